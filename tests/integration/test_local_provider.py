"""Integration tests of the local provider: real processes, real signals, a real state directory."""

from __future__ import annotations

import json
import os
import re
import signal
import socket
import stat
import subprocess
import sys
import textwrap
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import psutil
import pytest

from orchestrator.domain.nodes import OwnershipTags
from orchestrator.domain.offerings import Offering
from orchestrator.domain.ports import (
    CapacityError,
    InstanceState,
    InvalidRequest,
    LaunchRequest,
    Provider,
)
from orchestrator.policy.models import Market
from providers import PROVIDERS, load_provider_class
from providers.local import LocalProvider, default_offerings
from tests.processes import READY_S
from tests.processes import wait_for as shared_wait_for

REPO_ROOT = Path(__file__).resolve().parents[2]
ONE_GPU = next(
    o
    for o in default_offerings()
    if o.instance_type == "local.1gpu" and o.market is Market.ON_DEMAND
)


def gone(pid: int) -> bool:
    """Dead, or a zombie nobody has reaped yet (PID 1 in a container may not reap)."""
    try:
        return psutil.Process(pid).status() == psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return True



def wait_for(condition, timeout: float = READY_S, what: str = "condition"):
    """The shared readiness wait (tests/processes.py), polling every 0.02 s."""
    return shared_wait_for(condition, timeout, 0.02, what)


def request(
    cluster: str = "lab", request_id: str | None = None, offering: Offering = ONE_GPU
) -> LaunchRequest:
    request_id = request_id or f"req-{uuid.uuid4().hex[:8]}"
    tags = OwnershipTags(
        cluster=cluster, policy="p", node_id=f"node-{request_id}", request_id=request_id
    )
    return LaunchRequest(
        request_id, offering, tags, user_data=f"#!/bin/bash\n# user-data of {request_id}\n"
    )


def records(state_dir: Path) -> list[dict]:
    return [json.loads(p.read_text()) for p in sorted((state_dir / "instances").glob("lcl-*.json"))]


def processes_with(marker: str) -> list[psutil.Process]:
    found = []
    for proc in psutil.process_iter(["cmdline"]):
        if marker in (proc.info.get("cmdline") or []) and not gone(proc.pid):
            found.append(proc)
    return found


def instances_with(marker: str) -> list[psutil.Process]:
    """Node instances (the leaders of their process groups) whose command line has ``marker``."""
    found = []
    for proc in processes_with(marker):
        try:
            if os.getpgid(proc.pid) == proc.pid:
                found.append(proc)
        except ProcessLookupError:
            continue
    return found


def kill_everything(state_dir: Path, marker: str) -> None:
    """Teardown: no process a test started survives it, whatever the test did."""
    pids = {r["pid"] for r in records(state_dir) if r.get("pid")}
    victims = processes_with(marker)
    for proc in psutil.process_iter():
        try:
            if os.getsid(proc.pid) in pids and not gone(proc.pid):
                victims.append(proc)
        except OSError:
            continue
    for pid in pids:
        try:
            os.killpg(pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass
    for proc in victims:
        try:
            proc.kill()
        except psutil.Error:
            pass
    end = time.monotonic() + 3
    while time.monotonic() < end and not all(gone(p.pid) for p in victims):
        time.sleep(0.02)


@pytest.fixture
def marker() -> str:
    return f"burst-test-{uuid.uuid4().hex}"


@pytest.fixture
def state_dir(tmp_path: Path, marker: str) -> Iterator[Path]:
    state = tmp_path / "local-cloud"
    state.mkdir()
    try:
        yield state
    finally:
        kill_everything(state, marker)


@pytest.fixture
def make_provider(state_dir: Path, marker: str) -> Callable[..., LocalProvider]:
    def make(**kwargs) -> LocalProvider:
        # The marker rides along as an extra argv so the test can count the processes it spawned.
        kwargs.setdefault(
            "agent_command", [sys.executable, "-c", "import time; time.sleep(60)", marker]
        )
        kwargs.setdefault("boot_delay_s", 0.0)
        return LocalProvider(state_dir, **kwargs)

    return make


def test_registry_loads_the_local_provider() -> None:
    assert PROVIDERS["local"] == "providers.local:LocalProvider"
    assert load_provider_class("local") is LocalProvider
    with pytest.raises(ValueError, match="known providers: .*local"):
        load_provider_class("nope")


def test_catalogue(make_provider) -> None:
    provider = make_provider()
    assert isinstance(provider, Provider)
    assert provider.name == "local"
    offerings = provider.offerings()
    assert {o.instance_type for o in offerings} == {f"local.{n}gpu" for n in (1, 2, 4, 8)}
    assert {o.market for o in offerings} == {Market.ON_DEMAND, Market.SPOT}
    for o in offerings:
        assert (o.region, o.zone, o.gpu_model, o.provider) == (
            "local",
            "local-a",
            "simulated",
            "local",
        )
        expected = 4.1 * (1.0 if o.market is Market.ON_DEMAND else 0.35)
        assert o.price_per_gpu_hour == pytest.approx(expected, rel=1e-3)


def test_launch_runs_the_node_in_its_own_process_group(make_provider, state_dir, marker) -> None:
    provider = make_provider()
    req = request()
    [instance] = provider.launch(req)

    assert re.fullmatch(r"lcl-[0-9a-f]{12}", instance.id)
    assert instance.state is InstanceState.RUNNING
    assert instance.provider == "local"
    assert instance.offering_key == ONE_GPU.key
    assert instance.ownership == req.tags
    assert instance.launched_at is not None and instance.launched_at.tzinfo is not None

    [record] = records(state_dir)
    pid = record["pid"]
    assert record["request_id"] == req.request_id and record["id"] == instance.id
    assert record["create_time"] == pytest.approx(psutil.Process(pid).create_time())
    assert os.getpgid(pid) == pid and os.getsid(pid) == pid
    assert os.getpgid(pid) != os.getpgid(0)
    # The instance is a shell (pid) running the agent: every node process is in its group.
    node_pids = [p.pid for p in processes_with(marker)]
    assert pid in node_pids and all(os.getpgid(p) == pid for p in node_pids)

    user_data = state_dir / "instances" / f"{instance.id}.user-data"
    assert user_data.read_text() == req.user_data
    assert stat.S_IMODE(user_data.stat().st_mode) == 0o600
    env = psutil.Process(pid).environ()
    assert env["BURST_BOOT_DELAY_S"] == "0.0"
    assert env["BURST_INSTANCE_ID"] == instance.id


def test_launch_is_idempotent_on_the_request_id(make_provider, state_dir, marker) -> None:
    provider = make_provider()
    req = request()
    [first] = provider.launch(req)
    [again] = provider.launch(req)
    assert again.id == first.id and again.state is InstanceState.RUNNING
    assert len(records(state_dir)) == 1
    # The instance's shell execs the agent: under load that can lag the launch's return.
    wait_for(lambda: len(instances_with(marker)) == 1, timeout=30, what="one instance process")
    assert len(instances_with(marker)) == 1


def test_concurrent_launches_of_one_request_from_two_threads(
    make_provider, state_dir, marker
) -> None:
    req = request()
    # Two provider objects, as two controller workers would have: only the file lock serialises
    # them.
    providers = [make_provider(), make_provider()]
    barrier = threading.Barrier(2)

    def launch(provider: LocalProvider) -> str:
        barrier.wait()
        [instance] = provider.launch(req)
        return instance.id

    # The pool re-raises a thread's exception in .result(), so no failure is lost in a thread.
    with ThreadPoolExecutor(max_workers=2) as pool:
        results = [f.result(timeout=10) for f in [pool.submit(launch, p) for p in providers]]
    assert results[0] == results[1]
    assert len(records(state_dir)) == 1
    # The instance's shell execs the agent: under load that can lag the launch's return.
    wait_for(lambda: len(instances_with(marker)) == 1, timeout=30, what="one instance process")
    assert len(instances_with(marker)) == 1


def test_concurrent_launches_of_one_request_from_two_processes(state_dir, marker) -> None:
    req = request()
    script = textwrap.dedent(
        f"""
        import sys, time
        from pathlib import Path
        from orchestrator.domain.nodes import OwnershipTags
        from orchestrator.domain.ports import LaunchRequest
        from providers.local import LocalProvider, default_offerings
        offering = [o for o in default_offerings() if o.key == {ONE_GPU.key!r}][0]
        tags = OwnershipTags(cluster={req.tags.cluster!r}, policy={req.tags.policy!r},
                             node_id={req.tags.node_id!r}, request_id={req.request_id!r})
        provider = LocalProvider(Path({str(state_dir)!r}), boot_delay_s=0,
            agent_command=[sys.executable, "-c", "import time; time.sleep(60)", {marker!r}])
        start_at = float(sys.argv[1])
        time.sleep(max(start_at - time.time(), 0))
        [instance] = provider.launch(LaunchRequest({req.request_id!r}, offering, tags, "ud"))
        print(instance.id)
        """
    )
    start_at = str(time.time() + 1.0)
    env = {**os.environ, "PYTHONPATH": str(REPO_ROOT)}
    launchers = [
        subprocess.Popen(
            [sys.executable, "-c", script, start_at], stdout=subprocess.PIPE, text=True, env=env
        )
        for _ in range(2)
    ]
    outputs = [p.communicate(timeout=20)[0].strip() for p in launchers]
    assert [p.returncode for p in launchers] == [0, 0]
    assert outputs[0] == outputs[1] and outputs[0].startswith("lcl-")
    assert len(records(state_dir)) == 1
    # The instance's shell execs the agent: under load that can lag the launch's return.
    wait_for(lambda: len(instances_with(marker)) == 1, timeout=30, what="one instance process")
    assert len(instances_with(marker)) == 1


def test_a_launch_that_died_before_its_node_started_is_forgotten(
    make_provider, state_dir, marker
) -> None:
    """The launcher killed between writing the record and spawning the node (a Celery worker
    SIGKILLed mid-launch): nothing was created, so the record goes, and the launch repeated with
    the same request id starts a node instead of handing back a dead instance."""
    provider = make_provider()
    req = request()

    def die_before_spawning(instance_id: str, user_data: Path):
        raise SystemExit("killed")  # what the process saw last: the pending record on disk

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(provider, "_spawn", die_before_spawning)
        with pytest.raises(SystemExit):
            provider.launch(req)
    [pending] = records(state_dir)
    assert pending["state"] == "pending" and pending["pid"] is None

    fresh = make_provider()  # the next worker's view of the same fleet
    assert fresh.list_owned("lab") == []
    assert records(state_dir) == []
    [instance] = fresh.launch(req)
    assert instance.state is InstanceState.RUNNING and instance.id != pending["id"]
    wait_for(lambda: len(instances_with(marker)) == 1, timeout=30, what="one instance process")


def test_list_owned_filters_by_cluster(make_provider) -> None:
    provider = make_provider()
    [a] = provider.launch(request(cluster="lab"))
    [b] = provider.launch(request(cluster="lab"))
    [other] = provider.launch(request(cluster="elsewhere"))
    assert {i.id for i in provider.list_owned("lab")} == {a.id, b.id}
    assert [i.id for i in provider.list_owned("elsewhere")] == [other.id]
    assert provider.list_owned("nobody") == []
    assert {i.id for i in provider.describe([a.id, other.id, "lcl-000000000000"])} == {
        a.id,
        other.id,
    }


def test_a_new_provider_object_sees_the_same_fleet(make_provider, marker) -> None:
    before = make_provider()
    req = request()
    [instance] = before.launch(req)

    after = make_provider()  # the controller restarted
    [seen] = after.describe([instance.id])
    assert seen.state is InstanceState.RUNNING and seen.tags == instance.tags
    assert [i.id for i in after.list_owned("lab")] == [instance.id]
    [relaunch] = after.launch(req)
    assert relaunch.id == instance.id
    # The instance's shell execs the agent: under load that can lag the launch's return.
    wait_for(lambda: len(instances_with(marker)) == 1, timeout=30, what="one instance process")
    assert len(instances_with(marker)) == 1

    # The new object never spawned the process, so it must kill it without owning the child.
    after.terminate([instance.id])
    assert after.describe([instance.id])[0].state is InstanceState.TERMINATED
    assert before.describe([instance.id])[0].state is InstanceState.TERMINATED
    assert processes_with(marker) == []


def test_terminate_kills_the_whole_process_group_and_is_idempotent(
    make_provider, state_dir
) -> None:
    provider = make_provider(agent_command=["bash", "-c", "sleep 60 & sleep 60"])
    [instance] = provider.launch(request())
    [record] = records(state_dir)
    leader = psutil.Process(record["pid"])
    children = wait_for(
        lambda: (
            [c for c in leader.children(recursive=True) if c.name() == "sleep"][:2]
            if len([c for c in leader.children(recursive=True) if c.name() == "sleep"]) >= 2
            else None
        ),
        what="both sleeps",
    )
    pids = [leader.pid, *(c.pid for c in children)]
    assert all(os.getpgid(p) == leader.pid for p in pids)

    started = time.monotonic()
    provider.terminate([instance.id])
    assert time.monotonic() - started < 5.0  # SIGTERM was enough; no grace wait
    assert all(gone(p) for p in pids), [p for p in pids if not gone(p)]
    assert provider.describe([instance.id])[0].state is InstanceState.TERMINATED
    assert [i.state for i in provider.list_owned("lab")] == [InstanceState.TERMINATED]

    provider.terminate([instance.id])  # already gone
    provider.terminate(["lcl-ffffffffffff"])  # never existed
    provider.terminate([])


def test_terminate_kills_a_node_that_ignores_sigterm(make_provider, state_dir) -> None:
    provider = make_provider(agent_command=["bash", "-c", "trap '' TERM; sleep 60 & wait"])
    [instance] = provider.launch(request())
    [record] = records(state_dir)
    leader = psutil.Process(record["pid"])
    wait_for(lambda: leader.children(), what="the node's child")
    pids = [leader.pid, *(c.pid for c in leader.children(recursive=True))]
    started = time.monotonic()
    provider.terminate([instance.id])
    assert 4.5 <= time.monotonic() - started < 9.0
    assert all(gone(p) for p in pids)


def test_terminate_sweeps_work_left_in_the_node_session(make_provider, state_dir) -> None:
    # A job in its own process group (as the agent runs jobs) is outside the node's group but
    # inside its session; terminating the node must not leave it running.
    script = (
        "import subprocess, time; "
        "subprocess.Popen(['sleep', '60'], process_group=0); time.sleep(60)"
    )
    provider = make_provider(agent_command=[sys.executable, "-c", script])
    [instance] = provider.launch(request())
    [record] = records(state_dir)
    leader = psutil.Process(record["pid"])
    # The instance shell runs the agent, which started the job in a process group of its own.
    [job] = wait_for(lambda: [p for p in leader.children(recursive=True) if p.name() == "sleep"
                              and os.getpgid(p.pid) != leader.pid], what="the job")
    assert os.getsid(job.pid) == leader.pid
    provider.terminate([instance.id])
    assert gone(leader.pid) and gone(job.pid)


def test_an_exited_agent_leaves_the_instance_running(make_provider, state_dir) -> None:
    # Like a VM whose agent finished (e.g. after a drain released it): still billed, still there,
    # until terminate() is called. Only then is it gone.
    provider = make_provider(agent_command=[sys.executable, "-c", "pass"])
    [instance] = provider.launch(request())
    time.sleep(1.0)
    assert provider.describe([instance.id])[0].state is InstanceState.RUNNING
    provider.terminate([instance.id])
    assert provider.describe([instance.id])[0].state is InstanceState.TERMINATED


def test_a_node_that_dies_is_terminated_and_reaped(make_provider, state_dir) -> None:
    provider = make_provider(agent_command=[sys.executable, "-c", "pass"])
    [instance] = provider.launch(request())
    [record] = records(state_dir)
    os.killpg(record["pid"], signal.SIGKILL)  # the instance itself dies (host failure)
    wait_for(
        lambda: provider.describe([instance.id])[0].state is InstanceState.TERMINATED,
        what="the instance to show terminated",
    )
    with pytest.raises(psutil.NoSuchProcess):  # reaped, not left a zombie
        psutil.Process(record["pid"])
    [record] = records(state_dir)
    assert record["state"] == "terminated" and record["terminated_at"] is not None

    assert provider.gc(older_than_s=3600) == 0
    assert provider.gc(older_than_s=0) == 1
    assert records(state_dir) == [] and provider.describe([instance.id]) == []


def test_capacity_file_simulates_a_stockout(make_provider, state_dir, tmp_path, marker) -> None:
    capacity = tmp_path / "stockout"
    provider = make_provider(capacity_file=capacity)
    provider.launch(request())  # no file: capacity everywhere
    capacity.write_text(f"# stocked out\n\n{ONE_GPU.key}\n")
    req = request()
    with pytest.raises(CapacityError) as caught:
        provider.launch(req)
    assert caught.value.offering_key == ONE_GPU.key
    assert caught.value.request_id == req.request_id
    assert caught.value.provider == "local"
    two_gpu = next(o for o in default_offerings() if o.instance_type == "local.2gpu")
    provider.launch(request(offering=two_gpu))  # other offerings unaffected
    assert len(records(state_dir)) == 2
    wait_for(lambda: len(instances_with(marker)) == 2, timeout=30, what="two instance processes")

    capacity.write_text("")
    [instance] = provider.launch(req)  # the stockout is over
    assert instance.state is InstanceState.RUNNING


def test_invalid_offering_is_rejected(make_provider, state_dir, marker) -> None:
    provider = make_provider()
    foreign = Offering("aws", "us-east-1", "us-east-1a", "p4d.24xlarge", Market.SPOT, 8, 12.0)
    unknown = Offering("local", "local", "local-a", "local.16gpu", Market.SPOT, 16, 20.0)
    for offering in (foreign, unknown):
        req = request(offering=offering)
        with pytest.raises(InvalidRequest) as caught:
            provider.launch(req)
        assert caught.value.offering_key == offering.key
        assert caught.value.request_id == req.request_id
    assert records(state_dir) == [] and processes_with(marker) == []


def test_default_agent_command_starts_the_node_agent(state_dir) -> None:
    # An agent pointed at a closed port keeps retrying its registration until terminated.
    from orchestrator.fabric.bootstrap import Bootstrap

    with socket.socket() as probe:  # a port nothing listens on once the probe is closed
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    boot = Bootstrap("node-x", f"http://127.0.0.1:{port}", "jt-x", "lab", "p", 1, "simulated")
    provider = LocalProvider(state_dir, boot_delay_s=0.0)
    req = request()
    req = LaunchRequest(req.request_id, req.offering, req.tags, boot.render())
    [instance] = provider.launch(req)
    log = state_dir / "instances" / f"{instance.id}.log"
    wait_for(lambda: "unreachable" in log.read_text(), timeout=10, what="the agent's first attempt")
    assert "node-x" in log.read_text() and "jt-x" not in log.read_text()
    [record] = records(state_dir)
    started = time.monotonic()
    provider.terminate([instance.id])
    assert time.monotonic() - started < 3.0  # the agent exits on SIGTERM by itself
    assert gone(record["pid"])
