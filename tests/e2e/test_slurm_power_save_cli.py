"""`burst slurm resume / suspend / resume-fail`: bad names refused at once, the work handed to a
detached process that logs to the state directory, `--wait --json` for machines. The refusal and
`--wait` (the work in the foreground) run in-process (run_burst_here: exit code and output); the
hand-off starts `burst` with no stdio at all, as slurmctld does. (The whole cycle
with slurmctld calling these programs: tests/e2e/test_slurm_power_save.py.)"""

from __future__ import annotations

import json
import os
import subprocess
import time
from pathlib import Path

import pytest
import yaml

from tests.e2e.helpers import burst_cmd, kill_all, run_burst_here

POLICY = {
    "version": 1, "name": "ps", "cluster": "e2e-ps-cli",
    "pool": {"name": "cloud", "onprem": {"nodes": 1, "gpus_per_node": 4}},
    "queue": {"source": "slurm", "partition": "cloud"},
    "offerings": [{"provider": "local", "region": "local", "instance_type": "local.4gpu",
                   "gpus": 4, "price_usd_hour": 4.1}],
    "limits": {"max_nodes": 2},
    "fabric": {"slurm": {"join": "power-save", "slots": ["cloud-[1-2]"], "feature": "cloud"}},
}


@pytest.fixture
def env(tmp_path: Path):
    policy = tmp_path / "ps.yaml"
    policy.write_text(yaml.safe_dump(POLICY))
    state = tmp_path / "state"
    yield {"BURST_STATE_DIR": str(state), "BURST_POLICY_FILES": json.dumps([str(policy)])}
    kill_all(str(state))


def test_a_name_no_power_save_policy_lists_is_refused_naming_it(env):
    result = run_burst_here("slurm", "resume", "cloud-[2-3]", env=env)
    assert result.returncode == 2
    assert "error: no power-save policy lists cloud-3 in fabric.slurm.slots" in result.stderr
    assert "Traceback" not in result.stderr


def test_the_work_is_handed_off_and_logged_and_wait_json_reports_it(env):
    # As slurmctld may start it: no stdin, stdout or stderr at all.
    closed = subprocess.run(["sh", "-c", 'exec "$0" "$@" <&- >&- 2>&-',
                             *burst_cmd("slurm", "suspend", "cloud-[1-2]")],
                            env={**os.environ, **env}, timeout=120)
    assert closed.returncode == 0
    log = Path(env["BURST_STATE_DIR"]) / "slurm-powersave.log"
    end = time.monotonic() + 60
    while time.monotonic() < end and "slurm-suspend cloud-1, cloud-2" not in (
            log.read_text() if log.exists() else ""):
        time.sleep(0.2)
    assert "held by no burst node" in log.read_text(), log.read_text()

    done = run_burst_here("slurm", "resume-fail", "cloud-2", "--wait", "--json", env=env)
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout) == {"ps": {"launched": {}, "refused": {}, "terminated": {},
                                              "unbound": ["cloud-2"], "decision": None}}
