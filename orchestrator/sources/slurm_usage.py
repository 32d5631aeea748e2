"""What Slurm accounting says of an on-prem job's GPU use: ``sacct`` TRES usage, parsed.

burst has no agent on on-prem Slurm nodes, so their jobs' GPU use is what the site's accounting
collects. Where the site gathers GPU metrics (``AcctGatherProfile``/NVML: the ``gres/gpuutil``
and ``gres/gpumem`` TRES, Slurm 23.02+ with CUDA 12), ``sacct`` reports per job step
``TRESUsageInAve`` (average utilisation in percent, average memory in bytes) and
``TRESUsageInMax`` (peaks). Elsewhere only the allocation is known (``AllocTRES`` ``gres/gpu=N``
times ``Elapsed``): the job is *allocation only*, its utilisation unknown, never 0.

:data:`SACCT_FIELDS` is what to ask for (``sacct -P -X``-less, so that steps come too:
``sacct --parsable2 --format=<SACCT_FIELDS> --starttime ... --state CD,F,TO,CA,PR,NF,OOM``);
:func:`parse_sacct_usage` reads that (or any ``-p``/``-P`` output with a header naming its
fields) into one :class:`AccountedJob` per job: the ``.extern`` step (the job's adopted
processes, not its work) is ignored; the other steps' averages are weighted by their elapsed time
when given; the peak memory is the largest step ``TRESUsageInMax`` (else ``Ave``). A value that
is not a finite number, or a utilisation outside 0-100 (sites without GPU metrics report
"infinite values"), is unknown.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from datetime import UTC, datetime

from orchestrator.policy.timefmt import TimeFormatError, parse_aware

SACCT_FIELDS = ("JobID", "User", "Account", "QOS", "Start", "End", "Elapsed", "AllocTRES",
                "TRESUsageInAve", "TRESUsageInMax")
FINISHED_STATES = "CD,F,TO,CA,PR,NF,OOM,DL"  # ended jobs, whatever the reason
MIB = 2**20


@dataclass(frozen=True, slots=True)
class AccountedJob:
    """One Slurm job as accounting sees it. None: accounting did not say (unknown)."""

    job_id: str
    user: str | None
    account: str | None  # the project: its account, else its QOS (None: neither)
    started_at: datetime | None
    ended_at: datetime | None
    elapsed_s: float | None
    gpus: int | None  # AllocTRES gres/gpu
    mean_utilisation_percent: float | None  # gres/gpuutil, time-weighted over the steps
    peak_memory_mib: float | None  # gres/gpumem

    @property
    def measured(self) -> bool:
        return self.mean_utilisation_percent is not None


def parse_tres(text: str) -> dict[str, str]:
    """``cpu=00:56:24,gres/gpumem=40777023488,gres/gpuutil=100`` -> {name: value}."""
    pairs = {}
    for part in (text or "").split(","):
        name, sep, value = part.partition("=")
        if sep and name.strip():
            pairs[name.strip()] = value.strip()
    return pairs


def _finite(text: str | None) -> float | None:
    if text is None:
        return None
    try:
        value = float(text)
    except ValueError:
        return None
    return value if math.isfinite(value) and value >= 0 else None


def _utilisation(tres: dict[str, str]) -> float | None:
    value = _finite(tres.get("gres/gpuutil"))
    return value if value is not None and value <= 100 else None


def parse_elapsed(text: str | None) -> float | None:
    """sacct's ``[DD-[HH:]]MM:SS`` as seconds; None when absent or unreadable."""
    if not text:
        return None
    days, _, clock = text.strip().rpartition("-")
    try:
        numbers = [float(p) for p in clock.split(":")]
        whole_days = float(days or 0)
    except ValueError:
        return None
    if not 1 <= len(numbers) <= 3:
        return None
    seconds = 0.0
    for number in numbers:
        seconds = seconds * 60 + number
    return whole_days * 86400 + seconds


def _time(text: str | None) -> datetime | None:
    """sacct's local-time ISO stamp (``2024-10-08T12:00:00``), read as UTC (set ``TZ=UTC`` for
    sacct); ``Unknown``/``None`` are None."""
    if not text or text in ("Unknown", "None"):
        return None
    try:
        return parse_aware(text, "sacct time", assume_utc=True)
    except TimeFormatError:
        return None


@dataclass
class _Steps:
    weight: float = 0.0
    weighted: float = 0.0
    unweighted: list[float] | None = None
    peak: float | None = None


def sacct_command(since: datetime, until: datetime) -> list[str]:
    """The sacct call for jobs that ended in [since, until) (times in UTC: run it with TZ=UTC)."""
    fmt = "%Y-%m-%dT%H:%M:%S"
    return ["sacct", "--parsable2", "--allusers", "--starttime",
            since.astimezone(UTC).strftime(fmt), "--endtime", until.astimezone(UTC).strftime(fmt),
            "--state", FINISHED_STATES, f"--format={','.join(SACCT_FIELDS)}"]


def parse_sacct_usage(text: str) -> dict[str, AccountedJob]:
    """One :class:`AccountedJob` per job id in ``sacct -p``/``-P`` output with a header."""
    lines = [line for line in text.splitlines() if line.strip()]
    if not lines:
        return {}
    header = [h.strip() for h in lines[0].rstrip("|").split("|")]
    jobs: dict[str, dict[str, str]] = {}
    steps: dict[str, _Steps] = {}
    for line in lines[1:]:
        row = dict(zip(header, (c.strip() for c in line.rstrip("|").split("|")), strict=False))
        raw_id = row.get("JobID", "")
        if not raw_id:
            continue
        job_id, _, step = raw_id.partition(".")
        if not step:
            jobs[job_id] = row
            steps.setdefault(job_id, _Steps())
            continue
        if step == "extern":
            continue  # the job's adopted processes, not its work
        acc = steps.setdefault(job_id, _Steps())
        ave, peak = parse_tres(row.get("TRESUsageInAve", "")), parse_tres(
            row.get("TRESUsageInMax", ""))
        util = _utilisation(ave)
        if util is not None:
            elapsed = parse_elapsed(row.get("Elapsed"))
            if elapsed:
                acc.weight += elapsed
                acc.weighted += util * elapsed
            else:
                acc.unweighted = (acc.unweighted or []) + [util]
        memory = _finite(peak.get("gres/gpumem")) if "gres/gpumem" in peak else _finite(
            ave.get("gres/gpumem"))
        if memory is not None:
            acc.peak = max(acc.peak or 0.0, memory / MIB)
    found = {}
    for job_id, acc in steps.items():
        row = jobs.get(job_id, {})
        alloc = parse_tres(row.get("AllocTRES", ""))
        gpus = _finite(alloc.get("gres/gpu"))
        if acc.weight > 0:
            mean: float | None = acc.weighted / acc.weight
        elif acc.unweighted:
            mean = sum(acc.unweighted) / len(acc.unweighted)
        else:
            mean = None
        found[job_id] = AccountedJob(
            job_id=job_id, user=row.get("User") or None,
            account=row.get("Account") or row.get("QOS") or None,
            started_at=_time(row.get("Start")), ended_at=_time(row.get("End")),
            elapsed_s=parse_elapsed(row.get("Elapsed")),
            gpus=None if gpus is None else int(gpus),
            mean_utilisation_percent=None if mean is None else round(mean, 2),
            peak_memory_mib=None if acc.peak is None else round(acc.peak, 1))
    return found


__all__ = ["AccountedJob", "FINISHED_STATES", "SACCT_FIELDS", "parse_elapsed",
           "parse_sacct_usage", "parse_tres", "sacct_command"]
