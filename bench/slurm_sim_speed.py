"""Benchmark: replay time and on-prem-only attainment of the simulator's on-prem schedulers.

    DAYS=5 python bench/slurm_sim_speed.py never easy:1:1:0 slurm:100:8:30 slurm:100:100:30

Each argument after the controller (``never`` or ``policy``: bench/policies/itp-default.yaml) is
BACKFILL:MAX_JOB_TEST:RESERVATIONS:BF_INTERVAL_S. The ITP trace (``DAYS``: only the first days),
on-prem at p70 of concurrent demand in 4-GPU nodes. Prints wall time, cost and attainment.
"""

import sys, time
from orchestrator.policy import load_policy
from orchestrator.sim import SimOptions, load_trace
from orchestrator.sim.replay import run_controlled, size_onprem, as_simulated
from orchestrator.sim.controllers import NeverController, PolicyController
from orchestrator.sim.world import Backfill
trace = load_trace("itp")
import os
if os.environ.get("DAYS"):
    from orchestrator.sim import Trace
    st = trace.jobs[0].submit_s
    trace = Trace("x", tuple(j for j in trace.jobs if j.submit_s < st + float(os.environ["DAYS"]) * 86400), trace.source)
pol = load_policy("bench/policies/itp-default.yaml")
ctl = sys.argv[1]
for spec in sys.argv[2:]:
    bf, d, r, iv = spec.split(":")
    o = SimOptions(node_gpus=4, backfill=Backfill(bf), bf_max_job_test=int(d), bf_reservations=int(r), bf_interval_s=float(iv))
    sizing = size_onprem(trace, pol, o.onprem, o.node_gpus)
    sim = as_simulated(pol, sizing)
    c = NeverController() if ctl == "never" else PolicyController(sim, "itp-default")
    t=time.perf_counter()
    run, _ = run_controlled(ctl, c, pol, sim, trace, sizing, o, timings={})
    print(ctl, spec, sizing.gpus, "wall %.1f s" % (time.perf_counter()-t), "cost", run['cloud_cost_usd'], "slo %.4f %.4f" % (run['slo_attainment'], run['slo_attainment_gpu_hours']), "maxwait %.0f" % run['wait_max_s'], flush=True)
