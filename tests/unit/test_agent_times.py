"""The node agent reads the controller's drain deadline through the one ISO parser
(orchestrator.isotime), without pydantic: an aware time as it is, a naive one as the controller's
UTC, anything else ignored (logged) rather than crashing the agent."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta, timezone

import pytest

from orchestrator.fabric import agent
from orchestrator.fabric.agent import _parse_deadline


def test_a_drain_deadline_is_read_as_the_controller_wrote_it():
    assert _parse_deadline("2026-12-06T10:00:00Z") == datetime(2026, 12, 6, 10, tzinfo=UTC)
    plus2 = timezone(timedelta(hours=2))
    assert _parse_deadline("2026-12-06T12:00:00+02:00") == datetime(2026, 12, 6, 12, tzinfo=plus2)
    assert _parse_deadline("2026-12-06T10:00:00") == datetime(2026, 12, 6, 10, tzinfo=UTC)
    assert _parse_deadline(None) is None and _parse_deadline("") is None


@pytest.mark.parametrize("garbled", ["tomorrow", "0001-01-01T00:00:00Z", 12, "9" * 200])
def test_a_garbled_drain_deadline_is_ignored_and_logged(garbled, monkeypatch):
    # (read off the agent's logger itself: an agent started earlier in the same process may have
    # stopped it propagating to the root, where caplog listens)
    said: list[str] = []
    monkeypatch.setattr(agent.log, "warning", lambda message, *args: said.append(message % args))
    assert _parse_deadline(garbled) is None
    assert len(said) == 1 and said[0].startswith("ignoring unparseable drain deadline")
