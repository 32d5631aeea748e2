"""A stand-in for cloud-init on the instances a local cloud peer (moto, the GCP fake) "runs".

The peers keep instance records but run nothing. This plays the part of each VM booting: for every
instance the peer shows running, it reads the user-data that instance was launched with (through
the peer, as cloud-init would through the metadata service), writes it to a file and starts the
real node agent with it, in its own process group. When the peer shows the instance gone, the
"VM" is gone: its agent's process group is killed.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True)
class PeerInstance:
    id: str
    running: bool
    user_data: Callable[[], str]


class CloudInitSimulator:
    def __init__(self, list_instances: Callable[[], list[PeerInstance]], work_dir: Path, interval: float = 0.3):
        self.list_instances = list_instances
        self.work_dir = work_dir
        self.interval = interval
        self.agents: dict[str, subprocess.Popen] = {}
        self.booted: set[str] = set()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="cloud-init", daemon=True)
        self.errors: list[str] = []

    def __enter__(self) -> CloudInitSimulator:
        self.work_dir.mkdir(parents=True, exist_ok=True)
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self._thread.join(timeout=10)
        for instance_id in list(self.agents):
            self._kill(instance_id)

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                self._step()
            except Exception as exc:  # noqa: BLE001 - a flaky listing is retried next round
                self.errors.append(repr(exc))
            self._stop.wait(self.interval)

    def _step(self) -> None:
        seen = {}
        for instance in self.list_instances():
            seen[instance.id] = instance
            if instance.running and instance.id not in self.booted:
                self._boot(instance)
        for instance_id in list(self.agents):
            current = seen.get(instance_id)
            if current is None or not current.running:
                self._kill(instance_id)

    def _boot(self, instance: PeerInstance) -> None:
        self.booted.add(instance.id)
        safe = instance.id.replace("/", "_")  # GCP ids are zone/name
        user_data = self.work_dir / f"{safe}.user-data"
        user_data.write_text(instance.user_data())
        user_data.chmod(0o600)
        log = (self.work_dir / f"{safe}.log").open("ab")
        env = {**os.environ, "BURST_BOOT_DELAY_S": "0", "BURST_WORK_DIR": str(self.work_dir / safe)}
        self.agents[instance.id] = subprocess.Popen(
            [sys.executable, "-m", "orchestrator.fabric.agent", "--user-data", str(user_data)],
            stdout=log, stderr=subprocess.STDOUT, env=env, start_new_session=True)

    def _kill(self, instance_id: str) -> None:
        proc = self.agents.pop(instance_id)
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        proc.wait(timeout=10)

    def logs(self) -> str:
        return "".join(p.read_text(errors="replace") for p in self.work_dir.glob("*.log"))
