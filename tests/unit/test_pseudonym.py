"""Pseudonyms of customer and merchant ids (core/pseudonym.py): keyed, stable, apart by kind, never the raw
id, and a key that is made once, read as a Secret holds it, and refused when it is missing or weak."""

from __future__ import annotations

import hashlib
import hmac
import threading

import pytest

from core import pseudonym
from core.pseudonym import Pseudonymiser, PseudonymKeyError
from core.settings import Profile, Settings

KEY = bytes(range(32))


def test_a_pseudonym_is_the_keyed_hash_of_kind_and_id_and_matches_the_stored_pattern():
    p = Pseudonymiser(KEY)
    expected = "pc" + hmac.new(KEY, b"customer:c0000001", hashlib.sha256).hexdigest()[:20]
    assert p.customer("c0000001") == expected
    assert pseudonym.python_pattern("customer").match(expected)
    assert pseudonym.python_pattern("merchant").match(p.merchant("m000001"))
    assert not pseudonym.python_pattern("customer").match("c0000001")
    # the same id under another kind or another key is another pseudonym
    assert p.of("merchant", "c0000001")[2:] != expected[2:]
    assert Pseudonymiser(KEY[::-1]).customer("c0000001") != expected
    assert len(expected) == pseudonym.STORED_LENGTH


def test_many_keeps_order_and_nulls_and_agrees_with_one_at_a_time():
    p = Pseudonymiser(KEY)
    values = ["c0000002", None, "c0000001", "c0000002"]
    assert p.many("customer", values) == [p.customer("c0000002"), None, p.customer("c0000001"),
                                          p.customer("c0000002")]  # fmt: skip


def test_the_key_never_shows_in_a_repr_and_its_id_reveals_nothing_of_it():
    p = Pseudonymiser(KEY)
    assert KEY.hex() not in repr(p) and str(KEY) not in repr(p)
    assert len(p.key_id) == 12 and p.key_id not in KEY.hex()
    assert p.key_id != Pseudonymiser(KEY[::-1]).key_id


def test_a_short_key_is_refused_with_what_to_do(tmp_path):
    short = tmp_path / "short.key"
    short.write_text("abcd\n")
    with pytest.raises(PseudonymKeyError, match=r"short\.key: the pseudonym key has 2 bytes; at least 16"):
        pseudonym.read_key(short)


def test_a_secret_in_hex_and_in_raw_bytes_give_the_same_key(tmp_path):
    (tmp_path / "hex").write_text(KEY.hex() + "\n")
    (tmp_path / "raw").write_bytes(KEY)
    assert pseudonym.read_key(tmp_path / "hex").key == pseudonym.read_key(tmp_path / "raw").key == KEY


def test_the_local_profile_makes_one_key_once_even_when_processes_race(tmp_path):
    made: list[bytes] = []

    def first_use() -> None:
        made.append(pseudonym.load(None, tmp_path, create=True).key)

    threads = [threading.Thread(target=first_use) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    key_file = tmp_path / "secrets" / pseudonym.KEY_FILE_NAME
    assert len(set(made)) == 1 and len(made[0]) == pseudonym.KEY_BYTES
    assert key_file.stat().st_mode & 0o777 == 0o600
    assert sorted(p.name for p in key_file.parent.iterdir()) == [pseudonym.KEY_FILE_NAME]  # no staged copy
    assert pseudonym.load(None, tmp_path, create=True).key == made[0]


def test_the_cluster_profile_never_makes_a_key_it_must_be_given(tmp_path):
    settings = Settings(profile=Profile.CLUSTER, home=tmp_path)
    with pytest.raises(PseudonymKeyError, match=r"MLOPS_PRIVACY__KEY_FILE"):
        pseudonym.for_settings(settings)
    assert not (tmp_path / "secrets").exists()
    given = tmp_path / "mounted.key"
    given.write_text(KEY.hex())
    settings = Settings(profile=Profile.CLUSTER, home=tmp_path, privacy={"key_file": given})
    assert pseudonym.for_settings(settings).key == KEY


def test_the_published_example_key_is_known_and_refused_by_the_cluster_profile(tmp_path):
    import yaml

    from core.settings import REPO_ROOT

    published = yaml.safe_load((REPO_ROOT / "params.yaml").read_text())["privacy"]["example_key"]
    example = Pseudonymiser(bytes.fromhex(published))
    assert example.key_id in pseudonym.EXAMPLE_KEY_IDS
    key_file = tmp_path / "key"
    key_file.write_text(published)
    with pytest.raises(PseudonymKeyError, match="published example key"):
        pseudonym.for_settings(
            Settings(profile=Profile.CLUSTER, home=tmp_path, privacy={"key_file": key_file})
        )
    # the local profile may use it: dvc.yaml's example pipeline on synthetic data does
    assert pseudonym.for_settings(Settings(home=tmp_path, privacy={"key_file": key_file})).key == example.key
