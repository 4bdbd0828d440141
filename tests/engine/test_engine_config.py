"""EngineConfig, the server command line, and the checks made before launching (no server)."""

from __future__ import annotations

import socket

import pytest

from vime.config import apply_overrides
from vime.engine import (
    EngineConfig,
    EngineStartupError,
    VLLMServer,
    check_model_path,
    default_served_model_name,
    port_in_use,
)
from vime.errors import ConfigError


def test_defaults_are_right_for_cpu():
    cfg = EngineConfig(model="/m")
    assert (cfg.dtype, cfg.logprobs_mode, cfg.dev_mode, cfg.port) == (
        "float32",
        "processed_logprobs",
        True,
        0,
    )


@pytest.mark.parametrize(
    ("override", "key"),
    [
        ("dtype=fp8", "engine.dtype"),
        ("logprobs_mode=raw", "engine.logprobs_mode"),
        ("port=70000", "engine.port"),
        ("kv_cache_gib=0", "engine.kv_cache_gib"),
        ("url=localhost:8000", "engine.url"),
    ],
)
def test_invalid_values_name_the_field(override, key):
    with pytest.raises(ConfigError) as err:
        apply_overrides(EngineConfig(), [override])
    assert key in str(err.value)


def test_overrides_and_command_line(tiny_model_dir):
    cfg = apply_overrides(
        EngineConfig(),
        [
            f"model={tiny_model_dir}",
            "port=8123",
            "dtype=bfloat16",
            "extra_args=[--max-num-seqs, '8']",
        ],
    )
    server = VLLMServer(cfg)
    cmd = server.command()
    assert cmd[1:3] == ["-m", cmd[2]] and cmd[2].startswith("vllm.entrypoints.")
    joined = " ".join(cmd)
    for flag in (
        "--dtype bfloat16",
        "--port 8123",
        "--logprobs-mode processed_logprobs",
        f"--served-model-name {tiny_model_dir.name}",
        "--max-num-seqs 8",
        "--worker-extension-cls vime.engine.delta_worker.DeltaWorker",  # sync.delta's loads
    ):
        assert flag in joined
    env = server.environment()
    assert env["VLLM_SERVER_DEV_MODE"] == "1" and env["HF_HUB_OFFLINE"] == "1"
    assert server.model_name == tiny_model_dir.name
    assert server.url == "http://127.0.0.1:8123"
    assert server.openai_base_url == "http://127.0.0.1:8123/v1"


def test_served_model_name():
    assert default_served_model_name("/a/b/tiny-123/") == "tiny-123"
    assert default_served_model_name("Qwen/Qwen2.5-0.5B") == "Qwen/Qwen2.5-0.5B"
    assert VLLMServer(EngineConfig(model="/a/m", served_model_name="policy")).model_name == "policy"


def test_bad_model_path_fails_before_launching(tmp_path):
    with pytest.raises(EngineStartupError, match=r"^model folder .*/missing does not exist$"):
        VLLMServer(EngineConfig(model=str(tmp_path / "missing"))).start()
    (tmp_path / "empty").mkdir()
    with pytest.raises(EngineStartupError, match=r"has no config\.json"):
        check_model_path(str(tmp_path / "empty"))
    with pytest.raises(
        EngineStartupError, match="neither a folder nor in the local Hugging Face cache"
    ):
        check_model_path("no-such-org/no-such-model")


def test_port_in_use_fails_before_launching(tiny_model_dir):
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        port = s.getsockname()[1]
        assert port_in_use("127.0.0.1", port)
        server = VLLMServer(EngineConfig(model=str(tiny_model_dir), port=port))
        with pytest.raises(EngineStartupError) as err:
            server.start()
        assert str(err.value) == (
            f"port {port} on 127.0.0.1 is already in use (set engine.port=0 to pick a free one)"
        )
        assert server.pid is None


def test_stop_is_idempotent_without_start():
    server = VLLMServer(EngineConfig(model="/m"))
    server.stop()
    server.stop()
    assert not server.running


def test_serve_cli_reports_a_bad_model_in_one_line(tmp_path, capsys):
    from vime.cli import main

    assert main(["serve", f"model={tmp_path / 'nope'}"]) == 2
    err = capsys.readouterr().err.strip()
    assert err == f"vime-agent serve: error: model folder {tmp_path / 'nope'} does not exist"
