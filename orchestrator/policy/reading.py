"""Reading input files with limits: the one place policies, snapshots and traces are read from disk.

Every input burst reads from a file (policy YAML, snapshot JSON, trace CSV) goes through here, so
that a hostile or broken file gets one clear error naming the file and the position, never a
traceback:

* a size limit per kind of file, checked before the file is decoded;
* UTF-8 decoding, an error naming the BYTE offset (and line:column) of the first bad byte;
* NUL characters refused with their position (no format burst reads needs one);
* for JSON: a nesting-depth limit (Python's parser recurses and dies at ~1,000 levels), numbers of
  at most :data:`MAX_NUMBER_CHARS` characters (Python refuses to convert integers of more than
  4,300 digits) and no ``NaN``/``Infinity``, which are not JSON.

The YAML-specific limits (nesting, alias expansion, number length) live in the policy loader,
which owns the YAML composer; it takes its numbers from here.
"""

from __future__ import annotations

import json
import math
import re
from dataclasses import dataclass
from enum import StrEnum
from pathlib import Path
from typing import Any


class InputKind(StrEnum):
    """The kinds of input file, each with its own size limit."""

    POLICY = "policy"
    SNAPSHOT = "snapshot"
    TRACE = "trace"


# A policy is a page or two of YAML; a snapshot holds a whole queue and fleet (a few hundred bytes
# per job and node); the real traces in the shared data are under 4 MiB per folder. The limits
# leave room for far larger inputs while refusing a file that would exhaust memory.
# A policy's limit is lower: YAML is parsed in pure Python (some 20 KB/s for nested flow
# collections on a busy 2-core machine), so 256 KiB bounds the time a hostile policy can take.
MAX_BYTES = {InputKind.POLICY: 256 << 10, InputKind.SNAPSHOT: 64 << 20, InputKind.TRACE: 512 << 20}
# Deepest nesting of lists and mappings: a snapshot nests 6 levels, a policy 5.
MAX_DEPTH = 32
# Longest number literal, in characters: ample for any count, price or timestamp.
MAX_NUMBER_CHARS = 40
# Most YAML nodes a policy may expand to, aliases included (stops "billion laughs" documents).
MAX_NODES = 100_000


@dataclass(eq=False)  # an exception: mutable (tracebacks, notes) and hashable by identity
class InputError(Exception):
    """A file could not be read as input; ``str()`` is ``FILE:LINE:COL: message``."""

    file: str
    line: int
    column: int
    message: str

    def __str__(self) -> str:
        return f"{self.file}:{self.line}:{self.column}: {self.message}"


def position(text: str, index: int) -> tuple[int, int]:
    """1-based line and column of character ``index`` of ``text``."""
    line = text.count("\n", 0, index) + 1
    return line, index - (text.rfind("\n", 0, index) + 1) + 1


def read_input(path: str | Path, kind: InputKind) -> str:
    """The text of an input file, read within its size limit, decoded and checked.

    Raises :class:`InputError` for a missing or unreadable file, a file over the limit, bytes that
    are not UTF-8 and NUL characters.
    """
    path = Path(path)
    file = str(path)
    limit = MAX_BYTES[kind]
    try:
        if path.is_dir():
            raise InputError(file, 1, 1, "cannot read: is a directory")
        with path.open("rb") as handle:
            data = handle.read(limit + 1)
    except OSError as exc:
        raise InputError(file, 1, 1, f"cannot read: {exc.strerror or exc}") from None
    except ValueError as exc:  # a path with a NUL byte in its name
        raise InputError(file, 1, 1, f"cannot read: {exc}") from None
    if len(data) > limit:
        raise InputError(file, 1, 1, f"file is larger than the {_size(limit)} a {kind} file "
                         "may be")
    return decode_input(data, file)


def _size(limit: int) -> str:
    return f"{limit >> 20} MiB" if limit >= 1 << 20 else f"{limit >> 10} KiB"


def decode_input(data: bytes, file: str) -> str:
    """``data`` decoded as UTF-8 and checked for NUL; :class:`InputError` names the byte offset."""
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as exc:
        start = exc.start
        line = data.count(b"\n", 0, start) + 1
        column = start - (data.rfind(b"\n", 0, start) + 1) + 1
        raise InputError(file, line, column, f"not UTF-8 text: byte {data[start]:#04x} at byte "
                         f"offset {start}") from None
    check_text(text, file)
    return text


def check_text(text: str, file: str) -> None:
    """Refuse NUL characters, naming the first one's line, column and byte offset."""
    index = text.find("\x00")
    if index >= 0:
        line, column = position(text, index)
        offset = len(text[:index].encode("utf-8"))
        raise InputError(file, line, column, f"NUL character at byte offset {offset}")


# A JSON string literal (to skip brackets inside strings) or one bracket.
_JSON_TOKENS = re.compile(r'"(?:[^"\\]|\\.)*"|[\[\]{}]', re.DOTALL)


def check_json_depth(text: str, file: str, max_depth: int = MAX_DEPTH) -> None:
    """Refuse JSON nested deeper than ``max_depth``, naming where the limit is crossed."""
    depth = 0
    for match in _JSON_TOKENS.finditer(text):
        token = match.group()
        if token in "[{":
            depth += 1
            if depth > max_depth:
                line, column = position(text, match.start())
                raise InputError(file, line, column, f"nested deeper than {max_depth} levels")
        elif token in "]}":
            depth -= 1


def load_json(text: str, file: str) -> Any:
    """Parse JSON text within the limits; :class:`InputError` names the position of a problem."""
    check_text(text, file)
    check_json_depth(text, file)

    def number(literal: str, kind: type) -> Any:
        if len(literal) > MAX_NUMBER_CHARS:
            line, column = position(text, text.find(literal))
            raise InputError(file, line, column, f"number longer than {MAX_NUMBER_CHARS} "
                             f"characters: {literal[:20]}...")
        value = kind(literal)
        if kind is float and not math.isfinite(value):
            line, column = position(text, text.find(literal))
            raise InputError(file, line, column, f"number out of range: {literal}")
        return value

    def constant(name: str) -> Any:
        line, column = position(text, text.find(name))
        raise InputError(file, line, column, f"{name} is not a JSON number")

    try:
        return json.loads(text, parse_int=lambda s: number(s, int),
                          parse_float=lambda s: number(s, float), parse_constant=constant)
    except json.JSONDecodeError as exc:
        raise InputError(file, exc.lineno, exc.colno, f"invalid JSON: {exc.msg}") from None
    except RecursionError:  # pragma: no cover - check_json_depth stops it first
        raise InputError(file, 1, 1, f"nested deeper than {MAX_DEPTH} levels") from None
