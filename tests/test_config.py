"""One ``key=value`` grammar: values are read as ``vime-agent train`` (Hydra) reads them,
by ``apply_overrides`` and so by every command that reads its keys through it."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

import pytest

from vime.agents.own_agent_cli import OwnAgentRun
from vime.config import apply_overrides, parse_value
from vime.errors import ConfigError
from vime.eval.evaluate import parse_command
from vime.eval.suites import EvalSet


@pytest.mark.parametrize(
    ("text", "value"),
    [
        ("{max_turns:3}", {"max_turns": 3}),
        ("{enable_thinking:false}", {"enable_thinking": False}),
        ('{"repetition_penalty": 1.1}', {"repetition_penalty": 1.1}),  # JSON's quoted keys
        (
            '{"structured_outputs": {"regex": "[a-z]+"}}',
            {"structured_outputs": {"regex": "[a-z]+"}},
        ),
        ('{max_turns:3, "top_k": 2}', {"max_turns": 3, "top_k": 2}),  # the two mixed
        ('{"a b": [1, "x"]}', {"a b": [1, "x"]}),  # a key the grammar cannot take: YAML
        ('{max_turns:3, "a b": 1}', '{max_turns:3, "a b": 1}'),  # YAML: {'max_turns:3': None}
        ("{a: [1, {b: c}]}", {"a": [1, {"b": "c"}]}),
        ("[1,2]", [1, 2]),
        ("[--max-num-seqs, '8']", ["--max-num-seqs", "8"]),
        ("[--flag=x]", ["--flag=x"]),  # "=" inside a list: the grammar refuses, YAML reads it
        ("1e-5", 1e-5),
        ("10_000", 10_000),
        ("abc", "abc"),
        ("true", True),
        ("null", None),
        ("", ""),
        ("'3'", "3"),  # quoted text stays text
        ('"a b"', "a b"),
        ("yes", "yes"),  # YAML 1.1's boolean is text here, as in train
        ("a,b", "a,b"),  # a sweep in Hydra; here the text
        ("http://10.0.0.5:8000", "http://10.0.0.5:8000"),
        ("runs/20261130-061500-math", "runs/20261130-061500-math"),
        ("#x", "#x"),  # text the grammar refuses stays text (YAML read a comment: None)
        ("[oops", "[oops"),
    ],
)
def test_values_are_read_with_hydras_grammar(text: str, value: Any) -> None:
    assert parse_value(text) == value
    assert type(parse_value(text)) is type(value)


@dataclass
class Demo:
    step: int | None = None
    rate: float | None = None
    flag: bool | None = None
    name: str = ""
    kwargs: dict[str, Any] = field(default_factory=dict)


def test_the_documented_mapping_forms() -> None:
    cfg = apply_overrides(
        Demo(), ['kwargs={max_turns:3, "repetition_penalty": 1.1, enable_thinking: false}']
    )
    assert cfg.kwargs == {"max_turns": 3, "repetition_penalty": 1.1, "enable_thinking": False}
    # an eval set's keys (suite files and their overrides share them)
    s = apply_overrides(
        EvalSet(name="a", env="vime/Math-v0", tasks="t.jsonl"),
        [
            "kwargs={max_turns:3}",
            "collector.chat_template_kwargs={enable_thinking:false}",
            'collector.sampling.extra_body={"repetition_penalty": 1.1}',
        ],
    )
    assert s.kwargs == {"max_turns": 3}
    assert s.collector.chat_template_kwargs == {"enable_thinking": False}
    assert s.collector.sampling.extra_body == {"repetition_penalty": 1.1}


def test_a_command_reads_them_too() -> None:
    """``vime-agent own-agent`` (its keys are ``OwnAgentRun``) and ``vime-agent eval``."""
    run = apply_overrides(
        OwnAgentRun(),
        [
            "policy=http://127.0.0.1:8000",
            "endpoint.chat_template_kwargs={enable_thinking:false}",
            'endpoint.sampling.extra_body={"repetition_penalty": 1.1}',
        ],
    )
    assert run.endpoint.chat_template_kwargs == {"enable_thinking": False}
    assert run.endpoint.sampling.extra_body == {"repetition_penalty": 1.1}
    cmd = parse_command(["ckpt=runs/r", "suite=math", "engine.env={OMP_NUM_THREADS: '2'}"])
    assert cmd.engine.env == {"OMP_NUM_THREADS": "2"}


def test_optional_fields_are_checked() -> None:
    cfg = apply_overrides(Demo(), ["step=3", "rate=1e-5", "flag=true"])
    assert (cfg.step, cfg.rate, cfg.flag) == (3, 1e-5, True)
    assert apply_overrides(cfg, ["step=null"]).step is None
    for item, says in (
        ("step=abc", "step: expected int, got 'abc'"),
        ("step=1.5", "step: expected int, got 1.5"),
        ("rate=fast", "rate: expected float, got 'fast'"),
        ("flag=maybe", "flag: expected true/false, got 'maybe'"),
        ("name=null", "name: expected str, got None"),  # not optional
        ("kwargs={a", "kwargs: expected dict, got '{a'"),
    ):
        with pytest.raises(ConfigError, match=says) as err:
            apply_overrides(Demo(), [item])
        assert err.value.key == item.partition("=")[0]
    with pytest.raises(ConfigError, match="step: expected int") as err:
        parse_command(["ckpt=runs/r", "suite=math", "step=abc"])
    assert err.value.key == "step"


def test_a_json_value_keeps_its_escapes():
    """A regex in JSON (own-agent's structured outputs) reads as JSON reads it."""
    regex = r'(<tool_call>\n\{"name": "add"\}|The answer is \\boxed\{[5-8]\}\.)'
    text = json.dumps({"structured_outputs": {"regex": regex}})
    assert parse_value(text) == {"structured_outputs": {"regex": regex}}
