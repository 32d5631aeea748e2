"""Public tasks for automation written by others: the stable, documented task API of burst.

Schedulers, notebooks and CI jobs send these by name (``app.send_task("burst.pool.prewarm",
kwargs={...})``); docs/automation.md lists each with examples. Every task validates its arguments
with a strict pydantic model (:mod:`orchestrator.automation.operations`) and refuses bad ones by
raising :class:`InvalidTaskArguments`, whose message starts with the argument's name and says what
is wrong. A refusal is final: these tasks never retry. Results are small JSON dicts.

* ``burst.policy.evaluate(policy)``: plan one tick for the policy now (through the leader lease,
  exactly as the scheduled ``burst.loop.tick``).
* ``burst.pool.prewarm(pool, gpus, until)``: keep at least ``gpus`` burst GPUs for the pool until
  ``until`` (ISO 8601 with a timezone, in the future).
* ``burst.pool.drain(pool, reason="")``: drain every ready node of the pool now and pause it.
* ``burst.pool.pause(pool, reason="")`` / ``burst.pool.resume(pool)``: stop / restart launches.
* ``burst.jobs.cancel(jobs)``: cancel jobs of the built-in queue (a list of ids), pending or
  running; one result per id (``cancelled``, ``already-cancelled``, ``finished``, ``unknown``).
* ``burst.spend.report(since=None, until=None, group_by="project")``: spend from the cost ledger.

Missing and unknown arguments are refused the same way (``gpus: is required``), rather than with
a TypeError from the call.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from celery import shared_task

from orchestrator.automation import operations as ops
from orchestrator.automation.runtime import runtime


class InvalidTaskArguments(ops.InvalidArgument):
    """A public task refused its arguments; the message names the argument and the problem.

    A ValueError. It reaches the caller through ``AsyncResult.get()`` as this class when the
    caller has imported this module, otherwise as an exception of the same name."""


def _given(**values: Any) -> dict[str, Any]:
    """Arguments the caller passed: None stands for "not given" (JSON has no other way)."""
    return {k: v for k, v in values.items() if v is not None}


def _call(fn: Callable[..., dict], *args: Any, **kwargs: Any) -> dict:
    try:
        return fn(*args, **kwargs)
    except InvalidTaskArguments:
        raise
    except ops.InvalidArgument as exc:
        raise InvalidTaskArguments(str(exc), exc.argument) from None


def _parse(model: type[ops.M], **values: Any) -> ops.M:
    return _call(ops.parse, model, **values)  # type: ignore[return-value]


@shared_task(name="burst.policy.evaluate", ignore_result=False, throws=(InvalidTaskArguments,))
def evaluate(policy: str | None = None, **unknown: Any) -> dict:
    """Plan one tick for ``policy`` now; returns the decision (rule, summary) and action counts."""
    from orchestrator.automation import tasks

    args = _parse(ops.EvaluateArgs, **_given(policy=policy), **unknown)
    return _call(ops.evaluate, runtime(), args.policy, tick=lambda name: tasks.tick(name))


@shared_task(name="burst.pool.prewarm", ignore_result=False, throws=(InvalidTaskArguments,))
def prewarm(pool: str | None = None, gpus: int | None = None, until: str | None = None,
            **unknown: Any) -> dict:
    """Keep at least ``gpus`` burst GPUs for ``pool`` until ``until`` (ISO 8601, timezone)."""
    args = _parse(ops.PrewarmArgs, **_given(pool=pool, gpus=gpus, until=until), **unknown)
    return _call(ops.prewarm, runtime(), args.pool, args.gpus, args.until)


@shared_task(name="burst.pool.drain", ignore_result=False, throws=(InvalidTaskArguments,))
def drain(pool: str | None = None, reason: str = "", **unknown: Any) -> dict:
    """Drain every ready node of ``pool`` now, and pause the pool."""
    args = _parse(ops.DrainArgs, **_given(pool=pool, reason=reason), **unknown)
    return _call(ops.drain_pool, runtime(), args.pool, args.reason)


@shared_task(name="burst.pool.pause", ignore_result=False, throws=(InvalidTaskArguments,))
def pause(pool: str | None = None, reason: str = "", **unknown: Any) -> dict:
    """Stop launching for ``pool`` (drains go on) until ``burst.pool.resume``."""
    args = _parse(ops.PauseArgs, **_given(pool=pool, reason=reason), **unknown)
    return _call(ops.pause, runtime(), args.pool, args.reason)


@shared_task(name="burst.pool.resume", ignore_result=False, throws=(InvalidTaskArguments,))
def resume(pool: str | None = None, **unknown: Any) -> dict:
    """Let the planner launch for ``pool`` again."""
    args = _parse(ops.PoolArgs, **_given(pool=pool), **unknown)
    return _call(ops.resume, runtime(), args.pool)


@shared_task(name="burst.jobs.cancel", ignore_result=False, throws=(InvalidTaskArguments,))
def cancel(jobs: list[str] | str | None = None, **unknown: Any) -> dict:
    """Cancel the built-in queue's jobs ``jobs`` (ids; a single id may be given as a string)."""
    ids = [jobs] if isinstance(jobs, str) else jobs
    args = _parse(ops.CancelArgs, **_given(jobs=ids), **unknown)
    rt = runtime()
    results = ops.cancel_jobs(rt.store, args.jobs, rt.clock.now())
    return {"jobs": results, "cancelled": sum(r["result"] == "cancelled" for r in results)}


@shared_task(name="burst.spend.report", ignore_result=False, throws=(InvalidTaskArguments,))
def spend_report(since: str | None = None, until: str | None = None,
                 group_by: str | list[str] = "project", **unknown: Any) -> dict:
    """Spend between ``since`` and ``until`` (ISO 8601; default: everything until now), grouped
    by ``group_by`` (comma-separated: project, provider, instance_type, pool, day)."""
    args = _parse(ops.SpendArgs, **_given(since=since, until=until, group_by=group_by), **unknown)
    return _call(ops.spend_report, runtime(), args.since, args.until, args.group_by)


__all__ = ["InvalidTaskArguments", "cancel", "drain", "evaluate", "pause", "prewarm", "resume",
           "spend_report"]
