"""vime/Math-v0: make, play, GSM8K tasks, errors, gymnasium.make, thread safety."""

import json
import threading

import gymnasium
import pytest

import vime
from vime.errors import ConfigError, EnvError
from vime.suites.math.data import arithmetic_suite, load_math_jsonl
from vime.suites.math.env import MathEnv
from vime.types import Action


def test_default_task_is_seeded_arithmetic():
    env = vime.make("vime/Math-v0")
    messages, info = env.reset(seed=5)
    assert messages == [{"role": "user", "content": messages[0]["content"]}]
    question = messages[0]["content"]
    assert question.startswith("What is ") and question.endswith("? Answer in \\boxed{}.")
    a, b = question.removeprefix("What is ").split("?")[0].split("+")
    assert 0 <= int(a) <= 99 and 0 <= int(b) <= 99
    new, reward, terminated, truncated, info = env.step(
        Action(text=f"\\boxed{{{int(a) + int(b)}}}")
    )
    assert (new, reward, terminated, truncated) == ([], 1.0, True, False)
    assert info["correct"] and env.episode_metrics() == {"correct": 1.0, "format_ok": 1.0}
    assert env.reset(seed=5)[0] == messages


def test_wrong_and_unformatted_answers():
    env = vime.make("vime/Math-v0")
    task = {"id": "t", "question": "What is 2+2?", "answer": "4"}
    env.reset(options={"task": task})
    assert env.step(Action(text="\\boxed{5}"))[1] == 0.0
    env.reset(options={"task": task})
    _, reward, terminated, _, info = env.step(Action(text="4"))
    assert (reward, terminated, info["format_ok"], info["reason"]) == (0.0, True, False, "no_box")
    assert env.episode_metrics() == {"correct": 0.0, "format_ok": 0.0}


def test_gsm8k_task_file_end_to_end(tmp_path):
    path = tmp_path / "gsm8k.jsonl"
    rows = [
        {
            "question": "Tom has 1,200 apples and buys 34. How many?",
            "answer": "1200+34=1234\n#### 1,234",
        }
    ]
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    task = load_math_jsonl(path)[0]
    env = vime.make("vime/Math-v0", system_prompt="You are good at math.")
    messages, _ = env.reset(options={"task": task})
    assert [m["role"] for m in messages] == ["system", "user"]
    assert env.step(Action(text="He has \\boxed{1234} apples."))[1] == 1.0


def test_task_without_answer_is_env_error_with_task_id():
    env = vime.make("vime/Math-v0")
    with pytest.raises(EnvError, match="field 'answer' is missing") as info:
        env.reset(options={"task": {"id": "q-3", "question": "?"}})
    assert (info.value.env_id, info.value.task_id) == ("vime/Math-v0", "q-3")


def test_config_is_validated():
    with pytest.raises(ConfigError, match=r"env\.level"):
        MathEnv(level="add9")
    with pytest.raises(EnvError, match="add9"):
        vime.make("vime/Math-v0", level="add9")


def test_levels_and_checker():
    for level in ("add1", "sub2", "mul1", "mul2"):
        env = vime.make("vime/Math-v0", level=level)
        assert all(r.ok for r in vime.check_env(env))


def test_gymnasium_make():
    env = gymnasium.make("vime/Math-v0")
    task = arithmetic_suite(1, seed=1)[0]
    env.reset(options={"task": task})
    assert env.step(Action(text=f"\\boxed{{{task['answer']}}}"))[1] == 1.0


def test_steps_from_worker_threads():
    """The collector calls step from threads; symbolic answers go through math-verify there."""
    tasks = [{"id": str(i), "question": "Expand (x+1)^2.", "answer": "x^2+2x+1"} for i in range(4)]
    rewards = []

    def play(task):
        env = vime.make("vime/Math-v0")
        env.reset(options={"task": task})
        rewards.append(env.step(Action(text="\\boxed{(x+1)^2}"))[1])

    threads = [threading.Thread(target=play, args=(t,)) for t in tasks]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert rewards == [1.0] * 4


def test_raw_gsm8k_and_math_records_work_as_tasks():
    """A task file loaded with plain load_tasks (as the RL loop does) still scores right."""
    env = vime.make("vime/Math-v0")
    gsm = {"id": "g1", "question": "How many?", "answer": "600+634=1234\n#### 1,234"}
    env.reset(options={"task": gsm})
    assert env.step(Action(text="\\boxed{1234}"))[1] == 1.0
    math_row = {"id": "m1", "problem": "Half of one?", "solution": "It is $\\boxed{\\frac{1}{2}}$."}
    messages, _ = env.reset(options={"task": math_row})
    assert messages[-1]["content"].startswith("Half of one?")
    assert env.step(Action(text="\\boxed{0.5}"))[1] == 1.0
    assert env.task == math_row  # the record itself is kept as given
