"""scripts/infra_tools.sh keeps the infra tools' venv outside the clone, in a folder named after its key
(the requirements file's hash and the interpreter): a clean clone reuses it, and a changed requirements file
is a new key that builds a venv from nothing (docs/testing.md "Caches"). A requirements file of only a
comment keeps the builds to a bare venv (a few seconds each)."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


def _tools(cache: Path, requirements: Path) -> tuple[Path, str]:
    env = {**os.environ, "MLOPS_CACHE": str(cache), "INFRA_REQUIREMENTS": str(requirements)}
    env.pop("INFRA_VENV", None)
    done = subprocess.run(
        ["bash", str(REPO / "scripts" / "infra_tools.sh")],
        cwd=REPO, env=env, capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    return Path(done.stdout.strip().splitlines()[-1]), done.stderr


def test_the_key_is_printed_a_kept_venv_is_reused_and_a_stale_key_rebuilds(tmp_path):
    requirements = tmp_path / "requirements.txt"
    requirements.write_text("# no packages\n")
    cache = tmp_path / "cache"

    first, log = _tools(cache, requirements)
    assert first.parent == cache and first.name.startswith("venv-infra-"), first
    key = first.name.removeprefix("venv-infra-")
    assert f"key {key}" in log and "creating" in log
    assert (first / "bin" / "python").exists()

    again, log = _tools(cache, requirements)
    assert again == first and "reusing" in log and "creating" not in log

    # A half-built venv (no stamp) is not taken for a finished one.
    (first / f".installed-{key}").unlink()
    again, log = _tools(cache, requirements)
    assert again == first and "creating" in log

    requirements.write_text("# no packages, but another file\n")
    changed, log = _tools(cache, requirements)
    assert changed != first and changed.parent == cache
    assert "creating" in log and f"key {changed.name.removeprefix('venv-infra-')}" in log
    assert (changed / "bin" / "python").exists() and (first / "bin" / "python").exists()


def test_a_cached_test_file_is_kept_for_its_key_and_rebuilt_for_another(tmp_path, monkeypatch, capsys):
    """tests/integration/conftest.py `cached_file` (the migrated Airflow database): the same key reads the
    kept file without building; a changed key part (the lock file, say) builds anew and drops the old one."""
    from tests.integration.conftest import cached_file

    monkeypatch.setenv("MLOPS_TEST_CACHE", str(tmp_path / "cache"))
    builds: list[Path] = []

    def build(target: Path) -> None:
        builds.append(target)
        target.write_text(f"build {len(builds)}")

    first = cached_file("thing", [b"lock 1", b"python"], build)
    assert first.read_text() == "build 1" and "thing-" in capsys.readouterr().out
    assert cached_file("thing", [b"lock 1", b"python"], build) == first and len(builds) == 1
    second = cached_file("thing", [b"lock 2", b"python"], build)
    assert second != first and second.read_text() == "build 2"
    assert not first.exists(), "the stale key's file is removed"


def test_a_new_reference_lake_keeps_the_two_newest_lakes_of_other_code_and_removes_the_rest(tmp_path):
    """tests/lake.py `evict_stale_lakes`: another checkout's run may be reading its lake while this one
    builds, so the newest others stay (each with its phases and record); older ones and killed builds go."""
    import os

    from tests.lake import evict_stale_lakes

    for age, key in enumerate(["newest", "second", "third", "oldest"]):
        (tmp_path / f"lake-{key}" / "lake").mkdir(parents=True)
        (tmp_path / f"lake-{key}-phases" / "arrivals").mkdir(parents=True)
        record = tmp_path / f"lake-{key}.inputs.json"
        record.write_text("{}")
        os.utime(record, (1_000_000 - age * 100, 1_000_000 - age * 100))
    (tmp_path / "lake-orphan-phases").mkdir()  # a build killed between its renames: no record
    (tmp_path / ".building-x1" / "home").mkdir(parents=True)
    (tmp_path / "airflow-db-abc").mkdir()  # another cache: not a lake

    removed = evict_stale_lakes(tmp_path, keep=2)
    assert removed == sorted([
        "lake-third", "lake-third-phases", "lake-third.inputs.json",
        "lake-oldest", "lake-oldest-phases", "lake-oldest.inputs.json", "lake-orphan-phases",
    ])  # fmt: skip
    assert sorted(p.name for p in tmp_path.iterdir()) == [
        "airflow-db-abc",
        "lake-newest", "lake-newest-phases", "lake-newest.inputs.json",
        "lake-second", "lake-second-phases", "lake-second.inputs.json",
    ]  # fmt: skip
