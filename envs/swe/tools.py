"""The SWE agent's tools: a shell, a string-replace editor and whole-file writes.

All of them act on the episode's repository sandbox (``ctx.sandbox``, working folder
``ctx.workdir`` = the task's repository). ``submit`` is declared here and handled by
:class:`vime.suites.swe.env.SWEEnv` (it ends the episode and grades the diff).

Example:
    >>> [t.name for t in SWE_TOOLS]
    ['bash', 'str_replace', 'write_file', 'submit']
"""

from __future__ import annotations

from vime.envs.tool_context import ToolContext, format_exec
from vime.envs.toolkit import ToolError, resolve_path, tool
from vime.errors import SandboxError


@tool
def bash(ctx: ToolContext, command: str) -> str:
    """Run a shell command in the repository folder and return its exit code and output.

    Args:
        command: e.g. "ls -R", "grep -rn 'def merge' .", "python3 -m unittest -q" or "cat -n pkg/mod.py".
    """
    result = ctx.sandbox.exec(
        ["/bin/sh", "-c", command], timeout=ctx.exec_timeout, workdir=ctx.workdir
    )
    return format_exec(result, ctx.max_output_chars)


@tool
def str_replace(ctx: ToolContext, path: str, old_str: str, new_str: str) -> str:
    """Replace one exact occurrence of old_str by new_str in a file.

    Args:
        path: file path relative to the repository.
        old_str: the exact text to replace; it must occur exactly once (add context lines if not).
        new_str: the replacement text.
    """
    full = resolve_path(ctx, path, "repository")
    try:
        text = ctx.sandbox.read_file(full).decode()
    except UnicodeDecodeError as err:
        raise ToolError(f"{path} is not a UTF-8 text file") from err
    except SandboxError as err:
        if not getattr(ctx.sandbox, "alive", True):
            raise  # the sandbox died: an env failure, not the policy's mistake
        raise ToolError(f"cannot read {path}: it does not exist or is not a file") from err
    count = text.count(old_str) if old_str else 0
    if count != 1:
        where = "does not occur" if count == 0 else f"occurs {count} times"
        raise ToolError(
            f"old_str {where} in {path}; it must match exactly once (copy it from `cat -n {path}`)"
        )
    ctx.sandbox.write_file(full, text.replace(old_str, new_str))
    line = text[: text.index(old_str)].count("\n") + 1
    return f"replaced 1 occurrence in {path} at line {line}"


@tool
def write_file(ctx: ToolContext, path: str, content: str) -> str:
    """Create or overwrite a file with the given content.

    Args:
        path: file path relative to the repository; folders are created.
        content: the complete new content.
    """
    ctx.sandbox.write_file(resolve_path(ctx, path, "repository"), content)
    return f"wrote {len(content.encode())} bytes to {path}"


@tool
def submit() -> str:
    """Finish: your changes to the repository are graded by tests you cannot see."""
    return "submitted"


SWE_TOOLS = (bash, str_replace, write_file, submit)
