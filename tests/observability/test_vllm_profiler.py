"""vLLM's own profiler, driven by ``trace.vllm_profile_step`` (vime.observability.step_trace).

A server launched with ``engine.profiler_dir`` serves ``/start_profile`` and
``/stop_profile``; :class:`StepTrace` calls them around the chosen step and the server
writes torch profiler traces (CPU here) into that folder. A server without a profiler
(the session's shared one) makes the key fail when the run starts, naming it and the fix.
"""

from __future__ import annotations

import gzip
import json
import time
import urllib.request

import pytest

from vime.errors import ConfigError
from vime.observability.config import TraceConfig
from vime.observability.step_trace import StepTrace

pytestmark = [pytest.mark.engine, pytest.mark.slow]


def _complete(url: str, model: str) -> None:
    body = json.dumps({"model": model, "prompt": "1 2 3", "max_tokens": 8}).encode()
    request = urllib.request.Request(
        f"{url}/v1/completions", data=body, headers={"Content-Type": "application/json"}
    )
    with urllib.request.urlopen(request, timeout=120) as answer:
        assert json.loads(answer.read())["choices"][0]["text"] is not None


def test_profile_step_writes_vllm_torch_traces(tiny_model_dir, tmp_path):
    from vime.engine import EngineConfig, VLLMServer

    profile_dir = tmp_path / "profile"
    config = EngineConfig(
        model=str(tiny_model_dir), profiler_dir=str(profile_dir), log_dir=str(tmp_path)
    )
    with VLLMServer(config) as server:
        tracing = StepTrace(tmp_path, TraceConfig(vllm_profile_step=2), [server.url])
        tracing.begin(1)  # not the profiled step: nothing starts
        assert not profile_dir.exists() or not any(profile_dir.iterdir())
        tracing.begin(2)
        _complete(server.url, server.model_name)
        t0 = time.perf_counter()
        tracing.end(2)
        stop_s = time.perf_counter() - t0
    traces = sorted(profile_dir.glob("*.pt.trace.json.gz"))
    assert traces, sorted(p.name for p in profile_dir.iterdir())
    events = json.loads(gzip.decompress(traces[0].read_bytes()))["traceEvents"]
    assert len(events) > 100
    print(f"vLLM profiler: /stop_profile took {stop_s:.1f} s; {len(traces)} trace files")


def test_profile_step_on_a_server_without_profiler_names_the_key(vllm_server, tmp_path):
    with pytest.raises(ConfigError, match=r"trace.vllm_profile_step: .*engine.profiler_dir"):
        StepTrace(tmp_path, TraceConfig(vllm_profile_step=1), [vllm_server.url])
