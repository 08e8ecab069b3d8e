"""Who may call the scoring service, and what a request must look like before any handler reads it.

`Guard` is a plain ASGI middleware in front of every route (docs/serving.md, "Callers"):

- **Host.** A request whose `Host` is not one of `serving.allowed_hosts` is refused (400), so a web page that
  rebinds its own name to this machine's address cannot reach the service. The health endpoints answer any
  Host (Kubernetes probes use the pod's address).
- **Credentials.** Every route but the health endpoints wants `Authorization: Bearer <token>`, a token of the
  tokens file (`serving.tokens_file`), each of which names its caller and roles: `score` (POST /score and
  the Open Inference Protocol's infer), `chargebacks` (POST /chargebacks: fraud reports move every customer's
  merchant features, so the feed has a role of its own), `read` (GET /status, /docs, /openapi.json and the
  protocol's metadata; open to all when `serving.public_read`), `erase` (POST /erasures: a person's state
  forgotten, `mlops erase`). No token or an unknown one: 401; a token
  without the route's role: 403. The file holds tokens as their SHA-256 digests or as plain text; the
  service keeps only digests in memory.
- **Content type.** A POST must say `Content-Type: application/json` (415 otherwise): a web page can send a
  text/plain or form body to any address without asking, never an application/json one.
- **Admission.** At most `serving.max_in_flight` requests (health aside) are handled at once; past it a
  request is answered 503 with Retry-After at once instead of queueing without bound.

The caller's name goes to the request's scope (`state["caller"]`), for the audit records and the scoring
log. Unless `serving.tokens_file` names a file, the service generates $MLOPS_HOME/serving/tokens.json on
first start, as Airflow's simple auth manager does its passwords (`make up` prints where); a file it names
(in Kubernetes, a Secret mounted there) must exist, or the service does not start.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import secrets
import time
from collections.abc import Awaitable, Callable, Iterable, MutableMapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from core.settings import Settings

log = logging.getLogger(__name__)

ROLES = ("score", "chargebacks", "read", "erase")
OPEN_PATHS = frozenset({"/v2/health/live", "/v2/health/ready"})
DIGEST_PREFIX = "sha256:"
# What `mlops serve` generates for the local profile: one caller per role a local tool needs.
LOCAL_CALLERS = {
    "local-scorer": ("score", "read"),
    "local-chargebacks": ("chargebacks", "read"),
    "local-eraser": ("erase",),
}

Scope = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[MutableMapping[str, Any]]]
Send = Callable[[MutableMapping[str, Any]], Awaitable[None]]


class TokensFileError(ValueError):
    """The tokens file is missing or not what the service can read; the message says what to fix."""


@dataclass(frozen=True)
class Caller:
    name: str
    roles: frozenset[str]


def _digest(token: str) -> str:
    return hashlib.sha256(token.encode()).hexdigest()


TOKENS_FILE = Path("serving", "tokens.json")  # under MLOPS_HOME, unless serving.tokens_file names one


def tokens_path(settings: Settings) -> Path:
    return settings.serving.tokens_file or settings.home / TOKENS_FILE


def route_role(method: str, path: str) -> str | None:
    """The role a request needs; None for the open health endpoints."""
    if path in OPEN_PATHS:
        return None
    if method == "POST":
        return {"/chargebacks": "chargebacks", "/erasures": "erase"}.get(path, "score")
    return "read"


class Callers:
    """The callers of a tokens file, by their token's digest."""

    def __init__(self, by_digest: dict[str, Caller]) -> None:
        self._by_digest = by_digest

    def __len__(self) -> int:
        return len(self._by_digest)

    def who(self, token: str) -> Caller | None:
        return self._by_digest.get(_digest(token))

    @classmethod
    def load(cls, path: Path) -> Callers:
        """Read `path`: {"callers": [{"name": ..., "roles": [...], "token": ...}, ...]}, a token given as text
        or as "sha256:<hex digest>"."""
        fix = f'write {path} as {{"callers": [{{"name": "...", "roles": [...], "token": "..."}}]}}'
        try:
            data = json.loads(path.read_text())
        except FileNotFoundError as exc:
            raise TokensFileError(f"no tokens file at {path}: {fix} (serving.tokens_file)") from exc
        except (OSError, ValueError) as exc:
            raise TokensFileError(f"the tokens file {path} cannot be read as JSON ({exc}): {fix}") from exc
        entries = data.get("callers") if isinstance(data, dict) else None
        if not isinstance(entries, list) or not entries:
            raise TokensFileError(f"the tokens file {path} names no callers: {fix}")
        by_digest: dict[str, Caller] = {}
        for index, entry in enumerate(entries):
            where = f"{path}, caller {index}"
            named = isinstance(entry, dict) and all(isinstance(entry.get(k), str) for k in ("name", "token"))
            if not named:
                raise TokensFileError(f"{where}: needs a text `name` and `token`")
            roles = entry.get("roles")
            if not isinstance(roles, list) or not roles or not set(roles) <= set(ROLES):
                raise TokensFileError(
                    f"{where} ({entry['name']}): `roles` must list some of {', '.join(ROLES)}"
                )
            token = entry["token"]
            if token.startswith(DIGEST_PREFIX):
                digest = token.removeprefix(DIGEST_PREFIX).lower()
                if len(digest) != 64 or any(c not in "0123456789abcdef" for c in digest):
                    raise TokensFileError(f"{where} ({entry['name']}): a digest is sha256: and 64 hex digits")
            elif len(token) < 24:
                raise TokensFileError(f"{where} ({entry['name']}): a token needs 24 characters or more")
            else:
                digest = _digest(token)
            if digest in by_digest:
                raise TokensFileError(
                    f"{where} ({entry['name']}): the same token as {by_digest[digest].name}"
                )
            by_digest[digest] = Caller(entry["name"], frozenset(roles))
        return cls(by_digest)


def generate_local_tokens(path: Path) -> None:
    """A tokens file for this machine's own tools (LOCAL_CALLERS), readable by its owner only."""
    path.parent.mkdir(parents=True, exist_ok=True)
    callers = [
        {"name": name, "roles": list(roles), "token": secrets.token_urlsafe(32)}
        for name, roles in LOCAL_CALLERS.items()
    ]
    temp = path.with_name(f".{path.name}.{os.getpid()}")
    fd = os.open(temp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as out:
        json.dump({"callers": callers}, out, indent=1)
    os.replace(temp, path)


def open_callers(settings: Settings) -> RotatingCallers | None:
    """The callers the service admits (None when `serving.auth` is off), from a tokens file read again when
    it changes (RotatingCallers). The default file ($MLOPS_HOME/serving/tokens.json) is generated where it is
    missing; a file `serving.tokens_file` names (a mounted Secret) must exist."""
    if not settings.serving.auth:
        return None
    path = tokens_path(settings)
    if settings.serving.tokens_file is None and not path.exists():
        generate_local_tokens(path)
    return RotatingCallers(path)


class RotatingCallers:
    """The callers of a tokens file that may change while the service runs: a rotated Secret (the kubelet
    swaps the mounted file for a new one) or an operator's edit takes effect without a restart. At most every
    CHECK_S seconds a request's check looks at the file (a stat: its inode, time and size; read only when
    they changed). A new file that cannot be used leaves the callers as they were, logged and kept in
    `problem` (/status), never an open door nor a service locked to everyone."""

    CHECK_S = 1.0

    def __init__(self, path: Path) -> None:
        self.path = path
        self.callers = Callers.load(path)  # the first read must work: the service does not start otherwise
        self.signature = self._signature()
        self.checked = time.monotonic()
        self.reloads = 0
        self.problem: str | None = None

    def __len__(self) -> int:
        return len(self.callers)

    def who(self, token: str) -> Caller | None:
        now = time.monotonic()
        if now - self.checked >= self.CHECK_S:
            self.checked = now
            self._follow()
        return self.callers.who(token)

    def _signature(self) -> tuple[int, int, int] | None:
        try:
            found = os.stat(self.path)
        except OSError:
            return None
        return found.st_ino, found.st_mtime_ns, found.st_size

    def _follow(self) -> None:
        signature = self._signature()
        if signature == self.signature:
            return
        self.signature = signature
        try:
            self.callers = Callers.load(self.path)
        except TokensFileError as exc:
            self.problem = f"the tokens file changed but cannot be used, the previous callers stay: {exc}"
            log.error("%s", self.problem)
            return
        self.reloads += 1
        self.problem = None
        log.warning("tokens file %s read again: %d callers", self.path, len(self.callers))


def plain_tokens(path: Path) -> dict[str, str]:
    """A plain-text token per role of the tokens file at `path` (the first caller with it), for this
    machine's own tools (replays, the demo, the benchmarks); a digest cannot be sent, so it is skipped."""
    tokens: dict[str, str] = {}
    for entry in json.loads(path.read_text()).get("callers", []):
        if not entry["token"].startswith(DIGEST_PREFIX):
            for role in entry.get("roles", ()):
                tokens.setdefault(role, entry["token"])
    return tokens


def token_for(settings: Settings, role: str) -> str:
    """A plain-text token with `role` from the service's tokens file (`plain_tokens`)."""
    path = tokens_path(settings)
    token = plain_tokens(path).get(role)
    if token is None:
        raise TokensFileError(f"no caller with the role {role!r} and a plain-text token in {path}")
    return token


def _host(value: bytes) -> str:
    """The host of a Host header, without its port ([::1]:8000 -> ::1)."""
    text = value.decode("latin-1").strip().lower()
    if text.startswith("["):
        return text[1 : text.find("]")] if "]" in text else text
    return text.rsplit(":", 1)[0] if text.count(":") == 1 else text


def _media_type(value: bytes) -> str:
    return value.decode("latin-1").split(";", 1)[0].strip().lower()


class Guard:
    """The checks of the module docstring, before the application sees the request."""

    def __init__(
        self,
        app: Callable[[Scope, Receive, Send], Awaitable[None]],
        callers: Callers | RotatingCallers | None,
        public_read: bool,
        allowed_hosts: Iterable[str],
        max_in_flight: int | None = None,
    ) -> None:
        self.app = app
        self.callers = callers
        self.public_read = public_read
        self.max_in_flight = max_in_flight
        self.in_flight = 0  # requests past these checks and not yet answered (one event loop: no lock)
        hosts = {h.strip().lower().strip("[]") for h in allowed_hosts}
        self.any_host = "*" in hosts
        self.hosts = frozenset(hosts)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        path, method = scope["path"], scope["method"]
        headers = dict(scope["headers"])
        role = route_role(method, path)
        if role is not None and not self.any_host:
            host = _host(headers.get(b"host", b""))
            if host not in self.hosts:
                await _answer(send, 400, f"the Host {host!r} is not served here (serving.allowed_hosts)")
                return
        caller: Caller | None = None
        if role is not None and self.callers is not None and not (role == "read" and self.public_read):
            scheme, _, token = headers.get(b"authorization", b"").decode("latin-1").partition(" ")
            caller = self.callers.who(token.strip()) if scheme.lower() == "bearer" and token.strip() else None
            if caller is None:
                await _answer(
                    send,
                    401,
                    "a token is needed: send Authorization: Bearer <token> (serving.tokens_file)",
                    [(b"www-authenticate", b'Bearer realm="fraud-scoring"')],
                )
                return
            if role not in caller.roles:
                await _answer(send, 403, f"the caller {caller.name} has no {role!r} role, which {path} needs")
                return
        media = _media_type(headers.get(b"content-type", b""))
        # The Open Inference Protocol's clients may send their JSON body with no Content-Type at all; with
        # callers to check, the bearer token guards the route (a page cannot add one without asking first).
        untyped_oip = media == "" and self.callers is not None and _is_oip_infer(path)
        # Its binary tensor data extension's body: a type a page cannot send without asking first either.
        binary_oip = media == "application/octet-stream" and _is_oip_infer(path)
        if method == "POST" and media != "application/json" and not (untyped_oip or binary_oip):
            await _answer(send, 415, "send the body as JSON with Content-Type: application/json")
            return
        scope.setdefault("state", {})["caller"] = caller.name if caller else None
        if role is None or self.max_in_flight is None:
            await self.app(scope, receive, send)
            return
        if self.in_flight >= self.max_in_flight:
            await _answer(
                send,
                503,
                f"{self.in_flight} requests in progress (serving.max_in_flight): try again shortly",
                [(b"retry-after", b"1")],
            )
            return
        self.in_flight += 1
        try:
            await self.app(scope, receive, send)
        finally:
            self.in_flight -= 1


def _is_oip_infer(path: str) -> bool:
    return path.startswith("/v2/models/") and path.endswith("/infer")


async def _answer(
    send: Send, status: int, detail: str, extra: list[tuple[bytes, bytes]] | None = None
) -> None:
    body = json.dumps({"detail": detail}).encode()
    headers = [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())]
    await send({"type": "http.response.start", "status": status, "headers": headers + (extra or [])})
    await send({"type": "http.response.body", "body": body})


class OipErrors:
    """ASGI middleware: an error answered on a `/v2` route (the Open Inference Protocol's) carries the
    protocol's error object, `{"error": "<message>"}`, whoever answered it (the guard's refusals, a route's
    own errors, an unknown path, the incident 500); structured details stay beside it. Other routes keep
    their `{"detail": ...}`. Only error bodies are held (small); a success passes through untouched."""

    def __init__(self, app: Callable[[Scope, Receive, Send], Awaitable[None]]) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or not scope["path"].startswith("/v2"):
            await self.app(scope, receive, send)
            return
        start: MutableMapping[str, Any] | None = None
        chunks: list[bytes] = []

        async def rewritten(message: MutableMapping[str, Any]) -> None:
            nonlocal start
            if message["type"] == "http.response.start":
                kind = _media_type(dict(message.get("headers", [])).get(b"content-type", b""))
                if message["status"] < 400 or kind != "application/json":
                    await send(message)
                    return
                start = message  # held until the body is whole
                return
            if start is None:
                await send(message)
                return
            chunks.append(message.get("body", b""))
            if message.get("more_body"):
                return
            body = _as_oip_error(b"".join(chunks))
            headers = [(k, v) for k, v in start.get("headers", []) if k != b"content-length"]
            headers.append((b"content-length", str(len(body)).encode()))
            await send({**start, "headers": headers})
            await send({"type": "http.response.body", "body": body})

        await self.app(scope, receive, rewritten)


def _as_oip_error(body: bytes) -> bytes:
    try:
        payload = json.loads(body)
    except ValueError:
        return json.dumps({"error": body.decode("utf-8", "replace")}).encode()
    if not isinstance(payload, dict) or "error" in payload:
        return body
    detail = payload.pop("detail", None)
    if isinstance(detail, str):
        payload["error"] = detail
    elif detail is not None:
        payload["error"] = json.dumps(detail)
        payload["detail"] = detail  # the structured form stays for who reads it
    else:  # a readiness answer: its reason is the message
        payload["error"] = str(payload.get("reason") or "not ready")
    return json.dumps(payload).encode()
