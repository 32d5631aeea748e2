"""AWS provider: burst nodes are EC2 instances, launched and observed through boto3.

The package holds the adapter (``adapter.AwsProvider``) and, by concern, tags and launch
parameters (``tags``), the error table (``errors``), sessions and client settings (``clients``)
and the provider check (``checks``); the names below are re-exported.

``AwsProvider`` keeps the ``Provider`` contract of ``orchestrator.domain.ports`` for EC2:

* **Launch** is one ``RunInstances`` call (one instance, on-demand or one-time spot), tagged at
  creation with the ownership tags on the instance and its root volume. It is idempotent on the
  request id in two layers: before launching, the adapter looks for an instance already tagged
  ``burst:request-id=<id>`` and returns it; and ``ClientToken`` is derived from the request id, so
  EC2 itself dedupes a retry that races the tag lookup (EC2's describe is eventually consistent,
  and its ``ClientToken`` memory is not forever, so neither layer suffices alone).
* **Observation** (``describe``, ``list_owned``) uses ``DescribeInstances`` with filters only
  (filters never fail on unknown ids, whereas ``InstanceIds=`` fails the whole call), in every
  region in use: the regions given (else the catalogue's, else the session's default region) and
  any region launched in. One failing region fails the call: a partial view would look to the
  reconciler like vanished nodes.
* **Terminate** is idempotent: ids that EC2 does not know are skipped (an unknown id fails a
  whole TerminateInstances batch at EC2, so a failed batch is retried id by id).
* **Errors** are mapped by the explicit table :data:`ERROR_CODES` (then by HTTP status) to the
  typed errors of the ports, with the botocore exception as ``__cause__``.

Retries are explicit: ``RunInstances`` is attempted exactly once by botocore (EC2 reports
InsufficientInstanceCapacity as HTTP 500, which botocore would otherwise retry: the orchestrator
fails over to the next offering instead), read and terminate calls get a small bounded retry.

The endpoint is boto3's own business: it honours ``AWS_ENDPOINT_URL_EC2`` (how tests reach a moto
server), so this package has no test hook. Credentials come from the standard chain (or the named
profile) and are never logged; neither is user data, which holds a join token, so a filter on
botocore's request logger redacts it even at DEBUG.

Configuration (duck-typed, the policy's ``AwsConfig``): ``ami``, ``subnet_id``,
``security_group_ids``, ``iam_instance_profile``, ``key_name``, ``root_volume_gb``,
``spot_max_price_usd_hour``, ``profile``. It holds one AMI id and one subnet, and both are
regional at AWS: a policy whose AWS offerings span regions fails to launch outside the AMI's
region with ``InvalidRequest`` (InvalidAMIID.NotFound), so keep one region per policy.
"""

from providers.aws.adapter import IAM_ACTIONS, AwsProvider
from providers.aws.clients import make_session
from providers.aws.errors import ERROR_CODES, classify_error, typed_error
from providers.aws.tags import OFFERING_TAG, PROVIDER_NAME, STATES, client_token

__all__ = [
    "ERROR_CODES",
    "IAM_ACTIONS",
    "OFFERING_TAG",
    "PROVIDER_NAME",
    "STATES",
    "AwsProvider",
    "classify_error",
    "client_token",
    "make_session",
    "typed_error",
]
