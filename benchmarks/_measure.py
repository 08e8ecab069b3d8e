"""Run one command as the only child of this process and print its wall time and peak memory as JSON."""

from __future__ import annotations

import json
import resource
import subprocess
import sys
import time

if __name__ == "__main__":
    started = time.perf_counter()
    done = subprocess.run(sys.argv[1:], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    seconds = time.perf_counter() - started
    if done.returncode:
        sys.exit(
            f"benchmark command failed ({done.returncode}): {' '.join(sys.argv[1:])}\n{done.stderr[-2000:]}"
        )
    peak_kib = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss
    print(json.dumps({"seconds": seconds, "peak_mib": peak_kib / 1024}))
