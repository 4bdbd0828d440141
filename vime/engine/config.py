"""``EngineConfig``: how to launch (or where to find) one vLLM server.

The defaults are right for a CPU machine running the tiny model: float32 (faithful
logprobs), a 1 GiB KV cache, logprobs of the distribution actually sampled from, and
dev mode so that weights can be reloaded and generation paused over HTTP.

Example:
    >>> from vime.config import apply_overrides
    >>> cfg = apply_overrides(EngineConfig(), ["model=/tmp/tiny", "max_model_len=512"])
    >>> (cfg.model, cfg.max_model_len, cfg.port)
    ('/tmp/tiny', 512, 0)
"""

from __future__ import annotations

from dataclasses import dataclass, field

from vime.config import require, require_choice

DTYPES = ("float32", "bfloat16", "float16", "auto")
LOGPROBS_MODES = ("processed_logprobs", "raw_logprobs", "processed_logits", "raw_logits")
DEVICES = ("auto", "cpu", "cuda")


@dataclass
class EngineConfig:
    """One vLLM server. Give ``model`` (a folder) to launch one, or ``url`` to attach.

    Fields:
        model: HF-format model folder (or a hub id already in the local HF cache).
        url: attach to this running server instead of launching (never killed by vime).
        host, port: where to listen; port 0 picks a free port.
        dtype: weights/activations dtype; float32 gives logprobs that match the trainer
            to ~1e-7 on CPU, bfloat16 to ~1e-3.
        max_model_len: context length (prompt + completion) in tokens.
        kv_cache_gib: KV cache size (``VLLM_CPU_KVCACHE_SPACE`` on CPU,
            ``--kv-cache-memory-bytes`` on GPU unless ``gpu_memory_utilization`` is set).
        logprobs_mode: which logprobs vLLM returns; processed_logprobs = after temperature
            / top-p, i.e. of the distribution actually sampled from.
        dev_mode: ``VLLM_SERVER_DEV_MODE=1`` (/collective_rpc, /pause, /resume,
            /reset_prefix_cache, /update_weight_version ...), needed for weight updates.
        startup_timeout_s: seconds :meth:`VLLMServer.wait_ready` waits for the server to come up.
        seed: vLLM's global seed.
        served_model_name: the name clients pass as ``model``; default: the folder's name.
        extra_args: more ``vllm serve`` flags, appended verbatim.
        log_dir: where the server log goes; default: a fresh temporary folder.
        device: auto (cpu when the vllm-cpu distribution is installed), cpu or cuda.
        gpu_memory_utilization: GPU only; when > 0 it sizes the KV cache instead of kv_cache_gib.
        omp_threads: CPU only; 0 = vLLM's own core binding, N = N unbound OpenMP threads.
        spin_sleep_us: CPU only; vLLM's engine core and worker sleep this long per poll
            while they wait for each other, instead of spinning on a core the API server
            and the collector need (:mod:`vime.engine.vllm_plugin`); 0 = vLLM's spinning.
        python: interpreter that runs the server; default: the current one.
        env: extra environment variables for the server process.
        profiler_dir: launch with vLLM's torch profiler writing here (``/start_profile``,
            ``/stop_profile``; the train key ``trace.vllm_profile_step`` drives them).
        api_key: the engine's API key. An attached engine (``url``): the key it requires
            (its ``--api-key``), sent on every request. A launched one requires it on every
            route but ``/health`` and ``/metrics`` (:mod:`vime.engine.vllm_auth`); ''
            launches it open. A training run's launched engines always require one: this
            key, or a fresh random one per run when '' (``Ranks.engine_fleet``). Saved in
            the run's config.yaml like every key.
    """

    model: str = ""
    url: str = ""
    host: str = "127.0.0.1"
    port: int = 0
    dtype: str = "float32"
    max_model_len: int = 1024
    kv_cache_gib: float = 1.0
    logprobs_mode: str = "processed_logprobs"
    dev_mode: bool = True
    startup_timeout_s: float = 240.0
    seed: int = 0
    served_model_name: str = ""
    extra_args: list[str] = field(default_factory=list)
    log_dir: str = ""
    device: str = "auto"
    gpu_memory_utilization: float = 0.0
    omp_threads: int = 0
    spin_sleep_us: int = 50
    python: str = ""
    env: dict[str, str] = field(default_factory=dict)
    profiler_dir: str = ""
    api_key: str = ""

    def __post_init__(self) -> None:
        require_choice(self.dtype, "engine.dtype", DTYPES)
        require_choice(self.logprobs_mode, "engine.logprobs_mode", LOGPROBS_MODES)
        require_choice(self.device, "engine.device", DEVICES)
        require(0 <= self.port <= 65535, "engine.port", f"must be in 0..65535, got {self.port}")
        require(self.max_model_len > 0, "engine.max_model_len", "must be > 0")
        require(self.kv_cache_gib > 0, "engine.kv_cache_gib", "must be > 0")
        require(self.startup_timeout_s > 0, "engine.startup_timeout_s", "must be > 0")
        require(
            0.0 <= self.gpu_memory_utilization <= 1.0,
            "engine.gpu_memory_utilization",
            "must be in [0, 1] (0 = use kv_cache_gib)",
        )
        require(self.omp_threads >= 0, "engine.omp_threads", "must be >= 0 (0 = vLLM's binding)")
        require(self.spin_sleep_us >= 0, "engine.spin_sleep_us", "must be >= 0 (0 = spin)")
        require(
            not self.url or self.url.startswith(("http://", "https://")),
            "engine.url",
            f"must start with http:// or https://, got {self.url!r}",
        )
        require(
            all(isinstance(a, str) for a in self.extra_args),
            "engine.extra_args",
            "must be a list of strings",
        )
