"""`mlops lineage <version>`: the graph of a registered model version, read from the OpenLineage events the
steps wrote (core/lineage.py), upstream to the landing files and downstream to its alias moves, its ONNX
files and the scoring-log days it served.

Upstream, each dataset is taken as its newest producing run before the run that read it (a lake partition
is rewritten when late data comes; the run that read it saw the build before): the graph is the one that
made this version, not today's lake. Each dataset on the way carries the GX results of its newest
validation before that read. Where the version itself has no producing event (events lost, or a version
registered before lineage existed), its run and training set come from the registry's tags, and the
result says so under `from_registry`.
"""

from __future__ import annotations

from collections import defaultdict
from typing import TYPE_CHECKING, Any

from core import lineage

if TYPE_CHECKING:
    from core.settings import Settings

Key = tuple[str, str]


def _key(dataset: dict[str, Any]) -> Key:
    return dataset["namespace"], dataset["name"]


def _edge(source: Key, target: Key, event: dict[str, Any], origin: str = "event") -> dict[str, Any]:
    return {
        "from": list(source),
        "to": list(target),
        "job": event["job"]["name"] if event else "",
        "run_id": event["run"]["runId"] if event else "",
        "time": event["eventTime"] if event else "",
        "origin": origin,
    }


class Graph:
    """The COMPLETE events indexed by what they read and wrote."""

    def __init__(self, events: list[dict[str, Any]]) -> None:
        self.producers: dict[Key, list[dict]] = defaultdict(list)
        self.consumers: dict[Key, list[dict]] = defaultdict(list)
        for event in events:  # oldest first
            for dataset in event.get("outputs", []):
                self.producers[_key(dataset)].append(event)
            for dataset in event.get("inputs", []):
                self.consumers[_key(dataset)].append(event)

    def producer(self, node: Key, before: str | None) -> dict | None:
        made = [e for e in self.producers.get(node, []) if before is None or e["eventTime"] <= before]
        return made[-1] if made else None

    def quality(self, node: Key, before: str | None) -> dict | None:
        """The newest validation of `node` before `before`: its suite, outcome and assertions."""
        for event in reversed(self.consumers.get(node, [])):
            if before is not None and event["eventTime"] > before:
                continue
            for dataset in event["inputs"]:
                facet = dataset.get("inputFacets", {}).get("dataQualityAssertions")
                if _key(dataset) == node and facet:
                    assertions = facet.get("assertions", [])
                    return {
                        "job": event["job"]["name"],
                        "time": event["eventTime"],
                        "suite": next((a.get("name") for a in assertions), None),
                        "success": all(a["success"] for a in assertions),
                        "assertions": len(assertions),
                        "failed": [
                            f"{a['assertion']} {a.get('column', '')}".strip()
                            for a in assertions
                            if not a["success"]
                        ],
                    }
        return None


def lineage_of(settings: Settings, version: str) -> dict[str, Any]:
    """The graph of model version `version`, upstream and downstream, as edges (from, to, job, run)."""
    from model_contract.onnx import MODEL_NAME

    graph = Graph(lineage.read_events(settings))
    root = lineage.model_version(settings, MODEL_NAME, version).key
    upstream: list[dict] = []
    from_registry: list[str] = []
    quality: dict[str, dict] = {}
    stack: list[tuple[Key, str | None]] = [(root, None)]
    if graph.producer(root, None) is None:
        stack = _from_registry(settings, version, root, upstream, from_registry)
    seen: set[tuple[Key, str]] = set()
    missing: list[list[str]] = []
    while stack:
        node, before = stack.pop()
        checked = graph.quality(node, before)
        if checked:
            quality[f"{node[0]} {node[1]}"] = checked
        event = graph.producer(node, before)
        if event is None:
            if node[0] != "file" or not _is_landing(settings, node):
                missing.append(list(node))
            continue
        if (node, event["run"]["runId"]) in seen:
            continue
        seen.add((node, event["run"]["runId"]))
        for dataset in event.get("inputs", []):
            upstream.append(_edge(_key(dataset), node, event))
            stack.append((_key(dataset), event["eventTime"]))
    downstream: list[dict] = []
    made = graph.producer(root, None)
    frontier = [(root, made["eventTime"] if made else "")]
    reached: set[Key] = {root}
    while frontier:
        node, after = frontier.pop()
        for event in graph.consumers.get(node, []):
            if event["eventTime"] < after:
                continue
            for dataset in event.get("outputs", []):
                downstream.append(_edge(node, _key(dataset), event))
                if _key(dataset) not in reached:
                    reached.add(_key(dataset))
                    frontier.append((_key(dataset), event["eventTime"]))
    return {
        "model": MODEL_NAME,
        "model_version": str(version),
        "root": list(root),
        "upstream": upstream,
        "downstream": downstream,
        "quality": quality,
        "from_registry": from_registry,
        "missing": missing,
    }


def _is_landing(settings: Settings, node: Key) -> bool:
    """A landing file: where the graph starts (nothing produced it)."""
    from pathlib import Path

    return Path(node[1]).is_relative_to(settings.landing.absolute())


def _from_registry(
    settings: Settings, version: str, root: Key, upstream: list[dict], notes: list[str]
) -> list[tuple[Key, str | None]]:
    """No event made `root`: its run and training set from the registry's tags, said in `notes`."""
    from training.dataset import TRAINING_SET_MEMBER
    from training.registry import ModelRegistry

    found = ModelRegistry(settings.mlflow_tracking_uri).version(version)  # LookupError when there is none
    run = lineage.mlflow(settings, f"runs/{found.run_id}").key
    upstream.append(_edge(run, root, {}, origin="registry"))
    notes.append(f"no lineage event registered v{version}: its run {found.run_id} is the registry's")
    rev = (found.tags or {}).get("lineage.training_set_rev")
    if not rev:
        notes.append(f"v{version} has no lineage.training_set_rev tag: its training set is unknown")
        return [(run, None)]
    training_set = lineage.dvc_revision(settings, TRAINING_SET_MEMBER, rev).key
    upstream.append(_edge(training_set, run, {}, origin="registry"))
    notes.append(f"the training set {rev} of run {found.run_id} is its lineage.training_set_rev tag")
    return [(training_set, None)]


def describe(settings: Settings, graph: dict[str, Any]) -> list[str]:
    """The graph as lines for a person: each edge as `job: from -> to`, paths under $MLOPS_HOME shortened."""
    home = str(settings.home.absolute()) + "/"

    def short(node: list[str]) -> str:
        return node[1].removeprefix(home) if node[0] == "file" else node[1]

    lines = [f"{graph['model']} v{graph['model_version']}", "upstream (what made it):"]
    for edge in graph["upstream"]:
        lines.append(f"  {edge['job'] or edge['origin']}: {short(edge['from'])} -> {short(edge['to'])}")
    lines.append("data quality (GX, the newest validation before the read):")
    for name, checked in sorted(graph["quality"].items()):
        outcome = "passed" if checked["success"] else f"FAILED {', '.join(checked['failed'])}"
        lines.append(f"  {name.removeprefix('file ').removeprefix(home)}: {checked['suite']} {outcome}")
    lines.append("downstream (what it made):")
    for edge in graph["downstream"]:
        lines.append(f"  {edge['job']}: {short(edge['from'])} -> {short(edge['to'])}")
    lines += [f"from the registry: {note}" for note in graph["from_registry"]]
    lines += [f"no event produced: {short(node)}" for node in graph["missing"]]
    return lines
