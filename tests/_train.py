"""The overrides of a short training run on the untrained tiny model, shared by the tests
that train end to end.

Example:
    >>> quick_train("http://127.0.0.1:8000", "/tmp/runs", "steps=2", batch=2)[:3]
    ['engine.url=http://127.0.0.1:8000', 'run_root=/tmp/runs', 'model.warm_start_steps=0']
"""

from __future__ import annotations

from pathlib import Path


def quick_train(
    url: str | None, run_root: str | Path, *extra: str, batch: int = 4, samples: int = 4
) -> list[str]:
    """``vime-agent train`` overrides: no warm start, ``batch`` tasks × ``samples``, every
    group trained (a random model earns no reward, so ``filter_groups`` would drop them
    all), no eval, no plot; then ``extra``. ``url``: an engine to attach to (None: vime
    launches its own)."""
    return [
        *([f"engine.url={url}"] if url else []),
        f"run_root={run_root}",
        "model.warm_start_steps=0",
        f"rollout.batch_size={batch}",
        f"rollout.collector.n_samples={samples}",
        "rollout.filter_groups=false",
        "eval_every=0",
        "plot=false",
        *extra,
    ]
