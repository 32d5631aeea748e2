"""`burst provider check` and `burst catalog ...`: test a cloud setup before bursting to it."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from orchestrator.cli.common import POLICY_HELP, fail, load_policies, load_settings, out, print_json

provider_app = typer.Typer(rich_markup_mode=None, help="Check provider setups.", no_args_is_help=True, add_completion=False)
catalog_app = typer.Typer(rich_markup_mode=None, help="The GPU offering and price catalogue.", no_args_is_help=True,
                          add_completion=False)


@provider_app.command("check")
def check_command(
    name: Annotated[str, typer.Argument(help="Provider: aws, gcp, libcloud or local.")],
    policy: Annotated[list[Path] | None, typer.Option("--policy", "-p", help="Policy file(s) naming the provider (repeatable); default: the files in BURST_POLICY_FILES, else the shipped default policy.")] = None,
    as_json: Annotated[bool, typer.Option("--json", help="Print the checks and usable offerings as one JSON object.")] = False,
) -> None:
    """Verify credentials and permissions with a dry run, and list the offerings burst would use."""
    from rich.table import Table
    from rich.text import Text

    from orchestrator.domain.credentials import credentials_message
    from orchestrator.policy import ProviderName
    from orchestrator.wiring import check_provider

    known = [p.value for p in ProviderName]
    if name not in known:
        fail(f"unknown provider {name!r}; known providers: {', '.join(known)}")
    settings = load_settings()
    policies = load_policies(policy, settings)
    rows, usable = check_provider(name, settings, policies)
    ok = all(r.ok for r in rows)
    rows, credentials = _one_credentials_row(rows)
    advice = credentials_message(name, credentials) if credentials else None
    if as_json:
        print_json({"provider": name, "ok": ok, "credentials": advice,
                    "checks": [{"check": r.check, "ok": r.ok, "detail": r.detail} for r in rows],
                    "offerings": [{"key": o.key, "gpus": o.gpus, "gpu_model": o.gpu_model,
                                   "price_usd_hour": o.price_usd_hour} for o in usable]})
    else:
        table = Table(title=f"provider {name}")
        for col in ("check", "result", "detail"):
            table.add_column(col, overflow="fold")
        for r in rows:
            table.add_row(r.check, Text("ok", style="green") if r.ok else Text("FAILED", style="red"),
                          r.detail)
        out.print(table)
        offerings = Table(title="offerings the policy would use")
        for col in ("offering", "GPUs", "GPU model", "$/h"):
            offerings.add_column(col, overflow="fold")
        for o in usable:
            offerings.add_row(o.key, str(o.gpus), o.gpu_model, f"{o.price_usd_hour:.4f}")
        out.print(offerings)
        if advice:
            fail(advice, code=1)
    if not ok:
        raise typer.Exit(1)


def _one_credentials_row(rows: list) -> tuple[list, str | None]:
    """The rows with every credentials failure folded into one ``credentials`` row (at the first
    one's place), and that failure's detail (None when the credentials were accepted): missing
    credentials fail every call the check makes, and saying so once is enough."""
    from orchestrator.domain.credentials import is_credentials_problem
    from orchestrator.domain.ports import CheckRow

    failed = [r for r in rows if not r.ok and is_credentials_problem(r.detail, r.check)]
    if not failed:
        return rows, None
    detail = failed[0].detail
    others = len(failed) - 1
    folded = CheckRow("credentials", False, detail + (
        f" (and {others} more check{'s' if others > 1 else ''} failing the same way)"
        if others else ""))
    kept: list = []
    for row in rows:
        if row is failed[0]:
            kept.append(folded)
        elif row not in failed:
            kept.append(row)
    return kept, detail


@catalog_app.command("refresh")
def refresh_command(
    policy: Annotated[list[Path] | None, typer.Option("--policy", "-p", help="Policy file(s) whose AWS regions and types are refreshed (repeatable); default: the files in BURST_POLICY_FILES, else the shipped default policy.")] = None,
) -> None:
    """Refresh spot prices and GPU facts from the provider APIs (AWS) into the state directory."""
    from orchestrator.domain.credentials import credentials_message, is_credentials_problem
    from orchestrator.domain.ports import ProviderError
    from orchestrator.wiring import ProviderUnavailable, refresh_catalog

    settings = load_settings()
    try:
        count, path = refresh_catalog(settings, load_policies(policy, settings))
    except ProviderError as exc:
        if is_credentials_problem(str(exc)):
            fail(credentials_message(exc.provider, str(exc)))
        fail(f"provider {exc.provider}: {exc.kind}: {exc}")
    except ProviderUnavailable as exc:
        fail(str(exc))
    out.print(f"refreshed {count} offerings into {path}", soft_wrap=True)


@catalog_app.command("list")
def list_command(
    provider: Annotated[str, typer.Argument(help="aws or gcp.")],
    region: Annotated[str | None, typer.Option("--region", help="Only this region.")] = None,
    as_json: Annotated[bool, typer.Option("--json", help="Print the offerings as a JSON list.")] = False,
) -> None:
    """List the catalogue's GPU offerings with prices."""
    from rich.table import Table

    from orchestrator.wiring import catalog_offerings

    try:
        offerings = catalog_offerings(provider, load_settings())
    except ValueError as exc:
        fail(str(exc))
    if region:
        offerings = [o for o in offerings if o.region == region]
    if as_json:
        print_json([{"key": o.key, "gpus": o.gpus, "gpu_model": o.gpu_model, "vcpus": o.vcpus,
                     "memory_gib": o.memory_gib, "price_usd_hour": o.price_usd_hour} for o in offerings])
        return
    table = Table(title=f"{provider} GPU offerings ({len(offerings)})")
    for col in ("region", "zone", "instance type", "market", "GPUs", "GPU model", "$/h"):
        table.add_column(col)
    for o in sorted(offerings, key=lambda o: (o.region, o.instance_type, o.market)):
        table.add_row(o.region, o.zone or "-", o.instance_type, str(o.market), str(o.gpus), o.gpu_model,
                      f"{o.price_usd_hour:.4f}")
    out.print(table)
