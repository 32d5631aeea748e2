"""`burst pool pause / resume / prewarm / drain` and `burst spend`: operator controls of a pool.

The same operations as the public Celery tasks (:mod:`orchestrator.automation.operations`), run
directly against the store (embedded mode: no broker needed), with the same validation: a bad
argument exits 2 with one line naming it. A running `burst run` or Celery worker picks the
change up at its next tick.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Annotated, Any

import typer

from orchestrator.cli.common import POLICY_HELP, fail, load_policies, load_settings, out, print_json

pool_app = typer.Typer(rich_markup_mode=None, help="Pause, resume, pre-warm or drain the bursting of a pool.",
                       no_args_is_help=True)

_PolicyOpt = Annotated[list[Path] | None, typer.Option("--policy", "-p", help=POLICY_HELP)]
_StateOpt = Annotated[Path | None, typer.Option("--state-dir", help="State directory (BURST_STATE_DIR).")]
_JsonOpt = Annotated[bool, typer.Option("--json", help="Print the result as JSON.")]
_Pool = Annotated[str, typer.Argument(help="The pool, as named in a policy's pool.name.")]


@contextmanager
def _runtime(policy: list[Path] | None, state_dir: Path | None) -> Iterator[Any]:
    """A runtime over the store for operator commands: no provider is built (none is called)."""
    from orchestrator.wiring import build_runtime

    settings = load_settings(state_dir=state_dir)
    policies = load_policies(policy, settings)
    rt = build_runtime(settings, policies, providers={})
    try:
        yield rt
    finally:
        rt.close()


def _run(operation: Callable[..., dict], policy: list[Path] | None, state_dir: Path | None,
         model: Any, **raw: Any) -> dict:
    """Validate ``raw`` with ``model``, then run ``operation``; exit 2 naming a bad argument."""
    from orchestrator.automation import operations as ops
    from orchestrator.wiring import ProviderUnavailable

    try:
        args = ops.parse(model, **{k: v for k, v in raw.items() if v is not None})
        with _runtime(policy, state_dir) as rt:
            return operation(rt, *args.model_dump().values())
    except ops.InvalidArgument as exc:
        fail(_as_option(str(exc)))
    except ProviderUnavailable as exc:
        fail(str(exc))


def _as_option(message: str) -> str:
    """``gpus: ...`` -> ``--gpus: ...`` for options (arguments keep their name)."""
    name, _, rest = message.partition(":")
    options = {"gpus", "until", "since", "group_by", "reason"}
    return f"--{name.replace('_', '-')}:{rest}" if name in options else message


@pool_app.command("pause")
def pause_command(pool: _Pool,
                  reason: Annotated[str, typer.Option("--reason", help="Why (shown in decisions).")] = "",
                  policy: _PolicyOpt = None, state_dir: _StateOpt = None,
                  as_json: _JsonOpt = False) -> None:
    """Stop launching burst nodes for POOL; running nodes stay and drains go on."""
    from orchestrator.automation import operations as ops

    result = _run(ops.pause, policy, state_dir, ops.PauseArgs, pool=pool, reason=reason)
    _show(result, as_json, f"pool {pool} paused" + (f" ({result['reason']})" if result["reason"] else "")
          + (" (it already was)" if result["was_paused"] else ""))


@pool_app.command("resume")
def resume_command(pool: _Pool, policy: _PolicyOpt = None, state_dir: _StateOpt = None,
                   as_json: _JsonOpt = False) -> None:
    """Let the planner launch burst nodes for POOL again."""
    from orchestrator.automation import operations as ops

    result = _run(ops.resume, policy, state_dir, ops.PoolArgs, pool=pool)
    _show(result, as_json, f"pool {pool} resumed" + ("" if result["was_paused"] else " (it was not paused)"))


@pool_app.command("prewarm")
def prewarm_command(
    pool: _Pool,
    gpus: Annotated[int, typer.Option("--gpus", help="Burst GPUs to keep ready or starting.")],
    until: Annotated[str, typer.Option("--until", help="ISO 8601 time with a timezone, e.g. 2026-12-01T09:00:00Z.")],
    policy: _PolicyOpt = None, state_dir: _StateOpt = None, as_json: _JsonOpt = False,
) -> None:
    """Keep at least --gpus burst GPUs for POOL until --until (e.g. before a scheduled run)."""
    from orchestrator.automation import operations as ops

    result = _run(ops.prewarm, policy, state_dir, ops.PrewarmArgs, pool=pool, gpus=gpus, until=until)
    _show(result, as_json, f"pool {pool}: pre-warming {result['gpus']} GPUs until {result['until']} "
                           f"({result['have_gpus']} ready or starting now); {result['note']}")


@pool_app.command("drain")
def drain_command(pool: _Pool,
                  reason: Annotated[str, typer.Option("--reason", help="Why (recorded with the pause).")] = "",
                  policy: _PolicyOpt = None, state_dir: _StateOpt = None,
                  as_json: _JsonOpt = False) -> None:
    """Drain every ready burst node of POOL now and pause the pool."""
    from orchestrator.automation import operations as ops

    result = _run(ops.drain_pool, policy, state_dir, ops.DrainArgs, pool=pool, reason=reason)
    text = f"pool {pool}: draining {len(result['drained'])} node(s)"
    if result["deadline"]:
        text += f" (released by {result['deadline']} at the latest)"
    if result["starting"]:
        text += f"; {len(result['starting'])} still starting, drained once idle"
    if result["prewarm_cleared"]:
        text += "; pre-warm cleared"
    _show(result, as_json, f"{text}; {result['note']}")


def _show(result: dict, as_json: bool, text: str) -> None:
    if as_json:
        print_json(result)
    else:
        out.print(text, soft_wrap=True)


__all__ = ["pool_app"]
