"""The Slurm queue source's parsing, on JSON recorded from a real Slurm 22.05 mini-cluster.

The recording (``tests/unit/data/slurm-*-22.05.json``) holds: on-prem nodes ``onprem-1`` (2 of 4
GPUs used) and ``onprem-2`` (idle, PLANNED by backfill), a joined burst slot ``burst-1`` (full) and a
drained dynamic node ``dyn-1``; running jobs on ``burst-1`` and ``onprem-1``; finished jobs (squeue
keeps them for MinJobAge and ignores ``-t``); and pending jobs of every kind: ``Resources``,
``Priority``, a 2-node job, an array of 4 tasks, per-task and per-job GPUs, a CPU-only job, a
held job and one with a never-satisfied dependency.
"""

from __future__ import annotations

import json
from datetime import UTC, datetime
from pathlib import Path

import pytest
import yaml

from orchestrator.policy import load_policy_text
from orchestrator.domain.snapshot import OnPremRelease
from orchestrator.sources.slurm import (
    array_tasks_left,
    onprem_releases,
    job_gpus,
    parse_nodes,
    pending_jobs,
    pool_queue,
)
from orchestrator.sources.slurm_cli import expand_hostlist, gres_count

DATA = Path(__file__).parent / "data"
JOBS = json.loads((DATA / "slurm-squeue-22.05.json").read_text())["jobs"]
NODES = parse_nodes(json.loads((DATA / "slurm-sinfo-22.05.json").read_text())["nodes"])


def slurm_policy(partition: str | None = "gpu", **fabric) -> object:
    doc = {
        "version": 1, "name": "slurm-pool",
        "pool": {"name": "gpu", "onprem": {"nodes": 2, "gpus_per_node": 4}},
        "queue": {"source": "slurm", **({"partition": partition} if partition else {})},
        "offerings": [{"provider": "local", "region": "local", "instance_type": "local.4gpu"}],
        "fabric": {"slurm": fabric} if fabric else {},
    }
    return load_policy_text(yaml.safe_dump(doc), "slurm.yaml")


def by_id(job_id: int) -> dict:
    return next(j for j in JOBS if j["job_id"] == job_id)


def test_pending_jobs_count_only_demand_that_more_nodes_would_serve():
    jobs = pending_jobs(JOBS, "gpu", "gpu")
    ids = sorted(j.id for j in jobs)
    # 17 is CPU-only, 18 is held, 19 waits on a dependency; finished/running jobs never count.
    assert ids == ["14", "15", "16_0", "16_1", "16_2", "16_3", "20", "21"]
    got = {j.id: j for j in jobs}
    assert got["14"].gpus == 4 and got["14"].project == "research"
    assert got["14"].duration_s == 60 * 60
    assert got["15"].gpus == 8 and got["15"].project == "physics"  # 2 nodes x gpu:4
    # Neither account nor QOS: no project (never the user's name), and the user is Slurm's.
    assert got["16_2"].gpus == 1 and got["16_2"].project is None
    assert got["16_2"].user == "root" and got["14"].user == "root"
    assert got["20"].gpus == 2  # --gpus-per-task=1 -n 2
    assert got["21"].gpus == 3 and got["21"].duration_s == 24 * 3600  # --gpus=3, -t 1-00:00:00
    assert got["15"].duration_s is None  # no time limit
    assert got["14"].submitted_at == datetime.fromtimestamp(by_id(14)["submit_time"], UTC)
    assert got["14"].priority == by_id(14)["priority"]
    assert all(j.pool == "gpu" for j in jobs)


def test_a_partition_filter_is_applied_here_because_squeue_json_ignores_it():
    assert pending_jobs(JOBS, "gpu", "cloud") == []
    assert len(pending_jobs(JOBS, "gpu", None)) == 8


def test_pool_queue_reads_onprem_capacity_and_where_jobs_run():
    queue = pool_queue(slurm_policy(), JOBS, NODES, burst_feature="burst")
    # onprem-1 has 2 of 4 GPUs free; onprem-2 is idle (PLANNED for a pending job) with 4.
    assert queue.onprem.total_gpus == 8
    assert queue.onprem.free_gpus == 6
    assert sorted(queue.onprem.free_per_node) == [2, 4]
    assert queue.running_burst_jobs == 2  # jobs 11 and 12 on burst-1
    assert queue.running_onprem_jobs == 1  # job 13 on onprem-1
    assert len(queue.pending) == 8
    # Job 13 holds 2 GPUs of onprem-1 until its start + 10-minute limit (what wait_slo reads).
    job = by_id(13)
    # The release names its node by its index in free_per_node (the per-node wait model).
    node = [n.name for n in NODES if "burst" not in n.features and n.usable].index("onprem-1")
    assert queue.onprem_releases == (
        OnPremRelease(2, datetime.fromtimestamp(job["start_time"] + 600, UTC), node),)


def test_a_running_job_without_a_time_limit_or_on_an_unusable_node_releases_nothing():
    running = dict(by_id(13))
    [release] = onprem_releases(running, ["onprem-1"], {"onprem-1": 3})
    assert (release.gpus, release.node) == (2, 3)
    assert onprem_releases(running, ["onprem-1"], {"onprem-2": 0}) == []  # drained: not capacity
    assert onprem_releases({**running, "time_limit": 0}, ["onprem-1"], {"onprem-1": 0}) == []
    no_end = {**running, "end_time": 0}  # the limit from the start time instead
    [release] = onprem_releases(no_end, ["onprem-1"], {"onprem-1": 0})
    assert release.ends_at == datetime.fromtimestamp(running["start_time"] + 600, UTC)


def test_nodes_carry_state_flags_gpus_and_features():
    nodes = {n.name: n for n in NODES}
    assert nodes["dyn-1"].flags >= {"DRAIN", "DYNAMIC_NORM"} and not nodes["dyn-1"].usable
    assert nodes["dyn-1"].gpus_free == 0  # drained: takes no work
    assert nodes["burst-1"].usable and nodes["burst-1"].gpus_free == 0
    assert nodes["onprem-2"].usable and nodes["onprem-2"].gpus == 4
    assert "burst" in nodes["burst-1"].features and "burst" not in nodes["onprem-1"].features
    assert nodes["onprem-1"].last_busy is not None


def test_a_burst_node_never_counts_as_onprem_capacity_and_the_feature_is_configurable():
    queue = pool_queue(slurm_policy(feature="onprem"), JOBS, NODES, burst_feature="onprem")
    # Now the on-prem nodes are "burst" and burst-1 is on-prem (full): no free GPUs at all.
    assert queue.onprem.total_gpus == 4 and queue.onprem.free_gpus == 0


@pytest.mark.parametrize(("text", "count"), [
    ("gpu:4", 4), ("gres:gpu:2", 2), ("gpu:2(IDX:0-1)", 2), ("gpu:a100:2(S:0),gpu:v100:1", 3),
    ("gres/gpu=3", 3), ("gres:gpu:a100:8", 8), ("gpu", 1), ("N/A", 0), ("", 0), (None, 0),
    ("gres:shard:4", 0), ("gpu:0", 0),
])
def test_gres_counts(text, count):
    assert gres_count(text) == count


@pytest.mark.parametrize(("expr", "names"), [
    ("burst-1", ["burst-1"]),
    ("onprem-[1-2],burst-3", ["onprem-1", "onprem-2", "burst-3"]),
    ("n[01-03,7]", ["n01", "n02", "n03", "n7"]),
    ("", []),
])
def test_hostlists_expand(expr, names):
    assert expand_hostlist(expr) == names


@pytest.mark.parametrize(("spec", "tasks"), [
    ("0-3%2", 4), ("1,3,5", 3), ("0-9:2", 5), ("", 1), ("7", 1),
])
def test_array_tasks_left(spec, tasks):
    assert array_tasks_left({"array_task_string": spec}) == tasks


def test_job_gpus_of_each_request_form():
    assert job_gpus(by_id(15)) == 8
    assert job_gpus(by_id(21)) == 3
    assert job_gpus(by_id(20)) == 2
    assert job_gpus(by_id(17)) == 0


def test_a_job_annotates_its_dataset_size_in_its_comment():
    from orchestrator.sources.slurm import job_dataset_gb, pending_jobs

    assert job_dataset_gb({"comment": "burst.dataset_gb=500"}) == 500.0
    assert job_dataset_gb({"comment": "burst.checkpoint_every=30m burst.dataset_gb=2.5"}) == 2.5
    assert job_dataset_gb({"comment": "nothing here"}) is None
    assert job_dataset_gb({"job_id": 7, "comment": "burst.dataset_gb=-3"}) is None
    assert job_dataset_gb({"job_id": 7, "comment": "burst.dataset_gb=lots"}) is None
    assert job_dataset_gb({"job_id": 7, "comment": "burst.dataset_gb=nan"}) is None
    jobs = [dict(j, comment="burst.dataset_gb=40") for j in JOBS]
    assert {j.dataset_gb for j in pending_jobs(jobs, "gpu", "gpu")} == {40.0}


def test_a_job_annotates_its_checkpoint_interval_in_its_comment():
    from orchestrator.sources.slurm import job_checkpoint_s

    assert job_checkpoint_s({"comment": "burst.checkpoint_every=30m"}) == 1800
    assert job_checkpoint_s({"comment": "team x; burst.checkpoint_every=1h30m"}) == 5400
    assert job_checkpoint_s({"comment": "nothing here"}) is None
    assert job_checkpoint_s({}) is None
    assert job_checkpoint_s({"job_id": 7, "comment": "burst.checkpoint_every=0s"}) is None
    assert job_checkpoint_s({"job_id": 7, "comment": "burst.checkpoint_every=soon"}) is None
    jobs = [dict(j, comment="burst.checkpoint_every=10m") for j in JOBS]
    pending = pending_jobs(jobs, "gpu", None)
    assert pending and all(j.checkpoint_s == 600 for j in pending)
    assert all(j.checkpoint_s is None for j in pending_jobs(JOBS, "gpu", None))
