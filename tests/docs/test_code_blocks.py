"""Every fenced code block in docs/ runs, or is checked, in this test (tests/docs/blocks.py).

Python blocks run in a fresh interpreter per page, shell blocks run in the repository
with the venv's commands on PATH, blocks marked ``run-folder`` run against a real
finished run (``docs_run``, conftest.py), training blocks marked ``short`` run shortened
against the session's vLLM server (``gpu N``: with their own engine, where N GPUs are,
and checked against the real command line, config and placement on every machine). The
multi-node blocks run in tests/rl (test_two_nodes.py, test_slurm.py).
"""

from __future__ import annotations

import json
import os
import queue
import re
import shlex
import shutil
import signal
import subprocess
import sys
import threading
from pathlib import Path

import pytest

from tests.docs.blocks import (
    BENCH_SHORTEN,
    BENCH_URL_FLAG,
    KNOWN,
    ROOT,
    SHORTEN,
    Block,
    all_blocks,
    ci_command,
    commands,
    console_expectations,
)
from tests.docs.commands import bench_script, check_command, vime_args

BLOCKS = all_blocks()
PAGES = sorted({b.page for b in BLOCKS})
VENV_BIN = str(Path(sys.executable).parent)
RUN = re.compile(r"\bRUN\b")  # the run folder, in blocks marked run-folder, short or gpu
CKPT = re.compile(r"/ckpt/[\w./-]+")  # an HF checkpoint folder, in blocks marked short or gpu
SERVED = re.compile(r"http://127\.0\.0\.1:PORT(\d*)")  # a served URL, in blocks marked serve


def _page_blocks(page: str) -> list[Block]:
    return [b for b in BLOCKS if b.page == page]


def test_every_block_has_one_treatment():
    problems = []
    for b in BLOCKS:
        if b.lang == "mermaid":  # drawn by mermaid.js from a CDN: nothing offline
            problems.append(f"{b.where}: a mermaid block; draw an SVG under docs/img/ instead")
        elif b.lang not in KNOWN:
            problems.append(f"{b.where}: info string {b.lang!r}; use one of {KNOWN}")
        if b.marker == "file" and not (
            (b.lang == "python" and b.arg.endswith(".py")) or (b.lang == "text" and b.arg)
        ):
            problems.append(f"{b.where}: 'file' marks a python block NAME.py or a text file")
        if b.marker and b.marker != "file" and b.lang in ("text", "yaml"):
            problems.append(f"{b.where}: a {b.lang} block is not code; drop the marker")
        cmds = commands(b) if b.lang in ("bash", "console") else []
        if b.marker in ("short", "gpu") and not any(
            _runs(c, "train") or bench_script(c) for c in cmds
        ):
            problems.append(f"{b.where}: '{b.marker}' marks a shell block that trains or benches")
        for script in filter(None, map(bench_script, cmds)):
            if b.marker in ("short", "gpu") and script not in BENCH_SHORTEN:
                problems.append(f"{b.where}: {script} has no BENCH_SHORTEN flags")
        if b.marker == "nodes" and (b.lang != "bash" or len(cmds) != 1):
            problems.append(f"{b.where}: 'nodes' marks a bash block of one torchrun command")
        if b.marker == "slurm" and not (
            b.lang == "bash"
            and b.code.startswith("#!/bin/bash\n#SBATCH ")
            and [c.split()[0] for c in cmds] == ["srun"]
        ):
            problems.append(f"{b.where}: 'slurm' marks a batch script: #SBATCH lines, one srun")
        if b.marker == "hosts" and (b.lang != "bash" or not any(_runs(c, "train") for c in cmds)):
            problems.append(f"{b.where}: 'hosts' marks a bash block that trains on two daemons")
        if b.marker == "gpu" and not b.arg.isdigit():
            problems.append(f"{b.where}: 'gpu N' needs the number of GPUs")
        if b.marker == "serve" and (
            b.lang != "bash" or not any(_runs(c, "serve") for c in commands(b))
        ):
            problems.append(f"{b.where}: 'serve' marks a bash block with a vime-agent serve")
        if b.marker == "run-folder" and (
            b.lang not in ("bash", "console") or not RUN.search(b.code)
        ):
            problems.append(f"{b.where}: 'run-folder' marks a shell block that names RUN")
    assert not problems, "\n".join(problems)
    # tests/placement/test_two_nodes.py and test_slurm.py run the one block of each;
    assert [b.arg for b in BLOCKS if b.marker == "nodes"] == ["2"]
    assert [b.arg for b in BLOCKS if b.marker == "slurm"] == ["2"]
    # tests/faults/test_sandbox_hosts.py runs the one two-daemon recipe.
    assert [b.arg for b in BLOCKS if b.marker == "hosts"] == ["2"]
    assert len(BLOCKS) > 20  # the docs have code; an extraction bug would find none


def test_every_marker_names_a_treatment():
    """A ``docs-test:`` comment that no treatment knows (a typo, a retired one) is an
    error: its block would silently get the default treatment or none."""
    from tests.docs.blocks import DOCS, MARKER

    unknown = [
        f"{page.relative_to(ROOT)}:{n}: {line.strip()}"
        for page in sorted(DOCS.rglob("*.md"))
        for n, line in enumerate(page.read_text().splitlines(), 1)
        if line.lstrip().startswith("<!--") and "docs-test:" in line and not MARKER.search(line)
    ]
    assert not unknown, "\n".join(unknown)


def _scratch(page: str, tmp_path: Path, *, venv: bool = False) -> Path:
    """The page's scratch folder, with its ``file`` blocks written; with ``venv``, its
    ``.venv`` links to the repository's (``.venv/bin/vime-agent`` from there)."""
    folder = tmp_path / Path(page).stem
    folder.mkdir(exist_ok=True)
    if venv:
        (folder / ".venv").symlink_to(ROOT / ".venv")
    for b in _page_blocks(page):
        if b.marker == "file":
            (folder / b.arg).parent.mkdir(parents=True, exist_ok=True)
            (folder / b.arg).write_text(b.code)
    return folder


def _env(folder: Path) -> dict[str, str]:
    env = dict(os.environ)
    # Kept after ours: a machine whose packages come on PYTHONPATH (wheels in a folder).
    env["PYTHONPATH"] = os.pathsep.join(
        filter(None, [str(folder), str(ROOT), env.get("PYTHONPATH")])
    )
    env["PATH"] = VENV_BIN + os.pathsep + env.get("PATH", "")
    env["OUT"] = str(folder)  # a bench record's $OUT: what it wrote on the device machine
    env.setdefault("OMP_NUM_THREADS", "1")
    return env


RUNNABLE_PY = [
    p
    for p in PAGES
    if any(b.lang == "python" and b.marker in ("", "docker") for b in _page_blocks(p))
]


def _docker_mark(page_or_block, blocks: list[Block]):
    """The ``docker`` marker for a page or block that runs containers."""
    needs = any(b.marker == "docker" for b in blocks)
    return pytest.param(page_or_block, marks=pytest.mark.docker) if needs else page_or_block


@pytest.mark.parametrize("page", [_docker_mark(p, _page_blocks(p)) for p in RUNNABLE_PY])
def test_python_blocks_run(page, tmp_path, request):
    blocks = [b for b in _page_blocks(page) if b.lang == "python" and b.marker in ("", "docker")]
    if any(b.marker == "docker" for b in blocks):
        request.getfixturevalue("docker_host")  # sets DOCKER_HOST for the subprocess
    folder = _scratch(page, tmp_path)
    # One interpreter per page: a later block sees an earlier block's names.
    program = "\n".join(f"exec(compile({b.code!r}, {b.where!r}, 'exec'), ns)" for b in blocks)
    out = subprocess.run(
        [sys.executable, "-c", "ns = {'__name__': '__main__'}\n" + program],
        cwd=folder,
        env=_env(folder),
        capture_output=True,
        text=True,
        timeout=240,
    )
    assert out.returncode == 0, f"{page}: a python block failed:\n{out.stderr[-4000:]}"


SHELL = [b for b in BLOCKS if b.lang in ("bash", "console")]


@pytest.mark.parametrize("block", [b for b in SHELL if b.marker == "gpu"], ids=lambda b: b.where)
def test_gpu_shell_blocks_are_valid(block):
    """Checked here whatever the machine (a ``gpu N`` block runs only where N GPUs are):
    each command exists, and a training command's layout fits one node of N GPUs."""
    for cmd in commands(block):
        check_command(cmd)
        if _runs(cmd, "train"):
            words = shlex.split(cmd)
            ranks = int(words[words.index("--nproc-per-node") + 1]) if "torchrun" in cmd else 1
            _check_layout_fits(vime_args(words) or [], ranks=ranks, nodes=1, gpus=int(block.arg))


def _check_layout_fits(args: list[str], *, ranks: int, nodes: int, gpus: int) -> None:
    """``vime-agent train ARGS`` with ``ranks`` trainer ranks on each of ``nodes`` nodes
    of ``gpus`` GPUs places its ranks and engines (a ConfigError names the key)."""
    from vime.conf.compose import load_config
    from vime.placement.config import Cluster, check_placement

    cfg = load_config([a for a in args[1:] if "=" in a])
    cluster = Cluster(world_size=ranks * nodes, local_world_size=ranks, cuda_devices=gpus)
    check_placement(cfg.placement, cluster, external=len(cfg.placement.engine_urls))


def test_the_scaling_pages_gpu_node_keys_load():
    """docs/scaling.md's table of what changes on nodes of 8 GPUs: its vime keys load and
    place 8 ranks per node on 8 GPUs, on two nodes (the Slurm script's)."""
    table = {
        cells[0]: cells[1:]
        for line in (ROOT / "docs" / "scaling.md").read_text().splitlines()
        if line.startswith("| ")
        for cells in [[c.strip().strip("`") for c in line.strip("|").split("|")]]
    }
    assert table["torchrun's ranks per node"][1] == "--nproc-per-node 8"
    assert "--gpus-per-node=8" in table["Slurm's allocation"][1]
    keys = table["vime's keys"][1].split()
    assert "engine=gpu" in keys, keys
    _check_layout_fits(["train", *keys], ranks=8, nodes=2, gpus=8)


def _run_shell(
    block: Block,
    folder: Path,
    cwd: Path,
    run: Path | None = None,
    rewrite=lambda cmd: cmd,
    timeout: float = 120,
) -> None:
    """Run each command of a shell block; ``RUN`` stands for ``run`` when given, and
    ``rewrite`` makes each command what actually runs (a shortened training run)."""
    expected = dict(console_expectations(block)) if block.lang == "console" else {}
    for cmd in commands(block):
        lines = expected.get(cmd, [])
        if run is not None:
            cmd, lines = RUN.sub(str(run), cmd), [RUN.sub(str(run), ln) for ln in lines]
        _run_command(block, rewrite(cmd), lines, folder, cwd, timeout)


def _run_command(
    block: Block, cmd: str, lines: list[str], folder: Path, cwd: Path, timeout: float
) -> None:
    """Run one command of ``block``: it must exit 0 and print each of ``lines``."""
    out = subprocess.run(
        ["bash", "-c", cmd],
        cwd=cwd,
        env=_env(folder),
        capture_output=True,
        text=True,
        timeout=timeout,
    )
    assert out.returncode == 0, (
        f"{block.where}: `{cmd}` exited {out.returncode}:\n{out.stderr[-3000:]}"
    )
    printed = out.stdout + out.stderr
    for line in lines:
        assert line in printed, f"{block.where}: `{cmd}` did not print {line!r}:\n{printed[-3000:]}"


@pytest.mark.parametrize(
    "block",
    [_docker_mark(b, [b]) for b in SHELL if b.marker in ("", "docker")],
    ids=lambda b: b.where,
)
def test_shell_blocks_run(block, tmp_path, request):
    if block.marker == "docker":
        request.getfixturevalue("docker_host")
    _run_shell(block, _scratch(block.page, tmp_path), ROOT)


@pytest.mark.engine
@pytest.mark.slow
@pytest.mark.parametrize(
    "block", [b for b in SHELL if b.marker == "run-folder"], ids=lambda b: b.where
)
def test_run_folder_blocks_run(block, docs_run, tmp_path):
    """``RUN`` is a real finished run; the commands run in a scratch folder (``html=ep.html``,
    ``eval compare``'s ``eval-compare/`` land there) whose ``.venv`` links to the repository's."""
    folder = _scratch(block.page, tmp_path, venv=True)
    _run_shell(block, folder, folder, run=docs_run)


def _wait_for_url(server: subprocess.Popen, where: str, timeout: float) -> str:
    """The URL a ``vime-agent serve`` prints as its last line once the server is ready."""
    found: queue.Queue[str] = queue.Queue()
    printed: list[str] = []

    def read() -> None:  # keeps draining, so the server never blocks on a full pipe
        assert server.stdout is not None
        for line in server.stdout:
            printed.append(line)
            if re.fullmatch(r"http://\S+", line.strip()):
                found.put(line.strip())
        found.put("")  # it exited

    threading.Thread(target=read, daemon=True).start()
    try:
        url = found.get(timeout=timeout)
    except queue.Empty:
        url = ""
    assert url, f"{where}: `vime-agent serve` printed no URL:\n{''.join(printed)[-3000:]}"
    return url


@pytest.mark.engine
@pytest.mark.slow
@pytest.mark.parametrize("block", [b for b in SHELL if b.marker == "serve"], ids=lambda b: b.where)
def test_serve_blocks_run(block, tiny_model_dir, tmp_path):
    """Each ``vime-agent serve`` starts a real vLLM server; the block's other commands reach
    it at the URL it printed (``PORT``: the latest server's, ``PORTk``: the k-th's), a
    training command runs shortened (one step, its own run folder); SIGTERM then stops
    every server cleanly."""
    folder = _scratch(block.page, tmp_path, venv=True)
    servers: list[subprocess.Popen] = []
    urls: list[str] = []
    runs = tmp_path / "short-runs"

    def url_of(m: re.Match) -> str:
        assert urls, f"{block.where}: PORT before a serve"
        return urls[int(m.group(1)) - 1] if m.group(1) else urls[-1]

    def wait_for_urls() -> None:  # servers started one after another start together
        for server in servers[len(urls) :]:
            urls.append(_wait_for_url(server, block.where, timeout=300))

    try:
        for cmd in commands(block):
            if _runs(cmd, "serve"):
                servers.append(
                    subprocess.Popen(
                        ["bash", "-c", f"exec {cmd}"],
                        cwd=folder,
                        env=_env(folder),
                        stdout=subprocess.PIPE,
                        stderr=subprocess.STDOUT,
                        text=True,
                    )
                )
                continue
            wait_for_urls()
            cmd = SERVED.sub(url_of, cmd)
            if _runs(cmd, "train"):
                cmd = shortened(cmd, run_root=runs, ckpt=tiny_model_dir, run=None, url=None)
            _run_command(block, cmd, [], folder, folder, timeout=300)
        wait_for_urls()  # a block that only serves: each server printed its URL
    finally:
        for server in servers:
            server.send_signal(signal.SIGTERM)
    for server in servers:
        assert server.wait(timeout=120) == 0, f"{block.where}: the server did not stop cleanly"
    made = sorted(runs.iterdir()) if runs.exists() else []
    assert len(made) == sum(_runs(c, "train") for c in commands(block)), made
    for run in made:
        assert _last_step(run) == 1, f"{run}: no step 1 in metrics.jsonl"


def _runs(cmd: str, subcommand: str) -> bool:
    """Whether ``cmd`` runs ``vime-agent SUBCOMMAND`` (also as scripts/main.sh, torchrun...)."""
    args = vime_args(shlex.split(cmd))
    return bool(args) and args[0] == subcommand


def _last_step(run: Path) -> int:
    """The last step a run's metrics.jsonl has a row for (0: none)."""
    rows = (run / "metrics.jsonl").read_text().splitlines() if run.exists() else []
    return max((json.loads(row)["step"] for row in rows), default=0)


def shortened(cmd: str, *, run_root: Path, ckpt: Path, run: Path | None, url: str | None) -> str:
    """The command a ``short``/``gpu`` block really runs: ``/ckpt/NAME`` is ``ckpt``,
    ``scripts/`` the repository's, and a training run gets :data:`SHORTEN` (one step past
    ``run``'s last when it resumes it), its own ``run_root`` and, given, the engine's URL;
    a bench script gets its :data:`BENCH_SHORTEN` flags (the URL where it takes one).

    Example:
        >>> shortened("bash scripts/main.sh steps=20", run_root=Path("/r"), ckpt=Path("/m"),
        ...           run=None, url=None).split()[-2:]
        ['eval_every=0', 'run_root=/r']
    """
    if cmd == ci_command():  # the whole suite: CI runs it in full, the suite cannot nest it
        return "true"
    trains, script = _runs(cmd, "train"), bench_script(cmd)
    cmd = CKPT.sub(str(ckpt), cmd)
    cmd = re.sub(r"(?<![\w/])(scripts|bench)/", rf"{ROOT}/\1/", cmd)
    if script:
        flags = list(BENCH_SHORTEN[script])
        if url and script in BENCH_URL_FLAG:
            flags += [BENCH_URL_FLAG[script], url]
        return f"{cmd} {shlex.join(flags)}"
    if not trains:
        return cmd
    # SHORTEN turns the eval off (eval_every=0): the block's eval sizes would then be
    # refused as doing nothing.
    cmd = re.sub(r"\s+env\.eval_(size|tasks)=\S+", "", cmd)
    extra = list(SHORTEN)
    if "resume=" in cmd:  # a resumed run keeps its folder and continues its step count
        assert run is not None
        extra[0] = f"steps={_last_step(run) + 1}"
    else:
        extra.append(f"run_root={run_root}")
    if url:
        extra.append(f"engine.url={url}")
    return f"{cmd} {shlex.join(extra)}"


def _copy_of(run: Path, tmp_path: Path) -> Path:
    """A copy of the session's finished run (a block that resumes it trains the copy)."""
    copy = tmp_path / "runs" / run.name
    shutil.copytree(run, copy)
    return copy


def _run_training_block(block: Block, tmp_path: Path, request, url: str | None) -> None:
    folder = _scratch(block.page, tmp_path, venv=True)
    ckpt = request.getfixturevalue("tiny_model_dir")
    run = None
    if RUN.search(block.code):
        run = _copy_of(request.getfixturevalue("docs_run"), tmp_path)
    runs = tmp_path / "short-runs"

    def rewrite(cmd: str) -> str:
        return shortened(cmd, run_root=runs, ckpt=ckpt, run=run, url=url)

    steps_before = _last_step(run) if run is not None else 0
    _run_shell(block, folder, folder, run=run, rewrite=rewrite, timeout=600)
    # Each command trained: a new run has its step 1, a resumed one its next step.
    trains = [c for c in commands(block) if _runs(c, "train")]
    fresh = [c for c in trains if "resume=" not in c]
    made = sorted(runs.iterdir()) if runs.exists() else []
    assert len(made) == len(fresh), f"{block.where}: {len(fresh)} runs expected, got {made}"
    for folder_ in made:
        assert _last_step(folder_) == 1, f"{folder_}: no step 1 in metrics.jsonl"
    if run is not None and len(trains) > len(fresh):
        assert _last_step(run) == steps_before + 1, f"{block.where}: the resumed run did not step"


SHORT = [b for b in SHELL if b.marker == "short"]


@pytest.mark.engine
@pytest.mark.slow
@pytest.mark.docker  # env=tools leases sandboxes
@pytest.mark.parametrize("block", SHORT, ids=lambda b: b.where)
def test_short_blocks_run(block, shared_engine, docker_host, tmp_path, request):
    """Each training command runs one short step against the session's server."""
    _run_training_block(block, tmp_path, request, shared_engine.url)


@pytest.mark.gpu
@pytest.mark.slow
@pytest.mark.parametrize(
    "block", [b for b in SHELL if b.marker == "gpu"], ids=lambda b: f"{b.where}-gpu{b.arg}"
)
def test_gpu_blocks_run(block, tmp_path, request):
    """Each training command runs one short step with its own engine on the GPUs."""
    import torch

    have = torch.cuda.device_count()
    if have < int(block.arg):
        pytest.skip(f"needs {block.arg} CUDA GPUs, this machine has {have}")
    _run_training_block(block, tmp_path, request, url=None)


@pytest.mark.parametrize(
    "cmd",
    [
        "vime-agent train trainer.lrr=1",  # no such key
        "vime-agent train rollout.mode=fast",  # no such value
        "vime-agent eval ckpt=x suitee=math",  # not in eval's --help
        "vime-agent trian",  # no such command
        "python bench/collector.py --nope",  # not in the script's --help
        "rm -rf build",  # nothing vime can check: such a block must run
    ],
)
def test_the_command_check_rejects_what_does_not_exist(cmd):
    from vime.errors import ConfigError

    with pytest.raises((AssertionError, ConfigError)):
        check_command(cmd)


def test_the_own_agent_page_shows_the_example_file():
    """docs/own_agent.md's agent is examples/own_agent.py, which tests/agents run for real."""
    (agent, *_) = [b for b in BLOCKS if b.page == "docs/own_agent.md" and b.lang == "python"]
    assert agent.code == (ROOT / "examples" / "own_agent.py").read_text()


def test_the_extend_page_shows_the_generation_example_file():
    """docs/extend.md's generation function is examples/generate_math.py, which
    tests/agents/test_generate.py trains for 3 steps."""
    (block,) = [b for b in BLOCKS if b.page == "docs/extend.md" and "ctx.make_env()" in b.code]
    assert block.code == (ROOT / "examples" / "generate_math.py").read_text()


def test_the_extend_page_shows_the_simple_agent_file():
    """docs/extend.md's learning agent is examples/simple_agent.py, which
    bench/agent_learns.py trains and tests/agents/test_agent_command.py runs."""
    (block,) = [
        b for b in BLOCKS if b.page == "docs/extend.md" and "question = sys.stdin" in b.code
    ]
    assert block.code == (ROOT / "examples" / "simple_agent.py").read_text()


def test_the_extend_page_shows_the_orchestrator_example_file():
    """docs/extend.md's orchestrator is examples/orchestrator_until_full.py, which
    tests/rl/test_orchestrator.py checks against the contract and trains for 2 steps."""
    (block,) = [b for b in BLOCKS if b.page == "docs/extend.md" and "class UntilFull" in b.code]
    assert block.code == (ROOT / "examples" / "orchestrator_until_full.py").read_text()


def test_yaml_blocks_parse():
    import yaml

    found = [b for b in BLOCKS if b.lang == "yaml"]
    for b in found:
        assert yaml.safe_load(b.code) is not None, f"{b.where}: empty YAML"
    assert found
