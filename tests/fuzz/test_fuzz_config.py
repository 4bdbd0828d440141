"""Config overrides with garbage: a ConfigError naming the key, never a deep traceback.

``apply_overrides`` (``vime-agent serve``/``eval`` engine flags, eval suites) is fuzzed on
the real TrainConfig and EngineConfig; ``load_config`` (``vime-agent train``, through
Hydra) on fewer examples, as each call composes the whole config (~1 s here).
"""

from __future__ import annotations

from hypothesis import example, given
from hypothesis import strategies as st

from tests.fuzz._fuzz import fuzz, nasty_text
from vime.conf.compose import load_config
from vime.conf.train import TrainConfig
from vime.config import apply_overrides, field_names
from vime.engine.config import EngineConfig
from vime.errors import ConfigError

TRAIN_KEYS = field_names(TrainConfig())
ENGINE_KEYS = field_names(EngineConfig())
GARBAGE_VALUES = [
    "", "[", "{a:", "]]", "null", "~", ".nan", ".inf", "1e999", "-1", "0", "true", "'open",
    "${oops}", "${env:HOME}", "???", "\x00", "9" * 5_000, "[1, [2, {x: 3}]]", "{x: 1}", "a=b",
    "!!python/object:os.system", "&anchor x", "*alias", "- - -", "\t", "10_000",
]  # fmt: skip


def keys(valid: list[str]) -> st.SearchStrategy[str]:
    """Valid keys, near misses, and garbage names."""
    near = st.sampled_from(valid).map(lambda k: k[:-1] + "z")
    return st.sampled_from(valid) | near | nasty_text | st.sampled_from(["", ".", "a..b", "steps."])


def overrides(valid: list[str]) -> st.SearchStrategy[str]:
    values = st.sampled_from(GARBAGE_VALUES) | nasty_text
    item = st.builds(lambda k, v: f"{k}={v}", keys(valid), values)
    return item | nasty_text


def check_error(err: ConfigError, items: list[str], valid: list[str]) -> None:
    """The error names a key from the overrides (or says what form an override takes)."""
    text = str(err)
    named = [i.partition("=")[0].strip() for i in items]
    assert any(k and (k in text or repr(k)[1:-1] in text) for k in named) or "key=value" in text
    assert "Traceback" not in text and len(text) < 2_000


@fuzz(300)
@given(st.lists(overrides(TRAIN_KEYS), min_size=1, max_size=3))
@example(["trainer.lr=abc"])
@example(["steps=9" + "9" * 5_000])
@example(["rollout.collector.sampling.temperature=-1"])
@example(["env.tasks=3"])  # a dataclass field given a scalar
@example(["trainer.loss.policy_loss=[1]"])
def test_apply_overrides_gives_a_config_or_a_config_error(items: list[str]) -> None:
    for cfg, valid in ((TrainConfig(), TRAIN_KEYS), (EngineConfig(), ENGINE_KEYS)):
        try:
            apply_overrides(cfg, items)
        except ConfigError as err:
            check_error(err, items, valid)


@fuzz(25)
@given(st.lists(overrides(TRAIN_KEYS), min_size=1, max_size=2))
@example(["steps=${oops}"])  # an OmegaConf interpolation
@example(["trainer.lr=???"])  # OmegaConf's missing value
@example(["env=nope"])
@example(["+nokey=1"])
def test_load_config_gives_a_config_or_a_config_error(items: list[str]) -> None:
    try:
        cfg = load_config(items)
    except ConfigError as err:
        check_error(err, items, TRAIN_KEYS)
    else:
        assert isinstance(cfg, TrainConfig)


def test_exponent_floats_are_numbers() -> None:
    """YAML 1.1 reads 1e-5 as text; the override our own errors suggest must still work."""
    assert apply_overrides(TrainConfig(), ["trainer.lr=1e-5"]).trainer.lr == 1e-5
    assert (
        apply_overrides(EngineConfig(), ["gpu_memory_utilization=5e-1"]).gpu_memory_utilization
        == 0.5
    )
    assert apply_overrides(TrainConfig(), ["steps=1e2"]).steps == 100
