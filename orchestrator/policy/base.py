"""Shared base of the policy models: strictness, names, and cross-field problem reporting."""

from __future__ import annotations

from typing import Annotated

from pydantic import BaseModel, ConfigDict, Field

from orchestrator.policy.bounds import CLOUD_NAME_PATTERN, TEXT_PATTERN

NAME_PATTERN = r"^[a-z0-9]([a-z0-9-]{0,61}[a-z0-9])?$"
Name = Annotated[str, Field(pattern=NAME_PATTERN, description="lower-case letters, digits and '-'")]
# Names a cloud gives: instance types, regions, zones (letters, digits, '.', '_', '-').
CloudName = Annotated[str, Field(pattern=CLOUD_NAME_PATTERN,
                                 description="letters, digits, '.', '_' and '-' (at most 128)")]
# Free text: no control characters.
Text = Annotated[str, Field(pattern=TEXT_PATTERN, description="text without control characters")]


def field_problem(field: str, message: str) -> ValueError:
    """A cross-field error the loader attributes to ``field`` of the model that raised it."""
    return ValueError(f"@{field}: {message}")


class PolicyModel(BaseModel):
    """Base of every policy model: strict, frozen, unknown keys rejected."""

    model_config = ConfigDict(extra="forbid", frozen=True, strict=True, use_enum_values=False,
                              allow_inf_nan=False)
