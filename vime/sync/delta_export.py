"""The trainer's side of the delta weight sync: keep the last synced weights, write each
sync as a full HF folder or as a delta against them.

:class:`DeltaExporter` lives where rank 0's trainer lives (its own process with
``placement.trainer_process``), so the weights never cross a pipe: the loop asks
``TrainerGroup.export_delta(folder, version, full)`` and gets the numbers back. It keeps
the HF tensors of the last sync in host memory (one copy of the model, in the dtypes the
engines load) and encodes the next one against them (:mod:`vime.engine.delta`).

Example (a plain dict stands in for the gathered HF tensors):
    >>> import tempfile
    >>> exporter = DeltaExporter()
    >>> folder = Path(tempfile.mkdtemp())
    >>> first = exporter.write({"w": torch.zeros(4)}, folder / "v1", 1, full=True, like=None)
    >>> stats = exporter.write({"w": torch.ones(4)}, folder / "v2", 2, full=False, like=None)
    >>> stats["sync/changed_frac"], (folder / "v2" / "delta.safetensors").exists()
    (1.0, True)
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import numpy as np
import torch

from vime.engine import delta as codec
from vime.errors import WeightSyncError

Tensors = dict[str, torch.Tensor]


class DeltaExporter:
    """(Trainer rank 0.) The last synced HF tensors and their version; see the module."""

    def __init__(self) -> None:
        self.base: Tensors | None = None
        self.version = -1

    def __call__(
        self, module: Any, like: str | Path, folder: str | Path, version: int, full: bool
    ) -> dict[str, float]:
        """Gather the HF tensors (collective: every rank calls it), then on rank 0 write
        them to ``folder`` (see :meth:`write`); other ranks return ``{}``."""
        from vime.trainer.hf import hf_export_tensors

        t0 = time.perf_counter()
        tensors = hf_export_tensors(module, like=like, out=folder)
        if tensors is None:
            return {}
        # On a CPU trainer a gathered tensor may be the parameter itself or a view of it
        # (.cpu(), .contiguous() and .to() of an equal dtype do not copy): the optimizer
        # would change the kept copy under it.
        live = {p.untyped_storage().data_ptr() for p in module.parameters()}
        tensors = {
            k: v.clone() if v.untyped_storage().data_ptr() in live else v
            for k, v in tensors.items()
        }
        stats = self.write(tensors, folder, version, full=full, like=like)
        return {
            **stats,
            "sync/gather_s": time.perf_counter()
            - t0
            - stats["sync/encode_s"]
            - stats["sync/write_s"],
        }

    def write(
        self, tensors: Tensors, folder: str | Path, version: int, *, full: bool, like: Any
    ) -> dict[str, float]:
        """Write ``tensors`` as ``version``: a full HF folder shaped like ``like`` (or the
        bare safetensors file when ``like`` is None), else a delta against the last sync;
        keep them as the new base (so the caller must not change them in place afterwards:
        a changed base makes the next delta fail its checksums). Returns ``sync/changed_frac``, ``sync/bytes`` (what the
        engines read), ``sync/full_bytes``, ``sync/encode_s``, ``sync/write_s``."""
        t0 = time.perf_counter()
        if not full and self.base is None:
            raise WeightSyncError(
                f"delta sync of version {version}: the trainer holds no synced weights to "
                "encode against (the first sync of a run, and the first after a restart, "
                "must be full)"
            )
        full_bytes = sum(t.numel() * t.element_size() for t in tensors.values())
        if full:
            changed = 1.0 if self.base is None else _changed_frac(self.base, tensors)
            t1 = time.perf_counter()
            _write_full(tensors, Path(folder), like)
            sent = full_bytes
        else:
            assert self.base is not None
            delta = codec.encode(self.base, tensors, base=self.version, version=version)
            changed = delta.changed_frac
            t1 = time.perf_counter()
            sent = codec.write(delta, folder).stat().st_size
        t2 = time.perf_counter()
        self.base, self.version = dict(tensors), version  # a caller may refill its dict
        return {
            "sync/changed_frac": changed,
            "sync/bytes": float(sent),
            "sync/full_bytes": float(full_bytes),
            "sync/encode_s": t1 - t0,
            "sync/write_s": t2 - t1,
        }


def _changed_frac(old: Tensors, new: Tensors) -> float:
    """The fraction of elements whose bytes differ (1.0 where the names differ)."""
    if set(old) != set(new):
        return 1.0
    changed = total = 0
    for name, t in new.items():
        same = old[name].dtype == t.dtype and old[name].shape == t.shape
        before = codec.bits(old[name]).numpy()
        changed += int(np.count_nonzero(codec.bits(t).numpy() != before)) if same else t.numel()
        total += t.numel()
    return changed / max(total, 1)


def _write_full(tensors: Tensors, folder: Path, like: Any) -> None:
    if like is not None:
        from vime.trainer.hf import write_hf

        write_hf(tensors, folder, like=like)
        return
    from safetensors.torch import save_file

    folder.mkdir(parents=True, exist_ok=True)
    save_file(tensors, str(folder / "model.safetensors"))
