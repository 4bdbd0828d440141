"""rollout.sample_filter and rollout.group_filter (vime.rl.filters): what they leave out of
a step's training, the counts, and the errors at start and at a wrong answer."""

from __future__ import annotations

import pytest

from tests.rl.test_advantages import _cfg, _ep
from vime.errors import ConfigError
from vime.rl.advantages import make_samples, select_groups
from vime.rl.filters import load_filters

FILTERS = '''
def short(episode):
    """Leave out episodes whose reward is exactly 0.5 (stands for any per-sample rule)."""
    return episode.reward != 0.5

def no_group_b(episodes):
    return episodes[0].group_id != "b"

def maybe(episodes):
    return [True]  # not a bool: refused
'''


@pytest.fixture
def filters(tmp_path, monkeypatch):
    (tmp_path / "my_filters.py").write_text(FILTERS)
    monkeypatch.chdir(tmp_path)
    load_filters.cache_clear()
    yield
    load_filters.cache_clear()


def test_samples_and_groups_left_out_and_counted(filters):
    eps = [_ep("a", 1.0), _ep("a", 0.5), _ep("a", 0.0), _ep("b", 1.0), _ep("b", 0.0)]
    cfg = _cfg(sample_filter="my_filters.py:short", group_filter="my_filters.py:no_group_b")
    groups, stats = select_groups(eps, cfg, version=0)
    assert [[e.reward for e in g] for g in groups] == [[1.0, 0.0]]
    assert stats["samples/filtered_out"] == 1 and stats["samples/groups_filtered_out"] == 1
    samples, _ = make_samples(eps, cfg, version=0)  # GRPO over the episodes kept: [1, 0]
    assert [s.reward for s in samples] == [1.0, 0.0]
    assert samples[0].advantage == pytest.approx(-samples[1].advantage)

    plain, stats = select_groups(eps, _cfg(), version=0)
    assert len(plain) == 2 and stats["samples/filtered_out"] == 0


def test_wrong_filters_name_the_key(filters):
    with pytest.raises(ConfigError, match=r"rollout\.group_filter returned list") as err:
        select_groups([_ep("a", 1.0), _ep("a", 0.0)], _cfg(group_filter="my_filters.py:maybe"), 0)
    assert err.value.key == "rollout.group_filter"
    with pytest.raises(ConfigError, match=r"expected sample_filter\(episode\) -> bool"):
        load_filters("my_filters.py:nope", "")
