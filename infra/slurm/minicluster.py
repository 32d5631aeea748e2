#!/usr/bin/env python3
"""A real single-host Slurm 22.05 mini-cluster: munged, slurmctld and on-prem slurmds.

Used by burst's tests (``tests/slurm_env.py``) and by hand::

    python3 infra/slurm/minicluster.py start --base /tmp/burst-slurm   # prints SLURM_CONF=...
    export SLURM_CONF=/tmp/burst-slurm/etc/slurm.conf
    sinfo -N; sbatch --gres=gpu:2 --wrap 'sleep 60'
    python3 infra/slurm/minicluster.py stop --base /tmp/burst-slurm

Needs root and the Debian packages ``munge slurmctld slurmd slurm-client`` (``.ci/run`` installs
them). The cluster: ``onprem-[1-N]`` (8 CPUs, 4 fake GPUs each, ``Feature=onprem``), FUTURE slots
``burst-[1-M]`` (``Feature=burst``, one port each) that burst's node agents fill, and partition
``gpu`` holding both (plus any dynamic ``slurmd -Z`` node with ``Feature=burst``), and power-save
``State=CLOUD`` nodes ``cloud-[1-K]`` in partition ``cloud`` (``SuspendTime=5``) whose
ResumeProgram/SuspendProgram/ResumeFailProgram are ``bin/burst-*`` wrappers running ``burst slurm
...`` with the settings in ``etc/burst-power.env`` (absent: every resume fails).

``stop`` cancels every job first (job processes outlive the daemons by design), then stops every
slurmd whose pid file is in the cluster's run directory, slurmctld, and munged if this cluster
started it, each by pid: SIGTERM, then SIGKILL after a grace. Standard library only.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import socket
import stat
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from string import Template

HERE = Path(__file__).resolve().parent
BINARIES = ("munged", "munge", "unmunge", "runuser", "slurmctld", "slurmd", "sbatch", "squeue",
            "sinfo", "scontrol", "scancel")
SBIN = ("/usr/sbin", "/usr/bin", "/sbin", "/bin")
MUNGE_PID = Path("/run/munge/munged.pid")
MUNGE_KEY = Path("/etc/munge/munge.key")


def which(name: str) -> str | None:
    found = shutil.which(name)
    if found:
        return found
    for directory in SBIN:
        candidate = Path(directory) / name
        if candidate.exists() and os.access(candidate, os.X_OK):
            return str(candidate)
    return None


def missing_binaries() -> list[str]:
    """Slurm/munge programs that are not installed (empty when the cluster can run here)."""
    return [name for name in BINARIES if which(name) is None]


# A power-save program: Slurm runs it with the hostlist only and no environment but SLURM_CONF.
POWER_WRAPPER = """#!/bin/sh
echo "$(date +%T.%N) {action} $*" >> {log}
[ -r {env} ] || {{ echo "burst-{action}: no {env}" >&2; exit 1; }}
. {env}
exec "$BURST" slurm {action} "$@"
"""


class ClusterError(RuntimeError):
    """The mini-cluster could not start; the message says which step and shows its log."""


@dataclass
class Ports:
    ctld: int = 6817
    slurmd: int = 6818  # dynamic nodes
    onprem: int = 17001  # onprem-1 .. onprem-N use onprem .. onprem+N-1
    burst: int = 17101  # burst-1 .. burst-M use burst .. burst+M-1
    cloud: int = 17201  # cloud-1 .. cloud-K (power save) use cloud .. cloud+K-1


class MiniCluster:
    """One mini-cluster under ``base`` (see the module docstring)."""

    def __init__(self, base: Path, *, onprem_nodes: int = 2, burst_slots: int = 4,
                 ports: Ports | None = None, cloud_nodes: int = 2):
        self.base = Path(base).resolve()
        self.onprem_nodes = onprem_nodes
        self.burst_slots = burst_slots
        self.cloud_nodes = cloud_nodes
        self.ports = ports or Ports()
        self.conf = self.base / "etc" / "slurm.conf"
        self._procs: list[subprocess.Popen[bytes]] = []

    # -- names and environment ---------------------------------------------------------------
    @property
    def onprem_names(self) -> list[str]:
        return [f"onprem-{i}" for i in range(1, self.onprem_nodes + 1)]

    @property
    def slot_names(self) -> list[str]:
        return [f"burst-{i}" for i in range(1, self.burst_slots + 1)]

    @property
    def cloud_names(self) -> list[str]:
        return [f"cloud-{i}" for i in range(1, self.cloud_nodes + 1)]

    @property
    def power_env(self) -> Path:
        """Where the power-save wrappers read burst's settings (shell ``export`` lines)."""
        return self.base / "etc" / "burst-power.env"

    def env(self) -> dict[str, str]:
        """os.environ with SLURM_CONF pointing at this cluster (always set it: pitfall 8)."""
        return {**os.environ, "SLURM_CONF": str(self.conf)}

    def run(self, *argv: str, check: bool = True, timeout: float = 30.0) -> str:
        """Run a Slurm client command against this cluster; its stdout."""
        done = subprocess.run(list(argv), env=self.env(), capture_output=True, text=True,
                              timeout=timeout)
        if check and done.returncode != 0:
            raise ClusterError(f"{' '.join(argv)} failed ({done.returncode}): "
                               f"{done.stderr.strip() or done.stdout.strip()}")
        return done.stdout

    # -- start -------------------------------------------------------------------------------
    def render(self) -> None:
        """Write slurm.conf and gres.conf, the directories and the fake GPU devices."""
        for sub in ("etc", "bin", "state", "spool", "log", "run", "jobs", "fakegpu"):
            (self.base / sub).mkdir(parents=True, exist_ok=True)
        (self.base / "jobs").chmod(0o1777)
        values = {
            "base": str(self.base), "ctld_port": self.ports.ctld, "slurmd_port": self.ports.slurmd,
            "onprem_nodes": self.onprem_nodes, "onprem_port": self.ports.onprem,
            "onprem_port_last": self.ports.onprem + self.onprem_nodes - 1,
            "burst_slots": self.burst_slots, "burst_port": self.ports.burst,
            "burst_port_last": self.ports.burst + self.burst_slots - 1,
            "cloud_nodes": self.cloud_nodes, "cloud_port": self.ports.cloud,
            "cloud_port_last": self.ports.cloud + self.cloud_nodes - 1,
        }
        for name in ("slurm.conf", "gres.conf"):
            text = Template((HERE / f"{name}.in").read_text()).substitute(values)
            (self.base / "etc" / name).write_text(text)
        for action in ("resume", "suspend", "resume-fail"):
            wrapper = self.base / "bin" / f"burst-{action}"
            wrapper.write_text(POWER_WRAPPER.format(env=self.power_env, action=action,
                                                    log=self.base / "log" / "power.log"))
            wrapper.chmod(0o755)
        for index in range(4):
            device = self.base / "fakegpu" / f"nvidia{index}"
            if not device.exists():
                # Char devices aliasing /dev/null: regular files work but log an error per start.
                os.mknod(device, 0o666 | stat.S_IFCHR, os.makedev(1, 3))

    def busy_ports(self) -> list[int]:
        ports = [self.ports.ctld, self.ports.slurmd,
                 *range(self.ports.onprem, self.ports.onprem + self.onprem_nodes),
                 *range(self.ports.burst, self.ports.burst + self.burst_slots),
                 *range(self.ports.cloud, self.ports.cloud + self.cloud_nodes)]
        busy = []
        for port in ports:
            with socket.socket() as sock:
                sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
                try:
                    sock.bind(("127.0.0.1", port))
                except OSError:
                    busy.append(port)
        return busy

    def start(self, timeout_s: float = 30.0) -> None:
        """Bring the cluster up: every on-prem node idle. Raises ClusterError, leaving nothing."""
        missing = missing_binaries()
        if missing:
            raise ClusterError(f"Slurm/munge not installed (missing {', '.join(missing)})")
        busy = self.busy_ports()
        if busy:
            raise ClusterError(f"ports {busy} are in use: another Slurm cluster is running here?")
        self.render()
        try:
            self._start_munge()
            self._spawn("slurmctld", [which("slurmctld"), "-D", "-i"])
            self._wait(lambda: "is UP" in self.run("scontrol", "ping", check=False),
                       timeout_s, "slurmctld did not answer scontrol ping")
            for name in self.onprem_names:
                (self.base / "spool" / f"slurmd.{name}").mkdir(exist_ok=True)
                self._spawn(f"slurmd.{name}", [which("slurmd"), "-D", "-N", name])
            self._wait(lambda: all(self.node_state(n) == "idle" for n in self.onprem_names),
                       timeout_s, "on-prem nodes did not become idle")
        except BaseException:
            self.stop()
            raise

    def _start_munge(self) -> None:
        if self._munge_ok():
            return  # the machine's munged (or another cluster's) serves us too
        if not MUNGE_KEY.exists() or MUNGE_KEY.stat().st_size == 0:
            subprocess.run([which("mungekey") or "mungekey", "--create", f"--keyfile={MUNGE_KEY}"],
                           check=True)
            shutil.chown(MUNGE_KEY, "munge", "munge")
            MUNGE_KEY.chmod(0o400)
        for path, mode in ((Path("/run/munge"), 0o755), (Path("/var/log/munge"), 0o700),
                           (Path("/var/lib/munge"), 0o700)):
            path.mkdir(parents=True, exist_ok=True)
            shutil.chown(path, "munge", "munge")
            path.chmod(mode)
        self._spawn("munged", [which("runuser") or "runuser", "-u", "munge", "--", which("munged"),
                               "--foreground"])
        (self.base / "run" / "munged.ours").write_text("started by this cluster\n")
        self._wait(self._munge_ok, 10.0, "munged did not start")

    @staticmethod
    def _munge_ok() -> bool:
        try:
            cred = subprocess.run(["munge", "-n"], capture_output=True, timeout=5)
            if cred.returncode != 0:
                return False
            return subprocess.run(["unmunge"], input=cred.stdout, capture_output=True,
                                  timeout=5).returncode == 0
        except (OSError, subprocess.TimeoutExpired):
            return False

    def _spawn(self, name: str, argv: list[str | None]) -> None:
        log = open(self.base / "log" / f"{name}.stdout", "ab")  # noqa: SIM115 - owned by the child
        with log:
            proc = subprocess.Popen([a for a in argv if a], env=self.env(), stdout=log,
                                    stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                    start_new_session=True)
        self._procs.append(proc)

    def _wait(self, condition, timeout_s: float, what: str) -> None:
        end = time.monotonic() + timeout_s
        while time.monotonic() < end:
            if condition():
                return
            time.sleep(0.1)
        log = self.base / "log" / "slurmctld.log"
        tail = log.read_text()[-2000:] if log.exists() else "(no slurmctld log)"
        raise ClusterError(f"{what} within {timeout_s:.0f}s; slurmctld.log ends:\n{tail}")

    # -- state -------------------------------------------------------------------------------
    def nodes(self) -> dict[str, dict]:
        """``sinfo --json`` nodes by name (FUTURE slots are not listed)."""
        data = json.loads(self.run("sinfo", "--json"))
        return {n["name"]: n for n in data.get("nodes", [])}

    def node_state(self, name: str) -> str | None:
        """The node's state in lower case ("idle", "mixed", "future", ...), None if unknown."""
        out = self.run("scontrol", "--future", "-o", "show", "node", name, check=False)
        for field in out.split():
            if field.startswith("State="):
                return field.split("=", 1)[1].split("+")[0].lower()
        return None

    def jobs(self) -> list[dict]:
        return json.loads(self.run("squeue", "--json")).get("jobs", [])

    def slurmd_pids(self) -> dict[str, int]:
        """Live slurmd processes of this cluster, by node name (from their pid files)."""
        found = {}
        for pidfile in (self.base / "run").glob("slurmd.*.pid"):
            pid = _read_pid(pidfile)
            if pid is not None and _alive(pid):
                found[pidfile.name[len("slurmd."):-len(".pid")]] = pid
        return found

    # -- stop --------------------------------------------------------------------------------
    def stop(self) -> None:
        """Cancel all jobs, then stop every daemon of this cluster by pid. Idempotent."""
        run = self.base / "run"
        ctld = _read_pid(run / "slurmctld.pid")
        if ctld is not None and _alive(ctld):
            ids = [str(j["job_id"]) for j in self._live_jobs()]
            if ids:
                self.run("scancel", *ids, check=False)
                end = time.monotonic() + 20
                while self._live_jobs() and time.monotonic() < end:
                    time.sleep(0.2)
        for pidfile in sorted(run.glob("slurmd.*.pid")):
            _stop(_read_pid(pidfile))
        _stop(ctld)
        if (run / "munged.ours").exists():
            _stop(_read_pid(MUNGE_PID))
            (run / "munged.ours").unlink()
        for proc in self._procs:  # our own children: stop any left, and reap them
            if proc.poll() is None:
                _stop(proc.pid)
            try:
                proc.wait(5)
            except subprocess.TimeoutExpired:
                pass
        self._procs.clear()
        _kill_job_leftovers(self.base)

    def _live_jobs(self) -> list[dict]:
        try:
            jobs = self.jobs()
        except (ClusterError, ValueError, subprocess.TimeoutExpired):
            return []
        return [j for j in jobs if j.get("job_state") not in
                ("COMPLETED", "CANCELLED", "FAILED", "TIMEOUT", "NODE_FAIL", "PREEMPTED",
                 "BOOT_FAIL", "DEADLINE", "OUT_OF_MEMORY")]


def _read_pid(path: Path) -> int | None:
    try:
        return int(path.read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return None


def _kill_job_leftovers(base: Path) -> list[int]:
    """Kill what jobs left behind on this host: job scripts (their command line names this
    cluster's spool) and everything they started. On one host, a job's processes outlive a
    slurmd that was killed under it (a real burst node takes them along when it is terminated).
    Returns the pids killed."""
    marker = (str(base) + os.sep).encode()
    parents: dict[int, int] = {}
    roots: set[int] = set()
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            cmdline = (entry / "cmdline").read_bytes()
            stat_fields = (entry / "stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        pid = int(entry.name)
        parents[pid] = int(stat_fields[1])
        if marker in cmdline and pid != os.getpid():
            roots.add(pid)
    doomed = set(roots)
    grew = True
    while grew:  # and their descendants (a job's sleep, its python, ...)
        grew = False
        for pid, ppid in parents.items():
            if ppid in doomed and pid not in doomed:
                doomed.add(pid)
                grew = True
    for pid in sorted(doomed):
        try:
            os.kill(pid, signal.SIGKILL)
        except OSError:
            pass
    return sorted(doomed)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    try:  # a zombie is dead for our purposes
        with open(f"/proc/{pid}/stat") as handle:
            return handle.read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


def _stop(pid: int | None, grace_s: float = 5.0) -> None:
    """SIGTERM, wait up to ``grace_s``, then SIGKILL (slurmstepd ignores SIGTERM)."""
    if pid is None or not _alive(pid):
        return
    try:
        os.kill(pid, signal.SIGTERM)
    except ProcessLookupError:
        return
    end = time.monotonic() + grace_s
    while _alive(pid) and time.monotonic() < end:
        time.sleep(0.05)
    if _alive(pid):
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("action", choices=["start", "stop", "status"])
    parser.add_argument("--base", type=Path, default=Path("/tmp/burst-slurm"),
                        help="directory of the cluster (config, state, logs, fake GPUs)")
    parser.add_argument("--onprem-nodes", type=int, default=2)
    parser.add_argument("--burst-slots", type=int, default=4)
    args = parser.parse_args(argv)
    cluster = MiniCluster(args.base, onprem_nodes=args.onprem_nodes, burst_slots=args.burst_slots)
    if args.action == "start":
        try:
            cluster.start()
        except ClusterError as exc:
            print(f"minicluster: {exc}", file=sys.stderr)
            return 1
        print(f"SLURM_CONF={cluster.conf}")
    elif args.action == "stop":
        cluster.stop()
    else:
        print(cluster.run("sinfo", "-N", "-o", "%N %T %G %f", check=False), end="")
    return 0


if __name__ == "__main__":
    sys.exit(main())
