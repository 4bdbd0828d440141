"""vime's vLLM plugin: inert by default; when vime's launcher asks, waiting readers sleep,
and seeded requests survive a chunked prefill on CPU (vime.engine.cpu_seed_rewind)."""

from __future__ import annotations

import json
import os
import time
import urllib.request
from concurrent.futures import ThreadPoolExecutor

import pytest

from vime.engine import cpu_eager_ranks, cpu_fork, cpu_seed_rewind, vllm_plugin


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
    assert cpu[cpu_seed_rewind.ENV] == "1"  # seeded requests survive a chunked prefill
    assert cpu[cpu_eager_ranks.ENV] == "1"  # no C++ build at the first log-probs request
    gpu = VLLMServer(EngineConfig(model="/m", device="cuda")).environment()
    assert vllm_plugin.ENV not in gpu and cpu_seed_rewind.ENV not in gpu
    assert cpu_eager_ranks.ENV not in gpu
    off = VLLMServer(EngineConfig(model="/m", device="cpu", spin_sleep_us=0)).environment()
    assert vllm_plugin.ENV not in off
    monkeypatch.setenv("VLLM_PLUGINS", "lora_filesystem_resolver")
    allow = VLLMServer(EngineConfig(model="/m", device="cpu")).environment()
    assert allow["VLLM_PLUGINS"] == f"lora_filesystem_resolver,{vllm_plugin.NAME}"


def test_ranks_are_counted_without_compile(monkeypatch):
    """Through the plugin, the sampler's rank count is plain torch: the same counts as
    vLLM's compiled one, with no C++ build at the first log-probs request."""
    import torch

    sampler = pytest.importorskip("vllm.v1.sample.sampler")
    compiled = sampler.batched_count_greater_than
    monkeypatch.setattr(sampler, "batched_count_greater_than", compiled)  # restored after
    monkeypatch.setenv(cpu_eager_ranks.ENV, "1")  # as the launcher sets it for CPU servers
    vllm_plugin.register()  # as vLLM loads the plugin in its processes
    count = sampler.batched_count_greater_than
    assert count is not compiled and not hasattr(count, "_torchdynamo_orig_callable")
    logits = torch.tensor([[0.1, 0.5, 0.3, 0.3], [2.0, 1.0, 3.0, -1.0]])
    sampled = torch.tensor([[0.3], [3.0]])
    assert count(logits, sampled).tolist() == [3, 1]  # ties count, as vLLM's >= does


def _complete(url: str, model: str, prompt: list[int], seed: int) -> list[int]:
    body = {"model": model, "prompt": prompt, "max_tokens": 8, "temperature": 1.0, "seed": seed}
    body["return_token_ids"] = True
    request = urllib.request.Request(
        url + "/v1/completions", json.dumps(body).encode(), {"Content-Type": "application/json"}
    )
    with urllib.request.urlopen(request, timeout=120) as reply:
        return list(json.loads(reply.read())["choices"][0]["token_ids"])


@pytest.mark.engine
def test_seeded_requests_survive_a_chunked_prefill(tiny_model_dir, tmp_path):
    """vllm-cpu with a 64-token step budget chunks every 300-token prefill; eight seeded
    requests at once used to kill the engine ("CPU Generator does not use offset"). Now
    they are served, the same seeds give the same tokens again, and the engine lives."""
    from vime.engine import EngineConfig, VLLMServer

    extra = ["--max-num-batched-tokens", "64", "--max-num-seqs", "8"]
    config = EngineConfig(
        model=str(tiny_model_dir), max_model_len=512, log_dir=str(tmp_path), extra_args=extra
    )
    server = VLLMServer(config)
    server.start()
    try:
        prompt = [(7 * i) % 400 + 20 for i in range(300)]
        rounds = []
        for _ in range(2):
            with ThreadPoolExecutor(8) as pool:
                jobs = [
                    pool.submit(_complete, server.url, server.model_name, prompt, seed)
                    for seed in range(8)
                ]
                rounds.append([job.result() for job in jobs])
        assert rounds[0] == rounds[1] and all(len(ids) == 8 for ids in rounds[0])
        assert len({tuple(ids) for ids in rounds[0]}) > 1  # eight seeds, not one draw
        with urllib.request.urlopen(server.url + "/health", timeout=10) as reply:
            assert reply.status == 200
    finally:
        server.stop()
    assert "CPU Generator does not use offset" not in "".join(
        p.read_text(errors="replace") for p in tmp_path.glob("*.log")
    )


def test_cpu_engine_processes_are_forked_and_the_worker_bound(vllm_server):
    """A launched CPU server's engine core and worker are forks of its API server where
    vLLM binds its worker to one core (vime.engine.cpu_fork), and the forked worker is
    bound to that core as a spawned one is. The server log tells the fork: the API server
    says so, and neither child loads vime's plugin afresh, which a spawned one (a new
    interpreter) does, with its own ``vime:`` lines (checked by hand with
    ``VIME_VLLM_CPU_FORK=0``: 3 lines each, and the worker bound to core 0 either way)."""
    psutil = pytest.importorskip("psutil")
    if vllm_server.external or vllm_server.log_path is None:
        pytest.skip("an attached server: vime did not launch it")
    lines = vllm_server.log_path.read_text(errors="replace").splitlines()
    if not any(cpu_fork.FORKED in line for line in lines):
        pytest.skip("vLLM binds this machine's worker to several cores: spawned, as vLLM does")
    assert any("(APIServer" in line and cpu_fork.FORKED in line for line in lines)
    fresh = [line for line in lines if "vime:" in line and "(APIServer" not in line]
    assert fresh == []
    assert any("(EngineCore" in line for line in lines)  # the engine core logged at all
    children = psutil.Process(vllm_server.pid).children(recursive=True)
    workers = [p for p in children if "Worker" in p.name()]  # vLLM titles it VLLM::Worker
    assert len(workers) == 1, [(p.pid, p.name(), p.cmdline()) for p in children]
    bound = {tuple(sorted(os.sched_getaffinity(t.id))) for t in workers[0].threads()}
    assert len(bound) == 1 and len(next(iter(bound))) == 1, bound  # all on one same core
