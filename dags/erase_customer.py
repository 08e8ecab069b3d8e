"""
### Erase a customer on request, once a person approves

A manual run names the customer (the `customer` param: the id as the landing files hold it) and the request
it answers (`request`: a ticket or case reference, kept with the run).

- **request**: checks the id is one (letters, digits, `_` and `-`) before anyone is asked; says what the
  erasure will do.
- **approval**: a Human-in-the-loop task (Airflow's HITLOperator) in the Airflow UI's *Required actions*:
  **Erase** or **Refuse**, with a comment. Only the approvers group (`approval.approvers`) may answer: Airflow
  refuses anyone else; the request goes to the alert channels when the task starts waiting. No answer
  within `approval.timeout_hours`: nothing is erased.
- **erase** (runs whatever the approval's outcome): on **Erase** by someone other than the person who
  started this run, `mlops erase` (mlops/chain.py `erase`): the person's rows leave landing, quarantine,
  bronze, silver, the scoring log and the online store, gold is rebuilt from what is left (the `rebuild`
  param; Spark through the cluster's Spark Connect server), and the report names the DVC revisions and
  model versions that still hold them. It runs in the Airflow worker, which writes the lake. A refusal, a
  timeout, or an approval by the run's starter erase nothing (the last fails the task).
- **models_holding** (cluster, `training.runner=kubernetes`): the Airflow image has no MLflow, so a CPU pod of
  the training image (`python -m training trained-on`) names the model versions trained on the training sets
  the erasure's report lists as still holding the person.

The run's params keep the id in Airflow's metadata database, as the record of the request; Airflow's own
`airflow db clean` removes old runs.
"""

from __future__ import annotations

from datetime import timedelta

import pendulum
from airflow.providers.standard.operators.hitl import HITLOperator
from airflow.sdk import DAG, Param, task

from core.settings import get_settings
from mlops.erasure import ERASE, REFUSE
from orchestration.alerts import ErasureRequestNotifier, approval_assigned_users, failure_alerts

DEFAULT_ARGS = {
    "on_failure_callback": failure_alerts(),  # core/alerts.py: to the webhook and mail the settings name
    "owner": "data-protection",
    # An erasure repeated finds nothing more to remove and rebuilds what is still out of date: a retry after
    # a lost worker or Spark session finishes the work, and its report counts what that try removed.
    "retries": 1,
    "retry_delay": timedelta(minutes=5),
    "execution_timeout": timedelta(hours=2),
}
ASKED = "ti.xcom_pull(task_ids='request')"

with DAG(
    dag_id="erase_customer",
    schedule=None,
    start_date=pendulum.datetime(2026, 1, 1, tz="UTC"),
    catchup=False,
    max_active_runs=1,  # one erasure at a time: each rewrites the lake's partitions and rebuilds gold
    default_args=DEFAULT_ARGS,
    tags=["fraud", "privacy"],
    doc_md=__doc__,
    params={
        "customer": Param("", type="string", description="the customer id, as the landing files hold it"),
        "request": Param("", type="string", description="the request it answers (ticket, case reference)"),
        "rebuild": Param(True, type="boolean", description="rebuild gold from what is left (Spark)"),
    },
):

    @task(doc_md="Check the id and say what the erasure will do, before anyone is asked.")
    def request(params: dict, dag_run=None) -> dict:
        from airflow.sdk.exceptions import AirflowFailException

        from mlops.erasure import erasure_request

        try:
            return erasure_request(
                params.get("customer", ""),
                params.get("request", ""),
                bool(params.get("rebuild", True)),
                getattr(dag_run, "triggering_user_name", None) or "",
            )
        except ValueError as exc:  # the params are wrong: no retry can fix them
            raise AirflowFailException(str(exc)) from None

    approval = HITLOperator(
        task_id="approval",
        subject=f"Erase customer {{{{ {ASKED}['customer'] }}}}?",
        body=f"{{{{ {ASKED}['body'] }}}}",
        options=[ERASE, REFUSE],
        params={"comment": Param("", type="string", description="why (kept with the run and your name)")},
        response_timeout=timedelta(hours=get_settings().approval.timeout_hours),
        assigned_users=approval_assigned_users(get_settings().approval.approvers),
        notifiers=[ErasureRequestNotifier()],
        retries=0,  # a human decision is not retried: no answer in time erases nothing
        doc_md="A person approves or refuses the erasure in the Airflow UI (Required actions).",
    )

    @task(trigger_rule="all_done", doc_md="On Erase by another person than the run's starter: mlops erase.")
    def erase(ti=None) -> dict:
        from mlops.erasure import erase_if_approved

        return erase_if_approved(ti.xcom_pull(task_ids="request"), ti.xcom_pull(task_ids="approval"))

    erased = erase()
    request() >> approval >> erased
    if get_settings().training_runner == "kubernetes":
        from orchestration.training_task import step_pod_operator

        HOLDING = "{{ (ti.xcom_pull(task_ids='erase')['held_by']['dataset_revisions'] or {}) | join(',') }}"
        erased >> step_pod_operator(get_settings(), "trained-on", ["--revisions", HOLDING], "models_holding")
