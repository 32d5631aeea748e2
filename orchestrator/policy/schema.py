"""JSON Schema export of the policy format and the generated field reference.

``policies/schema.json`` is the output of :func:`policy_json_schema` (a test keeps them equal), and
``docs/policy-reference.md`` is the output of :func:`field_reference_markdown`, so the reference
can never drift from the model descriptions.
"""

from __future__ import annotations

import json
from typing import Any

from pydantic import BaseModel

from orchestrator.policy.models import Policy


def policy_json_schema() -> dict[str, Any]:
    """The JSON Schema of the policy YAML (validation mode)."""
    schema = Policy.model_json_schema(mode="validation")
    schema["$schema"] = "https://json-schema.org/draft/2020-12/schema"
    schema["$id"] = "burst-policy-v1"
    return schema


def policy_json_schema_text() -> str:
    return json.dumps(policy_json_schema(), indent=2, sort_keys=True) + "\n"


def _type_text(schema: dict[str, Any], defs: dict[str, Any]) -> str:
    if "$ref" in schema:
        return schema["$ref"].rsplit("/", 1)[-1]
    if "enum" in schema:
        return " \\| ".join(f"`{v}`" for v in schema["enum"])
    if "const" in schema:
        return f"`{schema['const']}`"
    if "anyOf" in schema:
        parts = [_type_text(s, defs) for s in schema["anyOf"]]
        return " or ".join(dict.fromkeys(p for p in parts if p != "null")) + (
            " (optional)" if any(s.get("type") == "null" for s in schema["anyOf"]) else ""
        )
    if schema.get("type") == "array":
        return f"list of {_type_text(schema.get('items', {}), defs)}"
    if schema.get("pattern") and "examples" in schema:
        return "duration (e.g. " + ", ".join(schema["examples"]) + ")"
    return str(schema.get("type", "any"))


def field_reference_markdown() -> str:
    """A Markdown table per policy model, from the Field descriptions."""
    schema = policy_json_schema()
    defs = schema.get("$defs", {})
    lines = [
        "# Policy field reference",
        "",
        "Generated from the policy models by `burst policy reference`; do not edit by hand.",
        "Durations are written like `30s`, `10m`, `1h30m`, `2d`; money is a plain number of US "
        "dollars (`12.50`).",
        "",
    ]
    sections: list[tuple[str, dict[str, Any]]] = [("Policy", schema)]
    sections += sorted(defs.items())
    for name, model_schema in sections:
        properties = model_schema.get("properties")
        if not properties:
            continue
        lines += [f"## {name}", "", model_schema.get("description", "").strip(), ""]
        lines += ["| key | type | default | description |", "|---|---|---|---|"]
        required = set(model_schema.get("required", []))
        for key, prop in properties.items():
            default = "required" if key in required else f"`{json.dumps(prop.get('default'))}`"
            if key not in required and "default" not in prop:
                default = "(see section)"
            description = prop.get("description", "").replace("|", "\\|").replace("\n", " ")
            lines.append(f"| `{key}` | {_type_text(prop, defs)} | {default} | {description} |")
        lines.append("")
    return "\n".join(lines)


