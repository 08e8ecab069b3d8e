"""The replay's tokens (serving/replay.py): read from the tokens file the service uses, the auth switch
read as the service's settings read it."""

from __future__ import annotations

import json

import pytest

from core.settings import Settings
from serving.auth import TOKENS_FILE, plain_tokens, tokens_path
from serving.replay import _tokens

pytestmark = pytest.mark.unit


@pytest.mark.parametrize("value", ["false", "off", "0", "no", "False"])
def test_auth_switched_off_the_way_the_settings_read_it_needs_no_tokens_file(value, tmp_path):
    assert not Settings(home=tmp_path, serving={"auth": value}).serving.auth
    assert _tokens({"MLOPS_SERVING__AUTH": value, "MLOPS_HOME": str(tmp_path)}) == {}


def test_with_auth_the_replay_reads_the_file_the_service_reads(tmp_path):
    path = tokens_path(Settings(home=tmp_path))
    assert path == tmp_path / TOKENS_FILE
    path.parent.mkdir(parents=True)
    callers = [
        {"name": "ops", "token": "sha256:" + "0" * 64, "roles": ["score"]},
        {"name": "replay", "token": "plain-score", "roles": ["score", "read"]},
        {"name": "feed", "token": "plain-feed", "roles": ["chargebacks"]},
    ]
    path.write_text(json.dumps({"callers": callers}))
    expected = {"score": "plain-score", "read": "plain-score", "chargebacks": "plain-feed"}
    assert plain_tokens(path) == expected
    assert _tokens({"MLOPS_HOME": str(tmp_path)}) == expected
