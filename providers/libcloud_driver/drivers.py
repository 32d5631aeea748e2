"""Building the libcloud driver a ``LibcloudConfig`` names: driver class, ``env:`` secrets, pricing.

Secrets given as ``env:VAR`` are read from the environment here and never logged; errors name
arguments, never their values.
"""

from __future__ import annotations

import logging
import os
import re
from collections.abc import Mapping
from typing import Any

from libcloud import pricing as libcloud_pricing
from libcloud.compute.base import NodeDriver
from libcloud.compute.providers import get_driver
from libcloud.compute.types import Provider as LibcloudProviderName

from orchestrator.domain.ports import AuthError, InvalidRequest, TransientError
from providers.libcloud_driver.errors import classify, status_of
from providers.libcloud_driver.tags import PROVIDER_NAME

log = logging.getLogger(__package__)

_ENV_REF = re.compile(r"^env:([A-Za-z_][A-Za-z0-9_]*)$")


def attr(obj: Any, name: str, default: Any = None) -> Any:
    if isinstance(obj, Mapping):
        return obj.get(name, default)
    return getattr(obj, name, default)


def resolve_env_ref(value: Any) -> Any:
    """``env:NAME`` -> the variable's value (KeyError naming it if unset); anything else as is."""
    if not isinstance(value, str):
        return value
    match = _ENV_REF.match(value)
    if match is None:
        return value
    name = match.group(1)
    try:
        return os.environ[name]
    except KeyError:
        raise KeyError(name) from None


def build_driver(config: Any, driver_name: str) -> NodeDriver:
    """The driver ``config`` names, built with its key, secret and arguments (``env:`` resolved)."""
    cls = driver_class(driver_name)
    try:
        key = resolve_env_ref(attr(config, "key"))
        secret = resolve_env_ref(attr(config, "secret"))
        args = {str(k): resolve_env_ref(v) for k, v in dict(attr(config, "args") or {}).items()}
    except KeyError as exc:
        # The variable's name only: its value, if any, is a secret.
        raise AuthError(
            f"environment variable {exc.args[0]} (named by the libcloud config) is not set",
            provider=PROVIDER_NAME, code="MissingEnv",
        ) from None
    positional = [key] if secret is None else [key, secret]
    try:
        driver = cls(*positional, **args)
    except Exception as exc:
        error, code = classify(exc)
        if error is TransientError and not isinstance(exc, OSError) and status_of(exc) is None:
            # A LibcloudError raised while building, not from the network, is a bad setting
            # (e.g. "OpenStack instance must have auth_url set"): retrying will not help.
            error = InvalidRequest
        # Arguments are named, never their values (they may hold tokens); a TypeError's text
        # names only the offending parameter, other messages could quote a value.
        why = f"{type(exc).__name__}: {exc}" if isinstance(exc, TypeError) else type(exc).__name__
        raise error(
            f"cannot build libcloud driver {driver_name!r} with arguments "
            f"{sorted(args)}: {why}",
            provider=PROVIDER_NAME, code=code,
        ) from exc
    log.info("libcloud driver %s built (arguments: %s)", driver_name,
             ", ".join(sorted(args)) or "none")
    remember_missing_pricing(driver)
    return driver


def driver_class(name: str) -> type[NodeDriver]:
    members = {m.name.lower(): m for m in LibcloudProviderName}
    members.update({str(m.value).lower(): m for m in LibcloudProviderName})
    member = members.get(name)
    if member is None:
        examples = "openstack, ec2, gce, azure_arm, digital_ocean, dummy"
        raise InvalidRequest(
            f"unknown libcloud driver {name!r}; known drivers include {examples} "
            f"(any libcloud.compute.types.Provider name)",
            provider=PROVIDER_NAME, code="UnknownDriver",
        )
    try:
        return get_driver(member)
    except (AttributeError, ImportError) as exc:
        raise InvalidRequest(f"libcloud driver {name!r} cannot be loaded: {exc}",
                             provider=PROVIDER_NAME, code="UnknownDriver") from exc


def remember_missing_pricing(driver: NodeDriver) -> None:
    """Record "no bundled prices" for drivers libcloud has none for (OpenStack among them).

    libcloud prices every size it lists from its bundled price file and caches only drivers found
    in it; for the others it re-reads the whole file (megabytes of JSON) once per size, which makes
    listing a hundred flavors take seconds. An empty entry gives the same result (no price; burst
    takes prices from the policy anyway) at the cost of one read here.
    """
    name = getattr(driver, "api_name", None)
    if not name:
        return
    try:
        libcloud_pricing.get_pricing("compute", name)
    except KeyError:
        libcloud_pricing.set_pricing("compute", name, {})
    except (OSError, ValueError):
        pass  # no readable price file: libcloud will say so itself if it needs one
