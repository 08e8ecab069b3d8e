"""`mlops lineage` and `mlops reproduce` on the demo's champion (the shared `demo_stack`).

The graph is read from the OpenLineage events the chain wrote through Airflow and checked edge by edge against
what the installation holds: the registry's run and training set, the DVC revisions' manifests, the lake's
partitions, the landing files, the GX results and the scoring log's rows. The rebuild must find the same
training set (DVC hash) and come within the tolerance of the registered metrics."""

from __future__ import annotations

import json
from datetime import date, timedelta
from pathlib import Path

import pyarrow.dataset as ds

from tests.conftest import free_port
from tests.e2e.conftest import mlops_json

MODEL = "fraud-detector"


def _file(path: Path) -> tuple[str, str]:
    return "file", str(path.absolute())


def _edges(graph: dict, key: str, job: str) -> set[tuple[tuple[str, str], tuple[str, str]]]:
    return {(tuple(e["from"]), tuple(e["to"])) for e in graph[key] if e["job"] == job}


def _names(nodes) -> set[str]:
    return {name for _, name in nodes}


def test_the_demo_champion_has_a_complete_lineage_graph_edge_by_edge(demo_stack):
    home = demo_stack.home
    summary = demo_stack.summary
    version = summary["champion_version"]
    [made] = [r for r in summary["retrains"] if r.get("model_version") == version]
    run_id, rev, as_of = made["run_id"], made["training_set_rev"], date.fromisoformat(made["as_of"])
    graph = mlops_json(demo_stack, "lineage", version)
    assert graph["from_registry"] == [] and graph["missing"] == [], graph
    root = tuple(graph["root"])
    assert root[1] == f"models/{MODEL}/versions/{version}"
    tracking = root[0]

    # the run that trained it, and the training set it trained on
    assert _edges(graph, "upstream", "register") == {((tracking, f"runs/{run_id}"), root)}
    [(training_set, run)] = _edges(graph, "upstream", "train")
    assert run == (tracking, f"runs/{run_id}") and training_set[1] == f"training_set@{rev}"

    # the training set: the DVC revisions of the window's gold, its feature rows and the labels known then
    lake = home / "lake"
    into_set = {
        source for source, target in _edges(graph, "upstream", "training_set") if target == training_set
    }
    window = [as_of - timedelta(days=k) for k in range(31)]
    gold_days = [d for d in window if (lake / "gold" / "customer_features" / f"event_date={d}").is_dir()]
    assert gold_days, "the demo's gold"
    revisions = {n for n in _names(into_set) if n.startswith("gold/")}
    assert {n.split("@")[0] for n in revisions} == {f"gold/event_date={d}" for d in gold_days}
    rows = {_file(lake / "training_rows" / f"event_date={d}") for d in window}
    assert {s for s in into_set if s[0] == "file" and "/training_rows/" in s[1]} == {
        r for r in rows if Path(r[1]).is_dir()
    }
    labels = {s for s in into_set if "/silver/labels/" in s[1]}
    assert labels and all(Path(name).is_dir() for _, name in labels)

    # each gold revision is what its manifest says: the two gold partitions of its date, versioned from them
    versioned = _edges(graph, "upstream", "version_gold")
    for name in revisions:
        day = name.split("=")[1].split("@")[0]
        manifest = json.loads((home / "datasets" / "revisions" / f"{name.split('@')[1]}.json").read_text())
        partitions = {_file(home / member["path"]) for member in manifest.values()}
        assert {p[1].split("/gold/")[1] for p in partitions} == {
            f"customer_features/event_date={day}",
            f"merchant_features/event_date={day}",
        }
        assert {s for s, t in versioned if t[1] == name} == partitions

    # gold from silver, silver from bronze, bronze from the landing files of the same arrival
    gold_from = _edges(graph, "upstream", "build_gold")
    silver_from = _edges(graph, "upstream", "build_silver")
    bronze_from = _edges(graph, "upstream", "ingest_to_bronze")
    labels_from = _edges(graph, "upstream", "ingest_labels")
    silver = {s for s, _ in gold_from if "/silver/transactions/" in s[1]}
    assert silver and {t for _, t in gold_from} >= {p for name in revisions for p in _gold_pair(lake, name)}
    for partition in silver:
        arrival = partition[1].rsplit("=", 1)[1]
        assert (_file(lake / "bronze" / "transactions" / f"arrival_date={arrival}"), partition) in silver_from
    arrivals = {p[1].rsplit("=", 1)[1] for p in silver}
    for arrival in arrivals:
        bronze = _file(lake / "bronze" / "transactions" / f"arrival_date={arrival}")
        landed = sorted((home / "landing" / arrival).glob("transactions-*"))
        assert landed and {s for s, t in bronze_from if t == bronze} == {_file(f) for f in landed}
    for _, partition in labels:
        arrival = partition.rsplit("=", 1)[1]
        landed = {_file(f) for f in (home / "landing" / arrival).glob("labels-*")}
        assert {s for s, t in labels_from if t[1] == partition} == landed

    # every validated layer on the way passed its GX suite
    quality = graph["quality"]
    checked = {name.split(" ", 1)[1]: q for name, q in quality.items()}
    for arrival in arrivals:
        for layer in ("bronze", "silver"):
            outcome = checked[str((lake / layer / "transactions" / f"arrival_date={arrival}").absolute())]
            assert (
                outcome["suite"] == f"{layer}_transactions" and outcome["success"] and outcome["assertions"]
            )
    for name in revisions:
        for _, partition in _gold_pair(lake, name):
            table = partition.split("/gold/")[1].split("/")[0]
            assert checked[partition]["suite"] == f"gold_{table}" and checked[partition]["success"]

    # downstream: the alias it holds, the ONNX file it serves, the days it scored
    alias = (tracking, f"models/{MODEL}/aliases/champion")
    assert (root, alias) in _edges(graph, "downstream", "promote")
    exported = {t[1] for _, t in _edges(graph, "downstream", "export")}
    assert f"runs/{run_id}/artifacts/onnx/model.onnx" in exported
    log = ds.dataset(home / "scoring_log", format="parquet", partitioning="hive")
    served = log.to_table(columns=["date"], filter=ds.field("model_version") == version)
    days = {str(d) for d in served["date"].unique().to_pylist()}
    assert days, "the demo scored a day with its champion"
    scored = {t for s, t in _edges(graph, "downstream", "score") if s == root}
    assert scored == {_file(home / "scoring_log" / f"date={d}") for d in days}


def _gold_pair(lake: Path, revision: str) -> set[tuple[str, str]]:
    day = revision.split("=")[1].split("@")[0]
    return {
        _file(lake / "gold" / t / f"event_date={day}") for t in ("customer_features", "merchant_features")
    }


def test_the_demo_champion_reproduces_within_tolerance_from_the_same_training_set(demo_stack):
    import subprocess

    import mlflow

    version = demo_stack.summary["champion_version"]
    [made] = [r for r in demo_stack.summary["retrains"] if r.get("model_version") == version]
    record = mlops_json(demo_stack, "reproduce", version)
    assert record["status"] == "reproduced", record
    head = subprocess.run(
        ["git", "rev-parse", "HEAD"], capture_output=True, text=True, check=True
    ).stdout.strip()
    assert record["git_commit"] == head and record["image"] == "local"
    assert record["training_set_rev"] == made["training_set_rev"] and record["run_id"] == made["run_id"]
    data = record["training_set"]
    assert data["hash_equal"] and data["rebuilt_md5"] == data["recorded_md5"] and data["rows"] > 0
    assert data["as_of"] == made["as_of"]
    # the configuration is the run's own, seed included
    client = mlflow.MlflowClient(demo_stack.mlflow_url)
    params = client.get_run(made["run_id"]).data.params
    assert str(record["config"]["seed"]) == params["train.seed"]
    assert str(record["config"]["learning_rate"]) == params["train.learning_rate"]
    assert set(record["metrics"]) == {"holdout_auc_pr", "holdout_roc_auc", "holdout_recall_at_1pct_fpr"}
    for metric, compared in record["metrics"].items():
        assert compared["within"] and compared["difference"] <= record["tolerance"], (metric, compared)
    rebuilt = client.get_run(record["rebuilt_run_id"])
    assert rebuilt.data.tags["reproduce.of_version"] == version
    assert not client.search_model_versions(f"run_id='{record['rebuilt_run_id']}'")  # never registered


def test_reproduce_refuses_a_checkout_at_another_commit_and_names_both(demo_stack):
    import subprocess
    import sys

    version = demo_stack.summary["champion_version"]
    env = {**demo_stack.env, "MLOPS_GIT_COMMIT": "0" * 40}  # what an image of another commit says
    mlops = str(Path(sys.executable).with_name("mlops"))
    done = subprocess.run(
        [mlops, "reproduce", version, "--json"], env=env, capture_output=True, text=True, timeout=600
    )
    assert done.returncode == 1, done.stderr
    refused = json.loads(done.stdout.strip().splitlines()[-1])
    assert refused["status"] == "refused" and "0" * 40 in refused["reason"]
    head = subprocess.run(
        ["git", "rev-parse", "HEAD"], capture_output=True, text=True, check=True
    ).stdout.strip()
    assert head in refused["reason"] and "git worktree add" in refused["reason"]


def _copy_home(source: Path, target: Path) -> Path:
    """The stack's installation copied to `target`, its SQLite databases through SQLite's own backup (the
    running stack may be writing them); the copy is an installation of its own (local profile: MLflow's
    registry and runs, the lake, DVC, the key all under MLOPS_HOME)."""
    import shutil
    import sqlite3

    shutil.copytree(source, target, symlinks=True, ignore=shutil.ignore_patterns("run", "*.sock", "*.pid"))
    for database in source.rglob("*.db"):
        with database.open("rb") as head:
            if head.read(16) != b"SQLite format 3\x00":  # Feast's registry.db is a protobuf file
                continue
        copy = target / database.relative_to(source)
        copy.unlink(missing_ok=True)
        with sqlite3.connect(database) as live, sqlite3.connect(copy) as kept:
            live.backup(kept)
    return target


def _landed_customers(home: Path) -> list[str]:
    """Every customer id of the landing's transactions files."""
    from tests.lake import landing_records

    rows = [r for path in sorted(home.glob("landing/*/transactions-*")) for r in landing_records(path)]
    return sorted({r["customer_id"] for r in rows if isinstance(r, dict) and r.get("customer_id")})


def _holding(home: Path, values: set[str]) -> dict[str, str]:
    """Each file under `home` holding one of `values` as text: its path (to `home`) -> its content's md5."""
    import hashlib

    from tests.e2e.test_privacy import _texts

    wanted = [value.encode() for value in values]
    return {
        str(path.relative_to(home)): hashlib.md5(path.read_bytes()).hexdigest()
        for path in sorted(home.rglob("*"))
        if path.is_file() and not path.is_symlink() and any(w in t for t in _texts(path) for w in wanted)
    }


def _held_contents(settings, held: dict) -> set[str]:
    """The md5 of every file of the DVC revisions an erasure's report names: their objects in the remote,
    and any copy of them (the cache, the working copies) by their content."""
    import hashlib

    from pipelines.versioning import revision_files

    return {
        hashlib.md5(path.read_bytes()).hexdigest()
        for rev in held["dataset_revisions"]
        for files in revision_files(settings, rev).values()
        for path in files.values()
    }


def test_after_an_erasure_in_its_window_the_champion_is_rebuilt_from_its_recorded_training_set(
    demo_stack, tmp_path
):
    """#57 item 5, on a copy of the stack's installation (the shared stack is left as it was): a customer of
    the champion's training set is erased (the lake rebuilt without them), so the lake no longer rebuilds
    that set; `mlops reproduce` retrains from the DVC copy the version recorded, says so, and comes within
    the tolerance. The erasure names that copy and the champion as what still holds the customer. Costs an
    erasure's rebuild of gold (a Spark driver of its own) and one retrain."""
    from core import pseudonym
    from core.settings import Settings
    from training.dataset import TRAINING_SET_MEMBER, read_training_set

    version = demo_stack.summary["champion_version"]
    [made] = [r for r in demo_stack.summary["retrains"] if r.get("model_version") == version]
    home = _copy_home(demo_stack.home, tmp_path / "home")
    settings = Settings(home=home)
    trained_on = set(
        read_training_set(settings, made["training_set_rev"], columns=["customer_id"])["customer_id"]
    )
    pseudonyms = pseudonym.for_settings(settings)
    who = next(c for c in _landed_customers(home) if pseudonyms.customer(c) in trained_on)
    # The copy has no scoring service of its own: the stack's, on the stack's port, serves the original.
    env = {"MLOPS_HOME": str(home), "MLOPS_SERVING__PORT": str(free_port())}

    erased = mlops_json(demo_stack, "erase", "--customer", who, env=env)
    assert erased["rebuilt"], erased
    assert erased["live_state"]["status"] == "not_running", erased["live_state"]
    held = erased["held_by"]
    assert TRAINING_SET_MEMBER in held["dataset_revisions"][made["training_set_rev"]]
    champion = [v for v in held["model_versions"] if v["version"] == version]
    assert champion and "champion" in champion[0]["aliases"], held["model_versions"]
    # Every store the demo wrote, scanned byte by byte (tests/e2e/test_privacy.py's reading): neither their
    # id nor their pseudonym anywhere but in the DVC objects of the revisions the report names (the cache, the
    # remote, and the working copies: the same contents).
    kept = _held_contents(settings, held)
    found = _holding(home, {who, pseudonyms.customer(who)})
    assert {path for path, md5 in found.items() if md5 not in kept} == set()
    assert any(md5 in kept for md5 in found.values())  # the scan can find them: in what the report names

    record = mlops_json(demo_stack, "reproduce", version, env=env)
    data = record["training_set"]
    assert not data["hash_equal"] and data["source"] == "recorded DVC copy", data
    assert data["recorded_md5"] in record["reason"] and made["training_set_rev"] in record["reason"]
    assert record["status"] == "reproduced", record
    for metric, compared in record["metrics"].items():
        assert compared["within"], (metric, compared)
