"""A real local HTTP receiver for the notification tests: it records every POST and answers by
path, so one server plays every kind of target:

* ``/ok/...``: 200;
* ``/fail/...``: 500 every time;
* ``/flaky/N/...``: 500 to the first N requests of that path, then 200;
* ``/hold/...``: waits until :meth:`Receiver.release` (a slow target), then 200.

A target that is *down* is a port nobody listens on: :func:`closed_port`.
"""

from __future__ import annotations

import json
import socket
import threading
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any


@dataclass(frozen=True)
class Received:
    path: str
    body: dict[str, Any]
    content_type: str


class Receiver:
    def __init__(self) -> None:
        self.received: list[Received] = []
        self.arrived = threading.Condition()
        self._released = threading.Event()
        self._counts: dict[str, int] = {}
        receiver = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:  # noqa: N802 - http.server's name
                length = int(self.headers.get("content-length", 0))
                body = json.loads(self.rfile.read(length) or b"{}")
                with receiver.arrived:
                    receiver.received.append(Received(self.path, body,
                                                      self.headers.get("content-type", "")))
                    receiver._counts[self.path] = receiver._counts.get(self.path, 0) + 1
                    count = receiver._counts[self.path]
                    receiver.arrived.notify_all()
                parts = self.path.strip("/").split("/")
                status = 200
                if parts[0] == "fail":
                    status = 500
                elif parts[0] == "flaky" and count <= int(parts[1]):
                    status = 500
                elif parts[0] == "hold":
                    receiver._released.wait(60)
                try:
                    self.send_response(status)
                    self.send_header("content-length", "2")
                    self.end_headers()
                    self.wfile.write(b"ok")
                except OSError:
                    pass  # the sender gave up (its timeout) before the answer

            def log_message(self, *args: Any) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.port = self.server.server_address[1]
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)

    def url(self, path: str) -> str:
        return f"http://127.0.0.1:{self.port}{path}"

    def start(self) -> Receiver:
        self.thread.start()
        return self

    def stop(self) -> None:
        self._released.set()
        self.server.shutdown()
        self.server.server_close()

    def reset(self) -> None:
        with self.arrived:
            self.received.clear()
            self._counts.clear()
        self._released.clear()

    def release(self) -> None:
        self._released.set()

    def wait_for(self, predicate, timeout: float = 60.0) -> list[Received]:
        """Block until ``predicate(received)`` holds (generous deadline; no timing asserted)."""
        with self.arrived:
            assert self.arrived.wait_for(lambda: predicate(self.received), timeout), self.received
            return list(self.received)


def closed_port() -> int:
    """A loopback port with nothing listening (a target that is down)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]
