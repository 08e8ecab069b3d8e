"""Time one DAG file's parse the way the dag-processor does it (`python -m benchmarks._dag_parse_run FILE`).

Airflow's own imports are loaded before the clock starts: the dag-processor has them already; what a DAG file
costs on every parse is its own top-level code and the modules it imports. Prints one JSON line.
"""

from __future__ import annotations

import json
import sys
import time

if __name__ == "__main__":
    from airflow.dag_processing.dagbag import DagBag

    started = time.perf_counter()
    bag = DagBag(dag_folder=sys.argv[1])
    seconds = time.perf_counter() - started
    print(json.dumps({"seconds": seconds, "dags": sorted(bag.dag_ids), "errors": bag.import_errors}))
