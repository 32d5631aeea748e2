"""Run the API with uvicorn in a background thread of the controller process."""

from __future__ import annotations

import threading
import time

import uvicorn
from fastapi import FastAPI


class ApiServer:
    """Serve ``app`` on host:port from a daemon thread; ``port`` 0 picks a free port."""

    def __init__(self, app: FastAPI, host: str, port: int):
        config = uvicorn.Config(app, host=host, port=port, log_level="warning", access_log=False,
                                lifespan="off")
        self._server = uvicorn.Server(config)
        self._thread = threading.Thread(target=self._server.run, name="burst-api", daemon=True)
        self.host = host
        self.port = port

    def start(self, timeout: float = 15.0) -> int:
        """Start serving; return the bound port."""
        self._thread.start()
        deadline = time.monotonic() + timeout
        while not self._server.started:
            if not self._thread.is_alive() or time.monotonic() > deadline:
                raise RuntimeError(f"the API could not start on {self.host}:{self.port}")
            time.sleep(0.02)
        sockets = self._server.servers[0].sockets
        self.port = sockets[0].getsockname()[1]
        return self.port

    def stop(self) -> None:
        self._server.should_exit = True
        self._thread.join(timeout=10)
