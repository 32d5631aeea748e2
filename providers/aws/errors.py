"""AWS error table: botocore exceptions -> our typed ``ProviderError`` (the exception as the cause).

EC2 error codes first (:data:`ERROR_CODES`), then the HTTP status; botocore's own failures
(credentials, parameters, connections) by type. ``ec2_errors`` is the context manager every EC2
call of the adapter runs in; ``typed_error`` serves callers outside it (the catalogue refresh).
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass

import botocore.exceptions as bce

from orchestrator.domain.ports import (
    AuthError,
    CapacityError,
    InvalidRequest,
    ProviderError,
    QuotaError,
    TransientError,
)
from providers.aws.tags import PROVIDER_NAME

# EC2 error codes -> typed errors, from the EC2 API reference's error-code page:
# https://docs.aws.amazon.com/AWSEC2/latest/APIReference/errors-overview.html
# Codes not listed fall back on the HTTP status (see classify_error): 5xx and 429 are transient,
# 401/403 are auth, every other 4xx is an invalid request (a bug or a bad policy).
ERROR_CODES: dict[str, type[ProviderError]] = {
    # No capacity for this offering now: the executor tries the next offering.
    "InsufficientInstanceCapacity": CapacityError,  # sent with HTTP 500
    "InsufficientHostCapacity": CapacityError,
    "InsufficientReservedInstanceCapacity": CapacityError,
    "InsufficientCapacity": CapacityError,
    "SpotMaxPriceTooLow": CapacityError,  # spot price above our max: this offering is out of reach
    "Unsupported": CapacityError,  # type/market not offered in this AZ: try another offering
    # Account limits: retrying will not help until the quota is raised.
    "InstanceLimitExceeded": QuotaError,
    "VcpuLimitExceeded": QuotaError,
    "MaxSpotInstanceCountExceeded": QuotaError,
    "InsufficientFreeAddressesInSubnet": QuotaError,
    # Credentials or permissions: stop using the provider and alert.
    "AuthFailure": AuthError,
    "UnauthorizedOperation": AuthError,
    "InvalidClientTokenId": AuthError,
    "SignatureDoesNotMatch": AuthError,
    "ExpiredToken": AuthError,
    "OptInRequired": AuthError,  # region or service not enabled for the account
    "Blocked": AuthError,  # account suspended
    # Temporary: retry with backoff (the same request id).
    "RequestLimitExceeded": TransientError,  # EC2's throttling code
    "Throttling": TransientError,
    "ServiceUnavailable": TransientError,
    "InternalError": TransientError,
    "InternalFailure": TransientError,
    "Unavailable": TransientError,
}

# botocore's own (non-HTTP) failures. Checked in order; anything else from botocore is transient.
_BOTOCORE_ERRORS: tuple[tuple[type[Exception], type[ProviderError]], ...] = (
    (bce.NoCredentialsError, AuthError),
    (bce.PartialCredentialsError, AuthError),
    (bce.ProfileNotFound, AuthError),
    (bce.CredentialRetrievalError, AuthError),
    (bce.TokenRetrievalError, AuthError),
    (bce.ParamValidationError, InvalidRequest),
    (bce.NoRegionError, InvalidRequest),
    # EndpointConnectionError, ConnectTimeoutError, ReadTimeoutError, ConnectionClosedError:
    (bce.ConnectionError, TransientError),
    (bce.HTTPClientError, TransientError),
)

NOT_FOUND_CODES = frozenset({"InvalidInstanceID.NotFound", "InvalidInstanceID.Malformed"})


def classify_error(code: str, http_status: int | None) -> type[ProviderError]:
    """The typed error for an EC2 error ``code`` sent with ``http_status``."""
    if code in ERROR_CODES:
        return ERROR_CODES[code]
    status = http_status or 0
    if status >= 500 or status == 429:
        return TransientError
    if status in (401, 403):
        return AuthError
    return InvalidRequest


@dataclass(frozen=True, slots=True)
class Context:
    """What an error is about, for the typed error's attributes."""

    offering_key: str | None = None
    request_id: str | None = None


class DryRunOk(Exception):
    """A dry run EC2 would have allowed."""


def typed_error(exc: BaseException, what: str = "EC2") -> ProviderError | None:
    """The typed error for a botocore exception raised outside the adapter (e.g. by the catalogue
    refresh, which drives EC2 with a session of :func:`make_session`); None for anything else."""
    if isinstance(exc, bce.ClientError):
        error = exc.response.get("Error", {})
        code = str(error.get("Code") or "Unknown")
        status = exc.response.get("ResponseMetadata", {}).get("HTTPStatusCode")
        message = error.get("Message") or str(exc)
        return classify_error(code, status)(f"{what} {exc.operation_name}: {code}: {message}",
                                            provider="aws", code=code)
    if isinstance(exc, bce.BotoCoreError):
        kind = next((k for t, k in _BOTOCORE_ERRORS if isinstance(exc, t)), TransientError)
        return kind(f"{what} client: {type(exc).__name__}: {exc}", provider="aws",
                    code=type(exc).__name__)
    return None


@contextmanager
def ec2_errors(ctx: Context, *, dry_run_ok: bool = False) -> Iterator[None]:
    """Translate botocore's exceptions into the typed errors, keeping them as the cause."""
    try:
        yield
    except bce.ClientError as exc:
        error = exc.response.get("Error", {})
        code = str(error.get("Code") or "Unknown")
        if dry_run_ok and code == "DryRunOperation":
            raise DryRunOk() from exc
        status = exc.response.get("ResponseMetadata", {}).get("HTTPStatusCode")
        kind = classify_error(code, status)
        message = error.get("Message") or str(exc)
        raise kind(
            f"EC2 {exc.operation_name}: {code}: {message}", provider=PROVIDER_NAME,
            offering_key=ctx.offering_key, request_id=ctx.request_id, code=code,
        ) from exc
    except bce.BotoCoreError as exc:
        kind = next((k for t, k in _BOTOCORE_ERRORS if isinstance(exc, t)), TransientError)
        raise kind(
            f"EC2 client: {type(exc).__name__}: {exc}", provider=PROVIDER_NAME,
            offering_key=ctx.offering_key, request_id=ctx.request_id, code=type(exc).__name__,
        ) from exc
