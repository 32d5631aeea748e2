"""Every input has a clear error: a seeded fuzz over policies, snapshots, traces and every API body
(issue 13, finding 3). The guarantee: 0 tracebacks and 0 "internal error" answers.

* policies: ``burst policy validate FILE`` (in-process, typer's runner): exit 0 or 1, never an
  exception, never "internal error while loading";
* snapshots: ``burst plan --snapshot FILE`` (in-process), the planner and the rendering included:
  exit 0 or 2;
* traces: :func:`orchestrator.sim.traces.load_canonical`: a Trace or a TraceError;
* API: every POST body (jobs, agent register / heartbeat / next / finish), the query parameters
  of the read routes and the path parameters (decision and job ids), through the ASGI app (Starlette's TestClient over a SQLite store): never a
  5xx, never a traceback.

The default suite runs :data:`QUICK` cases; the ``long`` run (``pytest -m long``) runs
:data:`LONG` cases and a handful through the ``burst`` entry point. A failure names the kind, the
seed and the case index, which reproduce it.
"""

from __future__ import annotations

import copy
import json
import os
import subprocess
import sys
import traceback
import urllib.parse
import warnings
from collections import Counter
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
import typer
import yaml
from click.testing import CliRunner

from orchestrator.api import create_app
from orchestrator.cli import app
from orchestrator.domain.nodes import NodeState
from orchestrator.sim.traces import TraceError, load_canonical, sample_text
from orchestrator.store import Store
from tests.builders import make_rig
from tests.fuzzing import Mutator
from tests.integration.api_support import add_node, bearer, make_tokens, runtime_of

with warnings.catch_warnings():  # Starlette's notice about its httpx dependency, not ours
    warnings.simplefilter("ignore")
    from starlette.testclient import TestClient

ROOT = Path(__file__).resolve().parents[2]
POLICIES = [ROOT / "policies/examples/default.yaml", ROOT / "policies/examples/multi-project.yaml"]
POLICY_TEXTS = [p.read_bytes() for p in POLICIES]
POLICY_DATA = [yaml.safe_load(t) for t in POLICY_TEXTS]
T0 = datetime(2026, 11, 30, 3, 0, tzinfo=UTC)


def _iso(moment: datetime) -> str:
    return moment.isoformat().replace("+00:00", "Z")


def _snapshot() -> dict:
    """A snapshot using every part of the format, valid, as the mutations' starting point."""
    data = json.loads((ROOT / "policies/snapshots/spike.json").read_text())
    data["queues"]["gpu"]["onprem_releases"] = [{"gpus": 1, "ends_at": _iso(T0 + timedelta(minutes=20))}]
    data["nodes"] = [{
        "id": f"default-{i}", "policy": "default", "pool": "gpu", "provider": "local",
        "offering_key": "local/local/local-a/local.4gpu/spot", "instance_type": "local.4gpu",
        "market": "spot", "gpus": 4, "price_usd_hour": 4.1, "state": state,
        "state_since": _iso(T0 - timedelta(minutes=5)), "created_at": _iso(T0 - timedelta(minutes=8)),
        "request_id": f"r-{i}", "instance_id": f"lcl-{i}", "project": "research",
        "gpus_busy": busy, "running_jobs": 1 if busy else 0,
        "idle_since": None if busy else _iso(T0 - timedelta(minutes=30)),
        "last_heartbeat": _iso(T0 - timedelta(seconds=20)), "budget_commit_usd": 3.5,
    } for i, (state, busy) in enumerate([("ready", 0), ("ready", 2), ("booting", 0),
                                          ("draining", 0)])]
    data["nodes"][3]["drain_deadline"] = _iso(T0 + timedelta(minutes=10))
    data["offerings"].append({"provider": "local", "region": "local", "zone": "local-a",
                              "instance_type": "local.4gpu", "market": "spot", "gpus": 4,
                              "price_usd_hour": 4.1, "billing": {"minimum_s": 60, "increment_s": 1}})
    data["capacity_blocks"] = [{"offering_key": "local/local/local-a/local.8gpu/on-demand",
                                "until": _iso(T0 + timedelta(minutes=3)), "reason": "capacity"}]
    data["memory"] = {"default": {"trigger_since": _iso(T0 - timedelta(minutes=10)),
                                  "last_launch_at": _iso(T0 - timedelta(minutes=30))}}
    data["prewarm"] = {"gpu": {"gpus": 8, "until": _iso(T0 + timedelta(hours=1))}}
    data["budget_spend"] = {"default/monthly": {"spent_usd": "12.5", "burn_usd_hour": "4.1",
                                                "window_start": "2026-11-01T00:00:00Z",
                                                "window_end": "2026-12-01T00:00:00Z"}}
    return data


SNAPSHOT = _snapshot()
SNAPSHOT_TEXT = json.dumps(SNAPSHOT, indent=1).encode()
TRACE_TEXT = "".join(sample_text().splitlines(keepends=True)[:25])
TRACE_DATA = [line.split(",") for line in TRACE_TEXT.splitlines()]

# Case counts per kind (policy, snapshot, trace, api).
QUICK = {"policy": 90, "snapshot": 90, "trace": 40, "api": 90}
LONG = {"policy": 2200, "snapshot": 2200, "trace": 2400, "api": 3200}
BAD_WORDS = ("Traceback", "internal error")
COMMAND = typer.main.get_command(app)  # built once: typer rebuilds the whole CLI per invoke


class Fuzz:
    """Runs cases of each kind and collects what went wrong, by kind."""

    def __init__(self, tmp_path: Path, seed: int):
        self.tmp = tmp_path
        self.seed = seed
        self.runner = CliRunner()
        self.failures: list[str] = []
        self.cases: Counter[str] = Counter()
        self.outcomes: Counter[str] = Counter()
        self._api: Callable[[Mutator, int], None] | None = None

    def fail(self, kind: str, index: int, what: str) -> None:
        self.failures.append(f"{kind} seed={self.seed} case={index}: {what[:1500]}")

    def cli(self, kind: str, index: int, args: list[str], codes: set[int]) -> None:
        result = self.runner.invoke(COMMAND, args)
        text = result.output + (result.stderr if result.stderr_bytes is not None else "")
        if result.exception is not None and not isinstance(result.exception, SystemExit):
            where = "".join(traceback.format_tb(result.exc_info[2])[-3:]) if result.exc_info else ""
            self.fail(kind, index, f"{type(result.exception).__name__}: {result.exception}\n{where}")
        elif result.exit_code not in codes:
            self.fail(kind, index, f"exit {result.exit_code}: {text}")
        elif any(word in text for word in BAD_WORDS):
            self.fail(kind, index, text)
        self.outcomes[f"{kind}:exit{result.exit_code}"] += 1

    # -- the kinds -------------------------------------------------------------------------------

    def policy(self, m: Mutator, index: int) -> None:
        which = m.rng.randrange(len(POLICIES))
        if m.rng.random() < 0.5:
            data = m.data(POLICY_DATA[which])
            text = yaml.safe_dump(data, allow_unicode=m.rng.random() < 0.5, sort_keys=False).encode()
        else:
            text = m.text(POLICY_TEXTS[which])
        path = self.tmp / f"p{index % 8}.yaml"
        path.write_bytes(text)
        self.cli("policy", index, ["policy", "validate", str(path)], {0, 1})

    def snapshot(self, m: Mutator, index: int) -> None:
        if m.rng.random() < 0.6:
            text = json.dumps(m.data(SNAPSHOT), ensure_ascii=m.rng.random() < 0.5).encode()
        else:
            text = m.text(SNAPSHOT_TEXT)
        path = self.tmp / f"s{index % 8}.json"
        path.write_bytes(text)
        args = ["plan", "--snapshot", str(path), "--policy", str(m.rng.choice(POLICIES))]
        if m.rng.random() < 0.5:
            args.append("--json")
        self.cli("snapshot", index, args, {0, 2})

    def trace(self, m: Mutator, index: int) -> None:
        if m.rng.random() < 0.5:
            rows = m.data(TRACE_DATA)
            text = "\n".join(",".join(str(c) for c in (row if isinstance(row, list) else [row]))
                             for row in (rows if isinstance(rows, list) else [rows])).encode(
                                 "utf-8", "surrogatepass")
        else:
            text = m.text(TRACE_TEXT.encode())
        path = self.tmp / f"t{index % 8}.csv"
        path.write_bytes(text)
        try:
            load_canonical(path)
            self.outcomes["trace:ok"] += 1
        except TraceError as exc:
            self.outcomes["trace:refused"] += 1
            if any(word in str(exc) for word in BAD_WORDS) or not str(exc).startswith(str(path)):
                self.fail("trace", index, str(exc))
        except Exception as exc:  # noqa: BLE001 - the oracle: anything else is a crash
            self.fail("trace", index, f"{type(exc).__name__}: {exc}")

    def api(self, m: Mutator, index: int) -> None:
        assert self._api is not None
        self._api(m, index)

    def run(self, counts: dict[str, int]) -> None:
        kinds = [kind for kind, n in counts.items() for _ in range(n)]
        for index, kind in enumerate(kinds):
            m = Mutator(self.seed * 1_000_003 + index)
            self.cases[kind] += 1
            getattr(self, kind)(m, index)


def api_fuzzer(fuzz: Fuzz, client: TestClient, admin: str, credential: str, node_id: str):
    """Mutated bodies for every POST route, and mutated query parameters for the read routes."""
    job = {"project": "research", "gpus": 2, "duration": "30m", "priority": 1,
           "command": "echo hi", "pool": "gpu"}
    beat = {"node_id": node_id, "status": "busy", "job_id": "j-1", "fabric_state": "joined",
            "fabric_error": None, "notice": {"source": "aws", "action": "terminate",
                                             "deadline": "2026-11-30T03:10:00Z"},
            "drain_report": {"released": True}}
    routes = [
        ("/v1/jobs", job, admin),
        ("/v1/agent/register", {"node_id": node_id, "join_token": "bjt_x", "gpus": 4,
                                "gpu_model": "A100", "hostname": "h", "pid": 7,
                                "gpu_inventory": [{"index": 0, "name": "A100"}],
                                "gpu_source": "nvidia-smi"}, None),
        ("/v1/agent/heartbeat", beat, credential),
        ("/v1/agent/jobs/next", {"node_id": node_id, "free_gpus": 4}, credential),
        ("/v1/agent/jobs/j-1/finish", {"node_id": node_id, "outcome": "done", "exit_code": 0},
         credential),
    ]
    queries = [("/v1/costs", {"from": "2026-11-01T00:00:00Z", "to": "2026-12-01T00:00:00Z",
                              "group_by": "project", "pool": "gpu"}),
               ("/v1/decisions", {"since": "2026-11-01T00:00:00Z", "limit": "5"}),
               ("/v1/nodes", {"state": "ready", "project": "research", "limit": "10"}),
               ("/v1/queue", {"state": "pending", "project": "research"})]

    def one(m: Mutator, index: int) -> None:
        roll = m.rng.random()
        if roll < 0.1:  # path parameters of the routes that take one
            segment = urllib.parse.quote(str(m.nasty() if m.rng.random() < 0.8 else "j-1"), safe="")
            method, path = m.rng.choice([("GET", "/v1/decisions/{}"), ("DELETE", "/v1/jobs/{}"),
                                         ("POST", "/v1/agent/jobs/{}/finish")])
            path = path.format(segment)
            body = {"node_id": node_id, "outcome": "failed"} if method == "POST" else None
            secret = credential if method == "POST" else admin
            response = client.request(method, path, json=body, headers=bearer(secret))
        elif roll < 0.75:
            path, body, secret = m.rng.choice(routes)
            headers = bearer(secret) if secret else {}
            if m.rng.random() < 0.7:
                response = client.post(path, json=m.data(body), headers=headers)
            else:
                raw = m.text(json.dumps(body).encode())
                response = client.post(path, content=raw,
                                       headers={**headers, "content-type": "application/json"})
        else:
            path, params = m.rng.choice(queries)
            mutated = m.data(params)
            if not isinstance(mutated, dict):
                mutated = {"x": mutated}
            flat = {str(k): json.dumps(v) if isinstance(v, (list, dict)) else str(v)
                    for k, v in mutated.items()}
            response = client.get(path, params=flat, headers=bearer(admin))
        fuzz.outcomes[f"api:{response.status_code}"] += 1
        if response.status_code >= 500 or any(w in response.text for w in BAD_WORDS):
            fuzz.fail("api", index, f"{path} -> {response.status_code}: {response.text}")

    return one


def run_fuzz(tmp_path: Path, seed: int, counts: dict[str, int]) -> Fuzz:
    fuzz = Fuzz(tmp_path, seed)
    store = Store(f"sqlite:///{tmp_path / 'burst.db'}")
    store.upgrade()
    try:
        rig = make_rig(store)
        runtime = runtime_of(rig, tmp_path)
        tokens = make_tokens(store, rig)
        node = add_node(rig, 1, "research", NodeState.BOOTING)
        join_token = rig.tokens.issue(node.id, node.request_id, node.created_at)[0]
        with TestClient(create_app(runtime), raise_server_exceptions=False) as client:
            registered = client.post("/v1/agent/register",
                                     json={"node_id": node.id, "join_token": join_token, "gpus": 4})
            assert registered.status_code == 200, registered.text
            fuzz._api = api_fuzzer(fuzz, client, tokens.admin, registered.json()["credential"],
                                   node.id)
            fuzz.run(counts)
    finally:
        store.close()
    return fuzz


def report(fuzz: Fuzz) -> str:
    return (f"{sum(fuzz.cases.values())} cases {dict(fuzz.cases)}, {len(fuzz.failures)} "
            f"failures; outcomes {dict(sorted(fuzz.outcomes.items()))}")


def test_fuzz_inputs_quick(tmp_path: Path) -> None:
    fuzz = run_fuzz(tmp_path, 13, QUICK)
    assert sum(fuzz.cases.values()) >= 300
    assert not fuzz.failures, "\n".join(fuzz.failures[:20]) + "\n" + report(fuzz)


@pytest.mark.long
def test_fuzz_inputs_10k(tmp_path: Path) -> None:
    fuzz = run_fuzz(tmp_path, 2026, LONG)
    print(report(fuzz))
    assert sum(fuzz.cases.values()) >= 10_000
    assert not fuzz.failures, "\n".join(fuzz.failures[:20]) + "\n" + report(fuzz)


@pytest.mark.long
def test_fuzz_inputs_through_the_entry_point(tmp_path: Path) -> None:
    """A handful of the mutated files through the real ``burst`` command: one error line per
    problem naming the file, a nonzero exit, no traceback."""
    burst = Path(sys.executable).parent / "burst"
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    cases = [("p.yaml", POLICY_TEXTS[0].replace(b"name: default", b"name: d\xffx", 1),
              ["policy", "validate"]),
             ("p.yaml", POLICY_TEXTS[0] + b"x: " + b"[" * 3000 + b"\n", ["policy", "validate"]),
             ("s.json", SNAPSHOT_TEXT.replace(b'"gpus": 8', b'"gpus": ' + b"9" * 5000, 1),
              ["plan", "--snapshot"]),
             ("s.json", b"[" * 5000, ["plan", "--snapshot"]),
             ("s.json", SNAPSHOT_TEXT.replace(b"02:52:00Z", b"02:52:00", 1), ["plan", "--snapshot"])]
    for name, data, args in cases:
        path = tmp_path / name
        path.write_bytes(data)
        done = subprocess.run([str(burst), *args, str(path)], capture_output=True, text=True,
                              env=env, timeout=120, check=False)
        assert done.returncode in (1, 2), (args, done.stdout, done.stderr)
        assert "Traceback" not in done.stderr and "internal error" not in done.stderr
        assert all(line.startswith(str(path)) for line in done.stderr.splitlines()), done.stderr


def test_a_case_is_reproduced_by_its_seed() -> None:
    first, again = Mutator(7), Mutator(7)
    assert first.data(copy.deepcopy(SNAPSHOT)) == again.data(copy.deepcopy(SNAPSHOT))
    assert first.text(SNAPSHOT_TEXT) == again.text(SNAPSHOT_TEXT)
