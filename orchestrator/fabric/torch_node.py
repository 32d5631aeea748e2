"""The torch-elastic fabric, node side: the agent's torchrun, its join, and the checkpoint drain.

Driven by the node agent from the join spec the controller answered registration with
(:meth:`orchestrator.fabric.torch_elastic.TorchElasticFabric.join_spec`).

Join: start ``torchrun --nnodes=MIN:MAX --rdzv-backend=c10d --rdzv-endpoint=<controller's store>
--rdzv-conf=is_host=false,...`` with the job's entry point. The running nodes' agents see a node
waiting and restart their workers into a larger world; the job resumes from its checkpoint. The
node has joined once its workers train (``$BURST_ELASTIC_DIR/status.json`` is written).

The environment pitfalls are handled here, not left to the user:

* ``TORCH_DISABLE_SHARE_RDZV_TCP_STORE=1``: with the shared store of torch >= 2.4 a node joining
  a running job waits for a ``MASTER_ADDR`` rank 0 never writes, and the scale-up deadlocks;
* ``is_host=false``: the controller hosts the rendezvous store, so no node's departure kills it;
* ``--local-addr`` and, on loopback, ``GLOO_SOCKET_IFNAME=lo``: MASTER_ADDR and gloo stay on the
  node's address instead of whatever ``getfqdn()`` resolves to;
* ``OMP_NUM_THREADS=1`` unless set; ``--max-restarts`` high, since every drain of a peer costs
  the survivors one restart; a short ``last_call_timeout`` so a smaller world re-forms in seconds;
* drain by signal, never by a clean exit: an agent whose workers finish or fail would close the
  rendezvous for every node; workers run in their own sessions, so they are stopped by pid too.

Drain (:meth:`TorchMember.drain_step`): ask the job to checkpoint through the hook (file or HTTP,
see :mod:`orchestrator.fabric.elastic_hooks`), wait for its confirmation (or ``checkpoint_wait``,
or the deadline), then stop torchrun and its workers. Standard library only.
"""

from __future__ import annotations

import json
import logging
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

log = logging.getLogger("burst.agent.torch")

STOP_GRACE_S = 5.0
RDZV_CONF = "is_host=false,last_call_timeout=2,join_timeout=120,close_timeout=10"
MAX_RESTARTS = 1000


def torchrun_command(spec: dict[str, Any], python: str | None = None) -> list[str]:
    """The torchrun command line of a node of this job."""
    local_addr = spec.get("local_addr") or socket.getfqdn()
    return [
        python or sys.executable, "-m", "torch.distributed.run",
        f"--nnodes={spec['min_nodes']}:{spec['max_nodes']}",
        f"--nproc-per-node={spec.get('nproc_per_node') or 1}",
        "--rdzv-backend=c10d", f"--rdzv-endpoint={spec['rdzv_endpoint']}",
        f"--rdzv-id={spec['run_id']}", f"--rdzv-conf={RDZV_CONF}",
        f"--max-restarts={MAX_RESTARTS}", "--monitor-interval=1", f"--local-addr={local_addr}",
        *[str(part) for part in spec["entrypoint"]],
    ]


def elastic_env(spec: dict[str, Any], elastic_dir: Path, node_id: str = "",
                base: dict[str, str] | None = None) -> dict[str, str]:
    """The environment of a node's torchrun (and so of its workers)."""
    env = dict(os.environ if base is None else base)
    env["TORCH_DISABLE_SHARE_RDZV_TCP_STORE"] = "1"
    env.setdefault("OMP_NUM_THREADS", "1")
    local_addr = spec.get("local_addr") or ""
    if local_addr.startswith("127.") or local_addr == "localhost":
        env["GLOO_SOCKET_IFNAME"] = "lo"
    env["BURST_ELASTIC_DIR"] = str(elastic_dir)
    env["BURST_CHECKPOINT_HOOK"] = str(spec.get("checkpoint_hook") or "file")
    if spec.get("checkpoint_port"):
        env["BURST_CHECKPOINT_PORT"] = str(spec["checkpoint_port"])
    env["BURST_NODE_ID"] = node_id
    if spec.get("checkpoint_uri"):  # storage.checkpoints, from the node's bootstrap
        env["BURST_CHECKPOINT_URI"] = str(spec["checkpoint_uri"])
    env.pop("BURST_JOIN_TOKEN", None)
    return env


class DrainReport:
    """What a torch-elastic drain did, sent to the controller with the release."""

    def __init__(self) -> None:
        self.checkpoint_step: int | None = None
        self.confirmed = False
        self.ended_by = ""
        self.seconds = 0.0

    def as_dict(self) -> dict[str, Any]:
        return {"checkpoint_step": self.checkpoint_step, "confirmed": self.confirmed,
                "ended_by": self.ended_by, "seconds": round(self.seconds, 3)}


class TorchMember:
    """This node's membership of the elastic job (see the module docstring)."""

    kind = "torch-elastic"

    def __init__(self, spec: dict[str, Any], work_dir: Path, *, node_id: str = ""):
        self.spec = dict(spec)
        if self.spec.get("checkpoint_hook") == "http" and not self.spec.get("checkpoint_port"):
            self.spec["checkpoint_port"] = _free_port()
        self.node_id = node_id or str(spec.get("node_id") or "")
        self.work_dir = work_dir
        self.dir = work_dir / "elastic"
        self.checkpoint_wait_s = float(spec.get("checkpoint_wait_s") or 60.0)
        self.state = "joining"
        self.failure: str | None = None
        self.proc: subprocess.Popen[bytes] | None = None
        self.started_at = 0.0
        self.report = DrainReport()
        self._requested_at: float | None = None
        self._drain_started: float | None = None

    def start(self) -> None:
        self.dir.mkdir(parents=True, exist_ok=True)
        for name in ("checkpoint.request", "checkpoint.done", "status.json", "stop"):
            (self.dir / name).unlink(missing_ok=True)
        self.started_at = time.time()
        with open(self.work_dir / "torchrun.log", "ab") as out:
            # Its own process group: the agent can signal torchrun without signalling itself.
            self.proc = subprocess.Popen(
                torchrun_command(self.spec), env=elastic_env(self.spec, self.dir, self.node_id),
                stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT, cwd=self.work_dir,
                process_group=0)
        log.info("started torchrun (pid %d) for job %s at %s", self.proc.pid,
                 self.spec["run_id"], self.spec["rdzv_endpoint"])

    def training_status(self) -> dict[str, Any] | None:
        try:
            status = json.loads((self.dir / "status.json").read_text())
        except (OSError, ValueError):
            return None
        return status if float(status.get("at", 0)) >= self.started_at else None

    def poll(self) -> None:
        if self.state not in ("joining", "joined") or self.proc is None:
            return
        if self.proc.poll() is not None:
            self.state, self.failure = "failed", f"torchrun exited with {self.proc.returncode}"
            return
        if self.state == "joining" and self.training_status() is not None:
            self.state = "joined"
            log.info("joined the elastic job %s: %s", self.spec["run_id"], self.training_status())

    @property
    def busy(self) -> bool:
        return self.state == "joined"

    # -- drain ---------------------------------------------------------------------------------
    def drain_step(self, deadline: datetime | None) -> bool:
        if self.state == "released":
            return True
        now = time.monotonic()
        if self._drain_started is None:
            self._drain_started = now
            self.state = "draining"
        late = deadline is not None and datetime.now(UTC) >= deadline
        running = self.proc is not None and self.proc.poll() is None
        if (running and self.training_status() is not None) or self._requested_at is not None:
            if self._requested_at is None:
                self._request_checkpoint()
                self._requested_at = now
            step = self._checkpoint_done()
            if step is None and not late and now - self._requested_at < self.checkpoint_wait_s:
                return False
            self.report.checkpoint_step = step
            self.report.confirmed = step is not None
        self.stop()
        self.report.ended_by = "deadline" if late else "release"
        self.report.seconds = now - self._drain_started
        self.state = "released"
        log.info("left the elastic job: %s", self.report.as_dict())
        return True

    def _request_checkpoint(self) -> None:
        if self.spec.get("checkpoint_hook") == "http":
            try:
                _http("POST", self._hook_url())
            except OSError as exc:
                log.warning("checkpoint request over HTTP failed: %s", exc)
        else:
            (self.dir / "checkpoint.request").write_text(json.dumps({"at": time.time()}))
        log.info("asked the job to checkpoint (%s hook)",
                 self.spec.get("checkpoint_hook") or "file")

    def _checkpoint_done(self) -> int | None:
        if self.spec.get("checkpoint_hook") == "http":
            try:
                done = _http("GET", self._hook_url()).get("done")
            except (OSError, ValueError):
                return None
            return None if done is None else int(done)
        try:
            return int(json.loads((self.dir / "checkpoint.done").read_text())["step"])
        except (OSError, ValueError, KeyError):
            return None

    def _hook_url(self) -> str:
        return f"http://127.0.0.1:{self.spec['checkpoint_port']}/checkpoint"

    # -- stop ----------------------------------------------------------------------------------
    def stop(self) -> None:
        """SIGTERM torchrun and its workers (found before, as they run in sessions of their
        own), SIGKILL what is left after a grace. Idempotent."""
        proc = self.proc
        if proc is None:
            return
        victims = _descendants(proc.pid) if proc.poll() is None else []
        for pid in [proc.pid, *victims]:
            _signal(pid, signal.SIGTERM)
        end = time.monotonic() + STOP_GRACE_S
        while time.monotonic() < end and (proc.poll() is None or any(_alive(p) for p in victims)):
            time.sleep(0.05)
        for pid in [proc.pid, *victims]:
            _signal(pid, signal.SIGKILL)
        try:
            proc.wait(2.0)
        except subprocess.TimeoutExpired:
            pass


def _http(method: str, url: str) -> dict[str, Any]:
    request = urllib.request.Request(url, method=method, data=b"" if method == "POST" else None)
    try:
        with urllib.request.urlopen(request, timeout=2.0) as answer:
            return json.loads(answer.read() or b"{}")
    except urllib.error.HTTPError as exc:
        with exc:
            return json.loads(exc.read() or b"{}")


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _descendants(pid: int) -> list[int]:
    """Every process below ``pid`` (from /proc; torchrun's workers are in other sessions)."""
    children: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as handle:
                ppid = int(handle.read().rsplit(")", 1)[1].split()[1])
        except (OSError, ValueError, IndexError):
            continue
        children.setdefault(ppid, []).append(int(entry))
    found, frontier = [], [pid]
    while frontier:
        for child in children.get(frontier.pop(), []):
            found.append(child)
            frontier.append(child)
    return found


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as handle:
            return handle.read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


def _signal(pid: int, sig: int) -> None:
    try:
        os.kill(pid, sig)
    except (ProcessLookupError, PermissionError):
        pass
