"""`dvc repro` runs the pipeline's `mlops` commands (landing -> silver -> gold) from nothing: it reproduces
the landing and gold hashes recorded in dvc.lock, skips every stage the second time, and two reproductions in
fresh workspaces give the same gold bytes (gold is rewritten by Arrow after Spark's commit).

Both reproductions run at once, in workspaces holding only what the stages read (dvc.yaml, params.yaml,
.dvcignore and the code and suites listed as dependencies), so the module costs one reproduction's time.
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
    done = subprocess.run(args, cwd=cwd, env=_env(), capture_output=True, text=True, timeout=600)
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
def reproductions(tmp_path_factory) -> tuple[Path, Path]:
    """Two fresh workspaces, each reproduced with `dvc repro` from nothing, concurrently."""
    scratch = tmp_path_factory.mktemp("dvc-repro")
    workspaces = (_workspace(scratch / "first"), _workspace(scratch / "second"))
    runs = [
        subprocess.Popen(
            [DVC, "repro"], cwd=w, env=_env(), stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
        )
        for w in workspaces
    ]
    outputs = [run.communicate(timeout=900)[0] for run in runs]
    for workspace, run, output in zip(workspaces, runs, outputs, strict=True):
        assert run.returncode == 0, f"`dvc repro` failed in {workspace}:\n{output[-6000:]}"
    return workspaces


def test_dvc_repro_reproduces_the_committed_landing_and_then_skips(reproductions):
    first, _ = reproductions
    assert _hashes(first / "dvc.lock", ["data/landing"]) == _hashes(REPO / "dvc.lock", ["data/landing"])
    again = _run([DVC, "repro"], first)
    for stage in yaml.safe_load((REPO / "dvc.yaml").read_text())["stages"]:
        assert f"Stage '{stage}' didn't change" in again


def test_each_reproduction_holds_gold_for_every_landed_date(reproductions):
    for workspace in reproductions:
        gold = _outs(workspace / "dvc.lock")["data/lake/gold"]
        # A folder DVC cannot see into (a nested `.dvc/` makes it a subrepo) hashes as an empty one.
        assert gold["md5"] != EMPTY_FOLDER_MD5
        landed = sorted(p.name for p in (workspace / "data/landing").iterdir())
        for table in ("customer_features", "merchant_features"):
            partitions = sorted((workspace / "data/lake/gold" / table).glob("event_date=*/*.parquet"))
            assert [p.parent.name for p in partitions] == [f"event_date={day}" for day in landed]


def test_two_reproductions_from_the_same_landing_give_the_same_gold_rows(reproductions):
    import pyarrow.parquet as pq

    first, second = reproductions
    assert _hashes(first / "dvc.lock", ["data/landing"]) == _hashes(second / "dvc.lock", ["data/landing"])
    files = sorted((first / "data/lake/gold").rglob("*.parquet"))
    assert files
    for path in files:
        twin = second / path.relative_to(first)
        assert pq.read_table(path).equals(pq.read_table(twin)), f"{path.relative_to(first)} differs"


def test_two_reproductions_from_the_same_landing_give_the_same_gold(reproductions):
    first, second = reproductions
    assert _hashes(first / "dvc.lock") == _hashes(second / "dvc.lock") == _hashes(REPO / "dvc.lock")
