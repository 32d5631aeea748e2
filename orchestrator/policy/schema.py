"""JSON Schema export of the policy format and the generated field reference.

``policies/schema.json`` is the output of :func:`policy_json_schema_text` (a test keeps them equal),
and ``docs/policy-reference.md`` is the output of :func:`field_reference_markdown`, so the
reference can never drift from the model descriptions.
"""

from __future__ import annotations

import json
from datetime import timedelta
from decimal import Decimal
from typing import Any

from pydantic.json_schema import GenerateJsonSchema

from orchestrator.policy.base import NAME_PATTERN
from orchestrator.policy.bounds import CLOUD_NAME_PATTERN, MAX_PRICE_USD_HOUR, MAX_USD
from orchestrator.policy.models import Policy
from orchestrator.policy.reading import (
    MAX_BYTES,
    MAX_DEPTH,
    MAX_NODES,
    MAX_NUMBER_CHARS,
    InputKind,
)
from orchestrator.policy.units import (
    DURATION_PATTERN,
    MAX_DURATION_S,
    MONEY_PATTERN,
    format_duration,
)


class _PolicySchemaGenerator(GenerateJsonSchema):
    """Writes defaults the way a policy spells them (``10m``, not ISO 8601 ``PT10M``)."""

    def encode_default(self, dft: Any) -> Any:
        if isinstance(dft, timedelta):
            return format_duration(dft)
        if isinstance(dft, Decimal):
            number = float(dft)
            return number if Decimal(repr(number)) == dft else format(dft, "f")
        return _whole_numbers(super().encode_default(dft))


def _whole_numbers(value: Any) -> Any:
    """``80.0`` -> ``80`` (a percent or weight is written without a fraction in a policy)."""
    if isinstance(value, float) and value.is_integer():
        return int(value)
    if isinstance(value, list):
        return [_whole_numbers(v) for v in value]
    if isinstance(value, dict):
        return {k: _whole_numbers(v) for k, v in value.items()}
    return value


def policy_json_schema() -> dict[str, Any]:
    """The JSON Schema of the policy YAML (validation mode)."""
    schema = Policy.model_json_schema(mode="validation", schema_generator=_PolicySchemaGenerator)
    schema["$schema"] = "https://json-schema.org/draft/2020-12/schema"
    schema["$id"] = "burst-policy-v1"
    return schema


def policy_json_schema_text() -> str:
    """:func:`policy_json_schema` as the exact text of ``policies/schema.json``."""
    return json.dumps(policy_json_schema(), indent=2, sort_keys=True) + "\n"


def _anchor(name: str) -> str:
    return f"[{name}](#{name.lower()})"


def _ref_name(schema: dict[str, Any]) -> str:
    return schema["$ref"].rsplit("/", 1)[-1]


def _is_money(schema: dict[str, Any]) -> bool:
    return any(s.get("pattern") == MONEY_PATTERN for s in schema.get("anyOf", []))


def _bounds(schema: dict[str, Any]) -> str:
    text = ""
    if "minimum" in schema:
        text = f" ≥ {schema['minimum']}"
    elif "exclusiveMinimum" in schema:
        text = f" > {schema['exclusiveMinimum']}"
    if "maximum" in schema:
        text += f"{',' if text else ''} ≤ {schema['maximum']:,}"
    return text


def _type_text(schema: dict[str, Any], defs: dict[str, Any]) -> str:
    """How a value is written, for the type column: `duration`, `money (USD)`, enum values..."""
    if "$ref" in schema:
        target = defs.get(_ref_name(schema), {})
        if "enum" in target:
            return _type_text(target, defs)
        return _anchor(_ref_name(schema))
    if "enum" in schema:
        return " \\| ".join(f"`{v}`" for v in schema["enum"])
    if "const" in schema:
        return f"`{schema['const']}`"
    if _is_money(schema):
        return "money (USD)"
    if "anyOf" in schema:
        options = [s for s in schema["anyOf"] if s.get("type") != "null"]
        text = " or ".join(dict.fromkeys(_type_text(s, defs) for s in options))
        return text + (", optional" if len(options) < len(schema["anyOf"]) else "")
    if schema.get("type") == "array":
        return f"list of {_type_text(schema.get('items', {}), defs)}"
    if schema.get("pattern") == DURATION_PATTERN:
        return "duration"
    if schema.get("pattern") == NAME_PATTERN:
        return "name"
    if schema.get("pattern") == CLOUD_NAME_PATTERN:
        return "cloud name"
    if schema.get("type") == "string" and schema.get("format") == "date-time":
        return "date-time with timezone"
    if schema.get("type") == "string" and schema.get("minLength"):
        return "text (non-empty)"
    if schema.get("type") == "string":
        return "text"
    if schema.get("type") == "integer":
        return "integer" + _bounds(schema)
    if schema.get("type") == "number":
        return "number" + _bounds(schema)
    return str(schema.get("type", "any"))


def _default_text(key: str, prop: dict[str, Any], required: set[str], defs: dict[str, Any]) -> str:
    if key in required:
        return "**required**"
    if "default" not in prop:  # a default_factory: an empty list or a section of defaults
        if prop.get("type") == "array":
            return "empty list"
        return f"see {_anchor(_ref_name(prop))}" if "$ref" in prop else "(computed)"
    value = prop["default"]
    if value is None:
        return "unset"
    if isinstance(value, bool):
        return f"`{str(value).lower()}`"
    if isinstance(value, (list, dict)):
        return f"`{json.dumps(value)}`"
    return f"`{value}`"


def _sections(
    schema: dict[str, Any], defs: dict[str, Any]
) -> list[tuple[str, str, dict[str, Any]]]:
    """(model name, YAML path, model schema) for every object model, in the order a policy reads."""
    found: list[tuple[str, str, dict[str, Any]]] = []
    seen: set[str] = set()

    def visit(name: str, path: str, model: dict[str, Any]) -> None:
        if name in seen or not model.get("properties"):
            return
        seen.add(name)
        found.append((name, path, model))
        for key, prop in model["properties"].items():
            for target, suffix in _refs(prop):
                visit(target, f"{path}.{key}{suffix}" if path else f"{key}{suffix}", defs[target])

    visit("Policy", "", schema)
    return found


def _refs(prop: dict[str, Any]) -> list[tuple[str, str]]:
    if "$ref" in prop:
        return [(_ref_name(prop), "")]
    if prop.get("type") == "array":
        return [(name, "[]" + suffix) for name, suffix in _refs(prop.get("items", {}))]
    return [ref for option in prop.get("anyOf", []) for ref in _refs(option)]


def field_reference_markdown() -> str:
    """A Markdown table per policy model, from the Field descriptions."""
    schema = policy_json_schema()
    defs = schema.get("$defs", {})
    lines = [
        "# Policy field reference",
        "",
        "Generated from the policy models by `burst policy reference`; do not edit by hand.",
        "",
        "How values are written:",
        "",
        "- **duration**: whole-number parts in the order `d`, `h`, `m`, `s`, no spaces: `30s`, "
        "`10m`, `1h30m`, `2d`. `10 minutes`, `1.5h` and a bare `600` are rejected.",
        "- **money (USD)**: a plain non-negative number of US dollars with at most 6 decimals: "
        "`12.5`, `3.06`. No currency sign.",
        "- **name**: lower-case letters, digits and `-`, starting and ending with a letter or "
        "digit, at most 63 characters.",
        "- **cloud name** (instance types, regions, zones, accelerator types): letters, digits, "
        "`.`, `_` and `-`, starting with a letter or digit, at most 128 characters (no `$`, "
        "braces, slashes, blanks or control characters).",
        "- *optional* keys may be left out; *unset* means the behaviour described applies.",
        "",
        "Unknown keys are errors, and so are values of the wrong type (`\"8\"` is not an integer).",
        "",
        "Limits (each refused with `FILE:LINE:COL: path: message`, never a traceback): a policy "
        f"file is at most {MAX_BYTES[InputKind.POLICY] >> 10} KiB of UTF-8 text (a bad byte is "
        f"named by its byte offset) with no NUL or other control characters; mappings and lists "
        f"nest at most {MAX_DEPTH} levels; YAML aliases expand to at most {MAX_NODES:,} values; "
        f"a number is at most {MAX_NUMBER_CHARS} characters, finite (no `.inf`, `.nan`). Money "
        f"fields are at most {MAX_USD:,} USD, hourly prices at most {MAX_PRICE_USD_HOUR:,} USD; "
        f"durations at most {MAX_DURATION_S // 86_400}d; times need a timezone. Integer bounds are in the type column.",
        "",
    ]
    for name, path, model_schema in _sections(schema, defs):
        title = f"## {name}" + (f" (`{path}`)" if path else "")
        lines += [title, "", model_schema.get("description", "").strip(), ""]
        lines += ["| key | type | default | description |", "|---|---|---|---|"]
        required = set(model_schema.get("required", []))
        for key, prop in model_schema["properties"].items():
            default = _default_text(key, prop, required, defs)
            description = prop.get("description", "").replace("|", "\\|").replace("\n", " ")
            lines.append(f"| `{key}` | {_type_text(prop, defs)} | {default} | {description} |")
        lines.append("")
    return "\n".join(lines)
