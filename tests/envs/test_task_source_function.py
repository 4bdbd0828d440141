"""env.tasks.source (vime.envs.function_source): a user's function drawn as a TaskSource.

The contract: a restored position continues with exactly the tasks an uninterrupted
source gives (by count for an iterable, by the object's own state for a stateful one),
lent tasks come back first, a finite function ends the draws as a file's last epoch does,
and what is wrong fails at start naming the key and the signature vime expects.
"""

from __future__ import annotations

import itertools

import pytest

from vime.conf.compose import load_config
from vime.envs.function_source import SIGNATURE, FunctionTaskSource
from vime.errors import ConfigError, DataError
from vime.rl.tasks import check_task_source, eval_tasks, train_source

CALLS: list[dict] = []  # the arguments each source function was called with


def counting(seed: int, split: str = "train"):
    """An endless iterable (a generator): its position is the count of tasks taken."""
    CALLS.append({"seed": seed, "split": split})
    return ({"id": f"{split}-{seed}-{i}", "n": i} for i in itertools.count())


class Stream:
    """A stateful source: it saves its own position (here a cursor over a stride)."""

    def __init__(self, seed: int, split: str = "train") -> None:
        self.seed, self.cursor = seed, 0

    def __iter__(self):
        while self.cursor < 50:
            self.cursor += 1
            yield {"id": f"s{self.seed}-{self.cursor * 3}"}

    def state_dict(self) -> dict:
        return {"cursor": self.cursor}

    def load_state_dict(self, state: dict) -> None:
        self.cursor = state["cursor"]


def _ids(tasks) -> list[str]:
    return [t["id"] for t in tasks]


def _source(fn=counting, **kw) -> FunctionTaskSource:
    return FunctionTaskSource(lambda: fn(seed=7), name="test:source", **kw)


@pytest.mark.parametrize("fn", [counting, Stream], ids=["iterable", "stateful"])
def test_a_restored_position_continues_as_if_never_stopped(fn):
    whole = _ids(_source(fn).take(9))
    first = _source(fn)
    assert _ids(first.take(4)) == whole[:4]
    state = first.state_dict()
    assert ("state" in state) == (fn is Stream)  # a stateful object's own state is saved
    restored = _source(fn)
    restored.load_state_dict(state)
    assert _ids(restored.take(5)) == whole[4:]
    # A rewound draw (Rollouts puts back a draw that Ctrl-C interrupted): same object.
    first.take(3)
    first.load_state_dict(state)
    assert _ids(first.take(5)) == whole[4:]


def test_lent_tasks_come_back_first_after_resume():
    src = _source()
    lent = [src.lend() for _ in range(4)]
    src.settle([lent[1]["id"]])
    restored = _source()
    restored.load_state_dict(src.state_dict())
    # The three not settled are played again before any new draw; then task 4 onwards.
    assert _ids(restored.take(5)) == [
        lent[0]["id"],
        lent[2]["id"],
        lent[3]["id"],
        "train-7-4",
        "train-7-5",
    ]
    # A buffered step replayed after resume walks the source as the run did.
    again = _source()
    again.settle(["train-7-2"], max_draws=3)
    assert _ids(again.lent) == ["train-7-0", "train-7-1"]


def test_a_finite_function_ends_the_draws_as_a_last_epoch_does():
    src = FunctionTaskSource(lambda: [{"id": "a"}, {"id": "b"}, {"id": "c"}], name="three")
    assert _ids(src.take(5)) == ["a", "b", "c"]  # fewer only at the end
    with pytest.raises(DataError, match=r"exhausted: three .* has yielded all its 3 tasks"):
        src.take(1)
    with pytest.raises(StopIteration):
        src.lend()  # the async stream marks itself exhausted
    limited = _source(limit=2)
    assert _ids(limited.take(3)) == ["train-7-0", "train-7-1"]
    with pytest.raises(DataError, match=r"env.tasks.limit=2 tasks of test:source"):
        limited.take(1)


def test_records_are_checked_and_ids_made_strings():
    src = FunctionTaskSource(lambda: iter([{"id": 5}, {"q": "x"}, "oops"]), name="mixed")
    assert src.next() == {"id": "5"}
    assert len(src.next()["id"]) == 12  # made from the content, as a file's records are
    with pytest.raises(DataError, match="mixed: task 2: a task must be an object"):
        src.next()


def test_a_function_that_yields_other_tasks_on_resume_is_refused():
    src = _source()
    src.take(3)
    state = src.state_dict()
    other = FunctionTaskSource(lambda: counting(seed=8), name="test:source")
    with pytest.raises(DataError, match="task 2 is 'train-8-2' now but was 'train-7-2'"):
        other.load_state_dict(state)
    short = FunctionTaskSource(lambda: [{"id": "train-7-0"}], name="test:source")
    with pytest.raises(DataError, match="yielded 1 tasks, but the checkpoint had drawn 3"):
        short.load_state_dict(state)
    stateful = _source(Stream)
    with pytest.raises(DataError, match="saved by function test:source, which"):
        stateful.load_state_dict(state)
    with pytest.raises(DataError, match="saved by a task file"):
        _source().load_state_dict({"epoch": 0, "index": 3, "num_tasks": 10})


@pytest.fixture
def source_file(tmp_path, monkeypatch):
    """A module file of source functions, in the working directory (as a user's would be)."""
    (tmp_path / "my_tasks.py").write_text(
        "import itertools\n"
        "def tasks(seed, split='train'):\n"
        "    return ({'id': f'{split}-{seed}-{i}'} for i in itertools.count())\n"
        "def no_split(seed):\n"
        "    return [{'id': f'n{seed}-{i}'} for i in range(10)]\n"
        "def no_seed(split):\n"
        "    return []\n"
        "async def agen(seed):\n"
        "    yield {'id': 'a'}\n"
        "def number(seed):\n"
        "    return 3\n"
        "class Half:\n"
        "    def __iter__(self):\n"
        "        return iter([])\n"
        "    def state_dict(self):\n"
        "        return {}\n"
        "def half(seed):\n"
        "    return Half()\n"
    )
    monkeypatch.chdir(tmp_path)
    return "my_tasks.py"


def test_train_and_eval_call_the_function_with_seed_and_split(source_file):
    cfg = load_config(["env.tasks.source=my_tasks.py:tasks", "env.tasks.seed=3", "env.eval_size=2"])
    check_task_source(cfg)
    assert _ids(train_source(cfg).take(2)) == ["train-3-0", "train-3-1"]
    assert _ids(eval_tasks(cfg.env)) == ["eval-3-0", "eval-3-1"]
    plain = load_config(["env.tasks.source=my_tasks.py:no_split", "eval_every=0"])
    check_task_source(plain)  # no evaluation: a function without split is fine
    assert _ids(train_source(plain).take(2)) == ["n0-0", "n0-1"]


def test_a_function_without_split_needs_eval_tasks_or_no_eval(source_file):
    cfg = load_config(["env.tasks.source=my_tasks.py:no_split", "eval_every=5"])
    with pytest.raises(ConfigError, match=r"set env.eval_tasks .* or set env.eval_size=0") as err:
        check_task_source(cfg)
    assert err.value.key == "env.eval_tasks"
    cfg.env.eval_size = 0
    check_task_source(cfg)


@pytest.mark.parametrize(
    ("spec", "says"),
    [
        ("my_tasks.py:no_seed", r"no_seed\(split\) cannot be called as vime calls it"),
        ("my_tasks.py:missing", "has no 'missing'"),
        ("my_tasks.py:agen", "is 'async def'"),
    ],
)
def test_a_wrong_function_fails_at_start_naming_the_key_and_signature(source_file, spec, says):
    cfg = load_config([f"env.tasks.source={spec}", "eval_every=0"])
    with pytest.raises(ConfigError, match=says) as err:
        check_task_source(cfg)
    assert err.value.key == "env.tasks.source" and SIGNATURE in str(err.value)


@pytest.mark.parametrize(
    ("spec", "says"),
    [
        ("my_tasks.py:number", "returned int, which is not iterable"),
        ("my_tasks.py:half", r"with state_dict\(\) but no load_state_dict\(\)"),
    ],
)
def test_a_wrong_result_names_the_key_and_signature(source_file, spec, says):
    cfg = load_config([f"env.tasks.source={spec}", "eval_every=0"])
    with pytest.raises(ConfigError, match=says) as err:
        train_source(cfg)
    assert err.value.key == "env.tasks.source" and SIGNATURE in str(err.value)


def test_a_task_file_and_a_source_together_fail_naming_both():
    with pytest.raises(
        ConfigError, match=r"env.tasks.path: cannot be set together with env.tasks.source"
    ) as err:
        load_config(["env.tasks.source=my_tasks.py:tasks", "env.tasks.path=t.jsonl"])
    assert err.value.key == "env.tasks.path"


@pytest.mark.parametrize("override", ["env.tasks.epochs=2", "env.tasks.shuffle=false"])
def test_keys_that_do_nothing_with_a_source_are_refused(override):
    key = override.split("=")[0]
    with pytest.raises(ConfigError, match=rf"{key}=.* does nothing with env.tasks.source") as err:
        load_config(["env.tasks.source=my_tasks.py:tasks", override])
    assert err.value.key == key
