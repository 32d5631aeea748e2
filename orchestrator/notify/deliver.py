"""Sending one claimed notification to its webhook: the body, the secret URL, one HTTP attempt.

The URL is read at send time from the target's ``url_env`` or ``url_file`` and used for the one
request: it is never stored, logged, put in an error message or returned by the API (an error
that quotes it has it replaced by ``<url>``). Each attempt has the target's timeout; its outcome
is recorded on the row (:meth:`orchestrator.store.Store.record_delivery`). Retrying is the
caller's: the Celery task's backoff, or the embedded sender's (:mod:`orchestrator.notify.sender`).
"""

from __future__ import annotations

import logging
import os
from collections.abc import Iterable
from datetime import datetime
from functools import lru_cache
from pathlib import Path
from typing import Any

import httpx

from orchestrator.policy.models import Policy
from orchestrator.policy.notifications import WebhookFormat, WebhookTarget
from orchestrator.store import Store
from orchestrator.store.notices import Notice, NoticeState

log = logging.getLogger(__name__)

# httpx logs every request's whole URL at INFO and httpcore its host and port at DEBUG: a
# webhook's URL is its secret (Slack's carries the token in its path), so at any level burst
# runs at (`--log-level info` or `debug`) neither library may log below WARNING.
for _library in ("httpx", "httpcore"):
    logging.getLogger(_library).setLevel(logging.WARNING)


class DeliveryFailed(Exception):
    """One attempt failed (worth retrying)."""


class NoTarget(Exception):
    """The notification's target is in no running policy any more (never retried)."""


def find_target(policies: Iterable[Policy], name: str) -> WebhookTarget | None:
    for policy in policies:
        for target in policy.notifications.targets:
            if target.name == name:
                return target
    return None


def webhook_url(target: WebhookTarget) -> str:
    """The target's URL from the environment or its file; DeliveryFailed naming the variable or
    file (never the URL) when it is missing."""
    if target.url_env is not None:
        url = os.environ.get(target.url_env, "").strip()
        if not url:
            raise DeliveryFailed(f"target {target.name}: environment variable {target.url_env} "
                                 "is not set")
    else:
        path = Path(target.url_file or "")
        try:
            url = path.read_text(encoding="utf-8").strip().splitlines()[0].strip()
        except (OSError, IndexError) as exc:
            raise DeliveryFailed(f"target {target.name}: cannot read url_file {path}: "
                                 f"{type(exc).__name__}") from None
    if not url.startswith(("http://", "https://")):
        raise DeliveryFailed(f"target {target.name}: the URL read from "
                             f"{target.url_env or target.url_file} is not http(s)")
    return url


def body(notice: Notice, fmt: WebhookFormat) -> dict[str, Any]:
    """The JSON body for ``fmt``: burst's own document, or a Slack-compatible message."""
    if fmt is WebhookFormat.SLACK:
        return {
            "text": f"{notice.title}: {notice.text}",
            "blocks": [
                {"type": "header", "text": {"type": "plain_text", "text": notice.title[:150]}},
                {"type": "section", "text": {"type": "mrkdwn", "text": notice.text}},
                {"type": "context", "elements": [{"type": "mrkdwn", "text":
                    f"burst · {notice.key.event} · policy {notice.key.policy}"}]},
            ],
        }
    return {"event": notice.key.event, "subject": notice.key.subject,
            "window": notice.key.window, "grade": notice.key.grade, "policy": notice.key.policy,
            "title": notice.title, "text": notice.text, "details": notice.details,
            "at": notice.created_at.isoformat().replace("+00:00", "Z"), "id": notice.id}


@lru_cache(maxsize=1)
def shared_client() -> httpx.Client:
    """One HTTP client per process (building one costs an SSL context); thread-safe."""
    return httpx.Client()


def attempt(store: Store, policies: Iterable[Policy], notice_id: int, now: datetime, *,
            final: bool = False, client: httpx.Client | None = None) -> bool:
    """One delivery attempt of row ``notice_id``; True when it is sent (now or before).
    Raises DeliveryFailed after recording a failed attempt (``final``: the row ends failed),
    NoTarget when no policy has its target any more."""
    notice = store.notice(notice_id)
    if notice is None or notice.state is NoticeState.SENT:
        return notice is not None
    target = find_target(policies, notice.target)
    if target is None:
        store.record_delivery(notice_id, now, error="target no longer configured", final=True)
        raise NoTarget(f"notification {notice_id}: target {notice.target} is in no policy")
    url = ""
    try:
        url = webhook_url(target)
        response = (client or shared_client()).post(
            url, json=body(notice, target.format), timeout=target.timeout.total_seconds())
        if response.status_code >= 300:
            raise DeliveryFailed(f"target {target.name} answered HTTP {response.status_code}")
    except (DeliveryFailed, httpx.HTTPError) as exc:
        message = str(exc) or type(exc).__name__
        if isinstance(exc, httpx.HTTPError):
            message = f"target {target.name}: {type(exc).__name__}: {message}"
        if url:
            message = message.replace(url, "<url>")
        store.record_delivery(notice_id, now, error=message, final=final)
        log.warning("notification %d (%s) not delivered%s: %s", notice_id, notice.key.event,
                    " (giving up)" if final else "", message)
        raise DeliveryFailed(message) from None
    store.record_delivery(notice_id, now, error=None)
    log.info("notification %d (%s %s) sent to %s", notice_id, notice.key.event,
             notice.key.subject, target.name)
    return True


__all__ = ["DeliveryFailed", "NoTarget", "attempt", "body", "find_target", "webhook_url"]
