"""`burst demo --fabric torch` as a user runs it: real torch.distributed processes on the CPU.

The controller hosts the rendezvous store; an "on-prem" torchrun trains alone; a pre-warm makes
the real control loop launch a local-provider node whose agent joins the job (world 1 -> 2);
clearing the pre-warm drains it through the checkpoint hook (2 -> 1); the job finishes. The
checkpointed history must be one contiguous run of steps (no step lost or redone), the drain's
checkpoint must be the last step of the larger world, the loss must go down, and nothing may be
left running.
"""

from __future__ import annotations

import json

import pytest

from tests.e2e.helpers import run_burst

pytest.importorskip("torch")
pytestmark = pytest.mark.slow


def test_burst_demo_fabric_torch_grows_and_shrinks_the_job_without_losing_a_step():
    result = run_burst("demo", "--fabric", "torch", "--json", "--timeout", "200", timeout=260)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    summary = json.loads(result.stdout)
    assert summary["world_sizes"] == [1, 2, 1], summary["events"]
    assert summary["contiguous"] and summary["steps"] > 20
    assert summary["checkpoint_step"] == summary["last_step_in_larger_world"]
    assert summary["restarts"] >= 1
    assert summary["loss_last"] < 0.1 * summary["loss_first"]
    assert summary["drain_reason"] == "idle" and summary["release_reason"] == "drained"
    assert summary["nodes_launched"] == summary["nodes_terminated"] == 1
    assert summary["leftover_processes"] == 0
    print(f"\ntorch demo: join {summary['join_s']}s, drain {summary['drain_s']}s, "
          f"wall {summary['wall_s']}s")
