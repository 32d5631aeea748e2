"""The cost ledger on real stores (SQLite and PostgreSQL): roll-up, report and spend.

Node histories are written the way burst writes them (node events through ``save_transition``,
jobs through the built-in queue's store methods), then ``roll_up`` turns them into cost lines.
The roll-up must be idempotent (a second run writes nothing), incremental (final buckets are
never recomputed), and exact: on generated histories, every grouping of the report adds up to
the same total, to the cent and to the micro-dollar, and the total is the sum of each node's
bill (price x billed seconds, one-minute minimum).
"""

from __future__ import annotations

import csv
import io
import random
import threading
from dataclasses import replace
from datetime import datetime, timedelta
from decimal import Decimal
from fractions import Fraction

import pytest

from orchestrator.costs.ledger import SETTLE, roll_up
from orchestrator.costs.report import (
    CostQuery,
    GroupKey,
    allocate_cents,
    cost_report,
    parse_group_by,
)
from orchestrator.costs.spend import burn_rate_usd_hour, spend
from orchestrator.domain import NodeState
from orchestrator.domain.costs import CostKind
from orchestrator.domain.jobs import JobState
from orchestrator.domain.offerings import BillingRule
from orchestrator.lifecycle import NodeEvent, transition
from orchestrator.policy import Policy
from orchestrator.store import Store
from tests.builders import POOL, T0, make_node, make_offering, make_policy

S = NodeState
H = timedelta(hours=1)
M = timedelta(minutes=1)
SEC = timedelta(seconds=1)
DAY0 = T0.replace(hour=0)  # 2025-03-01 00:00 UTC


def onprem_policy(rate: float | None = 2.0, name: str = "train", pool: str = POOL) -> Policy:
    onprem = {"nodes": 1, "gpus_per_node": 8}
    if rate is not None:
        onprem["gpu_hour_usd"] = rate
    return make_policy(name=name, pool={"name": pool, "onprem": onprem})


def launch(store: Store, node_id: str, at: datetime, *, price: float = 36.0, gpus: int = 8,
           project: str | None = "vision", policy: str = "train", pool: str = POOL,
           instance_type: str = "g8", provider: str = "aws", market: str = "on-demand") -> None:
    """A node requested a few seconds before ``at`` and accepted by the provider at ``at``."""
    offering = make_offering(instance_type, gpus=gpus, price=price, provider=provider,
                             market=market)
    requested = at - 3 * SEC
    node = make_node(node_id, state=S.REQUESTED, offering=offering, project=project, pool=pool,
                     policy=policy, state_since=requested, instance_id=None)
    assert store.add_node(node, NodeEvent(node_id, requested, None, S.REQUESTED, "demand", {}))
    step(store, node_id, S.LAUNCHING, at)


def step(store: Store, node_id: str, state: NodeState, at: datetime) -> None:
    node = store.get_node(node_id)
    assert node is not None
    new, event = transition(node, state, at=at, reason="test")
    assert store.save_transition(node, new, event)


def terminate(store: Store, node_id: str, at: datetime) -> None:
    step(store, node_id, S.TERMINATING, max(at - SEC, store.get_node(node_id).state_since))
    step(store, node_id, S.TERMINATED, at)


def run_job(store: Store, project: str, gpus: int, start: datetime, end: datetime | None, *,
            node_id: str | None = None, pool: str = POOL) -> str:
    """A job of the built-in queue that ran on ``node_id`` (None: on-prem) from start to end."""
    job = store.submit_job(project, pool, gpus, 0, None, None, start - M)
    job = store.start_job(job, placement="burst" if node_id else "onprem", node_id=node_id,
                          at=start)
    assert job is not None
    if end is not None:
        assert store.finish_job(job, state=JobState.DONE, exit_code=0, at=end) is not None
    return job.id


def bill(price: float, lived: timedelta, rule: BillingRule = BillingRule()) -> int:
    """An instance's bill in micro-dollars, computed independently of the ledger."""
    us = lived // timedelta(microseconds=1)
    billed = max(us, rule.minimum_s * 10**6)
    billed = -(-billed // (rule.increment_s * 10**6)) * rule.increment_s * 10**6
    return round(Fraction(str(price)) * billed / 3600)


def report(store: Store, *keys: GroupKey, **query) -> dict:
    return cost_report(store, CostQuery(group_by=keys, **query)).as_json()


def rows(store: Store, *keys: GroupKey, **query) -> list[tuple]:
    return [(*(r[str(k)] for k in keys), r["cost_usd"])
            for r in report(store, *keys, **query)["rows"]]


# -- roll-up ---------------------------------------------------------------------------------------


def test_terminated_node_gets_final_lines_and_is_done(store: Store) -> None:
    launch(store, "n1", T0 + 30 * M)
    terminate(store, "n1", T0 + 75 * M)
    result = roll_up(store, [onprem_policy(None)], T0 + 76 * M)
    assert (result.nodes, result.lines_written, result.lines_deleted) == (1, 2, 0)
    lines = store.ledger_lines("n1")
    assert [(x.period_start, x.kind, x.cost_micros, x.final) for x in lines] == [
        (T0, CostKind.IDLE, 18_000_000, True), (T0 + H, CostKind.IDLE, 9_000_000, True)]
    assert store.ledger_mark("n1") == T0 + 2 * H
    assert lines[0].day == "2025-03-01" and lines[0].region == "us-east-1"
    # Done: no longer a candidate, and a second run (even much later) writes nothing.
    assert store.ledger_candidates() == []
    again = roll_up(store, [onprem_policy(None)], T0 + 30 * H)
    assert (again.nodes, again.lines_written, again.lines_deleted) == (0, 0, 0)


def test_roll_up_is_idempotent_and_incremental(store: Store) -> None:
    policies = [onprem_policy(None)]
    launch(store, "n1", T0 + 10 * M, price=3.6)
    job = run_job(store, "nlp", 8, T0 + 20 * M, None, node_id="n1")

    first = roll_up(store, policies, T0 + 40 * M)
    assert first.lines_written == 2  # idle (boot), usage; no minimum: it lived 30 minutes
    assert {(x.kind, x.final) for x in store.ledger_lines("n1")} == {
        (CostKind.IDLE, False), (CostKind.USAGE, False)}
    assert roll_up(store, policies, T0 + 40 * M).lines_written == 0  # same now: nothing new
    assert store.ledger_mark("n1") is None

    # The open bucket's lines are replaced as time goes on; after SETTLE past the hour, final.
    roll_up(store, policies, T0 + 50 * M)
    usage = [x for x in store.ledger_lines("n1") if x.kind is CostKind.USAGE]
    assert usage[0].gpu_seconds == 8 * 30 * 60 and not usage[0].final
    roll_up(store, policies, T0 + H + SETTLE)
    first_bucket = {x.line_key: x for x in store.ledger_lines("n1") if x.period_start == T0}
    assert all(x.final for x in first_bucket.values())
    assert store.ledger_mark("n1") == T0 + H
    assert {x.final for x in store.ledger_lines("n1") if x.period_start == T0 + H} == {False}

    # Final buckets are never recomputed: a late change to the job's record leaves them be.
    record = store.get_job(job)
    assert store.finish_job(record, state=JobState.DONE, exit_code=0, at=T0 + 30 * M)
    roll_up(store, policies, T0 + 2 * H)
    assert {x.line_key: x for x in store.ledger_lines("n1") if x.period_start == T0} == first_bucket
    second = [x for x in store.ledger_lines("n1") if x.period_start == T0 + H]
    assert {x.kind for x in second} == {CostKind.IDLE}  # the job is over: all idle now


def test_shared_node_splits_between_projects_and_reports_idle(store: Store) -> None:
    launch(store, "n1", T0, price=36.0, project="vision")  # launched for vision's demand
    run_job(store, "vision", 4, T0, T0 + H, node_id="n1")
    run_job(store, "nlp", 2, T0 + 15 * M, T0 + 45 * M, node_id="n1")
    terminate(store, "n1", T0 + H)
    roll_up(store, [onprem_policy(2.0)], T0 + 2 * H)

    assert rows(store, GroupKey.PROJECT, GroupKey.KIND) == [
        ("nlp", "usage", "4.50"), ("vision", "idle", "13.50"), ("vision", "usage", "18.00")]
    by_project = report(store, GroupKey.PROJECT)
    nlp, vision = by_project["rows"]
    assert (nlp["project"], nlp["cost_usd"], nlp["idle_cost_usd"]) == ("nlp", "4.50", "0.00")
    assert (vision["cost_usd"], vision["idle_cost_usd"]) == ("31.50", "13.50")
    # GPU-hours of work at the on-prem $2/GPU-h: nlp 1 GPU-h, vision 4 GPU-h.
    assert (nlp["onprem_equiv_usd"], vision["onprem_equiv_usd"]) == ("2.00", "8.00")
    assert nlp["gpu_hours"] == 1.0 and vision["gpu_hours"] == 7.0
    assert by_project["total"]["cost_usd"] == "36.00" and by_project["total"]["lines"] == 3
    jobs = report(store, GroupKey.JOB)["rows"]
    assert [r["job"] for r in jobs][0] == "-" and len(jobs) == 3


def test_egress_is_its_own_line_per_job_run_and_written_once(store: Store) -> None:
    # The pool stages 1000 GB and brings 50 GB of checkpoints back at $0.09/GB: $94.50 a run;
    # nlp's own storage stages 10 GB at $0.10/GB: $1.00.
    policy = make_policy(
        pool={"name": POOL, "onprem": {"nodes": 1, "gpus_per_node": 8}, "storage": {
            "datasets": [{"uri": "nfs://fs/a", "size_gb": 600}, {"uri": "nfs://fs/b",
                                                                  "size_gb": 400}],
            "checkpoints": "s3://ckpt/x", "checkpoint_size_gb": 50, "egress_usd_per_gb": 0.09}},
        projects=[{"name": "nlp", "storage": {"datasets": [{"uri": "s3://nlp/d", "size_gb": 10}],
                                              "egress_usd_per_gb": 0.1}}])
    launch(store, "n1", T0, price=36.0, project="vision")
    run_job(store, "vision", 4, T0 + 5 * M, T0 + 50 * M, node_id="n1")
    run_job(store, "nlp", 2, T0 + H + 5 * M, T0 + H + 20 * M, node_id="n1")
    run_job(store, "vision", 4, T0 + 10 * M, None, node_id=None)  # on-prem: moves nothing
    terminate(store, "n1", T0 + 2 * H)
    roll_up(store, [policy], T0 + 3 * H)

    egress = [(x.period_start, x.project, x.cost_micros, x.final)
              for x in store.ledger_lines("n1") if x.kind is CostKind.EGRESS]
    assert egress == [(T0, "vision", 94_500_000, True), (T0 + H, "nlp", 1_000_000, True)]
    assert roll_up(store, [policy], T0 + 3 * H).lines_written == 0  # idempotent
    assert ("vision", "egress", "94.50") in rows(store, GroupKey.PROJECT, GroupKey.KIND)
    # The node's own bill is untouched: egress comes on top of price x lived time.
    compute = sum(x.cost_micros for x in store.ledger_lines("n1") if x.kind is not CostKind.EGRESS)
    assert compute == bill(36.0, 2 * H)


def test_minimum_billing_is_charged_once_where_termination_is_confirmed(store: Store) -> None:
    launch(store, "short", T0 + 59 * M + 55 * SEC, project=None)
    terminate(store, "short", T0 + H + 5 * SEC)  # lived 10 s across the hour
    launch(store, "young", T0 + 3 * H - 20 * SEC)  # alive, 20 s old at roll-up time
    roll_up(store, [], T0 + 3 * H)
    assert rows(store, GroupKey.NODE, GroupKey.KIND, GroupKey.DAY) == [
        ("short", "idle", "2025-03-01", "0.10"), ("short", "minimum", "2025-03-01", "0.50"),
        ("young", "idle", "2025-03-01", "0.20"), ("young", "minimum", "2025-03-01", "0.40")]
    short = [x for x in store.ledger_lines("short") if x.kind is CostKind.MINIMUM]
    assert short[0].period_start == T0 + H and short[0].project == "-" and short[0].final
    young = [x for x in store.ledger_lines("young") if x.kind is CostKind.MINIMUM]
    assert not young[0].final
    # Once the young node has lived past the minimum, its provisional minimum line goes away.
    roll_up(store, [], T0 + 3 * H + 2 * M)
    assert {x.kind for x in store.ledger_lines("young")} == {CostKind.IDLE}


def test_onprem_work_and_nodes_of_unloaded_policies(store: Store) -> None:
    run_job(store, "vision", 4, T0, T0 + 90 * M)  # on-prem: 6 GPU-hours at $2
    run_job(store, "nlp", 1, T0 + H, None)  # still running: 1 GPU-h by T0 + 2h
    launch(store, "old", T0, price=10.0, policy="retired", pool="legacy", project="nlp")
    terminate(store, "old", T0 + H)
    never = make_node("never", state=S.REQUESTED, instance_id=None, state_since=T0)
    store.add_node(never, NodeEvent("never", T0, None, S.REQUESTED, "demand", {}))
    step(store, "never", S.TERMINATED, T0 + M)

    result = roll_up(store, [onprem_policy(2.0)], T0 + 2 * H)
    assert result.pools == 1 and result.nodes == 1
    assert rows(store, GroupKey.PROVIDER, GroupKey.POLICY, GroupKey.PROJECT) == [
        ("aws", "retired", "nlp", "10.00"), ("onprem", "train", "nlp", "0.00"),
        ("onprem", "train", "vision", "0.00")]
    by_kind = report(store, GroupKey.PROJECT, GroupKey.KIND)["rows"]
    onprem = {r["project"]: r["onprem_cost_usd"] for r in by_kind if r["kind"] == "onprem"}
    assert onprem == {"nlp": "2.00", "vision": "12.00"}
    assert store.ledger_lines("never") == [] and store.ledger_mark("never") == T0 + M
    assert store.ledger_candidates() == []  # both nodes done
    assert store.ledger_mark("onprem:" + POOL) == T0 + H  # the first hour closed and settled
    assert roll_up(store, [onprem_policy(2.0)], T0 + 2 * H).lines_written == 0


def test_a_pool_with_no_onprem_work_is_marked_so_later_roll_ups_read_only_new_jobs(
        store: Store) -> None:
    """A pool with an on-prem rate but no on-prem jobs in this queue (a Slurm pool): its settled
    past is marked done, so a roll-up does not read every on-prem job ever, every time."""
    policies = [onprem_policy(2.0)]
    roll_up(store, policies, T0 + 2 * H)
    assert store.ledger_mark("onprem:" + POOL) == T0 + H
    run_job(store, "nlp", 4, T0 + 2 * H, T0 + 3 * H)  # later work is still billed
    roll_up(store, policies, T0 + 4 * H)
    onprem = [x for x in store.ledger_lines("onprem:" + POOL) if x.kind is CostKind.ONPREM]
    assert sum(x.cost_micros for x in onprem) == 8_000_000  # 4 GPU-h at $2


def test_two_roll_ups_at_once_converge(store: Store) -> None:
    for i in range(6):
        launch(store, f"n{i}", T0 + i * M, price=4.1 * (i + 1))
        run_job(store, "vision", 2, T0 + i * M, T0 + 3 * H, node_id=f"n{i}")
    policies = [onprem_policy(2.0)]
    now = T0 + 3 * H
    errors: list[BaseException] = []
    barrier = threading.Barrier(3)

    def worker() -> None:
        try:
            barrier.wait()
            roll_up(store, policies, now)
        except BaseException as exc:  # noqa: BLE001 - reported below
            errors.append(exc)

    threads = [threading.Thread(target=worker) for _ in range(3)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=60)
    assert not errors, errors
    total = report(store)["total"]
    expected = sum(bill(4.1 * (i + 1), 3 * H - i * M) for i in range(6))
    assert Decimal(total["cost_usd_exact"]) == Decimal(expected) / 10**6
    assert roll_up(store, policies, now).lines_written == 0


def test_a_slower_roll_up_never_rewrites_buckets_a_newer_one_made_final(store: Store) -> None:
    """Roll-up A reads the mark (none), roll-up B finalises the first hour, then A writes: its
    stale view of the first hour must not replace B's final lines (nor clear their flag)."""
    policies = [onprem_policy(None)]
    launch(store, "n1", T0 + 10 * M, price=3.6)
    run_job(store, "nlp", 8, T0 + 20 * M, None, node_id="n1")
    roll_up(store, policies, T0 + H + SETTLE)  # B: first hour final
    final = {x.line_key: x for x in store.ledger_lines("n1") if x.period_start == T0}
    assert final and all(x.final for x in final.values())

    # A's write, computed from before B's mark: other (provisional) lines from T0 on.
    stale = [replace(x, cost_micros=x.cost_micros + 1, final=False) for x in final.values()]
    store.write_ledger("n1", stale, since=T0, mark=None, at=T0 + 40 * M)
    assert {x.line_key: x for x in store.ledger_lines("n1") if x.period_start == T0} == final
    assert store.ledger_mark("n1") == T0 + H


# -- report ----------------------------------------------------------------------------------------


def test_report_filters_and_formats(store: Store) -> None:
    launch(store, "a", DAY0 - 2 * H, price=1.0, project="vision", pool="gpu")
    terminate(store, "a", DAY0 + H)  # 3 hours over two days
    launch(store, "b", DAY0, price=2.0, project="nlp", pool="big", market="spot")
    terminate(store, "b", DAY0 + H)
    roll_up(store, [], DAY0 + 2 * H)

    assert rows(store, GroupKey.DAY) == [("2025-02-28", "2.00"), ("2025-03-01", "3.00")]
    assert rows(store, GroupKey.PROJECT, projects=frozenset({"nlp"})) == [("nlp", "2.00")]
    assert rows(store, GroupKey.PROJECT, projects=frozenset()) == []
    assert rows(store, GroupKey.MARKET, pool="big") == [("spot", "2.00")]
    assert rows(store, GroupKey.PROJECT, since=DAY0) == [("nlp", "2.00"), ("vision", "1.00")]
    assert rows(store, GroupKey.PROJECT, until=DAY0) == [("vision", "2.00")]

    result = cost_report(store, CostQuery(since=DAY0 - 3 * H, until=DAY0 + 3 * H,
                                          group_by=(GroupKey.PROJECT, GroupKey.INSTANCE_TYPE)))
    data = result.as_json()
    assert (data["from"], data["to"], data["group_by"], data["currency"]) == (
        "2025-02-28T21:00:00Z", "2025-03-01T03:00:00Z", ["project", "instance_type"], "USD")
    assert data["rows"][0] == {
        "project": "nlp", "instance_type": "g8", "cost_usd": "2.00", "cost_usd_exact": "2.000000",
        "idle_cost_usd": "2.00", "onprem_cost_usd": "0.00", "onprem_equiv_usd": "0.00",
        "gpu_hours": 8.0, "instance_hours": 1.0, "lines": 1}
    assert data["total"]["cost_usd"] == "5.00" and "project" not in data["total"]
    parsed = list(csv.reader(io.StringIO(result.as_csv())))
    assert parsed[0] == ["project", "instance_type", "cost_usd", "cost_usd_exact",
                         "idle_cost_usd", "onprem_cost_usd", "onprem_equiv_usd", "gpu_hours",
                         "instance_hours", "lines"]
    assert parsed[1][:3] == ["nlp", "g8", "2.00"] and len(parsed) == 3

    empty = cost_report(store, CostQuery(since=DAY0 + 9 * H))
    assert empty.rows == () and empty.total.cost_usd == Decimal("0.00") and empty.total.lines == 0


def test_parse_group_by_and_query_checks() -> None:
    assert parse_group_by("project, day") == (GroupKey.PROJECT, GroupKey.DAY)
    with pytest.raises(ValueError, match=r"unknown key\(s\) 'colour'; choose from project, pool"):
        parse_group_by("project,colour")
    for bad, text in [("", "needs one or more"), ("project,,day", "needs one or more"),
                      ("day,day", "twice")]:
        with pytest.raises(ValueError, match=text):
            parse_group_by(bad)
    with pytest.raises(ValueError, match="since"):
        CostQuery(since=T0, until=T0)
    with pytest.raises(ValueError, match="timezone"):
        CostQuery(since=T0.replace(tzinfo=None))


def test_cents_are_allocated_by_largest_remainder() -> None:
    # Three rows of 1/3 cent... each: floors 0, the total rounds to 1 cent, given to the first.
    assert allocate_cents([3_333, 3_333, 3_334], 10_000) == [Decimal("0.00"), Decimal("0.00"),
                                                             Decimal("0.01")]
    assert allocate_cents([5_000, 5_000], 10_000) == [Decimal("0.01"), Decimal("0.00")]
    assert allocate_cents([], 0) == []


@pytest.mark.parametrize("seed", [1, 2, 3])
def test_every_grouping_adds_up_to_the_total_on_generated_histories(store: Store,
                                                                    seed: int) -> None:
    rng = random.Random(seed)
    now = T0 + 3 * 24 * H
    expected = 0
    projects = ["vision", "nlp", "speech", None]
    for i in range(14):
        launched = now - timedelta(seconds=rng.uniform(30, 3 * 86_400))
        life = timedelta(seconds=rng.choice([rng.uniform(2, 59), rng.uniform(60, 30 * 3600)]))
        ended = None if rng.random() < 0.3 else min(launched + life, now)
        price = rng.choice([4.1, 32.77, 0.35, 12.0, 98.32])
        gpus = rng.choice([1, 4, 8])
        launch(store, f"g{i}", launched, price=price, gpus=gpus, project=rng.choice(projects),
               policy=rng.choice(["train", "retired"]), pool=rng.choice([POOL, "other"]),
               instance_type=rng.choice(["g4", "g8", "p5"]), provider=rng.choice(["aws", "gcp"]),
               market=rng.choice(["spot", "on-demand"]))
        for _ in range(rng.randint(0, 3)):  # jobs sharing the node (sometimes oversubscribed)
            start = launched + timedelta(seconds=rng.uniform(0, 3600))
            end = start + timedelta(seconds=rng.uniform(60, 20 * 3600))
            if start < now:
                run_job(store, rng.choice(projects[:3]), rng.choice([1, 2, 4]), start,
                        end if end < now and rng.random() < 0.8 else None, node_id=f"g{i}")
        if ended is not None:
            terminate(store, f"g{i}", ended)
        expected += bill(price, (ended or now) - launched)
    for _ in range(5):
        start = now - timedelta(seconds=rng.uniform(60, 2 * 86_400))
        run_job(store, rng.choice(projects[:3]), rng.choice([1, 8]), start,
                start + timedelta(seconds=rng.uniform(60, 86_400)) if rng.random() < 0.7 else None)

    policies = [onprem_policy(rng.choice([1.0, 2.35]))]
    roll_up(store, policies, now - 2 * H)  # an earlier roll-up: the later one continues from it
    roll_up(store, policies, now)
    assert roll_up(store, policies, now).lines_written == 0

    keys = list(GroupKey)
    groupings = [(k,) for k in keys] + [tuple(keys)] + [
        tuple(rng.sample(keys, rng.randint(2, 5))) for _ in range(6)]
    totals = set()
    for group_by in groupings:
        result = cost_report(store, CostQuery(group_by=group_by))
        total = result.total
        for column in ("cost_usd", "idle_cost_usd", "onprem_cost_usd", "onprem_equiv_usd"):
            column_sum = sum((getattr(r, column) for r in result.rows), Decimal(0))
            assert column_sum == getattr(total, column)
        assert sum((r.cost_usd_exact for r in result.rows), Decimal(0)) == total.cost_usd_exact
        assert total.cost_usd == total.cost_usd_exact.quantize(Decimal("0.01"))
        assert sum(r.lines for r in result.rows) == total.lines
        totals.add((total.cost_usd_exact, total.onprem_cost_usd, total.onprem_equiv_usd))
    assert len(totals) == 1  # every grouping, the same total
    assert next(iter(totals))[0] == Decimal(expected) / 10**6  # each node billed exactly
    # Windows that partition time add up to the whole.
    cut = now - timedelta(days=1, hours=5)
    halves = [cost_report(store, CostQuery(until=cut)), cost_report(store, CostQuery(since=cut))]
    assert sum(h.total.cost_usd_exact for h in halves) == Decimal(expected) / 10**6


# -- spend for budgets -----------------------------------------------------------------------------


def test_spend_counts_the_ledger_and_what_it_has_not_reached(store: Store) -> None:
    launch(store, "done", T0 - 2 * H, price=10.0, project="vision")
    terminate(store, "done", T0 - H)
    launch(store, "live", T0 - 30 * M, price=36.0, project="nlp", pool="big")
    window = {"since": T0 - 24 * H, "until": T0 + 24 * H}
    # Nothing rolled up yet: all of it is accrual.
    assert spend(store, now=T0, **window) == Decimal("28")  # $10 + 30 min of $36
    roll_up(store, [], T0)
    assert spend(store, now=T0, **window) == Decimal("28")
    # The roll-up lags 10 minutes behind: the live node's last 10 minutes are accrued.
    later = T0 + 10 * M
    assert spend(store, now=later, **window) == Decimal("34")
    roll_up(store, [], later)
    assert spend(store, now=later, **window) == Decimal("34")
    assert spend(store, now=later, project="vision", **window) == Decimal("10")
    assert spend(store, now=later, pool="big", **window) == Decimal("24")
    assert spend(store, now=later, since=T0 - H, until=T0 + 24 * H) == Decimal("24")
    # A node launched a second ago already counts its one-minute minimum.
    launch(store, "new", later - SEC, price=36.0, project="nlp")
    assert spend(store, now=later, project="nlp", **window) == Decimal("24.6")
    with pytest.raises(ValueError, match="before until"):
        spend(store, since=T0, until=T0, now=T0)

    assert burn_rate_usd_hour(store) == Decimal("72")
    assert burn_rate_usd_hour(store, pool="big") == Decimal("36")
    assert burn_rate_usd_hour(store, project="vision") == Decimal("0")


# -- the tick rolls up before it observes ----------------------------------------------------------


def test_embedded_tick_and_evaluate_roll_up_before_observing(store: Store, tmp_path) -> None:
    from orchestrator.automation import operations as ops
    from orchestrator.loop import ControlLoop
    from tests.builders import make_rig
    from tests.integration.test_pool_operations import runtime_of

    rig = make_rig(store)
    rt = runtime_of(rig, tmp_path)
    launch(store, "gone", T0 - 2 * H, price=10.0)
    terminate(store, "gone", T0 - H)
    loop = ControlLoop(rt, 1.0)
    loop.tick()
    loop.close()  # stopped: its leases are free for the evaluation
    assert [x.cost_micros for x in store.ledger_lines("gone")] == [10_000_000]

    launch(store, "later", T0 - H, price=3.6)
    terminate(store, "later", T0 - 30 * M)
    ops.evaluate(rt, rig.policy.name)
    assert sum(x.cost_micros for x in store.ledger_lines("later")) == 1_800_000
