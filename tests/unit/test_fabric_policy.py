"""The fabric section of a policy: defaults, cross-field rules, and the file:line of each error."""

from __future__ import annotations

import pytest
import yaml

from orchestrator.policy import PolicyError, load_policy_text
from orchestrator.policy.fabric import FabricKind, SlurmJoinMode


def policy(queue: dict | None = None, fabric: dict | None = None, **extra) -> dict:
    doc = {
        "version": 1, "name": "p",
        "pool": {"name": "gpu", "onprem": {"nodes": 2, "gpus_per_node": 4}},
        "offerings": [{"provider": "local", "region": "local", "instance_type": "local.4gpu"}],
        **extra,
    }
    if queue is not None:
        doc["queue"] = queue
    if fabric is not None:
        doc["fabric"] = fabric
    return doc


def load(doc: dict):
    return load_policy_text(yaml.safe_dump(doc, sort_keys=False), "fabric.yaml")


def problems(doc: dict) -> str:
    with pytest.raises(PolicyError) as caught:
        load(doc)
    return str(caught.value)


def test_the_fabric_follows_the_queue_source_by_default():
    assert load(policy()).fabric_kind is FabricKind.BUILTIN
    slurm = load(policy(queue={"source": "slurm", "partition": "gpu"}))
    assert slurm.fabric_kind is FabricKind.SLURM
    assert slurm.fabric.slurm.join is SlurmJoinMode.DYNAMIC  # the production default
    assert slurm.fabric.slurm.checkpoint_signal == "USR1" and slurm.fabric.slurm.signal_batch_only


def test_slot_ranges_expand_and_must_cover_max_nodes():
    doc = policy(queue={"source": "slurm"}, limits={"max_nodes": 4},
                 fabric={"slurm": {"join": "slot", "slots": ["burst-[1-3]", "extra"]}})
    assert load(doc).fabric.slurm.slot_names() == ["burst-1", "burst-2", "burst-3", "extra"]
    doc["limits"]["max_nodes"] = 5
    assert "limits.max_nodes: 5 is more than the 4 Slurm slot(s)" in problems(doc)


@pytest.mark.parametrize(("doc", "message"), [
    (policy(fabric={"kind": "slurm"}), "fabric.kind: slurm needs queue.source: slurm"),
    (policy(queue={"source": "slurm"}, fabric={"kind": "builtin"}), "cannot run Slurm jobs"),
    (policy(fabric={"kind": "torch-elastic"}), "fabric.torch: kind: torch-elastic needs the torch"),
    (policy(queue={"source": "slurm"}, fabric={"slurm": {"join": "slot"}}),
     "fabric.slurm.slots: join: slot needs the slot names"),
    (policy(queue={"source": "slurm"}, fabric={"slurm": {"slots": ["bad name"]}}),
     "fabric.slurm.slots[0]"),
    (policy(queue={"source": "slurm"}, fabric={"slurm": {"checkpoint_signal": "usr1"}}),
     "fabric.slurm.checkpoint_signal"),
    (policy(queue={"slurm_conf": "/etc/slurm/slurm.conf"}), "queue.slurm_conf: only applies to source: slurm"),
    (policy(fabric={"spot_notice": {"kind": "azure"}}), "fabric.spot_notice.kind"),
    (policy(fabric={"kind": "torch-elastic", "torch": {
        "rdzv_endpoint": "ctl:29400", "run_id": "j", "min_nodes": 3, "max_nodes": 2,
        "entrypoint": ["train.py"]}}), "fabric.torch.min_nodes: 3 is more than max_nodes (2)"),
])
def test_bad_fabric_settings_name_the_field(doc, message):
    assert message in problems(doc)


def test_torch_elastic_and_spot_notices_load():
    loaded = load(policy(fabric={
        "kind": "torch-elastic",
        "torch": {"rdzv_endpoint": "controller:29400", "run_id": "llm-7b", "max_nodes": 8,
                  "entrypoint": ["train.py", "--config", "c.yaml"], "checkpoint_hook": "http"},
        "spot_notice": {"kind": "gcp"},
    }))
    assert loaded.fabric_kind is FabricKind.TORCH_ELASTIC
    assert loaded.fabric.torch.checkpoint_hook == "http"
    assert loaded.fabric.spot_notice.endpoint.endswith("/computeMetadata/v1/instance/preempted")
