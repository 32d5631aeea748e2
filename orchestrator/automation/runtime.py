"""The wired runtime of a worker process: built once per process, from settings and policy files."""

from __future__ import annotations

import threading
from functools import lru_cache

import redis

from orchestrator.policy import DEFAULT_POLICY_PATH, Policy, load_policy
from orchestrator.wiring import Runtime, Settings, build_runtime

_lock = threading.Lock()


def policies_from(settings: Settings) -> list[Policy]:
    """The deployment's policies, accelerators expanded and checked against the catalogues."""
    from orchestrator.catalogue_check import resolve_with_catalogue

    files = list(settings.policy_files or [DEFAULT_POLICY_PATH])
    return resolve_with_catalogue([load_policy(path) for path in files], files,
                                  settings.state_dir)[0]


def policy_names_from(settings: Settings) -> list[str]:
    return [p.name for p in policies_from(settings)]


@lru_cache(maxsize=1)
def runtime() -> Runtime:
    """This process's runtime. Migrations are not run here: `burst db upgrade` does that once."""
    with _lock:
        settings = Settings()
        return build_runtime(settings, policies_from(settings), upgrade=False)


@lru_cache(maxsize=1)
def redis_client() -> redis.Redis:
    settings = runtime().settings
    return redis.Redis.from_url(settings.redis_url or settings.broker_url, socket_timeout=5,
                                socket_connect_timeout=5, health_check_interval=30)


def lease_seconds() -> float:
    settings = runtime().settings
    return settings.lease_s or settings.tick_s * 3
