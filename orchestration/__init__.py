"""Airflow glue: assets, the arrival sensor, the step runner, the training task, its Kubernetes contract."""
