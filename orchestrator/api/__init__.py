"""The controller's HTTP API (FastAPI).

* agents (``/v1/agent/*``): registration and heartbeats, authenticated by per-node credentials;
* ``/v1`` read and submit routes (nodes, decisions, queue, jobs, costs, budgets), authenticated by
  bearer tokens scoped to a role and projects (:mod:`orchestrator.api.auth`);
* ``/healthz``, ``/readyz`` and ``/metrics``;
* the read-only web dashboard at ``/ui`` (:mod:`orchestrator.api.ui`, cookie sign-in with a token);
* ``/openapi.json``. Every error is an RFC 9457 problem document (:mod:`orchestrator.api.problems`).

Every request body is size-limited and the anonymous agent route rate-limited per source
(:mod:`orchestrator.api.limits`).

The routes are documented, with curl examples, in docs/api.md.
"""

from __future__ import annotations

from fastapi import FastAPI

from orchestrator.api import agents, health, problems, reports, ui, v1, wheels
from orchestrator.api.limits import BodyLimit, Rate, RateLimit
from orchestrator.wiring import Runtime


def create_app(runtime: Runtime, *, register_rate: Rate | None = None,
               broker_url: str | None = None) -> FastAPI:
    """The API application over a wired runtime; ``register_rate``: the per-source token
    bucket of anonymous agent registrations (default: from the runtime's settings);
    ``broker_url``: the Celery broker ``/readyz`` checks (the production API's; None: none)."""
    if register_rate is None:
        register_rate = Rate(runtime.settings.register_burst, runtime.settings.register_per_s)
    app = FastAPI(title="burst controller", version="0.1.0",
                  description="burst's controller API: node agents, cost reports, budgets, "
                              "nodes, decisions and the built-in queue. See docs/api.md.")
    app.state.runtime = runtime
    problems.install(app)
    app.include_router(agents.router(runtime))
    app.include_router(v1.router(runtime))
    app.include_router(reports.router(runtime))
    app.include_router(health.router(runtime, broker_url))
    app.include_router(wheels.router(runtime.settings.node_wheel_dir))
    ui.install(app, runtime)  # the web dashboard at /ui
    # The last added runs first: a flooding source is refused before its body is read.
    app.add_middleware(BodyLimit)
    app.add_middleware(RateLimit, rate=register_rate)
    return app
