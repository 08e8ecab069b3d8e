"""Airflow assets that chain the DAGs (ingest -> features -> retrain, features and scoring -> monitor ->
retrain). Importing costs only airflow.sdk."""

from __future__ import annotations

from airflow.sdk import Asset

# `x-` schemes are free for users; the path is relative to $MLOPS_HOME, resolved at run time.
SILVER_TRANSACTIONS = Asset(
    name="silver_transactions", uri="x-mlops://lake/silver/transactions", group="fraud"
)
SILVER_LABELS = Asset(name="silver_labels", uri="x-mlops://lake/silver/labels", group="fraud")
# Gold validated and versioned: what the training set reads (the retrain DAG starts on it).
FRAUD_FEATURES = Asset(name="fraud_features", uri="x-mlops://lake/gold", group="fraud")
# The same dates loaded into the Feast online store: what a scorer reads.
FRAUD_FEATURES_ONLINE = Asset(name="fraud_features_online", uri="x-mlops://feast/online", group="fraud")
FRAUD_MODEL = Asset(name="fraud_model", uri="x-mlops://mlflow/models/fraud-detector", group="fraud")
# The scoring service's log (serving/scoring_log.py) has a day's rows: posted by whoever closes the day
# (`POST /api/v2/assets/events`, extra {"event_dates": ["YYYY-MM-DD", ...]}); the monitor DAG starts on it.
SCORING_LOG = Asset(name="scoring_log", uri="x-mlops://scoring_log", group="fraud")
# The monitor DAG found drift against the champion's training reference: its extra names the days, the
# drifted inputs with their PSI and KS, and a one-line summary; the retrain DAG starts on it.
FRAUD_DRIFT = Asset(name="fraud_drift", uri="x-mlops://monitoring/drift", group="fraud")
# A candidate passed the gate and waits for a person (settings `approval.enabled`): its extra names the
# version, the champion it was compared with and who started the run; the approval DAG starts on it.
FRAUD_MODEL_CANDIDATE = Asset(
    name="fraud_model_candidate", uri="x-mlops://mlflow/models/fraud-detector/candidates", group="fraud"
)
