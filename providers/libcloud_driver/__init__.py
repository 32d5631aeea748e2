"""libcloud provider: burst nodes from any apache-libcloud compute driver (OpenStack first).

``LibcloudProvider(config)`` builds the driver named by ``config.driver`` with ``config.key``,
``config.secret`` and ``config.args`` (any string of the form ``env:VAR`` is read from the
environment when the provider is built, and never logged), and keeps the ``Provider`` contract on
top of the driver's generic calls (``list_sizes``, ``list_images``, ``create_node``,
``list_nodes``, ``destroy_node``). ``config`` is any object with the attributes of the policy's
``LibcloudConfig`` (driver, key, secret, args, image, sizes); this package does not import
the policy package.

The package holds the adapter (``adapter.LibcloudProvider``) and, by concern, driver building
(``drivers``), ownership tags and names (``tags``), the error table (``errors``) and the wait for
a launch still being scheduled (``operations``); the names below are re-exported.

Offerings
    Drivers know neither GPUs nor (mostly) prices, so ``config.sizes`` supplies them; each is
    matched to a driver size by id or name. A configured size the driver does not list is left
    out, with a warning. All offerings are on-demand (libcloud has no generic spot market), in
    region ``region`` (constructor argument, default ``"default"``), zone ``None``.

Ownership and idempotency
    libcloud has no client token in general, so the instance name and metadata carry them:

    * Drivers whose ``create_node`` takes ``ex_metadata`` (OpenStack: server metadata; EC2: tags)
      get the four ``burst:*`` tags unchanged: Nova's metadata keys may be
      ``[a-zA-Z0-9-_:. ]{1,255}`` and EC2 tag keys allow ':'. GCE metadata keys may not contain
      ':', so for ``gce`` the keys are written ``burst-cluster`` etc.; reading accepts both
      spellings. The instance is named after the node id.
    * Drivers without ``ex_metadata`` get the ownership encoded in the name:
      ``burst--<cluster>--<policy>--<node id>--<request id>`` (a component containing ``--`` is an
      :class:`InvalidRequest`). Drivers that ignore the name (libcloud's Dummy driver) cannot
      carry ownership at all: launches work, ``list_owned`` never sees them, and a warning says so.
    * ``launch`` first looks for a node tagged with the request id (or, untagged, bearing the
      expected name) and returns it. Where ``create_node`` takes ``ex_clienttoken`` (EC2) the
      request id is passed as the client token as well.
    * User data goes through ``ex_userdata`` where the driver has it (OpenStack, EC2, ...).

Launch failures reported after the API accepted the launch (OpenStack)
    Nova answers ``POST /servers`` with 202 before scheduling; when no hypervisor fits, the
    server turns ``ERROR`` with fault "No valid host was found" a moment later. ``launch``
    therefore polls the new server (``ex_get_node_details``) while it is still being scheduled
    (status BUILD, task state ``scheduling`` or unknown), for at most ``settle_s`` seconds. A
    server found in ``ERROR`` is deleted (best effort, so it leaks neither quota nor a request id)
    and its fault is raised through the error table below: NoValidHost becomes
    :class:`CapacityError`, with a :class:`ServerFault` as ``__cause__``. A NoValidHost message in
    an HTTP error (some Nova deployments and proxies answer 500 at once) maps the same way. A
    server still scheduling after ``settle_s`` is returned as pending; a later ``launch`` with the
    same request id settles it again: if it failed meanwhile, that call deletes it and raises the
    typed error, and the call after that launches afresh.

Errors (:func:`classify`, checked in this order; the libcloud exception is kept as ``__cause__``)

    ===================================================================  =====================
    libcloud.common.types.InvalidCredsError                              AuthError
    libcloud.common.exceptions.RateLimitReachedError (HTTP 429)          TransientError
    message matches "No valid host" / "NoValidHost" / "capacity" /       CapacityError
    "Insufficient resources" / "not enough hosts" (Nova NoValidHost, EC2
    InsufficientInstanceCapacity); not "insufficient privileges"
    message matches "rate limit" / "throttl" (throttling under any       TransientError
    status, so "Rate limit exceeded" is not read as a quota)
    message matches "quota" / "LimitExceeded" (Nova answers 403 "Quota   QuotaError
    exceeded for instances", EC2 InstanceLimitExceeded)
    HTTP status (BaseHTTPError.code, ProviderError.http_code): 401, 403  AuthError
    HTTP 413 (Nova's old overLimit for quotas)                           QuotaError
    HTTP 409 (Nova: the server is busy in another task), 429, 500, 502,  TransientError
    503, 504 (and any other 5xx)
    HTTP 400, 404, 405, 422 (and any other 4xx)                          InvalidRequest
    OSError (socket errors, timeouts, requests' ConnectionError and      TransientError
    Timeout, SSL errors)
    any other LibcloudError (e.g. MalformedResponseError from a proxy)   TransientError
    NotImplementedError, anything else (a bug here or in the driver)     InvalidRequest
    ===================================================================  =====================

Threads: launches through one provider object are serialised (so two concurrent launches of the
same request id create one node); other calls go straight to the driver.
"""

from providers.libcloud_driver.adapter import DEFAULT_REGION, LibcloudProvider
from providers.libcloud_driver.drivers import resolve_env_ref
from providers.libcloud_driver.errors import ServerFault, classify
from providers.libcloud_driver.tags import PROVIDER_NAME

__all__ = [
    "DEFAULT_REGION",
    "PROVIDER_NAME",
    "LibcloudProvider",
    "ServerFault",
    "classify",
    "resolve_env_ref",
]
