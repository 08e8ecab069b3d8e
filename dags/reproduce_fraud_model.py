"""
### Reproduce a registered fraud-model version, in the image it was trained in

A manual run names the version (`version` param) and the tolerance of the comparison. What `mlops reproduce`
does from a checkout, in the cluster: its training set rebuilt from the lake and compared with the DVC copy
it recorded (after an erasure or a retention in its window the lake no longer rebuilds it: the retrain uses
that recorded copy and the result says so), retrained with the recorded configuration and seed, evaluated on
the same holdout, and each holdout metric compared with the registered run's. The rebuilt run stays in MLflow
(tagged `reproduce.of_version`), never registered. The task fails unless the version is reproduced.

- Cluster (`training.runner=kubernetes`): **resolve_image**, a CPU pod of the training image, reads the
  version's image by digest from the registry (the node's report of the pod it was trained in, recorded as
  `lineage.image_id`); **reproduce** then runs in a CPU pod of exactly that image (`python -m training
  reproduce`), whatever tag the deployment runs now. A version the local runner trained has no digest: the
  run fails, naming the commit to reproduce it from.
- Local: **reproduce** runs in the worker, from this checkout (which must be the version's commit).
"""

from __future__ import annotations

from datetime import timedelta

import pendulum
from airflow.sdk import DAG, Param, task

from core.settings import get_settings
from orchestration.alerts import failure_alerts

DEFAULT_ARGS = {
    "on_failure_callback": failure_alerts(),  # core/alerts.py: to the webhook and mail the settings name
    "owner": "model-risk",
    "retries": 1,
    "retry_delay": timedelta(minutes=2),
    "execution_timeout": timedelta(hours=4),
}
VERSION = "{{ params.version }}"

with DAG(
    dag_id="reproduce_fraud_model",
    schedule=None,
    start_date=pendulum.datetime(2026, 1, 1, tz="UTC"),
    catchup=False,
    max_active_runs=1,
    default_args=DEFAULT_ARGS,
    tags=["fraud", "mlflow", "lineage"],
    doc_md=__doc__,
    params={
        "version": Param("1", type="string", pattern=r"^[0-9]+$", description="the registered version"),
        "tolerance": Param(0.02, type="number", minimum=0, description="per holdout metric, absolute"),
    },
):
    if get_settings().training_runner == "kubernetes":
        from orchestration.training_task import step_pod_operator

        IMAGE = "ti.xcom_pull(task_ids='resolve_image')"
        resolved = step_pod_operator(get_settings(), "resolve-image", ["--version", VERSION], "resolve_image")
        reproduced = step_pod_operator(
            get_settings(),
            "reproduce",
            [
                "--version", VERSION, "--tolerance", "{{ params.tolerance }}",
                "--image", f"{{{{ {IMAGE}['image_tag'] }}}}",
            ],
            "reproduce",
            image=f"{{{{ {IMAGE}['image'] }}}}",
        )  # fmt: skip
        resolved >> reproduced
    else:

        @task(doc_md="Rebuild the version from this checkout and compare; fails unless reproduced.")
        def reproduce(params: dict) -> dict:
            from core.errors import PipelineError
            from training.reproduce import reproduce as rebuild

            record = rebuild(get_settings(), str(params["version"]), float(params["tolerance"]))
            if record["status"] != "reproduced":
                raise PipelineError(f"v{params['version']}: {record['status']}: {record['reason']}")
            return record

        reproduce()
