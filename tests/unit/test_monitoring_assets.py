"""The alerting assets of infra/monitoring/: the rules pass ``promtool check rules`` and their unit
tests (``promtool test rules``), and the Grafana dashboard is well-formed. That every metric the
rules and panels name is really exported is checked against a live ``/metrics`` in
tests/integration/test_fleet_metrics.py."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
from pathlib import Path

import pytest
import yaml

MONITORING = Path(__file__).resolve().parents[2] / "infra" / "monitoring"
METRIC = re.compile(r"\bburst_[a-z_]+\b")
ALERTS = {"BurstBudgetForecastOverLimit", "BurstBudgetExhausted", "BurstNodeStuck",
          "BurstLaunchesFailing", "BurstLeakedInstancesCollected", "BurstControllerNotTicking",
          "BurstLeaderFlapping", "BurstMetricsIncomplete"}


def promtool(*args: str) -> subprocess.CompletedProcess[str]:
    tool = shutil.which("promtool")
    if tool is None:
        pytest.fail("promtool is missing: install the Debian package prometheus (.ci/run does)")
    return subprocess.run([tool, *args], cwd=MONITORING, capture_output=True, text=True,
                          timeout=120)


def test_alert_rules_pass_promtool_check() -> None:
    done = promtool("check", "rules", "alerts.yaml")
    assert done.returncode == 0, done.stdout + done.stderr
    assert f"{len(ALERTS)} rules found" in done.stdout


def test_alert_rules_pass_their_unit_tests() -> None:
    done = promtool("test", "rules", "alerts.test.yaml")
    assert done.returncode == 0, done.stdout + done.stderr
    tested = set(re.findall(r"alertname: (\w+)", (MONITORING / "alerts.test.yaml").read_text()))
    assert tested == ALERTS == set(alert_names())


def alert_names() -> list[str]:
    rules = yaml.safe_load((MONITORING / "alerts.yaml").read_text())
    return [r["alert"] for g in rules["groups"] for r in g["rules"]]


def dashboard() -> dict:
    return json.loads((MONITORING / "grafana-dashboard.json").read_text())


def test_grafana_dashboard_is_well_formed() -> None:
    board = dashboard()
    ids = [p["id"] for p in board["panels"]]
    assert len(ids) == len(set(ids)) and board["uid"] == "burst-overview"
    for panel in board["panels"]:
        assert panel["title"] and panel["targets"], panel
        assert panel["datasource"]["uid"] == "${datasource}"
        for target in panel["targets"]:
            assert METRIC.search(target["expr"]), (panel["title"], target["expr"])


def metric_names_used() -> set[str]:
    """Every burst_* name the rules and the dashboard query."""
    rules = yaml.safe_load((MONITORING / "alerts.yaml").read_text())
    exprs = [r["expr"] for g in rules["groups"] for r in g["rules"]]
    exprs += [t["expr"] for p in dashboard()["panels"] for t in p["targets"]]
    return {m for e in exprs for m in METRIC.findall(e)}
