"""The Slurm fabric, node side: the agent's slurmd, its join, and the checkpoint-aware drain.

Driven by the node agent (:mod:`orchestrator.fabric.agent`) from the join spec the controller
answered registration with (:meth:`orchestrator.fabric.slurm.SlurmFabric.join_spec`).

Join: start ``slurmd -D -N <slot>`` (``mode: slot``), ``slurmd -D -Z -N <name> --conf "Gres=gpu:N
Feature=burst"`` (``mode: dynamic``) or ``slurmd -D -b -N <cloud name>`` (``mode: power-save``) as a
child of the agent, then poll Slurm until the node is usable; the agent reports ``joined``.
A resumed CLOUD node is accepted by slurmctld only if the boot time slurmd reports is not older
than the resume request: ``-b`` reports the slurmd start as the boot (a node sharing a host's
uptime, as in the tests, has an older one), and the start waits until 2 s after the request,
since that boot time is counted in whole seconds.

Drain, one non-blocking step per call of :meth:`SlurmMember.drain_step`, so the agent keeps
heartbeating:

1. ``scontrol update state=drain``: no new job lands on the node;
2. every job running there gets the checkpoint signal (``scancel --signal=USR1 --batch``);
3. each is requeued (``scontrol requeue``, then its requeue hold lifted) as soon as it confirms
   its checkpoint (it sets its comment to ``burst:checkpointed``), or when ``checkpoint_wait``
   has passed, or at once when running jobs are not respected; a job that ends by itself is left
   alone;
4. wait until Slurm shows no job on the node, or the drain deadline (then whatever is left is
   requeued), and lift the requeue hold (Slurm keeps a requeued job pending on ``BeginTime`` for
   about two minutes) so each job may start again at once elsewhere;
5. stop slurmd, then return the slot to ``FUTURE`` or delete the dynamic node.

The drain report says what happened to each job and whether the release or the deadline ended
the drain. Standard library only.
"""

from __future__ import annotations

import logging
import os
import re
import shutil
import signal
import subprocess
import time
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from orchestrator.sources.slurm_cli import (
    UNUSABLE_NODE_FLAGS,
    USABLE_NODE_STATES,
    SlurmCli,
    SlurmError,
    expand_hostlist,
)

log = logging.getLogger("burst.agent.slurm")

CHECKPOINTED = "burst:checkpointed"  # the comment a job sets to confirm its checkpoint
SLURMD_STOP_GRACE_S = 5.0
RESUME_BOOT_MARGIN_S = 2.0  # a power-save slurmd starts this long after the resume request
POLL_S = 0.5  # how often Slurm is asked about the node and its jobs while draining


@dataclass
class DrainReport:
    """What a drain did, sent to the controller with the release."""

    signalled: list[str] = field(default_factory=list)
    confirmed: list[str] = field(default_factory=list)
    requeued: list[str] = field(default_factory=list)
    ended_alone: list[str] = field(default_factory=list)
    ended_by: str = ""  # "release" or "deadline"
    seconds: float = 0.0

    def as_dict(self) -> dict[str, Any]:
        return {"signalled": self.signalled, "confirmed": self.confirmed,
                "requeued": self.requeued, "ended_alone": self.ended_alone,
                "ended_by": self.ended_by, "seconds": round(self.seconds, 3)}


class SlurmMember:
    """This node's membership of the Slurm cluster (see the module docstring)."""

    kind = "slurm"

    def __init__(self, spec: dict[str, Any], work_dir: Path, *, cli: SlurmCli | None = None):
        self.name = str(spec["node_name"])
        self.mode = str(spec.get("mode") or "dynamic")
        self.feature = str(spec.get("feature") or "burst")
        self.gpus = int(spec.get("gpus") or 0)
        self.signal = str(spec.get("checkpoint_signal") or "USR1")
        self.batch_only = bool(spec.get("signal_batch_only", True))
        self.checkpoint_wait_s = float(spec.get("checkpoint_wait_s") or 0.0)
        self.respect_running = bool(spec.get("respect_running_jobs", True))
        self.resume_requested_at = spec.get("resume_requested_at")
        self.hold_reason = spec.get("hold_reason")  # register drained with it (dynamic mode)
        self.cli = cli or SlurmCli(spec.get("slurm_conf"))
        self.work_dir = work_dir
        self.state = "joining"  # joining | joined | draining | released | failed
        self.failure: str | None = None
        self.slurmd: subprocess.Popen[bytes] | None = None
        self.joined_at: float | None = None
        self._next_poll = 0.0
        self._busy = False
        # drain progress
        self._phase = "start"
        self._drain_started: float | None = None
        self._signalled_at: dict[str, float] = {}
        self._unheld: set[str] = set()
        self.report = DrainReport()

    # -- join ----------------------------------------------------------------------------------
    def start(self) -> None:
        """Start slurmd for this node (a child of the agent; stopped by :meth:`stop`)."""
        slurmd = shutil.which("slurmd") or "/usr/sbin/slurmd"
        argv = [slurmd, "-D", "-N", self.name]
        if self.mode == "power-save":
            argv.insert(2, "-b")
            if self.resume_requested_at is not None:
                wait = float(self.resume_requested_at) + RESUME_BOOT_MARGIN_S - time.time()
                if wait > 0:
                    time.sleep(min(wait, RESUME_BOOT_MARGIN_S))
        elif self.mode == "dynamic":
            conf = f"Feature={self.feature}"
            if self.gpus > 0:
                conf = f"Gres=gpu:{self.gpus} {conf}"
            if self.hold_reason:  # the controller resumes it (orchestrator.fabric.kept_off)
                conf = f"{conf} State=DRAIN Reason={self.hold_reason}"
            argv[2:2] = ["-Z", "--conf", conf]
        self._make_spool_dir()
        log_path = self.work_dir / f"slurmd.{self.name}.log"
        with open(log_path, "ab") as out:
            # Same session as the agent: the instance's teardown reaches it like any node process.
            self.slurmd = subprocess.Popen(argv, env=self.cli.environ, stdin=subprocess.DEVNULL,
                                           stdout=out, stderr=subprocess.STDOUT)
        log.info("started slurmd as Slurm node %s (%s mode, pid %d)", self.name, self.mode,
                 self.slurmd.pid)

    def _make_spool_dir(self) -> None:
        try:
            config = self.cli.run("scontrol", "show", "config", timeout_s=10)
        except SlurmError as exc:
            log.warning("cannot read the Slurm configuration (%s); slurmd makes its spool dir", exc)
            return
        match = re.search(r"^SlurmdSpoolDir\s*=\s*(\S+)", config, re.MULTILINE)
        if match:
            path = match.group(1).replace("%n", self.name).replace("%h", os.uname().nodename)
            Path(path).mkdir(parents=True, exist_ok=True)

    def poll(self) -> None:
        """Advance the join: ``joined`` once Slurm shows the node usable; ``failed`` if slurmd
        died. Rate-limited, so it may be called on every agent loop."""
        now = time.monotonic()
        if now < self._next_poll or self.state not in ("joining", "joined"):
            return
        self._next_poll = now + (0.1 if self.state == "joining" else POLL_S * 4)
        if self.slurmd is not None and self.slurmd.poll() is not None:
            self.state, self.failure = "failed", f"slurmd exited with {self.slurmd.returncode}"
            log.error("slurmd of %s exited with %s", self.name, self.slurmd.returncode)
            return
        try:
            if self.state == "joining":
                state = self.cli.node_state(self.name)
                usable = state and state[0] in USABLE_NODE_STATES
                if usable and not (state[1] & UNUSABLE_NODE_FLAGS):
                    self.state, self.joined_at = "joined", time.monotonic()
                    log.info("joined Slurm as %s (%s)", self.name, "+".join([state[0], *state[1]]))
            else:
                self._busy = bool(self.cli.live_jobs_on(self.name))
        except SlurmError as exc:
            log.warning("Slurm not answering about %s: %s", self.name, exc)

    @property
    def busy(self) -> bool:
        return self._busy

    # -- drain ---------------------------------------------------------------------------------
    def drain_step(self, deadline: datetime | None) -> bool:
        """Do the next step of the drain; True once the node is out of Slurm (released)."""
        if self.state == "released":
            return True
        now = time.monotonic()
        if self._drain_started is None:
            self._drain_started = now
            self.state = "draining"
        if now < self._next_poll and self._phase in ("checkpoint", "empty"):
            return False
        self._next_poll = now + POLL_S
        late = deadline is not None and datetime.now(UTC) >= deadline
        try:
            if self._phase == "start":
                self._drain_in_slurm()
                self._phase = "signal"
            if self._phase == "signal":
                self._signal_jobs()
                self._phase = "checkpoint"
            if self._phase == "checkpoint":
                if self._requeue_checkpointed(late):
                    self._phase = "empty"
            if self._phase == "empty":
                jobs = self.cli.jobs()
                # A job still starting (CONFIGURING) when the drain began is running now: it gets
                # its checkpoint signal too, rather than a requeue without one at the deadline.
                if not late and self._signal_jobs(jobs):
                    self._phase = "checkpoint"
                    return False
                left = self.cli.live_jobs_on(self.name, jobs)
                if left and not late:
                    return False
                for job in left:  # the deadline came first: nothing may stay behind
                    self._requeue(str(job["job_id"]), "deadline")
                self.report.ended_by = self.report.ended_by or ("deadline" if late else "release")
                self._phase = "unhold"
            if self._phase == "unhold":
                if not self._lift_holds(late):
                    return False
                self._phase = "leave"
            if self._phase == "leave":
                self.stop()
                self._leave_slurm()
                self.report.seconds = time.monotonic() - self._drain_started
                self.state = "released"
                log.info("drained out of Slurm (%s): %s", self.report.ended_by,
                         self.report.as_dict())
                return True
        except SlurmError as exc:
            log.warning("drain of %s: %s; retrying", self.name, exc)
        return False

    def _drain_in_slurm(self) -> None:
        state = self.cli.node_state(self.name)
        if state is None or state[0] == "future":
            return  # never joined (or already gone): nothing to drain
        self.cli.drain(self.name, "burst drain")

    def _signal_jobs(self, jobs: list | None = None) -> int:
        """Send the checkpoint signal to each job running on the node that has not had it;
        returns how many were signalled now."""
        signalled = 0
        for job in self.cli.live_jobs_on(self.name, jobs):
            job_id = str(job["job_id"])
            if job.get("job_state") != "RUNNING" or job_id in self._signalled_at:
                continue
            if self.respect_running:
                try:
                    self.cli.signal_job(job_id, self.signal, batch_only=self.batch_only)
                except SlurmError as exc:
                    log.warning("job %s: checkpoint signal failed: %s", job_id, exc)
            self._signalled_at[job_id] = time.monotonic()
            self.report.signalled.append(job_id)
            signalled += 1
            log.info("job %s: sent SIG%s to checkpoint", job_id, self.signal)
        return signalled

    def _requeue_checkpointed(self, late: bool) -> bool:
        """Requeue jobs that confirmed (or ran out of time); True when none is left waiting."""
        waiting = {j: t for j, t in self._signalled_at.items()
                   if j not in self.report.requeued and j not in self.report.ended_alone}
        if not waiting:
            return True
        jobs = {str(j["job_id"]): j for j in self.cli.jobs()}
        for job_id, signalled_at in waiting.items():
            job = jobs.get(job_id)
            on_node = job is not None and self.name in _hosts(job) and job.get("job_state") in (
                "RUNNING", "COMPLETING", "CONFIGURING", "SUSPENDED", "STOPPED")
            if not on_node:
                self.report.ended_alone.append(job_id)
                continue
            confirmed = CHECKPOINTED in str(job.get("comment") or "")
            timed_out = time.monotonic() - signalled_at >= self.checkpoint_wait_s
            if confirmed or timed_out or late or not self.respect_running:
                if confirmed:
                    self.report.confirmed.append(job_id)
                self._requeue(job_id, "confirmed" if confirmed else "checkpoint wait over")
        return all(j in self.report.requeued or j in self.report.ended_alone for j in waiting)

    def _lift_holds(self, late: bool) -> bool:
        """Requeued jobs may start again at once (Slurm holds them ~2 min otherwise); True when
        every requeued job is back in the queue and free to start (or the deadline came)."""
        jobs = {str(j["job_id"]): j for j in self.cli.jobs()}
        done = True
        for job_id in self.report.requeued:
            if job_id in self._unheld:
                continue
            job = jobs.get(job_id)
            if job is None or self.cli.lift_hold(job):
                self._unheld.add(job_id)
            else:
                done = False
        return done or late

    def _requeue(self, job_id: str, why: str) -> None:
        self.cli.requeue(job_id)
        if job_id not in self.report.requeued:
            self.report.requeued.append(job_id)
        log.info("job %s requeued (%s)", job_id, why)

    def _leave_slurm(self) -> None:
        if self.mode == "power-save":
            return  # Slurm powers the CLOUD node down itself (SuspendProgram)
        state = self.cli.node_state(self.name)
        if state is None or (self.mode == "slot" and state[0] == "future"):
            return
        end = time.monotonic() + 10.0
        while True:
            try:
                if self.mode == "slot":
                    self.cli.set_future(self.name)
                else:
                    self.cli.delete_node(self.name)
                return
            except SlurmError:
                if time.monotonic() >= end:
                    raise
                time.sleep(0.3)  # a requeued job may still be completing on the node

    # -- stop ----------------------------------------------------------------------------------
    def stop(self) -> None:
        """Stop slurmd (SIGTERM, then SIGKILL after a grace). Idempotent."""
        proc = self.slurmd
        if proc is None or proc.poll() is not None:
            return
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(SLURMD_STOP_GRACE_S)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(2.0)
        log.info("slurmd of %s stopped", self.name)


def _hosts(job: dict[str, Any]) -> list[str]:
    return expand_hostlist(job.get("nodes") or "")
