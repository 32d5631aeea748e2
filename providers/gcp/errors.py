"""GCP error table: exceptions of the google client stack -> our typed ``ProviderError``.

Operation error codes and HTTP error reasons first (``_CODE_ERRORS``), then the HTTP status
(``_STATUS_ERRORS``); the table and its reasons are in the package docstring (``providers.gcp``).
The google exception is always the ``__cause__`` of the typed error.
"""

from __future__ import annotations

import google.auth.exceptions as auth_exceptions
from google.api_core import exceptions as api_exceptions

from orchestrator.domain.ports import (
    AuthError,
    CapacityError,
    InvalidRequest,
    ProviderError,
    QuotaError,
    TransientError,
)
from providers.gcp.labels import PROVIDER_NAME

# Error codes of operations (error.errors[].code) and reasons of HTTP errors (error.errors[].reason,
# or the ErrorInfo reason), checked in the order GCE lists them; the first one known decides.
_CODE_ERRORS: dict[str, type[ProviderError]] = {
    "ZONE_RESOURCE_POOL_EXHAUSTED": CapacityError,
    "ZONE_RESOURCE_POOL_EXHAUSTED_WITH_DETAILS": CapacityError,
    "RESOURCE_POOL_EXHAUSTED": CapacityError,
    "QUOTA_EXCEEDED": QuotaError,
    "quotaExceeded": QuotaError,
    "limitExceeded": QuotaError,
    "insufficientPermissions": AuthError,
    "forbidden": AuthError,
    "authError": AuthError,
    "accessNotConfigured": AuthError,  # the Compute API is not enabled for the project
    "PERMISSION_DENIED": AuthError,
    "rateLimitExceeded": TransientError,  # throttling, not quota
    "userRateLimitExceeded": TransientError,
    "RATE_LIMIT_EXCEEDED": TransientError,
    "RESOURCE_OPERATION_RATE_EXCEEDED": TransientError,
    "backendError": TransientError,
    "internalError": TransientError,
    "INTERNAL_ERROR": TransientError,
    "resourceNotReady": TransientError,
    "RESOURCE_NOT_READY": TransientError,
    "UNSUPPORTED_OPERATION": InvalidRequest,  # see the package docstring: not a stockout
    "invalid": InvalidRequest,
    "badRequest": InvalidRequest,
    "required": InvalidRequest,
    "notFound": InvalidRequest,
    "RESOURCE_NOT_FOUND": InvalidRequest,
    "INVALID_FIELD_VALUE": InvalidRequest,
    "conditionNotMet": InvalidRequest,
    "alreadyExists": InvalidRequest,  # only reached when the instance is not ours
    "RESOURCE_ALREADY_EXISTS": InvalidRequest,
}

# HTTP status when no code above is known.
_STATUS_ERRORS: dict[int, type[ProviderError]] = {
    400: InvalidRequest,
    401: AuthError,
    403: AuthError,
    404: InvalidRequest,
    409: InvalidRequest,
    412: InvalidRequest,
    429: TransientError,
    500: TransientError,
    502: TransientError,
    503: TransientError,
    504: TransientError,
}

# How GCE words a stockout when it arrives without one of the codes above.
_CAPACITY_MESSAGES = (
    "does not have enough resources available",
    "resource pool exhausted",
    "currently unavailable in the",
)

# requests' exceptions derive from OSError; these few mean a bad endpoint, not a flaky network.
_BAD_URL_ERRORS = frozenset({"InvalidURL", "MissingSchema", "InvalidSchema", "URLRequired"})


# -- error mapping ---------------------------------------------------------------------------------


def codes_of(exc: api_exceptions.GoogleAPICallError) -> list[str]:
    codes = [e.get("reason", "") for e in (exc.errors or []) if isinstance(e, dict)]
    codes += [getattr(e, "code", "") for e in (exc.errors or []) if not isinstance(e, dict)]
    if getattr(exc, "reason", None):
        codes.append(exc.reason)
    return [c for c in codes if c]


def classify(codes: list[str], status: int | None, message: str) -> type[ProviderError]:
    for code in codes:
        if code in _CODE_ERRORS:
            return _CODE_ERRORS[code]
    if status in (429, 503) and any(m in message.lower() for m in _CAPACITY_MESSAGES):
        return CapacityError
    if status in _STATUS_ERRORS:
        return _STATUS_ERRORS[status]
    if status is not None and 400 <= status < 500:
        return InvalidRequest
    return TransientError  # 5xx and anything unexplained: the executor retries, then gives up


def map_exception(
    exc: BaseException, what: str, *, offering_key: str | None, request_id: str | None
) -> ProviderError | None:
    """The typed error for an exception of the client stack, or None if it is not one of them."""
    kind: type[ProviderError]
    code: str | None = None
    if isinstance(exc, api_exceptions.GoogleAPICallError):
        codes = codes_of(exc)
        status = exc.code if isinstance(exc.code, int) else None
        kind = classify(codes, status, exc.message or "")
        code = codes[0] if codes else (str(status) if status else type(exc).__name__)
        detail = exc.message
    elif isinstance(exc, api_exceptions.GoogleAPIError):  # RetryError and kin
        kind, code, detail = TransientError, type(exc).__name__, str(exc)
    elif isinstance(exc, auth_exceptions.RefreshError):
        kind = TransientError if getattr(exc, "retryable", False) else AuthError
        code, detail = "RefreshError", str(exc)
    elif isinstance(exc, auth_exceptions.TransportError):
        kind, code, detail = TransientError, "TransportError", str(exc)
    elif isinstance(exc, auth_exceptions.GoogleAuthError):  # DefaultCredentialsError and kin
        kind, code, detail = AuthError, type(exc).__name__, str(exc)
    elif isinstance(exc, OSError):  # requests' ConnectionError, Timeout, ...
        name = type(exc).__name__
        kind = InvalidRequest if name in _BAD_URL_ERRORS else TransientError
        code, detail = name, str(exc)
    else:
        return None
    return kind(
        f"{what}: {detail}",
        provider=PROVIDER_NAME,
        offering_key=offering_key,
        request_id=request_id,
        code=code,
    )
