"""Shared base of the policy models: strictness, names, and cross-field problem reporting."""

from __future__ import annotations

from typing import Annotated

from pydantic import BaseModel, ConfigDict, Field

NAME_PATTERN = r"^[a-z0-9]([a-z0-9-]{0,61}[a-z0-9])?$"
Name = Annotated[str, Field(pattern=NAME_PATTERN, description="lower-case letters, digits and '-'")]


def field_problem(field: str, message: str) -> ValueError:
    """A cross-field error the loader attributes to ``field`` of the model that raised it."""
    return ValueError(f"@{field}: {message}")


class PolicyModel(BaseModel):
    """Base of every policy model: strict, frozen, unknown keys rejected."""

    model_config = ConfigDict(extra="forbid", frozen=True, strict=True, use_enum_values=False)
