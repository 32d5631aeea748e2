"""Provider test set-up shared by the contract environments (tests/contract/adapters/) and the
provider integration tests (tests/integration/test_*_provider.py).

Each fake cloud (moto for EC2, our Compute REST server, our Nova) runs once per test session:
started on first use, stopped at exit, reset by whoever uses it. The server modules are imported
only when their server is first asked for, so a suite that needs one cloud's SDK loads no other.
"""

from __future__ import annotations

import atexit
import threading
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, TypeVar

import pytest

if TYPE_CHECKING:
    from tests.servers.fake_gce import FakeGce
    from tests.servers.fake_nova import FakeNova
    from tests.servers.moto_ec2 import MotoEC2Server

T = TypeVar("T")

GCE_ZONES = ("us-central1-a", "us-central1-b")  # the zones the session's Compute server serves

_servers: dict[str, Any] = {}
_lock = threading.Lock()


def session_server(name: str, start: Callable[[], T]) -> T:
    """The session's server called ``name``: ``start()``-ed on first use, stopped at exit."""
    with _lock:
        if name not in _servers:
            server = start()
            atexit.register(server.stop)  # type: ignore[attr-defined]
            _servers[name] = server
        return _servers[name]


def shared_moto() -> MotoEC2Server:
    """The session's moto EC2 server."""
    from tests.servers.moto_ec2 import MotoEC2Server

    return session_server("moto-ec2", lambda: MotoEC2Server().start())


def shared_fake_gce() -> FakeGce:
    """The session's Compute REST server (zones :data:`GCE_ZONES`, operations done on 2nd poll)."""
    from tests.servers.fake_gce import FakeGce

    return session_server("fake-gce", lambda: FakeGce(op_polls=2, zones=GCE_ZONES).start())


def shared_nova() -> FakeNova:
    """The session's fake Nova."""
    from tests.servers.fake_nova import FakeNova

    return session_server("fake-nova", lambda: FakeNova().start())


def point_boto3_at(server: MotoEC2Server, mp: pytest.MonkeyPatch) -> None:
    """boto3's standard chain pointed at ``server`` (endpoint and credentials from the
    environment), with no stray profile or credentials file of this machine leaking in."""
    for name, value in server.env().items():
        mp.setenv(name, value)
    mp.setenv("AWS_CONFIG_FILE", "/nonexistent/aws-config")
    mp.setenv("AWS_SHARED_CREDENTIALS_FILE", "/nonexistent/aws-credentials")
    mp.delenv("AWS_PROFILE", raising=False)
