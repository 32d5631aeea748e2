"""Join tokens and node credentials.

A join token lets exactly one node register once. It is derived from the controller's secret key
with HMAC over (node id, request id), so the executor can re-create the same token when it
re-issues a launch after a crash (the instance may already have booted with it), yet only its
SHA-256 hash is ever stored. The store enforces single use and expiry; a token is useless for any
other node id because the hash is looked up by node id.

Registration exchanges the token for a random per-node credential (also stored only as a hash),
which the agent presents as a bearer token on every later call.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import secrets
from dataclasses import dataclass
from datetime import datetime, timedelta


def token_hash(token: str) -> str:
    """The only form in which tokens and credentials are stored."""
    return hashlib.sha256(token.encode()).hexdigest()


@dataclass(frozen=True)
class JoinTokens:
    """Issues join tokens from the controller secret."""

    secret: bytes
    ttl: timedelta = timedelta(minutes=30)

    def issue(self, node_id: str, request_id: str, created_at: datetime) -> tuple[str, str, datetime]:
        """(token, its hash, expiry) for a node; the same inputs give the same token."""
        digest = hmac.new(self.secret, f"join|{node_id}|{request_id}".encode(), hashlib.sha256).digest()
        token = "bjt_" + base64.urlsafe_b64encode(digest).decode().rstrip("=")
        return token, token_hash(token), created_at + self.ttl


def new_credential() -> tuple[str, str]:
    """A fresh random node credential and its hash."""
    credential = "bnc_" + secrets.token_urlsafe(32)
    return credential, token_hash(credential)
