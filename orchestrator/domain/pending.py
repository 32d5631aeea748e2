"""The pending queue of one pool as columns: what the planner reads of 100k jobs without 100k
objects.

A queue source builds :class:`PendingColumns` once per tick, straight from its query result
(:meth:`PendingColumns.from_rows`: one tuple per row, in the order of :data:`ROW_FIELDS`), or from
jobs it already holds (:meth:`PendingColumns.from_jobs`: the simulator, a snapshot file). The
planner's scheduling order, unmet tallies, wait-aware split and pricing are vectorised sorts and
counts over these arrays; a :class:`~orchestrator.domain.jobs.Job` is made only for a job some
step reads one by one (the few that are placed, deferred or granted a node), through
:meth:`PendingColumns.job`. The columns are also a read-only sequence of jobs (``len``,
indexing, iteration), so ``PoolQueue(pending=columns)`` serves every reader of ``pending``.

numpy, not the standard ``array`` module: numpy is a core dependency already (the simulator's
schedule, matplotlib's own), and what the planner needs of the columns is ``lexsort``,
``bincount``, ``cumsum``, ``searchsorted`` and boolean masks, each one C call over the queue;
``array`` stores the columns as compactly but every operation on it is a Python loop, which is
the per-job cost this type exists to remove (``docs/performance.md``).

Encodings: ``submitted_us`` is microseconds since the Unix epoch, UTC (a ``datetime`` has
microsecond resolution, so the order of the integers is the order of the times, ties included);
``duration_s`` is NaN for an unknown duration; ``project`` holds codes into ``projects`` (the
distinct names, in order of first appearance). Arrays are read-only: the columns are a value.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Iterator, Sequence
from datetime import UTC, datetime, timedelta
from operator import itemgetter
from typing import Any, overload

import numpy as np

from orchestrator.domain.jobs import Job

__all__ = ["ROW_FIELDS", "JobsView", "PendingColumns", "columns_of"]

# The fields of one row for :meth:`PendingColumns.from_rows`, in order, unless the caller names
# its own (``fields=``: a query's column names, extra ones ignored; missing ones take defaults).
ROW_FIELDS = ("id", "project", "gpus", "priority", "submitted_at", "duration_s", "checkpoint_s",
              "user", "dataset_gb")
_DEFAULTS: dict[str, Any] = {"priority": 0, "duration_s": None, "checkpoint_s": None,
                             "user": None, "dataset_gb": None}

_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)
_EPOCH_NAIVE = datetime(1970, 1, 1)
_US = timedelta(microseconds=1)


def to_us(moment: datetime) -> int:
    """Microseconds since the epoch of a datetime (a naive one is taken as UTC)."""
    return (moment - (_EPOCH if moment.tzinfo is not None else _EPOCH_NAIVE)) // _US


def from_us(us: int) -> datetime:
    """The UTC datetime of :func:`to_us`'s integer."""
    return _EPOCH + timedelta(microseconds=int(us))


def _micros(moments: Sequence[Any]) -> np.ndarray:
    """Microseconds since the epoch of datetimes (naive: UTC) or of integers (taken as µs).

    ``timestamp()`` is C-level; its float is within a quarter microsecond of the exact value for
    any date of this millennium, so rounding restores the integer exactly."""
    first = moments[0]
    if not isinstance(first, datetime):
        return np.asarray(moments, dtype=np.int64)
    naive = [m.tzinfo is None for m in moments]
    if not any(naive):
        seconds = map(datetime.timestamp, moments)
    elif all(naive):  # the naive epoch subtracted (timestamp() would read them as local time)
        seconds = map(timedelta.total_seconds, map(_EPOCH_NAIVE.__rsub__, moments))
    else:
        return np.fromiter(map(to_us, moments), dtype=np.int64, count=len(moments))
    floats = np.fromiter(seconds, dtype=np.float64, count=len(moments))
    return np.rint(floats * 1e6).astype(np.int64)


def _encode(names: Sequence[Any]) -> tuple[list[int], tuple[Any, ...]]:
    """Codes of ``names`` and the distinct names, in order of first appearance."""
    codes: dict[Any, int] = dict.fromkeys(names)  # C-level: first-appearance order
    for number, name in enumerate(codes):
        codes[name] = number
    return list(map(codes.__getitem__, names)), tuple(codes)


def _recode(codes: np.ndarray, names: tuple[Any, ...]) -> tuple[np.ndarray, tuple[Any, ...]]:
    """``codes`` into ``names`` renumbered to the names they use, in order of first use."""
    if not len(codes):
        return codes, ()
    if len(names) == 1:  # (one name, used by every row: a queue of one user or project)
        return codes, names
    # Each name's first row (len(codes): unused), by one unbuffered minimum: a tenth of the
    # sort np.unique(return_index=True) makes of every row.
    n = len(codes)
    first = np.full(len(names), n, dtype=np.int64)
    np.minimum.at(first, codes, np.arange(n, dtype=np.int64))
    present = np.flatnonzero(first < n)
    used = present[np.argsort(first[present], kind="stable")]
    if len(used) == len(names) and (used == np.arange(len(names))).all():
        return codes, names
    renumber = np.zeros(len(names), dtype=np.int64)
    renumber[used] = np.arange(len(used))
    return renumber[codes], tuple(names[c] for c in used.tolist())


def _first_seen_counts(key: np.ndarray, size: int) -> list[tuple[int, int]]:
    """(value, how many times) of each distinct value of ``key`` (non-negative, below
    ``size``), in order of first appearance. Where the values are few for their number (a
    queue's owners and widths), counted in place (``bincount``, one unbuffered minimum for the
    first rows): no sort of every row, which ``np.unique`` makes."""
    n = len(key)
    if size <= 4 * n + 4096:
        count = np.bincount(key, minlength=size)
        present = np.flatnonzero(count)
        first = np.full(size, n, dtype=np.int64)
        np.minimum.at(first, key, np.arange(n, dtype=np.int64))
        used = present[np.argsort(first[present], kind="stable")]
        return list(zip(used.tolist(), count[used].tolist()))
    unique, first, count = np.unique(key, return_index=True, return_counts=True)
    used = np.argsort(first, kind="stable")
    return list(zip(unique[used].tolist(), count[used].tolist()))


def _seconds(values: Sequence[Any]) -> list[float] | Sequence[Any]:
    return [math.nan if v is None else v for v in values] if None in values else values


def _readonly(array: np.ndarray) -> np.ndarray:
    array.flags.writeable = False
    return array


def _frozen(values: Any, dtype: Any) -> np.ndarray:
    array = np.asarray(values, dtype=dtype)
    array.flags.writeable = False
    return array


class PendingColumns(Sequence[Job]):
    """Pending jobs of one pool as parallel arrays, row ``i`` being the ``i``-th job of the queue.

    ``gpus``, ``priority``: int64; ``project``: int64 codes into ``projects`` (a name, or None:
    no project); ``submitted_us``: int64; ``duration_s``, ``checkpoint_s``, ``dataset_gb``:
    float64, NaN when unknown; ``user``: int64 codes into ``users`` (None: not known); ``ids``: the job ids (str).
    ``pool``: the pool every job belongs to.
    """

    __slots__ = ("_counts", "_id_rows", "_id_source", "_ids", "_jobs", "_listed",
                 "checkpoint_s", "dataset_gb", "duration_s", "gpus", "id_rank", "pool",
                 "priority", "project", "projects", "submitted_us", "time_rank", "user", "users")

    def __init__(self, pool: str, ids: Sequence[str], projects: Sequence[str | None],
                 project: Any, gpus: Any, priority: Any, submitted_us: Any, duration_s: Any,
                 checkpoint_s: Any = None, users: Sequence[str | None] = (None,),
                 user: Any = None, dataset_gb: Any = None):
        self.pool = pool
        self._ids: tuple[str, ...] | None = tuple(ids)
        # A selection's ids are gathered when first read (most plans read a few ids of
        # thousands, one by one): from ``_id_source`` at ``_id_rows`` meanwhile.
        self._id_source: tuple[str, ...] = ()
        self._id_rows: np.ndarray | None = None
        self.projects: tuple[str, ...] = tuple(projects)
        self.project = _frozen(project, np.int64)
        self.gpus = _frozen(gpus, np.int64)
        self.priority = _frozen(priority, np.int64)
        self.submitted_us = _frozen(submitted_us, np.int64)
        self.duration_s = _frozen(duration_s, np.float64)
        n = len(self._ids)
        self.checkpoint_s = _frozen(np.full(n, np.nan) if checkpoint_s is None else checkpoint_s,
                                    np.float64)
        self.dataset_gb = _frozen(np.full(n, np.nan) if dataset_gb is None else dataset_gb,
                                  np.float64)
        self.users: tuple[str | None, ...] = tuple(users)
        self.user = _frozen(np.zeros(n, dtype=np.int64) if user is None else user, np.int64)
        for name in ("project", "gpus", "priority", "submitted_us", "duration_s", "checkpoint_s",
                     "user", "dataset_gb"):
            column = getattr(self, name)
            if column.shape != (n,):
                raise ValueError(f"pending column {name!r} has shape {column.shape}, not ({n},)")
        if n and (int(self.project.min()) < 0 or int(self.project.max()) >= len(self.projects)):
            raise ValueError("pending column 'project' holds a code outside 'projects'")
        if n and (int(self.user.min()) < 0 or int(self.user.max()) >= len(self.users)):
            raise ValueError("pending column 'user' holds a code outside 'users'")
        self._jobs: dict[int, Job] = {}
        self._listed: Sequence[Job] | None = None  # the Job of every row, where handed over whole
        self._counts: dict[tuple[str, int, int], int] | None = None
        # Each row's id as its rank among the ids in code point order (equal ids, equal ranks),
        # where the builder knows it (the simulator ranks a trace's ids once); None: read the ids.
        self.id_rank: np.ndarray | None = None
        # Each row's rank by (submit time, id) among the rows the builder knows (equal pairs,
        # equal ranks), where it knows it: the scheduling order within a priority class is then
        # one sort of integers, ties in submit time included. None: read the times and ids.
        self.time_rank: np.ndarray | None = None

    # -- building ------------------------------------------------------------------------------
    @classmethod
    def from_rows(cls, pool: str, rows: Iterable[Sequence[Any]],
                  fields: Sequence[str] = ROW_FIELDS) -> PendingColumns:
        """From query rows whose positions ``fields`` names (default :data:`ROW_FIELDS`; a
        query's own column names, e.g. the built-in queue's, with extra ones ignored):
        ``submitted_at`` a datetime (naive taken as UTC) or integer microseconds;
        ``duration_s``/``checkpoint_s`` seconds or None. One pass per column, no Job made."""
        rows = rows if isinstance(rows, list) else list(rows)
        missing = {"id", "project", "gpus", "submitted_at"} - set(fields)
        if missing:
            raise ValueError(f"pending rows lack the field(s) {', '.join(sorted(missing))}")
        if not rows:
            return cls.empty(pool)
        transposed = list(zip(*rows))
        if len(transposed) != len(fields):
            raise ValueError(f"pending rows have {len(transposed)} fields, not {len(fields)} "
                             f"({', '.join(fields)})")
        return cls.from_fields(pool, dict(zip(fields, transposed)))

    @classmethod
    def from_fields(cls, pool: str, column: dict[str, Sequence[Any]]) -> PendingColumns:
        """From whole columns of a query result, by field name (``id``, ``project``, ``gpus``
        and ``submitted_at`` required; the rest of :data:`ROW_FIELDS` default): what a source
        that transposed its rows once hands over. ``submitted_at`` may be an int64 array of
        microseconds already (a source that parsed its driver's text in one call)."""
        n = len(column["id"])
        if not n:
            return cls.empty(pool)

        def get(name: str) -> Sequence[Any]:
            return column[name] if name in column else (_DEFAULTS[name],) * n

        project_codes, projects = _encode(column["project"])
        user_codes, users = _encode(get("user"))
        priority = get("priority")
        submitted = column["submitted_at"]
        return cls(pool, column["id"], projects, project_codes, column["gpus"],
                   [0 if p is None else p for p in priority] if None in priority else priority,
                   submitted if isinstance(submitted, np.ndarray) else _micros(submitted),
                   _seconds(get("duration_s")), _seconds(get("checkpoint_s")), users, user_codes,
                   _seconds(get("dataset_gb")))

    @classmethod
    def from_jobs(cls, jobs: Iterable[Job], pool: str | None = None) -> PendingColumns:
        """From jobs (of one pool: ``pool``, or that of the first job)."""
        jobs = tuple(jobs)
        if pool is None:
            pool = jobs[0].pool if jobs else ""
        made = cls.from_rows(pool, [(j.id, j.project, j.gpus, j.priority, j.submitted_at,
                                     j.duration_s, j.checkpoint_s, j.user, j.dataset_gb)
                                    for j in jobs])
        made._listed = list(jobs)  # the jobs as given (state, tz) are what job(i) returns
        return made

    @classmethod
    def empty(cls, pool: str = "") -> PendingColumns:
        return cls(pool, (), (), (), (), (), (), ())

    def select(self, rows: Any, pool: str | None = None,
               jobs: Iterable[Job] | None = None) -> PendingColumns:
        """The rows ``rows`` (positions, in the order given) as columns of their own (of
        ``pool``, default this one's), with project and user codes renumbered in order of first
        appearance: equal, field for field, to the columns built from those rows alone.
        ``jobs``: the Jobs of those rows, in that order, for :meth:`job` to return (as
        :meth:`from_jobs` keeps the jobs it was given)."""
        rows = np.asarray(rows, dtype=np.int64)
        project, projects = _recode(self.project[rows], self.projects)
        user, users = _recode(self.user[rows], self.users)
        # Made field by field (a selection of valid columns is valid: no checks), its ids left
        # to be gathered when read.
        made = PendingColumns.__new__(PendingColumns)
        made.pool = self.pool if pool is None else pool
        if self._ids is None:
            made._ids, made._id_source, made._id_rows = None, self._id_source, self._id_rows[rows]
        else:
            made._ids, made._id_source, made._id_rows = None, self._ids, rows
        if not len(rows):
            made._ids = ()
        made.projects = projects
        made.users = users or (None,)
        made.project, made.user = _readonly(project), _readonly(user)
        for name in ("gpus", "priority", "submitted_us", "duration_s", "checkpoint_s",
                     "dataset_gb"):
            setattr(made, name, _readonly(getattr(self, name)[rows]))
        made._jobs = {}
        made._listed = None
        made._counts = None
        made.id_rank = made.time_rank = None
        if self.id_rank is not None:
            made.id_rank = self.id_rank[rows]
        if self.time_rank is not None:
            made.time_rank = self.time_rank[rows]
        if self._jobs and (pool is None or pool == self.pool):
            made._jobs.update((new, self._jobs[old]) for new, old in enumerate(rows.tolist())
                              if old in self._jobs)
        if jobs is None and self._listed is not None and (pool is None or pool == self.pool):
            jobs = [self._listed[i] for i in rows.tolist()]
        if jobs is not None:  # every row's Job, kept as the sequence it is (no map of 100k
            # rows; a source's own sequence may read its records when asked)
            made._listed = jobs if isinstance(jobs, Sequence) else list(jobs)
            if len(made._listed) != len(made):
                raise ValueError(f"{len(made._listed)} jobs for {len(made)} rows")
        return made

    @property
    def ids(self) -> tuple[str, ...]:
        """The job ids, row by row."""
        ids = self._ids
        if ids is None:  # (two threads may both gather them: the same tuple)
            picked = self._id_rows.tolist()  # type: ignore[union-attr]
            ids = (itemgetter(*picked)(self._id_source) if len(picked) > 1
                   else tuple(self._id_source[i] for i in picked))
            self._ids = ids
        return ids

    def id_of(self, index: int) -> str:
        """Row ``index``'s job id (without gathering every id)."""
        ids = self._ids
        if ids is not None:
            return ids[index]
        return self._id_source[int(self._id_rows[index])]  # type: ignore[index]

    # -- reading -------------------------------------------------------------------------------
    def job(self, index: int) -> Job:
        """Row ``index`` as a Job (made once, then kept)."""
        listed = self._listed
        if listed is not None and 0 <= index < len(listed):
            return listed[index]
        job = self._jobs.get(index)
        if job is None:
            index = int(index)
            if not -len(self) <= index < len(self):
                raise IndexError(index)
            index %= len(self)
            duration = float(self.duration_s[index])
            checkpoint = float(self.checkpoint_s[index])
            dataset = float(self.dataset_gb[index])
            job = Job(self.id_of(index), self.projects[int(self.project[index])], self.pool,
                      int(self.gpus[index]), from_us(int(self.submitted_us[index])),
                      int(self.priority[index]), None if math.isnan(duration) else duration,
                      checkpoint_s=None if math.isnan(checkpoint) else checkpoint,
                      user=self.users[int(self.user[index])],
                      dataset_gb=None if math.isnan(dataset) else dataset)
            self._jobs[index] = job
        return job

    def jobs(self, indexes: Iterable[int]) -> tuple[Job, ...]:
        """The jobs of the rows ``indexes``, in that order."""
        job = self.job
        return tuple(job(i) for i in (indexes.tolist() if isinstance(indexes, np.ndarray)
                                      else indexes))

    def project_names(self) -> np.ndarray:
        """Each row's project name (an object array, for sorting and reading by name)."""
        return np.array(self.projects, dtype=object)[self.project] if len(self) else (
            np.empty(0, dtype=object))

    def counts(self) -> dict[tuple[str, int, int], int]:
        """Jobs per (project, priority, width), in order of first appearance (kept)."""
        if self._counts is None:
            if not len(self):
                self._counts = {}
            else:
                # One integer key per row (priority and width offset to 0), counted by one sort.
                low_p, low_g = int(self.priority.min()), int(self.gpus.min())
                span_p = int(self.priority.max()) - low_p + 1
                span_g = int(self.gpus.max()) - low_g + 1
                key = (self.project * span_p + (self.priority - low_p)) * span_g + (
                    self.gpus - low_g)
                unique, first, count = np.unique(key, return_index=True, return_counts=True)
                counts = {}
                for k in np.argsort(first, kind="stable").tolist():
                    rest, width = divmod(int(unique[k]), span_g)
                    code, level = divmod(rest, span_p)
                    counts[(self.projects[code], level + low_p, width + low_g)] = int(count[k])
                self._counts = counts
        return dict(self._counts)

    def owner_counts(self, rows: np.ndarray) -> dict[tuple[str | None, str | None, int], int]:
        """Jobs among ``rows`` per (project, user, width), in order of first appearance."""
        if not len(rows):
            return {}
        span_u, span_g = len(self.users), int(self.gpus.max()) + 1
        key = (self.project[rows] * span_u + self.user[rows]) * span_g + self.gpus[rows]
        counts = {}
        for k, count in _first_seen_counts(key, len(self.projects) * span_u * span_g):
            rest, width = divmod(k, span_g)
            code, user = divmod(rest, span_u)
            counts[(self.projects[code], self.users[user], width)] = count
        return counts

    @property
    def total_gpus(self) -> int:
        return int(self.gpus.sum())

    def __len__(self) -> int:
        return len(self.gpus)

    @overload
    def __getitem__(self, index: int) -> Job: ...
    @overload
    def __getitem__(self, index: slice) -> tuple[Job, ...]: ...
    def __getitem__(self, index: int | slice) -> Job | tuple[Job, ...]:
        if isinstance(index, slice):
            return self.jobs(range(*index.indices(len(self))))
        return self.job(index)

    def __iter__(self) -> Iterator[Job]:
        return map(self.job, range(len(self)))

    def __bool__(self) -> bool:
        return len(self.gpus) > 0

    def __eq__(self, other: object) -> bool:
        if isinstance(other, PendingColumns):
            return self is other or (self.pool == other.pool and tuple(self) == tuple(other))
        if isinstance(other, tuple):
            return tuple(self) == other
        return NotImplemented

    def __hash__(self) -> int:
        return id(self)

    def __repr__(self) -> str:
        return f"PendingColumns(pool={self.pool!r}, jobs={len(self)})"


class JobsView(Sequence[Job]):
    """Some rows of a :class:`PendingColumns`, in a given order (``indexes``): a read-only
    sequence of jobs whose Jobs are made only when read, and whose columns are one fancy index
    away (:meth:`column`). The planner's ordered queue, its unmet jobs and its due jobs are
    views: 100k of them cost an array of positions, not 100k objects."""

    __slots__ = ("columns", "indexes")

    def __init__(self, columns: PendingColumns, indexes: Any):
        self.columns = columns
        self.indexes: np.ndarray = np.asarray(indexes, dtype=np.int64)

    def column(self, name: str) -> np.ndarray:
        """One column (``gpus``, ``project``, ``priority``, ``submitted_us``, ``duration_s``) of
        the viewed rows, in the view's order."""
        return getattr(self.columns, name)[self.indexes]

    def ids(self) -> list[str]:
        """The viewed rows' job ids, in the view's order (no Job made)."""
        columns = self.columns
        if columns._ids is None:  # (a selection whose ids are not gathered: only these)
            rows = columns._id_rows[self.indexes]  # type: ignore[index]
            return list(map(columns._id_source.__getitem__, rows.tolist()))
        return list(map(columns._ids.__getitem__, self.indexes.tolist()))

    def where(self, mask: np.ndarray) -> JobsView:
        """The rows of this view where ``mask`` (one bool per row of the view) holds."""
        return JobsView(self.columns, self.indexes[mask])

    def __len__(self) -> int:
        return len(self.indexes)

    @overload
    def __getitem__(self, index: int) -> Job: ...
    @overload
    def __getitem__(self, index: slice) -> JobsView: ...
    def __getitem__(self, index: int | slice) -> Job | JobsView:
        if isinstance(index, slice):
            return JobsView(self.columns, self.indexes[index])
        return self.columns.job(int(self.indexes[index]))

    def __iter__(self) -> Iterator[Job]:
        # The positions read in doubling chunks: a reader that stops after a few hundred jobs
        # (the forecast, staging) does not turn up to 1M positions into a list first.
        job, indexes = self.columns.job, self.indexes
        start, size = 0, 1024
        while start < len(indexes):
            yield from map(job, indexes[start:start + size].tolist())
            start += size
            size *= 2

    def __bool__(self) -> bool:
        return len(self.indexes) > 0

    def __add__(self, other: object) -> JobsView | tuple[Job, ...]:
        if isinstance(other, JobsView) and other.columns is self.columns:
            return JobsView(self.columns, np.concatenate([self.indexes, other.indexes]))
        if isinstance(other, (tuple, JobsView)):
            return tuple(self) + tuple(other)
        return NotImplemented

    def __radd__(self, other: object) -> tuple[Job, ...]:
        if isinstance(other, tuple):
            return other + tuple(self)
        return NotImplemented

    def __eq__(self, other: object) -> bool:
        if isinstance(other, (JobsView, tuple)):
            return tuple(self) == tuple(other)
        return NotImplemented

    def __hash__(self) -> int:
        return id(self)

    def __repr__(self) -> str:
        return f"JobsView({len(self)} of {self.columns!r})"


def columns_of(pending: Sequence[Job], pool: str = "") -> PendingColumns:
    """``pending`` as columns: itself when it is columns already, else built from its jobs."""
    if isinstance(pending, PendingColumns):
        return pending
    return PendingColumns.from_jobs(pending, pool or None)
