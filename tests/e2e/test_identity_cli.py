"""Users from the CLI on a real store (SQLite and PostgreSQL): `burst submit` records the OS user
or ``--user``, `burst status` shows it, `burst token create --user` makes a token whose jobs are
that user's (over the API it governs), and `burst report` groups and filters by user, naming the
bucket of no user or no project as such in tables and leaving it null in JSON."""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta

import pytest

from orchestrator.costs.ledger import roll_up
from orchestrator.store import Store
from orchestrator.store.jobruns import JobRun, RunSource, slurm_run_key
from orchestrator.wiring import Runtime
from tests.builders import POOL
from tests.e2e.test_token_cli import rt, run  # noqa: F401 (rt: fixture)
from tests.integration.api_support import bearer, served
from tests.integration.test_job_runs import ready
from tests.integration.test_ledger import onprem_policy

H = timedelta(hours=1)


@pytest.fixture(autouse=True)
def os_user(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("LOGNAME", "grace")  # who getpass says runs burst


def submit(*extra: str):
    return run("submit", "--project", "research", "--gpus", "1", "--duration", "10m", *extra)


def test_submit_records_the_os_user_or_the_one_named(rt: Runtime) -> None:
    [mine] = json.loads(submit("--json").stdout)
    assert mine["user"] == "grace" and rt.store.get_job(mine["id"]).user == "grace"
    [theirs] = json.loads(submit("--user", "ada@example.org", "--json").stdout)
    assert theirs["user"] == "ada@example.org"
    assert "for research (grace)" in submit().stdout

    bad = submit("--user", "has space")
    assert bad.exit_code == 2 and "--user:" in bad.stderr and "not a user name" in bad.stderr
    assert "Traceback" not in bad.output
    assert len(rt.store.jobs()) == 3  # the refused one queued nothing

    status = json.loads(run("status", "--json").stdout)
    assert {j["user"] for j in status["queue"]} == {"grace", "ada@example.org"}
    assert "grace" in run("status").stdout


def test_a_tokens_user_is_the_user_of_the_jobs_it_submits(rt: Runtime) -> None:
    created = json.loads(run("token", "create", "--role", "submitter", "--project", "research",
                             "--user", "ada", "--json").stdout)
    assert created["subject"] == "ada"
    listed = run("token", "list")
    assert "ada" in listed.stdout
    bad = run("token", "create", "--role", "viewer", "--project", "research", "--user", "a,b")
    assert bad.exit_code == 2 and "--user:" in bad.stderr
    with served(rt) as client:
        body = {"project": "research", "gpus": 1, "duration": "10m"}
        made = client.post("/v1/jobs", json=body, headers=bearer(created["token"]))
        assert made.status_code == 201 and made.json()["user"] == "ada"
        other = client.post("/v1/jobs", json={**body, "user": "grace"},
                            headers=bearer(created["token"]))
        assert other.status_code == 403 and other.json()["field"] == "body.user"


def test_report_groups_and_filters_by_user(rt: Runtime, store: Store) -> None:
    start = datetime(2025, 3, 1, 12, tzinfo=UTC)
    for user in ("ada", None):
        job = store.submit_job("research", POOL, 2, 0, None, None, start, user=user)
        job = store.start_job(job, placement="onprem", node_id=None, at=start)
        assert store.finish_job(job, state="done", exit_code=0, at=start + H)
    ready(store, "b1", start, project=None)
    run_ = JobRun(run_key=slurm_run_key("slurm:t", "5", "b1", start), job_id="5", project=None,
                  user="carol", node_id="b1", gpus=8, started_at=start, ended_at=start + H,
                  outcome="completed", source=RunSource.SLURM)
    store.observe_slurm_runs("slurm:t", [run_], start + H)
    roll_up(store, [onprem_policy()], start + 2 * H)
    window = ("--from", "2025-03-01", "--to", "2025-03-02")

    table = run("report", *window, "--group-by", "project,user")
    assert table.exit_code == 0, table.output
    assert "(no user)" in table.stdout and "(no project)" in table.stdout
    rows = json.loads(run("report", *window, "--group-by", "project,user", "--json").stdout)["rows"]
    assert (None, "carol") in {(r["project"], r["user"]) for r in rows}
    ada = json.loads(run("report", *window, "--group-by", "user", "--user", "ada",
                         "--json").stdout)
    assert [r["user"] for r in ada["rows"]] == ["ada"] and ada["total"]["onprem_cost_usd"] == "4.00"
    nobody = json.loads(run("report", *window, "--user", "nobody", "--json").stdout)
    assert nobody["rows"] == [] and nobody["total"]["cost_usd"] == "0.00"
