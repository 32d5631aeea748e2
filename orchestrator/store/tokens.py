"""Bearer tokens of the HTTP API, in the store: issue, check, list, revoke.

A token is a random secret (``bat_...``) shown once when issued; only its SHA-256 hash is stored
(the same hashing as join tokens and node credentials, :mod:`orchestrator.fabric.tokens`), so a
copy of the database lets nobody call the API. Each token has one :class:`Role`:

* ``admin``: every route, every project's rows;
* ``viewer``: read routes, rows of its named projects only;
* ``submitter``: what a viewer may, plus submitting jobs for its named projects.

A token may name a ``subject``: the user it acts as. Jobs it submits carry that user, and a
submitter token may not submit for another user (an admin's may).

A token may expire; revoking one is immediate and idempotent. ``last_used_at`` is refreshed at
most once a minute per token, so reading the API does not turn every request into a write.
Times are passed in, never read from a clock.
"""

from __future__ import annotations

import hashlib
import hmac
import re
import secrets
from collections.abc import Iterable
from dataclasses import dataclass
from datetime import datetime, timedelta
from enum import StrEnum
from typing import Any, Literal

import sqlalchemy as sa

from orchestrator.domain.jobs import check_user
from orchestrator.store import tables as T
from orchestrator.store.base import StoreBase, require_aware

TOKEN_PREFIX = "bat_"
TOKEN_ID_PREFIX = "tok-"
MAX_DESCRIPTION = 500
# A project name as policies and jobs use it; no commas (the API's ``project`` lists are
# comma-separated) and no whitespace.
PROJECT_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._/-]{0,127}$")
LAST_USED_GRANULARITY = timedelta(minutes=1)

TokenCheck = Literal["ok", "unknown", "revoked", "expired"]


class Role(StrEnum):
    """What a token may do (see the module docstring)."""

    ADMIN = "admin"
    VIEWER = "viewer"
    SUBMITTER = "submitter"


def hash_api_token(secret: str) -> str:
    """The only form in which an API token is stored (SHA-256, hex)."""
    return hashlib.sha256(secret.encode()).hexdigest()


def new_api_token_secret() -> str:
    return TOKEN_PREFIX + secrets.token_urlsafe(32)


@dataclass(frozen=True, slots=True)
class ApiToken:
    """One API token's record (never its secret)."""

    id: str
    role: Role
    projects: tuple[str, ...]
    description: str
    created_at: datetime
    expires_at: datetime | None
    revoked_at: datetime | None
    last_used_at: datetime | None
    subject: str | None = None  # the user the token acts as; None: none named

    @property
    def scope(self) -> frozenset[str] | None:
        """The projects this token may see; None means every project (admin)."""
        return None if self.role is Role.ADMIN else frozenset(self.projects)

    def sees(self, project: str | None) -> bool:
        """May this token see rows of ``project`` (None: rows of no project, admin only)?"""
        scope = self.scope
        return scope is None or (project is not None and project in scope)

    def status(self, now: datetime) -> TokenCheck:
        if self.revoked_at is not None:
            return "revoked"
        if self.expires_at is not None and self.expires_at <= now:
            return "expired"
        return "ok"

    def as_json(self, now: datetime | None = None) -> dict[str, Any]:
        data: dict[str, Any] = {
            "id": self.id, "role": str(self.role), "projects": list(self.projects),
            "subject": self.subject, "description": self.description, "created_at": _iso(self.created_at),
            "expires_at": _iso(self.expires_at), "revoked_at": _iso(self.revoked_at),
            "last_used_at": _iso(self.last_used_at),
        }
        if now is not None:
            data["status"] = self.status(now)
        return data


def validate_scope(role: Role | str, projects: Iterable[str]) -> tuple[Role, tuple[str, ...]]:
    """The role and its sorted, de-duplicated projects; ValueError naming the bad field.

    An admin token names no project (it sees all); a viewer or submitter names at least one.
    """
    try:
        role = Role(role)
    except ValueError:
        raise ValueError(f"role: must be one of {', '.join(r.value for r in Role)} "
                         f"(got {role!r})") from None
    names = sorted({p.strip() if isinstance(p, str) else p for p in projects})
    for name in names:
        if not isinstance(name, str) or not PROJECT_RE.match(name):
            raise ValueError(f"project: {name!r} is not a project name (letters, digits, '.', "
                             "'_', '/', '-'; at most 128 characters)")
    if role is Role.ADMIN and names:
        raise ValueError("project: an admin token sees every project; name projects only for "
                         "the viewer and submitter roles")
    if role is not Role.ADMIN and not names:
        raise ValueError(f"project: a {role} token needs at least one project")
    return role, tuple(names)


def _iso(moment: datetime | None) -> str | None:
    return moment.isoformat().replace("+00:00", "Z") if moment is not None else None


# The check's one statement, built once (``token_hash`` bound): on every API request, building
# the select cost about as much as the store's round trip to run it.
_BY_HASH = sa.select(T.api_tokens).where(T.api_tokens.c.token_hash == sa.bindparam("token_hash"))


def _token_from_row(row: sa.Row[Any]) -> ApiToken:
    m = row._mapping
    projects = (m["projects"] or {}).get("projects", [])
    return ApiToken(
        id=m["id"], role=Role(m["role"]), projects=tuple(projects),
        description=m["description"] or "", created_at=m["created_at"],
        expires_at=m["expires_at"], revoked_at=m["revoked_at"], last_used_at=m["last_used_at"],
        subject=m["subject"],
    )


class ApiTokens(StoreBase):
    """API-token methods of the Store."""

    def create_api_token(
        self,
        role: Role | str,
        projects: Iterable[str],
        *,
        created_at: datetime,
        expires_at: datetime | None = None,
        description: str = "",
        subject: str | None = None,
    ) -> tuple[str, ApiToken]:
        """Issue a token: (its secret, shown once; its record). ValueError naming a bad field.
        ``subject``: the user it acts as (None: none)."""
        role, names = validate_scope(role, projects)
        if subject is not None:
            try:
                check_user(subject)
            except ValueError as exc:
                raise ValueError(f"user: {exc}") from None
        require_aware(created_at, "created_at")
        if expires_at is not None:
            require_aware(expires_at, "expires_at")
            if expires_at <= created_at:
                raise ValueError(f"expires: {_iso(expires_at)} is not after {_iso(created_at)}")
        if len(description) > MAX_DESCRIPTION:
            raise ValueError(f"description: at most {MAX_DESCRIPTION} characters "
                             f"(got {len(description)})")
        with self._write() as conn:
            # Random ids and secrets make a clash unlikely, not impossible: retry on one.
            for _ in range(8):
                secret = new_api_token_secret()
                record = ApiToken(
                    id=TOKEN_ID_PREFIX + secrets.token_hex(4), role=role, projects=names,
                    description=description, created_at=created_at, expires_at=expires_at,
                    revoked_at=None, last_used_at=None, subject=subject,
                )
                stmt = self._insert(T.api_tokens).values(
                    id=record.id, token_hash=hash_api_token(secret), role=role.value,
                    projects={"projects": list(names)}, description=description, subject=subject,
                    created_at=created_at, expires_at=expires_at,
                ).on_conflict_do_nothing()
                if conn.execute(stmt).rowcount == 1:
                    return secret, record
        raise RuntimeError("could not allocate a unique API token")

    def check_api_token(self, secret: str, now: datetime) -> tuple[ApiToken | None, TokenCheck]:
        """The token a caller presents: (its record, "ok"), or (record or None, why it is refused).

        The lookup is by hash; the hash is compared again in constant time so the answer's
        timing tells nothing about stored hashes. A usable token's ``last_used_at`` is refreshed
        (at most once per minute).
        """
        require_aware(now, "now")
        given = hash_api_token(secret)
        c = T.api_tokens.c
        with self._peek() as conn:  # one statement, on every request: no BEGIN/COMMIT
            row = conn.execute(_BY_HASH, {"token_hash": given}).first()
        if row is None or not hmac.compare_digest(row._mapping["token_hash"], given):
            return None, "unknown"
        token = _token_from_row(row)
        status = token.status(now)
        if status == "ok" and (token.last_used_at is None
                               or now - token.last_used_at >= LAST_USED_GRANULARITY):
            with self._write() as conn:
                # Only moves forward, so concurrent requests never set it back.
                conn.execute(sa.update(T.api_tokens).where(
                    c.id == token.id,
                    sa.or_(c.last_used_at.is_(None), c.last_used_at < now),
                ).values(last_used_at=now))
        return token, status

    def api_tokens(self, include_revoked: bool = False) -> list[ApiToken]:
        """Every token by creation time (revoked ones only when asked)."""
        c = T.api_tokens.c
        query = sa.select(T.api_tokens).order_by(c.created_at, c.id)
        if not include_revoked:
            query = query.where(c.revoked_at.is_(None))
        with self._read() as conn:
            return [_token_from_row(r) for r in conn.execute(query)]

    def get_api_token(self, token_id: str) -> ApiToken | None:
        with self._read() as conn:
            row = conn.execute(
                sa.select(T.api_tokens).where(T.api_tokens.c.id == token_id)).first()
        return _token_from_row(row) if row is not None else None

    def revoke_api_token(self, token_id: str, at: datetime) -> ApiToken | None:
        """Revoke a token (it is refused from now on); revoking again keeps the first time.
        None if there is no such token."""
        require_aware(at, "at")
        c = T.api_tokens.c
        with self._write() as conn:
            conn.execute(sa.update(T.api_tokens)
                         .where(c.id == token_id, c.revoked_at.is_(None))
                         .values(revoked_at=at))
            row = conn.execute(sa.select(T.api_tokens).where(c.id == token_id)).first()
        return _token_from_row(row) if row is not None else None


__all__ = ["ApiToken", "ApiTokens", "Role", "TokenCheck", "hash_api_token",
           "new_api_token_secret", "validate_scope"]
