"""Operator operations on a real store (SQLite and PostgreSQL): pause, resume, pre-warm, drain,
evaluate and the spend report, through the same functions the public tasks and the CLI call.

Pool controls must be persisted and reach the planner through the Observer's snapshot; a drained
pool must stay drained (paused); spend rows must add up to the total exactly, to the cent, on
generated node histories, with the billing minimum applied once per instance.
"""

from __future__ import annotations

import json
import random
from datetime import UTC, datetime, timedelta
from decimal import Decimal
from fractions import Fraction
from pathlib import Path

import pytest
import typer
from typer.testing import CliRunner

from orchestrator.automation import operations as ops
from orchestrator.domain import NodeState, Rule
from orchestrator.domain.snapshot import PrewarmRequest
from orchestrator.lifecycle import NodeEvent, transition
from orchestrator.observe import Observer
from orchestrator.planner import plan
from orchestrator.store import Store
from orchestrator.wiring import Runtime, Settings
from tests.builders import POOL, T0, Rig, make_node, make_offering

S = NodeState
M = timedelta(minutes=1)
ROOT = Path(__file__).resolve().parents[2]
FAST_POLICY = ROOT / "tests" / "e2e" / "fast-policy.yaml"


def runtime_of(rig: Rig, tmp_path: Path) -> Runtime:
    providers = {rig.provider.name: rig.provider}
    return Runtime(
        settings=Settings(state_dir=tmp_path / "state"), store=rig.store,
        policies={rig.policy.name: rig.policy}, providers=providers, queue=rig.queue,
        fabric=rig.fabric, tokens=rig.tokens, clock=rig.clock, executor=rig.executor,
        reconciler=rig.reconciler, observer=Observer(rig.store, rig.queue, providers),
    )


def ready_node(rig: Rig, n: int) -> str:
    rig.executor.run([rig.launch_action(n)])
    rig.move(f"n{n}", S.BOOTING, S.JOINING, S.READY)
    return f"n{n}"


def tick(rt: Runtime):
    now = rt.clock.now()
    return plan(rt.observer.snapshot(now), rt.policies.values(), now)


# -- pause / resume ---------------------------------------------------------------------------------


def test_pause_and_resume_persist_and_reach_the_snapshot(rig: Rig, rt: Runtime) -> None:
    rt.store.submit_job("research", POOL, 8, 0, 600.0, None, T0 - 10 * M)
    result = ops.pause(rt, POOL, "quota review")
    assert result == {"pool": POOL, "paused": True, "was_paused": False, "reason": "quota review",
                      "paused_at": "2025-03-01T12:00:00Z"}
    assert rt.observer.snapshot(rig.now).paused_pools == frozenset({POOL})
    paused = tick(rt)
    assert paused.decisions[0].rule is Rule.PAUSED and paused.launches == []

    rig.clock.advance(minutes=5)
    again = ops.pause(rt, POOL, "still")
    assert again["was_paused"] and again["paused_at"] == "2025-03-01T12:00:00Z"  # since when kept
    assert rt.store.pool_control(POOL).paused_reason == "still"

    assert ops.resume(rt, POOL) == {"pool": POOL, "paused": False, "was_paused": True,
                                    "paused_since": "2025-03-01T12:00:00Z"}
    assert rt.observer.snapshot(rig.now).paused_pools == frozenset()
    resumed = tick(rt)
    assert resumed.decisions[0].rule is Rule.SCALE_UP and len(resumed.launches) == 1
    assert ops.resume(rt, POOL)["was_paused"] is False  # idempotent


@pytest.mark.parametrize("call, argument", [
    (lambda rt: ops.pause(rt, "cpu"), "pool"),
    (lambda rt: ops.resume(rt, "cpu"), "pool"),
    (lambda rt: ops.drain_pool(rt, "cpu"), "pool"),
    (lambda rt: ops.prewarm(rt, "cpu", 8, T0 + M), "pool"),
    (lambda rt: ops.prewarm(rt, POOL, 0, T0 + M), "gpus"),
    (lambda rt: ops.prewarm(rt, POOL, 8, T0), "until"),
    (lambda rt: ops.prewarm(rt, POOL, 8, T0 - M), "until"),
    (lambda rt: ops.evaluate(rt, "nope"), "policy"),
    (lambda rt: ops.spend_report(rt, since=T0, until=T0 - M), "since"),
    (lambda rt: ops.spend_report(rt, group_by=["project", "colour"]), "group_by"),
])
def test_operations_refuse_bad_arguments_naming_them(rt: Runtime, call, argument: str) -> None:
    with pytest.raises(ops.InvalidArgument) as info:
        call(rt)
    assert info.value.argument == argument
    assert str(info.value).startswith(f"{argument}: ")
    assert rt.store.pool_controls() == {}  # nothing written


# -- pre-warm ------------------------------------------------------------------------------------


def test_prewarm_persists_reaches_the_snapshot_and_expires(rig: Rig, rt: Runtime) -> None:
    until = T0 + timedelta(hours=1)
    result = ops.prewarm(rt, POOL, 16, until)
    assert result["gpus"] == 16 and result["until"] == "2025-03-01T13:00:00Z"
    assert result["have_gpus"] == 0 and result["paused"] is False
    assert rt.store.pool_control(POOL).prewarm_gpus == 16
    assert rt.observer.snapshot(rig.now).prewarm == {POOL: PrewarmRequest(16, until)}

    # Evaluated now (embedded sequence): two 8-GPU nodes launched for the floor.
    outcome = ops.evaluate(rt, rig.policy.name)
    assert outcome["decision"]["rule"] == "prewarm" and outcome["launch"] == 2
    assert "pre-warming 16 GPUs until 2025-03-01T13:00:00Z" in outcome["decision"]["summary"]
    nodes = rt.store.nodes()
    assert len(nodes) == 2 and all(n.state is S.LAUNCHING and n.project is None for n in nodes)
    assert {e.reason for n in nodes for e in rt.store.events(n.id)} >= {"prewarm"}
    # Planned again, the floor is met by the nodes in flight: nothing more (no flap).
    rig.clock.advance(seconds=30)
    assert ops.evaluate(rt, rig.policy.name)["launch"] == 0

    rig.clock.at = until
    assert rt.observer.snapshot(rig.now).prewarm == {}  # expired: no longer in force
    rt.store.clear_prewarm(POOL, rig.now)
    assert rt.store.pool_control(POOL).prewarm_gpus is None


def test_prewarm_of_a_paused_pool_says_it_waits(rt: Runtime) -> None:
    ops.pause(rt, POOL)
    result = ops.prewarm(rt, POOL, 8, T0 + timedelta(hours=1))
    assert result["paused"] and "paused" in result["note"]
    assert ops.evaluate(rt, "train")["launch"] == 0


# -- drain -----------------------------------------------------------------------------------------


def test_drain_pool_drains_ready_nodes_and_pauses(rig: Rig, rt: Runtime) -> None:
    a, b = ready_node(rig, 1), ready_node(rig, 2)
    rig.executor.run([rig.launch_action(3)])  # still launching
    ops.prewarm(rt, POOL, 16, T0 + timedelta(hours=2))
    rt.store.submit_job("research", POOL, 8, 0, 600.0, None, T0 - 10 * M)

    result = ops.drain_pool(rt, POOL, "maintenance")
    assert sorted(result["drained"]) == [a, b] and result["starting"] == ["n3"]
    assert result["deadline"] == "2025-03-01T12:15:00Z"  # now + drain_grace (15m)
    assert result["paused"] and result["prewarm_cleared"] and "paused" in result["note"]
    for node_id in (a, b):
        node = rig.node(node_id)
        assert node.state is S.DRAINING and node.drain_deadline == T0 + 15 * M
        assert rt.store.events(node_id)[-1].reason == "operator"
    control = rt.store.pool_control(POOL)
    assert control.paused and control.paused_reason == "drained: maintenance"
    assert control.prewarm_gpus is None

    # The planner does not launch again despite the pending job, and still finishes drains.
    rig.move(a, released=True)
    after = tick(rt)
    assert after.decisions[0].rule is Rule.PAUSED and after.launches == []
    assert [t.node_id for t in after.terminates] == [a]
    # Draining again is harmless.
    assert ops.drain_pool(rt, POOL)["drained"] == []


# -- spend -----------------------------------------------------------------------------------------


def record_life(store: Store, node_id: str, launched: datetime, ended: datetime | None, *,
                price: float = 10.0, gpus: int = 8, instance_type: str = "g8",
                provider: str = "aws", project: str | None = "research", pool: str = POOL) -> None:
    """A node launched at ``launched`` and confirmed terminated at ``ended`` (None: alive)."""
    offering = make_offering(instance_type, gpus=gpus, price=price, provider=provider)
    requested_at = launched - timedelta(seconds=3)
    node = make_node(node_id, state=S.REQUESTED, offering=offering, project=project, pool=pool,
                     state_since=requested_at, instance_id=None)
    assert store.add_node(node, NodeEvent(node_id, requested_at, None, S.REQUESTED, "demand", {}))
    steps = [(S.LAUNCHING, launched), (S.BOOTING, launched + timedelta(seconds=1))]
    if ended is not None:
        steps += [(S.TERMINATING, ended - timedelta(seconds=1)), (S.TERMINATED, ended)]
    for state, at in steps:
        at = max(at, launched)  # a very short life: the intermediate steps share the launch instant
        new, event = transition(node, state, at=at, reason="test")
        assert store.save_transition(node, new, event)
        node = new


def expected_cost(launched: datetime, ended: datetime, price: float) -> Fraction:
    """The exact bill of one instance (per second, one-minute minimum)."""
    seconds = Fraction((ended - launched) // timedelta(microseconds=1), 1_000_000)
    billed = max(seconds, Fraction(60))
    billed = Fraction(-(-billed.numerator // billed.denominator))  # up to the whole second
    return billed * Fraction(str(price)) / 3600


def totals(report: dict) -> tuple[Decimal, Decimal]:
    return Decimal(report["total"]["cost_usd"]), Decimal(report["total"]["cost_usd_exact"])


def test_spend_billing_minimum_and_rounding(rig: Rig, rt: Runtime) -> None:
    now = T0
    record_life(rt.store, "short", now - 5 * M, now - 5 * M + timedelta(seconds=10), price=36)
    record_life(rt.store, "odd", now - 4 * M, now - 4 * M + timedelta(seconds=61.5), price=36)
    record_life(rt.store, "alive", now - timedelta(seconds=20), None, price=36)
    # Never launched: requested, then failed: costs nothing.
    node = make_node("never", state=S.REQUESTED, instance_id=None, state_since=now - M)
    rt.store.add_node(node, NodeEvent("never", now - M, None, S.REQUESTED, "demand", {}))
    failed, event = transition(node, S.FAILED, at=now - M, reason="capacity")
    rt.store.save_transition(node, failed, event)

    report = ops.spend_report(rt, group_by=["instance_type"])
    assert report["total"]["nodes"] == 3
    # 60 s + 62 s + 60 s at $36/h = $0.60 + $0.62 + $0.60
    assert totals(report) == (Decimal("1.82"), Decimal("1.820000"))
    assert report["rows"] == [{"instance_type": "g8", "nodes": 3, "instance_hours": 0.0506,
                               "gpu_hours": 0.4044, "cost_usd": "1.82",
                               "cost_usd_exact": "1.820000"}]


def test_spend_splits_days_and_windows(rig: Rig, rt: Runtime) -> None:
    start = datetime(2025, 2, 27, 23, 0, tzinfo=UTC)
    record_life(rt.store, "night", start, start + timedelta(hours=2), price=10)
    by_day = ops.spend_report(rt, group_by="day")
    assert [(r["day"], r["cost_usd"]) for r in by_day["rows"]] == [
        ("2025-02-27", "10.00"), ("2025-02-28", "10.00")]
    window = ops.spend_report(rt, since=start + timedelta(minutes=30),
                              until=start + timedelta(minutes=90))
    assert totals(window)[1] == Decimal("10.000000")


@pytest.mark.parametrize("seed", [1, 2, 3])
def test_spend_rows_add_up_to_the_total_on_generated_histories(rig: Rig, rt: Runtime,
                                                               seed: int) -> None:
    rng = random.Random(seed)
    now = rig.now
    expected = Fraction(0)
    for i in range(24):
        launched = now - timedelta(seconds=rng.uniform(30, 3 * 86_400))
        alive = rng.random() < 0.3
        life = timedelta(seconds=rng.choice([rng.uniform(2, 59), rng.uniform(60, 40 * 3600)]))
        ended = None if alive else min(launched + life, now)
        price = rng.choice([4.1, 32.77, 0.35, 12.0, 98.32])
        record_life(rt.store, f"g{i}", launched, ended, price=price, gpus=rng.choice([1, 4, 8]),
                    instance_type=rng.choice(["g4", "g8", "p5"]),
                    provider=rng.choice(["aws", "gcp"]), project=rng.choice(["a", "b", None]),
                    pool=rng.choice([POOL, "other"]))
        expected += expected_cost(launched, ended or now, price)

    reports = [ops.spend_report(rt, group_by=g) for g in (
        "project", "provider", "instance_type,pool", "day", "project,provider,instance_type,pool,day")]
    for report in reports:
        cents, exact = totals(report)
        assert sum(Decimal(r["cost_usd"]) for r in report["rows"]) == cents
        assert sum(Decimal(r["cost_usd_exact"]) for r in report["rows"]) == exact
        assert cents == exact.quantize(Decimal("0.01"))
        assert abs(Fraction(exact) - expected) <= Fraction(len(report["rows"]) + 100, 10**6)
        assert report["total"]["nodes"] == 24
    assert len({totals(r)[1] for r in reports}) == 1  # every grouping, the same total
    # Windows that partition time add up to the whole (billing extras counted once).
    cut = now - timedelta(days=1, hours=5)
    halves = [ops.spend_report(rt, until=cut), ops.spend_report(rt, since=cut)]
    whole = totals(reports[0])[1]
    assert abs(sum(totals(h)[1] for h in halves) - whole) <= Decimal("0.0001")


# -- the commands ----------------------------------------------------------------------------------


def test_pool_commands_validate_and_act(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from orchestrator.cli.pool_cmd import pool_app
    from orchestrator.cli.report_cmd import report_command

    monkeypatch.setenv("BURST_STATE_DIR", str(tmp_path / "state"))
    monkeypatch.delenv("BURST_DATABASE_URL", raising=False)
    monkeypatch.setenv("BURST_POLICY_FILES", json.dumps([str(FAST_POLICY)]))
    app = typer.Typer()
    app.add_typer(pool_app, name="pool")
    app.command("spend")(report_command)
    runner = CliRunner()

    def run(*args: str):
        return runner.invoke(app, list(args), catch_exceptions=False)

    ok = run("pool", "pause", "gpu", "--reason", "budget", "--json")
    assert ok.exit_code == 0, ok.output
    assert json.loads(ok.output)["paused"] is True
    assert "resumed" in run("pool", "resume", "gpu").output
    warm = run("pool", "prewarm", "gpu", "--gpus", "8", "--until", "2999-01-01T00:00:00Z")
    assert warm.exit_code == 0 and "pre-warming 8 GPUs" in warm.output
    assert run("pool", "drain", "gpu").exit_code == 0
    spend = run("spend", "--group-by", "project,provider", "--json")
    assert spend.exit_code == 0 and json.loads(spend.output)["total"]["cost_usd"] in ("0", "0.00")
    assert "total" in run("spend").output

    for args, text in [
        (("pool", "prewarm", "gpu", "--gpus", "0", "--until", "2999-01-01T00:00:00Z"), "--gpus:"),
        (("pool", "prewarm", "gpu", "--gpus", "8", "--until", "2020-01-01T00:00:00Z"), "--until:"),
        (("pool", "prewarm", "gpu", "--gpus", "8", "--until", "2999-01-01T00:00:00"), "timezone"),
        (("pool", "pause", "cpu"), "pool: no running policy bursts a pool named 'cpu'"),
        (("spend", "--group-by", "colour"), "--group-by:"),
        (("spend", "--since", "yesterday"), "--from:"),  # spend is report: --since is --from
    ]:
        result = run(*args)
        assert result.exit_code == 2, (args, result.output)
        assert text in result.output, result.output
        assert "Traceback" not in result.output
