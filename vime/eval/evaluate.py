"""Evaluation against suites, with the same agent code as training.

``vime-agent eval ckpt=CKPT suite=SUITE [key=value ...]`` runs every set of the suite
(:mod:`vime.eval.suites`: bundled ``math``, ``tools``, ``swe`` on held-back tasks, or
your YAML file) and writes ``report.json`` (per-task rows and aggregates), ``report.md``,
``report.png`` and ``episodes.jsonl`` (every episode) to ``out=``. ``CKPT`` is

- an HF checkpoint folder (a vLLM engine is launched on it; ``engine.KEY=VALUE`` apply),
- a run folder: its newest weights, or ``step=N`` (exported from the step's trainer
  checkpoint when the run no longer keeps that export), or
- an engine URL ``http://host:port`` (attached, never stopped; the tokenizer is the
  server's model folder, or ``tokenizer=DIR``; ``engine.api_key=KEY`` when it requires
  a key).

``adapter=DIR`` evaluates a LoRA adapter (a PEFT folder: a LoRA run's ``weights/vNNNNNN``)
on the base ``ckpt`` (an HF folder the engine is launched on with LoRA, or the URL of an
engine serving LoRA; default: the adapter's ``base_model_name_or_path``): it is loaded into the engine and every request names it.

Episodes play and score as in training when asked: ``generate=module:function`` (a
``rollout.generate`` function), ``agent.command="python my_agent.py"`` (an agent program
against vime's endpoint; ``agent.timeout_s``, ``agent.max_turns`` as in training), and
``reward=``/``group_reward=`` (``rollout.reward``/``group_reward`` functions).

Other keys: ``seed=N`` (every set's sampling seed), ``limit=N`` (the first N tasks of
each set), ``out=DIR`` (default: ``<folder>/eval-<suite>``, ``<run>/eval/<suite>-step_N``,
or ``eval-<suite>`` here for a URL), ``trace.lock_watch_s=S`` (as in training: every
thread's stack is printed when one env call holds Python's interpreter lock for S
seconds; default 120, 0 turns the watch off).

``vime-agent eval compare A B ... [out=DIR]`` puts reports (their folders or
``report.json``) side by side: ``compare.md``, ``compare.json``, ``compare.png`` with the
per-task differences to ``A`` (default out: ``eval-compare``).

A crashed env, a dead sandbox or a lost engine ends its episode with a reason: the row
shows it and the suite still completes. Episodes an engine lost are played again once an
engine answers; eval restarts an engine it launched, never one attached by URL
(:mod:`vime.eval.lost_engines`). The RL loop's eval step
(:func:`vime.rl.eval_step.evaluate`) writes the same metrics (``eval/pass@1``,
``eval/reward``, ...) and the same report files, its episodes played by the run's
``rollout.generate`` function or ``agent.command`` when set.

Example:
    $ vime-agent eval ckpt=runs/20261130-061500-math suite=math
    $ vime-agent eval ckpt=runs/20261130-061500-math step=20 suite=my_suite.yaml seed=1
    $ vime-agent eval ckpt=http://10.0.0.5:8000 suite=tools limit=4
    $ vime-agent eval compare runs/a/eval/math-step_000040 runs/b/eval/math-step_000040
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import logging
import re
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import vime.envs as envs
from vime.agents.agent_command import AgentCommand
from vime.agents.collector import Collector
from vime.agents.generate import GenerateFn, load_generate
from vime.agents.policy_client import PolicyClient
from vime.agents.rewards import Rewards
from vime.conf.train import AgentConfig
from vime.config import apply_overrides
from vime.engine.config import EngineConfig
from vime.engine.lora import adapter_rank, lora_launch, serve_adapter
from vime.engine.serve import serve_engine
from vime.envs.tasks import Task
from vime.errors import ConfigError
from vime.eval.checkpoint import Checkpoint, resolve_checkpoint
from vime.eval.lost_engines import LostEngines, replay_lost, restarter
from vime.eval.report import (
    build_report,
    compare_markdown,
    compare_reports,
    read_report,
    task_rows,
    write_report,
)
from vime.eval.suites import BUNDLED_SUITES, EvalSet, Suite, load_suite
from vime.observability.config import TraceConfig
from vime.observability.lock_watch import LOCK_WATCH_S, LockWatch
from vime.types import Episode

log = logging.getLogger("vime.eval")

# ---------------------------------------------------------------- running a suite


def check_envs(suite: Suite) -> None:
    """Make each set's env once and run its preflight check (:func:`vime.envs.preflight_env`),
    so a wrong id or kwarg, or a Docker daemon that does not answer, fails before any
    episode runs, naming the set.

    Example:
        >>> check_envs(load_suite("math"))
    """
    for s in suite.sets:
        key = f"sets.{s.name}.env"
        try:
            envs.preflight_env(s.env, s.kwargs, key=key)
        except ConfigError as err:
            message = str(err).removeprefix(f"{key}: ")  # the set is named just before
            raise ConfigError(
                f"suite {suite.source or suite.name}: set {s.name!r}: {message}", key=err.key
            ) from err


async def _run_set(
    policy: PolicyClient,
    tokenizer: Any,
    s: EvalSet,
    tasks: list[Task],
    rewards: Rewards | None,
    generate: GenerateFn | None,
    engines: LostEngines,
) -> tuple[list[Episode], float, int]:
    """Every task of one set ``n_samples`` times; returns the episodes, the wall time and
    how many episodes were played again because an engine lost them."""
    # The set's collector config is the function's ctx.sampling (the eval's, greedy).
    collector = Collector(policy, tokenizer, s.collector, generate=generate, rewards=rewards)
    maker = envs.EnvMaker(s.env, dict(s.kwargs))
    t0 = time.perf_counter()
    try:
        episodes = await collector.collect(tasks, maker)
        retried = await replay_lost(policy, collector, tasks, maker, episodes, s.name, engines)
    finally:
        collector.close()
    return episodes, time.perf_counter() - t0, retried


async def run_suite(
    policy: PolicyClient,
    tokenizer: Any,
    suite: Suite,
    meta: dict[str, Any],
    tasks: dict[str, list[Task]] | None = None,
    rewards: Rewards | None = None,
    generate: GenerateFn | None = None,
    engines: LostEngines | None = None,
) -> tuple[dict[str, Any], list[Episode]]:
    """Run every set of ``suite``; returns the report (``meta`` + sets + rows) and every
    episode. ``tasks`` (by set name) replaces a set's task file (the RL loop's held-out
    tasks); ``rewards`` (the RL loop's ``rollout.reward``/``group_reward``) the envs';
    ``generate`` (the RL loop's ``rollout.generate`` or ``agent.command``) plays each
    episode in place of the env loop, with the set's sampling as its ``ctx.sampling``.
    ``engines`` says how episodes an engine lost are played again
    (:mod:`vime.eval.lost_engines`; default: wait for an engine, restart none).

    Usage (no doctest: it needs a running vLLM server): ``report, episodes = await
    run_suite(policy, model_dir, load_suite("math"), {})``, then
    ``report["aggregate"]["pass@1"]``.
    """
    check_envs(suite)
    sets: list[dict[str, Any]] = []
    rows: list[dict[str, Any]] = []
    episodes: list[Episode] = []
    for s in suite.sets:
        set_tasks = (tasks or {}).get(s.name) or suite.tasks(s)
        found, wall_s, retried = await _run_set(
            policy, tokenizer, s, set_tasks, rewards, generate, engines or LostEngines()
        )
        rows += task_rows(s.name, s.env, found, s.k, s.success)
        episodes += found
        sets.append({**_set_settings(s, wall_s), "engine_retried": retried})
    suite_meta = {"suite": suite.name, "suite_file": suite.source, "description": suite.description}
    return build_report({**suite_meta, **meta}, sets, rows), episodes


def _set_settings(s: EvalSet, wall_s: float) -> dict[str, Any]:
    """What the report records of a set: its settings and measured wall time."""
    return {
        "name": s.name,
        "env": s.env,
        "kwargs": s.kwargs,
        "tasks": s.tasks,
        "limit": s.limit,
        "k": s.k,
        "success": s.success,
        "n_samples": s.collector.n_samples,
        "seed": s.collector.seed,
        "sampling": dataclasses.asdict(s.collector.sampling),
        "max_turns": s.collector.max_turns,
        "max_model_len": s.collector.max_model_len,
        "wall_s": wall_s,
    }


def now() -> str:
    """The report's ``created`` stamp (local time with its offset)."""
    return time.strftime("%Y-%m-%dT%H:%M:%S%z")


# ---------------------------------------------------------------- command line


@dataclass
class EvalTrace:
    """Eval's ``trace.*`` key: ``lock_watch_s``, bounded as training bounds it."""

    lock_watch_s: float = LOCK_WATCH_S

    def __post_init__(self) -> None:
        TraceConfig(lock_watch_s=self.lock_watch_s)  # training's check and message


@dataclass
class EvalCommand:
    """The keys of ``vime-agent eval`` (the module docstring says what each does);
    ``engine.KEY=VALUE`` set the :class:`EngineConfig` of the engine eval launches.

    Example:
        >>> cmd = parse_command(["ckpt=runs/r", "suite=math", "seed=1", "engine.dtype=float32"])
        >>> cmd.seed, cmd.engine.dtype, cmd.trace.lock_watch_s
        (1, 'float32', 120.0)
    """

    ckpt: str = ""
    suite: str = ""
    out: str = ""
    seed: int | None = None
    limit: int | None = None
    step: int | None = None
    tokenizer: str = ""
    adapter: str = ""  # a PEFT adapter folder, served on the base ckpt (LoRA)
    trace: EvalTrace = dataclasses.field(default_factory=EvalTrace)
    engine: EngineConfig = dataclasses.field(default_factory=EngineConfig)
    generate: str = ""  # as training's rollout.generate: plays each episode
    reward: str = ""  # as training's rollout.reward: replaces each episode's reward
    group_reward: str = ""  # as training's rollout.group_reward
    agent: AgentConfig = dataclasses.field(default_factory=AgentConfig)  # agent.command=...


def parse_command(argv: list[str]) -> EvalCommand:
    """``vime-agent eval``'s ``key=value`` arguments; ``ckpt=`` and ``suite=`` are needed."""
    cmd = apply_overrides(EvalCommand(), argv)
    if cmd.adapter and not cmd.ckpt:  # the base the adapter was trained on
        adapter_rank(cmd.adapter)  # a clear error for a folder that is no adapter
        config = json.loads((Path(cmd.adapter) / "adapter_config.json").read_text())
        cmd.ckpt = str(config.get("base_model_name_or_path") or "")
    for key in ("ckpt", "suite"):
        if not getattr(cmd, key):
            raise ConfigError(
                f"eval needs {key}= (e.g. ckpt=runs/RUN suite=math; bundled suites: "
                f"{list(BUNDLED_SUITES)})",
                key=key,
            )
    return cmd


def players(cmd: EvalCommand, suite: Suite) -> tuple[GenerateFn | None, Rewards | None]:
    """What plays and scores the episodes, as in training: ``generate=``'s function or
    ``agent.command``'s program (None: the env loop), and ``reward=``/``group_reward=``
    (None: the envs' rewards), loaded and checked before the engine starts.

    Raises:
        ConfigError: both ``generate`` and ``agent.command``; ``agent.command`` with a
            suite whose sets sample differently (the agent's endpoint has one sampling).

    Example:
        >>> players(EvalCommand(generate="vime.agents.generate:play_env"), load_suite("math"))[0].__name__
        'play_env'
    """
    rewards = Rewards.load(cmd.reward, cmd.group_reward) if cmd.reward or cmd.group_reward else None
    if not cmd.agent.command:
        return load_generate(cmd.generate), rewards
    if cmd.generate:
        raise ConfigError(
            "generate: set one of generate (a function) and agent.command (an agent program)",
            key="generate",
        )
    first = suite.sets[0].collector
    if any(s.collector != first for s in suite.sets[1:]):
        raise ConfigError(
            f"agent.command: suite {suite.name}'s sets sample differently, and the agent's "
            "endpoint samples one way; evaluate one set at a time (a suite file per set)",
            key="agent.command",
        )
    return AgentCommand(cmd.agent.argv, cmd.agent.endpoint(first)), rewards


def _engine_config(
    cmd: EvalCommand, given: list[str], suite: Suite, ckpt: Checkpoint
) -> EngineConfig:
    """The launched engine's settings: ``engine.*`` overrides (the keys ``given``), and a
    context window that fits the suite's longest ``max_model_len`` unless
    ``engine.max_model_len`` is given."""
    if ckpt.url and set(given) - {"engine.api_key"}:
        raise ConfigError(
            "engine.*: apply only when eval launches the engine (but engine.api_key, the key "
            f"a running engine requires); ckpt is the running engine {ckpt.url}",
            key="engine",
        )
    if "engine.url" in given:
        raise ConfigError(
            "engine.url: to evaluate a running engine give ckpt=URL (it serves its own weights, "
            "not those of a folder)",
            key="engine.url",
        )
    cfg = cmd.engine
    if "engine.max_model_len" not in given:
        longest = max(s.collector.max_model_len for s in suite.sets)
        cfg = dataclasses.replace(cfg, max_model_len=max(cfg.max_model_len, longest))
    return cfg


def main(argv: list[str]) -> int:
    """``vime-agent eval ckpt=CKPT suite=SUITE [key=value ...]`` or ``eval compare A B ...``."""
    if any(a in ("-h", "--help") for a in argv):
        print(__doc__)
        return 0
    if argv and argv[0] == "compare":
        return compare_main(argv[1:])
    cmd = parse_command(argv)
    suite = load_suite(cmd.suite).with_settings(seed=cmd.seed)
    if cmd.limit is not None:
        suite = suite.with_settings(limit=cmd.limit)
    ckpt = resolve_checkpoint(
        cmd.ckpt, cmd.suite, step=cmd.step, tokenizer=cmd.tokenizer, api_key=cmd.engine.api_key
    )
    out = Path(cmd.out or ckpt.out)
    given = [k for a in argv if (k := a.partition("=")[0].strip()).startswith("engine.")]
    engine_cfg = _engine_config(cmd, given, suite, ckpt)
    if ckpt.url:
        engine_cfg = dataclasses.replace(engine_cfg, url=ckpt.url)
    elif cmd.adapter:  # the base, launched with LoRA on
        engine_cfg = lora_launch(engine_cfg, adapter_rank(cmd.adapter))
    check_envs(suite)
    with (
        LockWatch(cmd.trace.lock_watch_s),  # env calls run in this process: one may hold the GIL
        serve_engine(engine_cfg, ckpt.weights or "", log_dir=out / "logs") as server,
    ):
        adapter = serve_adapter(server.url, cmd.adapter) if cmd.adapter else ""
        policy = PolicyClient.from_urls(server.url, model=adapter)
        # A launched engine that dies is restarted as training restarts its engines.
        engines = LostEngines(restart=restarter(server, cmd.adapter))
        meta = {
            "checkpoint": str(ckpt.weights or ckpt.url),
            **({"adapter": str(Path(cmd.adapter).resolve())} if cmd.adapter else {}),
            "engine": server.url if ckpt.url else "launched",
            "seed": cmd.seed,
            "created": now(),
        }

        generate, rewards = players(cmd, suite)

        async def run() -> tuple[dict[str, Any], list[Episode]]:
            try:
                return await run_suite(
                    policy,
                    ckpt.tokenizer,
                    suite,
                    meta,
                    rewards=rewards,
                    generate=generate,
                    engines=engines,
                )
            finally:
                if isinstance(generate, AgentCommand):  # its endpoint serves on this loop
                    await generate.aclose()
                await policy.aclose()

        report, episodes = asyncio.run(run())
    paths = write_report(report, episodes, out)
    _print_summary(report)
    print(f"report: {paths[0].parent} ({', '.join(p.name for p in paths)})", file=sys.stderr)
    return 0


def _print_summary(report: dict[str, Any]) -> None:
    for s in [*report["sets"], {"name": "all", "aggregate": report["aggregate"]}]:
        agg = s["aggregate"]
        shown = {k: v for k, v in agg.items() if k.startswith("pass@")}
        shown.update(reward=agg["reward"], error=agg["error"])
        scores = "  ".join(f"{k} {v:.3f}" for k, v in shown.items())
        print(f"{s['name']:<14} {scores}  tasks {agg['tasks']:.0f}  episodes {agg['episodes']:.0f}")


@dataclass
class CompareCommand:
    """The keys of ``vime-agent eval compare A B ... [out=DIR]``: where it writes."""

    out: str = "eval-compare"


# key=value (out=DIR) as opposed to a report's path (which may hold a "=" after a "/")
_KEY_VALUE = re.compile(r"[A-Za-z_][\w.]*=")


def compare_main(argv: list[str]) -> int:
    """``vime-agent eval compare A B ... [out=DIR]``: reports side by side.

    Example (two reports written first; the comparison goes to ``out``):
        >>> import tempfile
        >>> from vime.eval.report import build_report, write_report
        >>> with tempfile.TemporaryDirectory() as tmp:
        ...     for name in ("a", "b"):
        ...         _ = write_report(build_report({"label": name}, [{"name": "s"}], []), [],
        ...                          Path(tmp, name))
        ...     compare_main([f"{tmp}/a", f"{tmp}/b", f"out={tmp}/compare"])
        # Eval compare: a, b
        ...
        0
    """
    from vime.eval.plots import plot_compare

    sources = [a for a in argv if not _KEY_VALUE.match(a)]
    out = Path(apply_overrides(CompareCommand(), [a for a in argv if a not in sources]).out)
    if len(sources) < 2:
        raise ConfigError("eval compare: give two or more reports (folders or report.json)")
    comparison = compare_reports([read_report(s) for s in sources])
    out.mkdir(parents=True, exist_ok=True)
    (out / "compare.json").write_text(json.dumps(comparison, indent=1) + "\n")
    text = compare_markdown(comparison)
    (out / "compare.md").write_text(text)
    plot_compare(comparison, out / "compare.png")
    print(text.split("\n## Tasks")[0])
    print(f"comparison: {out} (compare.md, compare.json, compare.png)", file=sys.stderr)
    return 0
