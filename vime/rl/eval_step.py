"""The RL loop's evaluation step: the train config's env on its held-out tasks, run as
``vime-agent eval`` runs a suite (:mod:`vime.eval`), writing the same report files and
``eval/*`` metrics. The only eval code that sees :class:`TrainConfig`. A run whose samples
are played by ``rollout.generate`` or ``agent.command`` is evaluated through the same
function or agent (:func:`eval_generate`), greedily: the eval measures what is trained.

Example:
    >>> from vime.conf.compose import load_config
    >>> training_suite(load_config([])).sets[0].env
    'vime/Math-v0'
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

from vime.agents.agent_command import AgentCommand
from vime.agents.generate import GenerateFn, load_generate
from vime.agents.policy_client import PolicyClient
from vime.agents.rewards import Rewards
from vime.conf.train import TrainConfig
from vime.envs.tasks import Task
from vime.eval.evaluate import now, run_suite
from vime.eval.lost_engines import LostEngines
from vime.eval.report import metrics, write_report
from vime.eval.suites import EvalSet, Suite

RUN_RESTARTS = (
    "the run restarts the engines it launched in its next step (an engine it attached by "
    "URL must be started again there)"
)
"""What happens to an engine lost for good during the RL loop's eval (its episodes'
reason says it): the next step's rollout finds it dead and restarts it
(``sync.recover()``), nothing restarts it mid-eval."""


async def evaluate(
    policy: PolicyClient,
    model_dir: Path,
    cfg: TrainConfig,
    tasks: list[Task],
    run_root: Path | None = None,
    step: int = 0,
    generate: GenerateFn | None = None,
) -> dict[str, float]:
    """The RL loop's eval: greedy on the held-out ``tasks``; returns ``eval/*`` metrics (the
    report's aggregates). With ``run_root``, the report files go to
    ``run_root/eval/step_NNNNNN/``, as ``vime-agent eval`` writes them. The rewards are
    training's: ``rollout.reward`` and ``rollout.group_reward`` when set; ``generate``
    (:func:`eval_generate`) plays each episode in place of the env loop.

    Example (``engine_url``: a running vLLM server serving ``model_dir``; ``tasks``: 2
    math tasks; the report files to ``tmp/eval/step_000010``):
        >>> from vime.conf.compose import load_config
        >>> cfg = load_config(["rollout.collector.sampling.max_tokens=8"])
        >>> async def run_eval():
        ...     policy = PolicyClient.from_urls(engine_url)
        ...     try:
        ...         return await evaluate(policy, Path(model_dir), cfg, tasks, tmp, 10)
        ...     finally:
        ...         await policy.aclose()
        >>> import asyncio
        >>> 0 <= asyncio.run(run_eval())["eval/pass@1"] <= 1, (tmp / "eval/step_000010").is_dir()
        (True, True)
    """
    suite = training_suite(cfg)
    meta = {"checkpoint": str(model_dir), "step": step, "created": now()}
    rewards = Rewards.load(cfg.rollout.reward, cfg.rollout.group_reward)
    report, episodes = await run_suite(
        policy,
        model_dir,
        suite,
        meta,
        tasks={suite.sets[0].name: tasks},
        rewards=rewards,
        generate=generate,
        engines=LostEngines(advice=RUN_RESTARTS),
    )
    if run_root is not None:
        write_report(report, episodes, Path(run_root) / "eval" / f"step_{step:06d}")
    return metrics(report)


def eval_generate(cfg: TrainConfig) -> GenerateFn | None:
    """What plays the eval's episodes: ``rollout.generate``'s function, or for
    ``agent.command`` an :class:`AgentCommand` of its own whose endpoint samples greedily
    (:func:`training_suite`'s settings); None: the env loop. An AgentCommand's endpoint
    starts at its first eval and serves on the caller's event loop: ``close()`` it before
    that loop stops.

    Example:
        >>> from vime.conf.compose import load_config
        >>> eval_generate(load_config(["rollout.generate=vime.agents.generate:play_env"])).__name__
        'play_env'
    """
    if cfg.agent.command:  # training's AgentCommand samples at the run's temperature
        greedy = training_suite(cfg).sets[0].collector
        return AgentCommand(cfg.agent.argv, cfg.agent.endpoint(greedy))
    return load_generate(cfg.rollout.generate)


def training_suite(cfg: TrainConfig) -> Suite:
    """The suite the RL loop evaluates on: the train config's env on its held-out tasks
    (``env.eval_tasks``/``env.eval_size``), one greedy episode per task.

    Example:
        >>> from vime.conf.compose import load_config
        >>> s = training_suite(load_config(["env=tools"])).sets[0]
        >>> s.env, s.collector.sampling.temperature, s.collector.n_samples
        ('vime/Tools-v0', 0.0, 1)
    """
    collector = dataclasses.replace(
        cfg.rollout.collector,
        n_samples=1,
        sampling=dataclasses.replace(cfg.rollout.collector.sampling, temperature=0.0),
        progress=False,
    )
    held_out = EvalSet(
        name=cfg.env.id.split("/")[-1].split("-")[0].lower(),
        env=cfg.env.id,
        kwargs=dict(cfg.env.kwargs),
        tasks=cfg.env.eval_tasks or "env.eval_tasks (the training source's held-out draw)",
        limit=cfg.env.eval_size or None,
        collector=collector,
    )
    return Suite("training", [held_out], description="the RL loop's held-out evaluation")
