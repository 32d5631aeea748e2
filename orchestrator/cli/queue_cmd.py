"""`burst submit` and `burst status`: the built-in queue, on-prem usage and burst nodes."""

from __future__ import annotations

from dataclasses import replace
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Annotated

import typer

from orchestrator.cli import running

from orchestrator.cli.common import (
    POLICY_HELP,
    age,
    fail,
    load_policies,
    load_settings,
    open_store,
    out,
    print_json,
)

_PolicyOpt = Annotated[list[Path] | None, typer.Option("--policy", "-p", help=POLICY_HELP)]
_StateOpt = Annotated[Path | None, typer.Option("--state-dir", help="State directory (BURST_STATE_DIR).")]


def _settings(state_dir: Path | None):
    return load_settings(state_dir=state_dir)


def submit_command(
    project: Annotated[str | None, typer.Option("--project", help="Project the job belongs to.")] = None,
    gpus: Annotated[int | None, typer.Option("--gpus", min=1, help="GPUs the job needs.")] = None,
    duration: Annotated[str | None, typer.Option("--duration", help="Expected runtime, e.g. 10m or 1h30m.")] = None,
    priority: Annotated[int, typer.Option("--priority", help="Job priority (higher first).")] = 0,
    command: Annotated[str | None, typer.Option("--command", help="Shell command to run (default: sleep for --duration).")] = None,
    pool: Annotated[str | None, typer.Option("--pool", help="Pool (default: the policy's pool).")] = None,
    count: Annotated[int, typer.Option("--count", min=1, help="Submit this many identical jobs (one transaction).")] = 1,
    user: Annotated[str | None, typer.Option("--user", help="Who the job is for (default: the OS user running burst).")] = None,
    from_file: Annotated[Path | None, typer.Option("--from-file", help="Submit the jobs of a CSV file in the canonical trace format (job_id,submit_s,duration_s,gpus,project,priority), one transaction; instead of --project/--gpus/--duration.")] = None,
    policy: _PolicyOpt = None,
    state_dir: _StateOpt = None,
    as_json: Annotated[bool, typer.Option("--json", help="Print the submitted jobs as a JSON list.")] = False,
) -> None:
    """Put jobs in the built-in queue: --count identical ones, or those of --from-file."""
    from orchestrator.policy import parse_duration
    from orchestrator.store.bulk import MAX_BATCH, JobSpec

    now = datetime.now(UTC)
    if from_file is not None:
        if project is not None or gpus is not None or duration is not None or count != 1:
            fail("--from-file: the file gives each job's project, GPUs and duration; drop "
                 "--project, --gpus, --duration and --count")
        specs = _file_specs(from_file, now)
    else:
        missing = [flag for flag, value in (("--project", project), ("--gpus", gpus),
                                            ("--duration", duration)) if value is None]
        if missing:
            fail(f"{', '.join(missing)}: required (or give --from-file)")
        assert project is not None and gpus is not None and duration is not None
        try:
            seconds = parse_duration(duration).total_seconds()
        except ValueError as exc:
            fail(f"--duration: {exc}")
        if not project.strip():
            fail("--project: must not be empty")
        specs = [JobSpec(project=project, pool="", gpus=gpus, priority=priority,
                         duration_s=seconds, command=command)] * count
    user = _submitter(user)
    if len(specs) > MAX_BATCH:
        fail(f"{'--from-file' if from_file else '--count'}: at most {MAX_BATCH} jobs per "
             f"submission, got {len(specs)}; split them")
    settings = _settings(state_dir)
    policies = load_policies(policy, settings)
    pools = {p.pool.name for p in policies}
    pool = pool or policies[0].pool.name
    if pool not in pools:
        fail(f"--pool: no running policy watches pool {pool!r} (a job there would wait forever); "
             f"the pools watched are {', '.join(sorted(pools))}")
    specs = [replace(s, pool=pool, user=user) for s in specs]
    store = open_store(settings)
    try:
        jobs = store.submit_jobs(specs, submitted_at=now)
    finally:
        store.close()
    if as_json:
        print_json([{"id": j.id, "project": j.project, "user": j.user, "pool": j.pool,
                     "gpus": j.gpus} for j in jobs])
    elif len(jobs) <= _LINES_UP_TO:
        for job in jobs:
            out.print(f"submitted {job.id}: {job.gpus} GPU(s) for {job.project} ({user}) in "
                      f"pool {pool}", soft_wrap=True)
    else:
        out.print(f"submitted {len(jobs)} jobs for {user} ({jobs[0].id} ... {jobs[-1].id}), "
                  f"{sum(j.gpus for j in jobs)} GPU(s) in pool {pool}; `burst status` lists them",
                  soft_wrap=True)


def _submitter(user: str | None) -> str:
    """The ``--user`` given, else the OS user running burst; a clear error for a bad name or
    when the OS cannot say who is running."""
    import getpass

    from orchestrator.domain.jobs import check_user

    if user is None:
        try:
            user = getpass.getuser()
        except (OSError, KeyError):
            fail("--user: the OS does not say who is running burst (no LOGNAME/USER and no "
                 "password entry); name the user with --user")
    try:
        return check_user(user)
    except ValueError as exc:
        fail(f"--user: {exc}")


def _utilisation_cell(node: dict, now: datetime) -> str:
    """The status table's GPU use of a node: measured percent, "unknown", and the idle flag."""
    percent = node["gpu_utilisation_percent"]
    if percent is None:
        return "unknown"
    if node["low_utilisation"]:
        # (imported here, not at the top: `burst --help` loads no policy module)
        from orchestrator.policy.timefmt import parse_aware

        since = parse_aware(node["low_utilisation_since"], "low_utilisation_since")
        return f"{percent:.0f}% idle {age((now - since).total_seconds())}"
    return f"{percent:.0f}%"


_LINES_UP_TO = 20  # a bigger submission prints one summary line, not a line per job


def _file_specs(path: Path, now: datetime) -> list:
    """The jobs of a canonical trace file: each keeps its offset from the file's last submission,
    which is ``now`` (so their order and relative waits are the file's). Errors name
    FILE:LINE and the column, as ``burst simulate --trace FILE`` does."""
    from orchestrator.sim.traces import TraceError, load_canonical
    from orchestrator.store.bulk import JobSpec

    try:
        jobs = load_canonical(path).jobs
    except TraceError as exc:
        fail(str(exc))
    if not jobs:
        fail(f"{path}: no jobs in the file")
    nameless = [j.job_id for j in jobs if not j.project.strip()]
    if nameless:  # a trace may leave project empty; a queued job needs one
        import csv

        with path.open(newline="", encoding="utf-8") as f:
            line = next(n for n, row in enumerate(csv.reader(f), 1) if row and row[0] == nameless[0])
        fail(f"{path}:{line}: project: must not be empty (a queued job belongs to a project)")
    last = max(j.submit_s for j in jobs)
    return [JobSpec(project=j.project, pool="", gpus=j.gpus, priority=j.priority,
                    duration_s=j.duration_s, submitted_at=now - timedelta(seconds=last - j.submit_s))
            for j in jobs]


def status_command(policy: _PolicyOpt = None, state_dir: _StateOpt = None,
                   as_json: Annotated[bool, typer.Option("--json", help="Print pools, policies, queue, nodes and capacity blocks as one JSON object.")] = False,
                   all_nodes: Annotated[bool, typer.Option("--all", help="List every burst node, terminated ones included (default: the first --limit nodes not terminated; the counts cover them all).")] = False,
                   limit: Annotated[int, typer.Option("--limit", min=0, help="List at most this many pending jobs, first in service order, and as many burst nodes, oldest first (the pools' and nodes' figures count every one).")] = 1000) -> None:
    """Show the queue (and what holds each pending job), on-prem usage, each policy's last
    decision, limits and budgets, and every burst node."""
    from rich.table import Table
    from rich.text import Text

    from orchestrator.cli.status_why import job_reasons, overview_tables, policy_overview
    from orchestrator.domain.jobs import NO_USER_LABEL, JobState, Placement
    from orchestrator.domain.nodes import NodeState
    from orchestrator.domain.utilisation import low_utilisation
    from orchestrator.sources.builtin import BuiltinQueue

    settings = _settings(state_dir)
    policies = load_policies(policy, settings)
    store = open_store(settings)
    now = datetime.now(UTC)
    # Figures from grouped counts; only the first --limit pending jobs are read.
    running_jobs = store.running_jobs()  # light rows: 11,000 of them at 10,000 nodes
    pools_summary = BuiltinQueue(store, policies).summary(running_jobs)
    # Nodes: counted by SQL (per pool, state and offering), the first --limit listed (--all:
    # every one, terminated included), so a site of 10,000 nodes prints a page, not a book.
    node_counts = store.node_counts_by_offering(include_terminated=all_nodes)
    nodes_total = sum(c.nodes for c in node_counts)
    nodes = store.nodes(include_terminated=all_nodes, limit=None if all_nodes else limit)
    busy = store.gpus_busy_by_node()
    blocks = store.capacity_blocks(now)
    pending = store.jobs(states=[JobState.PENDING], limit=limit)
    pending_total = sum(q.pending_jobs for q in pools_summary)
    idle_for = {p.name: p.utilisation.idle_for for p in policies}

    def flagged(since, policy_name: str) -> bool:
        return policy_name in idle_for and low_utilisation(since, idle_for[policy_name], now)

    # Jobs with idle GPUs, on any burst node (listed or not): the running jobs as light rows,
    # their measured use, and the nodes of those measured low (read one by one: few).
    running_burst = [j for j in running_jobs
                     if j.placement is Placement.BURST and j.node_id is not None]
    uses = {u.job_id: u for u in store.job_utilisation([j.id for j in running_burst])}
    low_running = [j for j in running_burst if j.id in uses and uses[j.id].low_since is not None]
    hosts = {n.id: n for n in nodes}
    for node_id in {j.node_id for j in low_running} - hosts.keys():
        host = store.get_node(node_id)
        if host is not None and (all_nodes or host.state is not NodeState.TERMINATED):
            hosts[node_id] = host
    overview, latest = policy_overview(store, policies, now)
    store.close()

    low_jobs = [{
        "id": j.id, "project": j.project, "node": j.node_id, "gpus": j.gpus,
        "gpu_utilisation_percent": uses[j.id].mean_utilisation_percent,
        "low_since": uses[j.id].low_since.isoformat(),
    } for j in low_running if j.node_id in hosts
        and flagged(uses[j.id].low_since, hosts[j.node_id].policy)]
    reasons = job_reasons(pending, policies, latest)
    loop = running.read(settings.state_dir)
    data = {
        "at": now.isoformat(),
        "loop": None if loop is None else {
            "running": loop.alive, "pid": loop.pid, "host": loop.host, "since": loop.started_at,
            "policy_files": [str(p) for p in loop.policy_files]},
        "pools": [{
            "pool": q.pool, "onprem_gpus": q.onprem_gpus,
            "onprem_gpus_busy": q.onprem_gpus - q.onprem_free_gpus,
            "pending_jobs": q.pending_jobs, "pending_gpus": q.pending_gpus,
            "running_onprem_jobs": q.running_onprem_jobs, "running_burst_jobs": q.running_burst_jobs,
        } for q in pools_summary],
        "policies": overview,
        "queue": [{"id": j.id, "project": j.project, "user": j.user, "pool": j.pool, "gpus": j.gpus,
                   "priority": j.priority,
                   "wait_s": round((now - j.submitted_at).total_seconds(), 1),
                   "held_back": reasons[j.id]} for j in pending],
        "queue_listed": len(pending),
        "nodes": [{
            "id": n.id, "state": str(n.state), "age_s": round((now - n.created_at).total_seconds(), 1),
            "in_state_s": round((now - n.state_since).total_seconds(), 1), "provider": n.provider,
            "offering": n.offering_key, "instance_type": n.instance_type, "market": str(n.market),
            "gpus": n.gpus, "gpus_busy": busy.get(n.id, 0), "price_usd_hour": n.price_usd_hour,
            "instance_id": n.instance_id, "project": n.project,
            "gpu_utilisation_percent": n.gpu_utilisation_percent,
            "low_utilisation_since": (n.low_utilisation_since.isoformat()
                                      if n.low_utilisation_since else None),
            "low_utilisation": flagged(n.low_utilisation_since, n.policy),
        } for n in nodes],
        "nodes_listed": len(nodes),
        "nodes_total": nodes_total,
        "node_counts": [{"pool": c.pool, "state": str(c.state), "offering": c.offering_key,
                         "nodes": c.nodes, "gpus": c.gpus} for c in node_counts],
        "low_utilisation_jobs": low_jobs,
        "capacity_blocks": [{"offering": b.offering_key, "until": b.until.isoformat(), "reason": b.reason}
                            for b in blocks],
    }
    if as_json:
        print_json(data)
        return
    if loop is None:
        out.print("loop: no `burst run` has recorded itself in this state directory")
    else:
        what = (f"burst run (pid {loop.pid} on {loop.host}) since {loop.started_at}" if loop.alive
                else f"not running (pid {loop.pid} ran from {loop.started_at})")
        out.print(Text(f"loop: {what}, policies: {', '.join(map(str, loop.policy_files))}"))
    pools = Table(title="pools")
    for col in ("pool", "on-prem GPUs busy", "pending jobs", "pending GPUs", "running on-prem", "running burst"):
        pools.add_column(col)
    for p in data["pools"]:
        pools.add_row(p["pool"], f"{p['onprem_gpus_busy']}/{p['onprem_gpus']}", str(p["pending_jobs"]),
                      str(p["pending_gpus"]), str(p["running_onprem_jobs"]), str(p["running_burst_jobs"]))
    out.print(pools)
    for table in overview_tables(overview):
        out.print(table)
    if pending:
        queue = Table(title=f"queue ({pending_total} pending)")
        for col in ("job", "project", "user", "GPUs", "priority", "waiting", "held back by"):
            queue.add_column(col)
        for j in data["queue"][:30]:
            queue.add_row(j["id"], j["project"], j["user"] or NO_USER_LABEL, str(j["gpus"]),
                          str(j["priority"]), age(j["wait_s"]), j["held_back"]["text"])
        out.print(queue)
    if node_counts and len(nodes) < nodes_total:
        # Per pool and state here (the JSON has them per offering too: hundreds of rows).
        by_state: dict[tuple[str, str], list[int]] = {}
        for c in node_counts:
            tally = by_state.setdefault((c.pool, str(c.state)), [0, 0, 0])
            tally[0] += 1
            tally[1] += c.nodes
            tally[2] += c.gpus
        counts = Table(title=f"burst nodes by pool and state ({nodes_total})")
        for col in ("pool", "state", "offerings", "nodes", "GPUs"):
            counts.add_column(col)
        for (pool_name, state), (offerings, count, gpus) in by_state.items():
            counts.add_row(pool_name, state, str(offerings), str(count), str(gpus))
        out.print(counts)
    table = Table(title=f"burst nodes ({nodes_total})" if len(nodes) == nodes_total
                  else f"burst nodes (the first {len(nodes)} of {nodes_total})")
    for col in ("node", "state", "age", "provider", "offering", "GPUs busy", "GPU util", "$/h",
                "project"):
        table.add_column(col)
    colours = {NodeState.READY: "green", NodeState.FAILED: "red", NodeState.DRAINING: "yellow"}
    for n, d in zip(nodes, data["nodes"], strict=True):
        colour = colours.get(n.state, "cyan")
        table.add_row(n.id, Text(str(n.state), style=colour), age(d["age_s"]), n.provider,
                      f"{n.instance_type} ({n.market})", f"{d['gpus_busy']}/{n.gpus}",
                      _utilisation_cell(d, now), f"{n.price_usd_hour:.2f}", n.project or "-")
    out.print(table)
    if len(nodes) < nodes_total:
        out.print(f"... {nodes_total - len(nodes)} more node(s): `burst status --all` lists "
                  "every one")
    if low_jobs:
        from orchestrator.policy.timefmt import parse_aware

        idle = Table(title=f"jobs with idle GPUs ({len(low_jobs)}): allocated, measured under "
                           "utilisation.idle_below_percent")
        for col in ("job", "project", "node", "GPUs", "GPU util", "low for"):
            idle.add_column(col)
        for j in low_jobs:
            low_for = (now - parse_aware(j["low_since"], "low_since")).total_seconds()
            idle.add_row(j["id"], j["project"], j["node"], str(j["gpus"]),
                         f"{j['gpu_utilisation_percent']:.0f}%", age(low_for))
        out.print(idle)
    if blocks:
        cache = Table(title="offerings excluded after capacity errors")
        for col in ("offering", "until", "reason"):
            cache.add_column(col)
        for b in data["capacity_blocks"]:
            cache.add_row(b["offering"], b["until"], b["reason"])
        out.print(cache)
