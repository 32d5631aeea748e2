"""Benchmark: the controller API under a bounded load from this machine (loopback only). Prints
figures; not a test.

    .venv/bin/python bench/bench_api_load.py [--clients 16] [--seconds 10] [--database-url URL]

``burst api`` runs as its own process on 127.0.0.1 over a fresh store (SQLite in a temporary
directory unless ``--database-url`` names an empty database), with an admin token and one ready
node whose credential the heartbeats use. Then, one route after the other, ``--clients`` threads
(each with its own keep-alive connection) call the route back to back for ``--seconds``:

* ``GET /healthz``: the floor, what any answer costs through uvicorn and the middleware here;
* ``GET /v1/costs`` (admin token): a cost report over the (empty) ledger;
* ``POST /v1/agent/heartbeat`` (node credential): a credential check and a write per call;
* ``GET /metrics`` (admin token): the Prometheus exposition, read from the store.

For each: requests, throughput, latency p50/p99/max, and errors (anything but a 2xx, or no
answer). The exit status is 1 if any request failed.
"""

from __future__ import annotations

import argparse
import os
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path

import httpx
import psutil

from orchestrator.domain import Node, NodeState
from orchestrator.fabric.tokens import new_credential
from orchestrator.lifecycle import NodeEvent
from orchestrator.policy import Market
from orchestrator.store import Store

REPO = Path(__file__).resolve().parents[1]
NODE_ID = "bench-node"


@dataclass
class Route:
    name: str
    method: str
    path: str
    headers: dict[str, str]
    json: dict | None = None
    latencies: list[float] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _prepare(url: str) -> tuple[str, str]:
    """An admin token and a ready node's credential in the store at ``url``."""
    store = Store(url)
    try:
        store.upgrade()
        now = datetime.now(UTC)
        secret, _ = store.create_api_token("admin", [], created_at=now, description="bench")
        node = Node(NODE_ID, "default", "gpu", "local", "local/r/z/t1/on-demand", "t1",
                    Market.ON_DEMAND, 1, 1.0, NodeState.READY, now, now, "bench-request",
                    instance_id="bench-instance", last_heartbeat=now, idle_since=now)
        store.add_node(node, NodeEvent(NODE_ID, now, None, NodeState.READY, "bench", {}))
        credential, credential_hash = new_credential()
        store.set_credential(NODE_ID, credential_hash)
        return secret, credential
    finally:
        store.close()


def _hammer(base: str, route: Route, stop_at: float) -> None:
    with httpx.Client(base_url=base, timeout=30) as client:
        while time.perf_counter() < stop_at:
            started = time.perf_counter()
            try:
                answer = client.request(route.method, route.path, headers=route.headers,
                                        json=route.json)
            except httpx.HTTPError as exc:
                route.errors.append(f"{type(exc).__name__}: {exc}")
                continue
            route.latencies.append(time.perf_counter() - started)
            if not 200 <= answer.status_code < 300:
                route.errors.append(f"HTTP {answer.status_code}: {answer.text[:200]}")


def _run(base: str, route: Route, clients: int, seconds: float) -> float:
    stop_at = time.perf_counter() + seconds
    threads = [threading.Thread(target=_hammer, args=(base, route, stop_at)) for _ in range(clients)]
    started = time.perf_counter()
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    return time.perf_counter() - started


def _quantile(values: list[float], q: float) -> float:
    if len(values) < 2:
        return values[0] if values else float("nan")
    return statistics.quantiles(values, n=100, method="inclusive")[int(q * 100) - 1]


def _wait_ready(base: str, proc: subprocess.Popen[bytes], timeout: float = 120.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise SystemExit(f"burst api exited with {proc.returncode}")
        try:
            if httpx.get(f"{base}/healthz", timeout=2).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        time.sleep(0.1)
    raise SystemExit(f"burst api did not answer within {timeout:.0f}s")


class Served(str):
    """The base URL of a served API, with its process id (``pid``) for CPU readings."""

    pid: int


def server_cpu_s(base: str) -> float:
    """CPU seconds (user + system) the API process behind ``base`` (a :class:`Served`) used."""
    times = psutil.Process(base.pid).cpu_times()  # type: ignore[attr-defined]
    return times.user + times.system


@contextmanager
def serve_api(env: dict) -> Iterator[str]:
    """``burst api`` (one process, as deployed) with ``env`` on a free loopback port, until the
    block ends: its base URL (a :class:`Served`) once ``/healthz`` answers. Stopped with SIGTERM, then killed if it
    is still answering slow requests 30 s later."""
    port = _free_port()
    env = {**env, "BURST_API_HOST": "127.0.0.1", "BURST_API_PORT": str(port)}
    proc = subprocess.Popen([sys.executable, "-c", "from orchestrator.cli import main; main()",
                             "api"], env=env, stdin=subprocess.DEVNULL)
    base = Served(f"http://127.0.0.1:{port}")
    base.pid = proc.pid
    try:
        _wait_ready(base, proc)
        yield base
    finally:
        proc.terminate()
        try:
            proc.wait(30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(30)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--clients", type=int, default=16, help="concurrent clients (default 16)")
    ap.add_argument("--seconds", type=float, default=10.0, help="seconds per route (default 10)")
    ap.add_argument("--database-url", help="an empty database to use (default: SQLite in a temp dir)")
    args = ap.parse_args()
    if args.clients < 1 or args.seconds <= 0:
        ap.error("--clients must be at least 1 and --seconds above 0")
    with tempfile.TemporaryDirectory(prefix="bench-api-") as tmp:
        url = args.database_url or f"sqlite:///{Path(tmp) / 'burst.db'}"
        admin, credential = _prepare(url)
        env = {**os.environ, "PYTHONPATH": str(REPO), "BURST_STATE_DIR": tmp,
               "BURST_DATABASE_URL": url, "BURST_LOG_LEVEL": "WARNING"}
        with serve_api(env) as base:
            routes = [
                Route("floor: GET /healthz", "GET", "/healthz", {}),
                Route("GET /v1/costs", "GET", "/v1/costs", {"Authorization": f"Bearer {admin}"}),
                Route("POST /v1/agent/heartbeat", "POST", "/v1/agent/heartbeat",
                      {"Authorization": f"Bearer {credential}"},
                      {"node_id": NODE_ID, "status": "idle"}),
                Route("GET /metrics", "GET", "/metrics", {"Authorization": f"Bearer {admin}"}),
            ]
            print(f"{args.clients} clients, {args.seconds:g} s per route, store "
                  f"{url.split(':', 1)[0]}, burst api on {base}")
            print(f"{'route':28} {'requests':>9} {'req/s':>8} {'p50 ms':>8} {'p99 ms':>8} "
                  f"{'max ms':>8} {'errors':>7}")
            failed = 0
            for route in routes:
                took = _run(base, route, args.clients, args.seconds)
                ms = [v * 1000 for v in route.latencies]
                print(f"{route.name:28} {len(ms):>9} {len(ms) / took:>8.0f} "
                      f"{_quantile(ms, 0.50):>8.1f} {_quantile(ms, 0.99):>8.1f} "
                      f"{max(ms, default=float('nan')):>8.1f} {len(route.errors):>7}")
                for error in route.errors[:3]:
                    print(f"    {error}")
                failed += len(route.errors)
        if args.database_url:
            Store(url).downgrade("base")
    return 1 if failed else 0


if __name__ == "__main__":
    raise SystemExit(main())
