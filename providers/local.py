"""Local provider: a "cloud node" is a local process running the node agent.

The embedded default and ``burst demo`` burst onto this machine: ``launch`` spawns the node agent
as its own session (so the node survives the controller's Ctrl-C, like a real VM would), and the
"cloud API" is a directory of JSON records, one per instance, so a restarted controller sees the
same fleet. It keeps the whole ``Provider`` contract, idempotency on the request id included, so the
executor and reconciler run against it exactly as against a cloud.

State directory layout::

    lock                        fcntl lock serialising launches and record updates across processes
    instances/<id>.json         {id, request_id, tags, offering_key, pid, create_time, launched_at,
                                 state, terminated_at}
    instances/<id>.user-data    the bootstrap handed to the agent (mode 0600: it holds a join token)
    instances/<id>.log          the agent's stdout and stderr
    instances/<id>.work/        the agent's working directory (job logs)

A stockout is simulated from outside the process with ``capacity_file``: every offering key listed
in it, one per line, fails to launch with :class:`CapacityError`.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import logging
import os
import secrets
import shutil
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import psutil

from orchestrator import domain as _domain
from orchestrator.domain.offerings import Offering
from orchestrator.domain.ports import (
    CapacityError,
    Instance,
    InstanceState,
    InvalidRequest,
    LaunchRequest,
    TransientError,
)
from orchestrator.policy.models import Market
from orchestrator.policy.timefmt import parse_aware

log = logging.getLogger(__name__)

PROVIDER_NAME = "local"
REGION = "local"
ZONE = "local-a"
GPU_MODEL = "simulated"
# Priced like an A100 on-demand at the big clouds, with spot at roughly a third, so local demos
# and the planner's cost arithmetic see realistic numbers.
ON_DEMAND_USD_PER_GPU_HOUR = 4.10
SPOT_FRACTION = 0.35
GPU_COUNTS = (1, 2, 4, 8)

TERMINATE_GRACE_S = 5.0
_CREATE_TIME_TOLERANCE_S = 0.05
_AGENT_MODULE = "orchestrator.fabric.agent"
# The agent runs from this checkout even when burst is not installed: the node runs the controller's
# own code, as a cloud image built from the same release would.
_CODE_ROOT = Path(_domain.__file__).resolve().parents[2]


def default_offerings() -> list[Offering]:
    """``local.{1,2,4,8}gpu`` in both markets."""
    offerings = []
    for gpus in GPU_COUNTS:
        for market, fraction in ((Market.ON_DEMAND, 1.0), (Market.SPOT, SPOT_FRACTION)):
            offerings.append(
                Offering(
                    provider=PROVIDER_NAME,
                    region=REGION,
                    zone=ZONE,
                    instance_type=f"local.{gpus}gpu",
                    market=market,
                    gpus=gpus,
                    price_usd_hour=round(ON_DEMAND_USD_PER_GPU_HOUR * fraction * gpus, 4),
                    gpu_model=GPU_MODEL,
                    vcpus=12 * gpus,
                    memory_gib=96.0 * gpus,
                )
            )
    return offerings


# Runs "$@" (the agent), then idles until signalled; SIGTERM/SIGINT end it at once.
_INSTANCE_SHELL = 'trap "exit 0" TERM INT; "$@"; while :; do sleep 3600 & wait $!; done'


class LocalProvider:
    """The ``Provider`` whose instances are node-agent processes on this machine."""

    name = PROVIDER_NAME
    # A local node is its agent's process: the agent exiting is the node ending.
    self_terminate_command: str | None = None

    def __init__(
        self,
        state_dir: Path,
        *,
        offerings: list[Offering] | None = None,
        boot_delay_s: float = 2.0,
        agent_command: list[str] | None = None,
        capacity_file: Path | None = None,
    ):
        self.state_dir = Path(state_dir)
        self.boot_delay_s = float(boot_delay_s)
        self.agent_command = list(agent_command) if agent_command is not None else None
        self.capacity_file = Path(capacity_file) if capacity_file is not None else None
        catalogue = list(offerings) if offerings is not None else default_offerings()
        foreign = [o.key for o in catalogue if o.provider != PROVIDER_NAME]
        if foreign:
            raise ValueError(f"LocalProvider offerings must have provider 'local': {foreign}")
        self._catalogue = {o.key: o for o in catalogue}
        self._instances_dir = self.state_dir / "instances"
        self._instances_dir.mkdir(parents=True, exist_ok=True)
        self._lock_path = self.state_dir / "lock"
        # Children this object spawned, kept so they are reaped instead of lingering as zombies.
        self._children: dict[str, subprocess.Popen[bytes]] = {}
        self._children_lock = threading.Lock()

    # -- Provider -----------------------------------------------------------------------------

    def offerings(self) -> list[Offering]:
        return list(self._catalogue.values())

    def launch(self, req: LaunchRequest) -> list[Instance]:
        offering = req.offering
        if offering.provider != PROVIDER_NAME or offering.key not in self._catalogue:
            raise InvalidRequest(
                f"offering {offering.key} is not in the local catalogue",
                provider=self.name,
                offering_key=offering.key,
                request_id=req.request_id,
                code="UnknownOffering",
            )
        with self._os_errors(req), self._locked():
            existing = self._find_by_request(req.request_id)
            if existing is not None:
                log.info("launch %s already done: instance %s", req.request_id, existing["id"])
                return [self._observe(existing)]
            self._check_capacity(req)
            return [self._launch_new(req)]

    def describe(self, ids: list[str]) -> list[Instance]:
        wanted = set(ids)
        with self._os_errors(), self._locked():
            return [self._observe(r) for r in self._records() if r["id"] in wanted]

    def list_owned(self, cluster: str) -> list[Instance]:
        with self._os_errors(), self._locked():
            return [
                self._observe(r)
                for r in self._records()
                if r.get("tags", {}).get("burst:cluster") == cluster
            ]

    def terminate(self, ids: list[str]) -> None:
        for instance_id in ids:
            with self._os_errors(), self._locked():
                record = self._read(instance_id)
                if record is not None:
                    self._observe(record)  # settles a half-done launch and a node already dead
            if record is None or record["state"] == "terminated":
                continue
            # Outside the lock: waiting out the grace period must not stall other launches.
            self._kill_node(record)
            with self._os_errors(), self._locked():
                record = self._read(instance_id)
                if record is not None and record["state"] != "terminated":
                    self._mark_terminated(record)
            log.info("terminated %s", instance_id)

    # -- extras (not part of the Protocol) -----------------------------------------------------

    def gc(self, older_than_s: float = 3600.0) -> int:
        """Delete the records and files of instances terminated more than ``older_than_s`` ago.

        A request id whose record was collected is forgotten: launching it again starts a new node.
        Returns how many instances were removed.
        """
        cutoff = time.time() - older_than_s
        removed = 0
        with self._os_errors(), self._locked():
            for record in self._records():
                self._observe(record)
                if record["state"] != "terminated" or (record.get("terminated_at") or 0) > cutoff:
                    continue
                base = self._instances_dir / record["id"]
                for suffix in (".user-data", ".log", ".json"):
                    base.with_name(base.name + suffix).unlink(missing_ok=True)
                shutil.rmtree(base.with_name(base.name + ".work"), ignore_errors=True)
                removed += 1
        return removed

    # -- launching ----------------------------------------------------------------------------

    def _launch_new(self, req: LaunchRequest) -> Instance:
        instance_id = f"lcl-{secrets.token_hex(6)}"
        record: dict[str, Any] = {
            "id": instance_id,
            "request_id": req.request_id,
            "tags": req.tags.as_dict(),
            "offering_key": req.offering.key,
            "pid": None,
            "create_time": None,
            "launched_at": datetime.now(UTC).isoformat(),
            "state": "pending",
            "terminated_at": None,
        }
        # Written before the spawn: if we die between the two, the record still exists and the
        # next look adopts the orphaned process (see _resolve_pending) instead of leaking it.
        self._write(record)
        user_data = self._path(instance_id, ".user-data")
        fd = os.open(user_data, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "w") as out:
            out.write(req.user_data)
        try:
            proc = self._spawn(instance_id, user_data)
        except OSError as exc:
            self._path(instance_id, ".json").unlink(missing_ok=True)
            user_data.unlink(missing_ok=True)
            error = (
                InvalidRequest
                if isinstance(exc, FileNotFoundError | PermissionError)
                else TransientError
            )
            raise error(
                f"could not start the node agent: {exc}",
                provider=self.name,
                offering_key=req.offering.key,
                request_id=req.request_id,
            ) from exc
        # The child is unreaped until we poll it, so its create_time is readable even if it died.
        record.update(
            pid=proc.pid, create_time=psutil.Process(proc.pid).create_time(), state="running"
        )
        self._write(record)
        log.info("launched %s (pid %d) for request %s", instance_id, proc.pid, req.request_id)
        return self._observe(record)

    def _spawn(self, instance_id: str, user_data: Path) -> subprocess.Popen[bytes]:
        if self.agent_command is None:
            command = [sys.executable, "-m", _AGENT_MODULE, "--user-data", str(user_data)]
        else:
            command = [part.replace("{user_data}", str(user_data)) for part in self.agent_command]
        # The instance is a small shell that runs the agent and then stays up, as a VM does after
        # its agent exits (e.g. once a drain released it): the instance lives until terminate()
        # signals its group, so "agent finished" is never mistaken for "instance vanished".
        command = ["/bin/sh", "-c", _INSTANCE_SHELL, "burst-local-instance", *command]
        work_dir = self._path(instance_id, ".work")
        work_dir.mkdir(exist_ok=True)
        env = dict(os.environ)
        env.update(
            BURST_BOOT_DELAY_S=repr(self.boot_delay_s),
            BURST_INSTANCE_ID=instance_id,
            BURST_WORK_DIR=str(work_dir),
            PYTHONPATH=os.pathsep.join(p for p in (str(_CODE_ROOT), env.get("PYTHONPATH")) if p),
        )
        with open(self._path(instance_id, ".log"), "ab") as out:
            proc = subprocess.Popen(
                command,
                stdin=subprocess.DEVNULL,
                stdout=out,
                stderr=subprocess.STDOUT,
                cwd=work_dir,
                env=env,
                # Its own session and process group: Ctrl-C in the controller's terminal does not
                # reach the node, and terminate can signal the node's whole group at once.
                start_new_session=True,
            )
        with self._children_lock:
            self._children[instance_id] = proc
        return proc

    def _check_capacity(self, req: LaunchRequest) -> None:
        if self.capacity_file is None:
            return
        try:
            lines = self.capacity_file.read_text().splitlines()
        except FileNotFoundError:
            return
        stocked_out = {line.strip() for line in lines if line.strip() and not line.startswith("#")}
        if req.offering.key in stocked_out:
            raise CapacityError(
                f"no local capacity for {req.offering.key} (listed in {self.capacity_file})",
                provider=self.name,
                offering_key=req.offering.key,
                request_id=req.request_id,
                code="InsufficientCapacity",
            )

    # -- observing ----------------------------------------------------------------------------

    def _observe(self, record: dict[str, Any]) -> Instance:
        """The instance as it is now; a process found dead is recorded as terminated. Locked."""
        if record["state"] == "pending" and record["pid"] is None:
            self._resolve_pending(record)
        if record["state"] == "running":
            self._reap(record["id"])
            if not _node_alive(record["pid"], record["create_time"]):
                self._mark_terminated(record)
        state = (
            InstanceState.RUNNING if record["state"] == "running" else InstanceState.TERMINATED
        )
        return Instance(
            id=record["id"],
            provider=self.name,
            state=state,
            tags=dict(record["tags"]),
            offering_key=record["offering_key"],
            launched_at=parse_aware(record["launched_at"], "launched_at", assume_utc=True),
        )

    def _resolve_pending(self, record: dict[str, Any]) -> None:
        """A pid-less record seen under the lock is a launch that died mid-way: find its process.

        With no process, nothing was ever created (the launcher died before or while spawning):
        the record is removed, as a cloud forgets a launch that never ran, so the launch repeated
        with the same request id starts a node. Marked terminated instead, that retry would get
        a dead instance back, and a node launched onto it would "vanish" at once (the Celery
        chaos run found this after a worker was killed mid-launch)."""
        for proc in psutil.process_iter(["pid", "environ"]):
            env = proc.info.get("environ") or {}
            if env.get("BURST_INSTANCE_ID") == record["id"]:
                with contextlib.suppress(psutil.Error):
                    record.update(pid=proc.pid, create_time=proc.create_time(), state="running")
                    self._write(record)
                    log.warning("adopted orphaned node process %d as %s", proc.pid, record["id"])
                    return
        log.warning("launch %s of request %s died before its node started: forgotten",
                    record["id"], record["request_id"])
        for suffix in (".json", ".user-data"):
            self._path(record["id"], suffix).unlink(missing_ok=True)
        record.update(state="never-started")

    def _mark_terminated(self, record: dict[str, Any]) -> None:
        record.update(state="terminated", terminated_at=time.time())
        self._write(record)
        self._reap(record["id"])

    def _reap(self, instance_id: str) -> None:
        with self._children_lock:
            proc = self._children.get(instance_id)
            if proc is not None and proc.poll() is not None:
                del self._children[instance_id]

    # -- terminating --------------------------------------------------------------------------

    def _kill_node(self, record: dict[str, Any]) -> None:
        """SIGTERM the node's group, wait for the agent, then SIGKILL whatever is left of it."""
        pid, create_time = record["pid"], record["create_time"]
        if pid is None:
            return
        self._reap(record["id"])
        try:
            proc = psutil.Process(pid)
            if abs(proc.create_time() - create_time) > _CREATE_TIME_TOLERANCE_S:
                return  # the pid now belongs to someone else: nothing of ours to kill
        except psutil.NoSuchProcess:
            proc = None  # the agent is gone; its jobs may not be
        except psutil.AccessDenied:
            return  # we spawned as this user; a process we may not inspect is not ours
        if proc is not None and _alive(pid, create_time):
            _signal_group(pid, signal.SIGTERM)
            with self._children_lock:
                child = self._children.get(record["id"])
            if child is not None:
                try:
                    child.wait(TERMINATE_GRACE_S)
                    stopped = True
                except subprocess.TimeoutExpired:
                    stopped = False
            else:
                # Not our child (spawned before a restart): poll, as only its parent can reap it.
                stopped = _wait_dead([proc], timeout_s=TERMINATE_GRACE_S)
            if not stopped:
                log.warning(
                    "node %s ignored SIGTERM for %.0fs; killing it", record["id"], TERMINATE_GRACE_S
                )
        # Job processes live in their own groups inside the node's session; sweep the session so a
        # killed agent leaves no orphaned work behind.
        _signal_group(pid, signal.SIGKILL)
        stragglers = _session_members(pid)
        for proc in stragglers:
            with contextlib.suppress(psutil.Error):
                proc.kill()
        _wait_dead(stragglers, timeout_s=1.0)
        self._reap(record["id"])

    # -- records ------------------------------------------------------------------------------

    @contextlib.contextmanager
    def _locked(self) -> Iterator[None]:
        # flock locks belong to the open file description, so separate opens exclude each other
        # across threads of one process as well as across processes.
        fd = os.open(self._lock_path, os.O_RDWR | os.O_CREAT, 0o600)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)
            yield
        finally:
            os.close(fd)

    @contextlib.contextmanager
    def _os_errors(self, req: LaunchRequest | None = None) -> Iterator[None]:
        try:
            yield
        except OSError as exc:
            raise TransientError(
                f"local provider state unavailable: {exc}",
                provider=self.name,
                offering_key=req.offering.key if req else None,
                request_id=req.request_id if req else None,
            ) from exc

    def _path(self, instance_id: str, suffix: str) -> Path:
        return self._instances_dir / f"{instance_id}{suffix}"

    def _records(self) -> list[dict[str, Any]]:
        """Every instance record, half-done launches settled first (adopted or forgotten). Locked."""
        records = []
        for path in sorted(self._instances_dir.glob("lcl-*.json")):
            record = self._read(path.name.removesuffix(".json"))
            if record is not None and record["state"] == "pending" and record["pid"] is None:
                self._resolve_pending(record)
            if record is not None and record["state"] != "never-started":
                records.append(record)
        return records

    def _read(self, instance_id: str) -> dict[str, Any] | None:
        try:
            return json.loads(self._path(instance_id, ".json").read_text())
        except FileNotFoundError:
            return None
        except ValueError:
            log.error("ignoring unreadable instance record %s", instance_id)
            return None

    def _write(self, record: dict[str, Any]) -> None:
        path = self._path(record["id"], ".json")
        tmp = path.with_name(f".{path.name}.{os.getpid()}.{threading.get_ident()}.tmp")
        tmp.write_text(json.dumps(record, indent=2, sort_keys=True))
        os.replace(tmp, path)  # readers never see half a record

    def _find_by_request(self, request_id: str) -> dict[str, Any] | None:
        for record in self._records():
            if record["request_id"] == request_id:
                return record
        return None


def _process(pid: int | None, create_time: float | None) -> psutil.Process | None:
    """The live process that is really ours (same pid and start time), else None."""
    if pid is None or create_time is None:
        return None
    try:
        proc = psutil.Process(pid)
        if abs(proc.create_time() - create_time) > _CREATE_TIME_TOLERANCE_S:
            return None  # the pid was reused by an unrelated process
        if proc.status() in (psutil.STATUS_ZOMBIE, psutil.STATUS_DEAD):
            return None
        return proc
    except (psutil.NoSuchProcess, psutil.AccessDenied):
        # AccessDenied: we spawn as this user, so a process we may not inspect is not ours.
        return None


def _alive(pid: int | None, create_time: float | None) -> bool:
    return _process(pid, create_time) is not None


def _node_alive(pid: int | None, create_time: float | None) -> bool:
    """The node lives while its agent does, or while work the agent started still runs."""
    if pid is None or _alive(pid, create_time):
        return pid is not None
    try:
        proc = psutil.Process(pid)
        if abs(proc.create_time() - (create_time or 0.0)) > _CREATE_TIME_TOLERANCE_S:
            return False  # pid reused: the session with this id is someone else's
    except psutil.NoSuchProcess:
        pass
    except psutil.AccessDenied:
        return False  # another user's process holds the pid now
    return bool(_session_members(pid))


def _wait_dead(procs: list[psutil.Process], timeout_s: float) -> bool:
    """Wait until each is gone or a zombie (orphans are reaped by PID 1 whenever it gets to it)."""
    end = time.monotonic() + timeout_s
    while True:
        if not any(_running(p) for p in procs):
            return True
        if time.monotonic() >= end:
            return False
        time.sleep(0.02)


def _running(proc: psutil.Process) -> bool:
    try:
        return proc.is_running() and proc.status() != psutil.STATUS_ZOMBIE
    except psutil.Error:
        return False


def _signal_group(pgid: int, sig: int) -> None:
    try:
        os.killpg(pgid, sig)
    except (ProcessLookupError, PermissionError):
        pass


def _session_members(sid: int) -> list[psutil.Process]:
    members = []
    for proc in psutil.process_iter():
        try:
            if os.getsid(proc.pid) == sid and proc.status() != psutil.STATUS_ZOMBIE:
                members.append(proc)
        except (OSError, psutil.Error):
            continue
    return members
