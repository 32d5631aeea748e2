"""No cloud credentials: `catalog refresh`, `provider check` and `burst run` say, in one line, which
provider and what to do; never a traceback, and `provider check` says it once, not per check.

The environment is a user's with no credentials at all: HOME is an empty directory (no
~/.aws, no gcloud configuration), every AWS_* and GOOGLE_* variable unset. (The EC2 instance
metadata lookup is switched off: off EC2 it can only time out, which would slow the test, not
change what it shows.)
"""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

from tests.e2e.helpers import burst_cmd, free_port

ROOT = Path(__file__).resolve().parents[2]
AWS_POLICY = ROOT / "policies" / "examples" / "aws-spot-fallback.yaml"
GCP_POLICY = ROOT / "policies" / "examples" / "gcp-a100.yaml"
LIBCLOUD_POLICY = """\
version: 1
name: lc
cluster: e2e
pool: {name: gpu, onprem: {nodes: 1, gpus_per_node: 4}}
offerings:
  - {provider: libcloud, region: regionOne, instance_type: gpu.large, market: on-demand}
providers:
  libcloud:
    driver: openstack
    key: env:BURST_TEST_OS_USER
    secret: env:BURST_TEST_OS_PASSWORD
    image: img
    args: {ex_force_auth_url: "http://127.0.0.1:9", ex_force_auth_version: 3.x_password}
    sizes: {gpu.large: {gpus: 4, price_usd_hour: 3}}
"""


@pytest.fixture
def bare(tmp_path: Path) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("AWS_", "GOOGLE_", "CLOUDSDK_", "BURST_"))}
    home = tmp_path / "home"
    home.mkdir()
    env.update(HOME=str(home), BURST_STATE_DIR=str(tmp_path / "state"),
               BURST_API_PORT=str(free_port()), AWS_EC2_METADATA_DISABLED="true")
    return env


def burst(env: dict[str, str], *args: str) -> subprocess.CompletedProcess:
    result = subprocess.run(burst_cmd(*args), capture_output=True, text=True, timeout=120, env=env)
    assert "Traceback" not in result.stdout + result.stderr, result.stderr
    return result


def errors(result: subprocess.CompletedProcess) -> list[str]:
    return [line for line in result.stderr.splitlines() if line.startswith("error:")]


AWS_FIX = ("provider aws: credentials missing or not accepted", "aws configure", "AWS_PROFILE",
           "instance role")


def test_catalog_refresh_without_aws_credentials_is_one_line(bare) -> None:
    result = burst(bare, "catalog", "refresh", "-p", str(AWS_POLICY))
    assert result.returncode == 2
    [line] = result.stderr.strip().splitlines()
    assert line.startswith("error: ") and all(text in line for text in AWS_FIX), line
    assert "NoCredentialsError" in line


def test_provider_check_says_it_once(bare) -> None:
    result = burst(bare, "provider", "check", "aws", "-p", str(AWS_POLICY))
    assert result.returncode == 1
    assert result.stdout.count("NoCredentialsError") == 1, result.stdout  # one row, not one per check
    assert "failing the same way" in result.stdout
    [line] = errors(result)
    assert all(text in line for text in AWS_FIX), line

    gcp = burst(bare, "provider", "check", "gcp", "-p", str(GCP_POLICY))
    assert gcp.returncode == 1
    [line] = errors(gcp)
    assert "provider gcp:" in line and "gcloud auth application-default login" in line
    assert "GOOGLE_APPLICATION_CREDENTIALS" in line


def test_provider_check_libcloud_names_the_key_settings(bare, tmp_path: Path) -> None:
    policy = tmp_path / "lc.yaml"
    policy.write_text(LIBCLOUD_POLICY)
    result = burst(bare, "provider", "check", "libcloud", "-p", str(policy))
    assert result.returncode == 1
    [line] = errors(result)
    assert "provider libcloud:" in line and "BURST_TEST_OS_USER" in line
    assert "providers.libcloud.key" in line


def test_run_refuses_to_start_without_credentials(bare) -> None:
    result = burst(bare, "run", "--once", "-p", str(AWS_POLICY))
    assert result.returncode == 2
    [line] = errors(result)
    assert all(text in line for text in AWS_FIX), line
    assert "running policies" not in result.stderr  # said before the loop starts
