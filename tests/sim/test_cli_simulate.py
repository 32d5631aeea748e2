"""`burst simulate` end to end, as a user runs it: the bundled sample, JSON for machines, the
table and chart for people, clean errors for bad input."""

from __future__ import annotations

import json

import pytest

from tests.e2e.helpers import run_burst

pytestmark = pytest.mark.slow
PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


@pytest.fixture(scope="module")
def sample_json(tmp_path_factory):
    chart = tmp_path_factory.mktemp("chart") / "sample.png"
    # A 5-minute tick: the policy run plans a fifth as often as at the default minute (the
    # baselines act on events, not ticks), and nothing checked here depends on the tick.
    result = run_burst("simulate", "--trace", "itp-sample", "--baselines", "--json", "--png",
                       str(chart), "--tick", "5m", timeout=300)
    assert result.returncode == 0, result.stderr
    return json.loads(result.stdout), chart


def test_json_has_one_run_per_policy_and_baseline_with_the_pinned_fields(sample_json):
    data, _ = sample_json
    assert data["trace"]["name"] == "itp-sample" and data["trace"]["jobs"] == 260
    assert data["onprem"]["sizing"].startswith("p70 of concurrent GPU demand")
    runs = {r["name"]: r for r in data["runs"]}
    assert list(runs) == ["default", "never", "greedy", "threshold", "clairvoyant"]
    assert runs["default"]["kind"] == "policy"
    assert {runs[b]["kind"] for b in ("never", "greedy", "threshold", "clairvoyant")} == {"baseline"}
    for run in data["runs"]:
        assert run["slo_s"] == 1800.0
        for key in ("cloud_cost_usd", "cloud_gpu_hours", "wait_p50_s", "wait_p95_s", "wait_p99_s",
                    "wait_max_s", "slo_attainment", "slo_attainment_gpu_hours"):
            assert isinstance(run[key], (int, float)), (run["name"], key)
        assert run["wait_p50_s"] <= run["wait_p95_s"] <= run["wait_p99_s"] <= run["wait_max_s"]
    assert runs["never"]["cloud_cost_usd"] == 0 and runs["never"]["launches"] == 0
    assert runs["greedy"]["wait_p50_s"] == 30.0  # pending 30 s, then a cloud node
    assert runs["clairvoyant"]["wait_max_s"] <= 1800 and runs["clairvoyant"]["slo_attainment"] == 1
    assert runs["default"]["plans"] > 0 and "scale-up" in runs["default"]["decisions_by_rule"]


def test_png_chart_is_written(sample_json):
    _, chart = sample_json
    assert chart.read_bytes()[:8] == PNG_MAGIC and chart.stat().st_size > 20_000


def invoke(*args: str):
    from typer.testing import CliRunner

    from orchestrator.cli import app

    return CliRunner().invoke(app, ["simulate", *args])


def test_table_output_names_every_run_and_the_limits_that_held_launches_back():
    result = invoke("--onprem-gpus", "8", "--tick", "5m")
    assert result.exit_code == 0, result.output
    assert "cloud cost and use" in result.stdout and "queue wait" in result.stdout
    assert "default" in result.stdout and "= 8 GPUs" in result.stdout
    assert "launches held back by" in result.stdout and "limits.max_nodes (" in result.stdout


def test_bad_input_is_a_clear_error_without_a_traceback(tmp_path):
    bad = tmp_path / "bad.csv"
    bad.write_text("job_id,submit_s,duration_s,gpus,project,priority\nj1,0,60,two,,\n")
    result = invoke("--trace", str(bad))
    assert result.exit_code == 2
    assert f"{bad}:2: gpus: not a whole number" in result.stderr
    assert result.exception is None or isinstance(result.exception, SystemExit)
    result = invoke("--slo", "half an hour")
    assert result.exit_code == 2 and "bad duration" in result.stderr
    result = invoke("--onprem-gpus", "lots")
    assert result.exit_code == 2 and "write N, pNN" in result.stderr
    result = invoke("--onprem-backfill", "conservative")
    assert result.exit_code == 2
    assert "--onprem-backfill must be one of easy, first-fit, slurm, got 'conservative'" in result.stderr
    result = invoke("--policy", str(tmp_path / "missing.yaml"))
    assert result.exit_code == 2 and "missing.yaml" in result.stderr
