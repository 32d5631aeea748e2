"""What to do when a cloud's credentials are missing or refused: one line per provider.

`burst catalog refresh`, `burst provider check` and the start of `burst run` say it in these
words (never a traceback, and once, however many checks hit the same wall). The fixes are the
standard credential chains of each SDK, which the adapters use unchanged.
"""

from __future__ import annotations

import re

FIXES: dict[str, str] = {
    "aws": "run `aws configure`, or set AWS_PROFILE (or AWS_ACCESS_KEY_ID and "
           "AWS_SECRET_ACCESS_KEY), or run burst on an EC2 instance with an instance role",
    "gcp": "run `gcloud auth application-default login`, or set GOOGLE_APPLICATION_CREDENTIALS "
           "to a service-account key file",
    "libcloud": "set the driver's key settings in the policy (providers.libcloud.key, and secret "
                "as env:VARIABLE) and export the variables they name",
}

# Error codes (as the adapters' typed errors and check rows spell them) that mean the
# credentials themselves are missing, unreadable, expired or not accepted: not a permission
# that one call lacks.
_CREDENTIAL_CODES = re.compile(
    r"\b(NoCredentialsError|PartialCredentialsError|ProfileNotFound|CredentialRetrievalError|"
    r"TokenRetrievalError|AuthFailure|InvalidClientTokenId|SignatureDoesNotMatch|ExpiredToken|"
    r"UnrecognizedClientException|DefaultCredentialsError|RefreshError|InvalidCreds|MissingEnv|"
    r"default credentials were not found|credentials were not found|is not set)\b")


def is_credentials_problem(detail: str, check: str = "") -> bool:
    """Does a failure (a check row's detail, an error message) say the credentials are bad?"""
    return check == "credentials" or bool(_CREDENTIAL_CODES.search(detail))


def credentials_message(provider: str, detail: str) -> str:
    """The one line: which provider, what it said, and what to do."""
    fix = FIXES.get(provider, "configure the provider's credentials")
    detail = " ".join(detail.split())  # one line, whatever the SDK put in its message
    return f"provider {provider}: credentials missing or not accepted ({detail}); to fix: {fix}"
