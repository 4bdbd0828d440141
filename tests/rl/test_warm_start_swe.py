"""``env=swe`` on the tiny model: the one-line family's demonstrations are played in the real
SWE env (pooled sandboxes, hidden tests) and tokenized as the collector tokenizes an
episode; the run starts without the old "needs a real model" warning."""

from __future__ import annotations

import logging

import pytest

import vime.envs as envs
from vime.agents.chat_tokens import ChatTokens
from vime.agents.tool_parsers import parse_tool_calls
from vime.conf.compose import load_config
from vime.rl.setup import prepare_model
from vime.rl.warm_start import demonstration_sample
from vime.runs.folder import RunDir
from vime.suites.swe.demonstrations import demonstration
from vime.suites.swe.tasks.oneline import oneline_tasks

SWE = "vime/SWE-v0"


def test_swe_on_the_tiny_model_starts_without_a_warning(tmp_path, caplog):
    cfg = load_config(["env=swe", "model.warm_start_steps=0", f"run_root={tmp_path}"])
    with caplog.at_level(logging.WARNING, logger="vime.train"):
        prepare_model(cfg, RunDir.create(tmp_path, "swe"))
    assert not caplog.records, [r.getMessage() for r in caplog.records]


@pytest.mark.docker
def test_swe_demonstration_tokens_are_the_collectors(docker_host, tok):
    """Four assistant turns trained (view, str_replace, tests, submit); the env's answers
    (the file, the edit, the tests' last line) masked out; the collector's own tokens."""
    from vime.sandbox.leases import close_pools

    kwargs = load_config(["env=swe"]).env.kwargs
    task = oneline_tasks(1, seed=9)[0]
    env = envs.make(SWE, **kwargs)
    try:
        sample = demonstration_sample(env, tok, SWE, task, demonstration(task))
        messages, _ = env.reset(options={"task": task})
        chat = ChatTokens(tok, messages, tools=env.tools, env_id=SWE)
        for text in demonstration(task):
            ids = [*chat.encode(text), tok.eos_token_id]
            chat.add_sampled(ids, [-1.0] * len(ids))
            new, reward, done, _, _ = env.step(parse_tool_calls(text))
            if not done:
                chat.add_messages(new)
        chat.close()
    finally:
        env.close()
        close_pools()
    assert reward == 1.0
    assert (sample.tokens, sample.loss_mask) == (chat.tokens, chat.loss_mask)
    runs = [m for i, m in enumerate(sample.loss_mask) if i == 0 or m != sample.loss_mask[i - 1]]
    assert runs == [0, 1, 0, 1, 0, 1, 0, 1, 0]
    trained = tok.decode([t for t, m in zip(sample.tokens, sample.loss_mask, strict=True) if m])
    path, old, new = task["solution"][0]
    assert f'"old_str": "{old}", "new_str": "{new}"' in trained and path in trained
    assert "\nOK\n" not in trained  # the tests' answer is the env's, never trained on
