"""`mlops retrain` and `mlops promote --gate` asking a person (mlops/approval_request.py) where no Airflow
of the installation runs: nothing is posted, and the error says what to run (the posting itself:
tests/e2e/test_approval_from_the_cli.py, on the demo stack)."""

from __future__ import annotations

import pytest


def test_without_a_running_airflow_the_command_says_how_to_ask(tmp_path):
    """No stack here: nothing is posted, and the record and the message say what to run."""
    from core.settings import Settings
    from mlops.approval_request import NoAirflowError, ask

    with pytest.raises(NoAirflowError) as refused:
        ask(Settings(home=tmp_path), {"model_version": "7"}, "someone", print)
    assert "`make up`" in str(refused.value) and "mlops ask-approval --version 7" in str(refused.value)
