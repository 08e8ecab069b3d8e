"""The end-to-end benchmark's history in bulk, in one warm process (`python -m benchmarks._e2e_setup START
DAYS ROWS SEED EPOCHS`, with MLOPS_HOME set to an empty folder).

Replaying 30 days of 1M transactions through Airflow (ingest, features and a retrain per day) takes hours on
2 cores; the measured day needs only their results. So: the synthetic feed's first DAYS days are landed
(no injected faults), written to silver by Arrow, typed like silver (benchmarks/gold.py: the jobs after
ingest read silver only), then every date goes through the real features job (build_gold, GX, DVC, Feast,
the training rows) in this one process (one JVM, warm after the first date), and a champion is trained,
gated and registered as of the last date by the real retrain. Prints one JSON line: seconds per phase.
"""

from __future__ import annotations

import json
import sys
import time
from datetime import date, timedelta


def main(start: date, days: int, rows: int, seed: int, epochs: int) -> dict:
    from benchmarks.gold import write_silver
    from core.settings import get_settings
    from mlops import chain
    from pipelines.synthetic.landing import land_synthetic
    from training import steps
    from training.loop import TrainConfig

    settings = get_settings()
    settings.ensure_dirs()
    if any(settings.lake.iterdir()) or any(settings.landing.iterdir()):
        raise SystemExit(f"MLOPS_HOME={settings.home} is not empty; the set-up starts from nothing")
    seconds: dict[str, float] = {}
    started = time.perf_counter()
    land_synthetic(settings, start=start, days=days, rows_per_day=rows, seed=seed, feed_start=start)
    seconds["land"] = time.perf_counter() - started
    started = time.perf_counter()
    write_silver(settings.landing, settings.lake)
    seconds["silver (Arrow)"] = time.perf_counter() - started
    features = []
    for offset in range(days):
        day = start + timedelta(days=offset)
        started = time.perf_counter()
        chain.features(settings, day)
        features.append(time.perf_counter() - started)
        print(f"features {day}: {features[-1]:.1f}s", file=sys.stderr, flush=True)
    seconds["features"] = sum(features)
    started = time.perf_counter()
    champion = steps.retrain(
        settings,
        start + timedelta(days=days - 1),
        TrainConfig.from_settings(settings.training, epochs=epochs),
        dag_id="benchmark-setup",
    )
    seconds["champion"] = time.perf_counter() - started
    if champion.get("decision") != "promoted":
        raise SystemExit(f"the set-up's model was not promoted: {champion.get('reason')}")
    return {"seconds": seconds, "features_seconds_per_date": features, "champion": champion["model_version"]}


if __name__ == "__main__":
    first, count, per_day, rng_seed, n_epochs = sys.argv[1:6]
    result = main(date.fromisoformat(first), int(count), int(per_day), int(rng_seed), int(n_epochs))
    print(json.dumps(result))
