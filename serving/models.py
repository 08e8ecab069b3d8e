"""The scoring service's models: the champion (scores returned) and the latest challenger (scored in shadow,
logged, never returned), loaded from the MLflow registry as the ONNX files the export step logged.

`ModelSource` is the registry and the promotion history behind a small interface (champion, versions,
artifacts). The champion served is the one the promotion history records (training/ledger.py), never simply
what MLflow's `champion` alias names: every move through `mlops` (gate, approval, promote, rollback) writes a
history row with its actor before it moves the alias, so an alias moved with MLflow's own client or UI names a
version nobody recorded; it is not served, and the service says so (`Models.alias_problem`, /status) while
the monitoring check alerts it. `Models` holds what is loaded and follows the history: every
`reload_interval_s` it reads it and, when the champion changed, loads the new version beside the old one and
swaps the reference (one assignment). A request takes the pair once, so it
is scored by one consistent champion whatever moves meanwhile, and no request waits on or fails because of
a load. A version that cannot be loaded leaves the previous one serving and says why (`Models.problem`);
with no champion loaded at all the service answers 503 with that reason and never scores.

A version is addressed by the input names it was trained on, which its ONNX file records
(model_contract.onnx INPUTS_METADATA): the service builds every declared input (MODEL_INPUTS) once per
request, and each loaded version takes its own columns of it, by name, so a champion and a shadow trained
on different features are each given their own vector. A version that takes an input the service does not
build (a feature removed from the declarations), or whose file records no names, is refused at load with
the names: it is never scored on a guess.
"""

from __future__ import annotations

import functools
import logging
import tempfile
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from model_contract import operating_point
from model_contract.inputs import MODEL_INPUTS, ModelInputError, input_positions
from model_contract.onnx import (
    CHAMPION_ALIAS,
    INPUT_NAME,
    MODEL_NAME,
    SERVING_FILE_TAG,
    input_width,
    recorded_baseline,
    recorded_inputs,
    session,
)

if TYPE_CHECKING:
    from core.settings import Settings

log = logging.getLogger(__name__)

ONNX_DIR = "onnx"
FP32_FILE = "model.onnx"
INT8_FILE = "model.int8.onnx"  # kept by the export only where it was faster and as accurate


class ModelUnavailableError(RuntimeError):
    """No model can be served; the message says why and what to do."""


@dataclass(frozen=True)
class LoadedModel:
    name: str
    version: str
    run_id: str
    file: str  # which ONNX file of the run: the one the export chose (onnx.serving_file), model.onnx, ...
    session: Any  # onnxruntime.InferenceSession
    inputs: tuple[str, ...] = MODEL_INPUTS  # the names it was trained on, in its matrix's order
    # Its own operating point (model_contract/operating_point.py: chosen on its holdout at training,
    # recorded on the version), else `serving.threshold` for a version registered before versions had one.
    threshold: float = 0.5
    review_threshold: float | None = None  # a review band from here up to `threshold`; None: none
    threshold_source: str = "serving.threshold"
    # Each of its inputs' reference value, in `inputs` order (model_contract/onnx.py BASELINE_METADATA): what
    # a decision's reasons are measured against (serving/reasons.py). None: its export recorded none.
    baseline: tuple[float, ...] | None = None

    @functools.cached_property
    def columns(self) -> list[int] | None:
        """Its inputs' positions among MODEL_INPUTS (None: all of them, in that order)."""
        return None if self.inputs == MODEL_INPUTS else input_positions(self.inputs)

    def score(self, x: np.ndarray) -> np.ndarray:
        """Fraud probabilities of the float32 rows of `x`, a matrix of every declared input (MODEL_INPUTS
        order, as the service builds it): the version is given its own inputs of it, by name."""
        columns = self.columns
        return self.score_own(x if columns is None else np.ascontiguousarray(x[:, columns]))

    def score_own(self, x: np.ndarray) -> np.ndarray:
        """Fraud probabilities of the float32 rows of `x`, which holds this version's inputs in its order."""
        return np.asarray(self.session.run(None, {INPUT_NAME: x})[0], dtype="float64").reshape(-1)


@dataclass(frozen=True)
class Champion:
    """The champion the promotion history records (None: none yet), the file to serve of it, and the version
    MLflow's champion alias names."""

    version: str | None
    file: str | None
    alias: str | None

    @property
    def out_of_band(self) -> str | None:
        """Why the alias disagrees with the history, or None when it agrees (a promotion between its
        history row and its alias move disagrees for an instant: the history's version is served)."""
        if self.alias == self.version:
            return None
        return (
            f"MLflow's {CHAMPION_ALIAS!r} alias points at {_label(self.alias)}, but the promotion history's "
            f"champion is {_label(self.version)}: the alias was moved outside `mlops` (MLflow's client or "
            f"UI) and is not served; `mlops promote --version {self.alias or 'N'} --reason ...` records it "
            "if it was meant, else `mlops history` shows what to set it back to"
        )


def _label(version: str | None) -> str:
    return f"v{version}" if version else "no version"


class ModelSource:
    """The registered model's aliases, versions and ONNX artifacts (MLflow's client: the local profile's
    SQLite registry or a tracking server over HTTP with proxied artifacts)."""

    def __init__(
        self,
        tracking_uri: str,
        name: str = MODEL_NAME,
        cache_dir: Path | None = None,
        ledger_url: str | None = None,
        default_threshold: float = 0.5,
    ) -> None:
        from mlflow import MlflowClient

        self.name = name
        self.default_threshold = default_threshold  # a version without an operating point decides at it
        self.client = MlflowClient(tracking_uri=tracking_uri, registry_uri=tracking_uri)
        self.cache_dir = cache_dir or Path(tempfile.mkdtemp(prefix="mlops-serving-"))
        self.ledger = None
        if ledger_url:
            from model_contract.promotion_history import LedgerReader

            self.ledger = LedgerReader(ledger_url)

    def champion(self) -> Champion | None:
        """The champion the promotion history records (training/ledger.py: every gate pass, approval,
        `mlops promote` and rollback is a row there, with its actor), the file its export chose to serve (its
        `onnx.serving_file` tag, which changes when the version's smaller variants are made after its
        promotion), and where MLflow's alias points; None before any promotion. The alias is not what is
        served: one moved with MLflow's client or UI names a version no gate, approval or person recorded."""
        from mlflow.exceptions import MlflowException

        if self.ledger is None:
            raise ModelUnavailableError(
                "no promotion history to read the champion from: the service serves only what the history "
                "records; set MLOPS_SERVING__LEDGER_URL (a read-only login to it)"
            )
        recorded, _ = self.ledger.champion(self.name)
        try:
            alias: str | None = str(self.client.get_model_version_by_alias(self.name, CHAMPION_ALIAS).version)
        except MlflowException as exc:
            if exc.error_code not in {"RESOURCE_DOES_NOT_EXIST", "INVALID_PARAMETER_VALUE"}:
                raise
            alias = None
        if recorded is None:
            return None if alias is None else Champion(None, None, alias)
        tags = self.client.get_model_version(self.name, recorded).tags or {}
        return Champion(recorded, tags.get(SERVING_FILE_TAG), alias)

    def latest_challenger(self, champion: str | None) -> str | None:
        """The newest registered version other than the champion that is newer than it: the candidate the
        gate saw last (kept or not), which is what a shadow should watch."""
        from mlflow.exceptions import MlflowException

        try:
            versions = self.client.search_model_versions(f"name='{self.name}'", max_results=200)
        except MlflowException as exc:
            if exc.error_code == "RESOURCE_DOES_NOT_EXIST":
                return None
            raise
        numbers = sorted((int(v.version) for v in versions), reverse=True)
        floor = int(champion) if champion else 0
        return next((str(n) for n in numbers if n > floor), None)

    def load(self, version: str, threads: int = 1) -> LoadedModel:
        """The version's ONNX model: the file its export chose (the version's tag `onnx.serving_file`: the
        smallest variant as accurate as fp32, training/export.py); for a version exported before that tag,
        its int8 file where the export kept one, else fp32. Raises ModelUnavailableError naming the version
        and what is missing."""
        from mlflow.exceptions import MlflowException

        try:
            model_version = self.client.get_model_version(self.name, version)
            run_id = model_version.run_id
        except MlflowException as exc:
            raise ModelUnavailableError(
                f"{self.name} v{version} cannot be read from the registry: {exc}"
            ) from exc
        if not run_id:
            raise ModelUnavailableError(
                f"{self.name} v{version} has no training run to take its ONNX file from"
            )
        try:
            listed = {Path(a.path).name for a in self.client.list_artifacts(run_id, ONNX_DIR)}
        except (MlflowException, OSError) as exc:
            raise ModelUnavailableError(
                f"{self.name} v{version}: its run's artifacts cannot be listed: {exc}"
            ) from exc
        chosen = (model_version.tags or {}).get(SERVING_FILE_TAG)
        if chosen and chosen not in listed:
            raise ModelUnavailableError(
                f"{self.name} v{version}: its export chose {ONNX_DIR}/{chosen} (tag {SERVING_FILE_TAG}) but "
                f"run {run_id} has no such file (it has {sorted(listed)}); run `mlops export --version "
                f"{version}` again"
            )
        try:
            point = operating_point.from_tags(model_version.tags)
        except operating_point.OperatingPointTagError as exc:
            raise ModelUnavailableError(
                f"{self.name} v{version}: its operating point cannot be used ({exc}); the tags are written "
                "by `mlops register` from the run's evaluation: set them back, or register the run again"
            ) from exc
        decides: dict[str, Any] = {"threshold": self.default_threshold}
        if point is not None:
            decides = {
                "threshold": point.threshold,
                "review_threshold": point.review_threshold,
                "threshold_source": f"operating point (at most {point.target_decline_rate:.2%} declined)",
            }
        file = chosen or (INT8_FILE if INT8_FILE in listed else FP32_FILE)
        if file not in listed:
            raise ModelUnavailableError(
                f"{self.name} v{version} has no ONNX export (no {ONNX_DIR}/{FP32_FILE} in run {run_id}); "
                f"run `mlops export --version {version}` (the retrain DAG's export task does it)"
            )
        target = self.cache_dir / f"v{version}"
        target.mkdir(parents=True, exist_ok=True)
        try:
            local = self.client.download_artifacts(run_id, f"{ONNX_DIR}/{file}", str(target))
            sess = session(Path(local), threads=threads)
            inputs = recorded_inputs(sess)
        except Exception as exc:  # a corrupt file, an artifact store that cannot be reached
            raise ModelUnavailableError(
                f"{self.name} v{version}: {ONNX_DIR}/{file} cannot be loaded: {exc}"
            ) from exc
        servable = servable_inputs(self.name, version, file, sess, inputs)
        return LoadedModel(
            self.name,
            version,
            run_id,
            file,
            sess,
            servable,
            **decides,
            baseline=recorded_baseline(sess, servable),
        )


def servable_inputs(
    name: str, version: str, file: str, sess: Any, inputs: tuple[str, ...] | None
) -> tuple[str, ...]:
    """The inputs a loaded file takes, checked against what the service builds; raises
    ModelUnavailableError naming what it lacks (the version is then not served: never scored on a guess)."""
    who = f"{name} v{version}"
    if inputs is None:
        raise ModelUnavailableError(
            f"{who}: {ONNX_DIR}/{file} records no input names (exported before they were recorded), so "
            f"the service cannot tell which columns it takes; run `mlops export --version {version}` to "
            "export it again"
        )
    width = input_width(sess)
    if width is not None and width != len(inputs):
        raise ModelUnavailableError(
            f"{who}: {ONNX_DIR}/{file} takes {width} columns but records {len(inputs)} input names; export "
            f"it again (`mlops export --version {version}`)"
        )
    try:
        input_positions(inputs, MODEL_INPUTS, who)
    except ModelInputError as exc:
        raise ModelUnavailableError(f"not ready to serve: {exc}") from exc
    return inputs


@dataclass(frozen=True)
class Loaded:
    """What a request is scored with: one consistent pair."""

    champion: LoadedModel | None
    shadow: LoadedModel | None


class Models:
    """The champion and shadow in use, following the registry's aliases (see the module docstring)."""

    def __init__(self, source: ModelSource, shadow: bool = True, reload_interval_s: float = 5.0) -> None:
        self.source = source
        self.shadow_enabled = shadow
        self.reload_interval_s = reload_interval_s
        self.current = Loaded(None, None)
        self.problem: str | None = "no champion loaded yet"
        # MLflow's alias moved outside the promotion history (Champion.out_of_band): not served, said here,
        # at /status and in the monitoring check's alert (alias_out_of_band).
        self.alias_problem: str | None = None
        self.reloads = 0
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._lock = threading.Lock()  # one refresh at a time (the thread and an explicit call)

    @classmethod
    def from_settings(cls, settings: Settings) -> Models:
        return cls(
            ModelSource(
                settings.mlflow_tracking_uri,
                ledger_url=settings.serving_ledger_url,
                default_threshold=settings.serving.threshold,
            ),
            shadow=settings.serving.shadow,
            reload_interval_s=settings.serving.reload_interval_s,
        )

    def refresh(self) -> Loaded:
        """Read the aliases; load and swap in whatever moved. Never raises: a failure keeps what serves."""
        with self._lock:
            current = self.current
            try:
                found = self.source.champion()
            except ModelUnavailableError as exc:
                self.problem = str(exc)
                log.warning("%s", self.problem)
                return current
            except Exception as exc:
                self.problem = f"the promotion history or the model registry cannot be read: {exc}"
                log.warning("%s", self.problem)
                return current
            moved = found.out_of_band if found is not None else None
            if moved != self.alias_problem:
                if moved:
                    log.warning("%s", moved)
                self.alias_problem = moved
            champion = current.champion
            wanted, wanted_file = (found.version, found.file) if found is not None else (None, None)
            if wanted is None:
                if champion is None:
                    self.problem = (
                        f"the promotion history records no champion of {self.source.name} yet; run the "
                        "retrain DAG (or `mlops promote`) until one passes the gate"
                    )
                    if moved:
                        self.problem += f" ({moved})"
                    return current
            elif (
                champion is None
                or champion.version != wanted
                or (wanted_file is not None and champion.file != wanted_file)
            ):  # a new champion, or the same one whose smaller variants were made since (compress)
                try:
                    champion = self.source.load(wanted)
                    self.problem = None
                except ModelUnavailableError as exc:
                    self.problem = str(exc)
                    log.warning(
                        "champion v%s not loaded, %s: %s",
                        wanted,
                        "keeping the previous" if current.champion else "nothing to serve",
                        exc,
                    )
            else:
                self.problem = None
            shadow = current.shadow if self.shadow_enabled else None
            if self.shadow_enabled:
                try:
                    challenger = self.source.latest_challenger(champion.version if champion else None)
                    if challenger is None:
                        shadow = None
                    elif shadow is None or shadow.version != challenger:
                        shadow = self.source.load(challenger)
                except Exception as exc:  # the shadow never stops the champion from serving
                    log.warning("shadow challenger not loaded: %s", exc)
            loaded = Loaded(champion, shadow)
            if loaded != current:
                self.reloads += 1
                self.current = loaded
                log.info(
                    "serving champion v%s, shadow %s",
                    champion.version if champion else None,
                    f"v{shadow.version}" if shadow else "none",
                )
            return loaded

    def start(self) -> None:
        self.refresh()
        self._thread = threading.Thread(target=self._follow, name="model-reload", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        if self._thread:
            self._thread.join(timeout=10)

    def _follow(self) -> None:
        while not self._stop.wait(self.reload_interval_s):
            self.refresh()
