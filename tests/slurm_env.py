"""Fixtures for tests against a real Slurm mini-cluster (``infra/slurm/minicluster.py``).

``slurm_cluster`` (session): munged, slurmctld and two on-prem slurmds (4 fake GPUs each) with
FUTURE slots ``burst-[1-4]``, in a fresh directory (``BURST_SLURM_BASE`` to choose it). It is
skipped, with the reason, only when the Slurm/munge programs are not installed (``.ci/run``
installs them) or when not running as root; any other start-up failure fails the tests.
``slurm`` (function): the same cluster, cleaned after each test: every job cancelled, every
burst slot back to FUTURE, every dynamic node deleted and every burst slurmd stopped, so a test
cannot leak into the next. Import both into a test module::

    from tests.slurm_env import slurm, slurm_cluster  # noqa: F401 (fixtures)
"""

from __future__ import annotations

import importlib.util
import os
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml

from orchestrator.policy import load_policy_text
from orchestrator.store import Store

ROOT = Path(__file__).resolve().parents[1]
_SPEC = importlib.util.spec_from_file_location("burst_minicluster",
                                               ROOT / "infra" / "slurm" / "minicluster.py")
minicluster = importlib.util.module_from_spec(_SPEC)  # type: ignore[arg-type]
sys.modules["burst_minicluster"] = minicluster
_SPEC.loader.exec_module(minicluster)  # type: ignore[union-attr]
MiniCluster = minicluster.MiniCluster


# A training job in miniature: one step per 0.1 s, logged; on the checkpoint signal it saves its
# step between two steps, confirms through its Slurm comment and waits to be requeued; on every
# start it resumes from the checkpoint.
CHECKPOINT_JOB = """#!/bin/bash
dir={dir}
step=$(cat $dir/ckpt 2>/dev/null || echo 0)
echo "start $step restart=${{SLURM_RESTART_COUNT:-0}} node=$SLURMD_NODENAME nodes=$SLURM_JOB_NUM_NODES:$SLURM_JOB_NODELIST" >> $dir/log
want=0
trap 'want=1' USR1
while [ $step -lt {steps} ]; do
  if [ $want = 1 ]; then
    echo $step > $dir/ckpt.tmp && mv $dir/ckpt.tmp $dir/ckpt
    echo "checkpoint $step" >> $dir/log
    scontrol update jobid=$SLURM_JOB_ID comment=burst:checkpointed
    while :; do sleep 1; done
  fi
  sleep 0.1 & wait $!
  step=$((step+1))
  echo "step $step" >> $dir/log
done
echo "done $step" >> $dir/log
"""


def skip_reason() -> str | None:
    missing = minicluster.missing_binaries()
    if missing:
        return (f"Slurm is not installed (missing {', '.join(missing)}); .ci/run installs "
                "munge slurmctld slurmd slurm-client")
    if os.geteuid() != 0:
        return "the Slurm mini-cluster runs its daemons as root"
    return None


# One cluster per test session. The fixture is imported by several test modules, and pytest makes
# each import its own session fixture: the first starts the cluster, the others share it, and the
# last one to finish stops it.
_shared: dict[str, object] = {"cluster": None, "users": 0}


@pytest.fixture(scope="session")
def slurm_cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[MiniCluster]:
    reason = skip_reason()
    if reason:
        pytest.skip(reason)
    if _shared["cluster"] is None:
        base = Path(os.environ.get("BURST_SLURM_BASE") or tmp_path_factory.mktemp("slurm"))
        cluster = MiniCluster(base)
        try:
            cluster.start()
        except minicluster.ClusterError as exc:
            pytest.fail(f"the Slurm mini-cluster did not start: {exc}", pytrace=False)
        _shared["cluster"] = cluster
    _shared["users"] = int(_shared["users"]) + 1  # type: ignore[call-overload]
    try:
        yield _shared["cluster"]  # type: ignore[misc]
    finally:
        _shared["users"] = int(_shared["users"]) - 1  # type: ignore[call-overload]
        if _shared["users"] == 0:
            _shared["cluster"].stop()  # type: ignore[union-attr]
            _shared["cluster"] = None


@pytest.fixture
def live_store(tmp_path: Path) -> Iterator[Store]:
    """The live-Slurm tests need one store, not both backends (the slot logic is tested on both)."""
    s = Store(f"sqlite:///{tmp_path / 'burst.db'}")
    s.upgrade()
    try:
        yield s
    finally:
        s.close()


@pytest.fixture
def slurm(slurm_cluster: MiniCluster) -> Iterator[MiniCluster]:
    try:
        yield slurm_cluster
    finally:
        reset(slurm_cluster)


def reset(cluster: MiniCluster) -> None:
    """Cancel every job, stop burst slurmds, put slots back to FUTURE, delete dynamic nodes."""
    live = [str(j["job_id"]) for j in cluster._live_jobs()]
    if live:
        cluster.run("scancel", *live, check=False)
    end = time.monotonic() + 20
    while cluster._live_jobs() and time.monotonic() < end:
        time.sleep(0.2)
    onprem = set(cluster.onprem_names)
    for name, pid in cluster.slurmd_pids().items():
        if name not in onprem:
            minicluster._stop(pid)
    clouds = set(cluster.cloud_names)
    for name in cluster.nodes():
        if name in onprem or name in clouds:
            continue
        if name in cluster.slot_names:
            cluster.run("scontrol", "update", f"nodename={name}", "state=future", check=False)
        else:
            cluster.run("scontrol", "delete", f"nodename={name}", check=False)
    for name in cluster.cloud_names:  # power save: back to powered down and usable
        if cluster.node_state(name) != "idle" or "POWERED_DOWN" not in cluster.run(
                "scontrol", "-o", "show", "node", name, check=False):
            cluster.run("scontrol", "update", f"nodename={name}", "state=power_down_force",
                        check=False)
            cluster.run("scontrol", "update", f"nodename={name}", "state=resume", check=False)
    for name in onprem:  # a test may have drained an on-prem node
        cluster.run("scontrol", "update", f"nodename={name}", "state=resume", check=False)


def slurm_policy(conf: Path, trigger: dict | None = None, **slurm_fabric) -> object:
    """A policy bursting the mini-cluster's ``gpu`` partition through the Slurm fabric;
    ``slurm_fabric``: the ``fabric.slurm`` settings to change; ``trigger``: its trigger."""
    doc = {
        "version": 1, "name": "train", "cluster": "it-slurm",
        "pool": {"name": "gpu", "onprem": {"nodes": 2, "gpus_per_node": 4}},
        "queue": {"source": "slurm", "partition": "gpu", "slurm_conf": str(conf)},
        "offerings": [{"provider": "local", "region": "local", "instance_type": "local.4gpu",
                       "gpus": 4, "price_usd_hour": 4.1}],
        "limits": {"max_nodes": 4},
        "fabric": {"slurm": {"checkpoint_wait": "20s", **slurm_fabric}},
    }
    if trigger is not None:
        doc["trigger"] = trigger
    return load_policy_text(yaml.safe_dump(doc), "slurm.yaml")
