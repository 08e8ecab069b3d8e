"""The worked example of docs/data-engineers.md: its DAG, copied into a DAG folder of its own, passes the
integrity suite's own checks (the ones every file in dags/ gets with no test code), and the suite catches
the mistakes it exists for when they are put into a copy. Its functions are tested on inline records; the
example runs through Airflow on real ingest output in tests/integration/test_worked_example_dag.py."""

from __future__ import annotations

import json
import shutil
from datetime import date
from pathlib import Path

import pytest

from tests.dags import test_dag_integrity as integrity

REPO = Path(__file__).resolve().parents[2]
EXAMPLES = REPO / "docs" / "examples"
EXAMPLE_DAG = EXAMPLES / "dags" / "example_quarantine_report.py"
DAG_ID = "example_quarantine_report"


def _dag_folder(root: Path, source: str) -> Path:
    folder = root / "dags"
    folder.mkdir()
    (folder / EXAMPLE_DAG.name).write_text(source)
    return folder


def _dagbag(folder: Path):
    from airflow.dag_processing.dagbag import DagBag

    return DagBag(dag_folder=str(folder))


@pytest.fixture(scope="module")
def example_folder(tmp_path_factory) -> Path:
    folder = tmp_path_factory.mktemp("example") / "dags"
    folder.mkdir()
    shutil.copy(EXAMPLE_DAG, folder)
    return folder


def test_the_example_imports_cleanly_and_is_the_only_dag_of_its_folder(example_folder):
    dagbag = _dagbag(example_folder)
    assert dagbag.import_errors == {}
    assert set(dagbag.dags) == {DAG_ID}
    assert [task.task_id for task in dagbag.dags[DAG_ID].topological_sort()] == [
        "dates_to_report",
        "report_quarantine",
    ]


def test_the_example_passes_the_integrity_checks(example_folder):
    integrity.check_no_work_at_parse_time(example_folder / EXAMPLE_DAG.name)
    dag = _dagbag(example_folder).dags[DAG_ID]
    integrity.check_owner_tags_and_docs(dag)
    integrity.check_retries_and_timeouts(dag)


# A copy of the example with one mistake: which check must catch it (the parse-time probe, or the
# declarations of the parsed DAG) and what it says.
MISTAKES = {
    "no_timeout": (
        '    "execution_timeout": timedelta(minutes=10),\n',
        "",
        "declarations",
        "set execution_timeout",
    ),
    "no_owner": ('    "owner": "data-platform",\n', "", "declarations", "set default_args owner"),
    "heavy_import_at_parse_time": (
        "from orchestration.assets import SILVER_TRANSACTIONS\n",
        "from orchestration.assets import SILVER_TRANSACTIONS\nimport pyspark  # noqa: F401\n",
        "parse",
        r"imports \['pyspark'\] at parse time",
    ),
    "variable_at_parse_time": (
        "with DAG(\n",
        'from airflow.sdk import Variable\n\nROWS = Variable.get("rows", default=1)\n\nwith DAG(\n',
        "parse",
        "Variable.get at DAG parse time",
    ),
}


@pytest.mark.parametrize("mistake", MISTAKES)
def test_the_integrity_checks_catch_a_mistake_in_a_copy_of_the_example(mistake, tmp_path):
    old, new, check, message = MISTAKES[mistake]
    source = EXAMPLE_DAG.read_text()
    assert old in source, "the example changed: update the mistake's anchor"
    folder = _dag_folder(tmp_path, source.replace(old, new, 1))
    with pytest.raises(AssertionError, match=message):
        if check == "parse":
            integrity.check_no_work_at_parse_time(folder / EXAMPLE_DAG.name)
        else:
            dag = _dagbag(folder).dags[DAG_ID]
            integrity.check_owner_tags_and_docs(dag)
            integrity.check_retries_and_timeouts(dag)


# --- the functions the example's tasks call ---------------------------------------------------------------


@pytest.fixture
def report(monkeypatch):
    monkeypatch.syspath_prepend(str(EXAMPLES))
    import quarantine_report

    return quarantine_report


def _record(**overrides) -> dict:
    record = {
        "arrival_date": "2026-01-05",
        "status": "silver",
        "rows_in": 1000,
        "rows_quarantined": 12,
        "quarantined_by_reason": {
            "malformed": 7,
            "extra_column": 0,
            "missing_required": 2,
            "wrong_type": 3,
            "out_of_range": 0,
            "invalid_value": 0,
        },
        "rows_silver": 980,
        "duplicates_removed": 8,
    }
    return {**record, **overrides}


def test_summary_counts_every_quarantined_row_by_reason_largest_first(report):
    summary = report.summarize_quarantine(_record())
    assert summary == {
        "arrival_date": "2026-01-05",
        "ingest_status": "silver",
        "rows_in": 1000,
        "rows_quarantined": 20,
        "quarantine_share": 0.02,
        "by_reason": {"duplicate": 8, "malformed": 7, "wrong_type": 3, "missing_required": 2},
        "top_reason": "duplicate",
    }
    assert list(summary["by_reason"]) == ["duplicate", "malformed", "wrong_type", "missing_required"]


@pytest.mark.parametrize(
    ("record", "quarantined", "top"),
    [
        (_record(status="bronze", duplicates_removed=None), 12, "malformed"),  # silver not built yet
        (_record(duplicates_removed=0), 12, "malformed"),
        (
            _record(
                status="empty",
                rows_in=0,
                rows_quarantined=0,
                quarantined_by_reason=dict.fromkeys(_record()["quarantined_by_reason"], 0),
                duplicates_removed=0,
            ),
            0,
            None,
        ),
    ],
    ids=["before_silver", "no_duplicates", "empty_arrival"],
)
def test_summary_of_partial_and_empty_records(report, record, quarantined, top):
    if record.get("duplicates_removed") is None:
        del record["duplicates_removed"]
    summary = report.summarize_quarantine(record)
    assert (summary["rows_quarantined"], summary["top_reason"]) == (quarantined, top)
    assert "duplicate" not in summary["by_reason"]
    assert summary["quarantine_share"] == (quarantined / record["rows_in"] if record["rows_in"] else 0.0)


def test_the_param_wins_over_events_and_events_give_each_date_once(report):
    extras = [
        {"arrival_date": "2026-01-06"},
        None,
        {"arrival_date": "2026-01-05"},
        {"arrival_date": "2026-01-06"},
    ]
    assert report.arrival_dates("2026-01-09", extras) == ["2026-01-09"]
    assert report.arrival_dates("", extras) == ["2026-01-05", "2026-01-06"]
    with pytest.raises(ValueError, match="no date to report on"):
        report.arrival_dates("", [None, {"other": 1}])
    with pytest.raises(ValueError):
        report.arrival_dates("2026-13-01", [])


def test_the_report_is_written_per_date_and_a_missing_record_is_named(report, tmp_path):
    from core.errors import PipelineError
    from core.settings import Settings
    from pipelines.lake import Tables, write_json

    settings = Settings(home=tmp_path / "home")
    day = date(2026, 1, 5)
    with pytest.raises(PipelineError, match=r"arrival 2026-01-05 has no reconciliation record at .*\.json"):
        report.write_quarantine_report(settings, day)
    assert not report.report_path(settings.lake, day).exists()

    write_json(Tables(settings.lake).reconciliation(day), _record())
    written = report.write_quarantine_report(settings, day)
    path = report.report_path(settings.lake, day)
    assert written["report"] == str(path)
    assert json.loads(path.read_text())["rows_quarantined"] == 20

    write_json(Tables(settings.lake).reconciliation(day), _record(duplicates_removed=0))
    report.write_quarantine_report(settings, day)  # a rerun replaces the date's report
    assert json.loads(path.read_text())["rows_quarantined"] == 12
    assert [p.name for p in path.parent.iterdir()] == [path.name]
