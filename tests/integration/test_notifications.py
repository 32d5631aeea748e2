"""Budget and fleet notifications end to end against a real local HTTP receiver
(tests/webhook_receiver.py) on a real store: sent once per (subject, window, grade) across checks
and a restart, JSON and Slack bodies, the webhook URL a secret (environment or file, never
stored), targets that are down, slow and answering 500 never holding a tick, the embedded sender's
retries, and the Celery task's retries with backoff.
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml

from orchestrator.domain import NodeState
from orchestrator.loop import ControlLoop
from orchestrator.notify.sender import NotificationSender
from orchestrator.notify.watch import check, events_due
from orchestrator.policy import Policy
from orchestrator.store import Store
from orchestrator.store.notices import EVENT_RECORD, NoticeState
from tests.builders import make_policy, make_rig, offering_of
from tests.integration.api_support import add_node, runtime_of
from tests.webhook_receiver import Receiver, closed_port

S = NodeState
FAST_POLICY = Path(__file__).resolve().parents[1] / "e2e" / "fast-policy.yaml"


@pytest.fixture(scope="module")
def receiver() -> Iterator[Receiver]:
    server = Receiver().start()
    yield server
    server.stop()


@pytest.fixture(autouse=True)
def _fresh(receiver: Receiver) -> None:
    receiver.reset()


def targets(*specs: dict) -> dict:
    return {"notifications": {"targets": list(specs)}}


def budget_policy(hook_file: Path) -> Policy:
    return make_policy(
        budgets=[{"name": "day", "project": "research", "window": "day", "limit_usd": 100}],
        **targets({"name": "ops-json", "url_env": "BURST_TEST_HOOK"},
                  {"name": "ops-slack", "format": "slack", "url_file": str(hook_file)}))


def wait_until(condition, timeout: float = 60.0) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, "condition not met in time"
        time.sleep(0.05)


def test_budget_notifications_are_sent_once_with_both_bodies(
        store: Store, receiver: Receiver, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
        caplog: pytest.LogCaptureFixture) -> None:
    # Every level captured, whatever an earlier test left the root at: the check below that no
    # log line holds the URL must see the lines.
    caplog.set_level(logging.DEBUG)
    hook_file = tmp_path / "slack-url"
    hook_file.write_text(receiver.url("/ok/slack") + "\n")
    monkeypatch.setenv("BURST_TEST_HOOK", receiver.url("/ok/json"))
    policy = budget_policy(hook_file)
    rig = make_rig(store, policy=policy)
    add_node(rig, 1, "research", S.BOOTING, S.JOINING, S.READY)  # $10/h from 12:00
    rig.clock.advance(hours=9)  # 21:00: $90 of $100 spent, $10/h for the last hour

    kinds = {(e.key.event, e.key.grade) for e in events_due(store, [policy], rig.now)}
    assert {("budget-grade", "warn"), ("budget-grade", "spot-only"),
            ("budget-forecast", "forecast")} <= kinds
    claimed = check(store, [policy], rig.now)
    assert len(claimed) == 2 * len(kinds)  # one row per target per event
    sender = NotificationSender(store, [policy], rig.clock.now).start()
    try:
        sender.submit(claimed)
        got = receiver.wait_for(lambda r: len(r) == len(claimed))
        wait_until(sender.idle)
    finally:
        sender.stop()
    json_bodies = [r.body for r in got if r.path == "/ok/json"]
    slack_bodies = [r.body for r in got if r.path == "/ok/slack"]
    assert len(json_bodies) == len(slack_bodies) == len(kinds)
    assert all(r.content_type.startswith("application/json") for r in got)
    forecast = next(b for b in json_bodies if b["event"] == "budget-forecast")
    assert forecast["subject"] == "budget:train/day" and forecast["policy"] == "train"
    assert ("reaches its limit of $100.00 on 2025-03-01 22:00 UTC" in forecast["text"]
            and "burn of the last hour ($10.00/h)" in forecast["text"]), forecast["text"]
    assert forecast["details"]["reaches_limit_at"] == "2025-03-01T22:00:00Z"
    assert all(set(b) == {"text", "blocks"} for b in slack_bodies)
    assert any("reached warn" in b["text"] for b in slack_bodies)

    # Checked again (a second beat) and after a restart: nothing new claimed, nothing resent.
    assert check(store, [policy], rig.now) == []
    rig.clock.advance(minutes=5)
    assert check(store, [policy], rig.now) == []
    again = NotificationSender(store, [policy], rig.clock.now).start()
    try:
        assert again.idle()
    finally:
        again.stop()
    assert len(receiver.received) == len(claimed)
    rows = store.notices()
    assert {n.state for n in rows if n.target != EVENT_RECORD} == {NoticeState.SENT}
    assert {n.state for n in rows if n.target == EVENT_RECORD} == {NoticeState.RECORDED}
    # The URL is a secret: in no row, no log line.
    for n in rows:
        assert str(receiver.port) not in json.dumps([n.title, n.text, n.details, n.last_error])
    assert str(receiver.port) not in caplog.text
    # Each grade reached is a crossing on /metrics (the events' own records count them).
    from orchestrator.api.metrics import registry_for

    metrics = registry_for(runtime_of(rig, tmp_path))
    for grade in ("warn", "spot-only"):
        assert metrics.get_sample_value("burst_budget_grade_crossings_total", {
            "policy": "train", "budget": "day", "grade": grade}) == 1


def test_failing_targets_never_hold_a_tick_and_are_retried(
        store: Store, receiver: Receiver, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    down = f"http://127.0.0.1:{closed_port()}/down"
    for name, url in {"HOLD": receiver.url("/hold/slow"), "FAIL": receiver.url("/fail/500"),
                      "DOWN": down, "FLAKY": receiver.url("/flaky/1/x"),
                      "QUICK": receiver.url("/ok/quick")}.items():
        monkeypatch.setenv(f"BURST_TEST_{name}", url)
    policy = make_policy(**targets(
        {"name": "slow", "url_env": "BURST_TEST_HOLD", "timeout": "1m"},
        {"name": "broken", "url_env": "BURST_TEST_FAIL"},
        {"name": "down", "url_env": "BURST_TEST_DOWN", "timeout": "2s"},
        {"name": "flaky", "url_env": "BURST_TEST_FLAKY"},
        {"name": "quick", "url_env": "BURST_TEST_QUICK", "events": ["budget-grade"]},
        {"name": "unset", "url_env": "BURST_TEST_NOT_SET"}))
    rig = make_rig(store, policy=policy)
    rig.provider.capacity_keys.add(offering_of(policy).key)
    for n in range(1, 4):  # three launches of the offering refused
        rig.executor.run([rig.launch_action(n)])
    loop = ControlLoop(runtime_of(rig, tmp_path), 1.0)
    loop.notifier = NotificationSender(store, [policy], rig.clock.now, max_attempts=3,
                                       backoff_s=0.05).start()
    try:
        loop.tick()
        # The slow target holds the sender's first request; ticks go on regardless.
        receiver.wait_for(lambda r: any(x.path == "/hold/slow" for x in r))
        rig.clock.advance(seconds=5)
        loop.tick()
        [slow] = store.notices(target="slow")
        assert slow.state is NoticeState.PENDING and slow.attempts == 0
        receiver.release()
        wait_until(lambda: all(n.state is not NoticeState.PENDING for n in store.notices()
                               if n.target != EVENT_RECORD))
    finally:
        loop.close()
    rows = {n.target: n for n in store.notices() if n.target != EVENT_RECORD}
    assert set(rows) == {"slow", "broken", "down", "flaky", "unset"}  # quick: not its event
    assert all(n.key.event == "launch-failures" for n in rows.values())
    assert rows["slow"].state is NoticeState.SENT and rows["slow"].attempts == 1
    assert rows["flaky"].state is NoticeState.SENT and rows["flaky"].attempts == 2
    for name, why in {"broken": "answered HTTP 500", "down": "ConnectError",
                      "unset": "environment variable BURST_TEST_NOT_SET is not set"}.items():
        assert rows[name].state is NoticeState.FAILED and rows[name].attempts == 3, rows[name]
        assert why in (rows[name].last_error or ""), rows[name]
        assert down not in (rows[name].last_error or "")
    assert len([r for r in receiver.received if r.path == "/fail/500"]) == 3


def test_celery_send_task_retries_with_backoff_until_delivered(
        receiver: Receiver, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """``burst.notify.send`` run by Celery (eagerly, so its retries run in this process)."""
    from orchestrator.automation import runtime as worker_runtime
    from orchestrator.automation.app import app  # noqa: F401 - the app the tasks run in
    from orchestrator.automation.tasks import send_notification
    from orchestrator.store.notices import NoticeKey

    spec = yaml.safe_load(FAST_POLICY.read_text())
    spec["notifications"] = {"targets": [
        {"name": "flaky", "url_env": "BURST_TEST_FLAKY"},
        {"name": "broken", "url_env": "BURST_TEST_FAIL"}]}
    policy_file = tmp_path / "fast.yaml"
    policy_file.write_text(yaml.safe_dump(spec))
    url = f"sqlite:///{tmp_path / 'burst.db'}"
    with Store(url) as s:
        s.upgrade()
    for name, value in {"BURST_STATE_DIR": str(tmp_path), "BURST_DATABASE_URL": url,
                        "BURST_POLICY_FILES": json.dumps([str(policy_file)]),
                        "BURST_SECRET_KEY": "k" * 32,
                        "BURST_TEST_FLAKY": receiver.url("/flaky/2/celery"),
                        "BURST_TEST_FAIL": receiver.url("/fail/celery")}.items():
        monkeypatch.setenv(name, value)
    worker_runtime.runtime.cache_clear()
    try:
        rt = worker_runtime.runtime()
        key = NoticeKey("stuck-node", "node:n1", "booting@x", "stuck", "fast")
        ids = {name: rt.store.claim_notice(name, key, title="t", text="x", details={},
                                           at=rt.clock.now()) for name in ("flaky", "broken")}
        done = send_notification.apply(args=(ids["flaky"],))
        assert done.successful() and done.result["sent"] is True
        assert rt.store.notice(ids["flaky"]).attempts == 3  # 500, 500, then 200
        failed = send_notification.apply(args=(ids["broken"],))
        assert not failed.successful()
        row = rt.store.notice(ids["broken"])
        assert row.state is NoticeState.FAILED and row.attempts == 7  # first try + 6 retries
        assert send_notification.retry_backoff == 2 and send_notification.max_retries == 6
        rt.close()
    finally:
        worker_runtime.runtime.cache_clear()


def test_targets_without_a_url_source_are_refused() -> None:
    from orchestrator.policy import PolicyError, load_policy_text

    text = yaml.safe_dump({**yaml.safe_load(FAST_POLICY.read_text()),
                           "notifications": {"targets": [{"name": "x"}]}})
    with pytest.raises(PolicyError) as refused:
        load_policy_text(text, "p.yaml")
    assert "notifications.targets[0].url_env" in str(refused.value)
    assert "exactly one of url_env and url_file" in str(refused.value)

