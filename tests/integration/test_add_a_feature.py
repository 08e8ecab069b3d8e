"""The worked example of docs/data-engineers.md "Add a feature", end to end, as a data engineer makes it: two
declarations appended to pipelines/gold/contract.py FEATURES (the customer's largest amount in 24 hours, a
sliding maximum; the merchant's mean amount over 7 days, a mean from per-day states), one of today's
features deprecated in the same change (DEPRECATED: still built and served, no longer trained on), the
suites generated again (`python -m pipelines.suites`), and no other change to the code.

Set-up, once for the module, on a copy of the reference lake (tests/lake.py) and a copy of the repository's
tracked files with the two declarations (the `edited` source):
- the code as it is trains v1 and makes it the champion (`mlops retrain`, floor 0);
- the edited code runs the backfill (`mlops features backfill`), which rebuilds every date built for
  other declarations, oldest first, a progress line each (gold with the new columns and their generated GX
  expectations, DVC, Feast; neither feature needs a new per-day state), then retrains (`mlops retrain
  --force`): v2 takes the new inputs and not the deprecated one, and the gate judges it against v1, which
  takes the deprecated one and not the new ones, each on its own inputs of the same holdout;
- v2 is made the champion (by the gate, or by hand when the gate keeps v1: a tiny model's verdict is noise)
  and loaded by the edited service's loader;
- `mlops features check` then says the deprecated feature's declaration can be removed (no version in use
  takes it);
- the edited code runs the live-feature parity replay (tests/integration/test_live_features.py): the
  scoring service's live rows, new features included, equal gold's.

Each test then holds one feature to all of it: gold equals a brute-force recomputation from the declaration
(tests/integration/test_gold.py's oracle) and today's features keep their values, the suite checks it, the
Feast view has it with its declared type and the online store serves it, the training set carries it, the
gate's decision records it as added, the edited loader serves v2 and the unedited one refuses v2 naming it.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from types import SimpleNamespace

import pyarrow.dataset as ds
import pytest

from core.settings import Settings
from features.definitions import CUSTOMER_VIEW, MERCHANT_VIEW
from pipelines.gold.contract import CUSTOMER_TABLE, MERCHANT_TABLE, Feature, table_path
from tests import lake as reference
from tests.conftest import child_env
from tests.integration.test_gold import _oracle

pytestmark = pytest.mark.integration

REPO = Path(__file__).resolve().parents[2]
DAYS = reference.DAYS
LAST = DAYS[-1]
NEW = {
    "customer": Feature(
        "customer_max_amount_24h", "customer", "amount_usd", "max", "24h", "float64",
        "the customer's largest USD amount in the last 24h",
    ),
    "merchant": Feature(
        "merchant_amount_mean_7d", "merchant", "amount_usd", "mean", "7d", "float64",
        "mean USD amount the merchant took in the last 7d",
    ),
}  # fmt: skip
RETIRED = "customer_foreign_share_30d"  # deprecated by the same change


# This run's own records, which a child pytest must not write into.
_PARENT_ONLY = ("MLOPS_TEST_SUMMARY", "MLOPS_TEST_GROUP_COSTS", "PYTEST_ADDOPTS", "PYTEST_XDIST_WORKER")


@dataclass
class Added:
    home: Path
    source: Path
    gold_before: dict[str, list[dict]]  # each table's rows of LAST before the backfill, by key and time
    first: dict  # v1's retrain (the code as it is)
    backfill: dict
    second: dict  # v2's retrain (the edited code)
    served: dict  # the edited loader's champion
    check: dict  # the edited code's `mlops features check` with v2 the champion
    parity: subprocess.CompletedProcess


def _edited_source(target: Path) -> Path:
    """The repository's tracked files with NEW appended to FEATURES, and the suites generated again."""
    listed = subprocess.run(
        ["git", "-C", str(REPO), "ls-files", "-z"], capture_output=True, check=True
    ).stdout.decode()
    for name in filter(None, listed.split("\0")):
        source = REPO / name
        if source.is_file():
            (target / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(source, target / name)
    contract = target / "pipelines" / "gold" / "contract.py"
    text = contract.read_text()
    end = ")  # fmt: skip\n\n# Deprecated features"
    assert text.count(end) == 1, "FEATURES ends where the guide says to append"
    declarations = "".join(
        f"    Feature(\n        {f.name!r}, {f.entity!r}, {f.input!r}, {f.aggregation!r}, {f.window!r}, "
        f"{f.dtype!r},\n        {f.description!r},\n    ),\n"
        for f in NEW.values()
    )
    text = text.replace(end, declarations + end)
    deprecated = "DEPRECATED: dict[str, str] = {}\n"
    assert text.count(deprecated) == 1
    text = text.replace(
        deprecated, f"DEPRECATED: dict[str, str] = {{{RETIRED!r}: 'the worked example retires it'}}\n"
    )
    contract.write_text(text)
    _run(target, [sys.executable, "-m", "pipelines.suites"])
    return target


def _run(source: Path, args: list[str], **env: str) -> subprocess.CompletedProcess:
    """A command of the product in a child process that imports the code under `source`."""
    environment = {k: v for k, v in child_env(PYTHONPATH=str(source), **env).items() if k not in _PARENT_ONLY}
    done = subprocess.run(args, cwd=source, capture_output=True, text=True, timeout=1500, env=environment)
    assert done.returncode == 0, (
        f"{' '.join(args)} exited {done.returncode}:\n{done.stdout[-3000:]}\n{done.stderr[-6000:]}"
    )
    return done


def _mlops(source: Path, home: Path, *args: str) -> dict:
    """The command's JSON line, with what it printed to stderr (progress, tables) under "stderr"."""
    done = _run(
        source,
        [sys.executable, "-c", "from mlops.cli import app; app()", *args, "--json"],
        MLOPS_HOME=str(home),
        MLOPS_TRAINING__EPOCHS="2",
        MLOPS_TRAINING__LABEL_MATURITY_DAYS="1",
        MLOPS_GATE__FLOOR="0",
    )
    return {**json.loads(done.stdout.strip().splitlines()[-1]), "stderr": done.stderr}


def _gold_rows(home: Path, table: str) -> list[dict]:
    rows = ds.dataset(table_path(home / "lake", table), partitioning="hive").to_table(
        filter=ds.field("event_date") == LAST.isoformat()
    )
    key = "customer_id" if table == CUSTOMER_TABLE else "merchant_id"
    return sorted(rows.to_pylist(), key=lambda r: (r[key], r["event_timestamp"]))


@pytest.fixture(scope="module")
def added(tmp_path_factory, spark) -> Added:
    work = tmp_path_factory.mktemp("add-a-feature")
    home = reference.reference_lake(work / "home").home
    before = {table: _gold_rows(home, table) for table in (CUSTOMER_TABLE, MERCHANT_TABLE)}
    first = _mlops(REPO, home, "retrain", "--date", LAST.isoformat())
    assert first["champion_version"] == "1", first

    source = _edited_source(work / "source")
    # one command, no date to name: every date built for other declarations is rebuilt, oldest first
    backfill = _mlops(source, home, "features", "backfill")
    second = _mlops(source, home, "retrain", "--date", LAST.isoformat(), "--force")
    assert second["model_version"] == "2", second
    if second["champion_version"] != "2":
        _mlops(source, home, "promote", "--version", "2", "--reason", "the worked example serves v2")
    loader = (
        "import json, sys\n"
        "from core.settings import get_settings\n"
        "from serving.models import Models\n"
        "models = Models.from_settings(get_settings())\n"
        "champion = models.refresh().champion\n"
        "print(json.dumps({'version': champion and champion.version, 'inputs': champion and "
        "list(champion.inputs), 'problem': models.problem}))\n"
    )
    served = json.loads(
        _run(source, [sys.executable, "-c", loader], MLOPS_HOME=str(home)).stdout.strip().splitlines()[-1]
    )
    check = _mlops(source, home, "features", "check")
    parity = _run(
        source,
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-x",
         f"--basetemp={work / 'replay'}",  # its own: pytest prunes the older base folders of the user's runs
         "tests/integration/test_live_features.py", "-k", "observe_returns or state_before"],
        MLOPS_TEST_CACHE=os.environ.get("MLOPS_TEST_CACHE", str(reference.cache_root())),
    )  # fmt: skip
    return Added(home, source, before, first, backfill, second, served, check, parity)


@pytest.mark.parametrize("entity", ["customer", "merchant"])
def test_a_declared_feature_reaches_gold_the_suites_feast_the_training_set_the_gate_and_the_service(
    added, spark, entity
):
    feature = NEW[entity]
    key = f"{entity}_id"
    table = CUSTOMER_TABLE if entity == "customer" else MERCHANT_TABLE

    # gold: the new column equals the declaration recomputed from silver; today's columns kept their values
    after = _gold_rows(added.home, table)
    assert len(after) == len(added.gold_before[table]) > 0
    assert all(
        set(b) | {feature.name} == set(a) for b, a in zip(added.gold_before[table], after, strict=True)
    )
    assert all(
        {k: v for k, v in a.items() if k != feature.name} == b
        for b, a in zip(added.gold_before[table], after, strict=True)
    ), "a declaration added at the end changes no value of the features before it"
    silver = spark.read.parquet(str(added.home / "lake" / "silver" / "transactions")).collect()
    history: dict[str, list] = {}
    for r in silver:
        history.setdefault(r[key], []).append(r)
    checked = 0
    for row in after[::7]:
        expected = _oracle(feature, SimpleNamespace(**row), history[row[key]], [])
        assert row[feature.name] == pytest.approx(expected, rel=1e-9), (row[key], row["event_timestamp"])
        checked += 1
    assert checked > 20

    # the generated suite checks it, and gold passed it on every backfilled date
    suite = json.loads(
        (added.source / "pipelines" / "expectations" / f"gold_{entity}_features.json").read_text()
    )
    assert {"type": "expect_column_values_to_be_between", "kwargs": {"column": feature.name, "min_value": 0},
            "meta": {}} in suite["expectations"]  # fmt: skip
    plan = added.backfill["plan"]
    assert plan["event_dates"] == [d.isoformat() for d in DAYS], plan  # every date, oldest first
    assert {*plan["reasons"].values()} == {"declared features changed (pipelines/gold/contract.py FEATURES)"}
    assert list(added.backfill["rebuilt"]) == plan["event_dates"]
    for record in added.backfill["rebuilt"].values():
        assert [r["success"] for r in record["validation"]] == [True, True], record["event_date"]
        assert record["dataset_rev"] and record["rows_materialized"] > 0, record["event_date"]
    progress = [line for line in added.backfill["stderr"].splitlines() if line.startswith("backfill ")]
    assert [line.split(":")[0] for line in progress] == [f"backfill {n}/{len(DAYS)}" for n in (1, 2, 3, 4)]
    assert [line.split()[2] for line in progress] == plan["event_dates"], progress

    # Feast: the view has it with its declared type, and the online store serves it
    probe = (
        "import json\n"
        "from core.settings import get_settings\n"
        "from features import repo\n"
        "store = repo.open_store(get_settings())\n"
        f"view = store.get_feature_view({CUSTOMER_VIEW if entity == 'customer' else MERCHANT_VIEW!r})\n"
        f"field = next(f for f in view.schema if f.name == {feature.name!r})\n"
        f"entity_rows = [{{{key!r}: {after[-1][key]!r}}}]\n"
        f"values = store.get_online_features(features=[view.name + ':' + {feature.name!r}], "
        "entity_rows=entity_rows).to_dict()\n"
        f"print(json.dumps({{'dtype': str(field.dtype), 'value': values[{feature.name!r}][0]}}))\n"
    )
    online = json.loads(
        _run(added.source, [sys.executable, "-c", probe], MLOPS_HOME=str(added.home))
        .stdout.strip()
        .splitlines()[-1]
    )
    assert online["dtype"].lower().startswith("float64") and online["value"] is not None, online

    # the training set carries it; the gate judged v2 against v1, each on its own inputs, and says so
    assert feature.name in added.second["inputs_change"]["added"], added.second
    assert added.second["inputs_change"]["removed"] == [RETIRED], "the deprecated feature is not trained on"
    assert added.second["champion_auc_pr"] is not None, "the champion was scored, not refused"
    assert "inputs differ from champion v1" in added.second["reason"]

    # the edited service serves v2 with the new input; the code as it was refuses v2 naming it
    assert added.served["version"] == "2" and feature.name in added.served["inputs"], added.served
    assert RETIRED not in added.served["inputs"], added.served
    # the deprecated feature is still built (gold's columns above kept it), and no version in use takes it
    assert added.check["status"] == "ok" and added.check["problems"] == [], added.check
    assert [line.split(" is deprecated")[0] for line in added.check["deprecated"]] == [RETIRED], added.check
    assert "its declaration can be removed" in added.check["deprecated"][0], added.check
    from serving.models import ModelSource, ModelUnavailableError

    with pytest.raises(ModelUnavailableError, match=feature.name):
        ModelSource(Settings(home=added.home).mlflow_tracking_uri, cache_dir=added.home / "probe").load("2")

    # the live rows, new features included, equal gold's in the replay (the edited code's parity tests)
    assert " passed" in added.parity.stdout and "failed" not in added.parity.stdout, added.parity.stdout
