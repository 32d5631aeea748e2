"""Chaos: ``burst run`` killed with SIGKILL at random moments over full burst cycles (issue 13).

The embedded mode as a user runs it (local provider: every burst node a process running the real
node agent; the built-in queue; SQLite), the controller killed again and again at random points
of its life (starting up, ticking, launching, answering agents) and restarted after an outage that
is mostly short, sometimes longer than ``timeouts.heartbeat`` (never as long as the node-side
``timeouts.controller_lease``). Each cycle submits jobs, sprinkles kills over the burst, then lets
the last controller finish the cycle: every job done, every node scaled down.

The invariants are exact; the timing is not asserted at all (waits are bounded by conditions):

* 0 leaked instances: at the end no local-provider process runs, each node had at most one
  instance, and every instance belongs to a node record;
* 0 jobs executed twice after a successful finish: each job's command appends ``start <job>`` and,
  after its work, ``done <job>`` to a marker file; no ``start`` follows a job's ``done``;
* 0 lost jobs: every job ends ``done``;
* healthy nodes survive every outage (all shorter than the controller lease): no node ever failed.

Restarts are forks of this (already imported) test process running ``burst run``'s command, so a
restart costs a fraction of a second rather than a Python start-up; the kill is a real SIGKILL of
that process. ``BURST_CHAOS_KILLS`` overrides the number of kills (default 200).
"""

from __future__ import annotations

import os
import random
import signal
import sys
import time
import traceback
from collections import Counter
from datetime import UTC, datetime
from pathlib import Path

import pytest

# What `burst run` imports lazily, imported here once: every forked controller starts from this
# process's modules, so a restart costs what `burst run` does, not a Python start-up, and the
# random kill points fall over its whole life (start-up, ticks, API answers), not mostly in imports.
import orchestrator.api
import orchestrator.api.presence
import orchestrator.api.server
import orchestrator.cli.run_cmd
import orchestrator.loop
import orchestrator.wiring
import providers.local  # noqa: F401
from orchestrator.store import Store, default_sqlite_url
from tests.e2e.helpers import free_port, kill_all, node_processes, wait_for

pytestmark = [pytest.mark.long, pytest.mark.timeout(900)]

KILLS = int(os.environ.get("BURST_CHAOS_KILLS", "200"))
CYCLES = 5
JOBS_PER_CYCLE = 6
HEARTBEAT_S = 5  # tight, with room for a loaded machine to answer a heartbeat late
LONG_OUTAGE_S = HEARTBEAT_S + 2  # longer than the heartbeat timeout, far below the lease
LONG_EVERY = 40  # one kill in 40 is followed by a long outage (5 of 200)
TICK_S = "0.5"
SEED = int(os.environ.get("BURST_CHAOS_SEED", "13"))

POLICY = f"""\
# Chaos test: sub-second ticks, tight timeouts, every job on a burst node.
version: 1
name: chaos
cluster: e2e-chaos
pool:
  name: gpu
  onprem: {{nodes: 0, gpus_per_node: 4}}
trigger: {{pending_gpus_above: 0, oldest_wait_above: 0s, sustained_for: 0s}}
offerings:
  - {{provider: local, region: local, zone: local-a, instance_type: local.4gpu, market: on-demand,
     gpus: 4, price_usd_hour: 4.10}}
limits: {{max_nodes: 3, max_concurrent_launches: 3}}
scale_down: {{idle_for: 1s, drain_grace: 30s}}
timeouts: {{launch: 30s, boot: 60s, join: 30s, terminate: 30s, heartbeat: {HEARTBEAT_S}s,
           controller_lease: 120s}}
cooldowns: {{scale_up: 0s, scale_down: 1s}}
"""


class Controller:
    """``burst run`` in a forked child of this process; killed and restarted by the test."""

    def __init__(self, env: dict[str, str], policy: Path, log: Path) -> None:
        self.env = env
        self.policy = policy
        self.log = log
        self.pid: int | None = None
        self.starts = 0
        self.exited_by_itself = 0
        self._stopping = False

    def start(self) -> None:
        sys.stdout.flush()
        sys.stderr.flush()
        pid = os.fork()
        if pid == 0:  # the child: become `burst run`, never return into pytest
            code = 1
            try:
                os.setsid()
                out = open(self.log, "a", buffering=1)  # noqa: SIM115 - the child's own stdout
                os.dup2(out.fileno(), 1)
                os.dup2(out.fileno(), 2)
                sys.stdout = sys.stderr = out
                os.environ.update(self.env)
                from orchestrator.cli.run_cmd import run_command

                run_command(policy=[self.policy], tick=float(TICK_S), state_dir=None, port=None,
                            once=False)
                code = 0
            except SystemExit as exc:
                code = exc.code if isinstance(exc.code, int) else 1
            except BaseException:  # noqa: BLE001 - report, then leave without pytest's cleanup
                traceback.print_exc()
            finally:
                os._exit(code)
        self.pid = pid
        self.starts += 1

    def alive(self) -> bool:
        if self.pid is None:
            return False
        done, _ = os.waitpid(self.pid, os.WNOHANG)
        if done:
            self.pid = None
            if not self._stopping:
                self.exited_by_itself += 1  # e.g. the API port not free yet: started again
            return False
        return True

    def kill(self) -> None:
        if self.pid is not None:
            try:
                os.kill(self.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            os.waitpid(self.pid, 0)
            self.pid = None

    def stop(self) -> None:
        self._stopping = True
        if self.pid is not None:
            os.kill(self.pid, signal.SIGTERM)
            deadline = time.monotonic() + 60
            while time.monotonic() < deadline and self.alive():
                time.sleep(0.1)
            self.kill()


@pytest.fixture
def rig(tmp_path: Path):
    state = tmp_path / "state"
    env = {"BURST_STATE_DIR": str(state), "BURST_API_PORT": str(free_port()),
           "BURST_LOCAL_BOOT_DELAY_S": "0.3", "BURST_LOG_LEVEL": "INFO"}
    policy = tmp_path / "chaos.yaml"
    policy.write_text(POLICY)
    controller = Controller(env, policy, tmp_path / "loop.log")
    yield controller, state, tmp_path
    controller.stop()
    kill_all(str(state))


def _store(state: Path) -> Store:
    return Store(default_sqlite_url(state))


def _submit(state: Path, markers: Path, cycle: int) -> None:
    command = (f'echo "start $BURST_JOB_ID" >> {markers}; sleep 1.5; '
               f'echo "done $BURST_JOB_ID" >> {markers}')
    with _store(state) as store:
        for _ in range(JOBS_PER_CYCLE):
            store.submit_job("research", "gpu", 4, 0, 1.5, command, datetime.now(UTC))


def _cycle_finished(state: Path) -> bool:
    with _store(state) as store:
        jobs = store.jobs()
        nodes = store.nodes(include_terminated=True)
    return (all(j.state.value == "done" for j in jobs)
            and all(n.state.value == "terminated" for n in nodes))


def test_kill_9_at_random_points_over_full_burst_cycles(rig) -> None:
    controller, state, tmp = rig
    markers = tmp / "markers"
    rng = random.Random(SEED)
    kills = long_outages = 0
    per_cycle = -(-KILLS // CYCLES)
    started = time.monotonic()
    controller.start()
    # The first start creates the store; wait for it before submitting.
    wait_for(lambda: (state / "burst.db").exists(), 60, what="the store created")
    for cycle in range(CYCLES):
        _submit(state, markers, cycle)
        for _ in range(min(per_cycle, KILLS - kills)):
            if not controller.alive():
                controller.start()
            time.sleep(rng.uniform(0.05, 1.2))  # a random point of its life
            controller.kill()
            kills += 1
            if kills % LONG_EVERY == LONG_EVERY // 2:  # a few long outages, spread out
                long_outages += 1
                time.sleep(LONG_OUTAGE_S)
            else:
                time.sleep(rng.uniform(0.0, 0.6))
            controller.start()
        # The last controller of the cycle finishes it: all done, all scaled down.
        def finished() -> bool:
            if not controller.alive():
                controller.start()
            return _cycle_finished(state)

        wait_for(finished, 180, interval=1.0, what=f"cycle {cycle} finished")
    controller.stop()
    wall = time.monotonic() - started

    with _store(state) as store:
        jobs = store.jobs()
        nodes = store.nodes(include_terminated=True)
        events = store.events(limit=1_000_000)
        reconcile = store.lease("reconcile")
    tenures = reconcile.token if reconcile is not None else 0  # controllers that came to lead
    lines = markers.read_text().split("\n") if markers.exists() else []
    runs = Counter(line.split()[1] for line in lines if line.startswith("start "))
    done_seen: set[str] = set()
    again_after_done = []
    for line in filter(None, lines):
        kind, job = line.split()
        if kind == "done":
            done_seen.add(job)
        elif job in done_seen:
            again_after_done.append(job)
    failed = [(e.node_id, e.reason) for e in events if e.to_state.value == "failed"]
    instances = sorted((Path(state) / "local-provider" / "instances").glob("*.json"))
    import json

    owners = [json.loads(p.read_text())["tags"]["burst:node-id"] for p in instances]
    print(f"\nchaos: {kills} kills ({long_outages} outages of {LONG_OUTAGE_S}s > heartbeat "
          f"{HEARTBEAT_S}s), {controller.starts} starts ({controller.exited_by_itself} exited "
          f"by themselves), {CYCLES} cycles, {len(jobs)} jobs, {sum(runs.values())} executions, "
          f"{len(nodes)} nodes, {len(failed)} failed nodes, {len(again_after_done)} re-runs "
          f"after success, {tenures} leader tenures, wall {wall:.0f}s")

    assert kills >= min(KILLS, 200) or KILLS < 200
    assert len(jobs) == CYCLES * JOBS_PER_CYCLE
    assert [j.id for j in jobs if j.state.value != "done"] == [], "lost jobs"
    assert again_after_done == [], f"jobs executed again after a successful finish: {again_after_done}"
    assert set(runs) == {j.id for j in jobs}, "a done job never ran its command"
    assert failed == [], f"healthy nodes were failed: {failed}"
    assert len(owners) == len(set(owners)), f"a node got two instances: {Counter(owners)}"
    assert set(owners) <= {n.id for n in nodes}, "an instance without a node record"
    assert all(n.state.value == "terminated" for n in nodes)
    wait_for(lambda: node_processes(str(state)) == [], 30, what="no node process left")
