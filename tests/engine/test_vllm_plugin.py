"""vime's vLLM plugin: inert by default; when vime's launcher asks, waiting readers sleep."""

from __future__ import annotations

import time

import pytest

from vime.engine import vllm_plugin


def test_inert_unless_the_launcher_asks(monkeypatch):
    monkeypatch.delenv(vllm_plugin.ENV, raising=False)
    assert vllm_plugin.register() is False
    monkeypatch.setenv(vllm_plugin.ENV, "0")
    assert vllm_plugin.register() is False


def test_waiting_reader_sleeps_instead_of_yielding(monkeypatch):
    shm = pytest.importorskip("vllm.distributed.device_communicators.shm_broadcast")
    monkeypatch.setattr(shm.SpinCondition, "wait", shm.SpinCondition.wait)  # restored after
    monkeypatch.setenv(vllm_plugin.ENV, "2000")
    assert vllm_plugin.register() is True
    assert vllm_plugin.register() is True  # vLLM may load plugins more than once
    yields: list[int] = []
    monkeypatch.setattr(shm, "sched_yield", lambda: yields.append(1))

    class Reader:  # the fields SpinCondition.wait reads, inside its busy window
        is_reader = True
        busy_loop_s = 1.0
        last_read = time.monotonic()

    start = time.monotonic()
    for _ in range(5):
        shm.SpinCondition.wait(Reader())
    assert time.monotonic() - start >= 5 * 0.002  # slept 2 ms per poll
    assert yields == []  # and never spun
