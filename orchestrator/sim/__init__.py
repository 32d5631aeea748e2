"""The simulator: replay real job traces against policies on a virtual clock (``burst simulate``).

The production planner decides every tick of virtual time, the production executor carries its
actions out against the ``sim`` provider (obtained through :mod:`orchestrator.wiring`), and the
same metrics are taken for the policy runs and for the pinned baselines (never, greedy, threshold)
and the clairvoyant reference. See ``docs/simulator.md``.
"""

from orchestrator.sim.replay import (
    BASELINES,
    OnPremSizing,
    SimOptions,
    SimResult,
    SimulationError,
    simulate,
)
from orchestrator.sim.traces import Trace, TraceError, TraceJob, load_trace

__all__ = ["BASELINES", "OnPremSizing", "SimOptions", "SimResult", "SimulationError", "Trace",
           "TraceError", "TraceJob", "load_trace", "simulate"]
