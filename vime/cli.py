"""``vime-agent``: the command line.

Each command lives next to the code it drives and is imported only when it runs, so
``vime-agent --help`` stays fast. A command is a function ``main(argv: list[str]) -> int``
that parses its own options; ``key=value`` overrides are passed through to it.

Example:
    $ vime-agent model tiny --out /tmp/tiny
    $ vime-agent train env=math rollout.batch_size=32
"""

from __future__ import annotations

import argparse
import importlib
import sys
from collections.abc import Callable

from vime.errors import VimeError

# command -> (module:function, one-line help)
COMMANDS: dict[str, tuple[str, str]] = {
    "train": (
        "vime.rl.train_command:main",
        "run RL training: vime-agent train env=math|tools|swe [key=value ...]",
    ),
    "eval": (
        "vime.eval.evaluate:main",
        "evaluate a checkpoint on a suite: vime-agent eval ckpt=CKPT|RUN|URL suite=math|FILE.yaml "
        "(eval compare A B ...: reports side by side)",
    ),
    "export": (
        "vime.runs.export:main",
        "a run's checkpoint as an HF folder: vime-agent export RUN [step=N] out=DIR",
    ),
    "model": ("vime.models.cli:main", "build or inspect models (vime-agent model tiny --out DIR)"),
    "serve": (
        "vime.engine.cli:main",
        "start a vLLM server for a model folder and wait until ready",
    ),
    "envs": ("vime.envs.cli:list_main", "list registered environments"),
    "check-env": ("vime.envs.cli:check_main", "run the env checker on a registered env id"),
    "sandbox": ("vime.sandbox.cli:main", "sandbox images and cleanup (build-base, gc)"),
    "show": (
        "vime.runs.show:main",
        "an episode as the model saw it: vime-agent show RUN [step=N] [episode=K] [logprobs=true]",
    ),
    "replay": (
        "vime.rl.replay:main",
        "re-run a step's training on its saved batch: vime-agent replay RUN step=N",
    ),
    "trace": (
        "vime.runs.timeline:main",
        "draw a step's timeline: vime-agent trace RUN step=N",
    ),
    "page": ("vime.runs.page:main", "write the run's HTML page: vime-agent page RUN"),
    "rollout": (
        "vime.rl.rollout_worker:main",
        "play a run's tasks from its rollout store: vime-agent rollout store=URL run=NAME",
    ),
    "store-watch": (
        "vime.store.watch:main",
        "follow a run's trained steps in its rollout store: vime-agent store-watch store=URL run=NAME",
    ),
    "own-agent": ("vime.agents.own_agent_cli:main", "run your agent: policy=URL tasks=F -- CMD"),
}


def _load(target: str) -> Callable[[list[str]], int]:
    module_name, _, func = target.partition(":")
    module = importlib.import_module(module_name)
    return getattr(module, func)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="vime-agent",
        description="vime: RL post-training of LLM agents (vLLM rollouts, Docker sandboxes, Megatron-core).",
        formatter_class=argparse.RawDescriptionHelpFormatter,
        epilog="Run 'vime-agent COMMAND --help' for a command's options.",
    )
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    for name, (_, help_text) in COMMANDS.items():
        sub.add_parser(name, help=help_text, add_help=False)
    return parser


def main(argv: list[str] | None = None) -> int:
    """Entry point of ``vime-agent``. Returns the process exit code."""
    argv = list(sys.argv[1:] if argv is None else argv)
    parser = build_parser()
    if not argv or argv[0] in ("-h", "--help"):
        parser.print_help()
        return 0
    command, rest = argv[0], argv[1:]
    if command not in COMMANDS:
        parser.print_help(sys.stderr)
        import difflib

        close = difflib.get_close_matches(command, list(COMMANDS), n=1)
        hint = f" (did you mean {close[0]!r}?)" if close else ""
        print(f"vime-agent: error: unknown command {command!r}{hint}", file=sys.stderr)
        return 2
    try:
        return int(_load(COMMANDS[command][0])(rest) or 0)
    except VimeError as err:
        print(f"vime-agent {command}: error: {err}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print(f"vime-agent {command}: interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
