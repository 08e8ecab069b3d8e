"""`dvc repro` runs the pipeline's `mlops` commands (landing -> silver -> gold) from nothing, in a fresh
workspace holding only what the stages read (dvc.yaml, params.yaml, .dvcignore and the code and suites listed
as dependencies): it reproduces the landing and gold hashes recorded in dvc.lock, and skips every stage the
second time. dvc.lock was written by another `dvc repro`, in another workspace and other JVMs, so equal gold
hashes mean equal gold bytes across reproductions (gold is rewritten by Arrow after Spark's commit).
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

REPO = Path(__file__).resolve().parents[2]
DVC = str(Path(sys.executable).with_name("dvc"))
# Outputs whose bytes depend only on the parameters and the code. The lake's other layers do not: Spark names
# their files after a random job id and the ingest records carry run ids.
REPRODUCIBLE = ("data/landing", "data/lake/gold")
EMPTY_FOLDER_MD5 = "d751713988987e9331980363e24189ce.dir"


def _env() -> dict[str, str]:
    return {**os.environ, "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}"}


def _run(args: list[str], cwd: Path) -> str:
    done = subprocess.run(args, cwd=cwd, env=_env(), capture_output=True, text=True, timeout=900)
    assert done.returncode == 0, f"{' '.join(args)} failed:\n{done.stdout}\n{done.stderr}"
    return done.stdout + done.stderr


def _outs(lock: Path) -> dict[str, dict]:
    stages = yaml.safe_load(lock.read_text())["stages"]
    return {out["path"]: out for stage in stages.values() for out in stage.get("outs", [])}


def _hashes(lock: Path, paths=REPRODUCIBLE) -> dict[str, str]:
    outs = _outs(lock)
    return {path: outs[path]["md5"] for path in paths}


def _workspace(root: Path) -> Path:
    """A git + DVC repository with the pipeline files and the stages' code dependencies, nothing else."""
    root.mkdir()
    stages = yaml.safe_load((REPO / "dvc.yaml").read_text())["stages"]
    produced = {out for stage in stages.values() for out in stage.get("outs", [])}
    code = {dep for stage in stages.values() for dep in stage.get("deps", []) if dep not in produced}
    _run(["git", "init", "-q"], root)
    _run([DVC, "init", "-q"], root)
    _run([DVC, "config", "core.analytics", "false"], root)
    for name in ("dvc.yaml", "params.yaml", ".dvcignore", "data/.gitignore", *sorted(code)):
        source, target = REPO / name, root / name
        target.parent.mkdir(parents=True, exist_ok=True)
        if source.is_dir():
            shutil.copytree(source, target, ignore=shutil.ignore_patterns("__pycache__"))
        else:
            shutil.copy(source, target)
    return root


@pytest.fixture(scope="module")
def reproduction(tmp_path_factory) -> Path:
    """A fresh workspace reproduced with `dvc repro` from nothing."""
    workspace = _workspace(tmp_path_factory.mktemp("dvc-repro") / "workspace")
    _run([DVC, "repro"], workspace)
    return workspace


def test_dvc_repro_reproduces_the_committed_landing_and_then_skips(reproduction):
    landing = ["data/landing"]
    assert _hashes(reproduction / "dvc.lock", landing) == _hashes(REPO / "dvc.lock", landing)
    again = _run([DVC, "repro"], reproduction)
    for stage in yaml.safe_load((REPO / "dvc.yaml").read_text())["stages"]:
        assert f"Stage '{stage}' didn't change" in again


def test_the_reproduction_holds_gold_for_every_landed_date(reproduction):
    gold = _outs(reproduction / "dvc.lock")["data/lake/gold"]
    # A folder DVC cannot see into (a nested `.dvc/` makes it a subrepo) hashes as an empty one.
    assert gold["md5"] != EMPTY_FOLDER_MD5
    landed = sorted(p.name for p in (reproduction / "data/landing").iterdir())
    for table in ("customer_features", "merchant_features"):
        partitions = sorted((reproduction / "data/lake/gold" / table).glob("event_date=*/*.parquet"))
        assert [p.parent.name for p in partitions] == [f"event_date={day}" for day in landed]


def test_the_reproduction_gives_the_committed_gold_bytes(reproduction):
    assert _hashes(reproduction / "dvc.lock") == _hashes(REPO / "dvc.lock")
