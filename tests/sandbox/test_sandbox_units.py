"""Pure-Python parts of the sandbox: config validation, stream demux, output cap, mirror lookup."""

from __future__ import annotations

import struct

import pytest

from vime.config import apply_overrides
from vime.errors import ConfigError
from vime.sandbox import BaseImageRecipe, ExecResult, Sandbox, SandboxConfig, base_image_tag
from vime.sandbox.config import parse_size
from vime.sandbox.docker import DockerSandbox
from vime.sandbox.stream import Capped as _Capped
from vime.sandbox.stream import Demux as _Demux


def _frame(kind: int, data: bytes) -> bytes:
    return bytes([kind, 0, 0, 0]) + struct.pack(">I", len(data)) + data


def test_config_defaults_are_safe_and_errors_name_the_field():
    cfg = SandboxConfig()
    assert (cfg.network, cfg.user, cfg.read_only, cfg.pids_limit) == (False, "1000:1000", True, 256)
    assert cfg.memory_bytes == 512 * 1024**2 and cfg.file_limit_bytes == 256 * 1024**2
    for bad, key in [
        ({"memory": "lots"}, "sandbox.memory"),
        ({"user": "root"}, "sandbox.user"),
        ({"pids_limit": 3}, "sandbox.pids_limit"),
        ({"workspace": "/"}, "sandbox.workspace"),
        ({"docker_hosts": ["myhost:2375"]}, "sandbox.docker_hosts"),
        ({"pool_max": 0}, "sandbox.pool_max"),
        ({"pool_warm": 5, "pool_max": 4}, "sandbox.pool_warm"),
        ({"per_host_limit": -1}, "sandbox.per_host_limit"),
    ]:
        with pytest.raises(ConfigError) as info:
            SandboxConfig(**bad)
        assert info.value.key == key and key in str(info.value)
    assert apply_overrides(cfg, ["memory=1g", "cpus=2"]).memory_bytes == 1024**3
    assert apply_overrides(cfg, ["pool=false"]).pool is False
    assert parse_size("65536") == 65536 and parse_size("2k") == 2048


def test_demux_handles_frames_split_anywhere():
    out, err = _Capped(None), _Capped(None)
    stream = _frame(1, b"hello ") + _frame(2, b"oops") + _frame(1, b"world") + _frame(1, b"")
    demux = _Demux(out, err)
    for i in range(len(stream)):  # one byte at a time: every split point
        demux.feed(stream[i : i + 1])
    assert out.bytes() == b"hello world" and err.bytes() == b"oops" and demux.buf == b""


def test_capped_keeps_prefix_and_marks_drop():
    cap = _Capped(10)
    cap.add(b"0123456")
    cap.add(b"789abc")
    cap.add(b"def")
    assert cap.bytes() == b"0123456789" and cap.dropped == 6
    assert cap.text().startswith("0123456789\n[vime: 6 bytes of output dropped]")
    bad_utf8 = _Capped(100)
    bad_utf8.add(b"ok \xff\xfe")
    assert bad_utf8.text() == "ok \ufffd\ufffd"


def test_protocol_and_result_helpers():
    assert issubclass(DockerSandbox, Sandbox)  # structural: DockerSandbox has every method
    res = ExecResult(0, "a", "b", False, 0.1)
    assert res.ok and res.output == "a\nb"
    assert not ExecResult(137, "", "", True, 1.0).ok


def test_base_image_tag_is_a_content_hash_of_the_recipe():
    assert base_image_tag() == base_image_tag(
        BaseImageRecipe(include=("git", "python3-pytest", "python3"))
    )
    assert base_image_tag() != base_image_tag(BaseImageRecipe(include=("python3",)))
    with pytest.raises(ConfigError, match=r"recipe\.include"):
        BaseImageRecipe(include=("bad name",))
