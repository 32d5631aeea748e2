"""End-to-end tests of `burst policy ...` as a user runs it, through the `burst` typer app
in-process (run_burst_here: exit code, stdout and stderr as the entry point gives them; an
exception the real CLI would print as a traceback fails the test). The process start itself is
tests/e2e/test_cli_consistency.py's (`burst --help` imports nothing heavy)."""

from __future__ import annotations

import json
import re
import subprocess
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.e2e.helpers import run_burst_here

ROOT = Path(__file__).resolve().parents[2]
EXAMPLES = sorted((ROOT / "policies" / "examples").glob("*.yaml"))
PROBLEM_LINE = re.compile(r"^.+:\d+:\d+: \S+: .+$")

BAD_POLICY = """\
version: 1
name: bad
pool:
  name: gpu
  onprem: {nodes: 1, gpus_per_node: "8"}
offerings:
  - provider: azure
    region: eastus
    instance_type: Standard_ND96asr_v4
limits:
  min_nodes: 3
  max_nodes: 2
scale_down:
  idle_for: 10 minutes
"""


def run_policy_cli(*args: str | Path) -> subprocess.CompletedProcess[str]:
    """`burst policy ARGS...` in this process (the paths given are absolute)."""
    return run_burst_here("policy", *map(str, args))


# (file name, content, message): inputs that are not policies at all. None: no such file.
NOT_POLICIES: list[tuple[str, str | bytes | None, str]] = [
    ("missing.yaml", None, "cannot read"),
    ("a-directory", "<dir>", "is a directory"),
    ("empty.yaml", "", "a policy is a YAML mapping of keys"),
    ("list.yaml", "- 1\n- 2\n", "a policy is a YAML mapping of keys"),
    ("syntax.yaml", "version: 1\nname: [x\n", "invalid YAML"),
    ("binary.yaml", b"\x00\xff\xfe\x89PNG", "not UTF-8"),
    # a long name: the problem lines must not be wrapped to the terminal width
    ("x" * 150 + ".yaml", BAD_POLICY, "3 is more than max_nodes (2)"),
]
DEFAULT = ROOT / "policies" / "examples" / "default.yaml"


@dataclass(frozen=True)
class Runs:
    """The CLI runs the tests below inspect, and the files they were given."""

    bad_file: Path
    not_policies: list[Path]
    results: dict[str, subprocess.CompletedProcess[str]]


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> Runs:
    """Run every CLI invocation once; the tests below inspect what each printed."""
    folder = tmp_path_factory.mktemp("policies")
    bad_file = folder / "bad.yaml"
    bad_file.write_text(BAD_POLICY, encoding="utf-8")
    not_policies = []
    for name, content, _ in NOT_POLICIES:
        path = folder / name
        if content == "<dir>":
            path.mkdir()
        elif isinstance(content, bytes):
            path.write_bytes(content)
        elif content is not None:
            path.write_text(content, encoding="utf-8")
        not_policies.append(path)
    invocations: dict[str, tuple[str | Path, ...]] = {
        "bad": ("validate", DEFAULT, bad_file, *not_policies),
        "examples": ("validate", *EXAMPLES),
        "json": ("validate", "--json", DEFAULT, bad_file),
        "schema": ("schema",),
        "reference": ("reference",),
    }
    results = {key: run_policy_cli(*args) for key, args in invocations.items()}
    return Runs(bad_file, not_policies, results)


def test_validate_bad_files(runs: Runs) -> None:
    result = runs.results["bad"]
    assert result.returncode == 1, result
    assert "Traceback" not in result.stderr + result.stdout
    # The good file is still reported as good; the problems go to stderr.
    assert re.fullmatch(rf"{re.escape(str(DEFAULT))}: ok \(policy default, 2 offerings\)\n",
                        result.stdout)
    lines = result.stderr.splitlines()
    assert all(PROBLEM_LINE.match(line) for line in lines), lines
    mine = [line for line in lines if line.startswith(f"{runs.bad_file}:")]
    assert [line.split(": ", 2)[:2] for line in mine] == [
        [f"{runs.bad_file}:5:22", "pool.onprem.gpus_per_node"],
        [f"{runs.bad_file}:7:5", "offerings[0].provider"],
        [f"{runs.bad_file}:11:3", "limits.min_nodes"],
        [f"{runs.bad_file}:14:3", "scale_down.idle_for"],
    ]


def test_validate_never_shows_a_traceback(runs: Runs) -> None:
    lines = runs.results["bad"].stderr.splitlines()
    for path, (_, _, message) in zip(runs.not_policies, NOT_POLICIES, strict=True):
        mine = [line for line in lines if line.startswith(f"{path}:")]
        assert mine, f"nothing reported for {path.name}"
        assert all(PROBLEM_LINE.match(line) for line in mine), mine
        assert any(message in line for line in mine), mine
    # 4 problems of bad.yaml, 4 of its long-named copy, one for each other file
    assert len(lines) == 4 + 4 + len(NOT_POLICIES) - 1


def test_validate_all_examples(runs: Runs) -> None:
    assert EXAMPLES
    result = runs.results["examples"]
    assert result.returncode == 0, result.stderr
    assert result.stderr == ""
    lines = result.stdout.splitlines()
    assert len(lines) == len(EXAMPLES)
    for path, line in zip(EXAMPLES, lines, strict=True):
        expected = rf"{re.escape(str(path))}: ok \(policy {path.stem}, \d+ offerings?\)"
        assert re.fullmatch(expected, line)


def test_validate_json(runs: Runs) -> None:
    result = runs.results["json"]
    assert result.returncode == 1
    assert result.stderr == ""
    report = json.loads(result.stdout)
    assert {k: report[0][k] for k in ("file", "ok", "problems", "notes")} == {
        "file": str(DEFAULT), "ok": True, "problems": [], "notes": []}
    assert report[0]["offerings"]  # the offerings the policy plans with (accelerators expanded)
    assert report[1]["file"] == str(runs.bad_file)
    assert report[1]["ok"] is False
    assert [(p["line"], p["column"], p["path"]) for p in report[1]["problems"]] == [
        (5, 22, "pool.onprem.gpus_per_node"),
        (7, 5, "offerings[0].provider"),
        (11, 3, "limits.min_nodes"),
        (14, 3, "scale_down.idle_for"),
    ]
    assert all(set(p) == {"line", "column", "path", "message"} for p in report[1]["problems"])


def test_schema_matches_the_shipped_file(runs: Runs) -> None:
    result = runs.results["schema"]
    assert result.returncode == 0, result.stderr
    schema = json.loads(result.stdout)
    assert schema["$id"] == "burst-policy-v1"
    assert result.stdout == (ROOT / "policies" / "schema.json").read_text(encoding="utf-8")


def test_reference_matches_the_shipped_doc(runs: Runs) -> None:
    result = runs.results["reference"]
    assert result.returncode == 0, result.stderr
    assert result.stdout.startswith("# Policy field reference\n")
    assert result.stdout == (ROOT / "docs" / "policy-reference.md").read_text(encoding="utf-8")


CATALOGUE_HEAD = """\
version: 1
name: cat
pool: {name: gpu, onprem: {nodes: 1, gpus_per_node: 4}}
providers:
  aws: {ami: ami-0a1b2c3d4e5f67890}
  gcp: {project: p, image: projects/p/global/images/i}
"""


def test_validate_checks_the_catalogue_at_file_line_col(tmp_path):
    bad = tmp_path / "typo.yaml"
    bad.write_text(CATALOGUE_HEAD + """\
offerings:
  - {provider: aws, region: us-east-1, instance_type: p4d.24xlrge, market: spot}
  - {provider: aws, region: us-east-9, instance_type: p4d.24xlarge}
""")
    result = run_policy_cli("validate", bad)
    assert result.returncode == 1
    lines = result.stderr.splitlines()
    assert f"{bad}:8:40: offerings[0].instance_type: 'p4d.24xlrge' is not a GPU instance type of aws; did you mean 'p4d.24xlarge'" in lines[0]
    assert lines[1].startswith(f"{bad}:9:21: offerings[1].region: aws has no GPU offerings in region 'us-east-9'")
    assert "ok" not in result.stdout


def test_validate_and_plan_show_the_accelerator_expansion(tmp_path):
    good = tmp_path / "acc.yaml"
    good.write_text(CATALOGUE_HEAD + """\
trigger: {pending_gpus_above: 0}
accelerators:
  - {accelerator: "A100-80GB:8", providers: [aws, gcp], regions: [us-east-1, us-central1]}
""")
    result = run_policy_cli("validate", good)
    assert result.returncode == 0, result.stderr
    assert "ok (policy cat, 2 offerings)" in result.stdout
    assert "accelerators[0].accelerator: info: A100-80GB:8 expands to 2 offering(s): " \
           "aws/us-east-1/-/p4de.24xlarge/on-demand, gcp/us-central1/-/a2-ultragpu-8g/on-demand" \
           in result.stderr
    snapshot = tmp_path / "world.json"
    snapshot.write_text(json.dumps({"taken_at": "2026-12-01T12:00:00Z", "queues": {"gpu": {
        "pool": "gpu", "onprem": {"total_gpus": 4, "free_gpus": 0},
        "pending": [{"id": "j1", "project": "nlp", "pool": "gpu", "gpus": 8,
                     "submitted_at": "2026-12-01T11:00:00Z", "duration_s": 3600}]}}}))
    plan = run_burst_here("plan", "-p", str(good), "--snapshot", str(snapshot),
                     env={"BURST_STATE_DIR": str(tmp_path / "state")}, check=True)
    assert "expands to 2 offering(s)" in plan.stderr
    assert "a2-ultragpu-8g" in plan.stdout and "p4de.24xlarge" in plan.stdout
