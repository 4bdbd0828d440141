"""The ``vime-agent train`` config: Hydra config groups over typed dataclass configs.

Groups (pick one option with ``group=option``; each option is a YAML file,
``vime/conf/<group>/<option>.yaml``, and ``--config-dir DIR`` adds a folder of your own):

- ``env``: ``math`` (default), ``tools``, ``swe`` — which environment and its tasks.
- ``model``: ``tiny`` (default: the locally built tiny model plus a warm start).
- ``algorithm``: ``grpo`` (default), ``dr_grpo``, ``gspo`` — the policy objective.
- ``engine``: ``cpu`` (default, float32), ``gpu`` (CUDA, bfloat16).
- ``rollout``: ``sync`` (default, on-policy), ``async`` (rollouts never stop; steps take
  the groups that finish first, at most ``max_staleness`` versions old).

Every component's own dataclass is a node: ``engine`` (:class:`vime.engine.EngineConfig`),
``trainer`` (:class:`vime.trainer.TrainerConfig`), ``rollout``
(:class:`RolloutConfig`, which holds the collector's options), ``algorithm``
(:class:`AlgorithmConfig`: advantages, over-long episodes, KL reward), ``placement``
(:class:`vime.placement.config.PlacementConfig`: trainer TP/PP, engines per node, devices,
colocated or split, external engine URLs). Any field can be set
with ``key=value``; a wrong key or value gives one :class:`ConfigError` naming the key
and the nearest valid names.

Composed by :func:`vime.conf.compose.load_config`.

Example:
    >>> RolloutConfig().batch_size
    64
"""

from __future__ import annotations

import shlex
import shutil
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from vime.agents.collector import CollectorConfig
from vime.conf.train_checks import ADVANTAGES as ADVANTAGES  # vime.rl.advantages reads it
from vime.conf.train_checks import check_train_config
from vime.config import require, require_choice
from vime.engine.config import EngineConfig
from vime.envs.task_source import TaskSourceConfig
from vime.errors import ConfigError
from vime.models.templates import load_chat_template
from vime.observability.config import MetricsConfig, TraceConfig, WatchdogConfig
from vime.placement.config import PlacementConfig
from vime.sync.config import SyncConfig
from vime.trainer.config import TrainerConfig
from vime.trainer.critic import CriticConfig
from vime.trainer.reference import ReferenceConfig
from vime.types import SamplingParams

if TYPE_CHECKING:
    from vime.agents.endpoint import EndpointConfig

GROUPS = ("env", "model", "algorithm", "engine", "rollout")
MODES = ("sync", "async")


@dataclass
class EnvConfig:
    """Which environment to train on, and where its tasks come from.

    ``tasks.path`` empty means the env's bundled tasks, produced by ``builtin_tasks``
    (``module:function`` called as ``function(n=..., seed=...)``).
    """

    id: str = "vime/Math-v0"  # the vime.make id of every episode (vime-agent envs lists them)
    # vime.make(env.id, **kwargs) for training, eval and warm-start episodes (max_turns, ...)
    kwargs: dict[str, Any] = field(default_factory=dict)
    tasks: TaskSourceConfig = field(default_factory=TaskSourceConfig)
    builtin_tasks: str = "vime.suites.math.data:arithmetic_suite"
    # Hydra merges dict-valued fields across groups, so the default stays empty and each
    # env preset sets its own arguments.
    builtin_args: dict[str, Any] = field(default_factory=dict)
    eval_tasks: str = ""  # a .jsonl/.parquet file; "" = the training tasks' source
    # Tasks per evaluation (eval_every): the first N of eval_tasks, else of tasks.path (held
    # out while eval_every > 0: training draws the rest of that file), else of the
    # generator's draw with seed tasks.seed + 1000003 (or its eval split); 0 = none.
    eval_size: int = 64
    # "module:function" giving a task's reference completion (text), used by the
    # supervised warm start; "" = the env has none (no warm start).
    demonstrations: str = ""

    def __post_init__(self) -> None:
        require(bool(self.id), "env.id", "must name a registered env (vime-agent envs lists them)")
        require(
            bool(self.tasks.path) or ":" in self.builtin_tasks,
            "env.builtin_tasks",
            "must be 'module:function' when env.tasks.path is empty",
        )
        require(self.eval_size >= 0, "env.eval_size", "must be >= 0 (0 = no evaluation)")


@dataclass
class ModelConfig:
    """The policy's starting checkpoint.

    ``path``: the HF folder (with its config.json) the policy starts from; empty means
    vime's tiny local model, which the warm start (:mod:`vime.rl.warm_start`) first trains
    on each training task played once with ``env.demonstrations``' answer.
    ``chat_template``: a bundled template (``chatml``, ``qwen3``, ``llama3``, ``mistral``) or
    a Jinja file, given to the tokenizer of the folder the run serves and trains, so that the
    collector, the evaluation and vLLM render with it; empty: the folder's own.
    """

    path: str = ""
    chat_template: str = ""
    # SFT steps on the tiny model before RL (model=tiny: 400), cached by content in
    # $VIME_CACHE_DIR/models (default .cache/models); 0 = none.
    warm_start_steps: int = 0
    warm_start_batch: int = 64  # demonstrations per step, drawn without replacement
    warm_start_lr: float = 1e-3  # Adam, linear warmup over 30 steps, then constant; clip 1.0
    warm_start_seed: int = 0  # batch draws, trainer, tasks (generator seed: this + 7919)
    # Stop once sampling at T=1 would write 64 held-out demonstrations exactly with this mean
    # chance (RL's first reward); warm_start_steps is then the cap. 0 = run them all.
    warm_start_target: float = 0.0

    def __post_init__(self) -> None:
        require(self.warm_start_steps >= 0, "model.warm_start_steps", "must be >= 0")
        require(self.warm_start_batch >= 1, "model.warm_start_batch", "must be >= 1")
        require(self.warm_start_lr > 0, "model.warm_start_lr", "must be > 0")
        require(0 <= self.warm_start_target <= 1, "model.warm_start_target", "must be in [0, 1]")
        if self.chat_template:  # a wrong name or file fails here, naming the key
            load_chat_template(self.chat_template)


@dataclass
class RolloutConfig:
    """How each step's data is collected.

    ``batch_size`` tasks per step, each sampled ``collector.n_samples`` times (a GRPO
    group). ``oversample`` > 1 draws more groups than needed so that ``filter_groups``
    (drop groups whose rewards are all equal: zero advantage, no signal) still leaves a
    full batch. ``mode`` is ``sync`` (a step collects its batch under the current weights,
    then trains) or ``async`` (needs ``placement.mode=split``): groups play continuously
    while the trainer trains, at most ``max_staleness`` weight versions ahead, and a step
    takes the first ``batch_size`` groups that finish (:mod:`vime.rl.stream`); samples older
    than ``max_staleness`` versions are dropped, the rest are corrected by TIS.
    ``partial_rollouts`` (default): a weight sync that lands while requests are in flight
    aborts them, and each continues under the new weights from where it stopped, every
    token keeping the version that sampled it (:mod:`vime.agents.completion`); false:
    they are frozen and resumed, their tokens recorded with the older version.

    Faults (RELIABILITY.md): episodes lost to an unavailable engine (killed, or hung: found
    by its heartbeat within ``engine_heartbeat_s`` + 20 s, or past ``request_timeout_s``
    per request try) are played again once the engine is back, at most ``engine_retries``
    rounds per step; a step where more than ``max_error_frac`` of the episodes end in
    ``error`` stops the run with the reasons.

    Rewards (:mod:`vime.agents.rewards`): ``reward`` and ``group_reward`` name your
    functions, loaded and checked when the run starts; the loop's evaluation uses the same
    rewards as training. One that raises or returns no finite number makes its episodes
    ``error`` episodes with the reason.

    Example:
        >>> RolloutConfig(engine_retries=0).max_error_frac
        0.5
    """

    batch_size: int = 64
    oversample: float = 1.0
    filter_groups: bool = True
    mode: str = "sync"
    max_staleness: int = 1
    engine_retries: int = 2  # rounds of re-collecting a step's engine-lost episodes
    max_error_frac: float = 0.5  # above this fraction of error episodes, the run stops
    # per request try to the engine; a timed-out try is retried only if /health answers
    request_timeout_s: float = 600.0
    # While requests wait on an engine, its /health is probed this often (one probe shared
    # by all of them); two distinct probes in a row unanswered within 10 s each mean the
    # engine is hung: its requests end as lost at once (found within this + 20 s) and the
    # engine is restarted, whatever request_timeout_s is (vime.agents.liveness).
    engine_heartbeat_s: float = 5.0
    partial_rollouts: bool = True  # a sync aborts in-flight requests, which then continue
    # Unseeded requests with identical bodies sent together (a group's first turns) go to
    # the engine as one request with n; each sample keeps its own choice's ids and log-probs
    # (vime.agents.request_batcher). false: one request per sample, e.g. for an engine
    # behind engine.url that does not take n.
    batch_identical_requests: bool = True
    collector: CollectorConfig = field(
        default_factory=lambda: CollectorConfig(
            n_samples=8,
            sampling=SamplingParams(temperature=1.0, max_tokens=16),
            max_model_len=512,
            progress=False,
        )
    )
    refill_retries: int = 0  # extra draws (of batch_size) when filter_groups leaves too few
    # A per-sample generation function, 'module:function' or 'file.py:function': async
    # def generate(ctx) -> Episode (vime.agents.generate, docs/extend.md); "" = the env loop.
    generate: str = ""
    # 'module:factory' or 'file.py:factory': factory(ctx) -> Orchestrator, which decides
    # what is played when and which groups each step takes (vime.rl.orchestrator,
    # docs/extend.md); "" = the built-in one of mode. With mode=async it may play while
    # the trainer trains.
    orchestrator: str = ""
    # Where the groups come from: "" = this process plays them (the run's own buffer);
    # a PostgreSQL URL (bash scripts/postgres.sh start prints one) = rollout workers
    # (vime-agent rollout store=URL run=RUN_NAME) lease the tasks the trainer publishes
    # and write their groups there; the trainer claims each step's (vime.store.postgres,
    # docs/scaling.md).
    store: str = ""
    # (rollout.store) a worker's lease on a task, renewed while it plays; a worker killed
    # mid-episode loses its tasks to another worker this long after its last renewal.
    store_lease_s: float = 60.0
    # 'module:function' or 'file.py:function': sample_filter(episode) -> bool, False leaves
    # the episode out of training (vime.rl.filters, docs/extend.md); "" = none.
    sample_filter: str = ""
    # group_filter(episodes) -> bool, False leaves the GRPO group out of training, after
    # filter_groups (vime.rl.filters); "" = none.
    group_filter: str = ""
    # Reward functions, 'module:function' or 'file.py:function', def or async def
    # (vime.agents.rewards, docs/extend.md); "" = the env's reward. Training and the loop's
    # evaluation both use them. reward(task, episode) -> float replaces each finished
    # episode's reward (the env's is kept as metric reward/env).
    reward: str = ""
    # group_reward(task, episodes) -> list[float], one per episode: each finished GRPO group
    # (a task's samples), after rollout.reward.
    group_reward: str = ""

    def __post_init__(self) -> None:
        require(self.batch_size >= 1, "rollout.batch_size", "must be >= 1")
        require(self.oversample >= 1.0, "rollout.oversample", "must be >= 1.0")
        require_choice(self.mode, "rollout.mode", MODES)
        require(self.max_staleness >= 0, "rollout.max_staleness", "must be >= 0")
        require(self.engine_retries >= 0, "rollout.engine_retries", "must be >= 0 (0 = none)")
        require(
            0.0 <= self.max_error_frac <= 1.0,
            "rollout.max_error_frac",
            "must be in [0, 1] (1 = never stop on env errors)",
        )
        require(self.request_timeout_s > 0, "rollout.request_timeout_s", "must be > 0 seconds")
        require(self.engine_heartbeat_s > 0, "rollout.engine_heartbeat_s", "must be > 0 seconds")
        require(self.refill_retries >= 0, "rollout.refill_retries", "must be >= 0 (0 = no refill)")
        require(self.store_lease_s > 0, "rollout.store_lease_s", "must be > 0 seconds")


@dataclass
class AgentConfig:
    """An agent program you already have, trained as it is (docs/extend.md, Agents you
    already have): ``command`` runs once per sample of every task, against its own session
    of vime's OpenAI-compatible endpoint (:mod:`vime.agents.agent_command`), in place of
    the env loop. "" = the env loop (or ``rollout.generate``).

    The session's sampling, token budget, tool parser, template handling, env timeout and
    seed are the collector's (``rollout.collector.sampling``, ``max_model_len``,
    ``tool_parser``, ``on_template_mismatch``, ``sample_per_turn``,
    ``chat_template_kwargs``, ``env_timeout_s``, ``seed``): one place per run, as in the
    env loop. The keys here are the agent's own.

    Example:
        >>> AgentConfig(command="python examples/own_agent.py --fast").argv
        ['python', 'examples/own_agent.py', '--fast']
    """

    command: str = ""  # split as a shell would split it (shlex); the task's prompt on stdin
    timeout_s: float = 600.0  # the agent's wall time per sample; past it: killed, an error
    max_turns: int = 16  # replies per session; a request past them is refused (truncated)
    host: str = "127.0.0.1"  # the endpoint's address (an agent in a container must reach it)

    @property
    def argv(self) -> list[str]:
        return shlex.split(self.command)

    def __post_init__(self) -> None:
        require(self.timeout_s > 0, "agent.timeout_s", "must be > 0 seconds")
        require(self.max_turns >= 1, "agent.max_turns", "must be >= 1")
        if not self.command:
            return
        try:
            argv = self.argv
        except ValueError as err:  # an unclosed quote
            why = f"agent.command: does not split as a shell command: {err}"
            raise ConfigError(why, key="agent.command") from None
        require(bool(argv), "agent.command", "is blank; give the agent's command line")
        require(
            shutil.which(argv[0]) is not None,
            "agent.command",
            f"starts with {argv[0]!r}, which is not an executable file or on PATH",
        )

    def endpoint(self, collector: CollectorConfig) -> EndpointConfig:
        """The endpoint's config: the collector's sampling and limits, the agent's keys."""
        from vime.agents.endpoint import EndpointConfig  # (aiohttp: only for a run with agents)

        return EndpointConfig(
            sampling=collector.sampling,
            max_model_len=collector.max_model_len,
            max_turns=self.max_turns,
            tool_parser=collector.tool_parser,
            on_template_mismatch=collector.on_template_mismatch,
            sample_per_turn=collector.sample_per_turn,
            chat_template_kwargs=dict(collector.chat_template_kwargs),
            agent_timeout_s=self.timeout_s,
            env_timeout_s=collector.env_timeout_s,
            seed=collector.seed,
            host=self.host,
        )


@dataclass
class AlgorithmConfig:
    """How a step's rewards become advantages (docs/algorithms.md; the keys are checked
    against each other and the trainer's in :mod:`vime.conf.train_checks`). The ``algorithm=``
    group (``grpo``, ``dr_grpo``, ``gspo``) sets these and the trainer's loss together.

    Example:
        >>> AlgorithmConfig().advantage
        'grpo'
    """

    advantage: str = "grpo"  # grpo | rloo | reinforce_pp | reinforce_pp_baseline | gae
    # advantage=grpo: centred rewards divided by the group's std (+1e-6); false: the mean
    # baseline only (Dr.GRPO, algorithm=dr_grpo). The other estimators take true only.
    normalize_std: bool = True
    gamma: float = 1.0  # gae: discount per sampled token
    gae_lambda: float = 1.0  # gae: λ (1: A = return − V; lower trusts the critic more)
    overlong: str = "none"  # truncated by a token limit: none | mask (out of the loss) | penalty
    overlong_penalty: float = 0.0  # subtracted from an over-long episode's reward (penalty)
    kl_reward_coef: float = 0.0  # β: reward −= β · Σ_t KL_t to the reference model


@dataclass
class TrainConfig:
    """Everything one ``vime-agent train`` run uses (saved as the run's config.yaml).

    No run-wide seed: each random choice has its own key. ``env.tasks.seed``: the task
    generator's draw and each epoch's task order; ``rollout.collector.seed``: env resets
    and per-request sampling seeds; ``engine.seed``: vLLM's own; ``trainer.seed``: the
    trainer's RNG (dropout); ``model.warm_start_seed``: the tiny model's warm start.
    """

    defaults: list[Any] = field(
        default_factory=lambda: [
            "_self_",
            {"model": "tiny"},
            {"env": "math"},  # after model: an env preset may size the tiny model's warm start
            {"algorithm": "grpo"},
            {"engine": "cpu"},
            {"rollout": "sync"},
        ]
    )
    env: EnvConfig = field(default_factory=EnvConfig)
    model: ModelConfig = field(default_factory=ModelConfig)
    engine: EngineConfig = field(default_factory=EngineConfig)
    trainer: TrainerConfig = field(default_factory=TrainerConfig)
    rollout: RolloutConfig = field(default_factory=RolloutConfig)
    algorithm: AlgorithmConfig = field(default_factory=AlgorithmConfig)
    placement: PlacementConfig = field(default_factory=PlacementConfig)
    reference: ReferenceConfig = field(default_factory=ReferenceConfig)
    critic: CriticConfig = field(default_factory=CriticConfig)  # algorithm.advantage=gae
    agent: AgentConfig = field(default_factory=AgentConfig)  # an agent program to train
    metrics: MetricsConfig = field(default_factory=MetricsConfig)  # TensorBoard, W&B, run page
    trace: TraceConfig = field(default_factory=TraceConfig)  # timelines, vLLM's profiler
    watchdog: WatchdogConfig = field(default_factory=WatchdogConfig)  # a stalled run's report
    # Optimizer steps of the policy; a resumed run goes on to this one. The last step is
    # always checkpointed, and evaluated when eval_every and env.eval_size are > 0.
    steps: int = 40
    run_root: str = "runs"  # a new run's folder: <run_root>/<YYYYmmdd-HHMMSS>-<name>
    name: str = ""  # the run folder's suffix; "" = the env's short name (vime/Math-v0: math)
    # A run folder to go on with: its newest complete checkpoint, its buffered steps after it,
    # then new ones, with the run's own config.yaml and this command's overrides on top.
    resume: str = ""
    # Every N steps, the last one and (new run) before step 1: env.eval_size held-out tasks,
    # a greedy episode each (eval/* metrics, <run>/eval/step_NNNNNN/); 0 = never.
    eval_every: int = 10
    # Checkpoint every N steps (<run>/checkpoints/step_NNNNNN, all kept); 0 = only the last
    # step's (and on Ctrl-C the last completed step's), which are always saved.
    save_every: int = 10
    # Weights to the engines each step (vime.sync.config): sync.method (sync=X for short)
    # disk / nccl / ipc; sync.delta sends only what changed; sync.full_every.
    sync: SyncConfig = field(default_factory=SyncConfig)
    plot: bool = True  # redraw <run>/reward.png (reward/mean, eval/reward) as the run goes

    def __post_init__(self) -> None:
        require(self.steps >= 1, "steps", "must be >= 1")
        require(self.eval_every >= 0, "eval_every", "must be >= 0 (0 = never)")
        require(self.save_every >= 0, "save_every", "must be >= 0 (0 = only at the end)")
        check_train_config(self)  # the cross-key checks (vime.conf.train_checks)
