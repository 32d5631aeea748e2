"""Process log output: plain text or one JSON object a line (``BURST_LOG_FORMAT``).

:func:`setup_logging` configures the root logger of a burst process. With ``json`` every record is
one line holding ``time`` (UTC, ISO 8601), ``level``, ``logger``, ``message`` and, where known, the
ids of the ``policy``, ``node``, ``job`` and ``decision`` it is about: from the record's ``extra``
(``log.info("...", extra={"node": node.id})``) or from the ids the code around it bound with
:func:`log_context` (a contextvar, so each thread and task sees its own). An exception adds ``exc``
(the formatted traceback). Standard library only: every layer may import it.
"""

from __future__ import annotations

import contextlib
import contextvars
import json
import logging
import sys
from collections.abc import Iterator
from datetime import UTC, datetime
from enum import Enum

# The ids a line may carry, in the order they are written.
CONTEXT_KEYS = ("policy", "node", "job", "decision")

_context: contextvars.ContextVar[dict[str, str]] = contextvars.ContextVar(
    "burst_log_context", default={})  # noqa: B039 - never mutated: each bind sets a new dict


class LogFormat(str, Enum):
    """How a process writes its log lines."""

    TEXT = "text"
    JSON = "json"


@contextlib.contextmanager
def log_context(**ids: str | None) -> Iterator[None]:
    """Bind ids (``policy=``, ``node=``, ``job=``, ``decision=``) to the lines logged inside."""
    unknown = set(ids) - set(CONTEXT_KEYS)
    if unknown:
        raise ValueError(f"log_context: unknown id(s) {', '.join(sorted(unknown))}; "
                         f"known: {', '.join(CONTEXT_KEYS)}")
    bound = {**_context.get(), **{k: str(v) for k, v in ids.items() if v is not None}}
    token = _context.set(bound)
    try:
        yield
    finally:
        _context.reset(token)


def current_context() -> dict[str, str]:
    """The ids bound here now (a copy)."""
    return dict(_context.get())


class JsonFormatter(logging.Formatter):
    """One JSON object a line: time, level, logger, message, the ids known, exc."""

    def format(self, record: logging.LogRecord) -> str:
        line: dict[str, object] = {
            "time": datetime.fromtimestamp(record.created, UTC).isoformat(timespec="milliseconds"),
            "level": record.levelname,
            "logger": record.name,
            "message": record.getMessage(),
        }
        bound = _context.get()
        for key in CONTEXT_KEYS:
            # An id given with the record (extra=) is the more specific: it wins over the bound one.
            value = getattr(record, key, None) or bound.get(key)
            if value is not None:
                line[key] = str(value)
        if record.exc_info:
            line["exc"] = self.formatException(record.exc_info)
        elif record.exc_text:
            line["exc"] = record.exc_text
        # default=str: a message argument of any type still gives one valid line.
        return json.dumps(line, ensure_ascii=False, default=str)


_HANDLER_NAME = "burst"
TEXT_FORMAT = "%(asctime)s %(levelname)s %(name)s: %(message)s"


def formatter(fmt: LogFormat | str) -> logging.Formatter:
    """The formatter of ``fmt`` (``text`` or ``json``); ValueError for anything else."""
    try:
        kind = LogFormat(str(getattr(fmt, "value", fmt)).lower())
    except ValueError:
        raise ValueError(f"log format {fmt!r}: expected text or json") from None
    return JsonFormatter() if kind is LogFormat.JSON else logging.Formatter(TEXT_FORMAT)


def setup_logging(level: str, fmt: LogFormat | str = LogFormat.TEXT) -> None:
    """The root logger at ``level`` writing ``fmt`` lines to stderr (replacing earlier handlers)."""
    chosen = formatter(fmt)
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(chosen)
    handler.set_name(_HANDLER_NAME)
    root = logging.getLogger()
    # Only a handler set up here before is replaced: others (a test's capture) stay.
    for old in [h for h in root.handlers if h.get_name() == _HANDLER_NAME]:
        root.removeHandler(old)
    root.addHandler(handler)
    root.setLevel(getattr(logging, level.upper(), logging.INFO))
    # JSON: Python warnings (a library's DeprecationWarning, Celery's SecurityWarning) become
    # records too, not free text between the JSON lines.
    logging.captureWarnings(isinstance(chosen, JsonFormatter))
