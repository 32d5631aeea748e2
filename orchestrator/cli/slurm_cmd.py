"""`burst slurm resume / suspend / resume-fail HOSTLIST`: slurm.conf's power-save programs.

slurmctld runs ``ResumeProgram``, ``SuspendProgram`` and ``ResumeFailProgram`` with one argument,
a hostlist of ``State=CLOUD`` nodes (``cloud-[1-3,7]``). Each command here checks the names
against the power-save policies (a bad name exits 2 at once, naming it) and then hands the work
to a detached child process (forked, in its own session) and returns: slurmctld's script daemon waits for
its programs, and a cloud launch takes longer than a resume should hold it. The detached pass
plans, launches or terminates, records decisions and node events in burst's store and logs to
``<state dir>/slurm-powersave.log``. ``--wait`` does the work in the foreground (by hand, tests).
slurmctld may start a program with no stdin, stdout or stderr: the child opens its own.

A program slurmctld starts inherits a blocked signal mask (SIGTERM among it) from its script
daemon; every command clears it first, so the nodes it launches (and their slurmd) can be stopped.
"""

from __future__ import annotations

import fcntl
import json
import logging
import os
import signal
import sys
from pathlib import Path
from typing import Annotated

import typer

from orchestrator.cli.common import POLICY_HELP, fail, load_policies, load_settings

slurm_app = typer.Typer(rich_markup_mode=None, no_args_is_help=True,
                        help="Slurm power save: ResumeProgram, SuspendProgram, ResumeFailProgram.")

LOG_NAME = "slurm-powersave.log"

_Hostlist = Annotated[str, typer.Argument(help="Slurm hostlist of CLOUD nodes, e.g. cloud-[1-3].")]
_PolicyOpt = Annotated[list[Path] | None, typer.Option("--policy", "-p", help=POLICY_HELP)]
_StateOpt = Annotated[Path | None, typer.Option("--state-dir", help="State directory (BURST_STATE_DIR).")]
_WaitOpt = Annotated[bool, typer.Option("--wait", help="Do the work in this process and print "
                                        "what was done (default: hand it off and return).")]
_JsonOpt = Annotated[bool, typer.Option("--json", help="With --wait: print the outcome as JSON.")]


def _act(action: str, hostlist: str, policy: list[Path] | None, state_dir: Path | None,
         wait: bool, as_json: bool) -> None:
    from orchestrator.domain.plan import ActionReason
    from orchestrator.powersave import PowerSaveError, power_down, resume, route
    from orchestrator.sources.slurm_cli import SlurmCli

    signal.pthread_sigmask(signal.SIG_SETMASK, set())
    settings = load_settings(state_dir=state_dir)
    policies = load_policies(policy, settings)
    conf = next((p.queue.slurm_conf for p in policies if p.power_saved), None)
    names = SlurmCli(conf).hostnames(hostlist)
    if not names:
        fail(f"HOSTLIST {hostlist!r} names no node")
    try:
        routed = route(policies, names)
    except PowerSaveError as exc:
        fail(str(exc))
    if not wait and _hand_off(settings.state_dir):
        return  # the parent: the detached child does the work
    from orchestrator.wiring import ProviderUnavailable, build_runtime

    logging.basicConfig(level=settings.log_level, stream=sys.stderr,
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    try:
        rt = build_runtime(settings, policies)
    except ProviderUnavailable as exc:
        fail(str(exc))
    results = {}
    try:
        for name, wanted in routed.items():
            target = rt.policies[name]
            if action == "resume":
                done = resume(rt, target, wanted)
            else:
                reason = (ActionReason.SLURM_SUSPEND if action == "suspend"
                          else ActionReason.SLURM_RESUME_FAIL)
                done = power_down(rt, target, wanted, reason)
            results[name] = done.as_dict()
    finally:
        rt.close()
    if as_json:
        sys.stdout.write(json.dumps(results, indent=2) + "\n")
        return
    for name, done in results.items():
        for key in ("launched", "terminated", "refused"):
            for node_name, what in done[key].items():
                typer.echo(f"{name}: {node_name} {key} {what}")
        for node_name in done["unbound"]:
            typer.echo(f"{name}: {node_name} held by no burst node")
    if not wait:  # the detached child: done, without the parent's exit path
        _flush()
        os._exit(0)


def _hand_off(state_dir: Path) -> bool:
    """Fork a detached child (own session, output to the log) that goes on with the work; True
    in the parent. A fork, not a new interpreter: the child has every module imported already
    (docs/performance.md: 8.6 s instead of 12.1 s from the call to the decision on a loaded
    host)."""
    state_dir.mkdir(parents=True, exist_ok=True)
    _flush()
    if os.fork():
        return True
    os.setsid()
    # slurmctld's script daemon reads the program's output until it closes: the child keeps none
    # of the parent's descriptors.
    log = _above_stdio(os.open(state_dir / LOG_NAME, os.O_WRONLY | os.O_CREAT | os.O_APPEND,
                               0o644))
    null = _above_stdio(os.open(os.devnull, os.O_RDONLY))
    os.dup2(null, 0)
    os.dup2(log, 1)
    os.dup2(log, 2)
    os.close(null)
    os.close(log)
    # Started with its descriptors closed (as slurmctld may), Python has no sys.stdout at all.
    sys.stdout = open(1, "w", buffering=1, closefd=False)  # noqa: SIM115 - the process's own
    sys.stderr = open(2, "w", buffering=1, closefd=False)  # noqa: SIM115
    return False


def _above_stdio(fd: int) -> int:
    """``fd`` moved above 0-2: with stdio closed, open() hands out the very numbers dup2 fills."""
    if fd > 2:
        return fd
    high = fcntl.fcntl(fd, fcntl.F_DUPFD, 3)
    os.close(fd)
    return high


def _flush() -> None:
    for stream in (sys.stdout, sys.stderr):
        if stream is not None:
            stream.flush()


@slurm_app.command("resume")
def resume_command(hostlist: _Hostlist, policy: _PolicyOpt = None, state_dir: _StateOpt = None,
                   wait: _WaitOpt = False, as_json: _JsonOpt = False) -> None:
    """ResumeProgram: launch a burst node for each CLOUD node, as the policy decides."""
    _act("resume", hostlist, policy, state_dir, wait, as_json)


@slurm_app.command("suspend")
def suspend_command(hostlist: _Hostlist, policy: _PolicyOpt = None, state_dir: _StateOpt = None,
                    wait: _WaitOpt = False, as_json: _JsonOpt = False) -> None:
    """SuspendProgram: terminate the burst nodes holding these CLOUD node names."""
    _act("suspend", hostlist, policy, state_dir, wait, as_json)


@slurm_app.command("resume-fail")
def resume_fail_command(hostlist: _Hostlist, policy: _PolicyOpt = None,
                        state_dir: _StateOpt = None, wait: _WaitOpt = False,
                        as_json: _JsonOpt = False) -> None:
    """ResumeFailProgram: terminate the burst nodes that did not come up by ResumeTimeout."""
    _act("resume-fail", hostlist, policy, state_dir, wait, as_json)
