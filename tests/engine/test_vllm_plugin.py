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


def test_the_launcher_asks_only_cpu_servers_and_keeps_an_allowlist(monkeypatch):
    from importlib.metadata import entry_points

    from vime.engine import EngineConfig, VLLMServer

    assert vllm_plugin.NAME in {ep.name for ep in entry_points(group="vllm.general_plugins")}
    monkeypatch.delenv("VLLM_PLUGINS", raising=False)
    cpu = VLLMServer(EngineConfig(model="/m", device="cpu")).environment()
    assert cpu[vllm_plugin.ENV] == "50" and "VLLM_PLUGINS" not in cpu
    assert vllm_plugin.ENV not in VLLMServer(EngineConfig(model="/m", device="cuda")).environment()
    off = VLLMServer(EngineConfig(model="/m", device="cpu", spin_sleep_us=0)).environment()
    assert vllm_plugin.ENV not in off
    monkeypatch.setenv("VLLM_PLUGINS", "lora_filesystem_resolver")
    allow = VLLMServer(EngineConfig(model="/m", device="cpu")).environment()
    assert allow["VLLM_PLUGINS"] == f"lora_filesystem_resolver,{vllm_plugin.NAME}"
