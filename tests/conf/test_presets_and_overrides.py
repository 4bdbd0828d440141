"""The train config as Hydra users expect it: presets as YAML files, a user's preset folder
(``--config-dir DIR +experiment=NAME``), dict-valued keys, ``+key`` that would add nothing,
and the renamed ``algorithm`` keys and group (old names fail naming the new ones; a run
saved before the rename still resumes)."""

from __future__ import annotations

import pytest
import yaml
from omegaconf import OmegaConf

from vime.conf.compose import describe, load_config
from vime.conf.overrides import MOVED, split_config_dir
from vime.conf.presets import CONF_DIR, group_options
from vime.errors import ConfigError

SHORT = """\
# @package _global_
# A short run of my own env, with RLOO.
defaults:
  - override /env: myenv
steps: 3
rollout:
  batch_size: 2
algorithm:
  advantage: rloo
"""
MYENV = """\
# @package _global_
env:
  id: vime/Tools-v0
  kwargs: {max_turns: 2, tools: [calculator]}
  builtin_tasks: vime.suites.tools.tasks:calculator_tasks
  eval_size: 5
"""


@pytest.fixture
def conf_dir(tmp_path):
    """A user's preset folder: ``experiment/short.yaml`` and ``env/myenv.yaml``."""
    folder = tmp_path / "my_conf"
    (folder / "experiment").mkdir(parents=True)
    (folder / "env").mkdir()
    (folder / "experiment" / "short.yaml").write_text(SHORT)
    (folder / "env" / "myenv.yaml").write_text(MYENV)
    return folder


@pytest.mark.parametrize(
    ("override", "key", "new"),
    [
        ("rollout.advantage=gae", "rollout.advantage", "algorithm.advantage=gae"),
        ("rollout.normalize_std=false", "rollout.normalize_std", "algorithm.normalize_std"),
        ("rollout.kl_reward_coef=0.1", "rollout.kl_reward_coef", "algorithm.kl_reward_coef"),
        ("trainer=grpo", "trainer", "algorithm=grpo"),
        ("trainer=gspo", "trainer", "algorithm=gspo"),
        ("+trainer=dr_grpo", "trainer", "algorithm=dr_grpo"),
    ],
)
def test_old_names_fail_naming_the_new_one(override, key, new):
    with pytest.raises(ConfigError, match="now") as err:
        load_config([override])
    assert err.value.key == key and new in str(err.value)


def test_the_algorithm_group_and_keys():
    cfg = load_config(["algorithm=dr_grpo", "trainer.lr=1e-4"])  # trainer keys still work
    assert cfg.trainer.lr == 1e-4 and not cfg.algorithm.normalize_std
    assert cfg.trainer.loss.aggregation == "token-sum" and {"algorithm": "dr_grpo"} in cfg.defaults
    assert load_config(["algorithm.advantage=rloo"]).algorithm.advantage == "rloo"


def test_a_run_saved_before_the_rename_resumes(tmp_path):
    """A config.yaml of the old layout (algorithm keys under rollout, ``{trainer: X}`` in
    its defaults) resumes as the same config."""
    keys = ["algorithm.overlong=mask", "algorithm.kl_reward_coef=0.1", "steps=7"]
    first = load_config(["env=tools", "algorithm=dr_grpo", *keys])
    old = OmegaConf.to_container(OmegaConf.structured(first))
    old["rollout"].update(old.pop("algorithm"))  # the layout before the algorithm node
    old["defaults"] = [
        {"trainer": e["algorithm"]} if isinstance(e, dict) and "algorithm" in e else e
        for e in old["defaults"]
    ]
    assert {"trainer": "dr_grpo"} in old["defaults"] and old["rollout"]["overlong"] == "mask"
    (tmp_path / "config.yaml").write_text(yaml.safe_dump(old))

    again = load_config([f"resume={tmp_path}"])
    again.resume = ""
    assert again == first
    longer = load_config([f"resume={tmp_path}", "algorithm=dr_grpo", "steps=9"])
    assert (longer.steps, longer.algorithm.kl_reward_coef) == (9, 0.1)
    with pytest.raises(ConfigError, match="started with algorithm=dr_grpo") as err:
        load_config([f"resume={tmp_path}", "algorithm=gspo"])
    assert err.value.key == "algorithm"
    with pytest.raises(ConfigError, match=r"algorithm\.overlong now"):
        load_config([f"resume={tmp_path}", "rollout.overlong=none"])


def test_every_moved_key_is_an_algorithm_key():
    cfg = load_config([])
    for old, new in MOVED.items():
        assert old.startswith("rollout.") and not hasattr(cfg.rollout, old.split(".")[1])
        assert hasattr(cfg.algorithm, new.split(".")[1])


@pytest.mark.parametrize(
    ("overrides", "key", "want"),
    [
        (
            ["rollout.collector.chat_template_kwargs={enable_thinking:false}"],
            "rollout.collector.chat_template_kwargs",
            {"enable_thinking": False},
        ),
        (["env.kwargs={max_turns:3}"], "env.kwargs", {"max_turns": 3}),
        # Merged into the preset's mapping, as Hydra merges a dict value.
        (["env=tools", "env.kwargs={max_turns:3}"], "env.kwargs", {"max_turns": 3, "tools": ["calculator"]}),
        (["env=tools", "env.kwargs.max_turns=2"], "env.kwargs", {"max_turns": 2, "tools": ["calculator"]}),
        (["env.kwargs.max_turns=2"], "env.kwargs", {"max_turns": 2}),
        (["env=tools", "~env.kwargs.tools"], "env.kwargs", {"max_turns": 4}),
        (
            ['rollout.collector.sampling.extra_body={"ignore_eos": true}'],
            "rollout.collector.sampling.extra_body",
            {"ignore_eos": True},
        ),
        (
            [
                'rollout.collector.sampling.extra_body={"structured_outputs": {"regex": "\\\\d+|it\'s"}}',
                "trainer.sampler_replay=false",  # a grammar: the trainer cannot replay it
            ],
            "rollout.collector.sampling.extra_body",
            {"structured_outputs": {"regex": "\\d+|it's"}},
        ),
        (
            ['rollout.collector.sampling.extra_body={"a": [1, null, true, "${x}"]}'],
            "rollout.collector.sampling.extra_body",
            {"a": [1, None, True, "${x}"]},
        ),
        (["++env.kwargs={max_turns:3}"], "env.kwargs", {"max_turns": 3}),  # Hydra's own form
        (["+env.kwargs.tools=[python]"], "env.kwargs", {"tools": ["python"]}),
        (["engine.env={OMP_NUM_THREADS:'2'}"], "engine.env", {"OMP_NUM_THREADS": "2"}),
    ],
)  # fmt: skip
def test_dict_valued_keys_take_the_documented_forms(overrides, key, want):
    value = load_config(overrides)
    for part in key.split("."):
        value = getattr(value, part)
    assert value == want


def test_a_resumed_run_merges_a_dict_value_into_its_own(tmp_path):
    first = load_config(["env=tools"])
    (tmp_path / "config.yaml").write_text(OmegaConf.to_yaml(OmegaConf.structured(first)))
    again = load_config([f"resume={tmp_path}", "env.kwargs={max_turns:3}"])
    assert again.env.kwargs == {"max_turns": 3, "tools": ["calculator"]}


@pytest.mark.parametrize(
    ("override", "key", "words"),
    [
        ("+foo=bar", "foo", ["+foo: no such key or group", "--config-dir DIR +GROUP=NAME"]),
        ("+rollout.nonsense=3", "rollout.nonsense", ["+rollout.nonsense: no such key"]),
        ("++foo=bar", "foo", ["++foo: no such key"]),
        ("+experiment=short", "experiment", ["no such option", "['lora']", "--config-dir"]),
        ("+steps=3", "steps", ["+steps: the key exists", "steps=VALUE"]),
        ('env.kwargs={"a b": 1}', "env.kwargs", ["'a b'"]),
    ],
)
def test_a_plus_key_that_adds_nothing_fails(override, key, words):
    with pytest.raises(ConfigError) as err:
        load_config([override])
    assert err.value.key == key
    for word in words:
        assert word in str(err.value)


def test_the_presets_are_yaml_files():
    options = group_options()
    assert options == {
        "algorithm": ["dr_grpo", "grpo", "gspo"],
        "engine": ["cpu", "gpu"],
        "env": ["math", "swe", "tools"],
        "experiment": ["lora"],
        "model": ["tiny"],
        "rollout": ["async", "sync"],
    }
    for group, names in options.items():
        for name in names:
            text = (CONF_DIR / group / f"{name}.yaml").read_text()
            assert text.startswith("#")  # each says what it is for
            assert (group == "model") != text.startswith("# @package _global_"), name
            extra = ["placement.mode=split"] if name == "async" else []
            plus = "+" if group == "experiment" else ""  # a group with no default option
            assert {group: name} in load_config([f"{plus}{group}={name}", *extra]).defaults


def test_a_users_folder_adds_options_and_experiments(conf_dir):
    cfg = load_config(["+experiment=short"], config_dir=conf_dir)
    assert (cfg.steps, cfg.rollout.batch_size, cfg.algorithm.advantage) == (3, 2, "rloo")
    assert cfg.env.id == "vime/Tools-v0" and cfg.env.kwargs["max_turns"] == 2
    assert {"env": "myenv"} in cfg.defaults and {"experiment": "short"} in cfg.defaults
    own = load_config(["env=myenv", "steps=5"], config_dir=str(conf_dir))
    assert (own.env.eval_size, own.steps, own.algorithm.advantage) == (5, 5, "grpo")
    # The command line wins over the experiment.
    assert load_config(["+experiment=short", "steps=4"], config_dir=conf_dir).steps == 4


@pytest.mark.parametrize(
    ("overrides", "key", "words"),
    [
        (["+experiment=nope"], "experiment", ["no such option", "short"]),
        (["experiment=short"], "experiment", ["+experiment=short"]),
        (["+flat=nopkg"], "flat", ["# @package _global_"]),
        (["env=nope"], "env", ["math", "myenv"]),
    ],
)
def test_a_users_folder_errors_name_the_fix(conf_dir, overrides, key, words):
    (conf_dir / "flat").mkdir()
    (conf_dir / "flat" / "nopkg.yaml").write_text("steps: 3\n")  # no @package line
    with pytest.raises(ConfigError) as err:
        load_config(overrides, config_dir=conf_dir)
    assert err.value.key == key
    for word in words:
        assert word in str(err.value)


def test_a_missing_config_dir_fails_naming_the_flag(tmp_path):
    with pytest.raises(ConfigError, match=r"--config-dir .*no such folder") as err:
        load_config([], config_dir=tmp_path / "nope")
    assert err.value.key == "--config-dir"


def test_a_users_preset_named_like_vimes_fails_instead_of_being_ignored(tmp_path):
    (tmp_path / "env").mkdir()
    (tmp_path / "env" / "math.yaml").write_text("# @package _global_\nsteps: 3\n")
    with pytest.raises(ConfigError, match=r"env/math.yaml has the name of one of vime's"):
        load_config(["env=math"], tmp_path)


def test_a_run_from_a_users_folder_resumes(conf_dir, tmp_path):
    first = load_config(["+experiment=short"], config_dir=conf_dir)
    run = tmp_path / "run"
    run.mkdir()
    (run / "config.yaml").write_text(OmegaConf.to_yaml(OmegaConf.structured(first)))
    for again in (
        load_config([f"resume={run}"]),  # the run's config.yaml holds every value
        load_config([f"resume={run}", "+experiment=short"], config_dir=conf_dir),
    ):
        assert (again.steps, again.env.eval_size, again.algorithm.advantage) == (3, 5, "rloo")
        assert again.defaults == first.defaults


@pytest.mark.parametrize(
    ("argv", "want"),
    [
        (["--config-dir", "d", "+experiment=x"], ("d", ["+experiment=x"])),
        (["steps=2", "--config-dir=d"], ("d", ["steps=2"])),
        (["-cd", "d", "--help"], ("d", ["--help"])),
        (["steps=2"], (None, ["steps=2"])),
    ],
)
def test_split_config_dir(argv, want):
    assert split_config_dir(argv) == want


@pytest.mark.parametrize("argv", [["--config-dir"], ["--config-dir", "--help"], ["--config-dir="]])
def test_config_dir_without_a_folder_fails(argv):
    with pytest.raises(ConfigError, match="--config-dir needs a folder"):
        split_config_dir(argv)


def test_help_lists_the_groups_of_both_folders(conf_dir):
    text = describe(conf_dir)
    assert "  algorithm: dr_grpo, grpo, gspo (default grpo)" in text
    assert "  env:       math, myenv, swe, tools (default math)" in text
    assert "  experiment: lora, short (add: +experiment=NAME)" in text
    assert "trainer:" not in text.split("Keys")[0]  # the group is algorithm now
