"""Durable state of the node agent: the results of ended runs, and its registration.

A run's result (job id, attempt, outcome, exit code, end time) is written to a file in the
agent's state dir the moment the run ends, and removed only when the controller acknowledges the
report. So a result survives a controller outage of any length and a restart of the agent
process: the controller records a run that finished while it was away from this report, and
never runs it again (:meth:`orchestrator.sources.builtin.BuiltinQueue.finish`).

The registration answer (the node's credential among it) is kept beside them, readable by its
owner only, so a restarted agent resumes as the node it was instead of presenting a join token
that was spent; and so is the run under way, so an agent restarted after a crash stops what is
left of it and hands it back instead of leaving it running unseen.

Every write is atomic: a temporary file in the same directory, flushed to disk, renamed over the
target. Standard library only: the node agent imports this on a bare cloud node.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import re
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

log = logging.getLogger("burst.agent")

RESULTS_DIR = "results"
SESSION_FILE = "session.json"
RUNNING_FILE = "running.json"  # the run under way: a restart after a crash hands it back


def write_atomic(path: Path, text: str, *, mode: int = 0o600) -> None:
    """Write ``text`` to ``path`` so that a crash leaves the old file or the new, never half."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, mode)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as out:
            out.write(text)
            out.flush()
            os.fsync(out.fileno())
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    dir_fd = os.open(path.parent, os.O_RDONLY)
    try:
        os.fsync(dir_fd)  # the rename itself survives a power cut
    finally:
        os.close(dir_fd)


@dataclass(frozen=True)
class RunResult:
    """How one run of a job ended, as the node reports it to ``jobs/{id}/finish``."""

    job_id: str
    outcome: str  # done | failed | handed-back
    exit_code: int | None
    ended_at: str  # ISO 8601, UTC
    attempt: int | None = None  # the run id jobs/next handed out; None from an older controller

    def body(self, node_id: str) -> dict[str, Any]:
        body: dict[str, Any] = {"node_id": node_id, "outcome": self.outcome,
                                "exit_code": self.exit_code, "ended_at": self.ended_at}
        if self.attempt is not None:
            body["attempt"] = self.attempt
        return body

    @classmethod
    def from_dict(cls, data: Any) -> RunResult:
        if not isinstance(data, dict):
            raise ValueError("not a JSON object")
        job_id, outcome = data.get("job_id"), data.get("outcome")
        exit_code, attempt = data.get("exit_code"), data.get("attempt")
        if not isinstance(job_id, str) or not job_id:
            raise ValueError("job_id missing")
        if outcome not in ("done", "failed", "handed-back"):
            raise ValueError(f"bad outcome {outcome!r}")
        for name, value in (("exit_code", exit_code), ("attempt", attempt)):
            if value is not None and (isinstance(value, bool) or not isinstance(value, int)):
                raise ValueError(f"{name} is not an integer")
        return cls(job_id, outcome, exit_code, str(data.get("ended_at") or ""), attempt)


class ResultBox:
    """The results not yet acknowledged, one file each under ``<state dir>/results``."""

    def __init__(self, state_dir: Path):
        self.directory = state_dir / RESULTS_DIR

    def _path(self, result: RunResult) -> Path:
        # Readable, and unique even when two job ids sanitise to the same text.
        safe = re.sub(r"[^A-Za-z0-9._-]", "_", result.job_id)[:80]
        digest = hashlib.sha256(result.job_id.encode()).hexdigest()[:8]
        return self.directory / f"{safe}.{digest}.{result.attempt or 0}.json"

    def put(self, result: RunResult) -> None:
        write_atomic(self._path(result), json.dumps(asdict(result), sort_keys=True))

    def ack(self, result: RunResult) -> None:
        self._path(result).unlink(missing_ok=True)

    def pending(self) -> list[RunResult]:
        """The results on disk, oldest end first; an unreadable file is set aside, not resent."""
        found: list[RunResult] = []
        if not self.directory.is_dir():
            return found
        for path in sorted(self.directory.glob("*.json")):
            try:
                found.append(RunResult.from_dict(json.loads(path.read_text(encoding="utf-8"))))
            except (OSError, ValueError) as exc:
                log.error("unreadable job result %s (%s); set aside as .bad", path.name, exc)
                path.replace(path.with_suffix(".bad"))
        return sorted(found, key=lambda r: (r.ended_at, r.job_id))


def load_session(state_dir: Path, node_id: str) -> dict[str, Any] | None:
    """The registration answer kept by :func:`save_session`, if it is this node's."""
    path = state_dir / SESSION_FILE
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        return None
    except (OSError, ValueError) as exc:
        log.warning("ignoring unreadable %s (%s)", path.name, exc)
        return None
    if not isinstance(data, dict) or data.get("node_id") != node_id:
        return None
    answer = data.get("answer")
    if not isinstance(answer, dict) or not isinstance(answer.get("credential"), str):
        return None
    return answer


def save_session(state_dir: Path, node_id: str, answer: dict[str, Any]) -> None:
    write_atomic(state_dir / SESSION_FILE, json.dumps({"node_id": node_id, "answer": answer}))


def forget_session(state_dir: Path) -> None:
    (state_dir / SESSION_FILE).unlink(missing_ok=True)


@dataclass(frozen=True)
class RunningRun:
    """The run under way when the agent last wrote it down."""

    job_id: str
    attempt: int | None


def note_running(state_dir: Path, run: RunningRun) -> None:
    write_atomic(state_dir / RUNNING_FILE, json.dumps(asdict(run)))


def running_run(state_dir: Path) -> RunningRun | None:
    try:
        data = json.loads((state_dir / RUNNING_FILE).read_text(encoding="utf-8"))
        run = RunningRun(str(data["job_id"]), data.get("attempt"))
    except FileNotFoundError:
        return None
    except (OSError, ValueError, TypeError, KeyError) as exc:
        log.warning("ignoring unreadable %s (%s)", RUNNING_FILE, exc)
        return None
    attempt = run.attempt
    if not run.job_id or (attempt is not None and (isinstance(attempt, bool)
                                                   or not isinstance(attempt, int))):
        log.warning("ignoring malformed %s", RUNNING_FILE)
        return None
    return run


def clear_running(state_dir: Path) -> None:
    (state_dir / RUNNING_FILE).unlink(missing_ok=True)
