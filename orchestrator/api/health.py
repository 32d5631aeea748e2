"""Health, readiness and metrics routes.

* ``/healthz``: liveness, no auth: the process answers.
* ``/readyz``: readiness, no auth: the store answers and its schema is at the newest migration
  (``burst db upgrade`` has run); otherwise 503 with a problem body saying which.
* ``/metrics``: Prometheus exposition (:mod:`orchestrator.api.metrics`), admin token only.
"""

from __future__ import annotations

import logging

from fastapi import APIRouter, Response
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

from orchestrator.api.auth import Caller, require_role
from orchestrator.api.metrics import registry_for
from orchestrator.api.problems import Problem
from orchestrator.store.migrate import head_revision
from orchestrator.wiring import Runtime

log = logging.getLogger(__name__)


def router(runtime: Runtime) -> APIRouter:
    api = APIRouter()
    registry = registry_for(runtime)
    head = head_revision()

    @api.get("/healthz", tags=["health"])
    def healthz() -> dict:
        """Liveness: the API process answers."""
        return {"status": "ok"}

    @api.get("/readyz", tags=["health"], responses={503: {"description": "not ready"}})
    def readyz() -> dict:
        """Readiness: the store is reachable and migrated to the newest schema."""
        try:
            revision = runtime.store.schema_revision()
        except Exception as exc:  # noqa: BLE001 - any store failure means "not ready"
            # The URL (host, user, database) goes to the log only: /readyz needs no token.
            log.warning("readyz: store %s unreachable: %s", runtime.store.url, exc)
            raise Problem(503, "store unreachable",
                          f"the state store does not answer: {type(exc).__name__}") from None
        if revision != head:
            raise Problem(503, "store not migrated",
                          f"the store is at migration {revision or 'none'}, this build needs "
                          f"{head}; run burst db upgrade")
        return {"status": "ready", "schema": revision}

    @api.get("/metrics", tags=["health"], response_class=Response,
             responses={200: {"content": {"text/plain": {}},
                              "description": "Prometheus text exposition format."}})
    def metrics(token: Caller) -> Response:
        """Prometheus metrics, computed from the store at scrape time (admin token)."""
        require_role(token)
        return Response(generate_latest(registry), media_type=CONTENT_TYPE_LATEST)

    return api
