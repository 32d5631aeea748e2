"""Notifications in the store: claimed once per (target, subject, window, grade), then sent.

:meth:`Notices.claim_notice` inserts the row with ON CONFLICT DO NOTHING and says whether this
call made it: only the claimant sends, so two beats, two workers or a restarted loop that see the
same budget grade send one message. A row then records each delivery attempt (``attempts``,
``last_error``, ``sent_at``) and ends ``sent`` or ``failed`` (retries given up). The target ``-``
is the event's own record (state ``recorded``), written whether or not any target listens: it is
what ``burst_budget_grade_crossings_total`` counts and what the dashboard lists.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from enum import StrEnum
from typing import Any

import sqlalchemy as sa

from orchestrator.store import tables as T
from orchestrator.store.base import StoreBase, require_aware

EVENT_RECORD = "-"  # the target name of an event's own record
MAX_ERROR = 500  # characters of a delivery error kept


class NoticeState(StrEnum):
    PENDING = "pending"
    SENT = "sent"
    FAILED = "failed"  # retries exhausted
    RECORDED = "recorded"  # the event's own record: nothing to send


@dataclass(frozen=True, slots=True)
class NoticeKey:
    """What makes a notification unique for one target."""

    event: str
    subject: str
    window: str
    grade: str
    policy: str


@dataclass(frozen=True, slots=True)
class Notice:
    id: int
    target: str
    key: NoticeKey
    title: str
    text: str
    details: dict[str, Any]
    created_at: datetime
    state: NoticeState
    attempts: int
    last_error: str | None
    sent_at: datetime | None


class Notices(StoreBase):
    """Notification rows of the Store."""

    def claim_notice(self, target: str, key: NoticeKey, *, title: str, text: str,
                     details: dict[str, Any], at: datetime) -> int | None:
        """Insert the notification of ``key`` for ``target``; its id if this call made it, None
        if it existed already (someone else sends it, or sent it)."""
        require_aware(at, "at")
        state = NoticeState.RECORDED if target == EVENT_RECORD else NoticeState.PENDING
        stmt = self._insert(T.notifications).values(
            target=target, event=key.event, subject=key.subject, window=key.window,
            grade=key.grade, policy=key.policy, title=title, text=text, details=details,
            created_at=at, state=state.value, attempts=0,
        ).on_conflict_do_nothing()
        c = T.notifications.c
        with self._write() as conn:
            if conn.execute(stmt).rowcount != 1:
                return None
            return int(conn.execute(sa.select(c.id).where(
                c.target == target, c.subject == key.subject, c.window == key.window,
                c.grade == key.grade)).scalar_one())

    def notice(self, notice_id: int) -> Notice | None:
        with self._read() as conn:
            row = conn.execute(sa.select(T.notifications).where(
                T.notifications.c.id == notice_id)).first()
        return _notice(row) if row is not None else None

    def notices(self, *, state: NoticeState | None = None, target: str | None = None,
                limit: int = 200) -> list[Notice]:
        """Newest first."""
        c = T.notifications.c
        query = sa.select(T.notifications).order_by(c.created_at.desc(), c.id.desc()).limit(limit)
        if state is not None:
            query = query.where(c.state == state.value)
        if target is not None:
            query = query.where(c.target == target)
        with self._read() as conn:
            return [_notice(r) for r in conn.execute(query)]

    def record_delivery(self, notice_id: int, at: datetime, *, error: str | None,
                        final: bool = False) -> None:
        """One attempt: sent (``error`` None), or failed with ``error`` (``final``: no retry
        follows, the row ends ``failed``). A row already sent stays sent."""
        require_aware(at, "at")
        c = T.notifications.c
        if error is None:
            values: dict[str, Any] = {"state": NoticeState.SENT.value, "sent_at": at,
                                      "last_error": None}
        else:
            values = {"last_error": error[:MAX_ERROR]}
            if final:
                values["state"] = NoticeState.FAILED.value
        with self._write() as conn:
            conn.execute(sa.update(T.notifications).where(
                c.id == notice_id, c.state != NoticeState.SENT.value).values(
                attempts=c.attempts + 1, **values))

    def grade_crossings(self) -> list[tuple[str, str, str, int]]:
        """(policy, subject, grade, count) of budget grade crossings recorded so far."""
        c = T.notifications.c
        query = (sa.select(c.policy, c.subject, c.grade, sa.func.count())
                 .where(c.target == EVENT_RECORD, c.event == "budget-grade")
                 .group_by(c.policy, c.subject, c.grade))
        with self._read() as conn:
            return [(p, s, g, int(n)) for p, s, g, n in conn.execute(query)]


def _notice(row: Any) -> Notice:
    return Notice(
        id=int(row.id), target=row.target,
        key=NoticeKey(row.event, row.subject, row.window, row.grade, row.policy),
        title=row.title, text=row.text, details=dict(row.details or {}), created_at=row.created_at,
        state=NoticeState(row.state), attempts=int(row.attempts), last_error=row.last_error,
        sent_at=row.sent_at)


__all__ = ["EVENT_RECORD", "Notice", "NoticeKey", "NoticeState", "Notices"]
