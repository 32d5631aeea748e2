"""Cost-allocation tags: the policy's ``tags:`` and the rules every cloud puts on them.

Every instance burst launches carries its ownership tags (``burst:cluster`` ...), ``burst:project``
(the project whose work launched it), ``burst:user`` (when all of that work is one user's) and
the policy's ``tags:``. Finance splits the cloud bill by them (docs/costs.md, "Reconciling with
the cloud bill").

The policy's tags are checked here, at load time, so a bad one is a ``FILE:LINE:COL`` error and
never a failed launch:

* every cloud: not empty, no key of burst's own (``burst:`` / ``burst-``), none of AWS's reserved
  ``aws:`` keys;
* AWS tags: keys at most 128 characters, values at most 256, of letters, digits, spaces and
  ``_ . : / = + - @``; at most 50 tags an instance, of which burst's own take 8;
* GCP labels (a policy with a gcp offering): keys start with a lower-case letter, keys and values
  are lower-case letters, digits, ``_`` and ``-``, at most 63 characters; at most 64 labels, of
  which burst's own take 6.

Standard library only.
"""

from __future__ import annotations

import re
from collections.abc import Mapping

PROJECT_TAG = "burst:project"
USER_TAG = "burst:user"
RESERVED_PREFIXES = ("burst:", "burst-", "aws:")

AWS_MAX_TAGS = 50
AWS_BURST_TAGS = 8  # cluster, policy, node-id, request-id, Name, offering, project, user
GCP_MAX_LABELS = 64
GCP_BURST_LABELS = 6  # cluster, policy, node-id, request-id, project, user

_AWS_TEXT = re.compile(r"^[\w .:/=+\-@]*$", re.UNICODE)
_GCP_KEY = re.compile(r"^[a-z][a-z0-9_-]{0,62}$")
_GCP_VALUE = re.compile(r"^[a-z0-9_-]{0,63}$")


def tag_problems(tags: Mapping[str, str], *, gcp: bool) -> list[tuple[str | None, str]]:
    """(key at fault or None for the whole map, message) for each rule ``tags`` breaks."""
    problems: list[tuple[str | None, str]] = []
    for key, value in tags.items():
        if not key:
            problems.append((key, "a tag key cannot be empty"))
            continue
        if key.lower().startswith(RESERVED_PREFIXES):
            problems.append((key, f"{key!r} is reserved (burst:, burst- and aws: keys are "
                                  "burst's and AWS's own)"))
            continue
        if len(key) > 128 or not _AWS_TEXT.match(key):
            problems.append((key, f"AWS tag key {key!r}: at most 128 letters, digits, spaces "
                                  "and _ . : / = + - @"))
        if len(value) > 256 or not _AWS_TEXT.match(value):
            problems.append((key, f"AWS tag value {value!r}: at most 256 letters, digits, "
                                  "spaces and _ . : / = + - @"))
        if gcp and not _GCP_KEY.match(key):
            problems.append((key, f"GCP label key {key!r}: a lower-case letter, then at most 62 "
                                  "lower-case letters, digits, '_' or '-'"))
        if gcp and not _GCP_VALUE.match(value):
            problems.append((key, f"GCP label value {value!r}: at most 63 lower-case letters, "
                                  "digits, '_' or '-'"))
    room = (GCP_MAX_LABELS - GCP_BURST_LABELS) if gcp else (AWS_MAX_TAGS - AWS_BURST_TAGS)
    if len(tags) > room:
        cloud = "GCP allows 64 labels" if gcp else "AWS allows 50 tags"
        problems.append((None, f"{len(tags)} tags: at most {room} ({cloud} an instance and "
                               f"burst's own take {64 - room if gcp else 50 - room})"))
    return problems


def cost_tags(policy_tags: Mapping[str, str], project: str | None,
              user: str | None) -> dict[str, str]:
    """The cost-allocation tags of one node: ``burst:project``, ``burst:user``, the policy's."""
    tags = dict(policy_tags)
    if project:
        tags[PROJECT_TAG] = project
    if user:
        tags[USER_TAG] = user
    return tags
