"""Run one benchmark command in a process of its own under _measure.py (wall time, peak RSS of the
process tree) and return what it measured. Every benchmark measures ours and its baseline this one way."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent


def measure(command: list[str], env: dict[str, str] | None = None) -> dict:
    out = subprocess.run(
        [sys.executable, str(HERE / "_measure.py"), *command],
        capture_output=True,
        text=True,
        cwd=HERE.parent,
        env=env,
    )
    if out.returncode:
        raise SystemExit(out.stderr[-3000:] or out.stdout[-3000:])
    return json.loads(out.stdout)
