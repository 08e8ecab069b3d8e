"""Run one command and print its wall time and the peak memory of its whole process tree as JSON.

Spark runs a JVM beside the Python driver, so the peak is sampled as the sum of the tree's resident memory
(every 0.1 s), not read from getrusage, which only knows the largest single process.
"""

from __future__ import annotations

import contextlib
import json
import subprocess
import sys
import threading
import time

import psutil


def tree_rss(process: psutil.Process) -> int:
    total = 0
    for member in [process, *process.children(recursive=True)]:
        with contextlib.suppress(psutil.Error):
            total += member.memory_info().rss
    return total


if __name__ == "__main__":
    started = time.perf_counter()
    child = subprocess.Popen(sys.argv[1:], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    watched = psutil.Process(child.pid)
    peak = 0
    done = threading.Event()

    def sample() -> None:
        global peak
        while not done.is_set():
            try:
                peak = max(peak, tree_rss(watched))
            except psutil.Error:
                return
            time.sleep(0.1)

    sampler = threading.Thread(target=sample, daemon=True)
    sampler.start()
    out, err = child.communicate()
    seconds = time.perf_counter() - started
    done.set()
    sampler.join()
    if child.returncode:
        sys.exit(f"benchmark command failed ({child.returncode}): {' '.join(sys.argv[1:])}\n{err[-3000:]}")
    last = out.strip().splitlines()[-1] if out.strip() else "{}"
    print(json.dumps({"seconds": seconds, "peak_mib": peak / 2**20, "output": json.loads(last)}))
