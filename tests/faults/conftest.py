"""Fixtures shared by the fault tests of several modules."""

from __future__ import annotations

import pytest

from tests.faults._sandbox_episodes import own_dockerd


@pytest.fixture(scope="session")
def second_daemon(docker_host, tmp_path_factory):
    """A second dockerd of the project's own (:func:`own_dockerd`), holding the base
    image; started once for every test that needs it (~20 s), stopped at the end. A test
    that stops it starts it again before it ends."""
    with own_dockerd(docker_host, tmp_path_factory.mktemp("dockerd2")) as daemon:
        yield daemon
