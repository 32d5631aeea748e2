"""Benchmark: how soon a node agent is heard again after a controller outage. Prints figures;
not a test.

    .venv/bin/python bench/bench_agent_outage.py [--outages 5,15,30,60] [--heartbeat 1.0]

A real agent process (``python -m orchestrator.fabric.agent``) registers with a small stand-in
controller (the four agent routes over http.server on 127.0.0.1) and runs a job. For each outage
length the controller cuts every request off unanswered for that long, with a job running that
finishes during the outage, then answers again. Measured: how long after its return the first
heartbeat arrives ("heard after") and the finished job's report ("report after"), and the
heartbeat attempts made during the outage. The agent contract
(``orchestrator/domain/agent_contract.py``) promises at most ``HEARTBEAT_RETRY_MAX_S`` between
attempts, so "heard after" stays within it (plus one request's time); the exit status is 1 if it
does not.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

from orchestrator.domain.agent_contract import HEARTBEAT_RETRY_MAX_S
from orchestrator.fabric.bootstrap import Bootstrap

REPO = Path(__file__).resolve().parents[1]


class Stub:
    """The controller's agent routes, in memory; ``down`` cuts every request off."""

    def __init__(self, heartbeat_s: float):
        self.heartbeat_s = heartbeat_s
        self.lock = threading.Lock()
        self.down = False
        self.jobs: list[dict] = []
        self.beats: list[float] = []  # arrival times of heartbeats (answered or not)
        self.reports: dict[str, float] = {}  # job id -> time its report was answered

    def answer(self, path: str) -> tuple[int, object]:
        with self.lock:
            if path == "/v1/agent/heartbeat":
                self.beats.append(time.monotonic())
            if self.down:
                return 0, None
            if path == "/v1/agent/register":
                return 200, {"credential": "c", "heartbeat_s": self.heartbeat_s}
            if path == "/v1/agent/heartbeat":
                return 200, {"drain": False, "deadline": None, "respect_running_jobs": True}
            if path == "/v1/agent/jobs/next":
                return (200, {"job": self.jobs.pop(0)}) if self.jobs else (204, None)
            if path.endswith("/finish"):
                self.reports[path.split("/")[4]] = time.monotonic()
                return 200, {"accepted": True}
            return 404, None


def serve(stub: Stub) -> ThreadingHTTPServer:
    class Handler(BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            self.rfile.read(int(self.headers.get("Content-Length") or 0))
            status, body = stub.answer(self.path)
            if status == 0:
                self.close_connection = True
                return
            data = b"" if body is None else json.dumps(body).encode()
            self.send_response(status)
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def log_message(self, *args: object) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    server.daemon_threads = True
    threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.05},
                     daemon=True).start()
    return server


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--outages", default="5,15,30,60", help="outage lengths, seconds")
    parser.add_argument("--heartbeat", type=float, default=1.0, help="heartbeat interval, s")
    args = parser.parse_args()
    outages = [float(x) for x in args.outages.split(",")]
    stub = Stub(args.heartbeat)
    server = serve(stub)
    work = Path(tempfile.mkdtemp(prefix="bench-agent-outage-"))
    url = f"http://127.0.0.1:{server.server_address[1]}"
    boot = Bootstrap(node_id="bench-node", controller_url=url, join_token="jt-bench", cluster="bench", policy="bench", gpus=1,
                     gpu_model="simulated", heartbeat_s=args.heartbeat)
    (work / "user-data").write_text(boot.render())
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    env.pop("BURST_BOOT_DELAY_S", None)
    with open(work / "agent.log", "wb") as log:
        agent = subprocess.Popen(
            [sys.executable, "-m", "orchestrator.fabric.agent", "--user-data",
             str(work / "user-data"), "--work-dir", str(work / "state")],
            stdin=subprocess.DEVNULL, stdout=log, stderr=log, env=env, start_new_session=True)
    worst = 0.0
    print(f"heartbeat {args.heartbeat:.1f}s, contract: at most {HEARTBEAT_RETRY_MAX_S:.0f}s "
          "between attempts")
    print(f"{'outage':>8} {'attempts':>9} {'heard after':>12} {'report after':>13}")
    try:
        for n, outage in enumerate(outages):
            job = f"job-{n}"
            with stub.lock:
                stub.jobs.append({"id": job, "command": None, "duration_s": min(2.0, outage / 2),
                                  "gpus": 1, "attempt": 1})
            while True:  # the job is running once a heartbeat has come after its pull
                time.sleep(0.1)
                with stub.lock:
                    if not stub.jobs:
                        break
            with stub.lock:
                stub.down = True
                went = time.monotonic()
            time.sleep(outage)
            with stub.lock:
                stub.down = False
                back = time.monotonic()
                tried = sum(1 for t in stub.beats if went <= t < back)
            while True:
                time.sleep(0.05)
                with stub.lock:
                    heard = [t for t in stub.beats if t >= back]
                    if heard and job in stub.reports:
                        break
            heard_after, report_after = heard[0] - back, stub.reports[job] - back
            worst = max(worst, heard_after)
            print(f"{outage:>7.0f}s {tried:>9} {heard_after:>11.2f}s {report_after:>12.2f}s")
    finally:
        agent.terminate()
        agent.wait(10)
        server.shutdown()
    ok = worst <= HEARTBEAT_RETRY_MAX_S + 5.0
    print(f"worst heard-after {worst:.2f}s: {'within' if ok else 'BEYOND'} the contract")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
