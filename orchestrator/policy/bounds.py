"""Sane bounds of the numbers and names every input format carries (policy, snapshot, trace, API).

One table, so that a policy, a snapshot and an API request agree on what a GPU count or a price
can be. The bounds are far beyond any real cluster and far inside what the arithmetic downstream
survives: a value past them is a typo or an attack, refused with an error naming the field.
"""

from __future__ import annotations

import re

MAX_GPUS_PER_NODE = 64  # the largest GPU servers carry 8-16; a node is one machine
MAX_JOB_GPUS = 4096  # a job spans several nodes (multi-node training)
MAX_NODES = 10_000  # nodes of one pool, of one offering, launches at once
MAX_POOL_GPUS = MAX_NODES * MAX_GPUS_PER_NODE  # GPUs of a pool, on-prem or burst
MAX_PRICE_USD_HOUR = 10_000  # one node's hourly price (an 8-GPU H100 node is ~$100/h)
MAX_USD = 1_000_000_000_000  # budget limits and observed spend
MAX_PRIORITY = 1_000_000  # job and project priorities, either sign
MAX_WEIGHT = 1_000_000  # fair-share weights
MAX_PERCENT = 10_000  # budget grades (a grade past 100 % acts after the limit is exceeded)
MAX_COUNT = 10_000_000  # counters: running jobs, launch attempts
MAX_NAME_CHARS = 255
# A trace's submit times and run times: the real traces span at most 150 days; a year bounds the
# simulated time (the simulator ticks every minute while work is in flight).
MAX_TRACE_S = 366 * 86_400

# Names a cloud gives (instance types, regions, zones, GPU accelerator types): letters, digits,
# '.', '_' and '-', starting with a letter or digit. No '$', braces, slashes, blanks or control
# characters, so a name can never be read as a template, a path or a shell word.
CLOUD_NAME_PATTERN = r"^[A-Za-z0-9][A-Za-z0-9._-]{0,127}$"
# Identifiers burst or a queue hands out (job, node, request and instance ids, offering keys,
# project names of a queue): also ':', '/', '@', '+', '=', ',' and the brackets of Slurm array ids.
ID_PATTERN = r"^[A-Za-z0-9_][A-Za-z0-9._:/@+=,\[\]-]{0,254}$"
# Free text (reasons, GPU models): any printable character, no control characters.
TEXT_PATTERN = r"^[^\x00-\x1f\x7f]{0,1000}$"

CLOUD_NAME_RE = re.compile(CLOUD_NAME_PATTERN)
ID_RE = re.compile(ID_PATTERN)
TEXT_RE = re.compile(TEXT_PATTERN)


def name_problem(value: str, pattern: re.Pattern[str]) -> str | None:
    """Why ``value`` is not a safe name of ``pattern``'s kind, or None if it is."""
    if pattern.fullmatch(value):
        return None
    shown = repr(value[:60]) + ("..." if len(value) > 60 else "")
    if pattern is CLOUD_NAME_RE:
        return (f"{shown} is not a valid cloud name: use letters, digits, '.', '_' and '-' "
                "(at most 128)")
    if pattern is ID_RE:
        return (f"{shown} is not a valid identifier: use letters, digits and ._:/@+=,[]- "
                f"(at most {MAX_NAME_CHARS}, no blanks or control characters)")
    return f"{shown} is not valid text: no control characters, at most 1000 characters"
