"""One task process's lineage cost (benchmarks/lineage.py): `python -m benchmarks._lineage_run WAY HOME`.

Imports what an ingest task holds (the Airflow SDK, the ingest step), then sends the first step's START and
COMPLETE events (what every task process pays once, imports included), then EVENTS more pairs; prints JSON.
`ours`: core/lineage.py's dicts written to files. `client`: the same events built with the OpenLineage
client's classes and written by its file transport, as the client documents them.
"""

from __future__ import annotations

import json
import sys
import time
import uuid
from pathlib import Path

EVENTS = 50


def main() -> None:
    way, home = sys.argv[1], Path(sys.argv[2])
    import airflow.sdk  # noqa: F401  (held by every task process)
    from airflow.sdk import task  # noqa: F401

    import pipelines.ingest.job  # noqa: F401
    from core.settings import Settings

    settings = Settings(home=home)
    files = [home / "landing" / "2026-01-01" / f"transactions-{k}.csv" for k in range(3)]
    partition = home / "lake" / "bronze" / "transactions" / "arrival_date=2026-01-01"

    def ours() -> None:
        from core import lineage

        run = str(uuid.uuid4())
        lineage.emit(settings, lineage.event(settings, "ingest_to_bronze", run, lineage.START))
        found = lineage.Datasets([lineage.path(f) for f in files], [lineage.path(partition, rows=1_000_000)])
        lineage.emit(settings, lineage.event(settings, "ingest_to_bronze", run, lineage.COMPLETE, found))

    def client() -> None:
        from openlineage.client import event_v2 as ol
        from openlineage.client.generated import job_type_job, output_statistics_output_dataset
        from openlineage.client.transport.file import FileConfig, FileTransport

        run = ol.Run(runId=str(uuid.uuid4()))
        job = ol.Job(
            namespace="mlops-fraud",
            name="ingest_to_bronze",
            facets={
                "jobType": job_type_job.JobTypeJobFacet(
                    processingType="BATCH", integration="MLOPS", jobType="TASK"
                )
            },
        )
        transport = FileTransport(FileConfig(log_file_path=str(home / "client" / run.runId)))
        (home / "client").mkdir(parents=True, exist_ok=True)
        now = time.strftime("%Y-%m-%dT%H:%M:%SZ")
        transport.emit(ol.RunEvent(eventType=ol.RunState.START, eventTime=now, run=run, job=job))
        outputs = [
            ol.OutputDataset(
                namespace="file",
                name=str(partition),
                outputFacets={
                    "outputStatistics": output_statistics_output_dataset.OutputStatisticsOutputDatasetFacet(
                        rowCount=1_000_000
                    )
                },
            )
        ]
        inputs = [ol.InputDataset(namespace="file", name=str(f)) for f in files]
        transport.emit(
            ol.RunEvent(
                eventType=ol.RunState.COMPLETE,
                eventTime=now,
                run=run,
                job=job,
                inputs=inputs,
                outputs=outputs,
            )
        )

    step = ours if way == "ours" else client
    started = time.perf_counter()
    step()
    first = time.perf_counter() - started
    started = time.perf_counter()
    for _ in range(EVENTS):
        step()
    print(json.dumps({"first_s": first, "next_s": (time.perf_counter() - started) / EVENTS}))


if __name__ == "__main__":
    main()
