"""Plain data types shared by every part of vime.

The data path is: an env produces OpenAI-format messages, the collector turns an episode
into an :class:`Episode` (token ids, loss mask, rollout log-probs, reward), and the
trainer consumes :class:`Sample` s built from episodes.

The loss mask is 1 for tokens the policy sampled (and is trained on), 0 for everything
else: the prompt, tool output, user turns and chat-template glue.

Example:
    >>> ep = Episode(task_id="t1", env_id="vime/Math-v0", tokens=[5, 6, 7],
    ...              loss_mask=[0, 1, 1], rollout_logprobs=[0.0, -0.5, -0.1], reward=1.0)
    >>> ep.num_sampled_tokens
    2
"""

from __future__ import annotations

import enum
import math
import os
import random
from dataclasses import dataclass, field, fields
from typing import Any

Message = dict[str, Any]
"""One OpenAI chat message: ``{"role": "user", "content": "..."}`` (plus ``tool_calls`` etc.)."""

# new_uid's generator, seeded from the OS and again in every forked child (or a fork's
# ids would repeat its parent's).
_uid_bits = random.Random(os.urandom(32))
os.register_at_fork(after_in_child=lambda: _uid_bits.seed(os.urandom(32)))


def new_uid() -> str:
    """A random 128-bit id in hex, as ``uuid.uuid4().hex`` writes it (32 digits), for the
    collector's hot path: ``uuid4`` reads the OS's random source by a system call that
    lets go of the GIL, and beside a busy Python thread (an env's) the event loop then
    waited for it again: 0.46 ms an id against 0.5 µs (measured on 2 cores); a main-job
    step makes about 1,600 ids. Unique, not secret: never use it for keys or tokens.

    Example:
        >>> a, b = new_uid(), new_uid()
        >>> len(a), int(a, 16) >= 0, a != b
        (32, True, True)
    """
    return f"{_uid_bits.getrandbits(128):032x}"


MAX_LISTED_ERRORS = 8
"""Parse errors listed in one observation; more are counted, so the observation stays short."""


class EpisodeStatus(enum.StrEnum):
    """How an episode ended.

    - ``completed``: the env said ``terminated`` (the task is over, reward is final).
    - ``truncated``: a limit ended it (turns, tokens, wall time); reward is what was earned.
    - ``aborted``: stopped from outside (engine restart, run shutdown); not trained on.
    - ``error``: the env, sandbox or engine failed; ``Episode.reason`` says why. Not trained on.
    """

    COMPLETED = "completed"
    TRUNCATED = "truncated"
    ABORTED = "aborted"
    ERROR = "error"

    @property
    def trainable(self) -> bool:
        return self in (EpisodeStatus.COMPLETED, EpisodeStatus.TRUNCATED)


# Every status, in the order reports and metrics list them.
STATUSES = tuple(s.value for s in EpisodeStatus)


@dataclass
class SamplingParams:
    """Per-request sampling options sent to the engine.

    Example:
        >>> SamplingParams(temperature=0.7, max_tokens=64).temperature
        0.7
    """

    # Softmax temperature of each request; 0 = greedy. In training it must equal
    # trainer.temperature (checked at start); the RL loop's evaluation samples at 0.
    temperature: float = 1.0
    # Nucleus sampling: only the most likely tokens whose probabilities sum to top_p (1 =
    # all). The trainer replays top_p, top_k and min_p (trainer.sampler_replay): it scores
    # the same truncated distribution the engine sampled from.
    top_p: float = 1.0
    top_k: int = -1  # only the k most likely tokens; -1 (any value <= 0) = all
    # Only tokens at least min_p times as likely as the most likely one (0 = all).
    min_p: float = 0.0
    # Tokens one turn may sample, lowered to what is left of collector.max_model_len.
    max_tokens: int = 256
    stop: list[str] = field(default_factory=list)  # strings that end a turn (vLLM's stop)
    # Sampling seed sent with each request (None: none). collector.seed, when set, replaces
    # it with a seed per episode and turn; without it, every episode of a group (one
    # prompt) gets the same seed, so vLLM draws the same random numbers for each.
    seed: int | None = None
    # Engine-specific request fields passed through as-is, e.g. vLLM's {"ignore_eos": true}.
    # Fields that reshape the distribution ({"structured_outputs": {"regex": ...}},
    # penalties) cannot be replayed by the trainer: training needs trainer.sampler_replay=false.
    extra_body: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if not (self.temperature >= 0):
            raise ValueError(f"SamplingParams.temperature must be >= 0, got {self.temperature}")
        if not (0 < self.top_p <= 1):
            raise ValueError(f"SamplingParams.top_p must be in (0, 1], got {self.top_p}")
        if self.max_tokens < 1:
            raise ValueError(f"SamplingParams.max_tokens must be >= 1, got {self.max_tokens}")
        if not (0 <= self.min_p <= 1):
            raise ValueError(f"SamplingParams.min_p must be in [0, 1], got {self.min_p}")

    def sampler(self) -> dict[str, float]:
        """What the trainer needs to score the distribution these params sample from
        (recorded with each episode as ``Episode.sampler``).

        Example:
            >>> SamplingParams(top_k=0, top_p=0.9).sampler()
            {'temperature': 1.0, 'top_p': 0.9, 'top_k': -1, 'min_p': 0.0}
        """
        return {
            "temperature": self.temperature,
            "top_p": self.top_p,
            "top_k": self.top_k if self.top_k > 0 else -1,
            "min_p": self.min_p,
        }


@dataclass
class ToolCall:
    """A tool call parsed from assistant text. ``arguments`` is the decoded JSON object."""

    name: str
    arguments: dict[str, Any]
    id: str = ""

    def to_openai(self) -> dict[str, Any]:
        """The OpenAI ``tool_calls`` entry for this call."""
        import json

        return {
            "id": self.id,
            "type": "function",
            "function": {"name": self.name, "arguments": json.dumps(self.arguments)},
        }


@dataclass
class Action:
    """What the policy did in one turn: its text and the tool calls parsed from it.

    ``parse_errors`` holds one human-readable message per malformed tool call; the env
    should answer them as an observation rather than crash.

    Example:
        >>> Action(text="The answer is \\\\boxed{4}").tool_calls
        []
    """

    text: str
    tool_calls: list[ToolCall] = field(default_factory=list)
    parse_errors: list[str] = field(default_factory=list)

    def parse_error_message(self, *, others_ran: bool = False) -> str:
        """The observation that tells the model what was wrong with its tool calls.

        The one wording for a malformed call, whoever answers it: the collector (which runs
        nothing of that turn) or an env (which runs the turn's well-formed calls and says so
        with ``others_ran=True``). Each listed error already ends with a valid call written
        in the syntax of the parser that produced it (``Write: ...``). Empty when nothing
        was malformed.

        Example:
            >>> action = Action("x", parse_errors=["bad JSON. Write: <tool_call>{...}</tool_call>"])
            >>> action.parse_error_message().splitlines()
            ['Error: your tool call could not be parsed, so nothing was run.', '- bad JSON. Write: <tool_call>{...}</tool_call>']
        """
        if not self.parse_errors:
            return ""
        if others_ran and self.tool_calls:
            head = "Error: your tool call could not be parsed, so it was not run; the others ran."
        else:
            head = "Error: your tool call could not be parsed, so nothing was run."
        listed = [f"- {e}" for e in self.parse_errors[:MAX_LISTED_ERRORS]]
        if len(self.parse_errors) > MAX_LISTED_ERRORS:
            listed.append(f"- ... and {len(self.parse_errors) - MAX_LISTED_ERRORS} more")
        return "\n".join([head, *listed])

    def to_message(self) -> Message:
        """The assistant message as it enters the conversation."""
        msg: Message = {"role": "assistant", "content": self.text}
        if self.tool_calls:
            msg["tool_calls"] = [c.to_openai() for c in self.tool_calls]
        return msg


@dataclass
class Turn:
    """One policy turn inside an episode (for metrics, debugging and replay)."""

    prompt_tokens: int
    completion_tokens: int
    finish_reason: str
    weight_version: int | None = None
    reward: float = 0.0
    latency_s: float = 0.0
    env_step_s: float = 0.0
    num_tool_calls: int = 0
    num_parse_errors: int = 0


@dataclass
class Episode:
    """One finished episode, as token-level data.

    Invariants (checked on creation):
    ``len(tokens) == len(loss_mask) == len(rollout_logprobs)``, ``loss_mask`` is 0/1,
    and ``rollout_logprobs`` is 0.0 wherever ``loss_mask`` is 0.

    ``weight_versions`` has one entry per token: the engine weight version that sampled
    it, or -1 for tokens the policy did not sample.
    """

    task_id: str
    env_id: str
    tokens: list[int]
    loss_mask: list[int]
    rollout_logprobs: list[float]
    reward: float = 0.0
    status: EpisodeStatus = EpisodeStatus.COMPLETED
    reason: str = ""
    prompt_len: int = 0
    group_id: str = ""
    sample_index: int = 0
    weight_versions: list[int] = field(default_factory=list)
    turns: list[Turn] = field(default_factory=list)
    timings: dict[str, float] = field(default_factory=dict)
    messages: list[Message] = field(default_factory=list)
    metrics: dict[str, float] = field(default_factory=dict)
    metadata: dict[str, Any] = field(default_factory=dict)
    # Unique id of this episode: the DataBuffer de-duplicates on it.
    uid: str = field(default_factory=new_uid)
    # Where each training sample starts in tokens: [] or [0] is one sample; more when
    # collector.sample_per_turn cut the episode into turns (vime.agents.turn_samples).
    sample_starts: list[int] = field(default_factory=list)
    # The sampler of every sampled token (SamplingParams.sampler()): the trainer replays
    # its truncation. None (records written before it existed): the whole vocabulary.
    sampler: dict[str, float] | None = None
    # Routing replay (MoE): per token, the experts the engine routed it to ([layer][k]):
    # a sampled token's from the pass that sampled it, any other token's from the latest
    # request that computed it (vime.agents.routing_records); [] where none did. None:
    # not recorded.
    routed_experts: list[list[list[int]]] | None = None

    def __post_init__(self) -> None:
        self.status = EpisodeStatus(self.status)
        if not self.weight_versions:
            self.weight_versions = [-1] * len(self.tokens)
        n = len(self.tokens)
        lengths = {
            "loss_mask": len(self.loss_mask),
            "rollout_logprobs": len(self.rollout_logprobs),
            "weight_versions": len(self.weight_versions),
        }
        if self.routed_experts is not None:
            lengths["routed_experts"] = len(self.routed_experts)
        bad = {k: v for k, v in lengths.items() if v != n}
        if bad:
            raise ValueError(
                f"Episode {self.task_id!r}: len(tokens)={n} but "
                + ", ".join(f"len({k})={v}" for k, v in bad.items())
            )
        if any(m not in (0, 1) for m in self.loss_mask):
            raise ValueError(f"Episode {self.task_id!r}: loss_mask must hold only 0 and 1")
        if any(not 0 <= s < max(n, 1) for s in self.sample_starts):
            raise ValueError(f"Episode {self.task_id!r}: sample_starts must lie in [0, {n})")
        if not math.isfinite(self.reward):
            raise ValueError(f"Episode {self.task_id!r}: reward must be finite, got {self.reward}")

    @property
    def num_sampled_tokens(self) -> int:
        return sum(self.loss_mask)

    @property
    def trainable(self) -> bool:
        return self.status.trainable and self.num_sampled_tokens > 0

    @property
    def min_weight_version(self) -> int:
        """Oldest weight version among sampled tokens (-1 if none were sampled)."""
        sampled = [v for v, m in zip(self.weight_versions, self.loss_mask, strict=True) if m]
        return min(sampled) if sampled else -1

    def to_dict(self) -> dict[str, Any]:
        """A JSON-serialisable dict (the buffer's on-disk record): ``asdict``'s, built
        without its copy of every token one by one (``copy.deepcopy`` per list element: about
        1 ms per main-job episode, half a second of every step's buffer write).

        Example:
            >>> from dataclasses import asdict
            >>> ep = Episode("t", "e", [5, 6], [0, 1], [0.0, -0.5], turns=[Turn(1, 1, "stop")])
            >>> ep.to_dict() == {**asdict(ep), "status": "completed"}
            True
        """
        d = {}
        for name in _EPISODE_FIELDS:
            value = getattr(self, name)
            # numbers only: a shallow copy is a deep one
            d[name] = list(value) if name in _FLAT_LISTS else _plain(value)
        d["status"] = self.status.value
        return d

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> Episode:
        """Inverse of :meth:`to_dict`."""
        d = dict(d)
        d["turns"] = [Turn(**t) for t in d.get("turns", [])]
        return cls(**d)


@dataclass
class Sample:
    """What the trainer consumes: one sequence with a per-token advantage signal.

    ``advantage`` is shared by every sampled token (outcome-reward estimators). With a
    learned critic (``algorithm.advantage=gae``) ``token_advantages`` holds one advantage per
    token instead (0.0 off the loss mask) and replaces it; ``values`` are the critic's
    predictions when the sample was made and ``returns`` its regression targets, all
    aligned with ``tokens``.

    Example:
        >>> s = Sample(tokens=[1, 2, 3], loss_mask=[0, 1, 1],
        ...            rollout_logprobs=[0.0, -0.3, -0.2], advantage=0.5)
        >>> s.num_loss_tokens
        2
    """

    tokens: list[int]
    loss_mask: list[int]
    rollout_logprobs: list[float]
    advantage: float = 0.0
    reward: float = 0.0
    weight_version: int = -1
    group_id: str = ""
    ref_logprobs: list[float] | None = None
    token_advantages: list[float] | None = None
    values: list[float] | None = None
    returns: list[float] | None = None
    metadata: dict[str, Any] = field(default_factory=dict)
    # How the engine sampled the tokens (SamplingParams.sampler()); None = unknown, scored
    # over the whole vocabulary.
    sampler: dict[str, float] | None = None
    # Routing replay (MoE): per token, the experts the engine routed it to, [layer][k] ids
    # over the MoE layers; [] where not recorded (the last token). None: not recorded.
    routed_experts: list[list[list[int]]] | None = None

    def __post_init__(self) -> None:
        n = len(self.tokens)
        if len(self.loss_mask) != n or len(self.rollout_logprobs) != n:
            raise ValueError(
                f"Sample: len(tokens)={n}, len(loss_mask)={len(self.loss_mask)}, "
                f"len(rollout_logprobs)={len(self.rollout_logprobs)} must be equal"
            )
        per_token = {"token_advantages": self.token_advantages, "values": self.values}
        per_token["returns"] = self.returns
        bad = {k: len(v) for k, v in per_token.items() if v is not None and len(v) != n}
        if self.routed_experts is not None and len(self.routed_experts) != n:
            bad["routed_experts"] = len(self.routed_experts)
        if bad:
            raise ValueError(f"Sample: len(tokens)={n} but lengths {bad}")
        if n < 2:
            raise ValueError("Sample: needs at least 2 tokens (a prompt token and a sampled one)")
        if self.loss_mask and self.loss_mask[0] != 0:
            raise ValueError("Sample: loss_mask[0] must be 0 (the first token has no prediction)")

    @property
    def num_loss_tokens(self) -> int:
        return sum(self.loss_mask)

    @classmethod
    def from_episode(
        cls, ep: Episode, advantage: float, span: tuple[int, int] | None = None
    ) -> Sample:
        """The training sample for ``ep`` with its (group-normalised) advantage; ``span``:
        only ``ep.tokens[start:end]`` (one of its per-turn samples)."""
        a, b = span or (0, len(ep.tokens))
        mask = ep.loss_mask[a:b]
        versions = [v for v, m in zip(ep.weight_versions[a:b], mask, strict=True) if m]
        return cls(
            tokens=ep.tokens[a:b],
            loss_mask=list(mask),
            rollout_logprobs=ep.rollout_logprobs[a:b],
            advantage=advantage,
            reward=ep.reward,
            weight_version=min(versions) if versions else -1,
            group_id=ep.group_id,
            metadata={"task_id": ep.task_id, "env_id": ep.env_id, "status": ep.status.value},
            sampler=ep.sampler,
            routed_experts=None if ep.routed_experts is None else ep.routed_experts[a:b],
        )


# Episode's fields in order, and those whose lists hold only numbers (copied whole; the
# others are converted as ``dataclasses.asdict`` does).
_FLAT_LISTS = ("tokens", "loss_mask", "rollout_logprobs", "weight_versions", "sample_starts")
_EPISODE_FIELDS = tuple(f.name for f in fields(Episode))


def _plain(value: Any) -> Any:
    """``value`` with its dataclasses turned into dicts and its containers copied, as
    ``dataclasses.asdict`` does for a field (other objects are returned, not deep-copied:
    they are serialised right away)."""
    if isinstance(value, list):
        return [_plain(v) for v in value]
    if isinstance(value, dict):
        return {k: _plain(v) for k, v in value.items()}
    if isinstance(value, tuple):
        return tuple(_plain(v) for v in value)
    if hasattr(value, "__dataclass_fields__") and not isinstance(value, type):
        return {f.name: _plain(getattr(value, f.name)) for f in fields(value)}
    return value
