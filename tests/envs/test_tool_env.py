"""ToolEnv: the registered turn limit, counters, parse-error replies and sandbox release."""

from __future__ import annotations

import pytest

import vime
from vime.envs import ToolContext, ToolEnv, Toolset, tool
from vime.errors import EnvError
from vime.types import Action, ToolCall


@tool
def echo(text: str) -> str:
    """Repeat the text.

    Args:
        text: what to repeat.
    """
    return text


class FakeSandbox:
    """Stands in for a Docker sandbox: only ``close`` matters here."""

    def __init__(self) -> None:
        self.closed = False

    def close(self) -> None:
        self.closed = True


class Echo(ToolEnv):
    """Calls run until a limit ends the episode; the env reports which one itself."""

    def __init__(self) -> None:
        super().__init__(Toolset([echo]))
        self.sandboxes: list[FakeSandbox] = []

    def _sandbox(self) -> FakeSandbox:
        self.sandboxes.append(FakeSandbox())
        return self.sandboxes[-1]

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed, options=options)
        self.draw_task(lambda: [{"id": "only"}])
        self.start_episode(ToolContext(sandbox_factory=self._sandbox), echoed=0.0)
        return [{"role": "user", "content": "Call echo."}], {"task_id": self.task["id"]}

    def step(self, action):
        self.begin_turn(action)
        new = [self.run_tool(c, i) for i, c in enumerate(action.tool_calls)]
        new += self.parse_error_reply(action)
        limit = self.limit_hit(max_seconds=60.0)
        return new, 0.0, False, bool(limit), {"truncated_by": limit} if limit else {}


vime.register("test/ToolEcho-v0", entry_point=Echo, max_turns=2)
CALL = Action(text="", tool_calls=[ToolCall("echo", {"text": "hi"})])


def test_turn_limit_is_the_registered_one():
    assert Echo().max_turns is None  # built without make: no limit of its own
    assert vime.make("test/ToolEcho-v0").unwrapped.max_turns == 2
    env = vime.make("test/ToolEcho-v0", max_turns=3)
    env.reset(seed=0)
    assert [env.step(CALL)[3] for _ in range(2)] == [False, False]
    _, _, _, truncated, info = env.step(CALL)
    assert truncated and info["truncated_by"] == "max_turns"


def test_counters_and_parse_error_reply():
    env = vime.make("test/ToolEcho-v0")
    env.reset(seed=0)
    bad = Action(
        text="",
        tool_calls=[ToolCall("echo", {"text": "hi"}), ToolCall("echo", {})],
        parse_errors=['tool call 3: missing "name". Write: {"name": ...}'],
    )
    new, *_ = env.step(bad)
    assert [m["role"] for m in new] == ["tool", "tool", "user"]
    assert new[2]["content"].startswith("Error: your tool call could not be parsed")
    assert "the others ran" in new[2]["content"] and 'Write: {"name"' in new[2]["content"]
    assert env.episode_metrics() == {
        "tool_calls": 2.0,
        "tool_errors": 1.0,
        "parse_errors": 1.0,
        "echoed": 0.0,
        "turns": 1.0,
        "sandbox_used": 0.0,
    }
    only_bad = env.unwrapped.parse_error_reply(Action(text="", parse_errors=["x"]))
    assert "nothing was run" in only_bad[0]["content"]


def test_reset_and_close_release_the_sandbox():
    env = Echo()
    env.reset(seed=0)
    env.ctx.sandbox  # noqa: B018 (first use creates it)
    env.reset(seed=1)
    assert env.sandboxes[0].closed and env.episode_metrics()["sandbox_used"] == 0.0
    env.ctx.sandbox  # noqa: B018
    assert env.episode_metrics()["sandbox_used"] == 1.0
    env.close()
    env.close()
    assert all(s.closed for s in env.sandboxes) and len(env.sandboxes) == 2


def test_a_sandbox_that_cannot_be_prepared_is_an_env_error_not_an_answer():
    # A tool that reads ctx.sandbox once answered the policy "error: <tool> raised
    # IndexError: ..." when the env's on_acquire failed that way: the episode went on with
    # no sandbox and no error status, as if the policy had erred.
    @tool
    def run(ctx: ToolContext) -> str:
        """Use the sandbox."""
        return str(ctx.sandbox)

    made: list[FakeSandbox] = []

    def make() -> FakeSandbox:
        made.append(FakeSandbox())
        return made[-1]

    def prepare(sandbox: FakeSandbox) -> None:
        [][-1]  # e.g. a setup command's output parsed when it printed nothing

    ctx = ToolContext(sandbox_factory=make, on_acquire=prepare, task={"id": "t1"})
    with pytest.raises(EnvError, match=r"preparing the episode's sandbox raised IndexError") as err:
        Toolset([run]).call(ToolCall("run", {}), ctx)
    assert err.value.task_id == "t1" and made[0].closed and not ctx.acquired

    def broken() -> FakeSandbox:
        raise RuntimeError("can't start new thread")

    with pytest.raises(EnvError, match=r"making the episode's sandbox raised RuntimeError"):
        Toolset([run]).call(ToolCall("run", {}), ToolContext(sandbox_factory=broken))
