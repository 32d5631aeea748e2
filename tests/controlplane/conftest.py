"""Fixtures of the control-plane tests: the distributed mode run for real, process by process.

Each test module gets

* its own ``redis-server`` on a free loopback port (``--save "" --appendonly no``: a restart
  loses everything, as the Redis-restart test wants), started and stopped by its PID, never the
  shared server on 6379;
* a fresh PostgreSQL database on 127.0.0.1:5432, created and dropped through psycopg and
  migrated with ``Store.upgrade()``;
* a :class:`ControlPlane`: the ``BURST_*`` environment every process of the module shares, a
  policy file with second-scale timings (cluster ``controlplane``), and helpers that start Celery
  workers, beats and the controller API as subprocesses in their own process groups, logging to
  files, all killed in teardown together with any local-provider node left running.

Workers, beat and the API run as ``burst worker``, ``burst beat`` and ``burst api``; where the
CLI lacks one of these commands, as its documented equivalent (``python -m celery -A
orchestrator.automation.app worker|beat``, or a small script serving
``orchestrator.api.create_app`` over the worker runtime).
"""

from __future__ import annotations

import json
import os
import re
import secrets
import signal
import subprocess
import sys
import time
import urllib.request
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psycopg
import pytest
import redis

from orchestrator.store import Store
from tests.e2e.helpers import burst_cmd, free_port, kill_all, node_processes
from tests.processes import READY_S, wait_for

REPO = Path(__file__).resolve().parents[2]
PG_ADMIN_DSN = os.environ.get("BURST_TEST_PG_ADMIN_DSN", "postgresql://postgres@127.0.0.1:5432/postgres")
POLICY_NAME = "cp"
CLUSTER = "controlplane"
TICK_S = 1.0

# Second-scale timings like tests/e2e/fast-policy.yaml, with a cluster of its own.
POLICY_YAML = f"""\
# Control-plane tests: a policy with second-scale timings.
version: 1
name: {POLICY_NAME}
cluster: {CLUSTER}
pool:
  name: gpu
  onprem: {{nodes: 1, gpus_per_node: 4}}
trigger: {{pending_gpus_above: 0, oldest_wait_above: 1s, sustained_for: 1s}}
offerings:
  - {{provider: local, region: local, zone: local-a, instance_type: local.4gpu, market: spot,
     fallback_on_demand: true, gpus: 4, price_usd_hour: 4.10}}
limits: {{max_nodes: 3, max_concurrent_launches: 3}}
scale_down: {{idle_for: 2s, drain_grace: 30s}}
timeouts: {{launch: 30s, boot: 60s, join: 30s, terminate: 30s, heartbeat: 30s}}
cooldowns: {{scale_up: 1s, scale_down: 2s}}
"""

API_SCRIPT = """\
import signal, sys, threading
from orchestrator.api import create_app
from orchestrator.api.server import ApiServer
from orchestrator.automation.runtime import runtime
rt = runtime()
server = ApiServer(create_app(rt), rt.settings.api_host, rt.settings.api_port)
print(f"burst api (test script) serving on port {server.start()}", flush=True)
stop = threading.Event()
signal.signal(signal.SIGTERM, lambda *_: stop.set())
signal.signal(signal.SIGINT, lambda *_: stop.set())
stop.wait()
server.stop()
"""


# -- Redis ------------------------------------------------------------------------------------------

class RedisServer:
    """A private redis-server on ``port``, without persistence, started and stopped by PID."""

    def __init__(self, port: int, workdir: Path):
        self.port = port
        self.workdir = workdir
        self.proc: subprocess.Popen[bytes] | None = None
        self.log = workdir / "redis.log"

    def url(self, db: int = 0) -> str:
        return f"redis://127.0.0.1:{self.port}/{db}"

    def client(self, db: int = 0) -> redis.Redis:
        return redis.Redis.from_url(self.url(db), socket_connect_timeout=2, socket_timeout=5)

    def start(self, timeout: float = 10.0) -> None:
        assert self.proc is None or self.proc.poll() is not None, "redis-server already running"
        self.workdir.mkdir(parents=True, exist_ok=True)
        self.proc = subprocess.Popen(
            ["redis-server", "--port", str(self.port), "--bind", "127.0.0.1", "--save", "",
             "--appendonly", "no", "--dir", str(self.workdir), "--logfile", str(self.log)],
            stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.STDOUT,
            start_new_session=True)
        deadline = time.monotonic() + timeout
        while True:
            if self.proc.poll() is not None:
                raise RuntimeError(f"redis-server on port {self.port} exited: "
                                   f"{self.log.read_text() if self.log.exists() else ''}")
            try:
                client = self.client()
                try:
                    if client.ping():
                        return
                finally:
                    client.close()
            except redis.exceptions.ConnectionError:
                pass
            if time.monotonic() > deadline:
                raise RuntimeError(f"redis-server on port {self.port} did not answer in {timeout}s")
            time.sleep(0.05)

    def stop(self, sig: int = signal.SIGTERM, timeout: float = 10.0) -> None:
        if self.proc is None or self.proc.poll() is not None:
            return
        self.proc.send_signal(sig)
        try:
            self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait(5)


@pytest.fixture(scope="module")
def redis_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RedisServer]:
    if subprocess.run(["which", "redis-server"], capture_output=True, check=False).returncode != 0:
        pytest.fail("redis-server is not on PATH (apt-get install -y redis-server)", pytrace=False)
    server = RedisServer(free_port(), tmp_path_factory.mktemp("redis"))
    server.start()
    try:
        yield server
    finally:
        server.stop()


# -- PostgreSQL -------------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def cp_database() -> Iterator[str]:
    """A new, migrated PostgreSQL database for the module; its SQLAlchemy URL."""
    try:
        admin = psycopg.connect(PG_ADMIN_DSN, autocommit=True, connect_timeout=3)
    except psycopg.OperationalError as exc:
        pytest.fail(f"PostgreSQL at {PG_ADMIN_DSN} is not reachable: {exc}", pytrace=False)
    name = f"burst_cp_{os.getpid()}_{secrets.token_hex(4)}"
    admin.execute(f'CREATE DATABASE "{name}"')
    url = f"postgresql+psycopg://postgres@127.0.0.1:5432/{name}"
    try:
        store = Store(url)
        store.upgrade()
        store.close()
        yield url
    finally:
        admin.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
        admin.close()


# -- the control plane ------------------------------------------------------------------------------

def _cli_has(command: str) -> bool:
    try:
        from orchestrator.cli import app as cli
    except Exception:  # noqa: BLE001 - a CLI being written by someone else may not import yet
        return False
    names = {c.name or (c.callback.__name__ if c.callback else None) for c in cli.registered_commands}
    return command in names


class ControlPlane:
    """The environment and processes of one module's distributed control plane."""

    def __init__(self, root: Path, redis_server: RedisServer, database_url: str,
                 policy_text: str, extra_env: dict[str, str] | None = None,
                 boot_delay_s: float = 0.5):
        self.root = root
        self.redis = redis_server
        self.database_url = database_url
        self.state_dir = root / "state"
        self.logs = root / "logs"
        self.logs.mkdir(parents=True, exist_ok=True)
        self.policy_path = root / "policy.yaml"
        self.policy_path.write_text(policy_text)
        self.api_port = free_port()
        self.settings_kwargs: dict[str, Any] = {
            "database_url": database_url,
            "state_dir": self.state_dir,
            "policy_files": [self.policy_path],
            "broker_url": redis_server.url(0),
            "result_backend": redis_server.url(1),
            "redis_url": redis_server.url(2),
            "tick_s": TICK_S,
            "local_boot_delay_s": boot_delay_s,
            "api_port": self.api_port,
            "visibility_timeout_s": 5.0,
            # Given, so no two processes race to create state_dir/secret.key on first start.
            "secret_key": "controlplane-test-secret-" + secrets.token_hex(8),
        }
        self.env: dict[str, str] = {
            "BURST_DATABASE_URL": database_url,
            "BURST_STATE_DIR": str(self.state_dir),
            "BURST_POLICY_FILES": json.dumps([str(self.policy_path)]),
            "BURST_BROKER_URL": redis_server.url(0),
            "BURST_RESULT_BACKEND": redis_server.url(1),
            "BURST_REDIS_URL": redis_server.url(2),
            "BURST_TICK_S": str(TICK_S),
            "BURST_LOCAL_BOOT_DELAY_S": str(boot_delay_s),
            "BURST_API_PORT": str(self.api_port),
            "BURST_VISIBILITY_TIMEOUT_S": "5",
            "BURST_SECRET_KEY": self.settings_kwargs["secret_key"],
            "BURST_LOG_LEVEL": "INFO",
            "PYTHONUNBUFFERED": "1",
            **(extra_env or {}),
        }
        self.procs: dict[str, subprocess.Popen[bytes]] = {}
        self._celery = None
        self._store: Store | None = None

    # -- settings, store and Celery client of the test process -----------------------------------

    def settings(self):
        from orchestrator.wiring import Settings

        return Settings(**self.settings_kwargs)

    @property
    def store(self) -> Store:
        if self._store is None:
            self._store = Store(self.database_url)
        return self._store

    @property
    def celery(self):
        """A Celery client configured exactly like the workers' app (routes, transport options)."""
        if self._celery is None:
            from orchestrator.automation.app import create_celery

            self._celery = create_celery(self.settings(), [POLICY_NAME])
        return self._celery

    def runtime(self):
        """A runtime of the test process on the same database (no providers: it never launches)."""
        from orchestrator.policy import load_policy
        from orchestrator.wiring import build_runtime

        return build_runtime(self.settings(), [load_policy(self.policy_path)], upgrade=False,
                             providers={})

    # -- processes ---------------------------------------------------------------------------------

    def start(self, name: str, argv: list[str]) -> subprocess.Popen[bytes]:
        assert name not in self.procs or self.procs[name].poll() is not None, f"{name} is running"
        with (self.logs / f"{name}.log").open("ab") as log:
            proc = subprocess.Popen(argv, cwd=REPO, env={**os.environ, **self.env},
                                    stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT,
                                    start_new_session=True)
        self.procs[name] = proc
        return proc

    def log(self, name: str) -> str:
        path = self.logs / f"{name}.log"
        return path.read_text(errors="replace") if path.exists() else ""

    def worker(self, name: str, *, concurrency: int = 4, pool: str = "threads",
               wait: bool = True) -> subprocess.Popen[bytes]:
        options = ["-n", f"{name}@%h", "-P", pool, "-c", str(concurrency),
                   "-Q", "burst.control,burst.provider", "-l", "INFO"]
        if _cli_has("worker"):
            argv = burst_cmd("worker", *options)
        else:  # the documented equivalent
            argv = [sys.executable, "-m", "celery", "-A", "orchestrator.automation.app", "worker",
                    *options, "--without-gossip", "--without-mingle", "--without-heartbeat"]
        proc = self.start(name, argv)
        if wait:
            self.wait_ready(name)
        return proc

    def wait_ready(self, *names: str, timeout: float = READY_S) -> None:
        """Wait for workers to log that they consume (``<name>@host ready.``)."""
        for name in names:
            pattern = re.compile(rf"{re.escape(name)}@\S+ ready\.")
            wait_for(lambda name=name, pattern=pattern: self._alive_or_fail(name)
                     and pattern.search(self.log(name)), timeout, 0.1, f"worker {name} ready")

    def beat(self, name: str = "beat") -> subprocess.Popen[bytes]:
        schedule = str(self.root / f"{name}-schedule")
        if _cli_has("beat"):
            argv = burst_cmd("beat", "-s", schedule, "-l", "INFO")
        else:  # the documented equivalent
            argv = [sys.executable, "-m", "celery", "-A", "orchestrator.automation.app", "beat",
                    "-s", schedule, "--pidfile", str(self.root / f"{name}.pid"), "-l", "INFO"]
        return self.start(name, argv)

    def api(self, timeout: float = READY_S) -> subprocess.Popen[bytes]:
        """The controller API (agents register and report there), waited for until it answers."""
        if _cli_has("api"):
            argv = burst_cmd("api")
        else:
            argv = [sys.executable, "-c", API_SCRIPT]
        proc = self.start("api", argv)

        def healthy() -> bool:
            self._alive_or_fail("api")
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{self.api_port}/healthz", timeout=1) as r:
                    return r.status == 200
            except OSError:
                return False

        wait_for(healthy, timeout, 0.2, "the controller API")
        return proc

    def _alive_or_fail(self, name: str) -> bool:
        proc = self.procs[name]
        if proc.poll() is not None:
            raise AssertionError(f"{name} exited with {proc.returncode}:\n{self.log(name)[-4000:]}")
        return True

    def kill(self, name: str, sig: int = signal.SIGKILL, timeout: float = 15.0) -> None:
        """Signal the whole process group of ``name`` (all of a worker's threads/children)."""
        proc = self.procs.get(name)
        if proc is None or proc.poll() is not None:
            return
        try:
            os.killpg(proc.pid, sig)
        except ProcessLookupError:
            return
        try:
            proc.wait(timeout)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(5)

    def stop(self, name: str) -> None:
        """Warm shutdown (SIGTERM), then SIGKILL after a grace period."""
        self.kill(name, signal.SIGTERM, timeout=15.0)

    def stop_all(self) -> None:
        for name in list(self.procs):
            self.kill(name, signal.SIGTERM, timeout=10.0)

    def close(self) -> None:
        for name in list(self.procs):
            self.kill(name, signal.SIGKILL, timeout=5.0)
        kill_all(self.node_marker)
        if self._celery is not None:
            self._celery.close()
        if self._store is not None:
            self._store.close()

    # -- what tests read -----------------------------------------------------------------------------

    @property
    def node_marker(self) -> str:
        """In the command line of every local-provider node process of this module."""
        return str(self.state_dir / "local-provider")

    def node_processes(self) -> list:
        return node_processes(self.node_marker)

    def instance_records(self) -> list[dict]:
        folder = self.state_dir / "local-provider" / "instances"
        return [json.loads(p.read_text()) for p in sorted(folder.glob("lcl-*.json"))]

    def instances_per_node(self) -> Counter[str]:
        return Counter(r["tags"]["burst:node-id"] for r in self.instance_records())

    def task_results(self) -> list[dict]:
        """Every task result still in the result backend (``celery-task-meta-*``)."""
        client = self.redis.client(1)
        try:
            found = []
            for key in client.scan_iter("celery-task-meta-*", count=500):
                raw = client.get(key)
                if raw:
                    found.append(json.loads(raw))
            return found
        finally:
            client.close()

    def burst(self, *args: str, timeout: float = 60.0) -> subprocess.CompletedProcess[str]:
        result = subprocess.run(burst_cmd(*args), capture_output=True, text=True, timeout=timeout,
                                cwd=REPO, env={**os.environ, **self.env}, check=False)
        if result.returncode != 0:
            raise AssertionError(f"burst {' '.join(args)} failed ({result.returncode}):\n"
                                 f"{result.stdout}\n{result.stderr}")
        return result

    def wait(self, predicate, timeout: float, what: str, interval: float = 0.25):
        """``wait_for`` that shows the processes' logs when it times out."""
        try:
            return wait_for(predicate, timeout, interval, what)
        except AssertionError as exc:
            raise AssertionError(f"{exc}\n{self.logs_text()}") from None

    def logs_text(self) -> str:
        return "\n".join(f"===== {p.name}\n{p.read_text(errors='replace')[-3000:]}"
                         for p in sorted(self.logs.glob("*.log")))


@pytest.fixture(scope="module")
def cp_policy() -> str:
    """The policy text of the module's control plane (a module may override this fixture)."""
    return POLICY_YAML


@pytest.fixture(scope="module")
def cp_extra_env() -> dict[str, str]:
    """Extra environment for the module's processes (a module may override this fixture)."""
    return {}


@pytest.fixture(scope="module")
def cp(tmp_path_factory: pytest.TempPathFactory, redis_server: RedisServer, cp_database: str,
       cp_policy: str, cp_extra_env: dict[str, str]) -> Iterator[ControlPlane]:
    plane = ControlPlane(tmp_path_factory.mktemp("cp"), redis_server, cp_database, cp_policy,
                         cp_extra_env)
    try:
        yield plane
    finally:
        plane.close()
