"""`mlops erase`'s call to the scoring service (serving/erasure.py) when it cannot be made: each case is said
in the report with what to do, and none stops the erasure of the files."""

from __future__ import annotations

import json

from core.settings import Settings
from serving.erasure import forget_in_service
from tests.conftest import free_port


def test_a_service_that_keeps_no_state_or_does_not_run_has_nothing_to_forget(tmp_path):
    off = forget_in_service(Settings(home=tmp_path, serving={"live_state": False}), "c0000001", "p")
    assert off["status"] == "nothing_kept" and "serving.live_state" in off["why"]
    port = free_port()
    down = forget_in_service(Settings(home=tmp_path, serving={"port": port}), "c0000001", "p")
    assert down["status"] == "not_running" and f"127.0.0.1:{port}/erasures" in down["why"], down


def test_replicated_without_redis_or_the_pseudonym_key_the_report_says_what_to_do(tmp_path):
    replicated = {"replicated": True, "erasure_wait_s": 1}
    settings = Settings(
        home=tmp_path,
        serving=replicated,
        cluster={"redis_url": f"redis://u:secret@127.0.0.1:{free_port()}/0"},
    )
    unreachable = forget_in_service(settings, "c0000001", "pseudonym")
    assert unreachable["status"] == "not_reached", unreachable
    assert "cannot be reached" in unreachable["why"] and "run `mlops erase` again" in unreachable["why"]
    assert "secret" not in unreachable["why"]  # the URL's password is never reported
    keyless = forget_in_service(settings, "c0000001", None)
    assert keyless["status"] == "not_reached" and "privacy.key_file" in keyless["why"]


def test_a_tokens_file_without_an_eraser_is_named_when_a_service_refuses(tmp_path):
    """A running service answers 401 to a call without a token: the report names the missing role."""
    import threading
    from http.server import BaseHTTPRequestHandler, HTTPServer

    class Refusing(BaseHTTPRequestHandler):
        def do_POST(self):
            self.send_response(401)
            self.end_headers()
            self.wfile.write(b'{"detail": "no token"}')

        def log_message(self, *args):
            pass

    server = HTTPServer(("127.0.0.1", 0), Refusing)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        tokens = tmp_path / "serving" / "tokens.json"
        tokens.parent.mkdir()
        tokens.write_text(json.dumps({"callers": [{"name": "s", "roles": ["score"], "token": "x" * 30}]}))
        settings = Settings(home=tmp_path, serving={"port": server.server_address[1]})
        refused = forget_in_service(settings, "c0000001", "p")
    finally:
        server.shutdown()
    assert refused["status"] == "not_reached", refused
    assert (
        "401" in refused["why"]
        and "`erase` role" in refused["why"]
        and "run `mlops erase` again" in refused["why"]
    )
