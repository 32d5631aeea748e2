"""What a node agent learns about its own machine: GPU inventory and spot/preemption notices.

GPU inventory, first source that answers wins:

1. ``nvidia-smi --query-gpu=index,name,memory.total --format=csv,noheader,nounits``;
2. torch (``torch.cuda``), probed in a subprocess and only where an NVIDIA driver is loaded
   (``/proc/driver/nvidia``): importing torch costs seconds and hundreds of MB, and finds nothing
   without a driver anyway;
3. configuration: the GPUs and model the controller launched the node for (CPU-only test nodes).

``BURST_GPU_PROBE`` (``auto``, ``nvidia-smi``, ``torch`` or ``config``) forces one source.

Spot/preemption notices: the provider's instance metadata says that the instance is about to be
reclaimed. AWS answers ``spot/instance-action`` with 404 until a notice, then ``{"action":
"terminate", "time": "2026-01-01T00:02:00Z"}`` (IMDSv2 token fetched when available); GCP answers
``instance/preempted`` with ``FALSE``/``TRUE`` (header ``Metadata-Flavor: Google``) and gives about
30 seconds. :class:`NoticeWatcher` polls the endpoint in a thread and records the first notice.

Standard library only: runs on a bare cloud node.
"""

from __future__ import annotations

import json
import logging
import os
import shutil
import subprocess
import sys
import threading
import urllib.error
import urllib.parse
import urllib.request
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

from orchestrator.isotime import TimeFormatError, parse_aware

log = logging.getLogger("burst.agent")

PROBE_ENV = "BURST_GPU_PROBE"
NVIDIA_DRIVER = Path("/proc/driver/nvidia")
NOTICE_TIMEOUT_S = 2.0

_TORCH_PROBE = (
    "import json, torch\n"
    "n = torch.cuda.device_count() if torch.cuda.is_available() else 0\n"
    "print(json.dumps([{'index': i, 'name': torch.cuda.get_device_name(i),\n"
    "  'memory_mib': torch.cuda.get_device_properties(i).total_memory // 2**20}\n"
    "  for i in range(n)]))\n"
)


@dataclass(frozen=True)
class GpuInventory:
    """The node's GPUs and where the list came from (nvidia-smi, torch or config)."""

    source: str
    gpus: tuple[dict[str, Any], ...] = field(default_factory=tuple)

    @property
    def count(self) -> int:
        return len(self.gpus)

    @property
    def model(self) -> str | None:
        return str(self.gpus[0]["name"]) if self.gpus else None

    def as_list(self) -> list[dict[str, Any]]:
        return [dict(g) for g in self.gpus]


def gpu_inventory(configured: int, model: str, *, probe: str | None = None) -> GpuInventory:
    """The node's GPUs (see the module docstring for the order of sources)."""
    probe = (probe or os.environ.get(PROBE_ENV) or "auto").lower()
    if probe in ("auto", "nvidia-smi"):
        found = _nvidia_smi()
        if found is not None and (found or probe == "nvidia-smi"):
            return GpuInventory("nvidia-smi", tuple(found))
    if probe == "torch" or (probe == "auto" and NVIDIA_DRIVER.exists()):
        found = _torch()
        if found is not None and (found or probe == "torch"):
            return GpuInventory("torch", tuple(found))
    return GpuInventory("config", tuple({"index": i, "name": model, "memory_mib": None}
                                        for i in range(max(configured, 0))))


def parse_nvidia_smi(text: str) -> list[dict[str, Any]]:
    """Rows of ``index, name, memory.total`` (csv, no header, no units)."""
    gpus = []
    for line in text.splitlines():
        parts = [p.strip() for p in line.split(",")]
        if len(parts) < 3 or not parts[0].isdigit():
            continue
        memory = int(float(parts[2])) if parts[2].replace(".", "", 1).isdigit() else None
        gpus.append({"index": int(parts[0]), "name": parts[1], "memory_mib": memory})
    return gpus


def _nvidia_smi() -> list[dict[str, Any]] | None:
    smi = shutil.which("nvidia-smi")
    if smi is None:
        return None
    try:
        done = subprocess.run([smi, "--query-gpu=index,name,memory.total",
                               "--format=csv,noheader,nounits"],
                              capture_output=True, text=True, timeout=20)
    except (OSError, subprocess.TimeoutExpired) as exc:
        log.warning("nvidia-smi failed: %s", exc)
        return None
    if done.returncode != 0:
        log.warning("nvidia-smi exited %d: %s", done.returncode, done.stderr.strip()[:200])
        return None
    return parse_nvidia_smi(done.stdout)


def _torch() -> list[dict[str, Any]] | None:
    try:
        done = subprocess.run([sys.executable, "-c", _TORCH_PROBE], capture_output=True,
                              text=True, timeout=120)
    except (OSError, subprocess.TimeoutExpired) as exc:
        log.warning("torch GPU probe failed: %s", exc)
        return None
    if done.returncode != 0:
        return None  # no torch here: not an error
    try:
        return list(json.loads(done.stdout.strip().splitlines()[-1]))
    except (ValueError, IndexError):
        return None


# -- spot / preemption notices -------------------------------------------------------------------

@dataclass(frozen=True)
class Notice:
    """A provider's notice that the instance will be reclaimed at ``deadline``."""

    source: str
    action: str
    deadline: datetime

    def as_dict(self) -> dict[str, Any]:
        return {"source": self.source, "action": self.action, "deadline": self.deadline.isoformat()}


def poll_notice(kind: str, url: str, default_deadline_s: float,
                now: datetime | None = None) -> Notice | None:
    """Ask the metadata endpoint once; the notice if there is one. Unreachable: None."""
    now = now or datetime.now(UTC)
    headers: dict[str, str] = {}
    if kind == "gcp":
        headers["Metadata-Flavor"] = "Google"
    elif kind == "aws":
        token = _imds_token(url)
        if token:
            headers["X-aws-ec2-metadata-token"] = token
    try:
        request = urllib.request.Request(url, headers=headers)
        with urllib.request.urlopen(request, timeout=NOTICE_TIMEOUT_S) as answer:
            body = answer.read().decode(errors="replace").strip()
    except urllib.error.HTTPError as exc:
        exc.close()
        return None  # AWS: 404 until there is a notice
    except (urllib.error.URLError, OSError, ValueError):
        return None
    if kind == "gcp":
        if body.upper() != "TRUE":
            return None
        return Notice("gcp", "preempted", now + timedelta(seconds=default_deadline_s))
    try:
        document = json.loads(body)
    except ValueError:
        return None
    if not isinstance(document, dict) or "action" not in document:
        return None
    deadline = now + timedelta(seconds=default_deadline_s)
    if document.get("time"):
        try:  # (the metadata service writes UTC; a time it garbles leaves the default deadline)
            deadline = parse_aware(str(document["time"]), "instance-action time", assume_utc=True)
        except TimeFormatError:
            pass
    return Notice("aws", str(document["action"]), deadline)


def _imds_token(url: str) -> str | None:
    """An IMDSv2 session token from the same host, or None (IMDSv1 or no metadata service)."""
    parts = urllib.parse.urlsplit(url)
    token_url = f"{parts.scheme}://{parts.netloc}/latest/api/token"
    request = urllib.request.Request(token_url, method="PUT",
                                     headers={"X-aws-ec2-metadata-token-ttl-seconds": "21600"})
    try:
        with urllib.request.urlopen(request, timeout=NOTICE_TIMEOUT_S) as answer:
            return answer.read().decode().strip() or None
    except (urllib.error.URLError, OSError, ValueError):
        return None


class NoticeWatcher:
    """Polls the notice endpoint in a daemon thread until a notice arrives or :meth:`stop`."""

    def __init__(self, kind: str, url: str, poll_s: float, default_deadline_s: float):
        self.kind = kind
        self.url = url
        self.poll_s = max(poll_s, 0.05)
        self.default_deadline_s = default_deadline_s
        self.notice: Notice | None = None
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="notice-watch", daemon=True)

    def start(self) -> NoticeWatcher:
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()

    def _run(self) -> None:
        while not self._stop.is_set():
            notice = poll_notice(self.kind, self.url, self.default_deadline_s)
            if notice is not None:
                log.warning("%s notice: instance %s at %s", notice.source, notice.action,
                            notice.deadline.isoformat())
                self.notice = notice
                return
            self._stop.wait(self.poll_s)
