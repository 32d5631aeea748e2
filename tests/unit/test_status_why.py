"""What `burst status` says holds a pending job (orchestrator.cli.status_why.job_reasons): only
the held-back labels that apply to the job's project, else the rule, else "launching"."""

from __future__ import annotations

from datetime import UTC, datetime

import yaml

from orchestrator.cli.status_why import job_reasons
from orchestrator.domain.jobs import JobState
from orchestrator.domain.plan import Decision, Rule
from orchestrator.policy import load_policy_text
from orchestrator.store.records import JobRecord

T0 = datetime(2026, 12, 1, 9, 0, tzinfo=UTC)
POLICY = load_policy_text(yaml.safe_dump({
    "version": 1, "name": "p", "pool": {"name": "gpu", "onprem": {"nodes": 1, "gpus_per_node": 8}},
    "offerings": [{"provider": "local", "region": "local", "zone": "local-a",
                   "instance_type": "local.8gpu", "market": "spot", "gpus": 8,
                   "price_usd_hour": 1.0}],
    "budgets": [{"name": "nlp-day", "project": "nlp", "window": "day", "limit_usd": 10},
                {"name": "pool-day", "window": "day", "limit_usd": 100}],
}), "p.yaml")


def job(i: int, project: str, pool: str = "gpu") -> JobRecord:
    return JobRecord(id=f"j-{i}", project=project, pool=pool, gpus=8, priority=0,
                     duration_s=600.0, command=None, state=JobState.PENDING, placement=None,
                     node_id=None, submitted_at=T0, started_at=None, finished_at=None,
                     exit_code=None)


def test_only_the_labels_of_the_jobs_project_and_the_pool_hold_it() -> None:
    decision = Decision(id="d-1", policy="p", at=T0, rule=Rule.SCALE_UP, summary="...",
                        held_back_by=("projects[nlp].max_burst_gpus", "budgets[nlp-day]"),
                        actions=("launch n-1 local/local/local-a/local.8gpu/spot for vision (demand)",))
    reasons = job_reasons([job(1, "nlp"), job(2, "vision"), job(3, "cv"), job(4, "x", pool="other")],
                          [POLICY], {"p": decision})
    assert reasons["j-1"]["held_back_by"] == ["projects[nlp].max_burst_gpus", "budgets[nlp-day]"]
    assert reasons["j-2"]["text"] == "launching"
    assert reasons["j-3"] == {"held_back_by": [], "rule": "scale-up", "decision": "d-1",
                              "text": "scale-up"}
    assert reasons["j-4"]["text"] == "no running policy watches its pool"

    pool_wide = Decision(id="d-2", policy="p", at=T0, rule=Rule.LIMITED, summary="...",
                         held_back_by=("limits.max_nodes", "budgets[pool-day]"))
    assert job_reasons([job(5, "cv")], [POLICY], {"p": pool_wide})["j-5"]["held_back_by"] == [
        "limits.max_nodes", "budgets[pool-day]"]
    assert job_reasons([job(6, "cv")], [POLICY], {})["j-6"]["text"] == "no decision yet"
