"""The torch-elastic member's drain hooks and torchrun set-up, without a training job.

The whole elastic cycle on real torch.distributed processes runs in tests/e2e/test_demo_torch.py
(``burst demo --fabric torch``). Here, fast: the HTTP and file checkpoint hooks between the agent's
member and the job's :class:`~orchestrator.fabric.elastic_hooks.ElasticControl`, a job that never
confirms, and the torchrun command and environment that avoid the known pitfalls.
"""

from __future__ import annotations

import json
import socket
import subprocess
import time
from datetime import UTC, datetime, timedelta

import pytest

from orchestrator.fabric.elastic_hooks import ElasticControl
from orchestrator.fabric.torch_node import TorchMember, elastic_env, torchrun_command

pytest.importorskip("torch")  # ElasticControl.poll uses torch tensors


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def spec(hook: str, wait_s: float = 10.0, **extra) -> dict:
    return {"kind": "torch-elastic", "rdzv_endpoint": "127.0.0.1:29400", "run_id": "job",
            "min_nodes": 1, "max_nodes": 3, "nproc_per_node": 1, "entrypoint": ["train.py"],
            "checkpoint_hook": hook, "checkpoint_wait_s": wait_s, "local_addr": "127.0.0.1",
            **extra}


def fake_torchrun(member: TorchMember) -> None:
    """A stand-in for torchrun: a process to stop, and a training status the member can read."""
    member.dir.mkdir(parents=True, exist_ok=True)
    member.started_at = time.time() - 1
    member.proc = subprocess.Popen(["sleep", "60"], start_new_session=True)


def drain(member: TorchMember, control: ElasticControl | None, confirm_step: int | None) -> None:
    deadline = datetime.now(UTC) + timedelta(seconds=30)
    end = time.monotonic() + 20
    while time.monotonic() < end:
        if member.drain_step(deadline):
            return
        if control is not None:
            checkpoint_now, _ = control.poll()  # what the job does every step
            if checkpoint_now and confirm_step is not None:
                control.confirm(confirm_step)
        time.sleep(0.05)
    raise AssertionError("the drain did not finish")


@pytest.mark.parametrize("hook", ["file", "http"])
def test_the_drain_asks_for_a_checkpoint_and_waits_for_the_confirmation(tmp_path, monkeypatch, hook):
    port = free_port()
    member = TorchMember(spec(hook, checkpoint_port=port), tmp_path, node_id="burst-1")
    monkeypatch.setenv("BURST_CHECKPOINT_HOOK", hook)
    monkeypatch.setenv("BURST_CHECKPOINT_PORT", str(port))
    monkeypatch.setenv("LOCAL_RANK", "0")
    fake_torchrun(member)
    control = ElasticControl(str(member.dir))
    control.status(step=41, world_size=2)
    member.poll()
    assert member.state == "joined" and member.busy
    assert control.poll() == (False, False)
    drain(member, control, confirm_step=42)
    assert member.report.confirmed and member.report.checkpoint_step == 42
    assert member.report.ended_by == "release" and member.state == "released"
    assert member.proc.poll() is not None  # torchrun stopped, by signal
    if hook == "file":
        assert json.loads((member.dir / "checkpoint.done").read_text())["step"] == 42


def test_a_job_that_never_confirms_is_stopped_after_the_checkpoint_wait(tmp_path):
    member = TorchMember(spec("file", wait_s=0.5), tmp_path)
    fake_torchrun(member)
    ElasticControl(str(member.dir)).status(step=5, world_size=2)
    began = time.monotonic()
    drain(member, None, confirm_step=None)
    assert 0.5 <= time.monotonic() - began < 8
    assert not member.report.confirmed and member.report.checkpoint_step is None
    assert (member.dir / "checkpoint.request").exists()
    assert member.proc.poll() is not None


def test_torchrun_gets_the_pitfall_free_command_and_environment(tmp_path):
    job = spec("file")
    command = torchrun_command(job, python="/usr/bin/python3")
    assert command[:3] == ["/usr/bin/python3", "-m", "torch.distributed.run"]
    assert "--nnodes=1:3" in command and "--rdzv-backend=c10d" in command
    conf = next(c for c in command if c.startswith("--rdzv-conf="))
    assert "is_host=false" in conf  # the controller hosts the store
    assert "--local-addr=127.0.0.1" in command and command[-1] == "train.py"
    env = elastic_env(job, tmp_path, "burst-1", base={"BURST_JOIN_TOKEN": "secret", "PATH": "/bin"})
    assert env["TORCH_DISABLE_SHARE_RDZV_TCP_STORE"] == "1"  # the scale-up deadlock
    assert env["GLOO_SOCKET_IFNAME"] == "lo" and env["OMP_NUM_THREADS"] == "1"
    assert env["BURST_ELASTIC_DIR"] == str(tmp_path) and "BURST_JOIN_TOKEN" not in env
    other = elastic_env({**job, "local_addr": "10.0.0.5"}, tmp_path, base={})
    assert "GLOO_SOCKET_IFNAME" not in other
    assert "BURST_CHECKPOINT_URI" not in other
    stored = elastic_env({**job, "checkpoint_uri": "s3://ckpt/run"}, tmp_path, base={})
    assert stored["BURST_CHECKPOINT_URI"] == "s3://ckpt/run"
