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
import math
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml
from pydantic import BaseModel, ValidationError

from orchestrator.policy.base import NAME_PATTERN
from orchestrator.policy.bounds import (
    CLOUD_NAME_PATTERN,
    CLOUD_NAME_RE,
    TEXT_PATTERN,
    TEXT_RE,
    name_problem,
)
from orchestrator.policy.models import Policy
from orchestrator.policy.reading import (
    MAX_DEPTH,
    MAX_NODES,
    MAX_NUMBER_CHARS,
    InputError,
    InputKind,
    check_text,
    position,
    read_input,
)

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


class _TooDeep(yaml.MarkedYAMLError):
    """Nesting past MAX_DEPTH, raised while composing (PyYAML's composer recurses per level)."""


class _PlainLoader(yaml.SafeLoader):
    """SafeLoader without the timestamp resolver (dates stay strings), composing within
    MAX_DEPTH levels of nesting so that a deep document is an error, not a RecursionError."""

    _depth = 0

    def compose_node(self, parent, index):  # type: ignore[no-untyped-def]
        self._depth += 1
        try:
            if self._depth > MAX_DEPTH:
                mark = self.peek_event().start_mark
                raise _TooDeep(problem=f"nested deeper than {MAX_DEPTH} levels",
                               problem_mark=mark)
            return super().compose_node(parent, index)
        finally:
            self._depth -= 1


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


_MERGE_TAG = "tag:yaml.org,2002:merge"
_SAFE_PATTERNS = {CLOUD_NAME_PATTERN: CLOUD_NAME_RE, TEXT_PATTERN: TEXT_RE}
_NUMBER_TAGS = {"tag:yaml.org,2002:int", "tag:yaml.org,2002:float"}
# Control characters no policy value needs (tab and newline are fine in text).
_CONTROL = re.compile(r"[\x00-\x08\x0b-\x1f\x7f]")


@dataclass(slots=True)
class _Composer:
    """Turns composed YAML nodes into plain data, recording positions and problems on the way."""

    loader: _PlainLoader
    marks: dict[Loc, tuple[int, int]]
    # (location, message, position when it differs from the location's own, e.g. a duplicate key)
    problems: list[tuple[Loc, str, tuple[int, int] | None]]
    # Locations whose value could not be built; validation errors at or below them are noise.
    broken: set[Loc]
    # Values built so far, aliases expanded (one counter shared with merged sub-composers).
    count: list[int] = field(default_factory=lambda: [0])

    def data(self, node: yaml.Node, loc: Loc, active: frozenset[int] = frozenset()) -> Any:
        self.count[0] += 1
        if self.count[0] > MAX_NODES:  # aliases expanding into a huge document
            if self.count[0] == MAX_NODES + 1:
                self._fail(loc, f"expands to more than {MAX_NODES} values (YAML aliases?)",
                           _mark(node))
            self.broken.add(loc)
            return None
        if len(loc) > MAX_DEPTH:  # aliases nesting into each other past the limit
            self._fail(loc[:MAX_DEPTH], f"nested deeper than {MAX_DEPTH} levels", _mark(node))
            return None
        if id(node) in active:  # an alias that refers to one of its own ancestors
            self._fail(loc, "recursive YAML alias")
            return None
        active = active | {id(node)}
        if isinstance(node, yaml.MappingNode):
            return self._mapping(node, loc, active)
        if isinstance(node, yaml.SequenceNode):
            items = []
            for index, item in enumerate(node.value):
                self.marks[loc + (index,)] = _mark(item)
                items.append(self.data(item, loc + (index,), active))
            return items
        return self._scalar(node, loc)

    def _fail(self, loc: Loc, message: str, mark: tuple[int, int] | None = None) -> None:
        self.problems.append((loc, message, mark))
        self.broken.add(loc)

    def _scalar(self, node: yaml.Node, loc: Loc) -> Any:
        if node.tag in _NUMBER_TAGS and len(str(node.value)) > MAX_NUMBER_CHARS:
            self._fail(loc, f"number longer than {MAX_NUMBER_CHARS} characters", _mark(node))
            return None
        try:
            value = self.loader.construct_object(node, deep=True)
        except yaml.YAMLError as exc:  # unknown tag such as !foo or !!python/object
            reason = getattr(exc, "problem", None) or exc
            self._fail(loc, f"unsupported YAML value: {reason}", _mark(node))
            return None
        except (ValueError, TypeError, OverflowError) as exc:  # e.g. !!int on a bad literal
            self._fail(loc, f"unsupported YAML value: {exc}", _mark(node))
            return None
        if isinstance(value, float) and not math.isfinite(value):
            self._fail(loc, f"{node.value!r} is not a finite number", _mark(node))
            return None
        if isinstance(value, str) and (bad := _CONTROL.search(value)):
            self._fail(loc, f"control character {bad.group()!r} at character {bad.start()} of "
                       "the value (write names and text without them)", _mark(node))
            return None
        if isinstance(value, bytes):  # !!binary
            self._fail(loc, "unsupported YAML value: binary data", _mark(node))
            return None
        return value

    def _mapping(self, node: yaml.MappingNode, loc: Loc, active: frozenset[int]) -> dict[str, Any]:
        result: dict[str, Any] = {}
        merges: list[yaml.Node] = []
        for key_node, value_node in node.value:
            if key_node.tag == _MERGE_TAG:
                merges.append(value_node)
                continue
            try:
                key = self.loader.construct_object(key_node, deep=True)
            except yaml.YAMLError as exc:
                message = f"unsupported YAML key: {getattr(exc, 'problem', None) or exc}"
                self.problems.append((loc, message, _mark(key_node)))
                continue
            if not isinstance(key, str):
                message = f"keys must be strings, not {key!r}"
                self.problems.append((loc + (str(key),), message, _mark(key_node)))
                continue
            if key in result:  # reported where the second one is; the first one is validated
                self.problems.append((loc + (key,), f"duplicate key {key!r}", _mark(key_node)))
                continue
            self.marks[loc + (key,)] = _mark(key_node)
            result[key] = self.data(value_node, loc + (key,), active)
        # YAML merge keys (`<<: *defaults`): keys written here win, then earlier merged mappings.
        for merge in merges:
            sources = merge.value if isinstance(merge, yaml.SequenceNode) else [merge]
            for source in sources:
                if not isinstance(source, yaml.MappingNode):
                    message = "'<<' merges a mapping or a list of mappings"
                    self.problems.append((loc + ("<<",), message, _mark(source)))
                    continue
                inner = _Composer(self.loader, {}, self.problems, self.broken, self.count)
                merged = inner.data(source, loc, active)
                for key, value in (merged or {}).items():
                    if key in result:
                        continue
                    result[key] = value
                    for sub_loc, mark in inner.marks.items():
                        if sub_loc[: len(loc) + 1] == loc + (key,):
                            self.marks.setdefault(sub_loc, mark)
        return result


def _yaml_error_message(exc: yaml.YAMLError) -> str:
    problem = getattr(exc, "problem", None)
    context = getattr(exc, "context", None)
    if not problem:
        return str(exc)
    if context and problem.startswith("but "):
        return f"{context}, {problem}"
    return f"{context}: {problem}" if context else problem


def _parse(text: str, file: str) -> tuple[Any, _Positions, list[Problem], set[Loc]]:
    """Parse YAML into data and positions, collecting structural problems instead of raising.

    A syntax error still raises PolicyError at once: nothing after it can be trusted.
    """
    loader = None
    try:
        loader = _PlainLoader(text)  # its reader checks every character at once
        node = loader.get_single_node()
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None) or getattr(exc, "context_mark", None)
        line, column = (mark.line + 1, mark.column + 1) if mark else (1, 1)
        message = f"invalid YAML: {_yaml_error_message(exc)}"
        if isinstance(exc, yaml.reader.ReaderError):  # a character YAML does not allow
            line, column = position(text, exc.position)
            offset = len(text[: exc.position].encode("utf-8"))
            message = (f"invalid YAML: character {chr(exc.character)!r} is not allowed (byte "
                       f"offset {offset})") if isinstance(exc.character, int) else message
        raise PolicyError([Problem(file, line, column, "<yaml>", message)]) from None
    finally:
        if loader is not None:
            loader.dispose()
    marks: dict[Loc, tuple[int, int]] = {(): (1, 1)}
    if node is None:
        return None, _Positions(marks), [], set()
    composer = _Composer(_PlainLoader(""), marks, [], set())
    data = composer.data(node, ())
    positions = _Positions(marks)
    problems = [
        Problem(file, *mark, format_loc(loc), msg) if mark else _problem(file, positions, loc, msg)
        for loc, msg, mark in composer.problems
    ]
    return data, positions, list(dict.fromkeys(problems)), composer.broken


def parse_yaml(text: str, file: str) -> tuple[Any, _Positions]:
    """Parse YAML text into plain data and the position of every key; raise PolicyError."""
    data, positions, problems, _ = _parse(text, file)
    if problems:
        raise PolicyError(problems)
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
    pattern = str(error.get("ctx", {}).get("pattern"))
    if kind == "string_pattern_mismatch" and pattern == NAME_PATTERN:
        return [(loc, f"{error.get('input')!r} is not a valid name: use lower-case letters, "
                      "digits and '-' (at most 63)")]
    if kind == "string_pattern_mismatch" and pattern in _SAFE_PATTERNS:
        return [(loc, str(name_problem(str(error.get("input")), _SAFE_PATTERNS[pattern])))]
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
    try:
        check_text(text, file)
    except InputError as exc:
        raise PolicyError([Problem(file, exc.line, exc.column, "<file>", exc.message)]) from None
    data, positions, problems, broken = _parse(text, file)
    if not isinstance(data, dict):
        if problems:
            raise PolicyError(problems)
        raise PolicyError([Problem(file, 1, 1, "<policy>", "a policy is a YAML mapping of keys")])
    try:
        # JSON mode: strict types, and enums accept their string values.
        policy = Policy.model_validate_json(json.dumps(data, default=str))
    except ValidationError as exc:
        for error in exc.errors(include_url=False):
            for loc, message in _messages(error, Policy):
                if any(loc[: len(bad)] == bad for bad in broken):
                    continue  # already reported: the value could not be read at all
                problems.append(_problem(file, positions, loc, message))
    else:
        if not problems:
            return policy
    problems = list(dict.fromkeys(problems))
    problems.sort(key=lambda p: (p.line, p.column, p.path))
    raise PolicyError(problems)


def load_policy(path: str | Path) -> Policy:
    """Load and validate one policy file; raise PolicyError naming the file."""
    path = Path(path)
    try:
        text = read_input(path, InputKind.POLICY)
    except InputError as exc:
        raise PolicyError([Problem(exc.file, exc.line, exc.column, "<file>", exc.message)]) from None
    return load_policy_text(text, str(path))
