"""Service settings: the generated controller secret is created once, atomically."""

from __future__ import annotations

import stat
import threading

from orchestrator.wiring import Settings


def test_secret_is_generated_once_even_when_many_processes_start_together(tmp_path):
    keys: list[bytes] = []
    barrier = threading.Barrier(16)

    def start() -> None:
        barrier.wait()
        keys.append(Settings(state_dir=tmp_path).secret())

    threads = [threading.Thread(target=start) for _ in range(16)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(keys) == 16 and len(set(keys)) == 1 and len(keys[0]) == 64
    key_file = tmp_path / "secret.key"
    assert stat.S_IMODE(key_file.stat().st_mode) == 0o600
    assert [p.name for p in tmp_path.iterdir()] == ["secret.key"], "no temporary files left"


def test_configured_secret_wins(tmp_path, monkeypatch):
    monkeypatch.setenv("BURST_SECRET_KEY", "from-the-environment")
    assert Settings(state_dir=tmp_path).secret() == b"from-the-environment"
    assert not (tmp_path / "secret.key").exists()
