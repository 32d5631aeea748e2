"""Job traces: the canonical CSV format, and loaders for the real traces in the shared data.

The canonical format is a CSV with the header ``job_id,submit_s,duration_s,gpus,project,priority``:
seconds from the start of the trace, the run time in seconds, the GPUs the job needs, and an
optional project and integer priority (empty: ``""`` and 0). An optional last column
``dataset_gb`` gives the GB of data a burst must stage for the job (empty, or a trace without the
column: the policy's ``storage`` for the job's project decides; none: no data moves). Rows may come in any order; loading
sorts them by submit time (then file order).

Loaders turn the real traces into that form (see ``docs/simulator.md`` for every choice made):

* ``itp``: Microsoft ITP ElasticFlow traces (10 clusters, 69,351 jobs, MIT): the cluster is the
  project, job ids are ``clusterNN/uuid``;
* ``philly``: the 15,000-job Microsoft Philly excerpt (CC BY 4.0): submit time is the running sum
  of ``interval``, the user is the project (``user42``);
* ``alibaba``: Alibaba GPU v2023 "openb" pods: pods with at least one GPU (a GPU-sharing pod
  counts as one whole GPU) that were scheduled; run time is deletion minus scheduling; the QoS
  class is the project.

Named traces are found under ``$BURST_TRACE_DIR`` (default: ``../shared/data`` beside the
checkout); ``itp-sample`` ships inside the package so ``burst simulate`` works on a fresh clone.
"""

from __future__ import annotations

import csv
import io
import os
from dataclasses import dataclass
from importlib import resources
from pathlib import Path

from orchestrator.policy import bounds
from orchestrator.policy.reading import (
    MAX_NUMBER_CHARS,
    InputError,
    InputKind,
    check_text,
    read_input,
)

COLUMNS = ("job_id", "submit_s", "duration_s", "gpus", "project", "priority")
DATASET_COLUMN = "dataset_gb"  # optional, last
MAX_DATASET_GB = 10_000_000  # 10 PB, as pool.storage.datasets[].size_gb
TRACE_DIR_ENV = "BURST_TRACE_DIR"
ITP_DIR = "microsoft-itp-elasticflow-traces"
PHILLY_DIR = "philly-15k-dirlab"
ALIBABA_DIR = "alibaba-gpu-v2023-openb"
SAMPLE = "itp-sample"
NAMES = ("itp", "philly", "alibaba", SAMPLE)


class TraceError(Exception):
    """A trace could not be loaded; the message names the file, line and column at fault."""


@dataclass(frozen=True, slots=True)
class TraceJob:
    """One job of a trace: when it arrives, how long it runs, how many GPUs it needs."""

    job_id: str
    submit_s: float
    duration_s: float
    gpus: int
    project: str = ""
    priority: int = 0
    dataset_gb: float | None = None  # None: the policy's storage decides


@dataclass(frozen=True, slots=True)
class Trace:
    """A trace: its jobs in submit order, a short name, and where it came from."""

    name: str
    jobs: tuple[TraceJob, ...]
    source: str

    @property
    def gpu_hours(self) -> float:
        return sum(j.gpus * j.duration_s for j in self.jobs) / 3600.0

    @property
    def span_s(self) -> float:
        if not self.jobs:
            return 0.0
        return max(j.submit_s + j.duration_s for j in self.jobs) - self.jobs[0].submit_s

    def first_days(self, days: float) -> Trace:
        """The jobs submitted within ``days`` of the first submit (the benches' ``--days``),
        named ``name[Nd]``."""
        if not self.jobs:
            return self
        end = self.jobs[0].submit_s + days * 86400
        return Trace(f"{self.name}[{days:g}d]", tuple(j for j in self.jobs if j.submit_s < end),
                     self.source)


def _sorted(jobs: list[TraceJob]) -> tuple[TraceJob, ...]:
    return tuple(sorted(jobs, key=lambda j: j.submit_s))  # stable: file order breaks ties


# -- the canonical CSV ---------------------------------------------------------------------------


def parse_canonical(text: str, where: str) -> tuple[TraceJob, ...]:
    """Jobs of a canonical trace CSV; :class:`TraceError` names ``where``, the line and column."""
    try:
        check_text(text, where)
    except InputError as exc:
        raise TraceError(str(exc)) from None
    reader = csv.reader(io.StringIO(text))
    try:
        return _parse_rows(reader, where)
    except csv.Error as exc:  # e.g. a field past the csv module's size limit
        raise TraceError(f"{where}:{reader.line_num}: not CSV: {exc}") from None


def _parse_rows(reader, where: str) -> tuple[TraceJob, ...]:  # type: ignore[no-untyped-def]
    header = next(reader, None)
    if header is None:
        raise TraceError(f"{where}: empty file; expected the header {','.join(COLUMNS)}")
    names = tuple(h.strip() for h in header)
    if names not in (COLUMNS, (*COLUMNS, DATASET_COLUMN)):
        got = ",".join(header)[:200]
        raise TraceError(f"{where}:1: expected the header {','.join(COLUMNS)} (and optionally "
                         f",{DATASET_COLUMN}), got {got}")
    width = len(names)
    jobs: list[TraceJob] = []
    seen: dict[str, int] = {}
    for row in reader:
        line = reader.line_num
        if not row or all(not cell.strip() for cell in row):
            continue
        if len(row) != width:
            raise TraceError(f"{where}:{line}: expected {width} columns, got {len(row)}")
        job_id, submit, duration, gpus, project, priority, *rest = (cell.strip() for cell in row)
        if not job_id:
            raise TraceError(f"{where}:{line}: job_id: must not be empty")
        for column, value in (("job_id", job_id), ("project", project)):
            if value and (problem := bounds.name_problem(value, bounds.ID_RE)):
                raise TraceError(f"{where}:{line}: {column}: {problem}")
        if job_id in seen:
            raise TraceError(f"{where}:{line}: job_id: {job_id!r} repeats line {seen[job_id]}")
        seen[job_id] = line
        submit_s = _number(submit, where, line, "submit_s")
        duration_s = _number(duration, where, line, "duration_s")
        count = _integer(gpus, where, line, "gpus")
        if count < 1:
            raise TraceError(f"{where}:{line}: gpus: must be at least 1, got {count}")
        if count > bounds.MAX_JOB_GPUS:
            raise TraceError(f"{where}:{line}: gpus: must be at most {bounds.MAX_JOB_GPUS}, got "
                             f"{count}")
        rank = _integer(priority, where, line, "priority") if priority else 0
        if abs(rank) > bounds.MAX_PRIORITY:
            raise TraceError(f"{where}:{line}: priority: must be between -{bounds.MAX_PRIORITY} "
                             f"and {bounds.MAX_PRIORITY}, got {rank}")
        dataset = _dataset_gb(rest[0], where, line) if rest and rest[0] else None
        jobs.append(TraceJob(job_id, submit_s, duration_s, count, project, rank, dataset))
    return _sorted(jobs)


def _dataset_gb(text: str, where: str, line: int) -> float:
    if len(text) > MAX_NUMBER_CHARS:
        raise TraceError(f"{where}:{line}: {DATASET_COLUMN}: number longer than "
                         f"{MAX_NUMBER_CHARS} characters")
    try:
        value = float(text)
    except ValueError:
        raise TraceError(f"{where}:{line}: {DATASET_COLUMN}: not a number: {text!r}") from None
    if not 0 <= value <= MAX_DATASET_GB:
        raise TraceError(f"{where}:{line}: {DATASET_COLUMN}: must be GB from 0 to "
                         f"{MAX_DATASET_GB}, got {text[:40]!r}")
    return value


def _number(text: str, where: str, line: int, column: str) -> float:
    if len(text) > MAX_NUMBER_CHARS:
        raise TraceError(f"{where}:{line}: {column}: number longer than {MAX_NUMBER_CHARS} "
                         "characters")
    try:
        value = float(text)
    except ValueError:
        raise TraceError(f"{where}:{line}: {column}: not a number: {text!r}") from None
    if not 0 <= value <= bounds.MAX_TRACE_S:
        raise TraceError(f"{where}:{line}: {column}: must be a number of seconds from 0 to "
                         f"{bounds.MAX_TRACE_S} (a year), got {text[:40]!r}")
    return value


def _integer(text: str, where: str, line: int, column: str) -> int:
    if len(text) > MAX_NUMBER_CHARS:
        raise TraceError(f"{where}:{line}: {column}: number longer than {MAX_NUMBER_CHARS} "
                         "characters")
    try:
        return int(text)
    except ValueError:
        raise TraceError(f"{where}:{line}: {column}: not a whole number: {text!r}") from None


def load_canonical(path: str | os.PathLike[str], name: str | None = None) -> Trace:
    path = Path(path)
    return Trace(name or path.stem, parse_canonical(_read(path), str(path)), str(path))


def _read(path: Path) -> str:
    """A trace file's text, within the input limits (size, UTF-8, no NUL)."""
    try:
        return read_input(path, InputKind.TRACE)
    except InputError as exc:
        raise TraceError(str(exc)) from None


def to_canonical(jobs: tuple[TraceJob, ...] | list[TraceJob]) -> str:
    """The canonical CSV text of some jobs (what :func:`parse_canonical` reads back)."""
    out = io.StringIO()
    writer = csv.writer(out, lineterminator="\n")
    sized = any(j.dataset_gb is not None for j in jobs)  # the column only where it says something
    writer.writerow((*COLUMNS, DATASET_COLUMN) if sized else COLUMNS)
    for j in jobs:
        row = [j.job_id, _fmt(j.submit_s), _fmt(j.duration_s), j.gpus, j.project, j.priority or ""]
        if sized:
            row.append("" if j.dataset_gb is None else _fmt(j.dataset_gb))
        writer.writerow(row)
    return out.getvalue()


def _fmt(value: float) -> str:
    return str(int(value)) if float(value).is_integer() else repr(float(value))


# -- loaders of the real traces -------------------------------------------------------------------


def _rows(path: Path, required: tuple[str, ...]):
    """(line, row) of a CSV with a header holding ``required`` columns."""
    reader = csv.DictReader(io.StringIO(_read(path), newline=""))
    try:
        missing = [c for c in required if c not in (reader.fieldnames or ())]
        if missing:
            raise TraceError(f"{path}:1: missing column(s) {', '.join(missing)}")
        for row in reader:
            yield reader.line_num, row
    except csv.Error as exc:
        raise TraceError(f"{path}:{reader.line_num}: not CSV: {exc}") from None


def _int(row: dict, column: str, path: Path, line: int) -> int:
    text = (row.get(column) or "").strip()
    try:
        if len(text) > MAX_NUMBER_CHARS:
            raise ValueError(text)
        return int(float(text))
    except (ValueError, OverflowError):
        raise TraceError(f"{path}:{line}: {column}: not a number: {text!r}") from None


def load_itp(directory: str | os.PathLike[str]) -> Trace:
    """Every ``clusterNN.csv`` of the ITP ElasticFlow ``raw-traces`` (or its parent) directory.

    Columns ``job_id,submission_time,duration,num_gpu``; the cluster is the project.
    """
    directory = Path(directory)
    if (directory / "raw-traces").is_dir():
        directory = directory / "raw-traces"
    files = sorted(directory.glob("cluster*.csv"))
    if not files:
        raise TraceError(f"{directory}: no clusterNN.csv files of the ITP trace here")
    jobs: list[TraceJob] = []
    for path in files:
        cluster = path.stem
        for line, row in _rows(path, ("job_id", "submission_time", "duration", "num_gpu")):
            gpus = _int(row, "num_gpu", path, line)
            if gpus < 1:
                continue  # none in the published files; a CPU-only job needs no GPU pool
            jobs.append(TraceJob(f"{cluster}/{row['job_id']}", _int(row, "submission_time", path, line),
                                 _int(row, "duration", path, line), gpus, cluster))
    # Submit order across clusters; ties keep cluster then file order (stable sort).
    return Trace("itp", _sorted(jobs), str(directory))


def load_philly(path: str | os.PathLike[str]) -> Trace:
    """The Philly 15k excerpt: ``u_id,user,gpu_num,...,interval,run_time,...``.

    Submit time is the cumulative sum of ``interval``; the user is the project. Jobs with no GPU
    (none in the file) are left out.
    """
    path = Path(path)
    if path.is_dir():
        path = path / "philly_data_training.csv"
    jobs: list[TraceJob] = []
    clock = 0
    for line, row in _rows(path, ("u_id", "user", "gpu_num", "interval", "run_time")):
        clock += _int(row, "interval", path, line)
        gpus = _int(row, "gpu_num", path, line)
        if gpus < 1:
            continue
        jobs.append(TraceJob(f"philly-{row['u_id'].strip()}", clock, _int(row, "run_time", path, line),
                             gpus, f"user{row['user'].strip()}"))
    return Trace("philly", _sorted(jobs), str(path))


def load_alibaba(path: str | os.PathLike[str]) -> Trace:
    """Alibaba openb pods with at least one GPU that were scheduled.

    A GPU-sharing pod (``num_gpu`` 1, ``gpu_milli`` < 1000) needs one whole GPU here; run time is
    ``deletion_time - scheduled_time`` (still-running pods are censored at the observation end, as
    in the file); pods never scheduled, or with no run time, are left out. QoS is the project.
    """
    path = Path(path)
    if path.is_dir():
        path = path / "openb_pod_list_default.csv"
    jobs: list[TraceJob] = []
    for line, row in _rows(path, ("name", "num_gpu", "qos", "creation_time", "deletion_time",
                                   "scheduled_time")):
        gpus = _int(row, "num_gpu", path, line)
        scheduled = (row.get("scheduled_time") or "").strip()
        if gpus < 1 or not scheduled:
            continue
        start = _int(row, "scheduled_time", path, line)
        duration = _int(row, "deletion_time", path, line) - start
        if duration <= 0:
            continue
        jobs.append(TraceJob(row["name"].strip(), _int(row, "creation_time", path, line), duration,
                             gpus, (row.get("qos") or "").strip()))
    return Trace("alibaba", _sorted(jobs), str(path))


# -- finding traces by name ---------------------------------------------------------------------


def trace_dir() -> Path:
    """Where named traces live: ``$BURST_TRACE_DIR``, else ``../shared/data`` beside the checkout."""
    configured = os.environ.get(TRACE_DIR_ENV)
    if configured:
        return Path(configured)
    return Path(__file__).resolve().parents[2].parent / "shared" / "data"


def sample_text() -> str:
    return resources.files("orchestrator.sim").joinpath("data", f"{SAMPLE}.csv").read_text("utf-8")


def load_trace(name_or_file: str) -> Trace:
    """A trace by name (``itp``, ``philly``, ``alibaba``, ``itp-sample``) or a canonical CSV file."""
    if name_or_file == SAMPLE:
        return Trace(SAMPLE, parse_canonical(sample_text(), f"orchestrator/sim/data/{SAMPLE}.csv"),
                     f"orchestrator/sim/data/{SAMPLE}.csv")
    if name_or_file in ("itp", "philly", "alibaba"):
        base = trace_dir()
        folder = base / {"itp": ITP_DIR, "philly": PHILLY_DIR, "alibaba": ALIBABA_DIR}[name_or_file]
        if not folder.is_dir():
            raise TraceError(
                f"trace {name_or_file!r}: {folder} not found; set {TRACE_DIR_ENV} to the directory "
                f"holding {folder.name}/ (or use --trace {SAMPLE}, bundled)")
        loader = {"itp": load_itp, "philly": load_philly, "alibaba": load_alibaba}[name_or_file]
        return loader(folder)
    path = Path(name_or_file)
    if not path.exists():
        raise TraceError(f"trace {name_or_file!r}: no such file, and not one of {', '.join(NAMES)}")
    return load_canonical(path)
