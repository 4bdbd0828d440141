"""Every docstring example in vime and in the bundled suites runs and stays true.

Modules are found by walking the packages' folders (no list to keep): every ``.py`` under
``vime`` and ``vime.suites`` (the repository's ``envs/``). The sandbox modules' examples
(and the SWE, tools and Harbor envs') run against the project's dockerd, the rollout
store's against its PostgreSQL, and the engine modules' and the disk weight sync's against
the session's vLLM server (the root conftest's ``docker_host``, ``store_url`` and
``vllm_server`` start them), with the names
of :func:`service_globals`; the trainer modules' get a new trainer on a random tiny model
for each example that uses one (:func:`trainer_globals`). An example that cannot run here
(a GPU, several hosts, minutes of training) is a ``Usage (no doctest: <why>):`` line
instead, with no ``>>>``.
"""

from __future__ import annotations

import asyncio
import contextlib
import doctest
import importlib
import importlib.util
import uuid
from collections.abc import Awaitable, Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

import vime
import vime.suites

# Not collected, with the reason. Folders: tests are pytest's; __main__ modules run a
# program when imported.
SKIP_DIRS = {"tests", "__pycache__"}
SKIP_FILES = {"__main__.py"}

# Optional dependencies (pyproject extras): a module that needs one is skipped, saying so,
# where it is not installed. Any other import error fails.
OPTIONAL = {"vllm": "vLLM is not installed (pip install 'vime[cpu]' or 'vime[gpu]')"}
# Modules that import their optional dependency only when used (so that importing them, and
# registering their env, costs nothing): their examples need it installed.
NEEDS = {
    "vime.suites.openenv.env": "openenv",
    "vime.suites.openenv.server": "openenv",
}


def discover(package) -> list[str]:
    """Dotted names of the modules under ``package``'s folders."""
    names = []
    for folder in map(Path, package.__path__):
        for path in sorted(folder.rglob("*.py")):
            rel = path.relative_to(folder)
            if SKIP_DIRS.intersection(rel.parts[:-1]) or rel.name in SKIP_FILES:
                continue
            parts = rel.with_suffix("").parts
            if parts[-1] == "__init__":
                parts = parts[:-1]
            names.append(".".join((package.__name__, *parts)))
    return names


MODULES = discover(vime) + discover(vime.suites)

# Modules whose examples run against a service that the root conftest starts.
DOCKER = {
    "vime.sandbox",
    "vime.sandbox.cli",
    "vime.sandbox.client",
    "vime.sandbox.container_exec",
    "vime.sandbox.docker",
    "vime.sandbox.image_pools",
    "vime.sandbox.images",
    "vime.sandbox.leases",
    "vime.sandbox.pool",
    "vime.suites.harbor.dockerfile",
    "vime.suites.harbor.env",
    "vime.suites.harbor.verifier",
    "vime.suites.swe.env",
    "vime.suites.tools.env",
}
STORE = {"vime.store.postgres"}
ENGINE = {
    "vime.agents",
    "vime.agents.agent_command",
    "vime.agents.collector",
    "vime.agents.endpoint",
    "vime.agents.generate",
    "vime.agents.liveness",
    "vime.agents.policy_client",
    "vime.agents.server_probes",
    "vime.engine",
    "vime.engine.client",
    "vime.engine.delta_worker",
    "vime.engine.serve",
    "vime.engine.server",
    "vime.rl.eval_step",
    "vime.sync.delta_disk",
    "vime.sync.disk",
}
# Modules whose examples get a fresh trainer of their own (examples train it, save it,
# load into it): see trainer_globals.
TRAINER = {
    "vime.rl.warm_start",
    "vime.trainer.checkpoint",
    "vime.trainer.critic",
    "vime.trainer.hf",
    "vime.trainer.lora",
    "vime.trainer.lora_export",
    "vime.trainer.model",
    "vime.trainer.reference",
    "vime.trainer.step",
}
# Those whose trainer trains rank-4 LoRA adapters.
TRAINER_LORA = {"vime.trainer.lora_export"}


@pytest.fixture(scope="session")
def doctest_hf_folder(tmp_path_factory) -> Path:
    """A random tiny llama HF checkpoint (vocabulary 250, 2 layers; about 1 MB)."""
    from tests.trainer._trainer_models import make_hf_checkpoint

    return make_hf_checkpoint("llama", tmp_path_factory.mktemp("doctest-hf") / "llama")


def trainer_globals(name: str, test: doctest.DocTest, request: pytest.FixtureRequest) -> dict:
    """``hf_folder`` (a random tiny llama), ``samples`` (4 random samples of its vocabulary,
    advantages ±1) and ``tmp`` (an empty folder) for one of ``name``'s examples, and
    ``trainer`` where it uses one: a new :class:`~vime.trainer.step.Trainer` on
    ``hf_folder`` (lr 1e-3; rank-4 LoRA adapters for the modules in TRAINER_LORA), so that
    no example sees what another did to its trainer."""
    from tests.trainer._trainer_samples import random_samples

    hf_folder = request.getfixturevalue("doctest_hf_folder")
    tmp = request.getfixturevalue("tmp_path") / test.name
    tmp.mkdir()
    globs = {"hf_folder": str(hf_folder), "samples": random_samples(4, 250, seed=3), "tmp": tmp}
    if any("trainer" in example.source for example in test.examples):
        from vime.trainer.lora import LoraConfig
        from vime.trainer.step import Trainer, TrainerConfig

        lora = LoraConfig(rank=4 if name in TRAINER_LORA else 0)
        globs["trainer"] = Trainer(hf_folder, TrainerConfig(lr=1e-3, lora=lora))
    return globs


def with_collector(engine_url: str, model_dir: str) -> Callable[..., Any]:
    """``with_collector(play)``: ``asyncio.run(play(collector))`` with a :class:`Collector`
    on the engine at ``engine_url`` (2 samples a task, 8-token turns, other
    :class:`CollectorConfig` fields as keywords; ``generate``: the collector's), closed
    after it with its client."""

    def run(play: Callable[[Any], Awaitable[Any]], *, generate: Any = None, **fields: Any) -> Any:
        from vime.agents import Collector, CollectorConfig, PolicyClient
        from vime.types import SamplingParams

        config = CollectorConfig(
            n_samples=2, sampling=SamplingParams(max_tokens=8), progress=False, **fields
        )

        async def main() -> Any:
            client = PolicyClient.from_urls(engine_url)
            extra = {"generate": generate} if generate is not None else {}
            collector = Collector(client, model_dir, config, **extra)
            try:
                return await play(collector)
            finally:
                collector.close()
                await client.aclose()

        return asyncio.run(main())

    return run


@contextlib.contextmanager
def service_globals(name: str, request: pytest.FixtureRequest) -> Iterator[dict]:
    """The names that ``name``'s examples use beyond the module's own, made for its run
    and closed after it: ``sb`` (a running ``DockerSandbox``) for vime.sandbox.docker and
    vime.sandbox.container_exec, ``pool`` (a started one-sandbox ``SandboxPool``) for
    vime.sandbox.pool, ``store_url`` and a new ``run_name`` for vime.store.postgres,
    ``engine_url`` (the session's vLLM server, its weights given back afterwards),
    ``model_dir`` (the tiny model it serves), ``with_collector`` (:func:`with_collector`
    on them), ``tasks`` (2 math tasks) and ``tmp`` (an empty folder) for the engine
    modules and the disk weight sync."""
    if name in ENGINE:
        engine = request.getfixturevalue("shared_engine")
        model_dir = str(request.getfixturevalue("tiny_model_dir"))
        yield {
            "engine_url": engine.url,
            "model_dir": model_dir,
            "with_collector": with_collector(engine.url, model_dir),
            "tmp": request.getfixturevalue("tmp_path"),
            "tasks": [
                {"id": "t1", "question": "1 + 1", "answer": "2"},
                {"id": "t2", "question": "2 + 3", "answer": "5"},
            ],
        }
        return
    if name in STORE:
        yield {
            "store_url": request.getfixturevalue("store_url"),
            "run_name": f"doctest-{uuid.uuid4().hex[:12]}",
        }
        return
    if name not in DOCKER:
        yield {}
        return
    request.getfixturevalue("docker_host")  # sets DOCKER_HOST
    from vime.sandbox import DockerSandbox, SandboxConfig, SandboxPool, build_base_image

    build_base_image(log=lambda msg: None)  # imported once per machine, as the tests do
    with contextlib.ExitStack() as stack:
        globs: dict = {}
        if name in ("vime.sandbox.docker", "vime.sandbox.container_exec"):
            globs["sb"] = stack.enter_context(DockerSandbox(SandboxConfig()))
        if name == "vime.sandbox.pool":
            globs["pool"] = stack.enter_context(SandboxPool(SandboxConfig(), size=1))
        yield globs


def test_discovery_finds_library_and_suites() -> None:
    assert {"vime", "vime.net", "vime.suites.math.env"} <= set(MODULES)
    assert not any(".tests" in name or name.endswith("__main__") for name in MODULES)


@pytest.mark.parametrize(
    "name",
    [
        pytest.param(
            n, marks=[pytest.mark.docker] * (n in DOCKER) + [pytest.mark.engine] * (n in ENGINE)
        )
        for n in MODULES
    ],
)
def test_docstring_examples(name: str, request: pytest.FixtureRequest) -> None:
    if name in NEEDS and importlib.util.find_spec(NEEDS[name]) is None:
        pytest.skip(f"{name}: {NEEDS[name]} is not installed (pip install 'vime[{NEEDS[name]}]')")
    try:
        module = importlib.import_module(name)
    except ModuleNotFoundError as err:
        top = (err.name or "").partition(".")[0]
        if top in OPTIONAL:
            pytest.skip(f"{name}: {OPTIONAL[top]}")
        raise
    runner = doctest.DocTestRunner(optionflags=doctest.ELLIPSIS)
    with service_globals(name, request) as globs:
        for test in doctest.DocTestFinder().find(module, name, extraglobs=globs):
            if name in TRAINER:
                test.globs.update(trainer_globals(name, test, request))
            runner.run(test)
    assert runner.failures == 0
