"""Session fixture ``docker_host`` for the SWE env tests.

tests/conftest.py's fixtures are visible only under tests/; this is the same idempotent
fixture (scripts/dockerd.sh reuses a running daemon).
"""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[3]


@pytest.fixture(scope="session")
def docker_host() -> str:
    """Start the project's dockerd (idempotent) and point DOCKER_HOST at it."""
    out = subprocess.run(
        ["bash", str(ROOT / "scripts" / "dockerd.sh"), "start"],
        check=True,
        capture_output=True,
        text=True,
    )
    host = out.stdout.strip().splitlines()[-1]
    os.environ["DOCKER_HOST"] = host
    return host
