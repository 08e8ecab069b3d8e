"""Data residency: every storage location the platform writes to must sit in an approved region or endpoint.

Transactions are personal data; where they are stored is a legal question, not a tuning knob. The settings
carry a `StoragePolicy` (allowed regions and/or allowed endpoint hosts) and the composition root passes every
configured storage URI through `check_storage_uris` before anything is written, so a bucket in the wrong
region fails at startup with a message naming the URI, not after a month of data has landed there.

How a URI is resolved to a place:
- `s3://`, `s3a://`, `s3n://` (boto, Spark): the endpoint named by `?endpoint_override=` (pyarrow's spelling)
  or `?endpoint_url=`, else the default endpoint given to the check; an AWS endpoint host names its region,
  any other endpoint is judged by its host. Without an endpoint, the region comes from `?region=` or the
  default region given to the check (e.g. AWS_DEFAULT_REGION).
- `https://` / `http://` object URLs: the host is the endpoint (AWS hosts again name their region).
- `postgresql://`, `redis://`, `rediss://` (a driver suffix such as `postgresql+psycopg2` included): the
  service's host is the endpoint (an RDS host names its region).
- `file://`, `sqlite:///` URIs and plain paths: local disk, allowed only when the policy allows local paths;
  so is a service or endpoint on this machine's loopback address (it stores on this machine's disk).
Anything that cannot be resolved is refused: a location of unknown residency is not a compliant one.

What the URI says is what its owner declared. `bucket_region` asks an S3-compatible endpoint where a bucket
really is (`mlops doctor` does, when it can reach it).
"""

from __future__ import annotations

import re
import urllib.error
import urllib.request
from collections.abc import Iterable
from dataclasses import dataclass
from urllib.parse import parse_qs, urlsplit, urlunsplit

from pydantic import BaseModel, ConfigDict, Field, field_validator

_S3_SCHEMES = frozenset({"s3", "s3a", "s3n"})
_HTTP_SCHEMES = frozenset({"http", "https"})
_SERVICE_SCHEMES = frozenset({"postgresql", "postgres", "redis", "rediss"})
_LOOPBACK_HOSTS = frozenset({"127.0.0.1", "localhost", "::1"})
# s3.eu-west-1.amazonaws.com, bucket.s3.eu-west-1.amazonaws.com, s3-eu-west-1.amazonaws.com,
# s3.dualstack.eu-west-1.amazonaws.com, bucket.s3-fips.us-east-1.amazonaws.com, and the .cn partition.
_AWS_S3_HOST = re.compile(
    r"(?:^|\.)s3(?:-fips)?(?:[.-]dualstack)?[.-](?P<region>[a-z]{2}(?:-[a-z]+)+-\d+)\.amazonaws\.com(?:\.cn)?$"
)
# mydb.abc123xyz.eu-west-1.rds.amazonaws.com (RDS and Aurora endpoints name their region).
_AWS_RDS_HOST = re.compile(r"\.(?P<region>[a-z]{2}(?:-[a-z]+)+-\d+)\.rds\.amazonaws\.com(?:\.cn)?$")
_LABEL = re.compile(r"^[a-z0-9]([a-z0-9.-]*[a-z0-9])?$")


class StoragePolicy(BaseModel):
    """Where data may be stored. Empty lists allow no object storage at all (fail closed)."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    allowed_regions: tuple[str, ...] = Field(default=(), description="e.g. eu-west-1, eu-central-1")
    allowed_endpoint_hosts: tuple[str, ...] = Field(
        default=(), description="S3-compatible endpoints by host, e.g. minio.storage.svc.cluster.local"
    )
    allow_local_paths: bool = Field(default=True, description="file:// URIs and plain paths (local profile)")

    @field_validator("allowed_regions", "allowed_endpoint_hosts", mode="after")
    @classmethod
    def _lowercase_names(cls, values: tuple[str, ...]) -> tuple[str, ...]:
        normalised = tuple(value.strip().lower() for value in values)
        for value in normalised:
            if not _LABEL.match(value):
                raise ValueError(f"{value!r} is not a region or host name (no scheme, port or path)")
        return normalised


@dataclass(frozen=True)
class StorageLocation:
    """Where one URI resolved to: `kind` is local, region or endpoint; `place` is the path, region or host."""

    uri: str
    kind: str
    place: str


class DataResidencyError(ValueError):
    """One or more storage URIs resolve outside the policy; `rejected` pairs each URI with the reason."""

    def __init__(self, rejected: list[tuple[str, str]], policy: StoragePolicy) -> None:
        self.rejected = rejected
        self.policy = policy
        lines = [f"{len(rejected)} storage location(s) break the data residency policy:"]
        lines += [f"  - {redact(uri)}: {reason}" for uri, reason in rejected]
        lines.append(
            f"Allowed regions: {list(policy.allowed_regions) or 'none'}; "
            f"allowed endpoint hosts: {list(policy.allowed_endpoint_hosts) or 'none'}; "
            f"local paths {'allowed' if policy.allow_local_paths else 'refused'}."
        )
        lines.append(
            "Fix: point the URI at a bucket in an allowed region (add ?region=<region> to an s3:// URI whose "
            "region is not the default) or at an allowed endpoint; if the location has been approved, add it "
            "to MLOPS_STORAGE_POLICY__ALLOWED_REGIONS or MLOPS_STORAGE_POLICY__ALLOWED_ENDPOINT_HOSTS."
        )
        super().__init__("\n".join(lines))


def redact(uri: str) -> str:
    """The URI without any user:password part, fit for an error message or a log line."""
    parts = urlsplit(uri)
    if parts.username is None and parts.password is None:
        return uri
    netloc = parts.hostname or ""
    if parts.port is not None:
        netloc += f":{parts.port}"
    return parts._replace(netloc=f"***@{netloc}").geturl()


def aws_region_of_host(host: str) -> str | None:
    """The region an AWS S3 or RDS endpoint host names, e.g. s3.eu-west-1.amazonaws.com -> eu-west-1."""
    match = _AWS_S3_HOST.search(host.lower()) or _AWS_RDS_HOST.search(host.lower())
    return match.group("region") if match else None


def _query(uri: str) -> dict[str, str]:
    """The URI's query parameters, the last value of each."""
    return {key: values[-1] for key, values in parse_qs(urlsplit(uri).query).items()}


def resolve_storage_uri(
    uri: str, *, default_region: str | None = None, default_endpoint: str | None = None
) -> StorageLocation:
    """Where `uri` stores its data; ValueError when that cannot be told from the URI and the defaults."""
    parts = urlsplit(uri)
    scheme = parts.scheme.lower().split("+", 1)[0]  # postgresql+psycopg2 is PostgreSQL
    if scheme in ("", "file"):
        return StorageLocation(uri, "local", parts.path or uri)
    if scheme == "sqlite":  # sqlite:///relative.db, sqlite:////absolute.db (SQLAlchemy's spelling)
        return StorageLocation(uri, "local", parts.path[1:] or uri)
    if scheme in _S3_SCHEMES:
        query = _query(uri)
        endpoint = query.get("endpoint_override") or query.get("endpoint_url") or default_endpoint
        if endpoint:
            return _endpoint_location(uri, endpoint)
        region = query.get("region") or default_region
        if region:
            return StorageLocation(uri, "region", region.lower())
        raise ValueError("no region or endpoint: add ?region=<region> or configure a default region")
    if scheme in _HTTP_SCHEMES or scheme in _SERVICE_SCHEMES:
        return _endpoint_location(uri, uri)
    raise ValueError(
        f"scheme {scheme!r} has no known residency (supported: s3, s3a, s3n, http(s), postgresql, redis, "
        "sqlite, file)"
    )


def _endpoint_location(uri: str, endpoint: str) -> StorageLocation:
    # An endpoint given without a scheme ("minio:9000") would otherwise parse as a path.
    host = (urlsplit(endpoint if "//" in endpoint else f"//{endpoint}").hostname or "").lower()
    if not host:
        raise ValueError(f"endpoint {endpoint!r} has no host")
    if host in _LOOPBACK_HOSTS:
        return StorageLocation(uri, "local", f"{host} (this machine)")
    region = aws_region_of_host(host)
    return StorageLocation(uri, "region", region) if region else StorageLocation(uri, "endpoint", host)


def judge(
    uri: str,
    policy: StoragePolicy,
    *,
    default_region: str | None = None,
    default_endpoint: str | None = None,
) -> tuple[StorageLocation | None, str | None]:
    """(where `uri` stores its data or None, why the policy refuses it or None)."""
    try:
        location = resolve_storage_uri(uri, default_region=default_region, default_endpoint=default_endpoint)
    except ValueError as exc:
        return None, f"cannot tell where it stores data: {exc}"
    return location, _refusal(location, policy)


def object_store_child(uri: str, name: str) -> str:
    """The folder `name` under an object store URI, without the URI's query: `?region=` and the endpoint are
    this platform's residency declarations, not part of the bucket's path (s3://b/p?region=r -> s3://b/p/name).
    """
    parts = urlsplit(uri)
    return urlunsplit((parts.scheme, parts.netloc, f"{parts.path.rstrip('/')}/{name}", "", ""))


def declared_region(uri: str, default_region: str | None = None) -> str | None:
    """The region `uri` says it is in (`?region=`, else the default given), lower-cased; None if neither."""
    region = _query(uri).get("region") or default_region
    return region.strip().lower() if region else None


def bucket_region(
    uri: str, *, region: str | None = None, endpoint: str | None = None, timeout_s: float = 3.0
) -> tuple[str, str]:
    """(the region an S3-compatible endpoint says `uri`'s bucket is in, the URL asked): a HEAD of the bucket,
    whose answer carries `x-amz-bucket-region` even when it refuses access (403) or redirects (301).
    OSError when the endpoint cannot be reached; ValueError when it answers without saying."""
    parts = urlsplit(uri)
    if parts.scheme.lower() not in _S3_SCHEMES or not parts.hostname:
        raise ValueError(f"{redact(uri)} is not an s3:// bucket URI")
    query = _query(uri)
    endpoint = query.get("endpoint_override") or query.get("endpoint_url") or endpoint
    region = declared_region(uri, region)
    if endpoint:
        base = endpoint if "//" in endpoint else f"https://{endpoint}"
    else:
        base = f"https://s3.{region}.amazonaws.com" if region else "https://s3.amazonaws.com"
    url = f"{base.rstrip('/')}/{parts.netloc}"
    request = urllib.request.Request(url, method="HEAD")
    try:
        with urllib.request.urlopen(request, timeout=timeout_s) as response:
            headers = response.headers
    except urllib.error.HTTPError as answered:  # 301, 403, 404: the endpoint answered
        headers = answered.headers
    except (urllib.error.URLError, TimeoutError) as exc:
        raise OSError(f"{url}: {getattr(exc, 'reason', exc)}") from exc
    found = headers.get("x-amz-bucket-region") if headers is not None else None
    if not found:
        raise ValueError(f"{url} answered without x-amz-bucket-region (not S3, or no such bucket)")
    return found.strip().lower(), url


def check_storage_uris(
    uris: Iterable[str],
    policy: StoragePolicy,
    *,
    default_region: str | None = None,
    default_endpoint: str | None = None,
) -> list[StorageLocation]:
    """Resolve every URI and return where each lives; DataResidencyError listing all that break the policy."""
    allowed: list[StorageLocation] = []
    rejected: list[tuple[str, str]] = []
    for uri in uris:
        location, reason = judge(
            uri, policy, default_region=default_region, default_endpoint=default_endpoint
        )
        if reason:
            rejected.append((uri, reason))
        elif location is not None:
            allowed.append(location)
    if rejected:
        raise DataResidencyError(rejected, policy)
    return allowed


def _refusal(location: StorageLocation, policy: StoragePolicy) -> str | None:
    if location.kind == "local":
        return None if policy.allow_local_paths else "resolves to local disk, which this policy refuses"
    if location.kind == "region":
        if location.place in policy.allowed_regions:
            return None
        return f"resolves to region {location.place}, not in the allowed regions"
    if location.place in policy.allowed_endpoint_hosts:
        return None
    return f"resolves to endpoint host {location.place}, not in the allowed endpoint hosts"
