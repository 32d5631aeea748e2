"""What the running `burst run` loop runs, recorded in its state directory for the other commands.

`burst run` writes ``running.json`` (its policy files as absolute paths, pid, host, start time, the
API address) when it starts and removes it when it stops cleanly; `submit`, `status`, `plan`,
`cancel` and `report` without ``-p`` then work on the policies the loop runs, not on the shipped
default (:func:`orchestrator.cli.common.policy_files`). A Celery deployment says the same through
``BURST_POLICY_FILES``, which wins. A record left by a loop that died is still the last thing that
ran there, and it is used until the next `burst run` replaces it (`status` says the loop is not
running).

Standard library only: every CLI command imports this on start-up.
"""

from __future__ import annotations

import json
import os
import socket
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path

RUNNING_FILE = "running.json"


@dataclass(frozen=True)
class RunningLoop:
    policy_files: tuple[Path, ...]
    pid: int
    host: str
    started_at: str
    api_url: str

    @property
    def alive(self) -> bool:
        """Whether the recording process still runs (known only on its own host)."""
        if self.host != socket.gethostname():
            return True  # cannot tell from here; assume it does
        try:
            os.kill(self.pid, 0)
        except ProcessLookupError:
            return False
        except PermissionError:
            return True
        return True


def record(state_dir: Path, policy_files: list[Path], api_url: str) -> Path:
    """Write this process's record atomically (a reader never sees half a file)."""
    state_dir.mkdir(parents=True, exist_ok=True)
    path = state_dir / RUNNING_FILE
    body = {"policy_files": [str(Path(p).resolve()) for p in policy_files], "pid": os.getpid(),
            "host": socket.gethostname(), "started_at": datetime.now(UTC).isoformat(),
            "api_url": api_url}
    tmp = path.with_name(f".{RUNNING_FILE}.{os.getpid()}.tmp")
    tmp.write_text(json.dumps(body, indent=2) + "\n", encoding="utf-8")
    tmp.replace(path)
    return path


def clear(state_dir: Path) -> None:
    """Remove the record if it is this process's (another loop may have replaced it)."""
    found = read(state_dir)
    if found is not None and found.pid == os.getpid() and found.host == socket.gethostname():
        (state_dir / RUNNING_FILE).unlink(missing_ok=True)


def read(state_dir: Path) -> RunningLoop | None:
    """The record in ``state_dir``, or None if there is none or it cannot be read."""
    try:
        body = json.loads((state_dir / RUNNING_FILE).read_text(encoding="utf-8"))
        return RunningLoop(tuple(Path(p) for p in body["policy_files"]), int(body["pid"]),
                           str(body["host"]), str(body["started_at"]), str(body["api_url"]))
    except (OSError, ValueError, KeyError, TypeError):
        return None
