"""`burst provider check` and `burst catalog ...` as an operator runs them, against moto (a real
EC2 API server in its own process). The commands run in-process (run_burst_here: the same typer
app, exit code and output; the AWS settings are set in the environment for each call only)."""

from __future__ import annotations

import json

import pytest
import yaml

from tests.e2e.helpers import run_burst_here

pytest.importorskip("boto3")
from tests.servers.moto_ec2 import MotoEC2Server  # noqa: E402


@pytest.fixture(scope="module")
def moto():
    with MotoEC2Server() as server:
        yield server


@pytest.fixture
def aws_env(moto, tmp_path):
    moto.clear()
    env = {**moto.env(), "AWS_ACCESS_KEY_ID": "AKIACLITEST", "AWS_SECRET_ACCESS_KEY": "cli-secret-zz9",
           "AWS_DEFAULT_REGION": "us-east-1", "AWS_EC2_METADATA_DISABLED": "true",
           "BURST_STATE_DIR": str(tmp_path / "state")}
    ami = moto.client("ec2").describe_images(Owners=["amazon"])["Images"][0]["ImageId"]
    policy = tmp_path / "aws.yaml"
    policy.write_text(yaml.safe_dump({
        "version": 1, "name": "cli", "pool": {"name": "gpu", "onprem": {"nodes": 1, "gpus_per_node": 8}},
        "offerings": [{"provider": "aws", "region": "us-east-1", "instance_type": "p4d.24xlarge",
                       "market": "spot", "fallback_on_demand": True}],
        "providers": {"aws": {"ami": ami}},
    }))
    return env, policy


def test_provider_check_passes_and_lists_the_offerings_it_would_use(aws_env):
    env, policy = aws_env
    result = run_burst_here("provider", "check", "aws", "--policy", str(policy), "--json", env=env)
    assert result.returncode == 0, result.stdout + result.stderr
    report = json.loads(result.stdout)
    assert report["ok"] and report["checks"]
    keys = {o["key"] for o in report["offerings"]}
    assert keys == {"aws/us-east-1/-/p4d.24xlarge/spot", "aws/us-east-1/-/p4d.24xlarge/on-demand"}
    assert all(o["gpus"] == 8 for o in report["offerings"])
    assert "cli-secret-zz9" not in result.stdout + result.stderr


def test_provider_check_fails_clearly_without_permission(aws_env, moto):
    env, policy = aws_env
    moto.inject("RunInstances", 403, "UnauthorizedOperation", "You are not authorized to perform this operation.", 10)
    result = run_burst_here("provider", "check", "aws", "--policy", str(policy), env=env)
    moto.clear()
    assert result.returncode == 1
    assert "FAILED" in result.stdout and "AuthError" in result.stdout
    assert "Traceback" not in result.stderr


def test_catalog_refresh_takes_spot_prices_from_ec2(aws_env):
    env, policy = aws_env
    before = json.loads(run_burst_here("catalog", "list", "aws", "--region", "us-east-1", "--json",
                                       env=env, check=True).stdout)
    spot_before = next(o for o in before if o["key"] == "aws/us-east-1/-/p4d.24xlarge/spot")
    result = run_burst_here("catalog", "refresh", "--policy", str(policy), env=env)
    assert result.returncode == 0, result.stderr
    assert "refreshed" in result.stdout
    after = json.loads(run_burst_here("catalog", "list", "aws", "--region", "us-east-1", "--json",
                                      env=env, check=True).stdout)
    spot_after = next(o for o in after if o["key"] == "aws/us-east-1/-/p4d.24xlarge/spot")
    # moto's DescribeSpotPriceHistory answers a fixed 0.00001: the refreshed value came from the API.
    assert spot_after["price_usd_hour"] == pytest.approx(0.00001)
    assert spot_before["price_usd_hour"] > 1


def test_provider_check_for_a_policy_without_settings_says_what_is_missing(tmp_path):
    result = run_burst_here("provider", "check", "gcp", "--json",
                            env={"BURST_STATE_DIR": str(tmp_path)})
    assert result.returncode == 1
    report = json.loads(result.stdout)
    assert not report["ok"] and "providers.gcp" in report["checks"][0]["detail"]


def test_provider_check_of_an_unknown_provider_names_the_known_ones(tmp_path):
    result = run_burst_here("provider", "check", "azure", env={"BURST_STATE_DIR": str(tmp_path)})
    assert result.returncode == 2
    assert "unknown provider 'azure'" in result.stderr and "aws" in result.stderr
    assert "Traceback" not in result.stderr
