"""Keeps secrets out of the google libraries' debug logs: a filter blanking request/response bodies.

An instance body carries the bootstrap and its join token; google-auth logs a federation subject
token in clear. ``install_redaction`` puts the filter on every emitting logger (idempotent).
"""

from __future__ import annotations

import logging


class _RedactPayloads(logging.Filter):
    """Blanks request and response bodies in the google libraries' debug records.

    With debug logging on for the ``google`` loggers, the compute REST transport logs every body
    as record extras (an instance body carries the bootstrap and its join token), and google-auth
    logs token requests, a workload identity federation subject token included, in clear.
    """

    def filter(self, record: logging.LogRecord) -> bool:
        for attr in ("httpRequest", "httpResponse"):
            value = getattr(record, attr, None)
            if isinstance(value, dict):
                setattr(
                    record,
                    attr,
                    {
                        k: "<redacted by burst>" if k in ("payload", "body") else v
                        for k, v in value.items()
                    },
                )
        for attr in ("request", "response"):
            if getattr(record, attr, None) is not None:
                setattr(record, attr, "<redacted by burst>")
        return True


# Logger filters only see records logged on that very logger, so each emitting module is named.
_REDACTED_LOGGERS = (
    "google.auth.transport.requests",
    "google.auth._helpers",
    *(
        f"google.cloud.compute_v1.services.{service}.{module}"
        for service in ("instances", "zone_operations", "images", "machine_types")
        for module in ("client", "transports.rest")
    ),
)


def install_redaction() -> None:
    for name in _REDACTED_LOGGERS:
        logger = logging.getLogger(name)
        if not any(isinstance(f, _RedactPayloads) for f in logger.filters):
            logger.addFilter(_RedactPayloads())
