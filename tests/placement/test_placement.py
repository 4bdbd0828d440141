"""Placement checks: a layout that cannot work fails at start, naming its keys."""

from __future__ import annotations

import pytest

from vime.conf.compose import load_config
from vime.errors import ConfigError
from vime.placement.config import Cluster, PlacementConfig, check_placement

CPU = Cluster(world_size=1, local_world_size=1, cuda_devices=0)


def test_the_default_is_one_rank_and_one_engine():
    layout = check_placement(PlacementConfig(), CPU)
    assert (layout.tp, layout.pp, layout.dp, layout.engines_per_node) == (1, 1, 1, 1)
    assert check_placement(PlacementConfig(), CPU, external=2).engines_per_node == 0


def test_tp_pp_must_divide_the_world():
    layout = check_placement(PlacementConfig(tp=2), Cluster(world_size=4, local_world_size=2))
    assert layout.dp == 2
    with pytest.raises(ConfigError, match=r"placement\.tp.*--nproc-per-node"):
        check_placement(PlacementConfig(tp=2, pp=2), Cluster(world_size=6, local_world_size=6))


def test_ep_must_divide_the_world_and_the_experts():
    assert check_placement(PlacementConfig(ep=2), Cluster(world_size=4)).ep == 2
    with pytest.raises(ConfigError, match=r"pp × ep = 2 × 2 must divide the 2") as err:
        check_placement(PlacementConfig(pp=2, ep=2), Cluster(world_size=2))
    assert err.value.key == "placement.ep"
    with pytest.raises(ConfigError, match=r"placement\.ep: must be >= 1"):
        PlacementConfig(ep=0)


def test_gpu_layouts():
    node = Cluster(world_size=4, local_world_size=4, cuda_devices=8)
    split = check_placement(PlacementConfig(engines_per_node=2, engine_tp=2), node)
    assert split.engine_devices == ((4, 5), (6, 7))  # after the trainer's GPUs 0-3
    colocated = check_placement(PlacementConfig(mode="colocated", engines_per_node=4), node)
    assert colocated.engine_devices == ((0,), (1,), (2,), (3,)) and colocated.colocated
    with pytest.raises(ConfigError, match=r"placement\.engines_per_node.*need 6 devices"):
        check_placement(PlacementConfig(engines_per_node=3, engine_tp=2), node)
    with pytest.raises(ConfigError, match=r"placement\.mode=split.*\[2, 3\]"):
        check_placement(PlacementConfig(engine_devices=[2, 3, 4]), node)
    with pytest.raises(ConfigError, match=r"placement\.engine_devices.*\[9\]"):
        check_placement(PlacementConfig(engine_devices=[9]), node)


def test_gpu_keys_on_a_cpu_machine_and_an_empty_fleet_fail():
    with pytest.raises(ConfigError, match=r"placement\.engine_devices"):
        check_placement(PlacementConfig(mode="colocated"), CPU)
    with pytest.raises(ConfigError, match=r"placement\.engines_per_node"):
        check_placement(PlacementConfig(engines_per_node=0), CPU)


def test_config_keys_and_their_errors():
    cfg = load_config(["placement.tp=2", "placement.engine_urls=[http://a:1]"])
    assert cfg.placement.tp == 2 and cfg.placement.engine_urls == ["http://a:1"]
    with pytest.raises(ConfigError, match=r"placement\.cp"):
        load_config(["placement.cp=2"])
    with pytest.raises(ConfigError, match=r"engine\.url"):
        load_config(["engine.url=http://a:1", "placement.engine_urls=[http://b:1]"])
    assert load_config(["engine=gpu"]).placement.mode == "colocated"
