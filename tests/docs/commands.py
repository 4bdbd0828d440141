"""Checking a shell command from the docs without running it (``gpu N`` blocks, on any
machine).

A ``vime-agent`` command is checked against the real command line: the subcommand must
exist, ``train``'s overrides must load with ``load_config`` (so a renamed key or a bad
value in the docs fails), and other subcommands' keys and ``--flags`` must appear in
their own ``--help``. A bench script's ``--flags`` must appear in its ``--help``.

Example:
    >>> vime_args(["torchrun", "--nproc-per-node", "2", "-m", "vime.cli", "train", "steps=2"])
    ['train', 'steps=2']
"""

from __future__ import annotations

import contextlib
import functools
import io
import re
import shlex
import subprocess
import sys
from pathlib import Path

from tests.docs.blocks import ROOT

WRAPPERS = {"nice", "timeout", "srun", "env"}  # run the command after their own options
SHELL_ONLY = {"export", "cd", "source"}  # set up the shell; nothing to check


def unwrap(words: list[str]) -> list[str]:
    """The command inside env assignments (``A=1 cmd``) and wrappers (``nice -n 10 cmd``)."""
    while words and re.fullmatch(r"[A-Z_][A-Z0-9_]*=.*", words[0]):
        words = words[1:]
    if words and words[0] in WRAPPERS:
        words = words[1:]
        while words and (words[0].startswith("-") or re.fullmatch(r"[\d.]+", words[0])):
            words = words[1:]
        return unwrap(words)
    return words


def vime_args(words: list[str]) -> list[str] | None:
    """The ``vime-agent`` arguments of a command line, or None when it runs something else."""
    words = unwrap(words)
    if not words:
        return None
    if words[0].endswith("vime-agent"):
        return words[1:]
    if words[:2] == ["bash", "scripts/main.sh"]:
        return ["train", *words[2:]]
    module = words[words.index("-m") + 1 : words.index("-m") + 2] if "-m" in words else []
    if module == ["vime.cli"] and re.search(r"(python3?|torchrun)$", words[0]):
        return words[words.index("-m") + 2 :]
    return None


def bench_script(cmd: str) -> str | None:
    """The bench script a command runs with Python, or None.

    Example:
        >>> bench_script("OMP_NUM_THREADS=1 nice -n 10 .venv/bin/python bench/fleet.py")
        'bench/fleet.py'
    """
    words = unwrap(shlex.split(cmd))
    if len(words) >= 2 and re.search(r"python3?$", words[0]) and words[1].startswith("bench/"):
        return words[1]
    return None


@functools.cache
def help_text(*args: str) -> str:
    """What ``vime-agent ARGS --help`` prints (in this process: imports are shared)."""
    from vime.cli import main

    out = io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(out):
        try:
            code = main([*args, "--help"])
        except SystemExit as exit_:
            code = int(exit_.code or 0)
    assert code == 0, f"vime-agent {' '.join(args)} --help exited {code}: {out.getvalue()}"
    return out.getvalue()


def check_vime(args: list[str]) -> None:
    """Raise AssertionError naming what in ``vime-agent ARGS`` does not exist."""
    from vime.cli import COMMANDS
    from vime.conf.compose import load_config

    assert args, "a bare vime-agent"
    sub, rest = args[0], args[1:]
    if "--" in rest:  # what follows is another program's command line (own-agent)
        rest = rest[: rest.index("--")]
    if sub in ("-h", "--help"):
        return
    assert sub in COMMANDS, f"vime-agent has no command {sub!r}"
    if sub == "train":
        overrides = [a for a in rest if a not in ("--help", "-h")]
        load_config(overrides)  # a ConfigError names the key
        return
    text = help_text(sub)
    first = next((a for a in rest if re.fullmatch(r"[a-z][\w-]*", a)), None)
    if first and re.search(rf"\b{first}\b", text) and sub in ("model", "sandbox"):
        text += help_text(sub, first)
    for arg in rest:
        key = arg.split("=", 1)[0] if "=" in arg and not arg.startswith("-") else None
        flag = arg.split("=", 1)[0] if arg.startswith("--") else None
        for name in filter(None, (key, flag)):
            assert re.search(rf"(?<![\w-]){re.escape(name)}\b", text), (
                f"vime-agent {sub}: {name!r} is not in `vime-agent {sub} --help`"
            )


@functools.cache
def script_help(script: str) -> str:
    """What ``python SCRIPT --help`` prints (a bench script)."""
    out = subprocess.run(
        [sys.executable, script, "--help"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert out.returncode == 0, f"{script} --help failed: {out.stderr[-2000:]}"
    return out.stdout


@functools.cache
def _tool_help(args: tuple[str, ...]) -> str:
    """What a venv tool prints for ``TOOL ARGS --help``."""
    tool = Path(sys.executable).parent / args[0]
    out = subprocess.run([str(tool), *args[1:], "--help"], capture_output=True, text=True)
    assert out.returncode == 0, out.stderr[-2000:]
    return out.stdout


def check_command(cmd: str) -> str:
    """Check one command without running it; return how it was checked (for the report)."""
    words = unwrap(shlex.split(cmd))
    args = vime_args(words)
    if args is not None:
        check_vime(args)
        return f"vime-agent {args[0] if args else ''}: checked"
    if words and words[0] in SHELL_ONLY:
        return "shell setup"
    if words[:2] == ["bash", "scripts/test.sh"] or words[:2] == ["bash", "scripts/setup.sh"]:
        assert (ROOT / words[1]).exists(), f"{words[1]} does not exist"
        return f"{words[1]}: exists"
    script = bench_script(cmd)
    if script:
        text = script_help(script)
        for flag in (w.split("=")[0] for w in words[2:] if w.startswith("--")):
            assert flag in text, f"{script}: no flag {flag} in its --help"
        return f"{script}: flags checked"
    if words[:2] in (["mkdocs", "build"], [".venv/bin/mkdocs", "build"]):
        text = _tool_help(("mkdocs", "build"))
        for flag in (w.split("=")[0] for w in words[2:] if w.startswith("--")):
            assert flag in text, f"mkdocs build has no flag {flag}"
        return "mkdocs build: flags checked (tests/docs/test_site.py builds the site)"
    if words and words[0] == "pip" and "install" in words:
        return "pip install"
    raise AssertionError(
        f"no way to check {cmd!r} without running it: run the block "
        "or add a check to tests/docs/commands.py"
    )
