"""Test harness: tiers by folder, an isolated Airflow home, and a report of DAG parse times.

Airflow reads its configuration when it is first imported, so its environment is set here, before any
test module imports it. Every test session gets its own AIRFLOW_HOME and MLOPS_HOME, removed afterwards.
"""

from __future__ import annotations

import contextlib
import functools
import json
import logging
import os
import shutil
import signal
import socket
import subprocess
import tempfile
import time
import urllib.request
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
TIERS = ("unit", "dags", "data", "model", "integration", "e2e")

_SESSION_DIR = Path(tempfile.mkdtemp(prefix="mlops-tests-"))
os.environ["AIRFLOW_HOME"] = str(_SESSION_DIR / "airflow")
os.environ["AIRFLOW__CORE__DAGS_FOLDER"] = str(REPO / "dags")
os.environ["AIRFLOW__CORE__LOAD_EXAMPLES"] = "False"
os.environ["AIRFLOW__CORE__UNIT_TEST_MODE"] = "True"
os.environ["AIRFLOW__DATABASE__SQL_ALCHEMY_CONN"] = f"sqlite:///{_SESSION_DIR / 'airflow' / 'airflow.db'}"
os.environ["MLOPS_HOME"] = str(_SESSION_DIR / "mlops-home")
os.environ.pop("MLOPS_PROFILE", None)
# py4j logs "closing down" from finalizers after pytest has closed its streams.
logging.getLogger("py4j").setLevel(logging.WARNING)


def tier_of(nodeid: str) -> str:
    """The tier of a test by its node id (tests/<tier>/...); "other" outside the tier folders."""
    parts = nodeid.split("::", 1)[0].split("/")
    return parts[1] if len(parts) > 2 and parts[0] == "tests" and parts[1] in TIERS else "other"


# --- Parallel runs (pytest-xdist, `make test`; docs/testing.md, "Parallel workers")
#
# Tests run on several worker processes, in groups: every test of a group runs on one worker, in file order,
# so a module's fixtures are built once. A group is a test module, except where modules share a set-up too
# large to build once per worker: every module that uses one of SHARED_SETUPS joins that set-up's group.
# Groups start longest first (the seconds of the last recorded run, GROUP_COSTS), so the long ones do not
# start last and hold the run's end; a worker takes its next group only when its current one is down to
# its last test (LongestFirstScheduling), so nothing short waits behind a long test.
#
# Only the workers collect, so they tell the scheduler (in the controller) each test's group through a file
# the controller names (GROUPS_ENV). xdist's own `xdist_group` marks are not used: xdist 3.8 rewrites the
# node id to carry them, which pytest 9.2's node ids no longer allow, so they are silently ignored.
SHARED_SETUPS = {
    "demo_stack": "e2e-demo-stack",  # tests/e2e/conftest.py: `mlops demo` through Airflow, once per run
    "airflow_image": "podman-images",  # tests/integration/podman.py: the project images, built at once
    "training_image": "podman-images",
    "serving_image": "podman-images",
}
# The first test of a shared set-up's group pays for the set-up in its own time: a test timeout that fits it
# on a busy machine (the e2e stack's own is set in tests/e2e/conftest.py).
SETUP_TIMEOUTS = {"podman-images": 2400}
GROUP_COSTS = REPO / "tests" / "group_costs.json"
GROUPS_ENV = "MLOPS_TEST_GROUPS"
# The controller's: workers inherit it (read once here: a test may empty the environment).
GROUPS_FILE = Path(os.environ.setdefault(GROUPS_ENV, str(_SESSION_DIR / "groups.json")))


def _group_costs() -> dict[str, float]:
    try:
        return {str(k): float(v) for k, v in json.loads(GROUP_COSTS.read_text()).items()}
    except (OSError, ValueError):
        return {}


@functools.cache
def _written_groups() -> dict[str, str]:
    """The groups the workers wrote; read once, when the scheduler first asks (after every collection)."""
    with contextlib.suppress(OSError, ValueError):
        return json.loads(GROUPS_FILE.read_text())
    return {}


def group_of(nodeid: str) -> str:
    """The group of a test: as the workers wrote it; its module without xdist."""
    return _written_groups().get(nodeid) or nodeid.split("::", 1)[0]


def _assign_groups(items: list[pytest.Item]) -> None:
    """Every item's group, the items ordered longest group first (file order within one); written for the
    scheduler where this process is an xdist worker."""
    modules: dict[str, str] = {}
    for item in items:
        module = item.nodeid.split("::", 1)[0]
        modules.setdefault(module, module)
        shared = {SHARED_SETUPS[f] for f in getattr(item, "fixturenames", ()) if f in SHARED_SETUPS}
        if len(shared) > 1:
            raise pytest.UsageError(f"{item.nodeid} uses set-ups of two groups: {sorted(shared)}")
        if shared:
            modules[module] = shared.pop()
    groups = {item.nodeid: modules[item.nodeid.split("::", 1)[0]] for item in items}
    for item in items:
        if groups[item.nodeid] in SETUP_TIMEOUTS:
            item.add_marker(pytest.mark.timeout(SETUP_TIMEOUTS[groups[item.nodeid]]))
    if not os.environ.get("PYTEST_XDIST_WORKER"):
        return  # in one process, file order: the e2e stacks never overlap (tests/e2e/conftest.py)
    costs = _group_costs()
    first_seen: dict[str, int] = {}
    for group in groups.values():
        first_seen.setdefault(group, len(first_seen))
    rank = {g: r for r, g in enumerate(sorted(first_seen, key=lambda g: (-costs.get(g, 0.0), first_seen[g])))}
    items.sort(key=lambda item: rank[groups[item.nodeid]])
    if not GROUPS_FILE.exists():
        temp = GROUPS_FILE.with_name(f"{GROUPS_FILE.name}.{os.getpid()}")
        temp.write_text(json.dumps(groups))
        os.replace(temp, GROUPS_FILE)  # every worker writes the same map; whole files only


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """A test's tier is the folder it lives in: a new test file needs no marker to be selected."""
    for item in items:
        tier = tier_of(item.nodeid)
        if tier != "other":
            item.add_marker(getattr(pytest.mark, tier))
    _assign_groups(items)


@pytest.hookimpl(optionalhook=True)
def pytest_xdist_make_scheduler(config: pytest.Config, log):
    if config.getvalue("dist") != "loadgroup":
        return None
    from xdist.scheduler import LoadScopeScheduling

    class LongestFirstScheduling(LoadScopeScheduling):
        """xdist's scope scheduling with our groups as the scopes, in collection order (longest first, as
        ordered above, not by their number of tests), and a worker's next group sent only when it is on its
        last test (xdist's default sends it with two left, and a short group can then wait behind a long
        test)."""

        def __init__(self, config: pytest.Config, log=None) -> None:
            super().__init__(config, log)
            config.option.loadscopereorder = False

        def _split_scope(self, nodeid: str) -> str:
            return group_of(nodeid)

        def _reschedule(self, node) -> None:
            if node.shutting_down:
                return
            if not self.workqueue:
                node.shutdown()
                return
            if self._pending_of(self.assigned_work[node]) > 1:
                return
            self._assign_work_unit(node)

    return LongestFirstScheduling(config, log)


_TIMES: dict[str, dict[str, list[float]]] = {"tier": {}, "group": {}}
# (seconds, test) of each set-up phase of a second or more: a shared set-up shows on its first test.
_SETUPS: list[tuple[float, str]] = []


def pytest_runtest_logreport(report: pytest.TestReport) -> None:
    """Per tier and per group: the seconds of every phase of every test, and when the first began and the
    last ended (on the controller under xdist, where every worker's reports arrive)."""
    if hasattr(report, "node") or os.environ.get("PYTEST_XDIST_WORKER") is None:
        for kind, key in (("tier", tier_of(report.nodeid)), ("group", group_of(report.nodeid))):
            total, first, last = _TIMES[kind].get(key, [0.0, report.start, report.stop])
            _TIMES[kind][key] = [total + report.duration, min(first, report.start), max(last, report.stop)]
        if report.when == "setup" and report.duration >= 1.0:
            _SETUPS.append((report.duration, report.nodeid))
    for name, value in report.user_properties:
        if name == "dag_parse_seconds":
            PARSE_TIMES[report.nodeid.split("[", 1)[-1].split("]", 1)[0]] = float(value)


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    shutil.rmtree(_SESSION_DIR, ignore_errors=True)


PARSE_TIMES: dict[str, float] = {}


def _free_disk() -> str:
    """Free space where the tests write (the temporary folder, the checkout, podman's storage): a run that
    fills the disk fails in many unrelated ways, and this line tells it apart."""
    places = {"tmp": Path(tempfile.gettempdir()), "checkout": REPO, "podman": Path("/var/lib/containers")}
    shown = []
    for name, place in places.items():
        if place.exists():
            shown.append(f"{name} {shutil.disk_usage(place).free / 2**30:.1f} GiB")
    return "free disk: " + ", ".join(shown)


def pytest_report_header(config: pytest.Config) -> str:
    return _free_disk()


def pytest_terminal_summary(terminalreporter, exitstatus: int, config: pytest.Config) -> None:
    terminalreporter.write_line(f"at the end, {_free_disk()}")
    if _TIMES["tier"]:
        terminalreporter.section("time per tier (summed over tests; wall: first start to last end)")
        for tier, (total, first, last) in sorted(_TIMES["tier"].items()):
            terminalreporter.write_line(f"  {tier:<12} {total:8.0f} s summed {last - first:8.0f} s wall")
        groups = sorted(_TIMES["group"].items(), key=lambda kv: -kv[1][0])
        terminalreporter.section("longest test groups (seconds summed over their tests)")
        for group, (total, _, _) in groups[:25]:
            terminalreporter.write_line(f"  {total:8.0f} s  {group}")
        summary = os.environ.get("MLOPS_TEST_SUMMARY")
        if summary:  # .ci/run prints it after every phase has ended, the last thing in the log
            lines = ["slowest set-ups (the set-up phase of the test that paid for it):"]
            slowest = sorted(_SETUPS, reverse=True)[:15]
            lines += [f"  {seconds:8.0f} s  {nodeid}" for seconds, nodeid in slowest]
            lines += ["slowest test groups (modules, or a shared set-up's tests; seconds summed):"]
            lines += [f"  {total:8.0f} s  {group}" for group, (total, _, _) in groups[:15]]
            Path(summary).write_text("\n".join(lines) + "\n")
        out = os.environ.get("MLOPS_TEST_GROUP_COSTS")
        if out:  # `make test-costs`: the figures the next run orders its groups by
            costs = {group: round(total, 1) for group, (total, _, _) in groups}
            Path(out).write_text(json.dumps(costs, indent=1, sort_keys=True) + "\n")
    if PARSE_TIMES:
        terminalreporter.section("DAG parse time (import of the file, after airflow.sdk)")
        for name, seconds in sorted(PARSE_TIMES.items()):
            terminalreporter.write_line(f"  {name:<40} {seconds * 1000:8.1f} ms")


@pytest.fixture(autouse=True)
def _fresh_settings(monkeypatch: pytest.MonkeyPatch, tmp_path: Path):
    """Each test gets its own MLOPS_HOME and a fresh settings cache."""
    from core.settings import get_settings

    monkeypatch.setenv("MLOPS_HOME", str(tmp_path / "mlops-home"))
    get_settings.cache_clear()
    yield
    get_settings.cache_clear()


@pytest.fixture
def alert_receiver(monkeypatch: pytest.MonkeyPatch):
    """A webhook and a mail server on 127.0.0.1 (tests/receivers.py), with the alert settings pointing at
    them for this test."""
    from core.settings import get_settings
    from tests.receivers import AlertReceiver

    receiver = AlertReceiver()
    for name, value in receiver.environment().items():
        monkeypatch.setenv(name, value)
    get_settings.cache_clear()
    yield receiver
    receiver.close()
    get_settings.cache_clear()


@pytest.fixture(scope="session")
def spark():
    """One local Spark session for the test process, configured as the pipeline configures it."""
    from core.settings import Settings
    from pipelines.spark import spark_session

    session = spark_session(Settings(spark_driver_memory="1g", spark_shuffle_partitions=2))
    yield session
    session.stop()


# A Spark JVM that a test starts for one command (the CLI in a child process, the reference lake's build)
# lives for seconds to minutes on a small feed: the client compiler only, as the stacks' JVMs
# (tests/e2e/conftest.py `stack_env`), where it cut the shared demo from 321 to 225 s. Not the test process's
# own driver, which lives for the whole run and repays the server compiler.
SHORT_LIVED_SPARK = {"MLOPS_SPARK_JAVA_OPTIONS": "-XX:TieredStopAtLevel=1"}


def child_env(**more: str) -> dict[str, str]:
    """The environment for a child process that runs a Spark command of the product: this process's, with
    SHORT_LIVED_SPARK where the caller has not set Spark's JVM options, and `more`."""
    return {**SHORT_LIVED_SPARK, **os.environ, **more}


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def wait_for(condition, timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if condition():
            return
        time.sleep(0.05)
    raise TimeoutError(f"gave up after {timeout:.0f}s waiting for {what}")


def machine_lock(name: str):
    """A lock held across this machine's processes (parallel test workers, two test runs): for set-ups
    that change the machine itself, such as an apt-get install, which fails while another one runs."""
    from filelock import FileLock

    return FileLock(Path(tempfile.gettempdir()) / f"mlops-tests-{name}.lock", timeout=1800)


SPARK_WORKERS = 2


@pytest.fixture(scope="session")
def spark_standalone(tmp_path_factory):
    """A Spark standalone cluster on loopback: a Master and two Workers (one core, 1 GiB each), started with
    the pyspark package's own spark-class, stopped at the end of the session. Yields the master URL; the
    Master's JSON status is at `spark_standalone_status(url)`."""
    import pyspark

    spark_home = Path(pyspark.__file__).parent
    spark_class = str(spark_home / "bin" / "spark-class")
    work = tmp_path_factory.mktemp("spark-standalone")
    port, ui = free_port(), free_port()
    env = {
        **os.environ,
        "SPARK_HOME": str(spark_home),
        "SPARK_LOG_DIR": str(work / "logs"),
        "SPARK_LOCAL_IP": "127.0.0.1",
    }
    url = f"spark://127.0.0.1:{port}"
    commands = {
        "master": ["org.apache.spark.deploy.master.Master", "--host", "127.0.0.1", "--port", str(port),
                   "--webui-port", str(ui)],
        **{
            f"worker-{n}": ["org.apache.spark.deploy.worker.Worker", "--host", "127.0.0.1", "--cores", "1",
                            "--memory", "1g", "--webui-port", str(free_port()), "--work-dir",
                            str(work / f"worker-{n}"), url]
            for n in range(1, SPARK_WORKERS + 1)
        },
    }  # fmt: skip
    processes = []
    logs = []
    for name, arguments in commands.items():
        logs.append((work / f"{name}.log").open("w"))
        processes.append(
            subprocess.Popen(
                [spark_class, *arguments],
                env=env,
                stdout=logs[-1],
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        )
    _STANDALONE_UI[url] = f"http://127.0.0.1:{ui}/json/"

    def workers_alive() -> bool:
        status = spark_standalone_status(url)
        return status is not None and status.get("aliveworkers", 0) >= SPARK_WORKERS

    try:
        wait_for(workers_alive, 120, f"{SPARK_WORKERS} Spark workers to register with {url} (logs in {work})")
        yield url
    finally:
        for process in reversed(processes):
            os.killpg(process.pid, signal.SIGTERM)
            process.wait(timeout=30)
        for handle in logs:
            handle.close()


_STANDALONE_UI: dict[str, str] = {}


def spark_standalone_status(url: str) -> dict | None:
    """The Master's JSON status (workers, active and completed applications), None while it is not up."""
    try:
        with urllib.request.urlopen(_STANDALONE_UI[url], timeout=2) as response:
            return json.load(response)
    except (OSError, ValueError):  # not up yet, or the UI answers before its JSON endpoint is ready
        return None
