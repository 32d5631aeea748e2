"""Provider registry: provider name -> the class implementing the ``Provider`` Protocol.

Entries are ``"module:Class"`` strings imported on first use, so a cloud SDK (boto3, the Google
client) is only imported when its provider is actually chosen. Only ``orchestrator.wiring`` looks
providers up here; each provider module imports ``orchestrator.domain`` and its own SDK, nothing
else of ours.
"""

from __future__ import annotations

import importlib

PROVIDERS: dict[str, str] = {
    "local": "providers.local:LocalProvider",
    "aws": "providers.aws:AwsProvider",
    "libcloud": "providers.libcloud_driver:LibcloudProvider",
    "gcp": "providers.gcp:GcpProvider",
    "sim": "providers.sim:SimProvider",  # the simulator's virtual cloud (`burst simulate`)
}


def load_provider_class(name: str) -> type:
    """Import and return the provider class registered under ``name``.

    Raises ValueError naming the known providers when ``name`` is not registered.
    """
    try:
        target = PROVIDERS[name]
    except KeyError:
        known = ", ".join(sorted(PROVIDERS))
        raise ValueError(f"unknown provider {name!r}; known providers: {known}") from None
    module_name, _, class_name = target.partition(":")
    module = importlib.import_module(module_name)
    return getattr(module, class_name)
