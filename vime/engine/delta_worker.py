"""The engine's side of the delta weight sync: a vLLM worker extension.

vime launches every vLLM server with ``--worker-extension-cls`` naming
:class:`DeltaWorker` (:meth:`vime.engine.server.VLLMServer.command`), which adds these
methods to each vLLM worker, called over ``POST /collective_rpc``:

- ``vime_load_full(path, version)``: load an HF folder's tensors and keep them in host
  memory (the copy a delta patches);
- ``vime_apply_delta(path)``: patch that copy with a delta (:mod:`vime.engine.delta`),
  verify every tensor's checksum, load the result; a mismatch, or a delta whose base is
  not the version held, raises an error naming it (the sync stops, never falls back);
- ``vime_digest()``: the checksum of every model parameter as vLLM holds it (after its
  fusing and repacking), to compare two engines' weights tensor by tensor.

Both loads hand vLLM every tensor: its layerwise reload processes a layer once all of its
(fused) parameters have arrived, so a layer sent in part would be rebuilt from missing
data; and after an RL step every tensor has changed elements anyway (measured: "changed
tensors whole" sends 0.999-1.0 of the bytes, :mod:`vime.engine.delta`). What the delta
saves is what crosses from the trainer (bytes written and read), not the load.

Nothing heavy is imported at module level: vLLM imports this class in every worker.

Example (the test session's engine, launched by vime, has the extension):
    >>> from vime.engine import EngineClient
    >>> digest = EngineClient(engine_url).collective_rpc("vime_digest")[0]
    >>> len(digest) > 0, all(len(c) == 16 for c in digest.values())
    (True, True)
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

from vime.engine.routed_experts import RoutedExpertsWorker

QUALNAME = "vime.engine.delta_worker.DeltaWorker"


class DeltaWorker(RoutedExpertsWorker):
    """Mixed into vLLM's worker class (see the module docstring); routing replay's
    ``vime_routed_experts`` comes with it (:mod:`vime.engine.routed_experts`)."""

    _vime_copy: dict[str, Any] | None = None  # the HF tensors last loaded, in host memory
    _vime_version: int | None = None

    def vime_load_full(self, path: str, version: int) -> dict[str, float]:
        """Load every ``*.safetensors`` tensor of the folder ``path`` as ``version`` and
        keep them; returns ``read_s`` and ``load_s``."""
        from safetensors.torch import load_file

        t0 = time.perf_counter()
        tensors: dict[str, Any] = {}
        for file in sorted(Path(path).glob("*.safetensors")):
            tensors.update(load_file(str(file)))
        t1 = time.perf_counter()
        self._vime_version = None  # a failed load leaves no version a delta could patch
        self._vime_load(tensors)
        self._vime_copy, self._vime_version = tensors, int(version)
        return {"read_s": t1 - t0, "load_s": time.perf_counter() - t1}

    def vime_apply_delta(self, path: str) -> dict[str, float]:
        """Patch the kept tensors with the delta in ``path``, verify, load; returns
        ``read_s``, ``apply_s`` (decode and verify) and ``load_s``."""
        from vime.engine import delta as codec

        t0 = time.perf_counter()
        delta = codec.read(path)
        t1 = time.perf_counter()
        if self._vime_version == delta.version:  # a retried call whose first one landed
            return {"read_s": t1 - t0, "apply_s": 0.0, "load_s": 0.0}
        if self._vime_copy is None or self._vime_version != delta.base:
            raise codec.DeltaMismatch(
                f"delta sync: the engine holds version {self._vime_version}, the delta in "
                f"{path} is from version {delta.base} to {delta.version}: it needs a full "
                "sync first"
            )
        tensors = codec.apply(self._vime_copy, delta)
        t2 = time.perf_counter()
        self._vime_version = None
        self._vime_load(tensors)
        self._vime_copy, self._vime_version = tensors, delta.version
        return {"read_s": t1 - t0, "apply_s": t2 - t1, "load_s": time.perf_counter() - t2}

    def vime_digest(self) -> dict[str, str]:
        """Each model parameter's checksum (vLLM's names and layout)."""
        from vime.engine.delta import checksum

        model = self.model_runner.get_model()  # type: ignore[attr-defined]
        return {name: checksum(p.data.cpu()) for name, p in model.named_parameters()}

    def _vime_load(self, tensors: dict[str, Any]) -> None:
        # vLLM's in-place reload (the one /collective_rpc reload_weights runs from disk),
        # fed from memory.
        self.reload_weights(weights_iterator=iter(tensors.items()))  # type: ignore[attr-defined]
