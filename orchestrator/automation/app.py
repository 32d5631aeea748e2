"""The Celery application of the distributed control plane, configured from settings.

Beat sends ``burst.loop.tick`` for every policy each ``tick_s`` and ``burst.reconcile.run`` /
``burst.catalog.refresh`` / ``burst.cost.rollup`` (each ``cost_rollup_s``) / ``burst.decisions.prune``
(hourly: ``decision_retention``) on their own periods;
workers carry them out. Two queues keep provider calls (slow, retried) from delaying planning:
``burst.control`` and ``burst.provider``.

Delivery is at-least-once: tasks that may run twice are written to be idempotent and only those
acknowledge late (``acks_late``), so a worker killed mid-task has its task redelivered.

``celery -A orchestrator.automation.app worker`` and ``burst worker`` both use :data:`app`.
"""

from __future__ import annotations

from datetime import timedelta

from celery import Celery
from celery.signals import worker_init

from orchestrator.gctune import tune_gc
from orchestrator.tick import PRUNE_EVERY
from orchestrator.wiring import Settings

CONTROL_QUEUE = "burst.control"
PROVIDER_QUEUE = "burst.provider"


def beat_schedule(settings: Settings, policy_names: list[str]) -> dict:
    tick = timedelta(seconds=settings.tick_s)
    schedule = {
        f"tick:{name}": {"task": "burst.loop.tick", "schedule": tick, "args": (name,),
                         # A tick older than one period is pointless: the next one is coming.
                         "options": {"expires": settings.tick_s}}
        for name in policy_names
    }
    schedule["reconcile"] = {"task": "burst.reconcile.run", "schedule": tick * 3,
                             "options": {"expires": settings.tick_s * 3}}
    schedule["catalog-refresh"] = {"task": "burst.catalog.refresh", "schedule": timedelta(hours=6)}
    schedule["cost-rollup"] = {"task": "burst.cost.rollup",
                               "schedule": timedelta(seconds=settings.cost_rollup_s),
                               "options": {"expires": settings.cost_rollup_s}}
    schedule["decision-prune"] = {"task": "burst.decisions.prune", "schedule": PRUNE_EVERY}
    return schedule


def broker_transport_options(settings: Settings) -> dict:
    """Redis transport options: how soon a task left unacknowledged by a dead worker comes back.

    kombu puts an unacknowledged message back on its queue once it is ``visibility_timeout`` old,
    but only looks every ``unacked_restore_interval * unacked_restore_throttle`` seconds (10 x 10
    by default): with a short visibility timeout (tests, fast tasks) that sweep, not the timeout,
    would decide the redelivery delay. Sweep about five times per visibility timeout, between
    once a second and kombu's default of once per 100 s.
    """
    visibility = settings.visibility_timeout_s
    sweep = min(max(visibility / 5, 1.0), 100.0)
    interval = max(1, min(10, int(sweep)))
    return {"visibility_timeout": visibility, "unacked_restore_interval": interval,
            "unacked_restore_throttle": max(1, round(sweep / interval))}


def create_celery(settings: Settings, policy_names: list[str] | None = None) -> Celery:
    app = Celery("burst", broker=settings.broker_url, backend=settings.result_backend,
                 include=["orchestrator.automation.tasks", "orchestrator.automation.public"])
    if policy_names is None:
        from orchestrator.automation.runtime import policy_names_from

        policy_names = policy_names_from(settings)
    app.conf.update(
        task_default_queue=CONTROL_QUEUE,
        task_routes={"burst.provider.*": {"queue": PROVIDER_QUEUE},
                     "burst.node.*": {"queue": PROVIDER_QUEUE},
                     "burst.notify.*": {"queue": PROVIDER_QUEUE}},
        task_serializer="json", accept_content=["json"], result_serializer="json",
        timezone="UTC", enable_utc=True,
        worker_prefetch_multiplier=1,  # a killed worker holds at most one unacknowledged task
        task_acks_late=False,  # only idempotent tasks opt in, task by task
        task_reject_on_worker_lost=True,
        task_time_limit=600, task_soft_time_limit=540,
        result_expires=3600,
        broker_connection_retry_on_startup=True,
        broker_transport_options=broker_transport_options(settings),
        result_backend_transport_options={"retry_policy": {"timeout": 5.0}},
        beat_schedule=beat_schedule(settings, policy_names),
        worker_hijack_root_logger=False,
    )
    return app


@worker_init.connect
def _tune_worker_gc(**_kwargs: object) -> None:
    # A worker however started (burst worker, celery -A ... worker): the collector's thresholds
    # of burst's processes (orchestrator.gctune), set before the pool forks its children.
    tune_gc()


app = create_celery(Settings())
