"""`burst token create / list / revoke`: bearer tokens of the HTTP API.

A token is printed once, by ``create``; the store keeps only its hash, so ``list`` can show what a
token may do and when it was last used, never the token itself. Anyone who can run these commands
against the store is already an administrator of it: this is how the first admin token is made.
"""

from __future__ import annotations

from datetime import UTC, datetime
from pathlib import Path
from typing import Annotated

import typer

from orchestrator.cli.common import err, fail, load_settings, open_store, out, print_json

token_app = typer.Typer(rich_markup_mode=None, help="Create, list and revoke bearer tokens of the HTTP API.",
                        no_args_is_help=True)

_StateOpt = Annotated[Path | None, typer.Option("--state-dir", help="State directory (BURST_STATE_DIR).")]
_JsonOpt = Annotated[bool, typer.Option("--json", help="Print the result as JSON.")]


def _store(state_dir: Path | None):
    return open_store(load_settings(state_dir=state_dir))


@token_app.command("create")
def create_command(
    role: Annotated[str, typer.Option("--role", help="admin (everything), viewer (read its projects) or submitter (read and submit jobs for its projects).")],
    project: Annotated[list[str] | None, typer.Option("--project", help="A project the token may see (repeat for several; not for admin).")] = None,
    expires: Annotated[str | None, typer.Option("--expires", help="Lifetime, e.g. 30d or 12h (default: never expires).")] = None,
    description: Annotated[str, typer.Option("--description", help="Who or what the token is for.")] = "",
    user: Annotated[str | None, typer.Option("--user", help="The user the token acts as (its subject): the user of the jobs it submits. A submitter token submits only for this user.")] = None,
    state_dir: _StateOpt = None,
    as_json: _JsonOpt = False,
) -> None:
    """Issue a token and print it, once."""
    from orchestrator.domain.jobs import check_user
    from orchestrator.policy import parse_duration
    from orchestrator.store.tokens import validate_scope

    now = datetime.now(UTC)
    expires_at = None
    if expires is not None:
        try:
            lifetime = parse_duration(expires)
        except ValueError as exc:
            fail(f"--expires: {exc}")
        if lifetime.total_seconds() <= 0:
            fail(f"--expires: must be longer than 0s (got {expires!r})")
        expires_at = now + lifetime
    try:
        validate_scope(role, project or [])
    except ValueError as exc:
        fail(f"--{exc}")
    if user is not None:
        try:
            check_user(user)
        except ValueError as exc:
            fail(f"--user: {exc}")
    store = _store(state_dir)
    try:
        secret, token = store.create_api_token(role, project or [], created_at=now,
                                               expires_at=expires_at, description=description,
                                               subject=user)
    except ValueError as exc:
        fail(f"--{exc}")
    finally:
        store.close()
    if as_json:
        print_json({"token": secret, **token.as_json()})
        return
    scope = "every project" if not token.projects else ", ".join(token.projects)
    err.print(f"created {token.id}: {token.role} of {scope}"
              + (f", acting as user {token.subject}" if token.subject else "")
              + (f", expires {token.expires_at:%Y-%m-%d %H:%M} UTC" if token.expires_at else "")
              + ". Store the token now: it is not shown again.")
    out.print(secret, soft_wrap=True)


@token_app.command("list")
def list_command(
    all_tokens: Annotated[bool, typer.Option("--all", help="Include revoked tokens.")] = False,
    state_dir: _StateOpt = None,
    as_json: _JsonOpt = False,
) -> None:
    """List tokens (never their secrets)."""
    from rich.table import Table
    from rich.text import Text

    store = _store(state_dir)
    tokens = store.api_tokens(include_revoked=all_tokens)
    store.close()
    now = datetime.now(UTC)
    if as_json:
        print_json([t.as_json(now) for t in tokens])
        return
    table = Table(title=f"API tokens ({len(tokens)})")
    table.add_column("id", no_wrap=True)
    table.add_column("role", no_wrap=True)
    table.add_column("projects", min_width=8, overflow="fold")
    table.add_column("user", overflow="fold")
    for col in ("status", "expires", "last used"):
        table.add_column(col, no_wrap=True)
    table.add_column("description", overflow="fold")
    colours = {"ok": "green", "expired": "yellow", "revoked": "red"}
    for t in tokens:
        status = t.status(now)
        table.add_row(t.id, str(t.role), ", ".join(t.projects) or "(all)", t.subject or "-",
                      Text(status, style=colours[status]),
                      _day(t.expires_at) or "never", _day(t.last_used_at) or "never",
                      t.description)
    out.print(table)


@token_app.command("revoke")
def revoke_command(
    token_id: Annotated[str, typer.Argument(help="Token id, as `burst token list` shows it (tok-...).")],
    state_dir: _StateOpt = None,
    as_json: _JsonOpt = False,
) -> None:
    """Revoke a token: the API refuses it from now on."""
    store = _store(state_dir)
    before = store.get_api_token(token_id)
    token = store.revoke_api_token(token_id, datetime.now(UTC))
    store.close()
    if token is None:
        fail(f"no token {token_id!r} (list them with `burst token list --all`)")
    if as_json:
        print_json(token.as_json())
        return
    already = before is not None and before.revoked_at is not None
    out.print(f"token {token.id} revoked" + (" (it already was)" if already else ""), soft_wrap=True)


def _day(moment: datetime | None) -> str:
    return f"{moment:%Y-%m-%d}" if moment is not None else ""


__all__ = ["token_app"]
