"""`burst report` as a user runs it, on the embedded SQLite state dir and on BURST_DATABASE_URL
(the ``store`` fixture: SQLite and PostgreSQL): the ledger written by a real roll-up of real node
histories, shown as a table with a total, JSON and CSV that match ``GET /v1/costs``'s report, and
a PNG chart with budget lines.
"""

from __future__ import annotations

import csv
import io
import json
from datetime import date, timedelta
from decimal import Decimal
from pathlib import Path

import pytest
import yaml
from typer.testing import CliRunner

from orchestrator.cli import app
from orchestrator.cli.report_cmd import budget_window_days, daily_pace
from orchestrator.costs.ledger import roll_up
from orchestrator.costs.report import CostQuery, cost_report, parse_group_by
from orchestrator.domain import NodeState
from orchestrator.policy import load_policy_text
from orchestrator.policy.models import Budget
from orchestrator.store import Store, default_sqlite_url
from tests.builders import T0, make_rig, policy_dict

S = NodeState
WINDOW = ["--from", "2025-03-01T00:00:00Z", "--to", "2025-03-03T00:00:00Z"]


def seed(store: Store) -> None:
    """Two $10/h nodes from T0 (12:00 on 1 March), one for research, one for vision, ledger
    rolled up to 18:00 on 2 March: 12 h on the 1st and 18 h on the 2nd each."""
    rig = make_rig(store)
    for n, project in ((1, "research"), (2, "vision")):
        rig.executor.run([rig.launch_action(n, project=project)])
        rig.move(f"n{n}", S.BOOTING, S.JOINING, S.READY)
    rig.clock.advance(hours=30)
    roll_up(store, [rig.policy], rig.now)


def use_store(store: Store, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Point the CLI at ``store`` (its URL) with a fresh state dir."""
    monkeypatch.setenv("BURST_STATE_DIR", str(tmp_path / "state"))
    monkeypatch.setenv("BURST_DATABASE_URL", store.engine.url.render_as_string(hide_password=False))


@pytest.fixture
def env(store: Store, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Store:
    seed(store)
    use_store(store, tmp_path, monkeypatch)
    monkeypatch.delenv("BURST_POLICY_FILES", raising=False)
    return store


def run(*args: str):
    return CliRunner().invoke(app, list(args), catch_exceptions=False)


def test_report_json_and_csv_are_the_api_report(env: Store) -> None:
    result = run("report", *WINDOW, "--group-by", "project,day", "--json")
    assert result.exit_code == 0, result.output
    data = json.loads(result.stdout)
    expected = cost_report(env, CostQuery(since=T0.replace(hour=0), until=T0.replace(hour=0) + timedelta(days=2),
                                          group_by=parse_group_by("project,day"))).as_json()
    assert data == expected
    cost = {(r["project"], r["day"]): Decimal(r["cost_usd"]) for r in data["rows"]}
    assert cost == {("research", "2025-03-01"): Decimal("120.00"),
                    ("research", "2025-03-02"): Decimal("180.00"),
                    ("vision", "2025-03-01"): Decimal("120.00"),
                    ("vision", "2025-03-02"): Decimal("180.00")}
    assert Decimal(data["total"]["cost_usd"]) == sum(cost.values())

    only = json.loads(run("report", *WINDOW, "--project", "vision", "--json").stdout)
    assert [(r["project"], r["cost_usd"]) for r in only["rows"]] == [("vision", "300.00")]

    table = run("report", *WINDOW, "--group-by", "provider")
    assert table.exit_code == 0 and "total" in table.stdout and "600.00" in table.stdout

    rows = list(csv.DictReader(io.StringIO(run("report", *WINDOW, "--group-by", "day", "--csv").stdout)))
    assert [(r["day"], r["cost_usd"]) for r in rows] == [("2025-03-01", "240.00"),
                                                          ("2025-03-02", "360.00")]


def test_report_takes_dates_and_spans_and_matches_the_api(env: Store) -> None:
    explicit = json.loads(run("report", *WINDOW, "--group-by", "project,day", "--json").stdout)
    dates = run("report", "--from", "2025-03-01", "--to", "2025-03-03", "--group-by",
                "project,day", "--json")
    assert dates.exit_code == 0, dates.output
    assert json.loads(dates.stdout) == explicit
    # A span counts back from now: 20 years back still starts before the seeded days.
    spans = json.loads(run("report", "--from", "7300d", "--to", "2025-03-03", "--json").stdout)
    assert spans["total"]["cost_usd"] == explicit["total"]["cost_usd"] == "600.00"
    # The API's report of the same window, to the cent (the same code answers both).
    api = cost_report(env, CostQuery(since=T0.replace(hour=0), until=T0.replace(hour=0, day=3),
                                     group_by=parse_group_by("project,day"))).as_json()
    assert explicit == api


def test_spend_is_report(env: Store) -> None:
    report = run("report", *WINDOW, "--json")
    spend = run("spend", *WINDOW, "--json")
    assert spend.exit_code == 0, spend.output
    assert json.loads(spend.stdout) == json.loads(report.stdout)
    assert json.loads(run("spend", "--since", "2025-03-01", "--until", "2025-03-03",
                          "--json").stdout) == json.loads(report.stdout)


def test_report_png_draws_the_days_with_budget_lines(env: Store, tmp_path: Path) -> None:
    from matplotlib.image import imread

    policy = policy_dict(budgets=[
        {"name": "research-monthly", "project": "research", "limit_usd": 3100},
        {"name": "pool-daily", "window": "day", "limit_usd": 500},
    ])
    policy_file = tmp_path / "policy.yaml"
    policy_file.write_text(yaml.safe_dump(policy, sort_keys=False))
    chart = tmp_path / "charts" / "march.png"
    result = run("report", *WINDOW, "--group-by", "project", "--png", str(chart),
                 "--policy", str(policy_file))
    assert result.exit_code == 0, result.output
    assert f"chart written to {chart}" in result.stdout.replace("\n", "")
    assert chart.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    height, width, _ = imread(chart).shape
    assert width >= 800 and height >= 500


def test_budget_lines_spread_each_limit_over_its_window() -> None:
    policy = load_policy_text(yaml.safe_dump(policy_dict(budgets=[
        {"name": "m", "project": "research", "limit_usd": 3100},
        {"name": "w", "window": "week", "limit_usd": 700},
        {"name": "c", "window": "custom", "period": "10d", "starts": "2025-01-01T00:00:00Z",
         "limit_usd": 50},
    ])), "<test>")
    monthly, weekly, custom = policy.budgets
    assert isinstance(monthly, Budget)
    assert daily_pace(monthly, [date(2025, 3, 31), date(2025, 4, 1)]) == [100.0, 3100 / 30]
    assert budget_window_days(monthly, date(2024, 2, 10)) == 29
    assert daily_pace(weekly, [date(2025, 3, 5)]) == [100.0]
    assert daily_pace(custom, [date(2025, 3, 5)]) == [5.0]


@pytest.mark.parametrize(("args", "text"), [
    (("--from", "yesterday"), "--from: expected an ISO 8601 time with a timezone"),
    (("--to", "2025-03-01T00:00:00"), "--to:"),
    (("--from", "2025-03-02T00:00:00Z", "--to", "2025-03-01T00:00:00Z"), "--from:"),
    (("--group-by", "project,colour"), "--group-by:"),
    (("--json", "--csv"), "--json and --csv"),
    (("--png", "chart.jpg"), "--png:"),
    (("--to", "9999-12-31T23:30:00-01:00"), "--to:"),
    (("--from", "0001-01-01T00:00:00+01:00"), "--from:"),
    (("--from", "2020-01-01T00:00:00Z", "--to", "2025-01-01T00:00:00Z", "--png", "c.png"),
     "--png:"),
])
def test_bad_report_options_name_the_option(env: Store, args: tuple[str, ...], text: str) -> None:
    result = run("report", *args)
    assert result.exit_code == 2, result.output
    assert text in result.output and "Traceback" not in result.output


def test_a_database_not_at_this_builds_migration_is_not_migrated_behind_the_operator(
        store: Store, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A read command on BURST_DATABASE_URL must not migrate a production database under
    running controllers: it says to run `burst db upgrade` (the embedded default migrates)."""
    old = Store(f"sqlite:///{tmp_path / 'old.db'}")
    old.upgrade("0003")
    old.close()
    monkeypatch.setenv("BURST_DATABASE_URL", f"sqlite:///{tmp_path / 'old.db'}")
    for args in (("report",), ("token", "list"), ("decisions",), ("status",)):
        result = run(*args)
        assert result.exit_code == 2, (args, result.output)
        assert "burst db upgrade" in result.output and "Traceback" not in result.output
    check = Store(f"sqlite:///{tmp_path / 'old.db'}")
    assert check.schema_revision() == "0003"
    check.close()


def test_report_on_the_embedded_state_dir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    state = tmp_path / "state"
    monkeypatch.setenv("BURST_STATE_DIR", str(state))
    monkeypatch.delenv("BURST_DATABASE_URL", raising=False)
    with Store(default_sqlite_url(state)) as store:
        store.upgrade()
        seed(store)
    result = run("report", *WINDOW, "--group-by", "project", "--json")
    assert result.exit_code == 0, result.output
    assert json.loads(result.stdout)["total"]["cost_usd"] == "600.00"


def test_report_roi_prints_the_return_on_burst_spend(store: Store, tmp_path: Path,
                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    from orchestrator.costs.roi import roi_report
    from tests.integration.test_roi import seed_roi

    seed_roi(store)
    use_store(store, tmp_path, monkeypatch)
    window = ["--from", "2025-03-01", "--to", "2025-04-01"]
    data = json.loads(run("report", "--roi", *window, "--json").stdout)
    assert data == roi_report(store, since=T0.replace(day=1, hour=0),
                              until=T0.replace(month=4, day=1, hour=0)).as_json()
    assert [(r["project"], r["month"], r["burst_jobs"]) for r in data["rows"]] == [
        ("research", "2025-03", 3), ("vision", "2025-03", 1)]
    table = run("report", "--roi", *window)
    assert table.exit_code == 0
    assert "research" in table.stdout and "24.00" in table.stdout and "total" in table.stdout
    rows = list(csv.DictReader(io.StringIO(run("report", "--roi", *window, "--project", "vision",
                                               "--csv").stdout)))
    assert [(r["project"], r["hours_avoided"]) for r in rows] == [("vision", "0.8333")]
    assert run("report", "--roi", *window, "--project", "nobody", "--json").exit_code == 0
    refused = run("report", "--roi", "--png", str(tmp_path / "x.png"))
    assert refused.exit_code != 0 and "--png" in refused.output


def test_report_usage_table_json_csv_and_chart(store: Store, tmp_path: Path,
                                               monkeypatch: pytest.MonkeyPatch) -> None:
    import matplotlib.image

    from orchestrator.costs.usage_report import usage_report
    from tests.integration.test_usage_report import seed_usage

    seed_usage(store)
    use_store(store, tmp_path, monkeypatch)
    window = ["--from", "2025-03-01", "--to", "2025-03-02"]
    data = json.loads(run("report", "--usage", *window, "--group-by", "project,user",
                          "--json").stdout)
    assert data == usage_report(store, ("project", "user"), since=T0.replace(hour=0),
                                until=T0.replace(day=2, hour=0)).as_json()
    table = run("report", "--usage", *window, "--group-by", "user")
    assert table.exit_code == 0, table.output
    assert "ada" in table.stdout and "unknown" in table.stdout and "(no user)" in table.stdout
    rows = list(csv.DictReader(io.StringIO(run("report", "--usage", *window, "--group-by",
                                               "provider", "--csv").stdout)))
    assert {r["provider"] for r in rows} >= {"onprem"}
    assert json.loads(run("report", "--usage", *window, "--user", "nobody",
                          "--json").stdout)["rows"] == []
    bad = run("report", "--usage", "--group-by", "colour")
    assert bad.exit_code != 0 and "user, project, provider, pool, day" in bad.output

    chart = tmp_path / "use.png"
    drawn = run("report", "--usage", *window, "--group-by", "user,day", "--png", str(chart))
    assert drawn.exit_code == 0 and f"chart written to {chart}" in drawn.stdout
    assert chart.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    pixels = matplotlib.image.imread(str(chart))
    assert pixels.shape[0] > 300 and pixels.shape[1] > 500
    # Not a blank canvas: the bars' colours (on-prem, burst, and the shaded used share) are drawn.
    import numpy as np

    for wanted in ((0.56, 0.70, 0.85), (0.95, 0.70, 0.48), (0.71, 0.38, 0.11)):
        assert np.any(np.all(np.abs(pixels[..., :3] - np.array(wanted)) < 0.02, axis=-1)), wanted


def test_db_rebuild_rollups_rebuilds_them_from_the_lines(env: Store) -> None:
    """Lines whose roll-ups are lost (a restore of cost_lines alone): reports read the roll-ups
    and see nothing until `burst db rebuild-rollups` rebuilds them; the report is then the
    lines' again."""
    before = run("report", *WINDOW, "--json")
    assert json.loads(before.stdout)["total"]["cost_usd"] == "600.00"
    with env.engine.begin() as conn:
        conn.exec_driver_sql("DELETE FROM cost_rollup_hours")
        conn.exec_driver_sql("DELETE FROM cost_rollup_days")
        conn.exec_driver_sql("DELETE FROM cost_rollup_months")
    assert json.loads(run("report", *WINDOW, "--json").stdout)["total"]["cost_usd"] == "0.00"
    rebuilt = run("db", "rebuild-rollups", "--json")
    assert rebuilt.exit_code == 0, rebuilt.output
    counts = json.loads(rebuilt.stdout)
    assert counts["hour_rows"] > 0 and counts["day_rows"] == 4  # 2 projects x 2 days
    assert counts["month_rows"] == 2  # 2 projects x 1 month
    assert run("report", *WINDOW, "--json").stdout == before.stdout
