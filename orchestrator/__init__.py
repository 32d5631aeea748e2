"""burst: a hybrid cloud-bursting orchestrator for on-prem GPU training clusters.

Kept import-light on purpose: provider adapters import ``orchestrator.domain`` and must not pull
in the store, the API or the CLI by doing so.
"""

__version__ = "0.1.0"
