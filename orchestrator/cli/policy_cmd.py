"""`burst policy ...`: validate policy files, print the JSON Schema and the field reference.

A typer sub-app (``policy_app``) that the main CLI mounts as ``burst policy``:

* ``validate FILES...`` loads each file with :func:`orchestrator.policy.load_policy` and prints
  every problem as ``FILE:LINE:COL: field.path: message`` on stderr (the form editors and CI
  annotate), or ``FILE: ok (policy NAME, N offerings)`` on stdout; exit code 1 if any file is bad.
  ``--json`` prints one machine-readable list instead. Never a traceback, whatever the input.
* ``schema`` prints the JSON Schema (``policies/schema.json`` is its output).
* ``reference`` prints the Markdown field reference (``docs/policy-reference.md`` is its output).
"""

from __future__ import annotations

import json
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer

from orchestrator.cli.common import err as _err
from orchestrator.cli.common import out as _out

if TYPE_CHECKING:
    from orchestrator.policy import Policy, Problem

policy_app = typer.Typer(rich_markup_mode=None, 
    help="Check and document bursting policy files (YAML).",
    no_args_is_help=True,
    add_completion=False,
)

# Plain, unwrapped lines (soft_wrap): `FILE:LINE:COL: ...` must stay one line however narrow the
# terminal; the shared consoles print data verbatim (no markup).


@dataclass(slots=True)
class _Result:
    """The outcome of validating one file."""

    file: str
    policy: Policy | None = None
    problems: list[Problem] = field(default_factory=list)
    notes: list[Problem] = field(default_factory=list)  # catalogue warnings, fills, expansions

    @property
    def ok(self) -> bool:
        return self.policy is not None and not self.problems

    def as_json(self) -> dict[str, Any]:
        return {
            "file": self.file,
            "ok": self.ok,
            "problems": [
                {"line": p.line, "column": p.column, "path": p.path, "message": p.message}
                for p in self.problems
            ],
            "notes": [
                {"line": p.line, "column": p.column, "path": p.path, "message": p.message}
                for p in self.notes
            ],
            "offerings": [o.key for o in self.policy.offerings] if self.ok and self.policy else [],
        }


def _validate_file(name: str) -> _Result:
    from orchestrator.catalogue_check import resolve_with_catalogue
    from orchestrator.policy import PolicyError, Problem, load_policy

    path = Path(name)
    name = str(path)  # spelled as load_policy spells it in problems (`./a.yaml` -> `a.yaml`)
    try:
        if path.is_dir():
            hint = f"is a directory; name the policy files in it, e.g. {name.rstrip('/')}/*.yaml"
            return _Result(name, problems=[Problem(name, 1, 1, "<file>", hint)])
        policy = load_policy(path)
        # Checked against the provider catalogues too (an unknown type or region is an error
        # here, not a "no usable offering" decision every tick at run time).
        [expanded], notes = resolve_with_catalogue([policy], [path])
        return _Result(name, policy=expanded, notes=notes)
    except PolicyError as exc:
        return _Result(name, problems=list(exc.problems))
    except Exception as exc:  # noqa: BLE001 - a validator must report, never crash
        detail = " ".join(str(exc).split())  # one line, whatever the exception says
        message = f"internal error while loading: {type(exc).__name__}: {detail}"
        return _Result(name, problems=[Problem(name, 1, 1, "<file>", message)])


@policy_app.command()
def validate(
    files: Annotated[
        list[str], typer.Argument(help="Policy YAML files to check.", show_default=False)
    ],
    as_json: Annotated[
        bool, typer.Option("--json", help="Print a JSON list of results instead of text.")
    ] = False,
) -> None:
    """Check policy files; print every problem as FILE:LINE:COL: field.path: message.

    Exit code 0 when every file is a valid policy, 1 otherwise.
    """
    from rich.text import Text

    results = [_validate_file(name) for name in files]
    if as_json:
        sys.stdout.write(json.dumps([r.as_json() for r in results], indent=2) + "\n")
    else:
        for result in results:
            if result.ok:
                assert result.policy is not None
                count = len(result.policy.offerings)
                line = Text(f"{result.file}: ")
                line.append("ok", style="green")
                line.append(
                    f" (policy {result.policy.name}, {count} offering{'s' if count != 1 else ''})"
                )
                _out.print(line, soft_wrap=True)
            for note in result.notes:
                _err.print(Text(str(note)))
            for problem in result.problems:
                _err.print(Text(str(problem)))
    if not all(r.ok for r in results):
        raise typer.Exit(code=1)


@policy_app.command()
def schema() -> None:
    """Print the JSON Schema of the policy format (the content of policies/schema.json)."""
    from orchestrator.policy.schema import policy_json_schema_text

    sys.stdout.write(policy_json_schema_text())


@policy_app.command()
def reference() -> None:
    """Print the Markdown field reference (the content of docs/policy-reference.md)."""
    from orchestrator.policy.schema import field_reference_markdown

    sys.stdout.write(field_reference_markdown())
