"""The Slurm queue source: pending GPU jobs and on-prem capacity from ``squeue``/``sinfo --json``.

Each policy with ``queue.source: slurm`` watches one partition (``queue.partition``; every
partition when unset) of the cluster its ``queue.slurm_conf`` names. Per pool it reports:

* pending jobs that ask for GPUs and wait for capacity, as :class:`~orchestrator.domain.jobs.Job`:
  GPUs from ``tres_per_node`` x nodes (or ``tres_per_job``, or ``tres_per_task`` x tasks), the
  account (else the QOS; with neither, no project: ``None``, never the user's name) as project,
  Slurm's ``user_name`` as user, Slurm's priority, submit time and time limit.
  Only reasons that more nodes would cure count (:data:`UNMET_REASONS`: ``Resources``, ``Priority``
  for the jobs queued behind the first blocked one, ``ReqNodeNotAvail``, and ``None`` for jobs the
  scheduler has not looked at yet); held jobs, dependencies and limits do not. A pending array
  counts once per task left;
* on-prem capacity: nodes of the partition without the fabric's burst feature that can take work
  now, with their GPUs (``gres``) and free GPUs (``gres`` minus ``gres_used``);
* running jobs on on-prem and on burst nodes.

Slurm 22.05 ignores ``squeue --json`` filters, so every filter is applied here. Burst nodes'
usage (for the idle rule of scale-down) comes from the jobs on the Slurm node name each burst node
holds (see :mod:`orchestrator.store.slots`) and the node's ``last_busy`` time.

Each observation also records the runs of Slurm jobs on burst nodes in the store's run history
(``job_runs``, which the cost ledger reads, see :mod:`orchestrator.store.jobruns`): a job running
(or seen finished) on a burst node's Slurm name is a run keyed by (cluster, job id, burst node,
start time), so a requeued job that starts again gets a new run; runs of the cluster no longer seen
running are closed. A job's GPUs on a node are its ``tres_per_node`` GPUs (else its allocated
``gres_detail`` on that node, else its GPUs spread over its nodes); its project and user are
found as for pending jobs.
"""

from __future__ import annotations

import hashlib
import logging
import re
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any

from orchestrator.domain.jobs import Job, JobState
from orchestrator.domain.snapshot import OnPremRelease, OnPremState, PoolQueue
from orchestrator.policy.models import Policy, QueueSourceKind
from orchestrator.policy.units import parse_duration
from orchestrator.sources.builtin import NodeUsage
from orchestrator.sources.slurm_cli import (
    FINISHED_JOB_STATES,
    LIVE_JOB_STATES,
    UNUSABLE_NODE_FLAGS,
    USABLE_NODE_STATES,
    SlurmCli,
    SlurmError,
    expand_hostlist,
    gres_count,
)
from orchestrator.sources.slurm_usage import AccountedJob, parse_sacct_usage
from orchestrator.store import StaleLeaderError, Store
from orchestrator.store.jobruns import JobRun, RunSource, slurm_run_key

log = logging.getLogger(__name__)

UNMET_REASONS = frozenset({
    "Resources", "Priority", "ReqNodeNotAvail", "None",
    "Nodes_required_for_job_are_DOWN,_DRAINED_or_reserved_for_jobs_in_higher_priority_partitions",
})
INFINITE_MINUTES = 0xFFFFFFFF - 1  # 22.05 prints INFINITE time limits as 4294967294 (or omits them)
MAX_ARRAY_TASKS = 10_000
ACCOUNTING_EVERY = timedelta(minutes=10)  # sacct is read at most this often per cluster
ACCOUNTING_LOOKBACK = timedelta(hours=6)  # the first read after a start looks back this far


@dataclass(frozen=True, slots=True)
class SlurmNode:
    """One node as sinfo shows it, reduced to what burst needs."""

    name: str
    state: str
    flags: frozenset[str]
    gpus: int
    gpus_used: int
    features: frozenset[str]
    partitions: frozenset[str]
    last_busy: datetime | None

    @property
    def usable(self) -> bool:
        return self.state in USABLE_NODE_STATES and not (self.flags & UNUSABLE_NODE_FLAGS)

    @property
    def gpus_free(self) -> int:
        return max(self.gpus - self.gpus_used, 0) if self.usable else 0


def parse_nodes(nodes: Iterable[dict[str, Any]]) -> list[SlurmNode]:
    parsed = []
    for node in nodes:
        last_busy = node.get("last_busy")
        parsed.append(SlurmNode(
            name=str(node.get("name") or node.get("hostname")),
            state=str(node.get("state") or "unknown").lower(),
            flags=frozenset(str(f).upper() for f in node.get("state_flags") or ()),
            gpus=gres_count(node.get("gres")),
            gpus_used=gres_count(node.get("gres_used")),
            features=frozenset(_split(node.get("active_features") or node.get("features"))),
            partitions=frozenset(node.get("partitions") or ()),
            last_busy=_epoch(last_busy),
        ))
    return parsed


def slurm_scope(policy: Policy) -> str:
    """Names are unique per Slurm cluster: pools of one cluster share its slots (and the runs of
    its jobs are observed per cluster)."""
    conf = policy.queue.slurm_conf or ""
    return f"slurm:{hashlib.sha256(conf.encode()).hexdigest()[:16]}"


def job_project(job: dict[str, Any]) -> str | None:
    """Who a job's GPUs are for: its account, else its QOS; None with neither (a job of no
    project: its user is not a project, so it is not counted as one)."""
    project = job.get("account") or job.get("qos")
    return str(project) if project else None


def job_user(job: dict[str, Any]) -> str | None:
    """Who submitted the job: Slurm's ``user_name`` (None when squeue does not say)."""
    user = job.get("user_name")
    return str(user) if user else None


CHECKPOINT_ANNOTATION = re.compile(r"(?:^|[\s,;])burst\.checkpoint_every=(\S+?)(?=$|[\s,;])")


def job_checkpoint_s(job: dict[str, Any]) -> float | None:
    """A job's own checkpoint interval, annotated in its Slurm comment as
    ``burst.checkpoint_every=30m`` (``sbatch --comment``); None when it gives none or an
    unreadable one (logged: the job then takes its project's or the policy's interval)."""
    found = CHECKPOINT_ANNOTATION.search(str(job.get("comment") or ""))
    if found is None:
        return None
    try:
        seconds = parse_duration(found.group(1)).total_seconds()
    except (ValueError, TypeError):
        seconds = 0.0
    if seconds <= 0:
        log.warning("job %s: comment burst.checkpoint_every=%s is not a duration above 0s; "
                    "ignored", job.get("job_id"), found.group(1))
        return None
    return seconds


DATASET_ANNOTATION = re.compile(r"(?:^|[\s,;])burst\.dataset_gb=(\S+?)(?=$|[\s,;])")


def job_dataset_gb(job: dict[str, Any]) -> float | None:
    """GB of data a burst must stage for the job, annotated in its Slurm comment as
    ``burst.dataset_gb=500``; None when it gives none or an unreadable one (logged: the job then
    takes its project's or pool's ``storage``)."""
    found = DATASET_ANNOTATION.search(str(job.get("comment") or ""))
    if found is None:
        return None
    try:
        size = float(found.group(1))
    except ValueError:
        size = -1.0
    if not (0 <= size < float("inf")):
        log.warning("job %s: comment burst.dataset_gb=%s is not a size in GB of 0 or more; "
                    "ignored", job.get("job_id"), found.group(1))
        return None
    return size


def job_gpus(job: dict[str, Any]) -> int:
    """GPUs a job asks for in all (per node x nodes, per job, or per task x tasks)."""
    per_node = gres_count(job.get("tres_per_node"))
    if per_node:
        return per_node * max(int(job.get("node_count") or 1), 1)
    per_job = gres_count(job.get("tres_per_job"))
    if per_job:
        return per_job
    per_task = gres_count(job.get("tres_per_task"))
    if per_task:
        return per_task * max(int(job.get("tasks") or 1), 1)
    return 0


def array_tasks_left(job: dict[str, Any]) -> int:
    """How many tasks a pending array record stands for (1 for a plain job)."""
    spec = str(job.get("array_task_string") or "").split("%", 1)[0]
    if not spec:
        return 1
    count = 0
    for part in spec.split(","):
        step = 1
        if ":" in part:
            part, _, raw_step = part.partition(":")
            step = max(int(raw_step), 1) if raw_step.isdigit() else 1
        first, _, last = part.partition("-")
        if first.isdigit() and (not last or last.isdigit()):
            count += (int(last or first) - int(first)) // step + 1
    return max(min(count, MAX_ARRAY_TASKS), 1)


def in_partition(job: dict[str, Any], partition: str | None) -> bool:
    return partition is None or partition in _split(job.get("partition"))


def pending_jobs(jobs: Iterable[dict[str, Any]], pool: str, partition: str | None) -> list[Job]:
    """The pool's pending GPU jobs that wait for capacity, as planner Jobs."""
    out: list[Job] = []
    for job in jobs:
        if job.get("job_state") != "PENDING" or not in_partition(job, partition):
            continue
        if str(job.get("state_reason") or "None") not in UNMET_REASONS:
            continue
        gpus = job_gpus(job)
        if gpus <= 0:
            continue  # CPU-only work: bursting GPU nodes would not help it
        project, user = job_project(job), job_user(job)
        limit = job.get("time_limit")
        duration = None
        if isinstance(limit, int) and 0 < limit < INFINITE_MINUTES:
            duration = float(limit * 60)
        submitted = _epoch(job.get("submit_time")) or datetime.now(UTC)
        base_id = str(job.get("job_id"))
        tasks = array_tasks_left(job) if job.get("array_task_string") else 1
        for index in range(tasks):
            out.append(Job(
                id=base_id if tasks == 1 else f"{base_id}_{index}",
                project=project, pool=pool, gpus=gpus, submitted_at=submitted,
                priority=int(job.get("priority") or 0), duration_s=duration,
                state=JobState.PENDING, user=user, checkpoint_s=job_checkpoint_s(job),
                dataset_gb=job_dataset_gb(job)))
    return out


def gpus_on_node(job: dict[str, Any], index: int) -> int:
    """GPUs a running job holds on the ``index``-th of its nodes."""
    per_node = gres_count(job.get("tres_per_node"))
    if per_node:
        return per_node
    detail = job.get("gres_detail") or []
    if index < len(detail) and gres_count(str(detail[index])):
        return gres_count(str(detail[index]))
    nodes = max(int(job.get("node_count") or 1), 1)
    return -(-job_gpus(job) // nodes)


def observed_runs(jobs: Iterable[dict[str, Any]], scope: str, members: Mapping[str, str]
                  ) -> list[JobRun]:
    """The runs of GPU jobs on burst nodes in one squeue listing of the cluster ``scope``:
    ``members`` maps the Slurm names burst nodes hold to their node ids. A job running now is an
    open run; a finished one still listed (squeue keeps them for MinJobAge) a closed run, ended
    at its ``end_time`` with its final state as outcome. Jobs that never started (cancelled while
    pending) and CPU-only jobs give none."""
    runs: list[JobRun] = []
    for job in jobs:
        state = str(job.get("job_state") or "")
        live, finished = state in LIVE_JOB_STATES, state in FINISHED_JOB_STATES
        start = _epoch(job.get("start_time"))
        if not (live or finished) or start is None:
            continue
        end = _epoch(job.get("end_time")) if finished else None
        if finished and (end is None or end <= start):
            continue
        for index, host in enumerate(expand_hostlist(job.get("nodes") or "")):
            node_id = members.get(host)
            gpus = gpus_on_node(job, index)
            if node_id is None or gpus <= 0:
                continue
            job_id = str(job.get("job_id"))
            runs.append(JobRun(
                run_key=slurm_run_key(scope, job_id, node_id, start), job_id=job_id,
                project=job_project(job), user=job_user(job), node_id=node_id, gpus=gpus,
                started_at=start,
                ended_at=end, outcome=state.lower() if finished else None,
                source=RunSource.SLURM))
    return runs


def pool_queue(policy: Policy, jobs: list[dict[str, Any]], nodes: list[SlurmNode],
               burst_feature: str) -> PoolQueue:
    """One pool's queue from parsed squeue/sinfo output."""
    partition = policy.queue.partition
    in_pool = [n for n in nodes if partition is None or partition in n.partitions]
    onprem = [n for n in in_pool if burst_feature not in n.features]
    burst_names = {n.name for n in in_pool if burst_feature in n.features}
    usable = [n for n in onprem if n.usable]
    onprem_state = OnPremState(
        total_gpus=sum(n.gpus for n in usable),
        free_gpus=sum(n.gpus_free for n in usable),
        free_per_node=tuple(n.gpus_free for n in usable),
    )
    onprem_names = {n.name for n in onprem}
    usable_index = {n.name: i for i, n in enumerate(usable)}  # the index in free_per_node
    running_onprem = running_burst = 0
    releases: list[OnPremRelease] = []
    for job in jobs:
        if job.get("job_state") not in LIVE_JOB_STATES or not in_partition(job, partition):
            continue
        hostlist = expand_hostlist(job.get("nodes") or "")
        hosts = set(hostlist)
        if hosts & burst_names:
            running_burst += 1
        elif hosts & onprem_names:
            running_onprem += 1
            releases.extend(onprem_releases(job, hostlist, usable_index))
    return PoolQueue(
        pool=policy.pool.name,
        onprem=onprem_state,
        pending=tuple(pending_jobs(jobs, policy.pool.name, partition)),
        running_onprem_jobs=running_onprem,
        running_burst_jobs=running_burst,
        onprem_releases=tuple(releases),
    )


def onprem_releases(job: dict[str, Any], hosts: list[str],
                    usable: dict[str, int]) -> list[OnPremRelease]:
    """When a running job's GPUs on usable on-prem nodes free up, one release per node (its
    index in ``usable``, the order of ``free_per_node``): Slurm's ``end_time`` of a running job
    is its start plus its time limit (the latest it may end; the wait-aware rule reads it as the
    expected end). None for a job without a limit or without GPUs there."""
    held = [(usable[host], gpus_on_node(job, index)) for index, host in enumerate(hosts)
            if host in usable]
    held = [(node, gpus) for node, gpus in held if gpus > 0]
    if not held:
        return []
    limit = job.get("time_limit")
    if not (isinstance(limit, int) and 0 < limit < INFINITE_MINUTES):
        return []  # no limit: it may hold its GPUs for as long as the rule looks ahead
    start, ends = _epoch(job.get("start_time")), _epoch(job.get("end_time"))
    if ends is None or (start is not None and ends <= start):
        if start is None:
            return []
        ends = start + timedelta(minutes=limit)
    return [OnPremRelease(gpus, ends, node) for node, gpus in held]


class SlurmQueue:
    """Queue source over one or more Slurm clusters (one per distinct ``queue.slurm_conf``)."""

    def __init__(self, store: Store, policies: list[Policy],
                 cli_factory: Callable[[str | None], SlurmCli] = SlurmCli):
        self.store = store
        self.policies = [p for p in policies if p.queue.source is QueueSourceKind.SLURM]
        self._clis: dict[str | None, SlurmCli] = {}
        self._accounted_until: dict[str | None, datetime] = {}
        self._accounting_failed: set[str | None] = set()  # logged once per cluster
        for policy in self.policies:
            conf = policy.queue.slurm_conf
            if conf not in self._clis:
                self._clis[conf] = cli_factory(conf)

    def cli(self, policy: Policy) -> SlurmCli:
        return self._clis[policy.queue.slurm_conf]

    def _read(self) -> dict[str | None, tuple[list[dict[str, Any]], list[SlurmNode]]]:
        return {conf: (cli.jobs(), parse_nodes(cli.nodes())) for conf, cli in self._clis.items()}

    def observe(self, now: datetime) -> dict[str, PoolQueue]:
        """Pending jobs and on-prem capacity of every Slurm pool (SlurmError if Slurm is down);
        records the runs of Slurm jobs on burst nodes as it goes (see the module docstring)."""
        views = self._read()
        queues: dict[str, PoolQueue] = {}
        for policy in self.policies:
            jobs, nodes = views[policy.queue.slurm_conf]
            queues[policy.pool.name] = pool_queue(policy, jobs, nodes, policy.fabric.slurm.feature)
        self.record_runs({conf: jobs for conf, (jobs, _) in views.items()}, now)
        self.record_accounting(now)
        return queues

    def record_accounting(self, now: datetime) -> int:
        """What Slurm accounting says of the GPU jobs that ended since the last read (at most
        every ``ACCOUNTING_EVERY`` per cluster): recorded once per job in the store's GPU-use
        aggregates (:mod:`orchestrator.sources.slurm_usage`), measured where the site collects
        ``gres/gpuutil``, else allocation only. A cluster without accounting (sacct failing) is
        logged once and leaves its jobs unmeasured; it never stops the observation."""
        if self.store.read_only:
            return 0
        recorded = 0
        for conf, cli in self._clis.items():
            since = self._accounted_until.get(conf)
            if since is not None and now - since < ACCOUNTING_EVERY:
                continue
            read = getattr(cli, "accounting", None)
            if read is None:
                continue  # a recorded listing (tests) has no accounting to read
            try:
                text = read(since or now - ACCOUNTING_LOOKBACK, now)
            except SlurmError as exc:
                if conf not in self._accounting_failed:
                    self._accounting_failed.add(conf)
                    log.warning("Slurm accounting of %s unreadable (%s): its jobs' GPU use is "
                                "unknown (logged once)", conf or "the default cluster", exc)
                self._accounted_until[conf] = now
                continue
            self._accounted_until[conf] = now
            try:
                recorded += record_accounted(self.store, parse_sacct_usage(text).values())
            except StaleLeaderError:
                raise
            except Exception:  # noqa: BLE001 - the queue view is still good without it
                log.warning("could not record the Slurm accounting of %s",
                            conf or "the default cluster", exc_info=True)
        return recorded

    def record_runs(self, listings: Mapping[str | None, list[dict[str, Any]]], now: datetime
                    ) -> tuple[int, int]:
        """Record in the store the runs each cluster's squeue listing shows on burst nodes, and
        close the cluster's runs it no longer shows. Returns (runs opened, runs closed). A store
        failure is logged, not raised: cost tracking must not stop the control loop (a deposed
        leader's refusal is raised, as for every write)."""
        opened = closed = 0
        if self.store.read_only:
            return opened, closed  # a dry-run (`burst plan`) observes the queue, records nothing
        scopes = {policy.queue.slurm_conf: slurm_scope(policy) for policy in self.policies}
        for conf, jobs in listings.items():
            scope = scopes.get(conf)
            if scope is None:
                continue
            try:
                members = {m.name: m.node_id for m in self.store.fabric_members(scope)
                           if m.node_id is not None}
                o, c = self.store.observe_slurm_runs(scope, observed_runs(jobs, scope, members),
                                                     now)
            except StaleLeaderError:
                raise
            except Exception:  # noqa: BLE001 - the queue view is still good without the runs
                log.warning("could not record Slurm job runs of %s", conf or "the default "
                            "cluster", exc_info=True)
                continue
            opened += o
            closed += c
        return opened, closed

    def node_usage(self, node_ids: list[str]) -> dict[str, NodeUsage]:
        """Per burst node: GPUs and jobs on its Slurm node now, and when it was last busy."""
        if not node_ids or not self._clis:
            return {}
        members = {m.node_id: m for m in self.store.fabric_members() if m.node_id in node_ids}
        if not members:
            return {}
        views = self._read()
        usage: dict[str, NodeUsage] = {}
        for node_id, member in members.items():
            for jobs, nodes in views.values():
                slurm_node = next((n for n in nodes if n.name == member.name), None)
                on_node = [j for j in jobs if j.get("job_state") in LIVE_JOB_STATES
                           and member.name in expand_hostlist(j.get("nodes") or "")]
                if slurm_node is None and not on_node:
                    continue
                busy = slurm_node.gpus_used if slurm_node else sum(job_gpus(j) for j in on_node)
                last = slurm_node.last_busy if slurm_node else None
                usage[node_id] = NodeUsage(busy, len(on_node), last)
                break
        return usage

    # The built-in queue's dispatcher hook: Slurm schedules its own on-prem nodes.
    def dispatch_onprem(self, now: datetime) -> list:
        return []


def record_accounted(store: Store, jobs: Iterable[AccountedJob]) -> int:
    """Record each ended GPU job accounting knows (a job is recorded once); the count new."""
    new = 0
    for job in jobs:
        if job.started_at is None or job.ended_at is None or not job.gpus:
            continue
        new += store.record_job_accounting(
            job.job_id, job.account, started_at=job.started_at, ended_at=job.ended_at,
            gpus=job.gpus, mean_utilisation_percent=job.mean_utilisation_percent,
            peak_memory_mib=job.peak_memory_mib)
    return new


def _split(value: Any) -> list[str]:
    if not value:
        return []
    if isinstance(value, list | tuple):
        return [str(v) for v in value]
    return [v for v in str(value).split(",") if v]


def _epoch(value: Any) -> datetime | None:
    if isinstance(value, int | float) and value > 0:
        return datetime.fromtimestamp(value, UTC)
    return None
