"""The figures of one RL step that the loop's own metrics do not already give.

:func:`step_figures` adds, to a step's metrics row:

- per env (``env/<name>/...``, ``<name>`` the env id without namespace and version):
  ``reward``, ``response_tokens`` and ``episode_tokens`` (means), ``turns``, the status
  mix (``status/completed`` ...), ``template_mismatch`` (fraction of episodes whose
  chat template was not append-only), ``tool_calls`` and ``tool_parse_errors`` (per
  turn), and the mean of every number the env reports itself (``metric/<key>``, e.g.
  the tools env's ``sandbox_used``);
- ``staleness/mean`` and ``staleness/max``: weight versions between the policy being
  trained and the one that sampled each episode's oldest token;
- ``throughput/rollout_tok_s`` (sampled tokens per second of collection) and
  ``throughput/train_tok_s`` (trained tokens per second of the train step);
- ``spans/<kind>/n`` and ``spans/<kind>/s``: how many spans of each kind
  (:data:`~vime.observability.trace.KINDS`: sandbox execs, env steps, engine requests,
  ...) ran since the last step, and their seconds;
- whatever each of the caller's ``sources`` returns (the loop passes ``sandbox/*`` from
  vime.sandbox.leases).

The train/rollout mismatch (``train/train_rollout_logprob_abs_diff``, ``train/tis_clip_frac``)
and the time split (``time/*``) come from the trainer and the loop.

Example:
    >>> from vime.types import Episode
    >>> ep = Episode("t", "vime/Math-v0", [1, 2], [0, 1], [0.0, -0.5], reward=1.0,
    ...              weight_versions=[-1, 0])
    >>> row = step_figures([ep], version=0, row={})
    >>> row["env/Math/reward"], row["env/Math/status/completed"], row["staleness/max"]
    (1.0, 1.0, 0.0)
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Callable, Sequence
from typing import Any

from vime.observability.trace import TRACE
from vime.types import STATUSES, Episode


def env_name(env_id: str) -> str:
    """The short name of an env id in metric keys.

    Example:
        >>> env_name("vime/Tools-v0"), env_name("my_echo:my/Echo-v0"), env_name("Plain")
        ('Tools', 'Echo', 'Plain')
    """
    return env_id.split("/")[-1].split(":")[-1].rsplit("-v", 1)[0] or "env"


def step_figures(
    episodes: list[Episode],
    version: int,
    row: dict[str, Any],
    sources: Sequence[Callable[[], dict[str, float]]] = (),
) -> dict[str, float]:
    """The figures of the module docstring for one step's ``episodes`` (sampled by
    weights up to ``version``) and its metrics ``row`` so far, plus each of ``sources``'
    figures (a call returning, and resetting, its counts since the last step)."""
    out: dict[str, float] = {}
    by_env: dict[str, list[Episode]] = defaultdict(list)
    for ep in episodes:
        by_env[env_name(ep.env_id)].append(ep)
    for name, eps in sorted(by_env.items()):
        out.update(_env_figures(f"env/{name}/", eps))
    lags = [version - ep.min_weight_version for ep in episodes if ep.trainable]
    if lags:
        out["staleness/mean"] = float(sum(lags) / len(lags))
        out["staleness/max"] = float(max(lags))
    collect_s = row.get("rollout/collect_s") or row.get("time/rollout_s") or 0.0
    if collect_s > 0:
        out["throughput/rollout_tok_s"] = row.get("rollout/sampled_tokens", 0.0) / collect_s
    train_s = row.get("time/train_s") or 0.0
    if train_s > 0 and row.get("train/num_tokens"):
        out["throughput/train_tok_s"] = row["train/num_tokens"] / train_s
    for kind, (count, seconds) in TRACE.take_totals().items():
        out[f"spans/{kind}/n"] = float(count)
        out[f"spans/{kind}/s"] = seconds
    for source in sources:
        out.update(source())
    return out


def _env_figures(prefix: str, eps: list[Episode]) -> dict[str, float]:
    n = len(eps)
    turns = sum(len(ep.turns) for ep in eps)
    out = {
        "reward": sum(ep.reward for ep in eps) / n,
        "response_tokens": sum(ep.num_sampled_tokens for ep in eps) / n,
        "episode_tokens": sum(len(ep.tokens) for ep in eps) / n,
        "turns": turns / n,
        "template_mismatch": sum(bool(ep.metadata.get("template_mismatches")) for ep in eps) / n,
        "tool_calls": sum(t.num_tool_calls for ep in eps for t in ep.turns) / max(turns, 1),
        "tool_parse_errors": sum(t.num_parse_errors for ep in eps for t in ep.turns)
        / max(turns, 1),
    }
    for status in STATUSES:
        out[f"status/{status}"] = sum(ep.status.value == status for ep in eps) / n
    reported: dict[str, list[float]] = defaultdict(list)
    for ep in eps:
        for key, value in ep.metrics.items():
            if isinstance(value, int | float):
                reported[key].append(float(value))
    for key, values in reported.items():
        out[f"metric/{key}"] = sum(values) / len(values)
    return {prefix + k: float(v) for k, v in out.items()}
