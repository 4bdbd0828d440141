"""Fixtures for the placement tests: two "nodes" (network namespaces joined by veth)."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.placement.multinode import Nodes, can_make_namespaces


@pytest.fixture
def nodes() -> Iterator[Nodes]:
    """Two namespaces made for the test and removed after it, pass or fail; skipped where
    namespaces cannot be made."""
    if not can_make_namespaces():
        pytest.skip("network namespaces need root and iproute2")
    with Nodes() as made:
        yield made
