"""Fixtures for the sandbox tests: the real dockerd, the base image, and a leak check.

Every sandbox made here carries the run id :data:`TEST_RUN_ID`; when the session ends,
no container with that label may be left (any leak fails the run).
"""

from __future__ import annotations

import os

import pytest

TEST_RUN_ID = f"pytest-sandbox-{os.getpid()}"


@pytest.fixture(scope="session")
def test_run_id() -> str:
    """The ``vime.run`` label of every container these tests make."""
    return TEST_RUN_ID


@pytest.fixture(scope="session")
def base_image(docker_host: str) -> str:
    """The offline base image's tag (imported from the cached rootfs, or debootstrapped)."""
    from vime.sandbox import build_base_image

    return build_base_image(host=docker_host, log=lambda msg: None)


@pytest.fixture(scope="session")
def sandbox_config(base_image: str):
    """A factory of test configs: safe defaults, small limits, the test run id."""
    from vime.sandbox import SandboxConfig

    def make(**overrides) -> SandboxConfig:
        fields = {"image": base_image, "run_id": TEST_RUN_ID, "timeout": 30.0, **overrides}
        return SandboxConfig(**fields)

    return make


@pytest.fixture(scope="session", autouse=True)
def no_leaked_containers():
    """After the session: no container labelled with this test run may remain."""
    yield
    host = os.environ.get("DOCKER_HOST")
    if not host:  # no docker test ran
        return
    from vime.sandbox.client import docker_client

    try:
        left = docker_client(host).api.containers(
            all=True, filters={"label": ["vime.sandbox=1", f"vime.run={TEST_RUN_ID}"]}
        )
    except Exception:  # no reachable daemon: no docker test made anything
        return
    for info in left:  # clean up anyway, then fail loudly
        docker_client(host).api.remove_container(info["Id"], force=True)
    assert not left, (
        f"{len(left)} labelled sandbox container(s) leaked: {[c['Id'][:12] for c in left]}"
    )


@pytest.fixture(scope="session")
def user_processes():
    """``procs(sb)``: the processes in a sandbox other than the listing shell itself
    (``"PID COMM"`` lines, PID 1 first)."""

    def procs(sb) -> list[str]:
        res = sb.exec("for p in /proc/[0-9]*; do echo ${p#/proc/} $(cat $p/comm); done", timeout=10)
        return [line for line in res.stdout.splitlines() if not line.endswith((" sh", " cat"))]

    return procs
