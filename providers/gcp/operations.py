"""GCP long-running operations: waiting for a zone operation, and the error a failed one carries.

Insert returns a zone operation; it is waited for with our own ``ZoneOperationsClient`` (same
endpoint and credentials as the instances client) in a bounded loop, never with
``ExtendedOperation.result()``, which polls through a client built without the endpoint override.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from contextlib import AbstractContextManager
from typing import Any

from google.api_core import exceptions as api_exceptions
from google.cloud import compute_v1

from orchestrator.domain.ports import TransientError

_MIN_WAIT_S = 0.5  # shortest read timeout given to one operations.wait call


def is_read_timeout(exc: BaseException | None) -> bool:
    return isinstance(exc, api_exceptions.DeadlineExceeded) or type(exc).__name__ == "ReadTimeout"


def operation_exception(op: compute_v1.Operation) -> api_exceptions.GoogleAPICallError:
    """The google exception ``op.result()`` would have raised for a failed operation."""
    errors = list(op.error.errors)
    message = "; ".join(f"{e.code}: {e.message}" for e in errors) or op.http_error_message
    return api_exceptions.from_http_status(
        op.http_error_status_code or 500, message or "operation failed", errors=errors
    )


def wait_for_operation(
    op: compute_v1.Operation,
    *,
    project: str,
    zone: str,
    client: Callable[[], Any],
    errors: Callable[[str], AbstractContextManager[None]],
    timeout_s: float,
    poll_interval_s: float,
) -> compute_v1.Operation:
    """Wait for ``op`` until it is done or ``timeout_s`` has passed; return it as last seen.

    ``client()`` gives the ZoneOperationsClient, ``errors(what)`` maps client errors to typed ones.
    A read timeout at the deadline is not an error: the caller looks at the instance instead.
    """
    deadline = time.monotonic() + timeout_s
    while op.status != compute_v1.Operation.Status.DONE:
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            break
        request = compute_v1.WaitZoneOperationRequest(project=project, zone=zone, operation=op.name)
        try:
            with errors(f"wait for operation {op.name}"):
                # wait() returns when the operation is done or after up to two minutes, so
                # our deadline is the read timeout: past it we stop waiting, not fail.
                op = client().wait(request=request, retry=None, timeout=max(remaining, _MIN_WAIT_S))
        except TransientError as error:
            if is_read_timeout(error.__cause__):
                break  # the caller looks at the instance instead
            raise
        if op.status != compute_v1.Operation.Status.DONE:
            time.sleep(min(poll_interval_s, max(deadline - time.monotonic(), 0)))
    return op
