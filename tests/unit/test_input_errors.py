"""Every input has a clear error (issue 13, finding 3): the inputs that crashed or were accepted
without a word, each now refused by name and position, in-process (no subprocess).

Snapshots (JSON), policies (YAML) and traces (CSV) are read through
:mod:`orchestrator.policy.reading` (size, UTF-8 with a byte offset, NUL, nesting depth, number
length); times need a timezone wherever they are read (:mod:`orchestrator.policy.timefmt`); numbers
and names are checked against :mod:`orchestrator.policy.bounds`.
"""

from __future__ import annotations

import copy
import json
import re
from datetime import datetime
from pathlib import Path

import pytest

from orchestrator.domain.snapshot_json import SnapshotError, load_snapshot, load_snapshot_text
from orchestrator.policy import PolicyError, load_policy, load_policy_text
from orchestrator.policy.reading import InputError, InputKind, decode_input, load_json, read_input
from orchestrator.policy.timefmt import TimeFormatError, parse_aware
from orchestrator.sim.traces import TraceError, load_canonical, parse_canonical

ROOT = Path(__file__).resolve().parents[2]
POLICY = (ROOT / "policies/examples/default.yaml").read_text()
SNAPSHOT = json.loads((ROOT / "policies/snapshots/spike.json").read_text())
NODE = {"id": "default-1f0c9a2b7e", "policy": "default", "pool": "gpu", "provider": "local",
        "offering_key": "local/local/local-a/local.4gpu/spot", "instance_type": "local.4gpu",
        "market": "spot", "gpus": 4, "price_usd_hour": 4.1, "state": "ready",
        "state_since": "2026-11-30T02:55:00Z", "created_at": "2026-11-30T02:52:00Z",
        "request_id": "r-1", "instance_id": "lcl-1", "project": "research",
        "gpus_busy": 0, "running_jobs": 0, "idle_since": "2026-11-30T02:55:00Z",
        "last_heartbeat": "2026-11-30T02:59:00Z"}
HEADER = "job_id,submit_s,duration_s,gpus,project,priority\n"


def snapshot(**changes) -> dict:
    data = copy.deepcopy(SNAPSHOT)
    data["nodes"] = [dict(NODE)]
    data["capacity_blocks"] = [{"offering_key": "local/local/local-a/local.8gpu/on-demand",
                                "until": "2026-11-30T03:03:00Z", "reason": "no capacity"}]
    data["memory"]["default"].update(last_launch_at="2026-11-30T02:40:00Z")
    data.update(changes)
    return data


def snapshot_error(text: str | bytes, tmp_path: Path) -> str:
    path = tmp_path / "s.json"
    path.write_bytes(text if isinstance(text, bytes) else text.encode())
    with pytest.raises(SnapshotError) as caught:
        load_snapshot(path)
    message = str(caught.value)
    assert "Traceback" not in message
    return message


def test_the_complete_snapshot_is_valid() -> None:
    world = load_snapshot_text(json.dumps(snapshot()), "s.json")
    assert world.nodes[0].last_heartbeat is not None and world.capacity_blocks


# -- snapshots: the crashes of finding 3 ---------------------------------------------------------


def test_snapshot_not_utf8_names_the_byte_offset(tmp_path: Path) -> None:
    text = json.dumps(snapshot()).encode()
    bad = text.replace(b'"gpu"', b'"g\xffu"', 1)
    offset = bad.index(b"\xff")
    message = snapshot_error(bad, tmp_path)
    assert f"byte offset {offset}" in message and "not UTF-8" in message
    assert message.startswith(f"{tmp_path / 's.json'}:1:{offset + 1}: ")


def test_snapshot_nested_a_thousand_deep_is_refused(tmp_path: Path) -> None:
    message = snapshot_error('{"taken_at": ' + "[" * 1000 + "]" * 1000 + "}", tmp_path)
    assert re.search(r"s\.json:1:\d+: nested deeper than 32 levels", message)


def test_snapshot_integer_of_5000_digits_is_refused(tmp_path: Path) -> None:
    data = json.dumps(snapshot()).replace('"gpus": 8', '"gpus": ' + "9" * 5000, 1)
    assert "number longer than 40 characters" in snapshot_error(data, tmp_path)


@pytest.mark.parametrize("constant", ["NaN", "Infinity", "-Infinity"])
def test_snapshot_nan_and_infinity_are_not_json(tmp_path: Path, constant: str) -> None:
    data = json.dumps(snapshot()).replace('"duration_s": 7200', f'"duration_s": {constant}', 1)
    assert "is not a JSON number" in snapshot_error(data, tmp_path)


def test_snapshot_nul_byte_is_refused_with_its_position(tmp_path: Path) -> None:
    data = json.dumps(snapshot()).replace("train-llm-1", "train\x00", 1)
    assert "NUL character at byte offset" in snapshot_error(data, tmp_path)


@pytest.mark.parametrize("where", [
    ("nodes", 0, "created_at"), ("nodes", 0, "idle_since"), ("nodes", 0, "last_heartbeat"),
    ("nodes", 0, "state_since"), ("capacity_blocks", 0, "until"),
    ("memory", "default", "trigger_since"), ("memory", "default", "last_launch_at"),
    ("taken_at",), ("queues", "gpu", "pending", 0, "submitted_at"),
])
def test_every_snapshot_time_needs_a_timezone(where: tuple) -> None:
    data = snapshot()
    target = data
    for key in where[:-1]:
        target = target[key]
    target[where[-1]] = "2026-11-30T02:50:00"
    with pytest.raises(SnapshotError) as caught:
        load_snapshot_text(json.dumps(data), "s.json")
    path = ".".join(str(k) for k in where)
    assert f"s.json: {path}: times need a timezone" in str(caught.value)


@pytest.mark.parametrize(("change", "path", "words"), [
    (("queues", "gpu", "pending", 0, "gpus", 4_000_000_000_000), "queues.gpu.pending.0.gpus",
     "must be at most 4096"),
    (("nodes", 0, "gpus", 100_000), "nodes.0.gpus", "must be at most 64"),
    (("offerings", 0, "price_usd_hour", -1), "offerings.0.price_usd_hour", "must be at least 0"),
    (("offerings", 0, "instance_type", "${HOME}"), "offerings.0.instance_type",
     "is not a valid cloud name"),
    (("offerings", 0, "instance_type", "local\x00.4gpu"), "offerings.0.instance_type",
     "is not a valid cloud name"),
    (("nodes", 0, "id", "n 1; rm -rf /"), "nodes.0.id", "is not a valid identifier"),
    (("capacity_blocks", 0, "reason", "a\x1b[31m"), "capacity_blocks.0.reason",
     "no control characters"),
])
def test_snapshot_numbers_and_names_have_bounds(change: tuple, path: str, words: str) -> None:
    data = snapshot()
    target = data
    for key in change[:-2]:
        target = target[key]
    target[change[-2]] = change[-1]
    with pytest.raises(SnapshotError) as caught:
        load_snapshot_text(json.dumps(data), "s.json")
    assert f"s.json: {path}: " in str(caught.value) and words in str(caught.value)


@pytest.mark.parametrize("value", ["1", True, 1.0])
def test_snapshot_numbers_are_strict(value: object) -> None:
    data = snapshot()
    data["queues"]["gpu"]["pending"][0]["gpus"] = value
    with pytest.raises(SnapshotError, match=r"s\.json: queues\.gpu\.pending\.0\.gpus: "):
        load_snapshot_text(json.dumps(data), "s.json")


# -- policies ------------------------------------------------------------------------------------


def policy_problems(text: str | bytes, tmp_path: Path) -> list[str]:
    path = tmp_path / "p.yaml"
    path.write_bytes(text if isinstance(text, bytes) else text.encode())
    with pytest.raises(PolicyError) as caught:
        load_policy(path)
    lines = [str(p) for p in caught.value.problems]
    assert lines and all(re.match(rf"{re.escape(str(path))}:\d+:\d+: ", line) for line in lines)
    assert not any("internal error" in line for line in lines)
    return lines


def test_policy_nested_deeply_is_refused_at_its_position(tmp_path: Path) -> None:
    text = POLICY + "extra: " + "[" * 1000 + "]" * 1000 + "\n"
    line = POLICY.count("\n") + 1
    assert any(p.startswith(f"{tmp_path / 'p.yaml'}:{line}:") and "nested deeper than 32" in p
               for p in policy_problems(text, tmp_path))


def test_policy_nested_block_mappings_are_refused(tmp_path: Path) -> None:
    text = POLICY + "".join(f"{'  ' * i}k{i}:\n" for i in range(200)) + "  " * 200 + "v: 1\n"
    assert any("nested deeper than 32" in p for p in policy_problems(text, tmp_path))


def test_policy_integer_of_5000_digits_is_refused(tmp_path: Path) -> None:
    text = POLICY.replace("max_nodes: 6", "max_nodes: " + "9" * 5000)
    assert any("limits.max_nodes: number longer than 40" in p
               for p in policy_problems(text, tmp_path))


def test_policy_not_utf8_names_the_byte_offset(tmp_path: Path) -> None:
    data = POLICY.encode().replace(b"name: default", b"name: d\xe9fault", 1)
    offset = data.index(b"\xe9")
    (problem,) = policy_problems(data, tmp_path)
    assert f"not UTF-8 text: byte 0xe9 at byte offset {offset}" in problem


def test_policy_nul_byte_is_refused_with_its_position(tmp_path: Path) -> None:
    (problem,) = policy_problems(POLICY.replace("name: default", "name: de\x00fault", 1), tmp_path)
    assert "NUL character at byte offset" in problem


def test_policy_alias_bomb_is_refused(tmp_path: Path) -> None:
    bomb = "a: &a [x, x, x, x, x, x, x, x, x, x]\n"
    for name, ref in zip("bcdef", "abcde", strict=True):
        bomb += f"{name}: &{name} [{', '.join(['*' + ref] * 10)}]\n"
    problems = policy_problems(POLICY + bomb, tmp_path)
    assert any("expands to more than 100000 values" in p for p in problems)


@pytest.mark.parametrize(("old", "new", "words"), [
    ("gpus: 4\n", "gpus: 4000000000000\n", "offerings[0].gpus: Input should be less than or "
     "equal to 64"),
    ("max_nodes: 6", "max_nodes: 1000000", "limits.max_nodes: Input should be less than or equal "
     "to 10000"),
    ("instance_type: local.4gpu", "instance_type: ${HOME}",
     "offerings[0].instance_type: '${HOME}' is not a valid cloud name"),
    ("instance_type: local.4gpu", 'instance_type: "local\\0.4gpu"',
     "offerings[0].instance_type: control character '\\x00'"),
    ("zone: local-a", "zone: local/../a", "offerings[0].zone: 'local/../a' is not a valid cloud"),
    ("price_usd_hour: 4.10", "price_usd_hour: 99999999", "offerings[0].price_usd_hour: Input "
     "should be less than or equal to 10000"),
    ("price_usd_hour: 4.10", "price_usd_hour: .inf", "offerings[0].price_usd_hour: '.inf' is not "
     "a finite number"),
    ("gpus: 4\n", 'gpus: "4"\n', 'offerings[0].gpus: Input should be a valid integer (got "4")'),
    ("gpus: 4\n", "gpus: true\n", "offerings[0].gpus: Input should be a valid integer (got true)"),
])
def test_policy_numbers_and_names_have_bounds(old: str, new: str, words: str) -> None:
    assert old in POLICY
    with pytest.raises(PolicyError) as caught:
        load_policy_text(POLICY.replace(old, new, 1), "p.yaml")
    assert any(words in str(p) and re.match(r"p\.yaml:\d+:\d+: ", str(p))
               for p in caught.value.problems), str(caught.value)


def test_policy_times_need_a_timezone() -> None:
    text = POLICY + ("budgets:\n  - name: b\n    limit_usd: 10\n    window: custom\n"
                     "    period: 24h\n    starts: '2026-01-01T00:00:00'\n")
    with pytest.raises(PolicyError, match=r"budgets\[0\]\.starts: Input should have timezone"):
        load_policy_text(text, "p.yaml")


def test_slurm_slot_ranges_are_bounded() -> None:
    text = POLICY.replace("queue:\n  source: builtin\n", "queue:\n  source: slurm\n") + (
        "fabric:\n  kind: slurm\n  slurm:\n    join: slot\n    slots: ['b-[1-999999999]']\n")
    with pytest.raises(PolicyError, match=r"fabric\.slurm\.slots\[0\]: the slots name more than"):
        load_policy_text(text, "p.yaml")


# -- traces --------------------------------------------------------------------------------------


@pytest.mark.parametrize(("data", "words"), [
    ((HEADER + "a,1,2,1,p\xe9,\n").encode("latin-1"), "not UTF-8 text: byte 0xe9 at byte offset"),
    ((HEADER + "a,1,2,1,\x00,\n").encode(), "NUL character at byte offset"),
    ((HEADER + "a,1,2," + "9" * 5000 + ",,\n").encode(), "t.csv:2: gpus: number longer than 40"),
    ((HEADER + "a,1,2,4000000000000,,\n").encode(), "t.csv:2: gpus: must be at most 4096"),
    ((HEADER + "a,1e400,2,1,,\n").encode(), "t.csv:2: submit_s: must be a number of seconds"),
    ((HEADER + "a,1,3122064000,1,,\n").encode(), "t.csv:2: duration_s: must be a number of "
     "seconds from 0 to 31622400 (a year)"),
    ((HEADER + "${HOME},1,2,1,,\n").encode(), "t.csv:2: job_id: '${HOME}' is not a valid"),
    ((HEADER + 'a,1,2,1,"' + "x" * 200_000 + '",\n').encode(), "t.csv:2: not CSV: field larger"),
])
def test_trace_errors_name_file_and_position(tmp_path: Path, data: bytes, words: str) -> None:
    path = tmp_path / "t.csv"
    path.write_bytes(data)
    with pytest.raises(TraceError) as caught:
        load_canonical(path)
    assert words in str(caught.value) and str(caught.value).startswith(str(path))


# -- the reading module and the one time parser --------------------------------------------------


def test_files_over_the_size_limit_are_refused_before_decoding(tmp_path: Path,
                                                               monkeypatch) -> None:
    monkeypatch.setitem(__import__("orchestrator.policy.reading", fromlist=["MAX_BYTES"]).MAX_BYTES,
                        InputKind.SNAPSHOT, 100)
    path = tmp_path / "big.json"
    path.write_bytes(b" " * 101)
    with pytest.raises(InputError, match="larger than the 0 KiB a snapshot file may be"):
        read_input(path, InputKind.SNAPSHOT)
    with pytest.raises(InputError, match="cannot read: is a directory"):
        read_input(tmp_path, InputKind.SNAPSHOT)
    with pytest.raises(InputError, match="cannot read"):
        read_input(tmp_path / "missing.json", InputKind.SNAPSHOT)


def test_decode_names_line_column_and_byte_offset() -> None:
    with pytest.raises(InputError) as caught:
        decode_input(b'{\n  "a": "\xc3"\n}', "f.json")
    assert str(caught.value) == "f.json:2:9: not UTF-8 text: byte 0xc3 at byte offset 10"


def test_json_strings_with_brackets_do_not_count_as_nesting() -> None:
    assert load_json(json.dumps({"a": "[" * 100, "b": '\\"[[[['}), "f.json")["a"] == "[" * 100


@pytest.mark.parametrize(("text", "words"), [
    ("2026-11-30T03:00:00", "times need a timezone"),
    ("yesterday", "not an ISO 8601 time"),
    ("9" * 100, "longer than 64 characters"),
    ("0001-01-01T00:00:00+01:00", "must lie between 1970-01-01 and 9000-01-01"),
    (12, "not int"),
])
def test_parse_aware_refuses_naming_the_field(text: object, words: str) -> None:
    with pytest.raises(TimeFormatError, match=re.escape(words)) as caught:
        parse_aware(text, "query.since")
    assert str(caught.value).startswith("query.since: ")


def test_parse_aware_reads_z_and_offsets() -> None:
    assert parse_aware("2026-11-30T03:00:00Z", "t") == parse_aware("2026-11-30T04:00:00+01:00", "t")
    assert isinstance(parse_aware(" 2026-11-30T03:00:00.5Z ", "t"), datetime)
