"""What a training job does to cooperate with burst's torch-elastic fabric (the drain hooks).

burst's node agent starts ``torchrun`` with these environment variables, which reach every worker:

* ``BURST_ELASTIC_DIR``: the node's control directory;
* ``BURST_CHECKPOINT_HOOK``: ``file`` or ``http``, how a drain asks for a checkpoint;
* ``BURST_CHECKPOINT_PORT``: for ``http``, where local rank 0 of the node listens (127.0.0.1).

The protocol, for a node that is about to leave:

* **file**: the agent creates ``$BURST_ELASTIC_DIR/checkpoint.request``; the job saves a
  checkpoint and writes ``$BURST_ELASTIC_DIR/checkpoint.done`` (``{"step": N}``);
* **http**: the agent sends ``POST http://127.0.0.1:$BURST_CHECKPOINT_PORT/checkpoint``; the job
  saves and then answers ``GET /checkpoint`` with ``{"requested": true, "done": N}``.

Then the agent stops the node's ``torchrun`` (by signal: an agent that exits cleanly would close
the rendezvous for everyone). Until then the job holds, without training, so no step is done that
the checkpoint lacks; the survivors' next collective fails when the node is gone, torchrun
restarts them in a smaller world and they resume from the checkpoint.

:class:`ElasticControl` implements the job's side in a few calls per step::

    control = ElasticControl()
    while step < total:
        checkpoint_now, stop_now = control.poll()      # collective: every rank agrees
        if checkpoint_now:
            save_checkpoint(step)                      # rank 0 (any shared storage)
            control.confirm(step)
            control.hold()                             # returns if the drain is called off
        if stop_now:
            break
        ...train one step...
        control.status(step=step, world_size=world)

Importing this module does not import torch; the calls do.
"""

from __future__ import annotations

import json
import os
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

REQUEST = "checkpoint.request"
DONE = "checkpoint.done"
STOP = "stop"  # any node's stop file ends the job cleanly (demos and tests)
STATUS = "status.json"


class ElasticControl:
    """The job's side of the drain hooks (see the module docstring)."""

    def __init__(self, directory: str | None = None):
        path = directory or os.environ.get("BURST_ELASTIC_DIR")
        self.dir = Path(path) if path else None
        self.hook = os.environ.get("BURST_CHECKPOINT_HOOK", "file")
        self.local_rank = int(os.environ.get("LOCAL_RANK", "0"))
        self._http_requested = False
        self._http_done: int | None = None
        self._server: ThreadingHTTPServer | None = None
        if self.dir is not None:
            self.dir.mkdir(parents=True, exist_ok=True)
        if self.hook == "http" and self.local_rank == 0 and os.environ.get("BURST_CHECKPOINT_PORT"):
            self._serve(int(os.environ["BURST_CHECKPOINT_PORT"]))

    # -- what this node was asked ------------------------------------------------------------
    def _requested_here(self) -> bool:
        if self.hook == "http":
            return self._http_requested
        return self.dir is not None and (self.dir / REQUEST).exists()

    def _stop_here(self) -> bool:
        return self.dir is not None and (self.dir / STOP).exists()

    def poll(self) -> tuple[bool, bool]:
        """(checkpoint now, stop now), agreed by every rank (one small all_reduce)."""
        import torch
        import torch.distributed as dist

        flags = torch.tensor([float(self._requested_here()), float(self._stop_here())])
        if dist.is_initialized():
            dist.all_reduce(flags, op=dist.ReduceOp.MAX)
        return bool(flags[0] > 0), bool(flags[1] > 0)

    def confirm(self, step: int) -> None:
        """Tell this node's agent the checkpoint of ``step`` is saved (if it asked). Call it
        after the checkpoint is durable; every rank calls it (a barrier keeps them together)."""
        import torch.distributed as dist

        if dist.is_initialized():
            dist.barrier()
        if self.local_rank != 0 or not self._requested_here():
            return
        if self.hook == "http":
            self._http_done = step
        elif self.dir is not None:
            tmp = self.dir / f".{DONE}.tmp"
            tmp.write_text(json.dumps({"step": step, "at": time.time()}))
            tmp.replace(self.dir / DONE)

    def hold(self, interval_s: float = 0.5) -> None:
        """Train no further while a node is leaving. Raises when the world changes (a peer
        gone fails the collective; torchrun then restarts the workers from the checkpoint);
        returns if every request was withdrawn."""
        while True:
            requested, _ = self.poll()
            if not requested:
                return
            time.sleep(interval_s)

    def status(self, **fields: Any) -> None:
        """Local rank 0 records the node's training status (the agent reads it to see the
        node has joined the job and is training)."""
        if self.local_rank != 0 or self.dir is None:
            return
        tmp = self.dir / f".{STATUS}.tmp"
        tmp.write_text(json.dumps({**fields, "at": time.time()}))
        tmp.replace(self.dir / STATUS)

    # -- http hook ----------------------------------------------------------------------------
    def _serve(self, port: int) -> None:
        control = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                if self.path.rstrip("/") == "/checkpoint":
                    control._http_requested = True
                    self._answer(202, {"requested": True, "done": control._http_done})
                else:
                    self._answer(404, {"error": "no such path"})

            def do_DELETE(self) -> None:
                control._http_requested = False
                self._answer(200, {"requested": False, "done": control._http_done})

            def do_GET(self) -> None:
                self._answer(200, {"requested": control._http_requested,
                                   "done": control._http_done})

            def _answer(self, status: int, body: dict[str, Any]) -> None:
                payload = json.dumps(body).encode()
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(payload)))
                self.end_headers()
                self.wfile.write(payload)

            def log_message(self, *args: object) -> None:
                pass

        ThreadingHTTPServer.allow_reuse_address = True
        self._server = ThreadingHTTPServer(("127.0.0.1", port), Handler)
        self._server.daemon_threads = True
        threading.Thread(target=self._server.serve_forever, daemon=True).start()
