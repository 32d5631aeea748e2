"""The c10d rendezvous store of a torch-elastic fabric, hosted by the controller.

``torchrun`` agents on every training node (on-prem and burst) rendezvous through one TCPStore.
By default the first agent up hosts it, so the job dies when that node leaves (pytorch#67742).
burst runs the store in a process of its own beside the controller instead, and every agent is
started with ``--rdzv-conf=is_host=false``: any training node may leave.

    python -m orchestrator.fabric.torch_store --host 0.0.0.0 --port 29400

runs it in the foreground until SIGTERM/SIGINT. :class:`RendezvousHost` starts and stops such a
process (the demo and the torch-elastic fabric use it); it needs torch only in the child.
"""

from __future__ import annotations

import argparse
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path


def reachable(host: str, port: int, timeout_s: float = 0.5) -> bool:
    try:
        with socket.create_connection((host, port), timeout=timeout_s):
            return True
    except OSError:
        return False


class RendezvousHost:
    """A store process for ``host:port`` (see the module docstring)."""

    def __init__(self, endpoint: str, *, log_path: Path | None = None):
        host, _, port = endpoint.rpartition(":")
        self.host, self.port = host or "127.0.0.1", int(port)
        self.log_path = log_path
        self.proc: subprocess.Popen[bytes] | None = None

    @property
    def endpoint(self) -> str:
        return f"{self.host}:{self.port}"

    def start(self, timeout_s: float = 60.0) -> RendezvousHost:
        """Start the store unless one already answers there; wait until it accepts connections."""
        if reachable(self.host, self.port):
            return self
        out = open(self.log_path, "ab") if self.log_path else subprocess.DEVNULL  # noqa: SIM115
        try:
            self.proc = subprocess.Popen(
                [sys.executable, "-m", "orchestrator.fabric.torch_store", "--host", self.host,
                 "--port", str(self.port)],
                stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT,
                start_new_session=True)  # a controller's Ctrl-C must not take the job down
        finally:
            if out is not subprocess.DEVNULL:
                out.close()
        end = time.monotonic() + timeout_s
        while not reachable(self.host, self.port):
            if self.proc.poll() is not None:
                raise RuntimeError(f"the rendezvous store exited with {self.proc.returncode}"
                                   f"{'; see ' + str(self.log_path) if self.log_path else ''}")
            if time.monotonic() > end:
                self.stop()
                raise RuntimeError(f"the rendezvous store did not listen on {self.endpoint} "
                                   f"within {timeout_s:.0f}s")
            time.sleep(0.1)
        return self

    def stop(self) -> None:
        """Stop the store this object started (one it found running is left alone)."""
        if self.proc is None or self.proc.poll() is not None:
            return
        self.proc.terminate()
        try:
            self.proc.wait(5)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait(5)

    def __enter__(self) -> RendezvousHost:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--host", default="0.0.0.0")
    parser.add_argument("--port", type=int, default=29400)
    args = parser.parse_args(argv)
    from datetime import timedelta

    from torch.distributed import TCPStore

    # multi_tenant: several jobs (rendezvous ids) may share one store; wait_for_workers=False:
    # the store serves whoever comes, for as long as it runs.
    store = TCPStore(args.host, args.port, is_master=True, wait_for_workers=False,
                     multi_tenant=True, timeout=timedelta(seconds=60))
    print(f"burst rendezvous store on {args.host}:{args.port}", flush=True)
    stop = threading.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: stop.set())
    stop.wait()
    del store
    return 0


if __name__ == "__main__":
    sys.exit(main())
