"""BURST_LOG_FORMAT=json: one JSON object a line, with the ids bound around the code that logs."""

from __future__ import annotations

import io
import json
import logging
import threading

import pytest

from orchestrator.logs import JsonFormatter, LogFormat, formatter, log_context, setup_logging
from orchestrator.wiring import Settings


def lines(emit) -> list[dict]:
    stream = io.StringIO()
    handler = logging.StreamHandler(stream)
    handler.setFormatter(JsonFormatter())
    logger = logging.getLogger("burst.test.logs")
    logger.addHandler(handler)
    logger.setLevel(logging.DEBUG)
    try:
        emit(logger)
    finally:
        logger.removeHandler(handler)
    return [json.loads(line) for line in stream.getvalue().splitlines()]


def test_each_record_is_one_object_with_time_level_logger_and_message():
    [line] = lines(lambda log: log.warning("launch of %s\nfailed", "n-1"))
    assert line["level"] == "WARNING" and line["logger"] == "burst.test.logs"
    assert line["message"] == "launch of n-1\nfailed"  # a newline stays inside the one line
    assert line["time"].endswith("+00:00")
    assert set(line) == {"time", "level", "logger", "message"}


def test_bound_ids_and_extra_ids_are_written_and_extra_wins():
    def emit(log):
        with log_context(policy="gpu-pool", node="n-1"):
            log.info("inside")
            with log_context(decision="d-9"):
                log.info("nested", extra={"node": "n-2", "job": "j-3"})
        log.info("outside")

    inside, nested, outside = lines(emit)
    assert (inside["policy"], inside["node"]) == ("gpu-pool", "n-1") and "decision" not in inside
    assert nested | {} == nested and (nested["node"], nested["job"], nested["decision"]) == (
        "n-2", "j-3", "d-9")
    assert "policy" not in outside and "node" not in outside


def test_each_thread_sees_only_its_own_ids():
    seen: dict[str, dict] = {}

    def worker(name: str) -> None:
        with log_context(node=name):
            barrier.wait()
            seen[name] = lines(lambda log: log.info("x"))[0]

    barrier = threading.Barrier(2)
    threads = [threading.Thread(target=worker, args=(n,)) for n in ("a", "b")]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert seen["a"]["node"] == "a" and seen["b"]["node"] == "b"


def test_an_exception_is_written_inside_the_line():
    def emit(log):
        try:
            raise RuntimeError("boom")
        except RuntimeError:
            log.exception("failed")

    [line] = lines(emit)
    assert "RuntimeError: boom" in line["exc"]


def test_unknown_ids_and_formats_are_refused():
    with pytest.raises(ValueError, match="unknown id"):
        with log_context(pool="x"):
            pass
    with pytest.raises(ValueError, match="expected text or json"):
        formatter("xml")


def test_the_setting_picks_the_format_and_a_bad_value_is_a_settings_error(monkeypatch, capsys):
    monkeypatch.setenv("BURST_LOG_FORMAT", "json")
    assert Settings().log_format is LogFormat.JSON
    setup_logging("INFO", Settings().log_format)
    try:
        with log_context(policy="p"):
            logging.getLogger("burst.test.setup").info("hello")
    finally:
        setup_logging("WARNING", LogFormat.TEXT)
    line = json.loads(capsys.readouterr().err.strip().splitlines()[-1])
    assert line["message"] == "hello" and line["policy"] == "p"
    monkeypatch.setenv("BURST_LOG_FORMAT", "yaml")
    with pytest.raises(ValueError, match="log_format"):
        Settings()


def test_the_node_agent_writes_json_with_its_node_id_and_redacts_its_token(monkeypatch, capsys):
    from orchestrator.fabric import agent

    monkeypatch.setenv("BURST_LOG_FORMAT", "json")
    try:
        agent._setup_logging("n-7", ["bjt_secret"], "INFO")
        agent.log.warning("registering with token %s", "bjt_secret")
    finally:
        agent.log.handlers[:] = []
    [line] = [json.loads(x) for x in capsys.readouterr().err.splitlines()]
    assert line["node"] == "n-7" and line["level"] == "WARNING"
    assert "bjt_secret" not in line["message"]
