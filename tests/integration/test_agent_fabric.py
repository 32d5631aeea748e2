"""The node agent's own facts and fabric duties, as a real agent process against a fake controller.

* GPU inventory: from ``nvidia-smi`` when there is one (a stand-in script here), else from the
  configuration the node was launched with; sent with the registration.
* Spot/preemption notices: the agent polls the metadata endpoint the controller named (AWS format,
  with an IMDSv2 token; GCP format) and, on a notice, checkpoint-drains at once: its job gets the
  signal, is handed back, the heartbeat carries the notice and the agent releases the node
  without waiting for the controller.
"""

from __future__ import annotations

import json
import os
import threading
import time
from datetime import UTC, datetime, timedelta
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import pytest

from orchestrator.fabric.node_facts import gpu_inventory, parse_nvidia_smi, poll_notice
from tests.integration.test_agent import Controller, serve, start_agent, wait_for  # noqa: F401

NVIDIA_SMI = """#!/bin/sh
echo "0, NVIDIA H100 80GB HBM3, 81559"
echo "1, NVIDIA H100 80GB HBM3, 81559"
"""


class NoticeController(Controller):
    """The fake controller, naming a notice endpoint in its registration answer."""

    notice: dict[str, Any] | None = None

    def answer(self, path: str, auth: str | None, body: dict[str, Any]) -> tuple[int, Any]:
        status, answer = super().answer(path, auth, body)
        if path == "/v1/agent/register" and status == 200:
            answer = {**answer, "fabric": None, "notice": self.notice}
        return status, answer


@pytest.fixture
def controller():
    ctl = NoticeController()
    server = serve(ctl)
    ctl.url = f"http://127.0.0.1:{server.server_address[1]}"  # type: ignore[attr-defined]
    try:
        yield ctl
    finally:
        server.shutdown()
        server.server_close()


class Metadata:
    """AWS (spot/instance-action, IMDSv2 token) and GCP (instance/preempted) notice endpoints."""

    def __init__(self) -> None:
        self.aws_notice: dict | None = None
        self.gcp_preempted = False
        self.tokens_issued = 0
        self.requests: list[tuple[str, dict]] = []
        outer = self

        class Handler(BaseHTTPRequestHandler):
            def do_PUT(self) -> None:
                if self.path == "/latest/api/token":
                    outer.tokens_issued += 1
                    self._answer(200, "token-1")
                else:
                    self._answer(404, "")

            def do_GET(self) -> None:
                outer.requests.append((self.path, dict(self.headers)))
                if self.path.endswith("/spot/instance-action"):
                    if self.headers.get("X-aws-ec2-metadata-token") != "token-1":
                        self._answer(401, "")
                    elif outer.aws_notice is None:
                        self._answer(404, "Not Found")
                    else:
                        self._answer(200, json.dumps(outer.aws_notice))
                elif self.path.endswith("/instance/preempted"):
                    if self.headers.get("Metadata-Flavor") != "Google":
                        self._answer(403, "")
                    else:
                        self._answer(200, "TRUE" if outer.gcp_preempted else "FALSE")
                else:
                    self._answer(404, "")

            def _answer(self, status: int, body: str) -> None:
                data = body.encode()
                self.send_response(status)
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def log_message(self, *args: object) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        threading.Thread(target=self.server.serve_forever, kwargs={"poll_interval": 0.05},
                         daemon=True).start()
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture
def metadata():
    server = Metadata()
    try:
        yield server
    finally:
        server.close()


# -- GPU inventory --------------------------------------------------------------------------------

def test_nvidia_smi_rows_parse():
    assert parse_nvidia_smi(NVIDIA_SMI.replace('echo "', "").replace('"', "")) == [
        {"index": 0, "name": "NVIDIA H100 80GB HBM3", "memory_mib": 81559},
        {"index": 1, "name": "NVIDIA H100 80GB HBM3", "memory_mib": 81559},
    ]
    assert parse_nvidia_smi("No devices were found\n") == []


def test_inventory_falls_back_to_the_configuration_without_a_gpu_tool(monkeypatch, tmp_path):
    monkeypatch.setenv("PATH", str(tmp_path))  # no nvidia-smi
    inventory = gpu_inventory(4, "A100-80GB")
    assert inventory.source == "config" and inventory.count == 4 and inventory.model == "A100-80GB"
    assert gpu_inventory(4, "A100-80GB", probe="config").source == "config"


def test_the_agent_registers_with_the_inventory_nvidia_smi_reports(controller, start_agent, tmp_path):
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "nvidia-smi").write_text(NVIDIA_SMI)
    (bin_dir / "nvidia-smi").chmod(0o755)
    agent = start_agent(PATH=f"{bin_dir}:{os.environ['PATH']}")
    [register] = wait_for(lambda: controller.of("/v1/agent/register"), what="registration")
    assert register.body["gpu_source"] == "nvidia-smi"
    assert register.body["gpus"] == 2 and register.body["gpu_model"] == "NVIDIA H100 80GB HBM3"
    assert [g["memory_mib"] for g in register.body["gpu_inventory"]] == [81559, 81559]
    agent.proc.terminate()
    agent.wait()


# -- spot / preemption notices --------------------------------------------------------------------

def test_notice_formats_of_aws_and_gcp(metadata):
    aws = metadata.url + "/latest/meta-data/spot/instance-action"
    gcp = metadata.url + "/computeMetadata/v1/instance/preempted"
    now = datetime(2026, 1, 1, tzinfo=UTC)
    assert poll_notice("aws", aws, 30, now) is None  # 404: no notice
    assert metadata.tokens_issued == 1  # IMDSv2: a session token first
    metadata.aws_notice = {"action": "terminate", "time": "2026-01-01T00:02:00Z"}
    notice = poll_notice("aws", aws, 30, now)
    assert notice.source == "aws" and notice.action == "terminate"
    assert notice.deadline == now + timedelta(minutes=2)
    # The one ISO parser reads it (orchestrator.isotime): a naive time is the service's UTC, a
    # garbled or absurd one leaves the default deadline.
    metadata.aws_notice = {"action": "terminate", "time": "2026-01-01T00:03:00"}
    assert poll_notice("aws", aws, 30, now).deadline == now + timedelta(minutes=3)
    for garbled in ("soon", "0001-01-01T00:00:00Z", "9" * 100):
        metadata.aws_notice = {"action": "stop", "time": garbled}
        assert poll_notice("aws", aws, 30, now).deadline == now + timedelta(seconds=30)
    assert poll_notice("gcp", gcp, 30, now) is None  # FALSE
    metadata.gcp_preempted = True
    notice = poll_notice("gcp", gcp, 30, now)
    assert notice.source == "gcp" and notice.deadline == now + timedelta(seconds=30)
    assert poll_notice("aws", "http://127.0.0.1:9/nothing", 30, now) is None  # unreachable


def test_a_spot_notice_drains_the_node_at_once_with_the_job_checkpointed(
        controller, start_agent, metadata, tmp_path):
    controller.notice = {"kind": "aws", "poll_s": 0.1, "deadline_s": 30,
                         "url": metadata.url + "/{node_id}/latest/meta-data/spot/instance-action"}
    checkpoint = tmp_path / "checkpoint"
    # A long job that checkpoints when it is signalled (the agent hands it back with SIGTERM).
    controller.jobs.append({"id": "job-long", "duration_s": None, "gpus": 1, "command":
                            f"trap 'echo saved > {checkpoint}; exit 0' TERM; "
                            "while :; do sleep 0.05; done"})
    agent = start_agent()
    wait_for(lambda: controller.of("/v1/agent/jobs/next"), what="the job to be pulled")
    time.sleep(0.5)
    assert agent.proc.poll() is None and not checkpoint.exists()
    noticed_at = time.monotonic()
    metadata.aws_notice = {"action": "terminate",
                           "time": (datetime.now(UTC) + timedelta(seconds=60)).isoformat()}
    # The controller never orders a drain: the notice alone drains the node.
    assert agent.wait(timeout=15) == 0
    took = time.monotonic() - noticed_at
    assert checkpoint.read_text().strip() == "saved"
    assert controller.finished["job-long"]["outcome"] == "handed-back"
    beats = controller.heartbeats()
    with_notice = [b for b in beats if b.body.get("notice")]
    assert with_notice and with_notice[0].body["notice"]["source"] == "aws"
    assert beats[-1].body["status"] == "released"
    assert any(f"/{agent.node_id}/latest/" in path for path, _ in metadata.requests)
    assert took < 10, took
