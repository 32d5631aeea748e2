"""A torch elastic job across two burst nodes: real all-reduce over gloo, one node drained.

The real control loop with the local provider: a pre-warm of 2 GPUs launches two 1-GPU nodes,
each a local process running the real agent, whose torchrun joins the elastic job the controller
hosts the rendezvous store of (``orchestrator/fabric/elastic_train.py``: gradients averaged with
``all_reduce``). Both train together (world 2); lowering the floor to 1 GPU drains one node
through the checkpoint hook: the job checkpoints, the node leaves, and the job rejoins at world
size 1 on the other node from that checkpoint; clearing the floor drains the last one. The
checkpointed history must be one contiguous run of steps (none lost or redone), world 2 then 1,
each drain's checkpoint uploaded to ``storage.checkpoints`` (``BURST_CHECKPOINT_URI``, a
``file://`` location here) before the drain heard of it, and nothing may be left running.
"""

from __future__ import annotations

import json
import shutil
import socket
import threading
import time
from datetime import timedelta

import pytest

from orchestrator.api import create_app
from orchestrator.api.server import ApiServer
from orchestrator.demo import _cleanup, _leftovers, _processes_under, torch_demo_policy
from orchestrator.domain.nodes import NodeState
from orchestrator.loop import ControlLoop
from orchestrator.policy.storage import Storage
from orchestrator.wiring import Settings, build_runtime

pytest.importorskip("torch")
pytestmark = [pytest.mark.slow, pytest.mark.long]

TIMEOUT_S = 240.0


def _wait(condition, what: str, timeout: float = TIMEOUT_S) -> None:
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        if condition():
            return
        time.sleep(0.2)
    raise AssertionError(f"timed out waiting for {what}")


def test_an_elastic_job_trains_across_two_burst_nodes_and_survives_one_drain(tmp_path):
    state_dir = tmp_path / "state"
    checkpoints = state_dir / "checkpoints"
    checkpoints.mkdir(parents=True)
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        endpoint = f"127.0.0.1:{sock.getsockname()[1]}"
    demo = torch_demo_policy(endpoint, checkpoints)
    uploads = tmp_path / "uploaded"  # storage.checkpoints: BURST_CHECKPOINT_URI of the job
    policy = demo.model_copy(update={
        "limits": demo.limits.model_copy(update={"max_nodes": 2, "max_concurrent_launches": 2}),
        "pool": demo.pool.model_copy(update={"storage": Storage(checkpoints=f"file://{uploads}")})})
    settings = Settings(state_dir=state_dir, database_url=None, tick_s=1.0, api_port=0,
                        local_boot_delay_s=0.0, controller_url=None)
    runtime = build_runtime(settings, [policy])
    server = ApiServer(create_app(runtime), "127.0.0.1", 0)
    fabric = runtime.fabric.by_policy[policy.name]
    pool = policy.pool.name
    stop = threading.Event()
    loop_thread = None
    instances = state_dir / "local-provider" / "instances"

    def statuses() -> list[dict]:
        out = []
        for path in instances.glob("*.work/elastic/status.json"):
            try:
                out.append(json.loads(path.read_text()))
            except (OSError, ValueError):
                continue
        return out

    def world(size: int, past: int = 0) -> bool:
        return any(s.get("world_size") == size and s.get("step", 0) > past for s in statuses())

    def alive() -> list:
        return [n for n in runtime.store.nodes(include_terminated=True)
                if n.state is not NodeState.TERMINATED]

    try:
        runtime.executor.config.controller_url = f"http://127.0.0.1:{server.start()}"
        fabric.ensure_store(policy)
        loop = ControlLoop(runtime, settings.tick_s)
        loop_thread = threading.Thread(target=loop.run, args=(stop,), daemon=True)
        loop_thread.start()
        now = runtime.clock.now()
        runtime.store.set_prewarm(pool, 2, now + timedelta(hours=1), now)
        _wait(lambda: world(2, past=5), "both burst nodes training together (world 2)")
        at_two = max(s["step"] for s in statuses() if s.get("world_size") == 2)
        now = runtime.clock.now()
        runtime.store.set_prewarm(pool, 1, now + timedelta(hours=1), now)
        _wait(lambda: len(alive()) == 1 and world(1, past=at_two + 5),
              "one node drained and the job going on at world 1")
        runtime.store.clear_prewarm(pool, runtime.clock.now())
        _wait(lambda: not alive(), "the last node to drain")
    finally:
        stop.set()
        if loop_thread is not None:
            loop_thread.join(timeout=30)
        _cleanup(runtime)
        server.stop()
        fabric.close()
    history = json.loads((checkpoints / "history.json").read_text())
    steps = [h["step"] for h in history]
    assert steps == list(range(1, len(steps) + 1))  # no step lost or redone
    sizes = [h["world"] for h in history]
    runs = [w for i, w in enumerate(sizes) if i == 0 or sizes[i - 1] != w]
    assert runs[:2] == [1, 2] or runs[:1] == [2], runs  # the second node may join at once
    assert 2 in runs and runs[runs.index(2) + 1:][:1] == [1], runs  # world 2, then 1
    assert max(h["restart"] for h in history) >= 1
    # Each drain's checkpoint was uploaded before it was confirmed: the last upload is the
    # checkpoint the last drain confirmed.
    confirmed = [json.loads(p.read_text())["step"]
                 for p in instances.glob("*.work/elastic/checkpoint.done")]
    import torch

    uploaded = torch.load(uploads / "checkpoint.pt", weights_only=False)["step"]
    assert confirmed and uploaded == max(confirmed)
    drains = [e for n in runtime.store.nodes(include_terminated=True)
              for e in runtime.store.events(n.id) if e.to_state is NodeState.DRAINING]
    assert len(drains) == 2
    assert _leftovers(runtime) == 0 and _processes_under(state_dir) == 0
    runtime.close()
    shutil.rmtree(state_dir, ignore_errors=True)
