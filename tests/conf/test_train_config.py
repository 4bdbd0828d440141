"""The train config: groups, overrides, and errors that name the key and the fix."""

from __future__ import annotations

import pytest

from vime.conf.compose import describe, load_config
from vime.errors import ConfigError


def test_defaults_are_the_embedded_math_run():
    cfg = load_config([])
    assert cfg.env.id == "vime/Math-v0"
    assert cfg.model.path == "" and cfg.model.warm_start_steps > 0  # the tiny local model
    assert cfg.rollout.mode == "sync" and cfg.engine.dtype == "float32"
    assert cfg.trainer.temperature == cfg.rollout.collector.sampling.temperature


@pytest.mark.parametrize(
    ("overrides", "check"),
    [
        (["env=tools"], lambda c: c.env.id == "vime/Tools-v0" and c.engine.max_model_len == 2048),
        # Shorter training episodes go to vime.make (the env knows its last turn); the
        # collector has no limit of its own (None: the env's).
        (
            ["env=swe"],
            lambda c: (
                c.env.id == "vime/SWE-v0"
                and c.env.kwargs == {"max_turns": 5, "tools": ["bash", "str_replace", "submit"]}
                and c.rollout.collector.max_turns is None
            ),
        ),
        (["env=tools"], lambda c: c.env.kwargs == {"max_turns": 4, "tools": ["calculator"]}),
        (["env=math"], lambda c: c.env.kwargs == {} and c.rollout.collector.max_turns is None),
        (
            ["algorithm=gspo"],
            lambda c: c.trainer.loss.policy_loss == "gspo" and c.trainer.minibatches == 2,
        ),
        (
            ["algorithm=dr_grpo"],
            lambda c: c.trainer.loss.aggregation == "token-sum" and not c.algorithm.normalize_std,
        ),
        (["rollout=async"], lambda c: c.rollout.mode == "async"),
        (["engine=gpu"], lambda c: c.engine.device == "cuda" and c.engine.dtype == "bfloat16"),
        (
            ["env=tools", "rollout.collector.max_turns=2"],
            lambda c: c.rollout.collector.max_turns == 2,
        ),
        (
            ["trainer.loss.eps_high=0.3", "trainer.minibatches=2", "steps=7"],
            lambda c: c.trainer.loss.eps_high == 0.3 and c.steps == 7,
        ),
    ],
)
def test_groups_and_overrides(overrides, check):
    assert check(load_config(overrides))


@pytest.mark.parametrize(
    ("overrides", "key", "words"),
    [
        (["trainer.lrr=1"], "trainer.lrr", ["trainer.lr"]),
        (["stepz=3"], "stepz", ["steps"]),
        (["steps=abc"], "steps", ["Integer"]),
        (["steps=0"], "steps", [">= 1"]),
        (["env=foo"], "env", ["math", "tools", "swe"]),
        (["rollout.mode=fast"], "rollout.mode", ["sync", "async"]),
        (
            ["trainer.temperature=0.5"],
            "trainer.temperature",
            ["rollout.collector.sampling.temperature"],
        ),
    ],
)
def test_bad_config_names_the_key(overrides, key, words):
    with pytest.raises(ConfigError) as err:
        load_config(overrides)
    assert err.value.key == key
    for word in words:
        assert word in str(err.value)


def test_help_lists_groups_and_keys():
    text = describe()
    for group in ("env:", "model:", "algorithm:", "engine:", "rollout:"):
        assert group in text
    assert "trainer.lr = " in text and "rollout.collector.n_samples = " in text


def test_resume_starts_from_the_runs_own_config(tmp_path):
    """resume=RUN keeps the run's config.yaml (presets and keys); the command's overrides
    change only the keys they name; another preset than the run's fails naming it."""
    from omegaconf import OmegaConf

    first = load_config(["env=tools", "steps=7", "trainer.lr=1e-3", "rollout.batch_size=6"])
    saved = OmegaConf.to_container(OmegaConf.structured(first))
    saved["seed"] = 3  # a key older runs saved and vime has since dropped
    (tmp_path / "config.yaml").write_text(OmegaConf.to_yaml(saved))
    run = f"resume={tmp_path}"

    again = load_config([run])
    assert (again.env.id, again.steps, again.trainer.lr) == ("vime/Tools-v0", 7, 1e-3)
    assert again.model.warm_start_steps == first.model.warm_start_steps  # the preset's
    assert again.resume == str(tmp_path) and {"env": "tools"} in again.defaults
    longer = load_config([run, "steps=9"])
    assert (longer.env.id, longer.steps, longer.rollout.batch_size) == ("vime/Tools-v0", 9, 6)
    assert load_config([run, "env=tools", "steps=9"]) == longer  # the run's preset, repeated
    assert load_config([run, "trainer.lr=1e-5"]).trainer.lr == 1e-5  # the default, named
    with pytest.raises(ConfigError, match=r"started with env=tools .* drop env=math") as err:
        load_config([run, "env=math"])
    assert err.value.key == "env"
