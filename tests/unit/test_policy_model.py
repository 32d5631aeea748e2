"""Unit tests of the policy models and loader: every bad policy names the exact field and line.

Also checks the shipped artefacts that are generated from the models (``policies/schema.json``,
``docs/policy-reference.md``) and that every example policy validates.
"""

from __future__ import annotations

import json
from datetime import timedelta
from decimal import Decimal
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from pydantic import BaseModel, ValidationError

from orchestrator.policy import (
    Market,
    Policy,
    PolicyError,
    Problem,
    ProviderName,
    QueueSourceKind,
    load_policy,
    load_policy_text,
)
from orchestrator.policy.loader import _model_in, parse_yaml
from orchestrator.policy.schema import field_reference_markdown, policy_json_schema_text

ROOT = Path(__file__).resolve().parents[2]
EXAMPLES = sorted((ROOT / "policies" / "examples").glob("*.yaml"))

# Line numbers matter: the cases below edit this text by line number (1-based).
BASE = """\
version: 1
name: test
pool:
  name: gpu
  onprem:
    nodes: 2
    gpus_per_node: 8
queue:
  source: builtin
trigger:
  oldest_wait_above: 10m
offerings:
  - provider: aws
    region: us-east-1
    instance_type: p4d.24xlarge
    market: spot
    fallback_on_demand: true
    price_usd_hour: 9.8318
limits:
  min_nodes: 0
  max_nodes: 4
  max_hourly_spend_usd: 100
scale_down:
  respect_running_jobs: true
projects:
  - name: research
    priority: 10
providers:
  aws:
    ami: ami-0123456789abcdef0
"""


def edit(
    replace: dict[int, str] | None = None,
    insert: dict[int, str] | None = None,
    delete: tuple[int, ...] = (),
) -> str:
    """BASE with lines replaced, inserted *after* the given line, or deleted (original numbers)."""
    lines = BASE.splitlines()
    out: list[str] = []
    for number, line in enumerate(lines, start=1):
        if number not in delete:
            out.append((replace or {}).get(number, line))
        if insert and number in insert:
            out.extend(insert[number].splitlines())
    return "\n".join(out) + "\n"


def problems_of(text: str) -> list[Problem]:
    with pytest.raises(PolicyError) as info:
        load_policy_text(text, "p.yaml")
    problems = info.value.problems
    assert problems, "PolicyError without problems"
    assert str(info.value) == "\n".join(str(p) for p in problems)
    return problems


def test_base_is_valid() -> None:
    policy = load_policy_text(BASE, "p.yaml")
    assert policy.name == "test"
    assert policy.offerings[0].market is Market.SPOT
    assert policy.offerings[0].provider is ProviderName.AWS
    assert policy.offerings[0].price_usd_hour == Decimal("9.8318")
    assert policy.trigger.oldest_wait_above == timedelta(minutes=10)
    assert policy.limits.max_hourly_spend_usd == Decimal("100")
    assert policy.queue.source is QueueSourceKind.BUILTIN
    assert policy.project_priority("research") == 10
    assert policy.project_priority("unknown") == policy.default_project_priority
    assert policy.project_quota("research") is None
    assert policy.pool.onprem.total_gpus == 16


# (id, text, path, line, message fragment): each text has exactly one problem.
BAD_POLICIES = [
    ("unknown key with hint", edit({21: "  max_node: 4"}), "limits.max_node", 21,
     "unknown key 'max_node' (did you mean 'max_nodes'?)"),
    ("unknown nested key with hint", edit({9: "  sourse: builtin"}), "queue.sourse", 9,
     "did you mean 'source'?"),
    ("unknown key without hint", edit({24: "  colour: blue"}), "scale_down.colour", 24,
     "unknown key 'colour'"),
    ("string for int", edit({7: '    gpus_per_node: "8"'}), "pool.onprem.gpus_per_node", 7,
     'valid integer (got "8")'),
    ("float for int", edit({6: "    nodes: 2.5"}), "pool.onprem.nodes", 6, "valid integer"),
    ("string for bool", edit({24: '  respect_running_jobs: "true"'}),
     "scale_down.respect_running_jobs", 24, 'valid boolean (got "true")'),
    ("negative max_nodes", edit({21: "  max_nodes: -1"}), "limits.max_nodes", 21,
     "greater than or equal to 0"),
    ("negative on-prem nodes", edit({6: "    nodes: -2"}), "pool.onprem.nodes", 6,
     "greater than or equal to 0"),
    ("min_nodes above max_nodes", edit({20: "  min_nodes: 5"}), "limits.min_nodes", 20,
     "5 is more than max_nodes (4)"),
    ("unknown provider", edit({13: "  - provider: azure"}), "offerings[0].provider", 13,
     '(got "azure")'),
    ("unknown market", edit({16: "    market: reserved"}), "offerings[0].market", 16,
     "'spot' or 'on-demand'"),
    ("duration in words", edit({11: "  oldest_wait_above: 10 minutes"}),
     "trigger.oldest_wait_above", 11, "bad duration '10 minutes'"),
    ("duration as number", edit({11: "  oldest_wait_above: 600"}), "trigger.oldest_wait_above",
     11, "a duration is a string"),
    ("money with currency sign", edit({22: "  max_hourly_spend_usd: $100"}),
     "limits.max_hourly_spend_usd", 22, "no currency sign"),
    ("negative money", edit({18: "    price_usd_hour: -1"}), "offerings[0].price_usd_hour", 18,
     "bad amount -1"),
    ("money with too many decimals", edit({18: "    price_usd_hour: 9.1234567"}),
     "offerings[0].price_usd_hour", 18, "at most 6 decimals"),
    ("duplicate YAML key", edit(insert={21: "  max_nodes: 5"}), "limits.max_nodes", 22,
     "duplicate key 'max_nodes'"),
    ("duplicate project", edit(insert={27: "  - name: research\n    priority: 1"}),
     "projects[1].name", 28, "duplicate project 'research'"),
    ("duplicate offering",
     edit(insert={18: "  - provider: aws\n    region: us-east-1\n    instance_type: p4d.24xlarge"
                      "\n    market: spot"}),
     "offerings[1]", 19, "duplicate offering aws/us-east-1/-/p4d.24xlarge/spot"),
    ("fallback_on_demand on on-demand", edit({16: "    market: on-demand"}),
     "offerings[0].fallback_on_demand", 17, "only applies to market: spot"),
    ("partition without slurm", edit(insert={9: "  partition: gpu"}), "queue.partition", 10,
     "only applies to source: slurm"),
    ("unsupported version", edit({1: "version: 2"}), "version", 1,
     "unsupported policy version 2; expected 1"),
    ("missing nested key points at parent", edit(delete=(7,)), "pool.onprem.gpus_per_node", 5,
     "required key is missing"),
    ("missing key of a list item points at the item", edit(delete=(14,)), "offerings[0].region",
     13, "required key is missing"),
    ("missing top-level key", edit(delete=(2,)), "name", 1, "required key is missing"),
    ("empty offerings", edit({12: "offerings: []"}, delete=(13, 14, 15, 16, 17, 18)),
     "offerings", 12, "at least one offering"),
    ("bad name", edit({2: "name: Test_Policy"}), "name", 2, "'Test_Policy' is not a valid name"),
    ("zero idle_for", edit(insert={23: "  idle_for: 0s"}), "scale_down.idle_for", 24,
     "must be longer than 0s"),
    ("zero timeout", edit(insert={24: "timeouts:\n  boot: 0s"}), "timeouts.boot", 26,
     "must be longer than 0s"),
    ("controller lease under the heartbeat timeout",
     edit(insert={24: "timeouts:\n  heartbeat: 5m\n  controller_lease: 1m"}),
     "timeouts.controller_lease", 27, "must be at least timeouts.heartbeat"),
    ("min_nodes with no launchable offering",
     edit({18: "    max_nodes: 0", 20: "  min_nodes: 1"}), "limits.min_nodes", 20,
     "no offering may launch a node"),
    ("section that is not a mapping", edit({23: "scale_down: soon"}, delete=(24,)), "scale_down",
     23, "should be an object (got \"soon\")"),
    ("non-string key", edit(insert={24: "  1: x"}), "scale_down.1", 25,
     "keys must be strings, not 1"),
    ("unknown YAML tag", edit({21: "  max_nodes: !big 4"}), "limits.max_nodes", 21,
     "unsupported YAML value"),
    ("invalid YAML syntax", edit({21: "  max_nodes: 4: 5"}), "<yaml>", 21,
     "invalid YAML: mapping values are not allowed here"),
    ("unclosed bracket", edit({12: "offerings: [", 13: "  - provider: aws"}), "<yaml>", 13,
     "invalid YAML"),
    ("two documents", BASE + "---\nversion: 1\n", "<yaml>", 31,
     "expected a single document in the stream, but found another document"),
    ("empty file", "", "<policy>", 1, "a policy is a YAML mapping of keys"),
    ("only comments", "# nothing yet\n", "<policy>", 1, "a policy is a YAML mapping of keys"),
    ("top-level list", "- version: 1\n- name: x\n", "<policy>", 1,
     "a policy is a YAML mapping of keys"),
    ("top-level scalar", "version 1\n", "<policy>", 1, "a policy is a YAML mapping of keys"),
]


@pytest.mark.parametrize(
    ("text", "path", "line", "fragment"),
    [case[1:] for case in BAD_POLICIES],
    ids=[case[0] for case in BAD_POLICIES],
)
def test_bad_policy_names_field_and_line(text: str, path: str, line: int, fragment: str) -> None:
    problems = problems_of(text)
    assert [(p.path, p.line) for p in problems] == [(path, line)], problems
    problem = problems[0]
    assert fragment in problem.message
    assert problem.file == "p.yaml"
    assert problem.column >= 1
    assert str(problem) == f"p.yaml:{line}:{problem.column}: {path}: {problem.message}"


def test_column_points_at_the_key() -> None:
    (problem,) = problems_of(edit({21: "  max_node: 4"}))
    assert (problem.line, problem.column) == (21, 3)


def test_all_problems_of_a_file_are_reported_together() -> None:
    text = edit({
        9: "  sourse: builtin",
        11: "  oldest_wait_above: 10 minutes",
        18: "    price_usd_hour: $9",
        20: "  min_nodes: 5",
    })
    problems = problems_of(text)
    assert [(p.line, p.path) for p in problems] == [
        (9, "queue.sourse"),
        (11, "trigger.oldest_wait_above"),
        (18, "offerings[0].price_usd_hour"),
        (20, "limits.min_nodes"),
    ]
    assert len(str(PolicyError(problems)).splitlines()) == 4


def test_duplicate_key_is_reported_with_the_other_problems() -> None:
    problems = problems_of(edit({7: '    gpus_per_node: "8"'}, insert={21: "  max_nodes: 5"}))
    assert [(p.line, p.path) for p in problems] == [
        (7, "pool.onprem.gpus_per_node"),
        (22, "limits.max_nodes"),
    ]


def test_missing_required_keys_are_all_listed() -> None:
    problems = problems_of("version: 1\n")
    assert sorted(p.path for p in problems) == ["name", "pool"]  # offerings or accelerators: checked once the rest is valid
    assert all(p.line == 1 for p in problems)


def test_yaml_timestamps_stay_strings() -> None:
    policy = load_policy_text(edit({2: "name: 2026-01-01"}))
    assert policy.name == "2026-01-01"


def test_yaml_anchors_and_merge_keys() -> None:
    text = edit(insert={18: "  - <<: *p4d\n    instance_type: p5.48xlarge\n    markt: spot"},
                replace={13: "  - &p4d", 14: "    provider: aws\n    region: us-east-1"})
    # The merged item inherits every key but instance_type; the typo is still found, in place.
    (problem,) = problems_of(text)
    assert (problem.path, problem.line) == ("offerings[1].markt", 22)
    fixed = text.replace("    markt: spot\n", "")
    policy = load_policy_text(fixed)
    assert [o.instance_type for o in policy.offerings] == ["p4d.24xlarge", "p5.48xlarge"]
    assert policy.offerings[1].price_usd_hour == Decimal("9.8318")


def test_recursive_alias_is_a_problem_not_a_crash() -> None:
    problems = problems_of(edit(insert={24: "  extra: &loop\n    again: *loop"}))
    assert any("recursive YAML alias" in p.message for p in problems)


@settings(max_examples=80, deadline=None, database=None)
@given(
    position=st.integers(0, len(BASE)),
    junk=st.text(alphabet=":-[]{}&*!|>'\"#%@`,?\t\n 0123456789abx.<$", max_size=6),
    cut=st.integers(0, 6),
)
def test_mangled_policy_is_reported_never_raised(position: int, junk: str, cut: int) -> None:
    text = BASE[:position] + junk + BASE[position + cut :]
    try:
        load_policy_text(text, "p.yaml")
    except PolicyError as exc:
        assert exc.problems
        for problem in exc.problems:
            assert problem.line >= 1 and problem.column >= 1
            assert problem.path and problem.message
            assert "\n" not in str(problem)


def test_load_policy_reports_unreadable_paths(tmp_path: Path) -> None:
    missing = tmp_path / "missing.yaml"
    with pytest.raises(PolicyError) as info:
        load_policy(missing)
    (problem,) = info.value.problems
    assert (problem.file, problem.line, problem.path) == (str(missing), 1, "<file>")
    assert "cannot read" in problem.message

    with pytest.raises(PolicyError, match="cannot read"):
        load_policy(tmp_path)

    binary = tmp_path / "binary.yaml"
    binary.write_bytes(b"version: 1\n\xff\xfe\n")
    with pytest.raises(PolicyError) as info:
        load_policy(binary)
    (problem,) = info.value.problems
    assert (problem.line, problem.path) == (2, "<file>")
    assert "not UTF-8" in problem.message


def test_load_policy_names_the_file(tmp_path: Path) -> None:
    path = tmp_path / "bad.yaml"
    path.write_text(edit({20: "  min_nodes: 5"}), encoding="utf-8")
    with pytest.raises(PolicyError) as info:
        load_policy(path)
    assert str(info.value) == f"{path}:20:3: limits.min_nodes: 5 is more than max_nodes (4)"


def test_models_are_frozen() -> None:
    policy = load_policy_text(BASE)
    with pytest.raises(ValidationError):
        policy.name = "other"  # type: ignore[misc]
    with pytest.raises(ValidationError):
        policy.limits.max_nodes = 100  # type: ignore[misc]
    with pytest.raises(ValidationError):
        policy.offerings[0].market = Market.ON_DEMAND  # type: ignore[misc]


def test_examples_exist() -> None:
    names = {path.name for path in EXAMPLES}
    assert {
        "default.yaml", "aws-spot-fallback.yaml", "gcp-a100.yaml", "multi-project.yaml",
        "slurm-onprem.yaml",
    } <= names


@pytest.mark.parametrize("path", EXAMPLES, ids=[path.name for path in EXAMPLES])
def test_example_policy_validates(path: Path) -> None:
    policy = load_policy(path)
    assert policy.name == path.stem
    assert policy.offerings


def test_default_policy_bursts_locally() -> None:
    policy = load_policy(ROOT / "policies" / "examples" / "default.yaml")
    assert policy.name == "default"
    assert policy.offerings
    assert all(o.provider is ProviderName.LOCAL for o in policy.offerings)


def test_examples_cover_their_features() -> None:
    examples = {path.stem: load_policy(path) for path in EXAMPLES}
    aws = examples["aws-spot-fallback"]
    assert {o.provider for o in aws.offerings} == {ProviderName.AWS}
    assert any(o.market is Market.SPOT and o.fallback_on_demand for o in aws.offerings)
    assert aws.spot.by_expected_cost and aws.checkpoint_every_s("any") == 1800
    gcp = examples["gcp-a100"]
    assert {o.provider for o in gcp.offerings} == {ProviderName.GCP}
    assert all(o.instance_type.startswith("a2-highgpu-") for o in gcp.offerings)
    multi = examples["multi-project"]
    assert len(multi.projects) >= 3
    assert len({p.priority for p in multi.projects}) == len(multi.projects)
    assert all(p.max_burst_gpus is not None for p in multi.projects)
    assert multi.limits.max_hourly_spend_usd is not None
    slurm = examples["slurm-onprem"]
    assert slurm.queue.source is QueueSourceKind.SLURM
    assert slurm.queue.partition


def test_schema_file_is_generated() -> None:
    assert (ROOT / "policies" / "schema.json").read_text(encoding="utf-8") == (
        policy_json_schema_text()
    ), "regenerate with: burst policy schema > policies/schema.json"


def test_reference_doc_is_generated() -> None:
    assert (ROOT / "docs" / "policy-reference.md").read_text(encoding="utf-8") == (
        field_reference_markdown()
    ), "regenerate with: burst policy reference > docs/policy-reference.md"


@pytest.mark.parametrize("path", EXAMPLES, ids=[path.name for path in EXAMPLES])
def test_examples_satisfy_the_json_schema(path: Path) -> None:
    jsonschema = pytest.importorskip("jsonschema")
    validator = jsonschema.Draft202012Validator(json.loads(policy_json_schema_text()))
    data, _ = parse_yaml(path.read_text(encoding="utf-8"), str(path))
    assert [error.message for error in validator.iter_errors(data)] == []


def test_json_schema_rejects_what_the_loader_rejects() -> None:
    jsonschema = pytest.importorskip("jsonschema")
    validator = jsonschema.Draft202012Validator(json.loads(policy_json_schema_text()))
    for text in (
        edit({21: "  max_node: 4"}),
        edit({11: "  oldest_wait_above: 10 minutes"}),
        edit({22: "  max_hourly_spend_usd: $100"}),
        edit({13: "  - provider: azure"}),
        edit({7: '    gpus_per_node: "8"'}),
    ):
        data, _ = parse_yaml(text, "p.yaml")
        assert list(validator.iter_errors(data)), text


def test_schema_defaults_are_written_as_in_a_policy() -> None:
    text = policy_json_schema_text()
    assert '"default": "10m"' in text
    assert "PT" not in text  # no ISO 8601 durations the policy format would reject


def _policy_models() -> list[type[BaseModel]]:
    found: list[type[BaseModel]] = []
    pending: list[type[BaseModel]] = [Policy]
    while pending:
        model = pending.pop()
        if model in found:
            continue
        found.append(model)
        for info in model.model_fields.values():
            inner = _model_in(info.annotation)
            if inner is not None:
                pending.append(inner)
    return found


def test_policy_models_are_all_found() -> None:
    names = {model.__name__ for model in _policy_models()}
    assert {"Policy", "Pool", "OnPrem", "OfferingSpec", "Limits", "Project", "Trigger"} <= names


@pytest.mark.parametrize("model", _policy_models(), ids=lambda m: m.__name__)
def test_every_field_is_described(model: type[BaseModel]) -> None:
    assert (model.__doc__ or "").strip(), f"{model.__name__} has no docstring"
    for name, info in model.model_fields.items():
        assert (info.description or "").strip(), f"{model.__name__}.{name} has no description"
