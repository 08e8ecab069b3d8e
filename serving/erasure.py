"""The scoring service told to forget a person, by `mlops erase` (mlops/chain.py `erase`), before the files
are rewritten: the service's live state holds the person's recent history and their merchants' running totals
count their transactions, and what their scoring handed to the scoring log and the online store may still be
on its way to disk.

- Replicated (`serving.replicated`, the cluster): an erasure entry is appended to the replicas' log (a Redis
  stream the Airflow workers already reach), so every replica forgets at the same point of the order, and the
  erasure waits up to `serving.erasure_wait_s` for every replica alive to have applied it and written what
  its scoring had on its way (serving/replication.py `wait_applied`). A replica that is down applies it when
  it starts, after the person's earlier entries.
- One process (the local profile): POST /erasures to the service at `serving.host`:`serving.port`, with a
  token of the `erase` role from its tokens file; it answers once it has forgotten and written. No service
  answering is no state to erase: one that starts loads the erased lake.

Nothing here raises for the service: the erasure of the files goes on, and the report says what was reached
and what to do about what was not.
"""

from __future__ import annotations

import json
import logging
import ssl
import urllib.error
import urllib.request
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from core.settings import Settings

log = logging.getLogger(__name__)


def forget_in_service(settings: Settings, customer: str, pseudonym: str | None) -> dict[str, Any]:
    """Tell the scoring service (every replica) to forget `customer`; what happened, as the report says it."""
    if not settings.serving.live_state:
        return {
            "status": "nothing_kept",
            "why": "the scoring service reads the online store (serving.live_state off): it keeps no state "
            "of its own, and the online store's rows are erased with the rest",
        }
    if settings.serving.replicated:
        return _through_the_log(settings, pseudonym)
    return _through_the_api(settings, customer)


def _through_the_log(settings: Settings, pseudonym: str | None) -> dict[str, Any]:
    import redis

    from core.residency import redact
    from serving.replication import (
        REPLICA_ALIVE_S,
        Replication,
        ReplicationUnavailableError,
        encode_erasure,
    )

    where = f"the replicas' log {settings.serving.replication_key} at {redact(settings.cluster.redis_url)}"
    if pseudonym is None:
        return {
            "status": "not_reached",
            "why": "no pseudonym key here to name the person as the replicas know them (privacy.key_file): "
            "run `mlops erase` where the key is mounted",
        }
    try:
        replication = Replication.connect(
            settings.cluster.redis_url,
            settings.serving.replication_key,
            settings.serving.replication_max_entries,
        )
        # No clock in the entry: this machine's time never moves the replicas' state.
        sequence, entry_id = replication.append(encode_erasure([pseudonym], None))
        waited = replication.wait_applied(sequence, settings.serving.erasure_wait_s)
        # Every replica alive has forgotten them and written what it scored (the scoring log, rewritten next,
        # holds it, and a replica that starts restores from it): the log's earlier entries, which name them,
        # are no longer needed. Not with serving.live_from: a replica that starts then replays the log.
        everyone = waited["applied"] and not waited["waiting"]
        replayed = settings.serving.live_from is not None
        trimmed = replication.trim_before(entry_id) if everyone and not replayed else None
    except (redis.exceptions.RedisError, ReplicationUnavailableError) as exc:
        return {
            "status": "not_reached",
            "why": f"{where} cannot be reached ({exc}): the replicas keep the person's state until they "
            "restart; run `mlops erase` again once Redis answers",
        }
    report: dict[str, Any] = {"via": where, "sequence": sequence, **waited}
    report["earlier_entries_removed"] = trimmed
    if waited["waiting"]:
        report["status"] = "pending"
        report["why"] = (
            f"replicas {', '.join(waited['waiting'])} had not applied the erasure within "
            f"{settings.serving.erasure_wait_s:.0f} s (serving.erasure_wait_s): they forget at their next "
            "batch or tick, and scoring log rows they write before that may name the person, as do the log's "
            "earlier entries (kept for them): run `mlops erase` again once they have (their /status)"
        )
    elif not waited["applied"]:
        report["status"] = "no_replica_running"
        report["why"] = (
            f"no replica reported within {REPLICA_ALIVE_S} s: a replica that starts applies the log, this "
            "erasure included, after the person's earlier entries (which the log keeps until a run of "
            "`mlops erase` finds the replicas up, or Redis trims them: serving.replication_max_entries)"
        )
    else:
        report["status"] = "forgotten"
    return report


def _through_the_api(settings: Settings, customer: str) -> dict[str, Any]:
    from serving.auth import TokensFileError, token_for, tokens_path

    serving = settings.serving
    host = "127.0.0.1" if serving.host in ("0.0.0.0", "::", "") else serving.host
    scheme = "https" if serving.tls_cert_file else "http"
    url = f"{scheme}://{host}:{serving.port}/erasures"
    headers = {"content-type": "application/json"}
    no_token = ""
    if serving.auth and tokens_path(settings).exists():  # no file: the service never started here
        try:
            headers["authorization"] = f"Bearer {token_for(settings, 'erase')}"
        except (TokensFileError, OSError, ValueError) as exc:  # asked anyway: is a service there at all?
            no_token = (
                f" ({exc}: add a caller with the `erase` role and a plain-text token to the tokens file, "
                'docs/serving.md "Callers")'
            )
    body = json.dumps({"customer_ids": [customer], "request": "mlops erase"}).encode()
    context = None
    if serving.tls_cert_file:
        context = ssl.create_default_context()
        context.load_verify_locations(serving.tls_cert_file)
    request = urllib.request.Request(url, data=body, headers=headers, method="POST")
    try:
        with urllib.request.urlopen(request, timeout=serving.erasure_wait_s + 30, context=context) as answer:
            return {"status": "forgotten", "via": url, **json.loads(answer.read())}
    except urllib.error.HTTPError as exc:
        detail = exc.read()[:500].decode(errors="replace")
        return {
            "status": "not_reached",
            "why": f"the scoring service at {url} answered {exc.code} ({detail}){no_token}: it keeps the "
            "person's state until it restarts; fix that and run `mlops erase` again",
        }
    except (urllib.error.URLError, OSError) as exc:
        reason = getattr(exc, "reason", exc)
        if isinstance(reason, ConnectionRefusedError):
            return {
                "status": "not_running",
                "why": f"no scoring service answers at {url}: one that starts loads the erased lake",
            }
        return {
            "status": "not_reached",
            "why": f"the scoring service at {url} could not be asked ({reason}): it keeps the person's state "
            "until it restarts; run `mlops erase` again once it answers",
        }
