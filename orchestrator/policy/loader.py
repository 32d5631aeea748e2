"""Load policy YAML into :class:`Policy`, reporting every problem as ``FILE:LINE:COL: path: message``.

YAML is composed into nodes first so that every key and list item keeps its position; pydantic's
error locations are then mapped back to those positions. All problems of a file are reported at
once (unknown keys, wrong types, bad durations, inconsistent limits), never a traceback.

YAML timestamps are *not* resolved (``2026-01-01`` stays a string) and duplicate keys are an
error, so what the user wrote is what gets validated.
"""

from __future__ import annotations

import difflib
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml
from pydantic import BaseModel, ValidationError

from orchestrator.policy.models import Policy

Loc = tuple[str | int, ...]


@dataclass(frozen=True, slots=True)
class Problem:
    """One problem found in a policy file."""

    file: str
    line: int
    column: int
    path: str
    message: str

    def __str__(self) -> str:
        return f"{self.file}:{self.line}:{self.column}: {self.path}: {self.message}"


class PolicyError(Exception):
    """A policy file failed to load; ``problems`` lists every problem found."""

    def __init__(self, problems: list[Problem]):
        self.problems = problems
        super().__init__("\n".join(str(p) for p in problems))


class _PlainLoader(yaml.SafeLoader):
    """SafeLoader without the timestamp resolver: dates stay strings."""


_PlainLoader.yaml_implicit_resolvers = {
    first: [(tag, regexp) for tag, regexp in resolvers if tag != "tag:yaml.org,2002:timestamp"]
    for first, resolvers in yaml.SafeLoader.yaml_implicit_resolvers.items()
}


@dataclass(slots=True)
class _Positions:
    """Line/column (1-based) of every key and item, by location path."""

    marks: dict[Loc, tuple[int, int]]

    def find(self, loc: Loc) -> tuple[int, int]:
        # A missing key has no position of its own: point at its closest existing parent.
        for end in range(len(loc), -1, -1):
            mark = self.marks.get(loc[:end])
            if mark is not None:
                return mark
        return (1, 1)


def _mark(node: yaml.Node) -> tuple[int, int]:
    return (node.start_mark.line + 1, node.start_mark.column + 1)


def _to_data(
    node: yaml.Node, loader: _PlainLoader, loc: Loc, marks: dict[Loc, tuple[int, int]],
    problems: list[tuple[Loc, str]],
) -> Any:
    if isinstance(node, yaml.MappingNode):
        result: dict[str, Any] = {}
        for key_node, value_node in node.value:
            key = loader.construct_object(key_node)
            if not isinstance(key, str):
                marks[loc + (str(key),)] = _mark(key_node)
                problems.append((loc + (str(key),), f"keys must be strings, not {key!r}"))
                continue
            marks[loc + (key,)] = _mark(key_node)
            if key in result:
                problems.append((loc + (key,), f"duplicate key {key!r}"))
                continue
            result[key] = _to_data(value_node, loader, loc + (key,), marks, problems)
        return result
    if isinstance(node, yaml.SequenceNode):
        items = []
        for index, item in enumerate(node.value):
            marks[loc + (index,)] = _mark(item)
            items.append(_to_data(item, loader, loc + (index,), marks, problems))
        return items
    return loader.construct_object(node, deep=True)


def parse_yaml(text: str, file: str) -> tuple[Any, _Positions]:
    """Parse YAML text into plain data and the position of every key; raise PolicyError."""
    loader = _PlainLoader(text)
    try:
        node = loader.get_single_node()
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None) or getattr(exc, "context_mark", None)
        line, column = (mark.line + 1, mark.column + 1) if mark else (1, 1)
        problem = getattr(exc, "problem", None) or str(exc)
        raise PolicyError([Problem(file, line, column, "<yaml>", f"invalid YAML: {problem}")]) from None
    finally:
        loader.dispose()
    marks: dict[Loc, tuple[int, int]] = {(): (1, 1)}
    if node is None:
        return None, _Positions(marks)
    problems: list[tuple[Loc, str]] = []
    data = _to_data(node, _PlainLoader(""), (), marks, problems)
    positions = _Positions(marks)
    if problems:
        raise PolicyError([_problem(file, positions, loc, msg) for loc, msg in problems])
    return data, positions


def format_loc(loc: Loc) -> str:
    """``('offerings', 0, 'market')`` -> ``offerings[0].market``."""
    text = ""
    for part in loc:
        if isinstance(part, int):
            text += f"[{part}]"
        else:
            text += ("." if text else "") + part
    return text or "<policy>"


def _parse_loc(text: str) -> Loc:
    loc: list[str | int] = []
    for part in text.replace("]", "").split("."):
        name, *indexes = part.split("[")
        if name:
            loc.append(name)
        loc.extend(int(i) for i in indexes)
    return tuple(loc)


def _problem(file: str, positions: _Positions, loc: Loc, message: str) -> Problem:
    line, column = positions.find(loc)
    return Problem(file, line, column, format_loc(loc), message)


def _known_fields(model: type[BaseModel], loc: Loc) -> list[str]:
    """Field names of the model found at ``loc`` (for 'did you mean' hints)."""
    current: Any = model
    for part in loc:
        if isinstance(part, int):
            continue
        field = getattr(current, "model_fields", {}).get(part)
        if field is None:
            return []
        annotation = field.annotation
        current = _model_in(annotation)
        if current is None:
            return []
    return list(getattr(current, "model_fields", {}))


def _model_in(annotation: Any) -> type[BaseModel] | None:
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return annotation
    for arg in getattr(annotation, "__args__", ()) or ():
        found = _model_in(arg)
        if found is not None:
            return found
    return None


def _messages(error: dict[str, Any], model: type[BaseModel]) -> list[tuple[Loc, str]]:
    loc: Loc = tuple(error["loc"])
    kind = error["type"]
    if kind == "extra_forbidden":
        key = str(loc[-1])
        known = _known_fields(model, loc[:-1])
        hint = difflib.get_close_matches(key, known, n=1)
        suffix = f" (did you mean {hint[0]!r}?)" if hint else ""
        return [(loc, f"unknown key {key!r}{suffix}")]
    if kind == "missing":
        return [(loc, "required key is missing")]
    if kind == "string_pattern_mismatch" and "a-z0-9" in str(error.get("ctx", {}).get("pattern")):
        return [(loc, f"{error.get('input')!r} is not a valid name: use lower-case letters, "
                      "digits and '-' (at most 63)")]
    message = str(error["msg"])
    if message.startswith("Value error, "):
        message = message[len("Value error, ") :]
    if kind == "literal_error" and loc == ("version",):
        return [(loc, f"unsupported policy version {error.get('input')!r}; expected 1")]
    if kind.endswith("_type") or kind in {"enum", "literal_error"}:
        message = f"{message} (got {json.dumps(error.get('input'), default=str)})"
    results = []
    for line in message.split("\n"):
        if line.startswith("@") and ": " in line:
            field, rest = line[1:].split(": ", 1)
            results.append((loc + _parse_loc(field), rest))
        else:
            results.append((loc, line))
    return results


def load_policy_text(text: str, file: str = "<policy>") -> Policy:
    """Validate policy YAML text; raise PolicyError listing every problem."""
    data, positions = parse_yaml(text, file)
    if not isinstance(data, dict):
        raise PolicyError([Problem(file, 1, 1, "<policy>", "a policy is a YAML mapping of keys")])
    try:
        # JSON mode: strict types, and enums accept their string values.
        return Policy.model_validate_json(json.dumps(data, default=str))
    except ValidationError as exc:
        problems = []
        for error in exc.errors(include_url=False):
            for loc, message in _messages(error, Policy):
                problems.append(_problem(file, positions, loc, message))
        problems.sort(key=lambda p: (p.line, p.column, p.path))
        raise PolicyError(problems) from None


def load_policy(path: str | Path) -> Policy:
    """Load and validate one policy file; raise PolicyError naming the file."""
    path = Path(path)
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as exc:
        raise PolicyError([Problem(str(path), 1, 1, "<file>", f"cannot read: {exc.strerror}")]) from None
    return load_policy_text(text, str(path))
