"""Test peer for AWS: a real moto server in this process, behind a fault-injecting middleware.

The adapter under test talks real HTTP to it through boto3 (``AWS_ENDPOINT_URL_EC2`` points at it),
so botocore's request signing, error parsing and retry logic all run as they do against EC2. moto
itself never fails for lack of capacity, so the WSGI middleware in front of it answers chosen
actions with the error EC2 would send (code, message, HTTP status) for the next ``times`` calls, and
counts every action it sees (to prove, e.g., that a capacity 500 is attempted exactly once).

Usage::

    with MotoEC2Server() as server:              # or start()/stop() around a session
        monkeypatch.setenv(...)                  # server.env(): endpoint, fake credentials, region
        server.inject("RunInstances", 500, "InsufficientInstanceCapacity", "no p5 capacity", times=1)
        server.delay("RunInstances", 3.0, times=1)  # the next RunInstances answers 3 s late
        ...
        server.reset()                           # moto's state, faults and counters wiped

Nothing here touches ``os.environ``: the caller applies :meth:`MotoEC2Server.env` (a pytest
``monkeypatch`` or ``MonkeyPatch.context()``), so no test sees AWS settings it did not ask for.

Instance-type validation: moto reads ``MOTO_EC2_ENABLE_INSTANCE_TYPE_VALIDATION`` once, when
``moto.settings`` is first imported, so setting the variable in a test depends on import order and
is not used. In-process the same switch is the module attribute
``moto.settings.EC2_ENABLE_INSTANCE_TYPE_VALIDATION``, read at each RunInstances: a test that wants
an unknown type to fail with ``InvalidInstanceType.NotFound`` (as at EC2) sets it with
``monkeypatch.setattr`` (moto runs in this process, so that reaches the server).

One server per process: moto's backends are module-level state, so two servers here would share
(and reset) the same data anyway.
"""

from __future__ import annotations

import io
import threading
import time
import urllib.request
from collections import Counter
from dataclasses import dataclass
from typing import Any, Self
from urllib.parse import parse_qs
from xml.sax.saxutils import escape

from werkzeug.serving import BaseWSGIServer, WSGIRequestHandler, make_server

TEST_ACCESS_KEY = "testing"
TEST_SECRET_KEY = "testing-secret-xyz"  # tests assert this string never appears in logs
TEST_REGION = "us-east-1"


@dataclass
class _Fault:
    http_status: int
    code: str
    message: str
    remaining: int
    skip: int = 0  # calls to let through first (e.g. the 2nd node of a group fails)


@dataclass
class _Delay:
    seconds: float
    remaining: int


class FaultInjector:
    """WSGI middleware: answers chosen EC2 actions with EC2-shaped errors, or late; counts every
    action."""

    def __init__(self, app: Any):
        self.app = app
        self._lock = threading.Lock()
        self._faults: dict[str, _Fault] = {}
        self._delays: dict[str, _Delay] = {}
        self.calls: Counter[str] = Counter()
        self.in_flight: Counter[str] = Counter()  # requests of each action being answered now

    def inject(self, action: str, http_status: int, code: str, message: str = "", times: int = 1,
               after: int = 0) -> None:
        """Fail the next ``times`` calls of ``action`` (e.g. "RunInstances") with this error,
        once ``after`` calls of it have gone through."""
        with self._lock:
            self._faults[action] = _Fault(http_status, code, message or code, times, after)

    def delay(self, action: str, seconds: float, times: int = 1) -> None:
        """Hold the next ``times`` calls of ``action`` for ``seconds`` before moto handles them
        (the call then succeeds or fails as it would have): a slow cloud API, e.g. to kill a
        client while its RunInstances is in flight."""
        with self._lock:
            self._delays[action] = _Delay(seconds, times)

    def clear(self) -> None:
        """Drop every pending fault and delay."""
        with self._lock:
            self._faults.clear()
            self._delays.clear()

    def reset_counts(self) -> None:
        with self._lock:
            self.calls.clear()

    def __call__(self, environ: dict[str, Any], start_response: Any) -> Any:
        # EC2's query protocol: the action is a form field of the POST body (or the query string).
        length = int(environ.get("CONTENT_LENGTH") or 0)
        body = environ["wsgi.input"].read(length) if length else b""
        environ["wsgi.input"] = io.BytesIO(body)
        fields = parse_qs(body.decode("utf-8", "replace")) or parse_qs(environ.get("QUERY_STRING", ""))
        action = fields.get("Action", [None])[0]
        if action is None:
            return self.app(environ, start_response)
        with self._lock:
            self.calls[action] += 1
            fault = self._faults.get(action)
            if fault is not None and fault.skip > 0:
                fault.skip -= 1
                fault = None
            elif fault is not None and fault.remaining > 0:
                fault.remaining -= 1
            else:
                fault = None
            delay = self._delays.get(action)
            if delay is not None and delay.remaining > 0:
                delay.remaining -= 1
                pause = delay.seconds
            else:
                pause = 0.0
            self.in_flight[action] += 1
        try:
            if pause:
                time.sleep(pause)  # the client's connection stays open meanwhile
            if fault is None:
                return self.app(environ, start_response)
            return self._error(fault, start_response)
        finally:
            with self._lock:
                self.in_flight[action] -= 1

    @staticmethod
    def _error(fault: _Fault, start_response: Any) -> list[bytes]:
        # The error document EC2 sends (botocore's ec2 parser reads Errors/Error/Code and Message).
        xml = (
            "<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n"
            f"<Response><Errors><Error><Code>{escape(fault.code)}</Code>"
            f"<Message>{escape(fault.message)}</Message></Error></Errors>"
            "<RequestID>00000000-fault-injected</RequestID></Response>"
        ).encode()
        start_response(f"{fault.http_status} Injected", [
            ("Content-Type", "text/xml;charset=UTF-8"), ("Content-Length", str(len(xml)))])
        return [xml]


class _QuietHandler(WSGIRequestHandler):
    """No access log: werkzeug would print a line per request to the test output."""

    def log_request(self, *args: Any, **kwargs: Any) -> None:
        pass


class MotoEC2Server:
    """moto (all services) served over HTTP on a free loopback port, with a :class:`FaultInjector`."""

    def __init__(self) -> None:
        self._server: BaseWSGIServer | None = None
        self._thread: threading.Thread | None = None
        self.faults: FaultInjector | None = None
        self.placement: Any = None  # tests.servers.ec2_placement.PlacementGroupsApp, once started
        self._clients: dict[tuple[str, str, str], Any] = {}
        self._clients_lock = threading.Lock()

    # -- lifecycle ----------------------------------------------------------------------------

    def start(self) -> Self:
        if self._server is not None:
            return self
        # Imported here: moto is heavy and only these tests need it.
        from moto.moto_server.werkzeug_app import DomainDispatcherApplication, create_backend_app

        from tests.servers.ec2_placement import PlacementGroupsApp

        # moto has no placement groups: served in front of it (tests.servers.ec2_placement)
        self.placement = PlacementGroupsApp(DomainDispatcherApplication(create_backend_app))
        self.faults = FaultInjector(self.placement)
        self._server = make_server("127.0.0.1", 0, self.faults, threaded=True,
                                   request_handler=_QuietHandler)
        self._thread = threading.Thread(target=self._server.serve_forever, name="moto-ec2",
                                        daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        if self._server is None:
            return
        self._server.shutdown()
        self._server.server_close()
        if self._thread is not None:
            self._thread.join(timeout=5)
        self._server = self._thread = None

    def __enter__(self) -> Self:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    # -- what tests use -----------------------------------------------------------------------

    @property
    def url(self) -> str:
        if self._server is None:
            raise RuntimeError("MotoEC2Server is not started")
        return f"http://127.0.0.1:{self._server.server_port}"

    def env(self) -> dict[str, str]:
        """Environment that points boto3's standard chain at this server (apply it yourself)."""
        return {
            "AWS_ENDPOINT_URL_EC2": self.url,
            "AWS_ENDPOINT_URL_IAM": self.url,  # instance profiles are checked by moto's IAM
            "AWS_ACCESS_KEY_ID": TEST_ACCESS_KEY,
            "AWS_SECRET_ACCESS_KEY": TEST_SECRET_KEY,
            "AWS_DEFAULT_REGION": TEST_REGION,
            "AWS_EC2_METADATA_DISABLED": "true",  # no 1-second IMDS probe per client
        }

    def reset(self) -> None:
        """Wipe moto's state (every service), pending faults and call counters."""
        request = urllib.request.Request(f"{self.url}/moto-api/reset", data=b"", method="POST")
        with urllib.request.urlopen(request, timeout=10) as reply:
            reply.read()
        assert self.faults is not None
        self.faults.clear()
        self.faults.reset_counts()

    def inject(self, action: str, http_status: int, code: str, message: str = "", times: int = 1,
               after: int = 0) -> None:
        assert self.faults is not None, "MotoEC2Server is not started"
        self.faults.inject(action, http_status, code, message, times, after)

    def delay(self, action: str, seconds: float, times: int = 1) -> None:
        assert self.faults is not None, "MotoEC2Server is not started"
        self.faults.delay(action, seconds, times)

    def in_flight(self, action: str) -> int:
        """How many requests for ``action`` the server is answering right now (delayed included)."""
        assert self.faults is not None, "MotoEC2Server is not started"
        with self.faults._lock:
            return self.faults.in_flight[action]

    def clear(self) -> None:
        if self.faults is not None:
            self.faults.clear()

    def calls(self, action: str) -> int:
        """How many requests for ``action`` reached the server (faulted ones included)."""
        assert self.faults is not None, "MotoEC2Server is not started"
        return self.faults.calls[action]

    def client(self, service: str = "ec2", region: str = TEST_REGION) -> Any:
        """A boto3 client for test setup and inspection only (explicit endpoint and keys).

        Cached per service and region: building an EC2 client costs 0.1-0.3 s (765 methods).
        """
        import boto3

        key = (self.url, service, region)
        with self._clients_lock:
            if key not in self._clients:
                self._clients[key] = boto3.client(
                    service, region_name=region, endpoint_url=self.url,
                    aws_access_key_id=TEST_ACCESS_KEY, aws_secret_access_key=TEST_SECRET_KEY)
            return self._clients[key]
