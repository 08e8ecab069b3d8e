"""Data residency: storage URIs are resolved to a region or an endpoint and checked against the policy."""

from __future__ import annotations

import socket

import pytest
from pydantic import ValidationError

from core.residency import (
    DataResidencyError,
    StorageLocation,
    StoragePolicy,
    aws_region_of_host,
    bucket_region,
    check_storage_uris,
    declared_region,
    object_store_child,
    redact,
    resolve_storage_uri,
)
from tests.buckets import bucket_endpoint

EU_POLICY = StoragePolicy(
    allowed_regions=["eu-west-1", "eu-central-1"],
    allowed_endpoint_hosts=["minio.storage.svc.cluster.local"],
)


@pytest.mark.parametrize(
    ("uri", "kind", "place"),
    [
        ("s3://lake/gold/2026-01-01?region=eu-west-1", "region", "eu-west-1"),
        ("s3a://lake/silver?region=EU-CENTRAL-1", "region", "eu-central-1"),
        ("s3://lake/x?endpoint_override=https://s3.eu-west-1.amazonaws.com", "region", "eu-west-1"),
        (
            "s3://mlflow?endpoint_override=http://minio.storage.svc.cluster.local:9000",
            "endpoint",
            "minio.storage.svc.cluster.local",
        ),
        (
            "s3://dvc?endpoint_url=minio.storage.svc.cluster.local:9000&region=us-east-1",
            "endpoint",
            "minio.storage.svc.cluster.local",
        ),
        ("https://lake.s3.eu-central-1.amazonaws.com/gold/part-0.parquet", "region", "eu-central-1"),
        ("https://s3.dualstack.eu-west-1.amazonaws.com/lake/key", "region", "eu-west-1"),
        ("https://s3-eu-west-1.amazonaws.com/lake/key", "region", "eu-west-1"),
        ("file:///var/mlops/lake", "local", "/var/mlops/lake"),
        ("var/lake/silver", "local", "var/lake/silver"),
    ],
)
def test_allowed_locations_pass_and_say_where_they_resolved(uri, kind, place):
    assert check_storage_uris([uri], EU_POLICY) == [StorageLocation(uri, kind, place)]


@pytest.mark.parametrize(
    ("uri", "reason"),
    [
        ("s3://lake/gold?region=us-east-1", "resolves to region us-east-1, not in the allowed regions"),
        (
            "s3a://lake/gold?endpoint_override=https://s3.us-west-2.amazonaws.com",
            "resolves to region us-west-2",
        ),
        ("https://lake.s3.ap-southeast-2.amazonaws.com/k", "resolves to region ap-southeast-2"),
        ("s3://lake?endpoint_override=https://minio.us.example.com", "endpoint host minio.us.example.com"),
        # A region label on a custom endpoint does not move the data: the endpoint host decides.
        ("s3://lake?endpoint_override=https://storage.example.net&region=eu-west-1", "storage.example.net"),
        ("s3://lake/gold", "no region or endpoint: add ?region=<region>"),
        ("gs://lake/gold", "scheme 'gs' has no known residency"),
    ],
)
def test_rejected_locations_name_the_uri_what_it_resolved_to_and_the_allowed_list(uri, reason):
    with pytest.raises(DataResidencyError) as raised:
        check_storage_uris([uri], EU_POLICY)
    message = str(raised.value)
    assert f"- {uri}: " in message
    assert reason in message
    assert "Allowed regions: ['eu-west-1', 'eu-central-1']" in message
    assert "allowed endpoint hosts: ['minio.storage.svc.cluster.local']" in message
    assert "MLOPS_STORAGE_POLICY__ALLOWED_REGIONS" in message
    assert raised.value.rejected == [(uri, raised.value.rejected[0][1])]


def test_every_offending_uri_is_reported_at_once():
    uris = ["s3://a?region=eu-west-1", "s3://b?region=us-east-1", "file:///ok", "s3://c?region=sa-east-1"]
    with pytest.raises(DataResidencyError, match=r"2 storage location\(s\)") as raised:
        check_storage_uris(uris, EU_POLICY)
    assert [uri for uri, _ in raised.value.rejected] == ["s3://b?region=us-east-1", "s3://c?region=sa-east-1"]


def test_default_region_and_endpoint_apply_to_uris_that_name_neither():
    assert (
        check_storage_uris(["s3://lake/gold"], EU_POLICY, default_region="eu-central-1")[0].place
        == "eu-central-1"
    )
    with pytest.raises(DataResidencyError, match="region us-east-1"):
        check_storage_uris(["s3://lake/gold"], EU_POLICY, default_region="us-east-1")
    located = check_storage_uris(
        ["s3://lake/gold"], EU_POLICY, default_endpoint="http://minio.storage.svc.cluster.local:9000"
    )
    assert located[0] == StorageLocation("s3://lake/gold", "endpoint", "minio.storage.svc.cluster.local")


def test_an_explicit_region_wins_over_the_default():
    with pytest.raises(DataResidencyError, match="region us-east-1"):
        check_storage_uris(["s3://lake?region=us-east-1"], EU_POLICY, default_region="eu-west-1")


def test_an_empty_policy_refuses_object_storage_but_keeps_local_paths():
    policy = StoragePolicy()
    assert check_storage_uris(["/tmp/lake"], policy)[0].kind == "local"
    with pytest.raises(DataResidencyError, match="Allowed regions: none"):
        check_storage_uris(["s3://lake?region=eu-west-1"], policy)


def test_local_paths_can_be_refused_for_the_cluster_profile():
    policy = StoragePolicy(allowed_regions=["eu-west-1"], allow_local_paths=False)
    with pytest.raises(DataResidencyError, match="resolves to local disk"):
        check_storage_uris(["file:///var/lake"], policy)


def test_credentials_in_a_uri_never_reach_the_error_message():
    uri = "https://admin:s3cr3t@minio.us.example.com:9000/lake"
    with pytest.raises(DataResidencyError) as raised:
        check_storage_uris([uri], EU_POLICY)
    assert "s3cr3t" not in str(raised.value)
    assert "https://***@minio.us.example.com:9000/lake" in str(raised.value)
    assert redact("s3://lake/x?region=eu-west-1") == "s3://lake/x?region=eu-west-1"


@pytest.mark.parametrize("bad", ["https://minio.example.com", "minio:9000", "eu west 1", ""])
def test_a_policy_entry_must_be_a_bare_region_or_host(bad):
    with pytest.raises(ValidationError, match="not a region or host name"):
        StoragePolicy(allowed_endpoint_hosts=[bad])


def test_policy_names_are_normalised_to_lowercase():
    policy = StoragePolicy(allowed_regions=[" EU-West-1 "], allowed_endpoint_hosts=["MinIO.Storage.SVC"])
    assert policy.allowed_regions == ("eu-west-1",)
    assert policy.allowed_endpoint_hosts == ("minio.storage.svc",)


@pytest.mark.parametrize(
    ("host", "region"),
    [
        ("s3.eu-west-1.amazonaws.com", "eu-west-1"),
        ("bucket.s3.us-gov-west-1.amazonaws.com", "us-gov-west-1"),
        ("bucket.s3-fips.us-east-1.amazonaws.com", "us-east-1"),
        ("s3.cn-north-1.amazonaws.com.cn", "cn-north-1"),
        ("s3.amazonaws.com", None),
        ("s3.eu-west-1.amazonaws.com.evil.example", None),
        ("minio.storage.svc", None),
    ],
)
def test_aws_hosts_name_their_region_and_lookalikes_do_not(host, region):
    assert aws_region_of_host(host) == region


def test_an_endpoint_without_a_host_cannot_be_resolved():
    with pytest.raises(ValueError, match="has no host"):
        resolve_storage_uri("s3://lake?endpoint_override=http://")


@pytest.mark.parametrize(
    ("uri", "kind", "place"),
    [
        ("postgresql://u:pw@db.abc123.eu-west-1.rds.amazonaws.com:5432/mlops", "region", "eu-west-1"),
        ("postgresql+psycopg2://u@db.abc123.eu-central-1.rds.amazonaws.com/mlops", "region", "eu-central-1"),
        ("redis://:pw@minio.storage.svc.cluster.local:6379/0", "endpoint", "minio.storage.svc.cluster.local"),
        ("rediss://127.0.0.1:6380/0", "local", "127.0.0.1 (this machine)"),
        ("postgresql://postgres@localhost:5432/postgres", "local", "localhost (this machine)"),
        ("http://127.0.0.1:5000", "local", "127.0.0.1 (this machine)"),
        ("sqlite:////var/mlops/mlflow/mlflow.db", "local", "/var/mlops/mlflow/mlflow.db"),
    ],
)
def test_databases_caches_and_servers_resolve_by_their_host(uri, kind, place):
    assert check_storage_uris([uri], EU_POLICY) == [StorageLocation(uri, kind, place)]


@pytest.mark.parametrize(
    ("uri", "reason"),
    [
        ("postgresql://u@db.abc123.us-east-1.rds.amazonaws.com/mlops", "resolves to region us-east-1"),
        ("redis://:pw@cache.us.example.com:6379/0", "endpoint host cache.us.example.com"),
        ("mysql://db.example.com/x", "scheme 'mysql' has no known residency"),
    ],
)
def test_a_database_or_cache_outside_the_policy_is_refused(uri, reason):
    with pytest.raises(DataResidencyError, match=reason) as raised:
        check_storage_uris([uri], EU_POLICY)
    assert "pw@" not in str(raised.value)


@pytest.mark.parametrize(
    ("uri", "child"),
    [
        ("s3://fraud-lake/prod?region=eu-west-1", "s3://fraud-lake/prod/dvc"),
        ("s3://fraud-lake/prod/?endpoint_override=http://minio:9000", "s3://fraud-lake/prod/dvc"),
        ("s3://fraud-lake", "s3://fraud-lake/dvc"),
    ],
)
def test_a_folder_under_the_object_store_drops_the_residency_query(uri, child):
    assert object_store_child(uri, "dvc") == child


def test_the_declared_region_is_the_uris_or_the_default():
    assert declared_region("s3://lake?region=EU-West-1", "us-east-1") == "eu-west-1"
    assert declared_region("s3://lake", "eu-central-1") == "eu-central-1"
    assert declared_region("s3://lake") is None


@pytest.mark.parametrize("status", [200, 301, 403])
def test_the_bucket_region_is_read_from_the_endpoints_answer_even_a_refusal(status):
    with bucket_endpoint(status, "US-EAST-1") as bucket:
        found, asked = bucket_region("s3://fraud-lake/prod?region=eu-west-1", endpoint=bucket.url)
    assert found == "us-east-1" and asked == f"{bucket.url}/fraud-lake"
    assert bucket.asked == ["/fraud-lake"]


def test_an_endpoint_that_does_not_say_where_the_bucket_is_is_not_taken_as_proof():
    with bucket_endpoint(region=None) as bucket, pytest.raises(ValueError, match="without x-amz-bucket"):
        bucket_region(f"s3://fraud-lake?endpoint_override={bucket.url}")


def test_an_unreachable_endpoint_is_an_os_error_naming_it():
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    with pytest.raises(OSError, match=f"127.0.0.1:{port}/fraud-lake"):
        bucket_region("s3://fraud-lake/prod", endpoint=f"http://127.0.0.1:{port}", timeout_s=2)
