r"""``vime/Math-v0``: a single-turn math environment scored by the last ``\boxed{}`` answer.

Each episode is one question (``"What is 37+58? Answer in \boxed{}."``) and one answer;
``step`` returns no new messages, reward 1.0 if the boxed answer equals the task's
``answer`` (numerically or symbolically, via math-verify) and 0.0 otherwise, and
``terminated=True``. Without a task the env draws an arithmetic question at ``level``
from ``self.np_random``; give it GSM8K/MATH tasks through ``options["task"]``
(see :func:`vime.suites.math.data.load_math_jsonl`).

Example:
    >>> import vime
    >>> env = vime.make("vime/Math-v0")
    >>> messages, info = env.reset(options={"task": {"id": "t1", "question": "What is 2+2?", "answer": "4"}})
    >>> messages[-1]["content"]
    'What is 2+2? Answer in \\boxed{}.'
    >>> env.step(vime.types.Action(text=r"\boxed{4}"))[1:3]
    (1.0, True)
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from vime.config import require, require_choice
from vime.envs import Env
from vime.errors import DataError
from vime.types import Action, Message

from .data import DEFAULT_LEVEL, LEVELS, arithmetic_task, math_task
from .reward import score_answer

INSTRUCTION = "Answer in \\boxed{}."


@dataclass
class MathEnvConfig:
    """Options of :class:`MathEnv` (``vime.make("vime/Math-v0", level="mul1")``).

    Attributes:
        level: the arithmetic level drawn when ``reset`` gets no task (see ``vime.suites.math.data.LEVELS``).
        instruction: appended to the question in the user message ("" for none).
        system_prompt: an optional system message ("" for none: shortest prompt for tiny models).

    Example:
        >>> MathEnvConfig(level="sub2").level
        'sub2'
    """

    level: str = DEFAULT_LEVEL
    instruction: str = INSTRUCTION
    system_prompt: str = ""

    def __post_init__(self) -> None:
        require_choice(self.level, "env.level", LEVELS)
        require(isinstance(self.instruction, str), "env.instruction", "must be a string")
        require(isinstance(self.system_prompt, str), "env.system_prompt", "must be a string")


class MathEnv(Env):
    r"""Single-turn math: ask one question, score the ``\boxed{}`` answer.

    Task records: ``{"id", "question", "answer"}`` (``answer`` is the bare final answer),
    or raw GSM8K (``answer`` ending in ``#### N``) and MATH (``problem``/``solution``) records.

    Example:
        >>> env = MathEnv(level="add1")
        >>> msgs, info = env.reset(seed=0)
        >>> msgs[-1]["content"]
        'What is 8+6? Answer in \\boxed{}.'
    """

    def __init__(self, **options: Any) -> None:
        super().__init__()
        self.config = MathEnvConfig(**options)
        self._result: dict[str, float] = {}
        self._problem: dict[str, Any] = {}

    def reset(
        self, *, seed: int | None = None, options: dict[str, Any] | None = None
    ) -> tuple[list[Message], dict[str, Any]]:
        super().reset(seed=seed, options=options)
        if not self.task:
            self.task = arithmetic_task(self.np_random, self.config.level)
        try:
            # Raw GSM8K/MATH records work too: the answer is taken from '#### N' or \boxed{}.
            self._problem = math_task(self.task)
        except DataError as err:
            raise DataError(
                f"math task {self.task.get('id')!r}: {err}; math tasks are "
                "{'id', 'question', 'answer'} or GSM8K/MATH records"
            ) from err
        self._result = {}
        question = str(self._problem["question"])
        content = f"{question} {self.config.instruction}" if self.config.instruction else question
        messages: list[Message] = []
        if self.config.system_prompt:
            messages.append({"role": "system", "content": self.config.system_prompt})
        messages.append({"role": "user", "content": content})
        return messages, {"task_id": self.task.get("id")}

    def step(self, action: Action) -> tuple[list[Message], float, bool, bool, dict[str, Any]]:
        score = score_answer(action.text, self._problem["answer"])
        self._result = {"correct": float(score.correct), "format_ok": float(score.format_ok)}
        info = {
            "correct": score.correct,
            "format_ok": score.format_ok,
            "extracted": score.extracted,
            "reason": score.reason,
        }
        return [], score.reward, True, False, info

    def episode_metrics(self) -> dict[str, float]:
        """``correct`` and ``format_ok`` (1.0/0.0) of the last answer."""
        return dict(self._result)
