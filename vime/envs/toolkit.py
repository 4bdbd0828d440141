"""The tool kit of every tool-using env: one decorated function is one tool.

:func:`tool` turns a function into a :class:`Tool` whose OpenAI function schema comes
from the signature (types, defaults) and the docstring (the description, and one line per
argument under ``Args:``). A :class:`Toolset` validates the arguments of a parsed
:class:`~vime.types.ToolCall` and runs it; whatever goes wrong (unknown tool, missing or
mistyped argument, the tool raising) comes back as an observation string, so a policy's
malformed call never crashes an episode. Tools that need the sandbox take a first
parameter named ``ctx`` (a :class:`~vime.envs.tool_context.ToolContext`, in its own
module); it is not part of the schema. :class:`ToolEnv` is the base of envs whose policy acts through a toolset (it owns the
episode's context, counters, metrics and ``close``).

Example:
    >>> @tool
    ... def add(a: int, b: int = 1) -> str:
    ...     '''Add two integers.
    ...
    ...     Args:
    ...         a: the first number.
    ...         b: the second number.
    ...     '''
    ...     return str(a + b)
    >>> add.schema["function"]["parameters"]["required"]
    ['a']
    >>> Toolset([add]).call(ToolCall(name="add", arguments={"a": 2}), ToolContext())
    '3'
"""

from __future__ import annotations

import inspect
import posixpath
import re
import time
import types
import typing
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

from vime.envs.base import Env
from vime.envs.tool_context import ToolContext, clip
from vime.envs.tool_context import format_exec as format_exec  # its old home: still importable
from vime.errors import EnvError, SandboxError
from vime.types import Action, Message, ToolCall


class ToolError(Exception):
    """Raised by a tool for a problem the policy caused; the message becomes the observation.

    Example:
        >>> @tool
        ... def half(n: int) -> str:
        ...     '''Halve an even number.'''
        ...     if n % 2:
        ...         raise ToolError(f"{n} is odd")
        ...     return str(n // 2)
        >>> Toolset([half]).call(ToolCall("half", {"n": 3}), ToolContext())
        'error: 3 is odd'
    """


def resolve_path(ctx: ToolContext, path: str, place: str = "workspace") -> str:
    """Absolute path of ``path`` inside ``ctx.workdir``; one that leaves it raises ToolError.

    ``place`` names the folder in the error (``"workspace"``, ``"repository"``).

    Example:
        >>> resolve_path(ToolContext(workdir="/repo"), "pkg/../a.py", "repository")
        '/repo/a.py'
    """
    full = posixpath.normpath(posixpath.join(ctx.workdir, path))
    if full != ctx.workdir and not full.startswith(ctx.workdir.rstrip("/") + "/"):
        raise ToolError(f"path {path!r} is outside the {place} {ctx.workdir}; use a relative path")
    return full


_JSON_TYPES: dict[Any, str] = {
    str: "string",
    int: "integer",
    float: "number",
    bool: "boolean",
    list: "array",
    dict: "object",
}


def _json_schema(annotation: Any, where: str) -> dict[str, Any]:
    """JSON schema of a parameter annotation (str, int, float, bool, list[X], dict, Literal, X | None)."""
    origin = typing.get_origin(annotation)
    if origin is typing.Literal:
        values = list(typing.get_args(annotation))
        return {"type": _JSON_TYPES[type(values[0])], "enum": values}
    if origin in (typing.Union, types.UnionType):
        args = [a for a in typing.get_args(annotation) if a is not type(None)]
        if len(args) == 1:
            return _json_schema(args[0], where)
    if origin is list:
        (item,) = typing.get_args(annotation) or (str,)
        return {"type": "array", "items": _json_schema(item, where)}
    if origin is dict:
        return {"type": "object"}
    if annotation in _JSON_TYPES:
        return {"type": _JSON_TYPES[annotation]}
    raise TypeError(
        f"{where}: unsupported annotation {annotation!r}; use str, int, float, bool, "
        "list[...], dict, Literal[...] or X | None"
    )


_ARG_LINE = re.compile(r"^\s*(\w+)\s*(?:\([^)]*\))?\s*:\s*(.*)$")


def _parse_docstring(doc: str) -> tuple[str, dict[str, str]]:
    """Split a Google-style docstring into (description, {arg: description})."""
    doc = inspect.cleandoc(doc or "")
    description_lines: list[str] = []
    args: dict[str, str] = {}
    section = "description"
    current = None
    for line in doc.splitlines():
        stripped = line.strip()
        if stripped in ("Args:", "Arguments:", "Parameters:"):
            section = "args"
            continue
        if stripped.endswith(":") and stripped[:-1] in ("Returns", "Raises", "Example", "Examples"):
            section = "other"
            continue
        if section == "description":
            description_lines.append(line)
        elif section == "args" and stripped:
            match = _ARG_LINE.match(line)
            if match and line.startswith("    ") and not line.startswith("        "):
                current = match.group(1)
                args[current] = match.group(2).strip()
            elif current:
                args[current] = f"{args[current]} {stripped}"
    description = " ".join(" ".join(description_lines).split())
    return description, args


@dataclass(frozen=True)
class Tool:
    """A callable tool with its OpenAI function schema. Build it with :func:`tool`.

    Example:
        >>> @tool
        ... def echo(text: str) -> str:
        ...     '''Repeat the text.'''
        ...     return text
        >>> echo.name, echo.schema["type"]
        ('echo', 'function')
    """

    name: str
    description: str
    parameters: dict[str, Any]
    fn: Callable[..., Any]
    takes_ctx: bool = False

    @property
    def schema(self) -> dict[str, Any]:
        """The OpenAI tool entry: ``{"type": "function", "function": {...}}``."""
        return {
            "type": "function",
            "function": {
                "name": self.name,
                "description": self.description,
                "parameters": self.parameters,
            },
        }

    def validate(self, arguments: Any) -> dict[str, Any]:
        """Check ``arguments`` against the schema; raise :class:`ToolError` saying what is wrong.

        Example:
            >>> @tool
            ... def sq(x: int) -> str:
            ...     '''Square.'''
            ...     return str(x * x)
            >>> try:
            ...     sq.validate({"x": "3"})
            ... except ToolError as err:
            ...     print(err)
            argument 'x' of sq must be integer, got string '3'
        """
        if not isinstance(arguments, dict):
            raise ToolError(
                f"arguments of {self.name} must be a JSON object, got {type(arguments).__name__}"
            )
        props = self.parameters["properties"]
        unknown = sorted(set(arguments) - set(props))
        if unknown:
            raise ToolError(
                f"{self.name} has no argument(s) {unknown}; its arguments are {sorted(props)}"
            )
        missing = [name for name in self.parameters["required"] if name not in arguments]
        if missing:
            raise ToolError(f"{self.name} is missing required argument(s) {missing}")
        out = {}
        for name, value in arguments.items():
            out[name] = _check_value(value, props[name], f"argument {name!r} of {self.name}")
        return out

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        return self.fn(*args, **kwargs)


def _check_value(value: Any, schema: dict[str, Any], where: str) -> Any:
    kind = schema.get("type")
    if "enum" in schema and value not in schema["enum"]:
        raise ToolError(f"{where} must be one of {schema['enum']}, got {value!r}")
    ok = {
        "string": isinstance(value, str),
        "integer": isinstance(value, int) and not isinstance(value, bool),
        "number": isinstance(value, int | float) and not isinstance(value, bool),
        "boolean": isinstance(value, bool),
        "array": isinstance(value, list),
        "object": isinstance(value, dict),
    }.get(str(kind), True)
    if not ok:
        got = {
            str: "string",
            bool: "boolean",
            int: "integer",
            float: "number",
            list: "array",
            dict: "object",
        }
        type_name = got.get(type(value), type(value).__name__)
        raise ToolError(f"{where} must be {kind}, got {type_name} {value!r:.60}")
    if kind == "array" and "items" in schema:
        return [_check_value(v, schema["items"], f"{where}[{i}]") for i, v in enumerate(value)]
    return value


def tool(fn: Callable[..., Any] | None = None, *, name: str | None = None) -> Any:
    """Make ``fn`` a :class:`Tool`: schema from its signature, description from its docstring.

    Parameters without a default are required. A first parameter named ``ctx`` receives
    the episode's :class:`ToolContext` and is hidden from the schema. The function
    returns the observation (anything; it is turned into a string).

    Example:
        >>> @tool(name="shout")
        ... def upper(text: str) -> str:
        ...     '''Upper-case the text.
        ...
        ...     Args:
        ...         text: what to shout.
        ...     '''
        ...     return text.upper()
        >>> upper.schema["function"]["parameters"]["properties"]["text"]
        {'type': 'string', 'description': 'what to shout.'}
    """

    def build(func: Callable[..., Any]) -> Tool:
        tool_name = name or func.__name__
        where = f"@tool {tool_name}"
        if not re.fullmatch(r"[a-zA-Z0-9_-]{1,64}", tool_name):
            raise TypeError(f"{where}: a tool name must match [a-zA-Z0-9_-]{{1,64}}")
        description, arg_docs = _parse_docstring(func.__doc__ or "")
        if not description:
            raise TypeError(
                f"{where}: add a docstring; its first paragraph is the tool description"
            )
        hints = typing.get_type_hints(func)
        params = list(inspect.signature(func).parameters.values())
        takes_ctx = bool(params) and params[0].name == "ctx"
        properties: dict[str, Any] = {}
        required: list[str] = []
        for p in params[1:] if takes_ctx else params:
            if p.kind in (p.VAR_POSITIONAL, p.VAR_KEYWORD):
                raise TypeError(f"{where}: *args/**kwargs cannot be described by a schema")
            if p.name not in hints:
                raise TypeError(f"{where}: annotate parameter {p.name!r} with its type")
            prop = _json_schema(hints[p.name], f"{where}, parameter {p.name!r}")
            if p.name in arg_docs:
                prop["description"] = arg_docs[p.name]
            if p.default is p.empty:
                required.append(p.name)
            else:
                prop["default"] = p.default
            properties[p.name] = prop
        parameters = {"type": "object", "properties": properties, "required": required}
        return Tool(tool_name, description, parameters, func, takes_ctx)

    return build(fn) if fn is not None else build


class Toolset:
    """A named collection of tools that validates and runs tool calls.

    Example:
        >>> @tool
        ... def ping() -> str:
        ...     '''Answer pong.'''
        ...     return "pong"
        >>> ts = Toolset([ping])
        >>> ts.call(ToolCall(name="pong", arguments={}), ToolContext())
        "error: unknown tool 'pong'; available tools: ping"
    """

    def __init__(self, tools: Iterable[Tool]) -> None:
        self.tools: dict[str, Tool] = {}
        for t in tools:
            if not isinstance(t, Tool):
                raise TypeError(f"Toolset: {t!r} is not a Tool; decorate the function with @tool")
            if t.name in self.tools:
                raise TypeError(f"Toolset: two tools are named {t.name!r}")
            self.tools[t.name] = t

    @property
    def schemas(self) -> list[dict[str, Any]]:
        """OpenAI schemas of all tools, in the order given (for ``Env.tools``)."""
        return [t.schema for t in self.tools.values()]

    def __contains__(self, name: str) -> bool:
        return name in self.tools

    def call(self, call: ToolCall, ctx: ToolContext) -> str:
        """Run one call and return its observation text; problems become ``error: ...`` text.

        Sandbox and env failures (:class:`SandboxError`, :class:`EnvError`) propagate: they
        are not the policy's fault and must end the episode with an error status.
        """
        t = self.tools.get(call.name)
        if t is None:
            return f"error: unknown tool {call.name!r}; available tools: {', '.join(self.tools)}"
        try:
            kwargs = t.validate(call.arguments)
            result = t.fn(ctx, **kwargs) if t.takes_ctx else t.fn(**kwargs)
        except ToolError as err:
            return f"error: {err}"
        except (SandboxError, EnvError):
            raise
        except Exception as err:  # a tool failing on the policy's input is an observation
            return f"error: {call.name} raised {type(err).__name__}: {err}"
        return clip(str(result), ctx.max_output_chars)


def tool_message(call: ToolCall, index: int, content: str) -> Message:
    """The ``role: tool`` message answering ``call`` (ids default to ``call_<index>``).

    Example:
        >>> tool_message(ToolCall(name="x", arguments={}), 0, "ok")
        {'role': 'tool', 'tool_call_id': 'call_0', 'name': 'x', 'content': 'ok'}
    """
    return {
        "role": "tool",
        "tool_call_id": call.id or f"call_{index}",
        "name": call.name,
        "content": content,
    }


class ToolEnv(Env):
    """Base of envs whose policy acts through a :class:`Toolset`.

    It owns what every such env keeps per episode: the :class:`ToolContext` (:attr:`ctx`,
    whose sandbox :meth:`close` releases), the counters in :attr:`stats` (``tool_calls``,
    ``tool_errors``, ``parse_errors`` and the env's own), the turn count and the start
    time; :meth:`episode_metrics` reports them. The turn limit is the registered one
    (``vime.register(..., max_turns=)``, as ``vime.make`` applied it): :attr:`max_turns`.

    A subclass passes its toolset to ``__init__``; its ``reset`` calls ``super().reset``
    (which releases the last episode's sandbox), then :meth:`start_episode`; its ``step``
    calls :meth:`begin_turn`, runs calls with :meth:`run_tool`, adds
    :meth:`parse_error_reply` and ends at :meth:`limit_hit`.

    Example:
        >>> @tool
        ... def echo(text: str) -> str:
        ...     '''Repeat the text.'''
        ...     return text
        >>> class Echo(ToolEnv):
        ...     def reset(self, *, seed=None, options=None):
        ...         super().reset(seed=seed, options=options)
        ...         self.start_episode(ToolContext())
        ...         return [{"role": "user", "content": "Call echo."}], {}
        ...     def step(self, action):
        ...         self.begin_turn(action)
        ...         new = [self.run_tool(c, i) for i, c in enumerate(action.tool_calls)]
        ...         return new + self.parse_error_reply(action), 0.0, True, False, {}
        >>> env = Echo(Toolset([echo]))
        >>> _ = env.reset()
        >>> env.step(Action(text="", tool_calls=[ToolCall("echo", {"text": "hi"})]))[0][0]["content"]
        'hi'
        >>> env.episode_metrics()
        {'tool_calls': 1.0, 'tool_errors': 0.0, 'parse_errors': 0.0, 'turns': 1.0, 'sandbox_used': 0.0}
    """

    def __init__(self, toolset: Toolset) -> None:
        super().__init__()
        self.toolset = toolset
        self.tools = toolset.schemas
        self.ctx = ToolContext()
        self.turn = 0
        self.started = time.monotonic()
        self.stats: dict[str, float] = {}
        self._task_pool: list[dict[str, Any]] | None = None

    def reset(
        self, *, seed: int | None = None, options: dict[str, Any] | None = None
    ) -> tuple[list[Message], dict[str, Any]]:
        """Release the last episode's sandbox (if ``close`` was not called), then as :meth:`Env.reset`."""
        self.ctx.close()
        return super().reset(seed=seed, options=options)

    def draw_task(self, load: Callable[[], list[dict[str, Any]]]) -> None:
        """Without a task from ``reset``, draw one with ``np_random`` from ``load()`` (read once).

        Example:
            >>> env = ToolEnv(Toolset([]))
            >>> _ = env.reset(seed=0)
            >>> env.draw_task(lambda: [{"id": "a"}])
            >>> env.task
            {'id': 'a'}
        """
        if self.task:
            return
        if self._task_pool is None:
            self._task_pool = load()
        pool = self._task_pool
        self.task = dict(pool[int(self.np_random.integers(len(pool)))])

    def start_episode(self, ctx: ToolContext, **stats: float) -> None:
        """Install the episode's context and zero the counters (see the class example).

        ``stats`` are the env's own counters with their start values (``correct=0.0``).
        """
        self.ctx.close()  # a live context replaced mid-episode would leak its sandbox
        self.ctx = ctx
        self.turn = 0
        self.started = time.monotonic()
        self.stats = {"tool_calls": 0.0, "tool_errors": 0.0, "parse_errors": 0.0, **stats}

    def begin_turn(self, action: Action) -> None:
        """Count the turn and its malformed calls; call it first in ``step`` (see the class example)."""
        self.turn += 1
        self.stats["parse_errors"] += len(action.parse_errors)

    def run_tool(self, call: ToolCall, index: int) -> Message:
        """Run one call in :attr:`ctx`, count it, return its tool message (see the class example)."""
        self.stats["tool_calls"] += 1
        content = self.toolset.call(call, self.ctx)
        self.stats["tool_errors"] += content.startswith("error:")
        return tool_message(call, index, content)

    def parse_error_reply(self, action: Action) -> list[Message]:
        """The user message answering the turn's malformed calls (``[]`` when none).

        The text is :meth:`vime.types.Action.parse_error_message` (each error written by
        the tool-call parser, in its own syntax), so the env and the collector word a
        malformed call the same way.

        Example:
            >>> ToolEnv(Toolset([])).parse_error_reply(Action(text="", parse_errors=["bad"]))
            [{'role': 'user', 'content': 'Error: your tool call could not be parsed, so nothing was run.\\n- bad'}]
        """
        if not action.parse_errors:
            return []
        return [{"role": "user", "content": action.parse_error_message(others_ran=True)}]

    @property
    def max_turns(self) -> int | None:
        """The registered turn limit as ``vime.make`` applied it (``None``: built without one)."""
        return self.spec.max_episode_steps if self.spec is not None else None

    def limit_hit(self, max_seconds: float) -> str:
        """Which limit ends the episode after this turn: ``"max_turns"``, ``"wall_time"`` or ``""``.

        The env must see the turn limit itself (``vime.make`` would truncate there anyway)
        when its last turn has work to do: grade, release the sandbox.

        Example:
            >>> ToolEnv(Toolset([])).limit_hit(max_seconds=60.0)
            ''
        """
        if self.max_turns is not None and self.turn >= self.max_turns:
            return "max_turns"
        if self.elapsed() >= max_seconds:
            return "wall_time"
        return ""

    def elapsed(self) -> float:
        """Seconds since the episode started."""
        return time.monotonic() - self.started

    def episode_metrics(self) -> dict[str, float]:
        """The counters, the turns used, whether a sandbox was acquired and on which docker
        host (:meth:`ToolContext.host_metrics`; see the class example)."""
        used = {"sandbox_used": float(self.ctx.acquired), **self.ctx.host_metrics()}
        return {**self.stats, "turns": float(self.turn), **used}

    def close(self) -> None:
        """Release the episode's sandbox, if one was acquired. Safe to call twice."""
        self.ctx.close()
