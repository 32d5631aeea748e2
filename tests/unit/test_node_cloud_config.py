"""The cloud-config a cloud node boots with (infra/bootstrap/): valid for cloud-init, and it works.

``cloud-init schema`` (Debian's cloud-init) validates every rendered document, and a broken one
to show it can fail; the files it writes are checked by what reads them: the agent parses the
bootstrap back, ``systemd-analyze verify`` the unit, ``sh`` runs the install script for real
against a virtualenv (a pre-baked image is left alone; a wrong version is refused).
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from orchestrator import __version__
from orchestrator.fabric.bootstrap import AGENT_UNIT, Bootstrap, NodeInstall, template
from orchestrator.wiring import Settings

ROOT = Path(__file__).resolve().parents[2]
CLOUD_INIT = shutil.which("cloud-init")
needs_cloud_init = pytest.mark.skipif(CLOUD_INIT is None, reason="cloud-init is not installed "
                                      "(.ci/run installs it)")
INSTALL = NodeInstall(__version__, index_url="https://pypi.internal.example/simple")


def make(**overrides: object) -> Bootstrap:
    values: dict[str, object] = {
        "node_id": "aws-pool-3f2a91c0de", "controller_url": "https://burst.example.internal",
        "join_token": "bjt_s3cr3t", "cluster": "lab", "policy": "aws-pool", "gpus": 8,
        "gpu_model": "H100-80GB", "self_terminate": "shutdown -h now",
    }
    values.update(overrides)
    return Bootstrap(**values)  # type: ignore[arg-type]


def schema_errors(text: str, tmp_path: Path) -> str:
    """What ``cloud-init schema`` says is wrong with ``text`` (empty when it is valid)."""
    path = tmp_path / "user-data"
    path.write_text(text)
    done = subprocess.run([CLOUD_INIT, "schema", "--config-file", str(path)], capture_output=True,
                          text=True, timeout=120, check=False)
    return "" if done.returncode == 0 else (done.stdout + done.stderr).strip() or "invalid"


def written(text: str) -> dict[str, dict]:
    return {f["path"]: f for f in yaml.safe_load(text)["write_files"]}


@needs_cloud_init
def test_the_rendered_cloud_config_is_valid_and_a_broken_one_is_not(tmp_path):
    text = make().render_cloud_config(INSTALL, {"BURST_LOG_FORMAT": "json"})
    assert text.startswith("#cloud-config\n")
    assert schema_errors(text, tmp_path) == ""
    broken = text.replace("runcmd:", "runcmd: 7\nignored:")  # runcmd must be a list
    assert "runcmd" in schema_errors(broken, tmp_path)


@needs_cloud_init
def test_the_shipped_template_renders_valid_without_a_self_terminate_command(tmp_path):
    text = make(self_terminate="").render_cloud_config(NodeInstall(__version__))
    assert schema_errors(text, tmp_path) == ""
    [[_, _, setup]] = yaml.safe_load(text)["runcmd"]
    assert "||" not in setup  # libcloud nodes: nothing to shut down with; the controller reaps


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(node=st.from_regex(r"[a-z][a-z0-9-]{0,30}", fullmatch=True),
       token=st.text(st.characters(codec="utf-8", exclude_categories=("Cs", "Cc")), min_size=1,
                     max_size=40),
       terminate=st.sampled_from(["", "shutdown -h now", "poweroff"]))
def test_the_agent_reads_the_bootstrap_back_from_the_cloud_config_and_its_file(node, token,
                                                                              terminate):
    boot = make(node_id=node, join_token=token, self_terminate=terminate)
    text = boot.render_cloud_config(INSTALL)
    assert Bootstrap.parse(text) == boot  # what parse reads from the whole user-data
    script = written(text)["/etc/burst/bootstrap.sh"]
    assert script["permissions"] == "0600"  # it holds the join token
    assert Bootstrap.parse(script["content"]) == boot  # what the unit's agent reads


def test_the_files_are_the_shipped_ones_with_the_pinned_version_and_settings():
    text = make().render_cloud_config(INSTALL, {"BURST_LOG_FORMAT": "json"})
    files = written(text)
    unit = files["/etc/systemd/system/burst-agent.service"]["content"]
    assert unit == template(AGENT_UNIT)
    assert unit == (ROOT / "infra" / "bootstrap" / AGENT_UNIT).read_text()
    install = files["/usr/local/lib/burst/install-burst.sh"]["content"]
    assert f"want='burst {__version__}'" in install
    assert f"--index-url https://pypi.internal.example/simple burst=={__version__}" in install
    env = files["/etc/burst/agent.env"]["content"].splitlines()
    assert "BURST_LOG_FORMAT=json" in env and "BURST_WORK_DIR=/var/lib/burst/work" in env
    [[_, _, setup]] = yaml.safe_load(text)["runcmd"]
    assert setup.startswith("/usr/local/lib/burst/install-burst.sh && systemctl daemon-reload")
    assert setup.endswith("|| { echo 'burst: node setup failed' >&2; shutdown -h now; }")


def test_the_unit_restarts_the_agent_but_not_after_exits_a_restart_cannot_fix():
    from orchestrator.fabric import agent

    unit = template(AGENT_UNIT)
    assert "Restart=on-failure" in unit and "StartLimitIntervalSec=0" in unit
    kept = {int(code) for code in unit.split("RestartPreventExitStatus=")[1].split("\n")[0].split()}
    assert kept == {agent.EXIT_BAD_BOOTSTRAP, agent.EXIT_AUTH, agent.EXIT_LEASE_EXPIRED}
    assert "ExecStart=/opt/burst/venv/bin/burst agent --user-data /etc/burst/bootstrap.sh" in unit


@pytest.mark.skipif(shutil.which("systemd-analyze") is None, reason="needs systemd-analyze")
def test_systemd_accepts_the_unit(tmp_path):
    unit = tmp_path / AGENT_UNIT
    # verify checks ExecStart's binary exists: point it at one that does, keep the rest.
    unit.write_text(template(AGENT_UNIT).replace("/opt/burst/venv/bin/burst", sys.executable)
                    .replace("EnvironmentFile=/etc/burst/agent.env", f"EnvironmentFile=-{tmp_path}/env"))
    done = subprocess.run(["systemd-analyze", "verify", str(unit)], capture_output=True, text=True,
                          timeout=60, check=False)
    problems = [line for line in done.stderr.splitlines() if AGENT_UNIT in line]
    assert problems == [], done.stderr


def _install_script(tmp_path: Path, install: NodeInstall) -> Path:
    text = make().render_cloud_config(install)
    path = tmp_path / "install-burst.sh"
    path.write_text(written(text)["/usr/local/lib/burst/install-burst.sh"]["content"])
    path.chmod(0o755)
    return path


def _fake_burst(venv: Path, version: str) -> None:
    (venv / "bin").mkdir(parents=True)
    burst = venv / "bin" / "burst"
    burst.write_text(f"#!/bin/sh\necho 'burst {version}'\n")
    burst.chmod(0o755)


def test_the_install_script_leaves_a_prebaked_image_alone(tmp_path):
    venv = tmp_path / "venv"
    _fake_burst(venv, __version__)
    done = subprocess.run(["sh", str(_install_script(tmp_path, INSTALL))], capture_output=True,
                          text=True, timeout=60, env={**os.environ, "BURST_VENV": str(venv)})
    assert done.returncode == 0 and "already on the image" in done.stdout


@pytest.mark.long  # a real virtualenv with pip: about 20 s on a loaded machine
def test_the_install_script_installs_from_the_index_and_refuses_another_version(tmp_path):
    # A package index with no burst in it (an empty directory): pip fails, so does the script.
    index = tmp_path / "index"
    index.mkdir()
    venv = tmp_path / "venv"
    _fake_burst(venv, "0.0.1")  # an image with another burst: replaced, not used
    script = _install_script(tmp_path, NodeInstall(__version__, index_url=index.as_uri()))
    done = subprocess.run(["sh", str(script)], capture_output=True, text=True, timeout=300,
                          env={**os.environ, "BURST_VENV": str(venv)})
    assert done.returncode != 0
    assert "already on the image" not in done.stdout
    assert (venv / "bin" / "pip").exists()  # a real virtualenv was made to install into


def test_the_controller_served_wheel_is_the_default_package_when_a_wheel_dir_is_set(tmp_path):
    settings = Settings(state_dir=tmp_path, node_wheel_dir=tmp_path,
                        controller_url="https://burst.example.internal/")
    install = settings.node_install()
    assert install.package == (f"https://burst.example.internal/v1/agent/wheels/"
                               f"burst-{__version__}-py3-none-any.whl")
    assert Settings(state_dir=tmp_path).node_install().pip_args() == f"burst=={__version__}"
    assert Settings(state_dir=tmp_path, node_package="burst[gpu]==9").node_install().package == "burst[gpu]==9"
