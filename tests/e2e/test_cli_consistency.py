"""One consistent CLI: BURST_POLICY_FILES everywhere -p is absent, -p always a policy file, every
--json documented, `burst --version`, shell completion, and a `--help` that imports nothing heavy.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tomllib
from pathlib import Path

import click
import pytest
import typer.main

from orchestrator.cli import app
from orchestrator.cli.common import DEFAULT_POLICY
from orchestrator.policy import DEFAULT_POLICY_PATH
from tests.e2e.helpers import FAST_POLICY, burst_cmd, free_port, kill_all, run_burst, run_burst_here

ROOT = Path(__file__).resolve().parents[2]
SPIKE = ROOT / "policies" / "snapshots" / "spike.json"
# What no `--help` may import: the start-up cost the issue measured was the web app, the store
# and the policy model imported for two constants.
HEAVY = ("fastapi", "uvicorn", "sqlalchemy", "alembic", "celery", "yaml", "boto3", "matplotlib",
         "orchestrator.api", "orchestrator.store", "orchestrator.policy", "orchestrator.wiring",
         "orchestrator.planner", "orchestrator.domain")
# `burst --help` not even pydantic. (Below the root, typer itself converts the root group's option
# values through pydantic before it reaches a sub-command's --help.)
ROOT_HEAVY = (*HEAVY, "pydantic")


def _heavy(modules: list[str], heavy: tuple[str, ...]) -> list[str]:
    return [m for m in modules if any(m == h or m.startswith(h + ".") for h in heavy)]


def _commands() -> list[tuple[list[str], click.Command]]:
    """Every command of the CLI with its path, groups included (``[]`` is `burst` itself)."""
    found: list[tuple[list[str], click.Command]] = []

    def walk(path: list[str], command: click.Command) -> None:
        found.append((path, command))
        for name, sub in getattr(command, "commands", {}).items():
            walk([*path, name], sub)

    walk([], typer.main.get_command(app))
    return found


def test_help_of_every_command_imports_nothing_heavy(tmp_path: Path) -> None:
    listing = tmp_path / "modules.json"
    script = f"""
import json, sys
from orchestrator.cli import app, main
sys.argv = ["burst", "--help"]
try:
    main()
except SystemExit as exit:
    assert exit.code in (0, None), exit.code
root = sorted(sys.modules)
import typer.main
paths = []
def walk(path, command):
    for name, sub in getattr(command, "commands", {{}}).items():
        paths.append([*path, name]); walk([*path, name], sub)
walk([], typer.main.get_command(app))
for path in paths:
    sys.argv = ["burst", *path, "--help"]
    try:
        main()
    except SystemExit as exit:
        assert exit.code in (0, None), (path, exit.code)
json.dump({{"root": root, "modules": sorted(sys.modules), "helped": len(paths)}},
          open({str(listing)!r}, "w"))
"""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))}
    subprocess.run([sys.executable, "-c", script], env=env, check=True, timeout=120,
                   stdout=subprocess.DEVNULL)
    data = json.loads(listing.read_text())
    assert data["helped"] >= 30  # every command and group, sub-commands included
    assert _heavy(data["root"], ROOT_HEAVY) == []
    assert _heavy(data["modules"], HEAVY) == []


def test_cli_names_the_shipped_default_without_importing_the_policy_model() -> None:
    assert DEFAULT_POLICY == DEFAULT_POLICY_PATH


def test_every_json_option_has_help_and_every_policy_option_is_a_file() -> None:
    undocumented, not_files = [], []
    for path, command in _commands():
        for param in command.params:
            if not isinstance(param, click.Option):
                continue
            if "--json" in param.opts and not (param.help or "").strip():
                undocumented.append(" ".join(path))
            if "--policy" in param.opts and not ("-p" in param.opts and isinstance(param.type, click.Path)):
                not_files.append(" ".join(path))
    assert undocumented == [] and not_files == []


def test_version_and_shell_completion() -> None:
    version = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["version"]
    result = run_burst("--version", check=True)
    assert result.stdout.strip() == f"burst {version}"

    completion = subprocess.run(burst_cmd(), capture_output=True, text=True, timeout=60, env={
        **os.environ, "_BURST_COMPLETE": "complete_bash", "COMP_WORDS": "burst sta",
        "COMP_CWORD": "1"})
    assert completion.returncode == 0 and completion.stdout.split() == ["status"]
    shown = run_burst("--show-completion", "bash", check=True)
    assert "_burst_completion" in shown.stdout


MINE = """\
version: 1
name: mine
cluster: e2e
pool:
  name: mine-pool
  onprem: {nodes: 1, gpus_per_node: 4}
trigger: {pending_gpus_above: 0, oldest_wait_above: 2s, sustained_for: 1s}
offerings:
  - {provider: local, region: local, zone: local-a, instance_type: local.8gpu, market: on-demand,
     gpus: 8, price_usd_hour: 30}
limits: {max_nodes: 1, max_concurrent_launches: 1}
"""


@pytest.fixture
def mine(tmp_path: Path):
    """An environment whose BURST_POLICY_FILES names a policy `mine` with pool `mine-pool`."""
    policy = tmp_path / "mine.yaml"
    policy.write_text(MINE)
    state = tmp_path / "state"
    yield {"BURST_STATE_DIR": str(state), "BURST_API_PORT": str(free_port()),
           "BURST_LOCAL_BOOT_DELAY_S": "0", "BURST_POLICY_FILES": json.dumps([str(policy)])}
    kill_all(str(state))


def test_commands_read_burst_policy_files_when_p_is_absent(mine, tmp_path: Path) -> None:
    # The commands read BURST_POLICY_FILES when they load their settings (per command, not at
    # import): in-process (run_burst_here sets it for the call) but for `burst run`, a process.
    def burst(*args: str) -> subprocess.CompletedProcess:
        run = run_burst if args[0] == "run" else run_burst_here
        return run(*args, env=mine, check=True)

    assert "in pool mine-pool" in burst("submit", "--project", "p", "--gpus", "1",
                                        "--duration", "1m").stdout
    status = json.loads(burst("status", "--json").stdout)
    assert [p["pool"] for p in status["pools"]] == ["mine-pool"]
    assert [j["pool"] for j in status["queue"]] == ["mine-pool"]

    snapshot = json.loads(SPIKE.read_text())
    queue = snapshot["queues"].pop("gpu")
    queue["pool"] = "mine-pool"
    snapshot["queues"]["mine-pool"] = queue
    (tmp_path / "mine.json").write_text(json.dumps(snapshot))
    plan = json.loads(burst("plan", "--snapshot", str(tmp_path / "mine.json"), "--json").stdout)
    assert [d["policy"] for d in plan["decisions"]] == ["mine"]

    check = json.loads(burst("provider", "check", "local", "--json").stdout)
    assert [o["key"] for o in check["offerings"]] == ["local/local/local-a/local.8gpu/on-demand"]

    assert "running policies [mine]" in burst("run", "--once").stderr
    # -p still wins over the environment.
    assert "running policies [fast]" in burst("run", "--once", "-p", str(FAST_POLICY)).stderr

    # `decisions --name` filters by policy name (-p/--policy always means a policy file).
    assert {d["policy"] for d in json.loads(burst("decisions", "--json").stdout)} == {"mine", "fast"}
    assert {d["policy"] for d in json.loads(burst("decisions", "--name", "mine", "--json").stdout)} == {"mine"}
