"""Node agent: the process on every burst node that joins it to the controller and runs its work.

Run as ``python -m orchestrator.fabric.agent --user-data FILE`` (or ``burst agent``). It reads the
node's bootstrap, waits out the simulated boot delay, registers with its join token, then loops:
heartbeat every ``heartbeat_s``; while idle and not draining, pull a job from the built-in queue and
run it (a shell command in its own process group, or a timed sleep); report each job's outcome.
A drain stops the pulling, lets the running job finish or hands it back, sends a final "released"
heartbeat and exits.

HTTP contract with the controller (JSON bodies; every call after registration carries
``Authorization: Bearer <credential>``):

* ``POST /v1/agent/register`` ``{node_id, join_token, gpus, gpu_model, gpu_inventory,
  gpu_source, hostname, pid}`` -> 200 ``{credential, heartbeat_s, fabric, notice}``; 401/403
  refuses the token for good; no answer or any other status (a 5xx, 409 "not launched yet", 429
  with ``retry_after_s``) is retried with the same token, with backoff, for ~5 minutes. A
  registration the controller wrote but never answered is answered again, with a fresh
  credential, so a retry after a lost answer is fine. ``fabric`` (null for the built-in fabric) tells the agent which fabric to join and how
  (:mod:`orchestrator.fabric.slurm_node`, :mod:`orchestrator.fabric.torch_node`); ``notice``
  (null: none) where to poll for spot/preemption notices (:mod:`orchestrator.fabric.node_facts`).
* ``POST /v1/agent/heartbeat`` ``{node_id, status: idle|busy|released, job_id, fabric_state,
  notice, drain_report, gpu_usage}`` -> 200 ``{drain, deadline (ISO 8601 or null), respect_running_jobs,
  stop_job}``; 401/403: revoked. ``stop_job`` names the running job when a user cancelled it or
  it has ended meanwhile through another run (the agent stops it: SIGTERM to its group, then
  SIGKILL, and reports it handed back). ``fabric_state`` (joining|joined|draining|released|failed) is sent by nodes
  of a joined fabric; ``notice`` once a spot notice arrived; ``drain_report`` with ``released``;
  ``gpu_usage`` ``{source: nvml|nvidia-smi, interval_s, gpus: [{index, utilisation_percent,
  memory_used_mib, memory_total_mib, job_id}]}`` every heartbeat where the GPUs can be read
  (:mod:`orchestrator.fabric.gpu_sampler`; absent: unknown), ``job_id`` naming the run holding
  that GPU (its ``CUDA_VISIBLE_DEVICES``), each reading standing for ``interval_s`` seconds.
* ``POST /v1/agent/jobs/next`` ``{node_id, free_gpus}``
  -> 200 ``{job: {id, command, duration_s, gpus, attempt}}`` or 204 when there is nothing to run.
* ``POST /v1/agent/jobs/{id}/finish`` ``{node_id, outcome: done|failed|handed-back, exit_code,
  attempt, ended_at}``; ``exit_code`` is the command's status (negative: killed by that signal),
  0 for a sleep that ran out, null for a sleep handed back; ``attempt`` the run id ``jobs/next``
  gave. 5xx and no answer are retried; any other answer acknowledges the report.

Each run's result is written to ``<work dir>/results/`` (atomically) when the run ends and removed
only when the controller acknowledges it, so it is resent through an outage of any length and
after a restart of this process; the registration answer is kept in ``<work dir>/session.json``
(mode 0600), so a restarted agent resumes as the node it was instead of re-sending its spent join
token (:mod:`orchestrator.fabric.results`).

The controller may be away (restarting, a network cut): the agent rides that out. Its jobs run
on; heartbeats that get no good answer are retried backing off from the interval, doubling, up to
``HEARTBEAT_RETRY_MAX_S`` between attempts (each request waits ``HEARTBEAT_REQUEST_TIMEOUT_S``;
both figures come from :mod:`orchestrator.domain.agent_contract`, which the controller's liveness
rule reads too); job reports wait out the same backoff, and go at once when a heartbeat gets
through again. No work is asked for meanwhile.

A node of a joined fabric (Slurm, torch elastic) pulls no work: its fabric gives it work. Its
agent starts the fabric's member (slurmd, torchrun), reports ``joined`` as soon as the fabric
shows the node usable, and on a drain runs the fabric's checkpoint-aware drain step by step
(heartbeating meanwhile) before it reports ``released``. A spot notice starts the same drain at
once, with the provider's deadline, without waiting for the controller.

Exit codes: 0 released, stopped by a signal, or drained; 2 unusable bootstrap; 3 the controller
refused the join token or revoked the credential; 4 the controller stayed unreachable at
registration; 5 the fabric member failed (e.g. slurmd died); 6 the dead-man switch: no good
answer from the controller for the controller lease.

The dead-man switch: a controller that is gone for good must not leave GPUs running forever. With
no good answer for ``controller_lease_s`` (the policy's ``timeouts.controller_lease``, from the
bootstrap and renewed by the registration answer; it runs from the registration, or from a
restart of this process), the agent drains on its own: SIGTERM to its job's process group (the
checkpoint cue), SIGKILL after ``DEAD_MAN_GRACE_S``, the fabric's checkpoint drain and leave, a
clear log line, the bootstrap's ``self_terminate`` command (aws, gcp: ``shutdown -h now``; none
for libcloud and local nodes), then exit 6.

Standard library only (urllib for HTTP), so the agent starts on a bare cloud image.
"""

from __future__ import annotations

import argparse
import http.client
import importlib.util
import json
import logging
import os
import re
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import urllib.error
import urllib.parse
import urllib.request
from dataclasses import dataclass, replace
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

from orchestrator.fabric.bootstrap import ENV_NAMES, Bootstrap
from orchestrator.fabric.gpu_sampler import GuardedSampler, choose_sampler
from orchestrator.fabric.node_facts import GpuInventory, NoticeWatcher, gpu_inventory
from orchestrator.isotime import TimeFormatError, parse_aware
from orchestrator.logs import JsonFormatter, LogFormat
from orchestrator.fabric.results import (
    ResultBox,
    RunningRun,
    RunResult,
    clear_running,
    forget_session,
    load_session,
    note_running,
    running_run,
    save_session,
)


def _load_contract() -> Any:
    """orchestrator/domain/agent_contract.py, loaded by its path.

    The figures the controller's liveness rule assumes live there, once; importing it as
    ``orchestrator.domain.agent_contract`` would run the domain package's ``__init__`` and pull in
    pydantic, which a bare cloud image does not have.
    """
    path = Path(__file__).resolve().parents[1] / "domain" / "agent_contract.py"
    spec = importlib.util.spec_from_file_location("burst_agent_contract", path)
    assert spec is not None and spec.loader is not None, path
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


_CONTRACT = _load_contract()
HEARTBEAT_RETRY_MAX_S: float = _CONTRACT.HEARTBEAT_RETRY_MAX_S
HEARTBEAT_REQUEST_TIMEOUT_S: float = _CONTRACT.HEARTBEAT_REQUEST_TIMEOUT_S

EXIT_OK = 0
EXIT_BAD_BOOTSTRAP = 2
EXIT_AUTH = 3
EXIT_UNREACHABLE = 4
EXIT_FABRIC = 5
EXIT_LEASE_EXPIRED = 6  # the dead-man switch: no controller answer for the controller lease
NOTICE_MARGIN_S = 5.0  # finish a notice drain this long before the provider's deadline

BOOT_DELAY_ENV = "BURST_BOOT_DELAY_S"  # set by the local provider; wins over the bootstrap value
WORK_DIR_ENV = "BURST_WORK_DIR"
LOG_FORMAT_ENV = "BURST_LOG_FORMAT"  # json: one JSON object a line (orchestrator.logs)
LOG_LEVEL_ENV = "BURST_LOG_LEVEL"

REGISTER_PATIENCE_S = 300.0  # the controller may be restarting; a few minutes is normal
REGISTER_BACKOFF_MAX_S = 15.0
RETRY_AFTER_MAX_S = 60.0
HTTP_TIMEOUT_S = 10.0
LAST_WORDS_TIMEOUT_S = 3.0  # on a signal the provider kills us hard after ~5 s
JOB_STOP_GRACE_S = 3.0
RELEASE_PATIENCE_S = 30.0
DEAD_MAN_GRACE_S = 30.0  # the dead-man switch's checkpoint grace: SIGTERM, this long, SIGKILL
SELF_TERMINATE_TIMEOUT_S = 60.0
POLL_S = 0.1  # longest the loop sleeps without looking at the signal flag
USAGE_INTERVAL_MAX_S = 60.0  # a GPU reading stands for at most this long (gaps stay unmeasured)
MAX_GPU_READINGS = 64  # the controller takes no more per heartbeat (a node's GPUs)

log = logging.getLogger("burst.agent")


def retry_delay(interval_s: float, failures: int) -> float:
    """Seconds to the next attempt after ``failures`` calls in a row got no good answer.

    Backs off from the heartbeat interval, doubling, and never beyond ``HEARTBEAT_RETRY_MAX_S``
    (the controller's liveness rule counts on hearing a live agent within that of its return).
    """
    if failures <= 0:
        return interval_s
    return min(interval_s * 2 ** min(failures - 1, 32), HEARTBEAT_RETRY_MAX_S)


class Unreachable(Exception):
    """No HTTP answer at all: connection refused or reset, DNS, timeout."""


class Revoked(Exception):
    """The controller answered 401/403: the credential or token is no good any more."""


@dataclass(frozen=True)
class Answer:
    status: int
    body: Any  # parsed JSON, or None when empty or not JSON


class Controller:
    """The controller's agent API, over urllib."""

    def __init__(self, base_url: str, *, timeout_s: float = HTTP_TIMEOUT_S):
        self.base_url = base_url.rstrip("/")
        self.timeout_s = timeout_s
        self.credential: str | None = None

    def post(self, path: str, payload: dict[str, Any], *, timeout_s: float | None = None) -> Answer:
        """POST JSON; any HTTP status comes back as an Answer, no answer raises Unreachable."""
        headers = {"Content-Type": "application/json", "Accept": "application/json"}
        if self.credential is not None:
            headers["Authorization"] = f"Bearer {self.credential}"
        request = urllib.request.Request(
            self.base_url + path,
            data=json.dumps(payload).encode(),
            headers=headers,
            method="POST",
        )
        try:
            with urllib.request.urlopen(request, timeout=timeout_s or self.timeout_s) as response:
                return Answer(response.status, _json_or_none(response.read()))
        except urllib.error.HTTPError as exc:
            with exc:
                return Answer(exc.code, _json_or_none(exc.read()))
        except (urllib.error.URLError, OSError, http.client.HTTPException, ValueError) as exc:
            # HTTPException: a connection cut mid-answer; ValueError: a garbled URL or status line.
            raise Unreachable(_describe_error(exc)) from exc


def _retry_after(body: dict[str, Any]) -> float:
    """The ``retry_after_s`` of a refusal-for-now (429), within 0..RETRY_AFTER_MAX_S."""
    try:
        value = float(body.get("retry_after_s") or 0.0)
    except (TypeError, ValueError):
        return 0.0
    return min(max(value, 0.0), RETRY_AFTER_MAX_S) if value == value else 0.0


def _json_or_none(raw: bytes) -> Any:
    if not raw:
        return None
    try:
        return json.loads(raw)
    except ValueError:
        return None


def _describe_error(exc: BaseException) -> str:
    reason = getattr(exc, "reason", None)
    return f"{type(exc).__name__}: {reason if reason is not None else exc}"


@dataclass(frozen=True)
class JobSpec:
    id: str
    command: str | None
    duration_s: float | None
    gpus: int
    attempt: int | None = None  # the controller's run id, sent back with the result

    @classmethod
    def from_json(cls, job: Any) -> JobSpec:
        if not isinstance(job, dict) or job.get("id") in (None, ""):
            raise ValueError("job without an id")
        command = job.get("command")
        duration = job.get("duration_s")
        if command is not None and not isinstance(command, str):
            raise ValueError("job command is not a string")
        if command is None and duration is None:
            raise ValueError("job has neither a command nor a duration")
        attempt = job.get("attempt")
        if attempt is not None and (isinstance(attempt, bool) or not isinstance(attempt, int)):
            raise ValueError("job attempt is not an integer")
        return cls(
            id=str(job["id"]),
            command=command,
            duration_s=None if duration is None else max(float(duration), 0.0),
            gpus=int(job.get("gpus") or 0),
            attempt=attempt,
        )


class JobRun:
    """One running job, watched by its own thread so the agent keeps heartbeating meanwhile."""

    def __init__(self, spec: JobSpec, work_dir: Path, env: dict[str, str], on_end: threading.Event):
        self.spec = spec
        self._on_end = on_end
        self._lock = threading.Lock()
        self._cancel = threading.Event()
        self._cancelled = False
        self.outcome: str | None = None  # set once, when the job has ended
        self.exit_code: int | None = None
        self.proc: subprocess.Popen[bytes] | None = None
        if spec.command is not None:
            safe_id = re.sub(r"[^A-Za-z0-9._-]", "_", spec.id)
            self.log_path = work_dir / "jobs" / f"{safe_id}.log"
            self.log_path.parent.mkdir(parents=True, exist_ok=True)
            with open(self.log_path, "ab") as out:
                # Own process group (same session) so a stop reaches everything the job spawned,
                # and the provider's sweep of the node's session still finds it.
                self.proc = subprocess.Popen(
                    ["bash", "-c", spec.command],
                    stdin=subprocess.DEVNULL,
                    stdout=out,
                    stderr=subprocess.STDOUT,
                    cwd=work_dir,
                    env=env,
                    process_group=0,
                )
        self._thread = threading.Thread(target=self._watch, name=f"job-{spec.id}", daemon=True)
        self._thread.start()

    @property
    def ended(self) -> bool:
        return self.outcome is not None

    def _watch(self) -> None:
        if self.proc is not None:
            code: int | None = self.proc.wait()
            # The job is over; anything it left running in its group would squat on the GPUs.
            _killpg(self.proc.pid, signal.SIGKILL)
        else:
            interrupted = self._cancel.wait(self.spec.duration_s or 0.0)
            code = None if interrupted else 0
        with self._lock:
            if self._cancelled:
                self.outcome = "handed-back"
            else:
                self.outcome = "done" if code == 0 else "failed"
            self.exit_code = code
        self._on_end.set()

    def stop(self, grace_s: float = JOB_STOP_GRACE_S) -> None:
        """Stop the job now (it is handed back); a job that already ended keeps its outcome."""
        with self._lock:
            if self.outcome is not None:
                return
            self._cancelled = True
        self._cancel.set()
        if self.proc is not None:
            _killpg(self.proc.pid, signal.SIGTERM)
            self._thread.join(grace_s)
            if self._thread.is_alive():
                _killpg(self.proc.pid, signal.SIGKILL)
        self._thread.join(grace_s)


def _job_processes(job_id: str, node_id: str) -> list[int]:
    """Pids of the processes of job ``job_id`` run by this node's agent, found by the
    environment every job process inherits (so no pid the system gave to someone else since is
    ever signalled). Linux /proc; elsewhere none are found."""
    marks = {f"BURST_JOB_ID={job_id}".encode(), f"BURST_NODE_ID={node_id}".encode()}
    found = []
    try:
        entries = [e for e in os.listdir("/proc") if e.isdigit()]
    except OSError:
        return []
    for entry in entries:
        try:
            environ = set(Path(f"/proc/{entry}/environ").read_bytes().split(b"\0"))
        except OSError:
            continue  # gone, or not ours to read
        if marks <= environ and int(entry) != os.getpid():
            found.append(int(entry))
    return found


def _stop_processes(job_id: str, node_id: str, pids: list[int]) -> None:
    """SIGTERM the process groups of ``pids`` (the job's checkpoint cue), SIGKILL what is left
    after the stop grace."""
    for sig in (signal.SIGTERM, signal.SIGKILL):
        for pid in pids:
            try:
                os.killpg(os.getpgid(pid), sig)
            except (ProcessLookupError, PermissionError):
                pass
        end = time.monotonic() + JOB_STOP_GRACE_S
        while time.monotonic() < end:
            pids = _job_processes(job_id, node_id)
            if not pids:
                return
            time.sleep(POLL_S)


def _killpg(pgid: int, sig: int) -> None:
    try:
        os.killpg(pgid, sig)
    except (ProcessLookupError, PermissionError):
        pass


class Agent:
    """Register, heartbeat, run work, honour drains. :meth:`run` returns the exit code."""

    def __init__(
        self,
        boot: Bootstrap,
        work_dir: Path,
        *,
        controller: Controller | None = None,
        secrets: list[str] | None = None,
        sampler: GuardedSampler | None = None,
    ):
        self.boot = boot
        # Shared with the log filter: the credential joins the redacted strings once issued.
        self._secrets = secrets if secrets is not None else []
        self.work_dir = work_dir
        self.api = controller or Controller(boot.controller_url)
        self.heartbeat_s = boot.heartbeat_s
        self.controller_lease_s = boot.controller_lease_s  # the registration answer may renew it
        self.job: JobRun | None = None
        self._job_ended = threading.Event()
        # Results of ended runs the controller has not acknowledged: on disk first (so they
        # survive an outage and a restart of this process), sent oldest first.
        self.box = ResultBox(work_dir)
        self._unreported: list[RunResult] = self.box.pending()
        self._signalled: int | None = None
        self._draining = False
        self._respect_running = True
        self._deadline: datetime | None = None
        self.inventory: GpuInventory | None = None
        self.member: Any = None  # the joined fabric's member (SlurmMember, TorchMember) or None
        self.notices: NoticeWatcher | None = None
        self._notice_applied = False
        self._joined_reported = False
        # Controller outages: heartbeats (and reports) back off while the controller gives no good
        # answer, and the time of its last good answer is what the controller lease runs from.
        self._failures = 0  # heartbeats in a row without a good answer
        self._report_failures = 0
        self._reports_due = 0.0  # monotonic time of the next report attempt
        self._last_answer = time.monotonic()
        # GPU readings sent with each heartbeat (None: chosen when the agent runs).
        self.gpu_sampler = sampler
        self._last_reading: float | None = None  # monotonic time of the previous reading

    # -- signals ------------------------------------------------------------------------------

    def install_signal_handlers(self) -> None:
        for sig in (signal.SIGTERM, signal.SIGINT):
            signal.signal(sig, self._on_signal)

    def _on_signal(self, signum: int, _frame: object) -> None:
        # Only a flag: taking locks inside a handler can deadlock against the interrupted code.
        self._signalled = signum

    def _sleep(self, seconds: float) -> bool:
        """Sleep, waking early on a signal or a job ending; False when a signal arrived."""
        end = time.monotonic() + seconds
        while self._signalled is None:
            left = end - time.monotonic()
            if left <= 0:
                return True
            if self._job_ended.wait(min(left, POLL_S)):
                return True
        return False

    # -- lifecycle ----------------------------------------------------------------------------

    def run(self) -> int:
        if self.gpu_sampler is None:
            self.gpu_sampler = GuardedSampler(*choose_sampler())
        session = load_session(self.work_dir, self.boot.node_id)
        if session is not None:
            code = self._resume(session)
        else:
            if self.boot.boot_delay_s > 0:
                log.info("booting (%.1fs)", self.boot.boot_delay_s)
                if not self._sleep_ignoring_jobs(self.boot.boot_delay_s):
                    log.info("signal %s while booting; exiting", self._signalled)
                    return EXIT_OK
            code = self._register()
        if code is not None:
            return code
        try:
            if self.member is not None:
                return self._member_loop()
            return self._loop()
        except Revoked as exc:
            log.error("controller revoked this node's credential (%s); stopping", exc)
            forget_session(self.work_dir)
            if self.job is not None:
                self.job.stop()
            if self.member is not None:
                self.member.stop()
            return EXIT_AUTH
        finally:
            if self.notices is not None:
                self.notices.stop()

    def _take_lease(self, body: dict[str, Any]) -> None:
        """Registered (or resumed): the controller lease runs from now, for the answer's length."""
        lease = body.get("controller_lease_s")
        if lease is not None:
            try:
                if 0 < float(lease) < float("inf"):
                    self.controller_lease_s = float(lease)
            except (TypeError, ValueError):
                log.warning("ignoring unusable controller_lease_s from the controller")
        self._last_answer = time.monotonic()
        log.info("controller lease %.0fs: without an answer that long this node drains itself",
                 self.controller_lease_s)

    def _recover_interrupted(self) -> None:
        """A run was under way when this process died: stop what is left of it and hand it
        back, so the controller does not count it running on a node that runs nothing."""
        run = running_run(self.work_dir)
        if run is None:
            return
        if run.job_id in {r.job_id for r in self._unreported if r.attempt == run.attempt}:
            clear_running(self.work_dir)  # it ended and was recorded just before the crash
            return
        left = _job_processes(run.job_id, self.boot.node_id)
        if left:
            log.warning("job %s outlived the agent that started it (%d process(es)); stopping it",
                        run.job_id, len(left))
            _stop_processes(run.job_id, self.boot.node_id, left)
        log.warning("job %s was interrupted by a restart of this agent; handing it back",
                    run.job_id)
        self._record(_finish(run.job_id, "handed-back", None, run.attempt))
        clear_running(self.work_dir)

    def _keep_session(self, body: dict[str, Any]) -> None:
        """Keep the registration answer, so a restart of this process resumes as this node."""
        answer = {**body, "heartbeat_s": self.heartbeat_s}
        try:
            save_session(self.work_dir, self.boot.node_id, answer)
        except OSError as exc:
            log.warning("could not keep the registration on disk (%s); a restart re-registers", exc)

    def _resume(self, body: dict[str, Any]) -> int | None:
        """Take up the registration a previous run of this process kept (instead of spending
        the join token again, which the controller would refuse); None: go on."""
        self._secrets.append(body["credential"])
        self.api.credential = body["credential"]
        try:
            if body.get("heartbeat_s") is not None and float(body["heartbeat_s"]) > 0:
                self.heartbeat_s = float(body["heartbeat_s"])
        except (TypeError, ValueError):
            pass
        self._recover_interrupted()
        log.info("resuming as registered before this restart; %d job result(s) to send",
                 len(self._unreported))
        return self._setup_fabric(body)

    def _sleep_ignoring_jobs(self, seconds: float) -> bool:
        end = time.monotonic() + seconds
        while self._signalled is None and time.monotonic() < end:
            time.sleep(min(POLL_S, max(end - time.monotonic(), 0.0)))
        return self._signalled is None

    def _register(self) -> int | None:
        self.inventory = gpu_inventory(self.boot.gpus, self.boot.gpu_model)
        log.info("%d GPU(s) from %s", self.inventory.count, self.inventory.source)
        payload = {
            "node_id": self.boot.node_id,
            "join_token": self.boot.join_token,
            "gpus": self.inventory.count,
            "gpu_model": self.inventory.model or self.boot.gpu_model,
            "gpu_inventory": self.inventory.as_list(),
            "gpu_source": self.inventory.source,
            "hostname": socket.gethostname(),
            "pid": os.getpid(),
        }
        give_up_at = time.monotonic() + REGISTER_PATIENCE_S
        delay = 0.5
        while True:
            if self._signalled is not None:
                return EXIT_OK
            try:
                answer = self.api.post("/v1/agent/register", payload)
            except Unreachable as exc:
                log.warning(
                    "controller unreachable at registration (%s); retrying in %.1fs", exc, delay
                )
            else:
                if answer.status in (401, 403):
                    log.error(
                        "controller refused the join token (HTTP %d); giving up", answer.status
                    )
                    return EXIT_AUTH
                body = answer.body if isinstance(answer.body, dict) else {}
                credential = body.get("credential")
                if answer.status == 200 and isinstance(credential, str) and credential:
                    self._secrets.append(credential)
                    self.api.credential = credential
                    try:
                        if body.get("heartbeat_s") is not None and float(body["heartbeat_s"]) > 0:
                            self.heartbeat_s = float(body["heartbeat_s"])
                    except (TypeError, ValueError):
                        log.warning("ignoring unusable heartbeat_s from the controller")
                    log.info("registered; heartbeat every %.2fs", self.heartbeat_s)
                    return self._setup_fabric(body)
                # A rate-limited controller says when to come back (bounded: a bad value must
                # not park the agent).
                delay = max(delay, _retry_after(body))
                log.warning(
                    "unexpected registration answer HTTP %d; retrying in %.1fs",
                    answer.status,
                    delay,
                )
            if time.monotonic() + delay > give_up_at:
                log.error("controller unreachable for %.0fs; giving up", REGISTER_PATIENCE_S)
                return EXIT_UNREACHABLE
            if not self._sleep_ignoring_jobs(delay):
                return EXIT_OK
            delay = min(delay * 2, REGISTER_BACKOFF_MAX_S)

    def _loop(self) -> int:
        next_heartbeat = 0.0
        next_pull = 0.0
        while True:
            if self._signalled is not None:
                return self._stop_on_signal()
            if self._lease_expired():
                return self._dead_man()
            self._collect_ended_job()
            self._flush_reports()
            if self._notice_arrived():
                next_heartbeat = 0.0
            now = time.monotonic()
            if now >= next_heartbeat:
                self._heartbeat()
                next_heartbeat = time.monotonic() + self._heartbeat_gap()
            if self._draining:
                if self.job is not None and (not self._respect_running or self._deadline_passed()):
                    why = (
                        "deadline passed"
                        if self._respect_running
                        else "not respecting running jobs"
                    )
                    log.info("drain (%s): handing back job %s", why, self.job.spec.id)
                    self.job.stop()
                    self._collect_ended_job()
                    self._flush_reports()
                if self.job is None:
                    return self._release()
            elif self.job is None and (self._failures or self._report_failures):
                next_pull = next_heartbeat  # no work asked for until the controller answers again
            elif self.job is None and time.monotonic() >= next_pull and not self._pull_and_start():
                next_pull = time.monotonic() + self.heartbeat_s
            if self.job is None:
                self._job_ended.clear()
                wake_at = next_heartbeat if self._draining else min(next_heartbeat, next_pull)
            else:
                wake_at = next_heartbeat  # or earlier: the job's end sets _job_ended
            self._sleep(max(wake_at - time.monotonic(), 0.0))

    def _heartbeat_gap(self) -> float:
        """Seconds to the next heartbeat: the interval, or the backoff while none gets through."""
        return retry_delay(self.heartbeat_s, self._failures)

    def _answered(self) -> None:
        """The controller gave a good answer: it is back, so reports go out at once."""
        if self._failures:
            log.info("controller answering again after %d failed heartbeat(s)", self._failures)
        self._failures = 0
        self._reports_due = 0.0
        self._last_answer = time.monotonic()

    def _heartbeat(self, status: str | None = None) -> Answer | None:
        if status is None:
            status = "busy" if self.job is not None else "idle"
        payload: dict[str, Any] = {
            "node_id": self.boot.node_id,
            "status": status,
            "job_id": self.job.spec.id if self.job is not None else None,
        }
        if self.member is not None:
            payload["fabric_state"] = self.member.state
            if self.member.failure:
                payload["fabric_error"] = self.member.failure
            if status == "released":
                payload["drain_report"] = self.member.report.as_dict()
        if self.notices is not None and self.notices.notice is not None:
            payload["notice"] = self.notices.notice.as_dict()
        usage = self._gpu_usage()
        if usage is not None:
            payload["gpu_usage"] = usage
        try:
            answer = self.api.post(
                "/v1/agent/heartbeat", payload, timeout_s=HEARTBEAT_REQUEST_TIMEOUT_S
            )
        except Unreachable as exc:
            self._failures += 1
            log.warning("heartbeat failed (%s); retrying in %.1fs", exc, self._heartbeat_gap())
            return None
        if answer.status in (401, 403):
            raise Revoked(f"heartbeat HTTP {answer.status}")
        if answer.status != 200 or not isinstance(answer.body, dict):
            self._failures += 1
            log.warning(
                "heartbeat answered HTTP %d; retrying in %.1fs", answer.status, self._heartbeat_gap()
            )
            return None
        self._answered()
        if status != "released":
            self._apply_drain(answer.body)
            self._apply_stop(answer.body.get("stop_job"))
        return answer

    def _held_gpus(self, spec: JobSpec) -> list[int]:
        """The GPU indices a run holds (its CUDA_VISIBLE_DEVICES): the node's first ``gpus``
        GPUs, as the agent runs one job at a time."""
        indices = sorted(int(g["index"]) for g in (self.inventory.gpus if self.inventory else ())
                         if isinstance(g.get("index"), int))
        if len(indices) < spec.gpus:
            indices = list(range(spec.gpus))
        return indices[: max(spec.gpus, 0)]

    def _gpu_usage(self) -> dict[str, Any] | None:
        """This heartbeat's GPU readings, each naming the job holding that GPU; None when
        nothing can be measured (no GPU, no NVML, no nvidia-smi, or the reader failed)."""
        if self.gpu_sampler is None:
            return None
        readings = self.gpu_sampler.read()
        now = time.monotonic()
        previous, self._last_reading = self._last_reading, now
        if readings is None:
            return None
        interval = self.heartbeat_s if previous is None else now - previous
        held: dict[int, str] = {}
        job = self.job
        if job is not None and not job.ended:
            held = {index: job.spec.id for index in self._held_gpus(job.spec)}
        return {
            "source": self.gpu_sampler.source,
            "interval_s": round(min(max(interval, 0.0), USAGE_INTERVAL_MAX_S), 3),
            "gpus": [r.as_json(held.get(r.index)) for r in readings[:MAX_GPU_READINGS]],
        }

    def _apply_drain(self, body: dict[str, Any]) -> None:
        drain = bool(body.get("drain"))
        if drain and not self._draining:
            log.info(
                "drain requested (deadline %s, respect running jobs: %s)",
                body.get("deadline"),
                body.get("respect_running_jobs", True),
            )
        elif self._draining and not drain:
            log.info("drain cancelled by the controller; taking work again")
        self._draining = drain
        self._respect_running = bool(body.get("respect_running_jobs", True))
        self._deadline = _parse_deadline(body.get("deadline"))
        if self._notice_applied:
            self._apply_notice()  # a spot notice is not the controller's to cancel

    def _apply_stop(self, job_id: Any) -> None:
        """The controller says the running job ended elsewhere meanwhile: running it on is waste."""
        if job_id is None or self.job is None or self.job.spec.id != job_id or self.job.ended:
            return
        log.warning("controller: job %s was cancelled or has ended through another run; "
                    "stopping it here", job_id)
        self.job.stop()

    def _deadline_passed(self) -> bool:
        return self._deadline is not None and datetime.now(UTC) >= self._deadline

    def _pull_and_start(self) -> bool:
        """Ask for a job and start it; False when there is nothing to run (or no answer)."""
        try:
            answer = self.api.post(
                "/v1/agent/jobs/next",
                {"node_id": self.boot.node_id, "free_gpus": self.boot.gpus},
                timeout_s=HEARTBEAT_REQUEST_TIMEOUT_S,
            )
        except Unreachable as exc:
            log.warning("asking for work failed (%s); retrying next interval", exc)
            return False
        if answer.status in (401, 403):
            raise Revoked(f"jobs/next HTTP {answer.status}")
        if answer.status == 204:
            return False
        if answer.status != 200 or not isinstance(answer.body, dict):
            log.warning("asking for work answered HTTP %d; retrying next interval", answer.status)
            return False
        raw = answer.body.get("job")
        if raw is None:
            return False
        try:
            spec = JobSpec.from_json(raw)
        except (TypeError, ValueError) as exc:
            job_id = raw.get("id") if isinstance(raw, dict) else None
            log.error("controller sent an unusable job %r: %s", job_id, exc)
            if job_id is not None:
                attempt = raw.get("attempt") if isinstance(raw.get("attempt"), int) else None
                self._record(_finish(str(job_id), "failed", None, attempt))
            return False
        self._job_ended.clear()
        try:
            # Written down before the job starts: whenever this process dies from here on, its
            # restart knows the run and hands it back (stopping what is left of it).
            note_running(self.work_dir, RunningRun(spec.id, spec.attempt))
        except OSError as exc:
            log.warning("could not note the running job on disk (%s)", exc)
        try:
            self.job = JobRun(spec, self.work_dir, self._job_env(spec), self._job_ended)
        except OSError as exc:
            log.error("could not start job %s: %s", spec.id, exc)
            self._record(_finish(spec.id, "failed", None, spec.attempt))
            clear_running(self.work_dir)
            return False
        kind = "command" if spec.command is not None else f"sleep {spec.duration_s:.1f}s"
        log.info("running job %s (%s)", spec.id, kind)
        return True

    def _job_env(self, spec: JobSpec) -> dict[str, str]:
        env = {k: v for k, v in os.environ.items() if k != ENV_NAMES["join_token"]}
        env.update(
            BURST_JOB_ID=spec.id, BURST_NODE_ID=self.boot.node_id, BURST_JOB_GPUS=str(spec.gpus)
        )
        if self.boot.checkpoint_uri:  # storage.checkpoints: where the job saves (and uploads)
            env[ENV_NAMES["checkpoint_uri"]] = self.boot.checkpoint_uri
        if spec.gpus > 0:
            # The GPUs this run holds: what its readings are attributed to.
            env["CUDA_VISIBLE_DEVICES"] = ",".join(str(i) for i in self._held_gpus(spec))
        return env

    def _collect_ended_job(self) -> None:
        if self.job is None or not self.job.ended:
            return
        run, self.job = self.job, None
        log.info("job %s ended: %s (exit code %s)", run.spec.id, run.outcome, run.exit_code)
        self._record(_finish(run.spec.id, run.outcome or "failed", run.exit_code, run.spec.attempt))
        clear_running(self.work_dir)

    def _record(self, result: RunResult) -> None:
        """Keep ``result`` until the controller acknowledges it: on disk, then in the queue."""
        try:
            self.box.put(result)
        except OSError as exc:
            log.error("could not write the result of job %s to disk (%s); kept in memory",
                      result.job_id, exc)
        self._unreported.append(result)

    def _flush_reports(self, *, timeout_s: float = HEARTBEAT_REQUEST_TIMEOUT_S,
                       force: bool = False) -> None:
        """Send the unreported job outcomes, oldest first, until one gets no answer.

        After a failed attempt the next waits out the same backoff as the heartbeats (or the
        controller's return, which a good heartbeat notices); ``force`` tries now regardless.
        """
        if not force and time.monotonic() < self._reports_due:
            return
        while self._unreported:
            report = self._unreported[0]
            path = f"/v1/agent/jobs/{urllib.parse.quote(report.job_id, safe='')}/finish"
            try:
                answer = self.api.post(path, report.body(self.boot.node_id), timeout_s=timeout_s)
            except Unreachable as exc:
                self._report_failed()
                log.warning("reporting job %s failed (%s); will retry", report.job_id, exc)
                return
            if answer.status in (401, 403):
                raise Revoked(f"finish HTTP {answer.status}")
            if answer.status >= 500:
                self._report_failed()
                log.warning(
                    "reporting job %s answered HTTP %d; will retry", report.job_id, answer.status
                )
                return
            self._report_failures = 0
            if answer.status >= 400:
                # The controller no longer knows the job (requeued, cancelled): nothing to retry.
                log.warning(
                    "controller rejected the report of job %s (HTTP %d)",
                    report.job_id,
                    answer.status,
                )
            self._unreported.pop(0)
            self.box.ack(report)

    def _report_failed(self) -> None:
        self._report_failures += 1
        self._reports_due = time.monotonic() + retry_delay(self.heartbeat_s, self._report_failures)

    def _release(self) -> int:
        """Tell the controller this node runs nothing and may go; then exit."""
        give_up_at = time.monotonic() + RELEASE_PATIENCE_S
        while True:
            self._flush_reports(force=True)
            if not self._unreported and self._heartbeat("released") is not None:
                log.info("released; exiting")
                forget_session(self.work_dir)
                return EXIT_OK
            if self._signalled is not None or time.monotonic() >= give_up_at:
                log.warning("could not confirm the release with the controller; exiting anyway")
                forget_session(self.work_dir)
                return EXIT_OK
            self._sleep_ignoring_jobs(min(self.heartbeat_s, 1.0))

    def _stop_on_signal(self) -> int:
        log.info("signal %s: stopping", self._signalled)
        if self.member is not None:
            self.member.stop()
        if self.job is not None:
            log.info("handing back job %s", self.job.spec.id)
            self.job.stop()
            self._collect_ended_job()
        try:
            self._flush_reports(timeout_s=LAST_WORDS_TIMEOUT_S, force=True)
        except Revoked:
            pass
        if self._unreported:
            log.warning("could not report %d job outcome(s) before exiting", len(self._unreported))
        return EXIT_OK

    def _lease_expired(self) -> bool:
        return time.monotonic() - self._last_answer >= self.controller_lease_s

    def _dead_man(self) -> int:
        """No answer from the controller for the whole controller lease: it is lost, and this
        node must not run (and bill) forever. Drain safely on our own, then stop the instance."""
        log.error(
            "no answer from the controller for %.0fs (controller lease %.0fs): dead-man switch, "
            "draining this node on its own and stopping it",
            time.monotonic() - self._last_answer, self.controller_lease_s)
        if self.job is not None:
            log.warning("checkpoint signal to job %s: SIGTERM, SIGKILL after %.0fs",
                        self.job.spec.id, DEAD_MAN_GRACE_S)
            self.job.stop(grace_s=DEAD_MAN_GRACE_S)
            self._collect_ended_job()  # its result stays on disk for a controller that returns
        if self.member is not None:
            self._leave_fabric()
        try:
            self._flush_reports(timeout_s=LAST_WORDS_TIMEOUT_S, force=True)
        except Revoked:
            pass
        forget_session(self.work_dir)
        self._self_terminate()
        return EXIT_LEASE_EXPIRED

    def _leave_fabric(self) -> None:
        """The fabric's own checkpoint drain, within the grace (its controller may still be up
        when ours is not), then stop the member."""
        deadline = datetime.now(UTC) + timedelta(seconds=DEAD_MAN_GRACE_S)
        give_up_at = time.monotonic() + DEAD_MAN_GRACE_S + 5.0
        try:
            while not self.member.drain_step(deadline) and time.monotonic() < give_up_at:
                self._sleep_ignoring_jobs(POLL_S)
        except Exception as exc:  # noqa: BLE001 - the node goes anyway; say why the drain did not
            log.warning("the fabric drain failed (%s); leaving the fabric regardless", exc)
        self.member.stop()

    def _self_terminate(self) -> None:
        command = self.boot.self_terminate
        if not command:
            log.warning("this provider gives an instance no way to stop itself: exiting; the "
                        "controller (or its operator) must terminate this node")
            return
        log.warning("stopping this instance: %s", command)
        try:
            done = subprocess.run(["/bin/sh", "-c", command], stdin=subprocess.DEVNULL,
                                  capture_output=True, timeout=SELF_TERMINATE_TIMEOUT_S,
                                  check=False)
        except (OSError, subprocess.TimeoutExpired) as exc:
            log.error("the self-terminate command failed: %s", exc)
            return
        if done.returncode != 0:
            log.error("the self-terminate command exited with %d: %s", done.returncode,
                      done.stderr.decode(errors="replace").strip()[:500])

    def _setup_fabric(self, body: dict[str, Any]) -> int | None:
        """Start the joined fabric's member and the notice watcher from the registration answer."""
        self._take_lease(body)
        self._keep_session(body)
        notice = body.get("notice")
        if isinstance(notice, dict) and notice.get("url"):
            url = (str(notice["url"]).replace("{node_id}", self.boot.node_id)
                   .replace("{instance_id}", os.environ.get("BURST_INSTANCE_ID", "")))
            self.notices = NoticeWatcher(str(notice.get("kind") or "aws"), url,
                                         float(notice.get("poll_s") or 5.0),
                                         float(notice.get("deadline_s") or 30.0)).start()
            log.info("watching %s for spot/preemption notices", url)
        spec = body.get("fabric")
        if not isinstance(spec, dict):
            return None
        try:
            if self.boot.checkpoint_uri:  # torchrun's workers save there (BURST_CHECKPOINT_URI)
                spec = {**spec, "checkpoint_uri": self.boot.checkpoint_uri}
            self.member = _make_member(spec, self.work_dir)
            self.member.start()
        except (OSError, ValueError, KeyError) as exc:
            log.error("cannot join the %s fabric: %s", spec.get("kind"), exc)
            if self.member is not None:
                self.member.state, self.member.failure = "failed", str(exc)
            else:
                return EXIT_FABRIC
        return None

    def _notice_arrived(self) -> bool:
        """True the first time a spot notice is seen: the drain starts now, with its deadline."""
        if self._notice_applied or self.notices is None or self.notices.notice is None:
            return False
        self._notice_applied = True
        log.warning("spot/preemption notice: checkpoint-draining now (deadline %s)",
                    self.notices.notice.deadline.isoformat())
        self._apply_notice()
        return True

    def _apply_notice(self) -> None:
        assert self.notices is not None and self.notices.notice is not None
        deadline = self.notices.notice.deadline - timedelta(seconds=NOTICE_MARGIN_S)
        self._draining = True
        self._deadline = deadline if self._deadline is None else min(self._deadline, deadline)
        if self.member is None:
            # Built-in jobs are handed back at once: the SIGTERM is their cue to checkpoint.
            self._respect_running = False

    def _member_loop(self) -> int:
        """The loop of a node in a joined fabric: heartbeat, report the join, drain, release."""
        member = self.member
        next_heartbeat = 0.0
        while True:
            if self._signalled is not None:
                return self._stop_on_signal()
            if self._lease_expired():
                return self._dead_man()
            member.poll()
            if self._notice_arrived():
                next_heartbeat = 0.0
            now = time.monotonic()
            report_join = member.state == "joined" and not self._joined_reported
            # A join is reported at once, unless the controller is not answering (then: backoff).
            if now >= next_heartbeat or (report_join and not self._failures) or (
                    member.state == "failed"):
                status = "busy" if member.busy else "idle"
                if self._heartbeat(status) is not None and report_join:
                    self._joined_reported = True
                next_heartbeat = time.monotonic() + self._heartbeat_gap()
            if member.state == "failed":
                log.error("leaving: the fabric member failed (%s)", member.failure)
                member.stop()
                return EXIT_FABRIC
            if self._draining and member.state in ("joining", "joined", "draining", "released"):
                if member.drain_step(self._deadline):
                    return self._release()
            wake_at = next_heartbeat if member.state != "joining" else now + POLL_S
            self._sleep_ignoring_jobs(min(max(wake_at - time.monotonic(), 0.0), POLL_S))


def _make_member(spec: dict[str, Any], work_dir: Path) -> Any:
    kind = spec.get("kind")
    if kind == "slurm":
        from orchestrator.fabric.slurm_node import SlurmMember

        return SlurmMember(spec, work_dir)
    if kind == "torch-elastic":
        from orchestrator.fabric.torch_node import TorchMember

        return TorchMember(spec, work_dir)
    raise ValueError(f"unknown fabric kind {kind!r} (this agent joins slurm and torch-elastic)")


def _finish(job_id: str, outcome: str, exit_code: int | None, attempt: int | None) -> RunResult:
    return RunResult(job_id=job_id, outcome=outcome, exit_code=exit_code,
                     ended_at=datetime.now(UTC).isoformat(), attempt=attempt)


def _parse_deadline(value: Any) -> datetime | None:
    if not value:
        return None
    try:  # (the controller writes UTC: a naive time is read as such)
        return parse_aware(str(value), "drain deadline", assume_utc=True)
    except TimeFormatError:
        log.warning("ignoring unparseable drain deadline %r", value)
        return None


class _Redact(logging.Filter):
    """Last line of defence: secrets never reach the log, whatever a message interpolates."""

    def __init__(self, node_id: str, secrets: list[str]):
        super().__init__()
        self.node_id = node_id
        self.secrets = secrets

    def filter(self, record: logging.LogRecord) -> bool:
        message = record.getMessage()
        for secret in self.secrets:
            if secret:
                message = message.replace(secret, "***")
        record.msg, record.args = message, None
        record.node_id = self.node_id
        return True


def _setup_logging(node_id: str, secrets: list[str], level: str) -> None:
    handler = logging.StreamHandler(sys.stderr)
    if os.environ.get(LOG_FORMAT_ENV, "").lower() == LogFormat.JSON.value:
        # One JSON object a line (BURST_LOG_FORMAT=json, from the node's agent.env): the node id
        # as the "node" field; the redaction filter below runs before the line is formatted.
        handler.setFormatter(JsonFormatter())
        handler.addFilter(_NodeField(node_id))
    else:
        handler.setFormatter(
            logging.Formatter("%(asctime)s %(levelname)s burst-agent[%(node_id)s] %(message)s")
        )
    handler.addFilter(_Redact(node_id, secrets))
    log.handlers[:] = [handler]
    log.setLevel(level)
    log.propagate = False


class _NodeField(logging.Filter):
    """Puts the node id on every record, as the JSON formatter's ``node`` field."""

    def __init__(self, node_id: str) -> None:
        super().__init__()
        self.node_id = node_id

    def filter(self, record: logging.LogRecord) -> bool:
        record.node = self.node_id
        return True


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="burst agent", description=__doc__.splitlines()[0])
    parser.add_argument(
        "--user-data", type=Path, help="bootstrap file (default: BURST_* variables)"
    )
    parser.add_argument(
        "--work-dir", type=Path, help=f"where job logs go (default: ${WORK_DIR_ENV})"
    )
    levels = ["DEBUG", "INFO", "WARNING", "ERROR"]
    from_env = (os.environ.get(LOG_LEVEL_ENV) or "").upper()
    parser.add_argument(
        "--log-level", choices=levels, default=from_env if from_env in levels else "INFO",
        help=f"default: ${LOG_LEVEL_ENV}, else INFO",
    )
    args = parser.parse_args(argv)

    try:
        if args.user_data is not None:
            boot = Bootstrap.parse(args.user_data.read_text())
        else:
            boot = Bootstrap.from_env(os.environ)
        if os.environ.get(BOOT_DELAY_ENV):
            boot = replace(boot, boot_delay_s=float(os.environ[BOOT_DELAY_ENV]))
    except (OSError, ValueError) as exc:
        print(f"burst-agent: unusable bootstrap: {exc}", file=sys.stderr)
        return EXIT_BAD_BOOTSTRAP

    agent_secrets = [boot.join_token]
    _setup_logging(boot.node_id, agent_secrets, args.log_level)
    work_dir = args.work_dir or Path(
        os.environ.get(WORK_DIR_ENV) or Path(tempfile.gettempdir()) / f"burst-agent-{boot.node_id}"
    )
    work_dir.mkdir(parents=True, exist_ok=True)
    agent = Agent(boot, work_dir, secrets=agent_secrets)
    agent.install_signal_handlers()
    return agent.run()


if __name__ == "__main__":
    sys.exit(main())
