"""Health, readiness and metrics routes.

* ``/healthz``: liveness, no auth: the process answers.
* ``/readyz``: readiness, no auth: the store answers and its schema is at the newest migration
  (``burst db upgrade`` has run) and, for ``burst api`` (which is given the broker URL), the
  Celery broker answers; otherwise 503 with a problem body saying which. The embedded loop
  (``burst run``) has no broker and checks none.
* ``/metrics``: Prometheus exposition (:mod:`orchestrator.api.metrics`), admin token only.
"""

from __future__ import annotations

import logging
import socket
from urllib.parse import urlsplit

from fastapi import APIRouter, Response
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

from orchestrator.api.auth import Caller, require_role
from orchestrator.api.metrics import registry_for
from orchestrator.api.one_hop import OneHopRoute
from orchestrator.api.problems import Problem
from orchestrator.store.migrate import head_revision
from orchestrator.wiring import Runtime

log = logging.getLogger(__name__)


BROKER_TIMEOUT_S = 2.0
_DEFAULT_PORTS = {"redis": 6379, "rediss": 6380, "amqp": 5672, "amqps": 5671}


def broker_problem(url: str, timeout: float = BROKER_TIMEOUT_S) -> str | None:
    """Why the broker at ``url`` is not reachable (None when it answers).

    A TCP connection to its host and port; for Redis also a ``PING``, which any live server
    answers (``+PONG``, or an error such as ``-NOAUTH`` that still proves it is there).
    """
    parts = urlsplit(url)
    scheme = parts.scheme.split("+")[0]
    host, port = parts.hostname or "127.0.0.1", parts.port or _DEFAULT_PORTS.get(scheme)
    if port is None:
        return f"broker scheme {parts.scheme!r} has no default port; give one in the URL"
    try:
        with socket.create_connection((host, port), timeout=timeout) as conn:
            if scheme == "redis":
                conn.sendall(b"PING\r\n")
                reply = conn.recv(64)
                if reply[:1] not in (b"+", b"-"):
                    return f"the broker at port {port} does not answer as Redis does"
    except OSError as exc:
        return f"the broker does not answer: {type(exc).__name__}"
    return None


def router(runtime: Runtime, broker_url: str | None = None) -> APIRouter:
    api = APIRouter(route_class=OneHopRoute)
    registry = registry_for(runtime)
    head = head_revision()

    @api.get("/healthz", tags=["health"])
    def healthz() -> dict:
        """Liveness: the API process answers."""
        return {"status": "ok"}

    @api.get("/readyz", tags=["health"], responses={503: {"description": "not ready"}})
    def readyz() -> dict:
        """Readiness: the store is reachable and migrated to the newest schema, and the broker
        (where this API was given one) answers."""
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
        if broker_url is not None:
            problem = broker_problem(broker_url)
            if problem is not None:
                # The URL (host, password) goes to the log only, as the store's does.
                log.warning("readyz: broker %s unreachable: %s", urlsplit(broker_url).hostname,
                            problem)
                raise Problem(503, "broker unreachable", problem)
        return {"status": "ready", "schema": revision}

    @api.get("/metrics", tags=["health"], response_class=Response,
             responses={200: {"content": {"text/plain": {}},
                              "description": "Prometheus text exposition format."}})
    def metrics(token: Caller) -> Response:
        """Prometheus metrics, computed from the store at scrape time (admin token)."""
        require_role(token)
        return Response(generate_latest(registry), media_type=CONTENT_TYPE_LATEST)

    return api
