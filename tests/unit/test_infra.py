"""The deployment assets in infra/ agree with the code: commands, options, settings, references.

Docker and systemd cannot run here, so the files are checked by parsing them: every ``burst ...``
command that compose.yaml or a systemd unit runs must parse against the real ``burst`` CLI (its
subcommand path, its options and their values), every key of the example env and settings files
must be a real :class:`~orchestrator.wiring.Settings` field (and every field must be documented
there), the example values must validate, and every service, unit, volume and file a file refers
to must exist. The checkers are also fed broken variants, so each one is shown to be able to fail.
"""

from __future__ import annotations

import re
import shlex
import shutil
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest
import typer
import typer.main
import yaml

from orchestrator.cli import app as cli_app
from orchestrator.wiring import Settings

ROOT = Path(__file__).resolve().parents[2]
INFRA = ROOT / "infra"
COMPOSE = INFRA / "compose.yaml"
UNITS = sorted((INFRA / "systemd").glob("*.service"))
ENV_EXAMPLE = INFRA / "burst.env.example"
SETTINGS_EXAMPLE = INFRA / "settings.example.yaml"

CONTROL_QUEUE, PROVIDER_QUEUE = "burst.control", "burst.provider"
QUEUES = {CONTROL_QUEUE, PROVIDER_QUEUE}
CONDITIONS = {"service_started", "service_healthy", "service_completed_successfully"}
SETTING_ENV = {f"BURST_{name.upper()}": name for name in Settings.model_fields}


# -- the burst CLI -------------------------------------------------------------------------------

def check_burst_argv(argv: list[str]) -> tuple[str, dict]:
    """Parse ``burst ARGS...`` against the real CLI without running it; return (path, params).

    Raises AssertionError naming the problem: not ``burst``, unknown subcommand, unknown option,
    bad option value, or a worker queue burst does not use.
    """
    assert argv and Path(argv[0]).name == "burst", f"not a burst command: {argv}"
    command = typer.main.get_command(cli_app)  # a click-style command tree (typer's own click)
    path = ["burst"]
    args = list(argv[1:])
    while isinstance(getattr(command, "commands", None), dict):  # a group: descend
        assert args and not args[0].startswith("-"), f"{' '.join(argv)}: no subcommand after {' '.join(path)}"
        name = args.pop(0)
        sub = command.commands.get(name)
        assert sub is not None, (f"{' '.join(argv)}: {' '.join(path)} has no subcommand {name!r} "
                                 f"(has {', '.join(sorted(command.commands))})")
        path.append(name)
        command = sub
    try:
        ctx = command.make_context(" ".join(path), args)
    except typer.TyperException as exc:  # usage errors, unknown options, bad values
        message = exc.format_message() if hasattr(exc, "format_message") else str(exc)
        raise AssertionError(f"{' '.join(argv)}: {message}") from None
    params = dict(ctx.params)
    if path == ["burst", "worker"]:
        queues = [q.strip() for q in params["queues"].split(",")]
        assert set(queues) <= QUEUES, f"{' '.join(argv)}: unknown queue(s) {set(queues) - QUEUES}"
    return " ".join(path[1:]), params


def test_the_checker_accepts_good_and_rejects_bad_commands():
    assert check_burst_argv(["burst", "worker", "--queues", "burst.control", "--concurrency", "2"])[0] == "worker"
    assert check_burst_argv(["/opt/burst/venv/bin/burst", "db", "upgrade"])[0] == "db upgrade"
    for bad in (["burst", "wroker"], ["burst", "worker", "--queue", CONTROL_QUEUE],
                ["burst", "worker", "--concurrency", "many"], ["burst", "worker", "--pool", "gevent"],
                ["burst", "worker", "--queues", "burst.contrl"], ["burst", "db"],
                ["burst", "db", "upgrad"], ["burst", "api", "--port", "99999"], ["celery", "worker"]):
        with pytest.raises(AssertionError):
            check_burst_argv(bad)


def test_the_queue_names_are_those_of_the_celery_app():
    from orchestrator.automation import app as automation

    assert {automation.CONTROL_QUEUE, automation.PROVIDER_QUEUE} == QUEUES


# -- compose.yaml --------------------------------------------------------------------------------

def interpolate(value: str) -> str:
    """Compose's ``${VAR:-default}`` / ``${VAR}`` with no variables set: the defaults."""
    return re.sub(r"\$\{\w+(?::?-([^}]*))?\}", lambda m: m.group(1) or "", value)


def compose_problems(data: dict) -> list[str]:
    """What is wrong with a parsed compose file (empty when nothing is)."""
    problems: list[str] = []
    services: dict = data.get("services") or {}
    volumes = set((data.get("volumes") or {}).keys())
    for name, service in services.items():
        depends = service.get("depends_on") or {}
        items = depends.items() if isinstance(depends, dict) else ((d, {}) for d in depends)
        for target, spec in items:
            if target not in services:
                problems.append(f"{name}: depends_on an undefined service {target!r}")
                continue
            condition = (spec or {}).get("condition", "service_started")
            if condition not in CONDITIONS:
                problems.append(f"{name}: unknown depends_on condition {condition!r}")
            if condition == "service_healthy" and "healthcheck" not in services[target]:
                problems.append(f"{name}: waits for {target} to be healthy, which has no healthcheck")
            if condition == "service_completed_successfully" and services[target].get("restart", "no") != "no":
                problems.append(f"{name}: waits for {target} to complete, but {target} restarts")
        for volume in service.get("volumes") or []:
            source, _, target = interpolate(str(volume)).partition(":")
            if source.startswith("."):
                if not (COMPOSE.parent / source).exists():
                    problems.append(f"{name}: mounts {source}, which does not exist beside compose.yaml")
            elif not source.startswith(("/", "~")) and source not in volumes:
                problems.append(f"{name}: named volume {source!r} is not declared")
        command = service.get("command")
        if command is not None:
            argv = shlex.split(command) if isinstance(command, str) else [str(a) for a in command]
            if argv and Path(argv[0]).name == "burst":
                try:
                    check_burst_argv(argv)
                except AssertionError as exc:
                    problems.append(f"{name}: {exc}")
                if service.get("env_file") != "burst.env":
                    problems.append(f"{name}: runs burst without env_file burst.env")
                if not any(interpolate(str(v)).split(":")[1:] == ["/etc/burst/policies", "ro"]
                           for v in service.get("volumes") or []):
                    problems.append(f"{name}: policies are not mounted read-only at /etc/burst/policies")
        build = service.get("build")
        if build:
            context = (COMPOSE.parent / build.get("context", ".")).resolve()
            if not (context / build.get("dockerfile", "Dockerfile")).is_file():
                problems.append(f"{name}: no Dockerfile at {build.get('dockerfile')} in {context}")
    return problems


def compose_burst_commands(data: dict) -> dict[str, tuple[str, dict]]:
    found = {}
    for name, service in data["services"].items():
        command = service.get("command")
        if command is None:
            continue
        argv = shlex.split(command) if isinstance(command, str) else [str(a) for a in command]
        if Path(argv[0]).name == "burst":
            found[name] = check_burst_argv(argv)
    return found


@pytest.fixture(scope="module")
def compose() -> dict:
    return yaml.safe_load(COMPOSE.read_text())


def test_compose_file_is_consistent(compose):
    assert compose_problems(compose) == []


def test_compose_runs_the_whole_control_plane(compose):
    commands = compose_burst_commands(compose)
    assert {path for path, _ in commands.values()} == {"db upgrade", "api", "worker", "beat"}
    workers = {name: params for name, (path, params) in commands.items() if path == "worker"}
    assert {params["queues"] for params in workers.values()} == QUEUES
    assert commands["api"][1]["host"] == "0.0.0.0"
    services = compose["services"]
    assert services["postgres"]["image"].startswith("postgres:16")
    assert services["redis"]["image"].startswith("redis:7")
    assert "healthcheck" in services["postgres"]
    assert services["migrate"]["depends_on"]["postgres"]["condition"] == "service_healthy"
    for name in ("api", "worker-control", "worker-provider"):
        assert services[name]["depends_on"]["migrate"]["condition"] == "service_completed_successfully"


def test_compose_checker_catches_mistakes(compose):
    import copy

    broken = copy.deepcopy(compose)
    broken["services"]["worker-control"]["command"] = ["burst", "worker", "--queue", CONTROL_QUEUE]
    broken["services"]["api"]["depends_on"]["migrat"] = {"condition": "service_completed_successfully"}
    broken["services"]["beat"]["command"] = "burst beet"
    broken["services"]["redis"].pop("healthcheck")
    problems = "\n".join(compose_problems(broken))
    assert "worker-control" in problems and "--queue" in problems
    assert "'migrat'" in problems
    assert "beet" in problems
    assert "redis to be healthy" in problems


def test_dockerfile_installs_extras_that_exist():
    dockerfile = (INFRA / "Dockerfile").read_text()
    extras = re.search(r'pip install "\.\[([^\]]+)\]"', dockerfile)
    assert extras, "infra/Dockerfile must pip install .[extras]"
    defined = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["optional-dependencies"]
    wanted = {e.strip() for e in extras.group(1).split(",")}
    assert wanted <= set(defined), wanted - set(defined)
    assert {"postgres", "celery"} <= wanted


# -- systemd units -------------------------------------------------------------------------------

KNOWN_DIRECTIVES = {
    "Unit": {"Description", "Documentation", "Wants", "Requires", "After", "Before", "BindsTo",
             "PartOf", "Conflicts", "StartLimitIntervalSec", "StartLimitBurst"},
    "Service": {"Type", "RemainAfterExit", "User", "Group", "DynamicUser", "Environment",
                "EnvironmentFile", "ExecStartPre", "ExecStart", "ExecStartPost", "ExecReload",
                "ExecStop", "ExecStopPost", "Restart", "RestartSec", "KillSignal", "KillMode",
                "TimeoutStartSec", "TimeoutStopSec", "TimeoutSec", "WorkingDirectory",
                "StateDirectory", "StateDirectoryMode", "RuntimeDirectory", "LogsDirectory", "UMask",
                "NoNewPrivileges", "ProtectSystem", "ProtectHome", "PrivateTmp", "PrivateDevices",
                "ProtectKernelTunables", "ProtectKernelModules", "ProtectKernelLogs",
                "ProtectControlGroups", "ProtectClock", "ProtectHostname", "RestrictSUIDSGID",
                "RestrictRealtime", "RestrictNamespaces", "LockPersonality",
                "MemoryDenyWriteExecute", "RestrictAddressFamilies", "CapabilityBoundingSet",
                "AmbientCapabilities", "SystemCallArchitectures", "SystemCallFilter",
                "ReadWritePaths", "ReadOnlyPaths", "LimitNOFILE", "SuccessExitStatus"},
    "Install": {"WantedBy", "RequiredBy", "Alias", "Also", "DefaultInstance"},
}
EXEC_KEYS = {"ExecStartPre", "ExecStart", "ExecStartPost", "ExecReload", "ExecStop", "ExecStopPost"}


def parse_unit(text: str) -> dict[str, list[tuple[str, str]]]:
    """A systemd unit as {section: [(key, value), ...]}, keeping repeated keys in order."""
    sections: dict[str, list[tuple[str, str]]] = {}
    current: str | None = None
    pending = ""
    for number, raw in enumerate(text.splitlines(), 1):
        line = pending + raw.strip()
        if line.endswith("\\"):
            pending = line[:-1] + " "
            continue
        pending = ""
        if not line or line[0] in "#;":
            continue
        if line.startswith("[") and line.endswith("]"):
            current = line[1:-1]
            sections.setdefault(current, [])
            continue
        if current is None or "=" not in line:
            raise ValueError(f"line {number}: {line!r} is not KEY=VALUE inside a [Section]")
        key, value = line.split("=", 1)
        sections[current].append((key.strip(), value.strip()))
    return sections


def _values(unit: dict, section: str, key: str) -> list[str]:
    return [v for k, v in unit.get(section, []) if k == key]


def expand(word_line: str, env: dict[str, str], instance: str) -> list[str]:
    """An Exec line as argv: systemd specifiers, then ${VAR} / $VAR from Environment=."""
    def specifier(match: re.Match) -> str:
        table = {"i": instance, "I": instance, "H": "host.example", "n": "unit.service", "%": "%"}
        if match.group(1) not in table:
            raise AssertionError(f"unknown specifier %{match.group(1)} in {word_line!r}")
        return table[match.group(1)]

    line = re.sub(r"%(.)", specifier, word_line).lstrip("-@:+!")
    argv = []
    for word in shlex.split(line):
        def variable(match: re.Match) -> str:
            name = match.group(1) or match.group(2)
            if name not in env:
                raise AssertionError(f"{word_line!r}: ${name} is not set by an Environment= line")
            return env[name]

        argv.append(re.sub(r"\$\{(\w+)\}|\$(\w+)", variable, word))
    return argv


def unit_problems(name: str, text: str, instances: list[str]) -> list[str]:
    """What is wrong with a burst systemd unit (empty when nothing is)."""
    try:
        unit = parse_unit(text)
    except ValueError as exc:
        return [f"{name}: {exc}"]
    problems: list[str] = []
    for section in ("Unit", "Service", "Install"):
        if section not in unit:
            problems.append(f"{name}: no [{section}] section")
    for section, items in unit.items():
        known = KNOWN_DIRECTIVES.get(section)
        if known is None:
            problems.append(f"{name}: unknown section [{section}]")
            continue
        problems += [f"{name}: unknown directive {section}.{key}" for key, _ in items if key not in known]
    service = dict(unit.get("Service", []))
    oneshot = service.get("Type") == "oneshot"
    if service.get("Type") not in ("exec", "simple", "oneshot"):
        problems.append(f"{name}: Type={service.get('Type')} (burst commands run in the foreground)")
    if not oneshot and service.get("Restart") != "on-failure":
        problems.append(f"{name}: a long-running unit needs Restart=on-failure")
    if "/etc/burst/burst.env" not in _values(unit, "Service", "EnvironmentFile"):
        problems.append(f"{name}: no EnvironmentFile=/etc/burst/burst.env")
    for key, wanted in (("NoNewPrivileges", "yes"), ("ProtectSystem", "strict"),
                        ("StateDirectory", "burst"), ("PrivateTmp", "yes")):
        if service.get(key) != wanted:
            problems.append(f"{name}: hardening: expected {key}={wanted}, found {service.get(key)}")
    if service.get("User") in (None, "root"):
        problems.append(f"{name}: runs as root")
    env: dict[str, str] = {}
    for value in _values(unit, "Service", "Environment"):
        for assignment in shlex.split(value):
            key, _, val = assignment.partition("=")
            env[key] = val
    execs = [(k, v) for k, v in unit.get("Service", []) if k in EXEC_KEYS]
    if not any(k == "ExecStart" for k, _ in execs):
        problems.append(f"{name}: no ExecStart")
    for key, value in execs:
        for instance in instances:
            try:
                argv = expand(value, env, instance)
                if Path(argv[0]).name == "burst":
                    check_burst_argv(argv)
                else:
                    problems.append(f"{name}: {key} runs {argv[0]}, not burst")
            except AssertionError as exc:
                problems.append(f"{name}: {key}: {exc}")
    present = {p.name for p in UNITS}
    for key in ("Wants", "Requires", "After", "Before", "BindsTo", "PartOf"):
        for value in _values(unit, "Unit", key):
            for ref in value.split():
                if ref.startswith("burst") and ref not in present:
                    problems.append(f"{name}: {key}={ref}, which infra/systemd does not have")
    return problems


def instances_of(path: Path) -> list[str]:
    """Template units (name@.service) are instantiated per queue; others have no instance."""
    return sorted(QUEUES) if path.name.endswith("@.service") else [""]


def test_the_expected_units_exist():
    assert {p.name for p in UNITS} >= {"burst-api.service", "burst-worker@.service",
                                       "burst-beat.service", "burst-migrate.service"}


@pytest.mark.parametrize("path", UNITS, ids=lambda p: p.name)
def test_systemd_unit_is_consistent(path: Path):
    assert unit_problems(path.name, path.read_text(), instances_of(path)) == []


def test_units_run_the_whole_control_plane():
    ran = set()
    for path in UNITS:
        unit = parse_unit(path.read_text())
        env = dict(a.partition("=")[::2] for v in _values(unit, "Service", "Environment")
                   for a in shlex.split(v))
        for value in _values(unit, "Service", "ExecStart"):
            for instance in instances_of(path):
                path_name, params = check_burst_argv(expand(value, env, instance))
                ran.add((path_name, params.get("queues")))
    assert {("db upgrade", None), ("api", None), ("beat", None),
            ("worker", CONTROL_QUEUE), ("worker", PROVIDER_QUEUE)} <= ran
    migrate = dict(parse_unit((INFRA / "systemd" / "burst-migrate.service").read_text())["Service"])
    assert migrate["Type"] == "oneshot" and migrate["RemainAfterExit"] == "yes"


@pytest.mark.parametrize(("old", "new", "complaint"), [
    ("burst worker --queues", "burst worker --queue", "--queue"),
    ("ExecStart=/opt/burst/venv/bin/burst worker", "ExecStart=/opt/burst/venv/bin/burst wroker", "wroker"),
    ("Restart=on-failure", "Restat=on-failure", "Restat"),
    ("${WORKER_CONCURRENCY}", "${WORKER_CONCURENCY}", "WORKER_CONCURENCY"),
    ("Requires=burst-migrate.service", "Requires=burst-migrations.service", "burst-migrations.service"),
    ("ProtectSystem=strict", "ProtectSystem=full", "ProtectSystem"),
    ("[Service]", "Service", "not KEY=VALUE"),
])
def test_unit_checker_catches_typos(old: str, new: str, complaint: str):
    path = INFRA / "systemd" / "burst-worker@.service"
    text = path.read_text()
    assert old in text
    problems = unit_problems(path.name, text.replace(old, new, 1), instances_of(path))
    assert any(complaint in p for p in problems), problems


def test_units_pass_systemd_analyze_verify(tmp_path: Path):
    analyze = shutil.which("systemd-analyze")
    if analyze is None:
        pytest.skip("systemd-analyze is not installed; the parser checks above still ran")
    # The units name the installed binary (/opt/burst/venv/bin/burst); verify against this one.
    for path in UNITS:
        name = path.name.replace("@.service", f"@{CONTROL_QUEUE}.service")
        (tmp_path / name).write_text(path.read_text().replace("/opt/burst/venv/bin/burst", sys.executable))
    result = subprocess.run([analyze, "verify", "--man=no", "--recursive-errors=no",
                             *sorted(str(p) for p in tmp_path.iterdir())],
                            check=False, capture_output=True, text=True, timeout=60)
    ours = [line for line in (result.stdout + result.stderr).splitlines() if "burst" in line]
    assert result.returncode == 0 and not ours, result.stdout + result.stderr


# -- example settings ----------------------------------------------------------------------------

def env_example_keys(text: str) -> tuple[dict[str, str], set[str]]:
    """(active KEY=VALUE lines, every BURST_* key including commented-out ``# BURST_X=`` ones)."""
    active: dict[str, str] = {}
    mentioned: set[str] = set()
    for line in text.splitlines():
        match = re.match(r"^(#\s*)?([A-Z][A-Z0-9_]*)=(.*)$", line.strip())
        if not match:
            continue
        commented, key, value = match.groups()
        if key.startswith("BURST_"):
            mentioned.add(key)
        if not commented:
            active[key] = value
    return active, mentioned


@pytest.fixture
def clean_env(monkeypatch: pytest.MonkeyPatch):
    import os

    for key in list(os.environ):
        if key.startswith("BURST_"):
            monkeypatch.delenv(key)
    return monkeypatch


def test_env_example_documents_exactly_the_settings(clean_env):
    active, mentioned = env_example_keys(ENV_EXAMPLE.read_text())
    assert mentioned - set(SETTING_ENV) == set(), "keys that are no Settings field"
    assert set(SETTING_ENV) - mentioned == set(), "Settings fields burst.env.example does not list"
    for key, value in active.items():
        if key.startswith("BURST_"):
            clean_env.setenv(key, value)
    settings = Settings()  # the example values validate
    assert settings.database_url and settings.database_url.startswith("postgresql")
    assert settings.secret_key is not None
    assert all(str(p).startswith("/etc/burst/policies/") for p in settings.policy_files)
    # The compose network: these hosts are the compose services.
    services = set(yaml.safe_load(COMPOSE.read_text())["services"])
    for url in (settings.database_url, settings.broker_url, settings.result_backend, settings.redis_url):
        host = re.match(r"^[\w+]+://(?:[^@/]*@)?([^:/]+)", url).group(1)
        assert host in services, f"{url}: host {host} is not a compose service"
    pg_password = re.match(r"^[\w+]+://[^:]+:([^@]+)@", settings.database_url).group(1)
    assert active["POSTGRES_PASSWORD"] == pg_password


def test_env_example_checker_catches_unknown_keys():
    _, mentioned = env_example_keys("BURST_TICK_S=10\n# BURST_TICKS=5\n")
    assert mentioned - set(SETTING_ENV) == {"BURST_TICKS"}


def test_settings_example_yaml_documents_exactly_the_settings(clean_env):
    data = yaml.safe_load(SETTINGS_EXAMPLE.read_text())
    fields = set(Settings.model_fields) - {"settings_file"}  # the file does not name itself
    assert set(data) - fields == set(), "keys that are no Settings field"
    assert fields - set(data) == set(), "Settings fields settings.example.yaml does not list"
    clean_env.setenv("BURST_SETTINGS_FILE", str(SETTINGS_EXAMPLE))
    settings = Settings()  # read through pydantic-settings' YAML source, as in production
    assert settings.database_url == data["database_url"]
    assert [str(p) for p in settings.policy_files] == data["policy_files"]


def test_readme_production_commands_exist():
    text = (ROOT / "README.md").read_text()
    section = text.split("### Production", 1)[1].split("\n### ", 1)[0]
    lines = [line.split("#", 1)[0].strip() for line in re.findall(r"^burst .*$", section, re.MULTILINE)]
    assert len(lines) >= 5
    paths = {check_burst_argv(shlex.split(line))[0] for line in lines}
    assert paths == {"db upgrade", "worker", "api", "beat"}
