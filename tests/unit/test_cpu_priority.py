"""orchestration.tasks.lower_cpu_priority: the niceness the online load runs at beside the retrain. Each case
runs in a fresh interpreter, since a niceness is the thread's and this process's must not change."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]

PROBE = textwrap.dedent(
    """
    import json, os, sys, threading
    from orchestration.tasks import lower_cpu_priority

    def niceness():
        return os.getpriority(os.PRIO_PROCESS, 0)  # on Linux: the calling thread's

    seen = {"before": niceness()}
    started = {}
    with lower_cpu_priority(int(sys.argv[1])) as inside:
        seen["yielded"], seen["inside"] = inside, niceness()
        worker = threading.Thread(target=lambda: started.update(thread=niceness()))
        worker.start()
        worker.join()
    seen["thread"], seen["after"] = started["thread"], niceness()
    print(json.dumps(seen))
    """
)


def _probe(niceness: int) -> dict:
    done = subprocess.run(
        [sys.executable, "-c", PROBE, str(niceness)], cwd=REPO, capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


def test_the_block_and_the_threads_it_starts_run_at_the_lower_priority() -> None:
    seen = _probe(10)
    lowered = min(19, seen["before"] + 10)
    assert seen["yielded"] == seen["inside"] == lowered
    assert seen["thread"] == lowered  # Arrow's and SQLite's threads, started by the load, inherit it
    assert seen["after"] == seen["before"]  # put back (root here: CAP_SYS_NICE)


def test_niceness_zero_changes_nothing() -> None:
    seen = _probe(0)
    assert seen["yielded"] == seen["inside"] == seen["thread"] == seen["after"] == seen["before"]
