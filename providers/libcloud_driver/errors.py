"""libcloud error table: driver and transport exceptions -> our typed ``ProviderError``.

Messages first (capacity, throttling, quota), then the HTTP status, then the exception's type; the
table is in the package docstring (``providers.libcloud_driver``). ``ServerFault`` stands in as the
cause for a launch the cloud accepted and then failed.
"""

from __future__ import annotations

import contextlib
import re
from collections.abc import Iterator
from typing import Any

from libcloud.common.exceptions import BaseHTTPError, RateLimitReachedError
from libcloud.common.types import InvalidCredsError, LibcloudError
from libcloud.common.types import ProviderError as LibcloudProviderError

from orchestrator.domain.ports import (
    AuthError,
    CapacityError,
    InvalidRequest,
    LaunchRequest,
    ProviderError,
    QuotaError,
    TransientError,
)
from providers.libcloud_driver.tags import PROVIDER_NAME

# "Insufficient" only where it is about capacity: "insufficient privileges" is not a stockout.
_CAPACITY_MESSAGE = re.compile(
    r"no valid host|novalidhost|capacity|insufficient\s*(compute\s*)?resources|not enough hosts",
    re.IGNORECASE)
_THROTTLE_MESSAGE = re.compile(r"rate\s*limit|throttl", re.IGNORECASE)
_QUOTA_MESSAGE = re.compile(r"quota|limitexceeded|limit exceeded", re.IGNORECASE)
_STATUS_ERRORS: dict[int, type[ProviderError]] = {
    401: AuthError,
    403: AuthError,
    413: QuotaError,
    409: TransientError,
    429: TransientError,
    500: TransientError,
    502: TransientError,
    503: TransientError,
    504: TransientError,
    400: InvalidRequest,
    404: InvalidRequest,
    405: InvalidRequest,
    422: InvalidRequest,
}


class ServerFault(Exception):
    """A launch the cloud accepted and then failed (a server in ERROR with a fault).

    The ``__cause__`` of the typed error raised for it, standing in for the SDK exception that
    does not exist in that case.
    """

    def __init__(self, node_id: str, message: str, code: int | None):
        super().__init__(f"server {node_id} failed: {message}")
        self.node_id = node_id
        self.message = message
        self.code = code


def classify(exc: BaseException) -> tuple[type[ProviderError], str]:
    """The typed error for a libcloud (or transport) exception, and a short code; see the table."""
    if isinstance(exc, InvalidCredsError):
        return AuthError, "InvalidCreds"
    if isinstance(exc, RateLimitReachedError):
        return TransientError, "HTTP 429"
    message = message_of(exc)
    status = status_of(exc)
    if _CAPACITY_MESSAGE.search(message):
        return CapacityError, "NoValidHost" if "valid host" in message.lower() else "Capacity"
    if _THROTTLE_MESSAGE.search(message):
        return TransientError, "Throttled"
    if _QUOTA_MESSAGE.search(message):
        return QuotaError, "QuotaExceeded"
    if status is not None:
        if status in _STATUS_ERRORS:
            return _STATUS_ERRORS[status], f"HTTP {status}"
        if 400 <= status < 500:
            return InvalidRequest, f"HTTP {status}"
        return TransientError, f"HTTP {status}"
    if isinstance(exc, OSError):
        return TransientError, type(exc).__name__
    if isinstance(exc, LibcloudError):
        return TransientError, type(exc).__name__
    return InvalidRequest, type(exc).__name__


def message_of(exc: BaseException) -> str:
    if isinstance(exc, ServerFault):
        return exc.message
    if isinstance(exc, BaseHTTPError):
        return str(exc.message)
    if isinstance(exc, LibcloudError):
        return str(exc.value)
    return str(exc)


def status_of(exc: BaseException) -> int | None:
    if isinstance(exc, BaseHTTPError):
        return int_or_none(exc.code)
    if isinstance(exc, LibcloudProviderError):
        return int_or_none(exc.http_code)
    if isinstance(exc, ServerFault):
        return exc.code
    return None


def int_or_none(value: Any) -> int | None:
    try:
        return int(value)
    except (TypeError, ValueError):
        return None


@contextlib.contextmanager
def libcloud_errors(driver_name: str, req: LaunchRequest | None = None) -> Iterator[None]:
    """Translate whatever the driver raises into the typed errors, keeping it as the cause."""
    try:
        yield
    except ProviderError:
        raise
    except Exception as exc:
        error, code = classify(exc)
        raise error(
            f"libcloud {driver_name}: {type(exc).__name__}: {message_of(exc)}",
            provider=PROVIDER_NAME,
            offering_key=req.offering.key if req else None,
            request_id=req.request_id if req else None,
            code=code,
        ) from exc
