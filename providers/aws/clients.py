"""boto3 sessions and EC2 client settings (timeouts, bounded retries), and user data kept out of logs.

Credentials come from the standard chain or the named profile and are never logged; botocore's
request logger would print user data (with the node's join token) at DEBUG, so a filter blanks it.
"""

from __future__ import annotations

import logging
import re
from typing import Any

import boto3
from botocore.config import Config

_TIMEOUTS = {"connect_timeout": 5, "read_timeout": 30}
# One attempt: a capacity 500 must reach the executor at once, which fails over to the next
# offering. A lost response is safe to retry at the executor's level (same request id).
LAUNCH_CONFIG = Config(retries={"total_max_attempts": 1, "mode": "standard"}, **_TIMEOUTS)
# Reads and terminate are idempotent: absorb a blip, but stay bounded so a tick is not stalled.
READ_CONFIG = Config(retries={"total_max_attempts": 3, "mode": "standard"}, **_TIMEOUTS)


def make_session(profile: str | None = None) -> Any:
    """A boto3 Session on the standard credential chain, or on the named profile.

    For callers outside this module that need EC2 with the policy's credentials (e.g. the catalogue
    refresh) without importing boto3 themselves.
    """
    return boto3.session.Session(profile_name=profile) if profile else boto3.session.Session()


# botocore's request logger prints the whole request at DEBUG, user data (with its join token)
# included. This filter blanks it in both forms botocore logs: the params dict and the encoded body.
_USER_DATA_BODY = re.compile(r"(UserData=)[^&'\"\s]*")
_USER_DATA_PARAM = re.compile(r"('UserData':\s*)(b?'[^']*'|b?\"[^\"]*\")")


class _RedactUserData(logging.Filter):
    def filter(self, record: logging.LogRecord) -> bool:
        try:
            text = record.getMessage()
        except (TypeError, ValueError):  # a record that cannot format is not ours to fix
            return True
        if "UserData" in text:
            text = _USER_DATA_BODY.sub(r"\1<redacted>", text)
            text = _USER_DATA_PARAM.sub(r"\1'<redacted>'", text)
            record.msg, record.args = text, ()
        return True


_REDACTOR = _RedactUserData()


def install_log_redaction() -> None:
    for name in ("botocore.endpoint", "botocore.parsers", "botocore.hooks"):
        logger = logging.getLogger(name)
        if _REDACTOR not in logger.filters:
            logger.addFilter(_REDACTOR)
