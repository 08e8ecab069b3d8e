"""Connection arguments for Airflow's metadata database on SQLite (the local profile), which scripts/up.sh
names in AIRFLOW__DATABASE__SQL_ALCHEMY_CONNECT_ARGS for every Airflow component it starts.

SQLite lets one writer in at a time. The scheduler, the api-server (the REST API and the task execution
API) and the dag-processor all write, and on a busy 2-core machine a write can hold the lock for seconds:
with pysqlite's default of 5 s a waiting request fails with "database is locked" (HTTP 500, a lost task
heartbeat). Waiting up to 30 s turns those into delays. Importing this module has no side effect.
"""

SQLITE_CONNECT_ARGS = {"timeout": 30}
