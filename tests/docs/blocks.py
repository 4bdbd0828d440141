"""The fenced code blocks of the docs pages, and what the docs test does with each.

Every block of every page under docs/ (with the files a page includes through
``--8<-- "path"`` snippets) gets exactly one treatment, chosen by its info string and by
an optional marker comment on the line before it:

- ``python``: run. A page's Python blocks run in order in one fresh interpreter (a page
  reads as one session), in a scratch folder that is also on ``sys.path``.
  ``<!-- docs-test: file NAME -->`` writes the block to NAME there instead (a module a
  later block imports; also on a ``text`` block: a data file such as ``words.jsonl``);
  ``<!-- docs-test: docker -->`` runs it with the project's
  dockerd.
- ``bash``/``console``: run, each command (``console``: the ``$`` lines, whose output
  lines must then appear in what the command prints, ``...`` skipping).
  ``<!-- docs-test: short -->`` runs a block of training or bench commands for real,
  shortened: each ``vime-agent train`` (also under ``torchrun`` or ``scripts/main.sh``)
  gets :data:`SHORTEN` appended (one step, tiny batches, no warm start or eval), each
  ``python bench/X.py`` its :data:`BENCH_SHORTEN` flags (one small rep), attached to
  the session's vLLM server where the script can attach, in the page's scratch folder. The one command CI runs
  (``.ci/run`` execs it: :func:`ci_command`) is not nested in the suite it starts; every CI
  run runs it in full. ``<!-- docs-test: gpu N -->``
  does the same with the run's own engine on a machine with N CUDA GPUs, and is skipped
  on one with fewer. In both, ``/ckpt/NAME`` stands for the tiny model's folder (an HF
  checkpoint like any other) and ``RUN`` for a copy of a real finished run.
  ``<!-- docs-test: serve -->`` runs a block that starts a server: each ``vime-agent
  serve`` command starts in the background (consecutive ones together), and before the
  next other command each is waited on until it prints its URL;
  ``http://127.0.0.1:PORT`` in the block's later commands is the latest server's URL
  (``PORTk``: the k-th server's), a training command runs shortened; at the block's end
  every server gets SIGTERM and must stop cleanly (exit 0).
  ``<!-- docs-test: nodes 2 -->`` marks the one multi-node torchrun block: the same command
  on every node, with ``N``, ``NODE0_ADDR`` and ``RUN_ID`` in its environment.
  tests/placement/test_two_nodes.py runs it on two network namespaces of this machine, shortened
  to 3 steps, with the flags that the scaling page's network notes give for hosts that
  share a hostname (``--rdzv-conf is_host=1`` on node 0, ``--local-addr``).
  ``<!-- docs-test: hosts 2 -->`` marks the one recipe for sandboxes on two docker daemons:
  tests/faults/test_sandbox_hosts.py runs it as one bash script in a scratch folder (its
  second daemon's state there, the training command shortened to one step).
  ``<!-- docs-test: slurm 2 -->`` marks the one Slurm batch script: tests/placement/test_slurm.py
  submits it with ``sbatch --wait`` to a two-node Slurm cluster that it starts on two
  network namespaces, each with its own host name, shortened to 3 steps.
  ``<!-- docs-test: run-folder -->`` runs them against a real finished run: ``RUN`` in
  them is the folder of a short training run made once a session (``docs_run`` in
  tests/docs/conftest.py), and they run in a scratch folder whose ``.venv`` is the
  repository's (what they write stays out of the checkout). A ``gpu N`` block is also
  checked on every machine (tests/docs/commands.py): a ``vime-agent`` command (also as
  ``python -m vime.cli``, under ``torchrun``/``srun``, or as ``bash scripts/main.sh``)
  must name a real subcommand; ``train``'s ``key=value`` overrides must load with
  ``load_config`` and their layout must fit N GPUs; the other subcommands' keys and
  ``--flags`` must appear in their ``--help``; ``python bench/X.py --flags`` must name
  flags of that script's ``--help``.
- ``yaml``: parsed (a config file shown on a page must be valid YAML).
- ``text``: not code (file trees, output), unless marked ``file``. A block with no info string is an error:
  say ``text`` if it is not code. Diagrams are SVG files under docs/img/ (a ``mermaid``
  block would need mermaid.js from a CDN, so it is an error too).

Example:
    >>> [b.lang for b in blocks_of("# t\\n```text\\nx\\n```\\n")]
    ['text']
"""

from __future__ import annotations

import re
import shlex
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
DOCS = ROOT / "docs"
# A marker comment; one that names no treatment here is an error (a typo would run nothing).
MARKER = re.compile(
    r"<!--\s*docs-test:\s*(?P<kind>file|docker|run-folder|short|gpu|serve|nodes|slurm|hosts)\s*(?P<arg>.*?)\s*-->"
)
FENCE = re.compile(r"^(?P<indent> *)(?P<fence>```+)(?P<info>[^`]*)$")
SNIPPET = re.compile(r'^--8<--\s+"(?P<path>[^"]+)"\s*$')
KNOWN = ("python", "bash", "console", "yaml", "text")
# What a ``short``/``gpu`` block's training commands get appended: one step of two groups
# of two, nothing before it (warm start, eval), every group trained (a random model's
# groups have no reward variance, so filtering would wait for one that does).
SHORTEN = (
    "steps=1",
    "rollout.batch_size=2",
    "rollout.collector.n_samples=2",
    "rollout.filter_groups=false",
    "model.warm_start_steps=0",
    "eval_every=0",
)
# What a ``short``/``gpu`` block's bench commands get appended (argparse keeps the last of
# a repeated flag): one small rep, so the script's whole path runs in seconds.
BENCH_SHORTEN: dict[str, tuple[str, ...]] = {
    "bench/collector.py": (
        *("--episodes", "8", "--concurrency", "4", "--max-tokens", "8", "--reps", "1"),
        "--no-progress",
    ),
    # Step 1 has nothing to overlap with and is dropped from the medians: two steps.
    "bench/step.py": ("--steps", "2", "--rounds", "1", *SHORTEN[1:5]),
    "bench/fleet.py": ("--episodes", "8", "--concurrency", "4", "--max-tokens", "8", "--reps", "1"),
    # The tiny shape: on a GPU the script would build and train its 1.5B model.
    "bench/trainer_step.py": ("--size", "tiny", "--seq", "128", "--reps", "1", "--warmup", "0"),
    "bench/weight_sync.py": ("--reps", "1"),
    # The tiny model alone (its own LoRA engine), one timed sync of each kind.
    "bench/lora_sync.py": ("--models", "tiny", "--reps", "1"),
    # The tiny shape instead of the 1.78B one (--measure then builds a tiny Trainer).
    "bench/rank_memory.py": ("--model", "bench-tiny"),
    # The tiny default model ("" picks it) instead of the block's own folder.
    "bench/shared_prefix.py": ("--steps", "1", "--model", ""),
}
# The flag that attaches a bench script to a running server: a ``short`` block's get the
# session's (a ``gpu`` block has none: its script launches its own engine).
BENCH_URL_FLAG = {"bench/collector.py": "--url", "bench/step.py": "--engine-url"}


def ci_command() -> str:
    """The command ``.ci/run`` execs: the README's test command.

    Example:
        >>> ci_command()
        'bash scripts/test.sh'
    """
    (line,) = [
        ln for ln in (ROOT / ".ci" / "run").read_text().splitlines() if ln.startswith("exec ")
    ]
    return line.removeprefix("exec ").strip()


@dataclass
class Block:
    """One fenced block: where it is, its language, its marker and its text."""

    page: str
    line: int
    lang: str
    marker: str  # "", "file", "docker", "run-folder", "short", "gpu", "serve", "nodes", "slurm", "hosts"
    arg: str  # the marker's argument: the file name, the GPU or node count
    code: str

    @property
    def where(self) -> str:
        return f"{self.page}:{self.line}"


def expand_snippets(text: str) -> str:
    """The page with each ``--8<-- "path"`` line replaced by that file (path from the root).

    A marker on the line before the include applies to every unmarked block of the file
    (a file that is not a docs page, e.g. bench/RESULTS.md, is not edited for the docs).
    """
    lines = text.splitlines()
    out: list[str] = []
    for i, line in enumerate(lines):
        m = SNIPPET.match(line)
        if not m:
            out.append(line)
            continue
        included = (ROOT / m.group("path")).read_text().splitlines()
        kind, arg = _marker_before(lines, i)
        marker = f"<!-- docs-test: {kind} {arg} -->" if kind else ""
        for j, inner in enumerate(included):
            fence = FENCE.match(inner)
            code = fence and fence.group("info").strip().split(" ")[0] in (
                "python",
                "bash",
                "console",
            )
            if marker and code and _opens(included, j) and not _marker_before(included, j)[0]:
                out.append(marker)
            out.append(inner)
    return "\n".join(out) + "\n"


def _opens(lines: list[str], index: int) -> bool:
    """Whether the fence at ``index`` opens a block (an odd count of fences up to it)."""
    fences = [i for i, ln in enumerate(lines[: index + 1]) if FENCE.match(ln)]
    return len(fences) % 2 == 1


def blocks_of(text: str, page: str = "<text>") -> list[Block]:
    """The fenced blocks of one Markdown text, in order."""
    lines = text.splitlines()
    found: list[Block] = []
    i = 0
    while i < len(lines):
        m = FENCE.match(lines[i])
        if not m:
            i += 1
            continue
        fence, indent = m.group("fence"), len(m.group("indent"))
        info = m.group("info").strip()
        start = i
        body: list[str] = []
        i += 1
        while i < len(lines) and not lines[i].strip().startswith(fence):
            body.append(lines[i][indent:])
            i += 1
        marker = _marker_before(lines, start)
        lang = info.split()[0] if info else ""
        found.append(Block(page, start + 1, lang, *marker, "\n".join(body) + "\n"))
        i += 1
    return found


def _marker_before(lines: list[str], start: int) -> tuple[str, str]:
    j = start - 1
    while j >= 0 and not lines[j].strip():
        j -= 1
    m = MARKER.search(lines[j]) if j >= 0 else None
    return (m.group("kind"), m.group("arg")) if m else ("", "")


def doc_pages() -> list[Path]:
    """Every Markdown page under docs/."""
    return sorted(DOCS.rglob("*.md"))


def all_blocks() -> list[Block]:
    """The blocks of every page, snippets expanded."""
    found: list[Block] = []
    for path in doc_pages():
        rel = str(path.relative_to(ROOT))
        found += blocks_of(expand_snippets(path.read_text()), rel)
    return found


def commands(block: Block) -> list[str]:
    """The commands of a shell block: continuations joined, comments and ``$`` dropped."""
    lines = block.code.splitlines()
    if block.lang == "console":
        lines = [ln[2:] for ln in lines if ln.startswith("$ ")]
    joined: list[str] = []
    pending = ""
    for line in lines:
        if line.rstrip().endswith("\\"):
            pending += line.rstrip()[:-1] + " "
            continue
        joined.append(pending + line)
        pending = ""
    out = []
    for cmd in joined:
        words = shlex.split(cmd, comments=True)
        if words:
            out.append(shlex.join(words))
    return out


def console_expectations(block: Block) -> list[tuple[str, list[str]]]:
    """(command, expected output lines) for each ``$`` line of a console block."""
    pairs: list[tuple[str, list[str]]] = []
    for line in block.code.splitlines():
        if line.startswith("$ "):
            pairs.append((line[2:], []))
        elif pairs and line.strip() and line.strip() != "...":
            pairs[-1][1].append(line.strip())
    return pairs
