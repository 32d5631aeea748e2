"""Power-save passes on a real store and the local provider (no Slurm needed: the names' GPUs
default to the offering's, and marking a node down fails and is logged): a resume binds each
name before its launch, a name still bound to a live node is taken from it first (the old node
failed and terminated), resume-fail fails the node before it goes, suspend frees the name."""

from __future__ import annotations

import socket

import pytest
import yaml

from orchestrator.domain.nodes import NodeState
from orchestrator.domain.plan import ActionReason
from orchestrator.policy import load_policy_text
from orchestrator.powersave import power_down, resume
from orchestrator.store.slots import CLOUD
from orchestrator.wiring import Settings, build_runtime
from tests.e2e.helpers import kill_all


def closed_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


@pytest.fixture
def rt(tmp_path):
    policy = load_policy_text(yaml.safe_dump({
        "version": 1, "name": "ps", "cluster": "it-powersave",
        "pool": {"name": "cloud", "onprem": {"nodes": 1, "gpus_per_node": 4}},
        "queue": {"source": "slurm", "partition": "cloud",
                  "slurm_conf": str(tmp_path / "no-slurm.conf")},
        "offerings": [{"provider": "local", "region": "local", "zone": "local-a",
                       "instance_type": "local.4gpu",
                       "gpus": 4, "price_usd_hour": 4.1}],
        "limits": {"max_nodes": 3, "max_concurrent_launches": 3},
        "fabric": {"slurm": {"join": "power-save", "slots": ["cloud-[1-3]"]}},
    }), "ps.yaml")
    settings = Settings(state_dir=tmp_path / "state", local_boot_delay_s=0.0,
                        controller_url=f"http://127.0.0.1:{closed_port()}")
    runtime = build_runtime(settings, [policy])
    yield runtime
    provider = runtime.providers["local"]
    live = [i.id for i in provider.list_owned("it-powersave") if i.state.value != "terminated"]
    if live:
        provider.terminate(live)
    kill_all(str(tmp_path / "state"))
    runtime.close()


def members(rt) -> dict[str, str | None]:
    return {m.name: m.node_id for m in rt.store.fabric_members() if m.kind == CLOUD}


def reasons(rt, node_id: str) -> list[tuple[str, str]]:
    return [(str(e.to_state), e.reason) for e in sorted(rt.store.events(node_id), key=lambda e: e.at)]


def test_resume_binds_before_launch_and_power_down_frees_the_names(rt):
    policy = rt.policies["ps"]
    done = resume(rt, policy, ["cloud-1", "cloud-2"])
    assert set(done.launched) == {"cloud-1", "cloud-2"} and done.refused == {}
    assert members(rt) == done.launched
    for node_id in done.launched.values():
        node = rt.store.get_node(node_id)
        assert node.state is NodeState.LAUNCHING and node.instance_id
    decision = next(d for d in rt.store.decisions(limit=10) if d.id == done.decision_id)
    assert decision.inputs["slurm_power_save"]["launched_for"] == done.launched

    # Slurm resumes cloud-1 again: its old node is lost to Slurm, so it goes first.
    old = done.launched["cloud-1"]
    again = resume(rt, policy, ["cloud-1"])
    assert again.launched["cloud-1"] != old
    assert ("failed", "slurm-resume-fail") in reasons(rt, old)
    assert rt.store.get_node(old).state is NodeState.TERMINATING

    failed = power_down(rt, policy, ["cloud-1"], ActionReason.SLURM_RESUME_FAIL)
    node = again.launched["cloud-1"]
    assert failed.terminated == {"cloud-1": node}
    assert [r for r in reasons(rt, node) if r[0] in ("failed", "terminating")] == [
        ("failed", "slurm-resume-fail"), ("terminating", "slurm-resume-fail")]

    suspended = power_down(rt, policy, ["cloud-1", "cloud-2"], ActionReason.SLURM_SUSPEND)
    assert suspended.unbound == ["cloud-1"]
    assert suspended.terminated == {"cloud-2": done.launched["cloud-2"]}
    assert ("terminating", "slurm-suspend") in reasons(rt, done.launched["cloud-2"])
    assert members(rt) == {}


def test_a_resume_over_the_limits_refuses_the_name_it_cannot_launch_for(rt):
    policy = rt.policies["ps"]
    first = resume(rt, policy, ["cloud-1", "cloud-2", "cloud-3"])
    assert len(first.launched) == 3
    power_down(rt, policy, ["cloud-2"], ActionReason.SLURM_SUSPEND)
    # cloud-2's node is still terminating (it counts until the provider confirms it gone), so a
    # fourth node would pass max_nodes=3: refused, with the rule's text.
    refused = resume(rt, policy, ["cloud-2"])
    assert refused.launched == {}
    assert refused.refused["cloud-2"].startswith("burst: ") and "max_nodes" in refused.refused[
        "cloud-2"], refused.refused
    assert "cloud-2" not in members(rt)
