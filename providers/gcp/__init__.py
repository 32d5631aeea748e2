"""GCP provider: burst nodes as Compute Engine VMs, through google-cloud-compute over REST.

The package holds the adapter (``adapter.GcpProvider``) and, by concern, the instance resource
and naming (``labels``), zone choice and launchability (``placement``), the error table
(``errors``), operation waits (``operations``), the provider check (``checks``) and log redaction
(``redaction``); the names below are re-exported.

``GcpProvider`` implements the ``Provider`` Protocol of ``orchestrator.domain.ports`` with the
official client (``InstancesClient`` and ``ZoneOperationsClient``, REST transport). Its modules
import only ``orchestrator.domain``, ``google.*`` and the standard library; the policy's
``GcpConfig`` arrives as a plain object with attributes.

Identity and idempotency
    * Instance id: ``"<zone>/<name>"`` (e.g. ``us-central1-a/burst-train-3f2a9c01de``), so describe
      and terminate work after a restart without any memory. A bare name is also accepted; it is
      looked up in every configured zone.
    * Instance name: ``burst-<node id>`` (RFC 1035: lower case, starts with a letter, <= 63 chars).
      A node id that is not already lower-case ``[a-z0-9-]`` or would make the name too long is
      sanitised, truncated and suffixed with 8 hex digits of its SHA-256 (:func:`instance_name`).
      GCE refuses a second instance of the same name in a zone, which is the last line of
      idempotency.
    * ``InsertInstanceRequest.request_id``: GCE's own idempotency key, a UUID5 of the request id
      (:func:`gce_request_id`). The same key returns the same operation (for up to an hour at GCE),
      *even when that operation failed*; so after an operation fails (stockout, quota) the next try
      for the same request id uses ``uuid5(request_id#attempt)``. The attempt counter lives in
      process memory, so after a restart the first try may get an old failure replayed: if an
      instance of ours then exists under our name (a later attempt succeeded), it is returned as
      "already done"; otherwise the old failure is reported once and the next try is fresh.
      Nothing is created twice either way.
    * A 409 ``alreadyExists`` for our name means "already done": the instance is fetched and
      returned when it carries the same ``burst:request-id``, else :class:`InvalidRequest`.

Labels and metadata
    GCP label keys cannot hold ``:``; the ownership tags map one to one::

        burst:cluster    <->  burst-cluster
        burst:policy     <->  burst-policy
        burst:node-id    <->  burst-node-id
        burst:request-id <->  burst-request-id

    Label values are lower-cased, anything outside ``[a-z0-9_-]`` becomes ``-`` and they are cut
    at 63 characters (:func:`label_value`). Because that is lossy, the exact tags also ride in the
    metadata item ``burst-tags`` (JSON); ``Instance.tags`` is read from it, or rebuilt from the
    labels through the inverse key map when it is missing. ``list_owned`` filters server-side on
    the label and then on the exact cluster. Other metadata items: ``user-data`` (the bootstrap;
    cloud-init's GCE datasource reads it), ``burst-node-id`` and ``burst-offering`` (offering key).

Operations
    Insert returns a zone operation; the adapter waits for it with its own ``ZoneOperationsClient``
    built with the same endpoint and credentials (``wait`` in a bounded loop,
    ``operation_timeout_s``). ``ExtendedOperation.result()`` is never used: it polls through a
    client created without the endpoint override, i.e. Google's public host. Delete is not waited
    for: the instance shows ``STOPPING`` until it disappears, which the reconciler observes.

States: PROVISIONING, STAGING -> pending; RUNNING -> running; STOPPING, SUSPENDING, SUSPENDED,
STOPPED, REPAIRING, PENDING_STOP -> stopping; TERMINATED -> terminated. A deleted instance is
simply absent.

Errors (``_CODE_ERRORS`` then ``_STATUS_ERRORS``; the google exception is the ``__cause__``):

    =====================================================  ==================
    operation error code / HTTP error reason                error
    =====================================================  ==================
    ZONE_RESOURCE_POOL_EXHAUSTED[_WITH_DETAILS],            CapacityError
    RESOURCE_POOL_EXHAUSTED, 429/503 saying the zone
    "does not have enough resources"
    QUOTA_EXCEEDED, quotaExceeded, limitExceeded            QuotaError
    401, 403 (insufficientPermissions, forbidden, ...),     AuthError
    google.auth DefaultCredentialsError / RefreshError
    429 (rateLimitExceeded), 500, 502, 503, 504,            TransientError
    resourceNotReady, connection errors, timeouts,
    RefreshError marked retryable, auth TransportError
    400 (invalid, badRequest), 404 on insert (bad image,    InvalidRequest
    machine or accelerator type), UNSUPPORTED_OPERATION,
    409 for an instance that is not ours, 412
    =====================================================  ==================

``UNSUPPORTED_OPERATION`` is deliberately *not* capacity: GCE uses it for shapes a zone never
offers (e.g. an accelerator type or spot for a machine type there), which retrying elsewhere later
will not fix; a spot stockout comes back as ``ZONE_RESOURCE_POOL_EXHAUSTED`` like any other.
``rateLimitExceeded`` is throttling (transient), not quota.

Credentials: Application Default Credentials (``google.auth.default``) unless given; resolved on
first use, so a missing credential surfaces as :class:`AuthError` (and as a failed ``check()``
row). Neither credentials nor user data are ever logged, by us or, when an operator turns on debug
logging for the google libraries, by them: their records of request and response bodies (an
instance body carries the bootstrap's join token; google-auth logs a federation subject token in
clear) are blanked by a logging filter on the emitting loggers.

Permissions: ``API_PERMISSIONS`` lists every API method this package calls with the IAM
permissions it needs; ``infra/gcp/burst-controller-role.yaml`` grants exactly their union.
"""

from providers.gcp.adapter import API_PERMISSIONS, GcpProvider
from providers.gcp.labels import (
    CLUSTER_LABEL,
    LABEL_KEYS,
    PROVIDER_NAME,
    SCOPES,
    TAG_KEYS,
    gce_request_id,
    instance_name,
    label_value,
    labels_for,
    parse_instance_id,
    tags_from_labels,
)

__all__ = [
    "API_PERMISSIONS",
    "CLUSTER_LABEL",
    "LABEL_KEYS",
    "PROVIDER_NAME",
    "SCOPES",
    "TAG_KEYS",
    "GcpProvider",
    "gce_request_id",
    "instance_name",
    "label_value",
    "labels_for",
    "parse_instance_id",
    "tags_from_labels",
]
