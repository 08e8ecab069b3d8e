"""`dvc repro` runs the pipeline's `mlops` commands and reproduces the data hashes recorded in dvc.lock."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import yaml

REPO = Path(__file__).resolve().parents[2]


def _run(args: list[str], cwd: Path) -> str:
    env = {**os.environ, "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}"}
    done = subprocess.run(args, cwd=cwd, env=env, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, f"{' '.join(args)} failed:\n{done.stdout}\n{done.stderr}"
    return done.stdout + done.stderr


def _out_hashes(lock: Path) -> dict[str, str]:
    stages = yaml.safe_load(lock.read_text())["stages"]
    return {out["path"]: out["md5"] for stage in stages.values() for out in stage.get("outs", [])}


def test_dvc_repro_reproduces_the_committed_hashes_and_then_skips(tmp_path):
    for name in ("dvc.yaml", "params.yaml"):
        shutil.copy(REPO / name, tmp_path / name)
    _run(["git", "init", "-q"], tmp_path)
    dvc = str(Path(sys.executable).with_name("dvc"))
    _run([dvc, "init", "-q"], tmp_path)
    _run([dvc, "config", "core.analytics", "false"], tmp_path)
    _run([dvc, "repro"], tmp_path)
    assert _out_hashes(tmp_path / "dvc.lock") == _out_hashes(REPO / "dvc.lock")
    assert "didn't change" in _run([dvc, "repro"], tmp_path)
