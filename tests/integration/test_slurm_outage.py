"""The Slurm fabric when slurmctld does not answer (no live Slurm needed: a stand-in ``scontrol``
on PATH plays the controller, the store is real, SQLite and PostgreSQL).

"Unreachable" must never read as "no such node": a departing node would skip its drain and
requeue, and its name would be freed while Slurm still holds it. The clean-up is kept pending and
finished by the reconciler's retry once Slurm answers.
"""

from __future__ import annotations

import os
from datetime import UTC, datetime
from pathlib import Path

import pytest

from orchestrator.domain.nodes import NodeState
from orchestrator.fabric.slurm import SlurmFabric, slurm_scope
from orchestrator.sources.slurm_cli import SlurmCli, SlurmError
from orchestrator.store import Store
from tests.builders import FixedClock, make_node
from tests.slurm_env import slurm_policy

NOW = datetime(2026, 1, 1, tzinfo=UTC)

SCONTROL = """#!/bin/bash
# A stand-in scontrol: its behaviour is read from $MODE_FILE on every call.
mode=$(cat "$MODE_FILE")
echo "$*" >> "$MODE_FILE.calls"
case "$mode" in
  down) echo "slurm_load_node error: Unable to contact slurm controller (connect failure)" >&2; exit 1 ;;
  missing) echo "Node $5 not found" >&2; exit 1 ;;
  up) if [ "$1" = "--future" ]; then echo "NodeName=$5 Arch=x86_64 State=IDLE+DRAIN ThreadsPerCore=1"; fi; exit 0 ;;
esac
"""
SQUEUE = """#!/bin/bash
echo '{"jobs": [], "errors": []}'
"""


@pytest.fixture
def slurm_bin(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    for name, text in (("scontrol", SCONTROL), ("squeue", SQUEUE)):
        (bin_dir / name).write_text(text)
        (bin_dir / name).chmod(0o755)
    mode = tmp_path / "mode"
    mode.write_text("down")
    monkeypatch.setenv("PATH", f"{bin_dir}{os.pathsep}{os.environ['PATH']}")
    monkeypatch.setenv("MODE_FILE", str(mode))
    conf = tmp_path / "slurm.conf"
    conf.write_text("# stand-in\n")
    return tmp_path




def test_node_state_tells_no_such_node_from_an_unreachable_controller(slurm_bin: Path) -> None:
    cli = SlurmCli(str(slurm_bin / "slurm.conf"))
    with pytest.raises(SlurmError, match="Unable to contact"):
        cli.node_state("burst-1")
    (slurm_bin / "mode").write_text("missing")
    assert cli.node_state("burst-1") is None
    (slurm_bin / "mode").write_text("up")
    assert cli.node_state("burst-1") == ("idle", frozenset({"DRAIN"}))


def test_a_node_gone_during_an_outage_keeps_its_name_until_slurm_answers(
        slurm_bin: Path, store: Store) -> None:
    p = slurm_policy(slurm_bin / "slurm.conf")
    fabric = SlurmFabric(store, {p.name: p}, FixedClock(NOW))
    node = make_node("n1", state=NodeState.TERMINATING, policy=p.name)
    store.add_fabric_member(slurm_scope(p), "n1", node.id, NOW)

    assert fabric.node_gone(node, NOW) == 0
    assert store.fabric_member(node.id) is not None, "Slurm may still hold the node: not freed"

    assert fabric.retry_gone({node.id: node}, NOW) == 1  # still down: still held
    assert store.fabric_member(node.id) is not None

    (slurm_bin / "mode").write_text("up")
    assert fabric.retry_gone({node.id: node}, NOW) == 1
    assert store.fabric_member(node.id) is None, "cleaned up and freed once Slurm answered"
    calls = (slurm_bin / "mode.calls").read_text()
    assert "update nodename=n1 state=drain" in calls.lower()
    assert "delete nodename=n1" in calls.lower()
    assert fabric.retry_gone({node.id: node}, NOW) == 0  # nothing left to retry


def test_members_of_live_nodes_are_not_touched_by_the_retry(slurm_bin: Path, store: Store) -> None:
    p = slurm_policy(slurm_bin / "slurm.conf")
    fabric = SlurmFabric(store, {p.name: p}, FixedClock(NOW))
    node = make_node("n2", state=NodeState.READY, policy=p.name)
    store.add_fabric_member(slurm_scope(p), "n2", node.id, NOW)
    assert fabric.retry_gone({node.id: node}, NOW) == 0
    assert store.fabric_member(node.id) is not None
    assert not (slurm_bin / "mode.calls").exists()
