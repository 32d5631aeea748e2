"""The Slurm command line, as burst uses it: squeue/sinfo JSON, scontrol, scancel.

Shared by the Slurm queue source (controller), the Slurm fabric (controller) and the node agent's
Slurm member (on the burst node), so it uses the standard library only. Every command runs with
``SLURM_CONF`` exported when one is configured: without it a Slurm client on a host with no
``/etc/slurm/slurm.conf`` tries configless DNS look-ups and dies. ``squeue --json`` in 22.05
ignores ``-t/-p/-w`` filters, so callers filter the parsed jobs themselves.
"""

from __future__ import annotations

import json
import logging
import os
import re
import subprocess
from collections.abc import Mapping, Sequence
from datetime import datetime
from typing import Any

log = logging.getLogger(__name__)

# Job states in which a job holds (or is about to hold, or still cleans up) a node.
LIVE_JOB_STATES = frozenset({"RUNNING", "COMPLETING", "CONFIGURING", "SUSPENDED", "STOPPED",
                             "SIGNALING", "STAGE_OUT", "RESIZING"})
FINISHED_JOB_STATES = frozenset({"COMPLETED", "CANCELLED", "FAILED", "TIMEOUT", "NODE_FAIL",
                                 "PREEMPTED", "BOOT_FAIL", "DEADLINE", "OUT_OF_MEMORY"})
# Node state flags that make a node unusable for new work.
UNUSABLE_NODE_FLAGS = frozenset({"DRAIN", "NOT_RESPONDING", "FAIL", "POWERED_DOWN",
                                 "POWERING_DOWN", "POWER_DOWN", "POWERING_UP", "MAINTENANCE",
                                 "REBOOT_REQUESTED", "REBOOT_ISSUED", "INVALID_REG"})
USABLE_NODE_STATES = frozenset({"idle", "mixed", "allocated", "completing", "planned"})


class SlurmError(Exception):
    """A Slurm command failed or its output could not be read; the message names the command."""

    def __init__(self, message: str, *, command: Sequence[str] = (), returncode: int | None = None):
        super().__init__(message)
        self.command = list(command)
        self.returncode = returncode


NOT_FOUND = re.compile(r"Node \S+ not found")


class SlurmCli:
    """Runs Slurm client commands against one cluster (``conf``: its slurm.conf, or None)."""

    def __init__(self, conf: str | None = None, *, timeout_s: float = 20.0,
                 environ: Mapping[str, str] | None = None):
        base = dict(os.environ if environ is None else environ)
        self.conf = conf or base.get("SLURM_CONF")
        if self.conf:
            base["SLURM_CONF"] = self.conf
        self.environ = base
        self.timeout_s = timeout_s

    def run(self, *argv: str, check: bool = True, timeout_s: float | None = None) -> str:
        """stdout of the command; SlurmError (with stderr) when it fails and ``check``."""
        if self.conf and not os.path.exists(self.conf):
            raise SlurmError(f"slurm.conf {self.conf} does not exist (set queue.slurm_conf in "
                             "the policy, or SLURM_CONF)", command=argv)
        try:
            done = subprocess.run(list(argv), env=self.environ, capture_output=True, text=True,
                                  timeout=timeout_s or self.timeout_s, stdin=subprocess.DEVNULL)
        except FileNotFoundError:
            raise SlurmError(f"{argv[0]} is not installed (Slurm client tools missing)",
                             command=argv) from None
        except subprocess.TimeoutExpired:
            raise SlurmError(f"{' '.join(argv)} did not answer within "
                             f"{timeout_s or self.timeout_s:.0f}s (slurmctld down?)",
                             command=argv) from None
        if check and done.returncode != 0:
            detail = (done.stderr or done.stdout).strip().splitlines()
            raise SlurmError(f"{' '.join(argv)} failed (exit {done.returncode}): "
                             f"{detail[-1] if detail else 'no output'}",
                             command=argv, returncode=done.returncode)
        return done.stdout

    def accounting(self, since: datetime, until: datetime) -> str:
        """sacct's parsable output of the jobs that ended in [since, until), in UTC
        (:mod:`orchestrator.sources.slurm_usage`); SlurmError without accounting storage."""
        from orchestrator.sources.slurm_usage import sacct_command

        utc = SlurmCli(self.conf, timeout_s=self.timeout_s, environ={**self.environ, "TZ": "UTC"})
        return utc.run(*sacct_command(since, until))

    def json(self, *argv: str) -> dict[str, Any]:
        out = self.run(*argv)
        try:
            data = json.loads(out)
        except ValueError as exc:
            raise SlurmError(f"{' '.join(argv)} printed no JSON ({exc}); Slurm 22.05 or newer "
                             "with the openapi/serializer plugins is needed",
                             command=argv) from None
        errors = [e for e in data.get("errors", []) if e]
        if errors:
            raise SlurmError(f"{' '.join(argv)} reported errors: {errors}", command=argv)
        return data

    # -- reading -------------------------------------------------------------------------------
    def jobs(self) -> list[dict[str, Any]]:
        """Every job slurmctld knows (``squeue --json``; finished ones within MinJobAge too)."""
        return list(self.json("squeue", "--json").get("jobs", []))

    def nodes(self) -> list[dict[str, Any]]:
        """Every node ``sinfo --json`` lists (FUTURE slots are not listed)."""
        return list(self.json("sinfo", "--json").get("nodes", []))

    def node_state(self, name: str) -> tuple[str, frozenset[str]] | None:
        """(base state in lower case, flags) of one node, FUTURE slots included; None if Slurm
        has no such node. ``scontrol show node`` is used rather than ``sinfo -n``, which logs a
        look-up error in slurmctld.log for every unknown name."""
        try:
            out = self.run("scontrol", "--future", "-o", "show", "node", name)
        except SlurmError as exc:
            # Only "no such node" means None; slurmctld unreachable (or any other failure) must
            # not read as "gone": callers would skip the drain or free a name Slurm still holds.
            if exc.returncode is not None and NOT_FOUND.search(str(exc)):
                return None
            raise
        match = re.search(r"(?:^|\s)State=(\S+)", out)
        if match is None:
            return None
        parts = match.group(1).split("+")
        base = parts[0].rstrip("*~#!%$@^-").lower()
        return base, frozenset(p.upper() for p in parts[1:])

    def hostnames(self, expr: str) -> list[str]:
        """A hostlist expression's names: ``scontrol show hostnames`` (Slurm's own expansion, any
        form it accepts), else :func:`expand_hostlist` where scontrol is missing or fails."""
        try:
            names = self.run("scontrol", "show", "hostnames", expr, timeout_s=10).split()
        except SlurmError as exc:
            log.info("scontrol show hostnames %s failed (%s); expanding it here", expr, exc)
            return expand_hostlist(expr)
        return names or expand_hostlist(expr)

    def node_gpus(self, name: str) -> int | None:
        """The GPUs slurm.conf gives node ``name`` (``Gres=gpu:N`` or ``gpu:type:N``); None when
        Slurm does not say."""
        out = self.run("scontrol", "--future", "-o", "show", "node", name, check=False)
        match = re.search(r"(?:^|\s)Gres=(\S+)", out)
        return (gres_count(match.group(1)) or None) if match else None

    def set_down(self, name: str, reason: str) -> None:
        """Mark the node DOWN with a reason ``sinfo -R`` and ``scontrol show node`` show."""
        self.run("scontrol", "update", f"nodename={name}", "state=down", f"reason={reason}")

    def live_jobs_on(self, name: str,
                     jobs: list[dict[str, Any]] | None = None) -> list[dict[str, Any]]:
        """Jobs holding node ``name`` now (running, completing, ...)."""
        jobs = self.jobs() if jobs is None else jobs
        return [j for j in jobs if j.get("job_state") in LIVE_JOB_STATES
                and name in expand_hostlist(j.get("nodes") or "")]

    # -- acting --------------------------------------------------------------------------------
    def drain(self, name: str, reason: str) -> None:
        self.run("scontrol", "update", f"nodename={name}", "state=drain", f"reason={reason}")

    def resume(self, name: str) -> None:
        self.run("scontrol", "update", f"nodename={name}", "state=resume")

    def set_down(self, name: str, reason: str) -> None:
        self.run("scontrol", "update", f"nodename={name}", "state=down", f"reason={reason}")

    def set_future(self, name: str) -> None:
        self.run("scontrol", "update", f"nodename={name}", "state=future")

    def delete_node(self, name: str) -> None:
        self.run("scontrol", "delete", f"nodename={name}")

    def signal_job(self, job_id: str | int, signal: str, *, batch_only: bool = True) -> None:
        argv = ["scancel", f"--signal={signal}"]
        if batch_only:
            argv.append("--batch")
        self.run(*argv, str(job_id))

    def set_nice(self, job_id: str | int, nice: int) -> None:
        """Adjust a pending job's priority by ``-nice`` (``scontrol update nice=``; a negative
        nice needs an operator, as burst's controller is)."""
        self.run("scontrol", "update", f"jobid={job_id}", f"nice={nice}")

    def set_excluded(self, job_ids: list[str], names: list[str]) -> None:
        """Set the pending jobs' excluded nodes (``scontrol update jobid=a,b ExcNodeList=``;
        every name must be a node Slurm knows, FUTURE and CLOUD ones included; none: cleared)."""
        self.run("scontrol", "update", "jobid=" + ",".join(job_ids),
                 "ExcNodeList=" + ",".join(names))

    def requeue(self, job_id: str | int) -> None:
        """Requeue the job: it is killed and goes back to PENDING once it has left its node.
        Slurm then holds it (reason BeginTime) for about 2 minutes: see :meth:`lift_hold`."""
        self.run("scontrol", "requeue", str(job_id))

    def lift_hold(self, job: dict[str, Any]) -> bool:
        """Let a requeued job start again at once (``scontrol update starttime=now``). Only a
        job already back to PENDING can be changed: while it is still completing the update
        would be overwritten. True when the job needs nothing more (lifted, or not pending on
        BeginTime, or gone)."""
        if job.get("job_state") in ("COMPLETING", "RUNNING", "CONFIGURING"):
            return False
        if job.get("job_state") == "PENDING" and job.get("state_reason") == "BeginTime":
            self.run("scontrol", "update", f"jobid={job['job_id']}", "starttime=now")
        return True


# -- parsing helpers (pure) ---------------------------------------------------------------------

_RANGE = re.compile(r"^(\d+)(?:-(\d+))?$")


def expand_hostlist(expr: str) -> list[str]:
    """``"onprem-[1-2],burst-3"`` -> ``["onprem-1", "onprem-2", "burst-3"]`` (Slurm hostlists
    with one bracket group per name, as squeue prints them; leading zeros are kept)."""
    names: list[str] = []
    for part in _split_top(expr.strip()):
        if not part:
            continue
        if "[" not in part:
            names.append(part)
            continue
        prefix, rest = part.split("[", 1)
        body, _, suffix = rest.partition("]")
        for item in body.split(","):
            match = _RANGE.match(item.strip())
            if match is None:
                names.append(f"{prefix}{item}{suffix}")
                continue
            first, last = match.group(1), match.group(2) or match.group(1)
            width = len(first) if first.startswith("0") else 0
            for number in range(int(first), int(last) + 1):
                names.append(f"{prefix}{str(number).zfill(width)}{suffix}")
    return names


def _split_top(expr: str) -> list[str]:
    """Split on commas outside brackets."""
    parts, depth, current = [], 0, []
    for char in expr:
        if char == "[":
            depth += 1
        elif char == "]":
            depth -= 1
        if char == "," and depth == 0:
            parts.append("".join(current))
            current = []
        else:
            current.append(char)
    parts.append("".join(current))
    return parts


def gres_count(text: str | None, name: str = "gpu") -> int:
    """GPUs in a gres/tres string: ``"gpu:4"``, ``"gres:gpu:a100:2"``, ``"gpu:2(IDX:0-1)"``,
    ``"gres/gpu=2"``, ``"gpu:a100:2(S:0),gpu:v100:1"`` -> total count of ``name``."""
    if not text or text in ("N/A", "(null)"):
        return 0
    total = 0
    for part in _split_top(text):
        part = re.sub(r"\(.*?\)", "", part.strip())
        if "=" in part:  # tres form: gres/gpu=2 or gres/gpu:a100=2
            key, _, value = part.partition("=")
            fields = key.replace("gres/", "").split(":")
            if fields[0] == name and value.isdigit():
                total += int(value)
            continue
        fields = [f for f in part.split(":") if f]
        if fields and fields[0] == "gres":
            fields = fields[1:]
        if not fields or fields[0] != name:
            continue
        if len(fields) == 1:
            total += 1
        elif fields[-1].isdigit():
            total += int(fields[-1])
    return total
