"""End-to-end tests of `burst policy ...`, run in a subprocess exactly as a user would run it."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
EXAMPLES = sorted((ROOT / "policies" / "examples").glob("*.yaml"))
CLI_MODULE = "orchestrator.cli.policy_cmd"
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
    """Run `burst policy ARGS...` in a subprocess, from the repository root."""
    # The one line to change once the `burst` console script exists: ["burst", "policy"].
    prefix = [sys.executable, "-c", f"from {CLI_MODULE} import policy_app; policy_app()"]
    python_path = [str(ROOT), *filter(None, [os.environ.get("PYTHONPATH")])]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(python_path)}
    return subprocess.run(
        [*prefix, *map(str, args)],
        capture_output=True, text=True, cwd=ROOT, env=env, timeout=60, check=False,
    )


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
    """Run every CLI invocation once, side by side: each start of the CLI costs about a second."""
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
    with ThreadPoolExecutor(max_workers=len(invocations)) as pool:
        futures = {key: pool.submit(run_policy_cli, *args) for key, args in invocations.items()}
        results = {key: future.result() for key, future in futures.items()}
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
    assert report[0] == {"file": str(DEFAULT), "ok": True, "problems": []}
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
