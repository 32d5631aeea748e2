"""In-memory fakes of burst's ports, for tests only (DESIGN.md: "Tests")."""

from tests.fakes.provider import FakeProvider

__all__ = ["FakeProvider"]
