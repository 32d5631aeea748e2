"""The controller's HTTP API (FastAPI): agent registration and heartbeats, health."""

from __future__ import annotations

from fastapi import FastAPI

from orchestrator.api import agents, problems
from orchestrator.wiring import Runtime


def create_app(runtime: Runtime) -> FastAPI:
    """The API application over a wired runtime."""
    app = FastAPI(title="burst controller", version="0.1.0")
    problems.install(app)
    app.include_router(agents.router(runtime))

    @app.get("/healthz", tags=["health"])
    def healthz() -> dict:
        return {"status": "ok"}

    return app
