"""``vime-agent serve``: start a vLLM server for a model folder and keep it up until Ctrl-C.

Any :class:`~vime.engine.EngineConfig` field can be set as ``key=value``; ``model=tiny``
(the default) serves the tiny local model, building it first if needed.

Example:
    $ vime-agent serve model=tiny port=8000 dtype=bfloat16
    vLLM ready in 24.1 s: model 'tiny-3ded8b65abbf', log /tmp/vime-vllm-x/vllm-8000.log
    OpenAI base URL: http://127.0.0.1:8000/v1
    http://127.0.0.1:8000
"""

from __future__ import annotations

import dataclasses
import signal
import sys
import time

from vime.config import apply_overrides
from vime.engine.config import EngineConfig

USAGE = """usage: vime-agent serve [key=value ...]

Start a vLLM server and keep it running until Ctrl-C. The last line printed is its URL.
model=tiny (default) serves the tiny local model. Keys (EngineConfig):
"""


def main(argv: list[str] | None = None) -> int:
    """Run ``vime-agent serve``; returns the exit code (0 after Ctrl-C)."""
    argv = list(sys.argv[1:] if argv is None else argv)
    if any(a in ("-h", "--help") for a in argv):
        defaults = EngineConfig()
        keys = [f.name for f in dataclasses.fields(EngineConfig)]
        print(USAGE + "".join(f"  {k}={getattr(defaults, k)!r}\n" for k in keys), end="")
        return 0
    cfg = apply_overrides(EngineConfig(), argv)
    if not cfg.url:
        from vime.models.tiny import resolve_model

        cfg = dataclasses.replace(cfg, model=resolve_model(cfg.model))

    from vime.engine.server import VLLMServer

    server = VLLMServer(cfg)
    # Ctrl-C and `kill` both stop the server cleanly (and a background job started from a
    # script, where SIGINT is ignored, still answers SIGINT).
    signal.signal(signal.SIGINT, signal.default_int_handler)
    signal.signal(signal.SIGTERM, _raise_interrupt)
    try:
        server.start()
        how = f"in {server.startup_s:.1f} s" if server.startup_s is not None else "(attached)"
        print(f"vLLM ready {how}: model {server.model_name!r}, log {server.log_path}", flush=True)
        print(f"OpenAI base URL: {server.openai_base_url}", flush=True)
        print(server.url, flush=True)
        while server.running:
            time.sleep(1.0)
        print(
            f"vime-agent serve: error: the vLLM server at {server.url} went away; "
            f"log tail:\n{server.log_tail()}",
            file=sys.stderr,
        )
        return 1
    except KeyboardInterrupt:
        return 0
    finally:
        server.stop()


def _raise_interrupt(signum: int, frame: object) -> None:
    raise KeyboardInterrupt
