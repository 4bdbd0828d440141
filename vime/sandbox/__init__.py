"""Sandboxes for agent code: the :class:`Sandbox` protocol, Docker sandboxes, warm pools,
and images built without a registry.

- :class:`DockerSandbox` (one locked-down container) and its :class:`SandboxConfig`
  (every limit, with what relaxing it risks).
- :class:`SandboxPool` (warm, bounded, reset between episodes, spread over several
  DOCKER_HOSTs) and :class:`ImagePools` (one pool per task image).
- :func:`build_base_image` (debootstrap → ``docker import``, offline, cached by content),
  :func:`build_layered_image` (task files on top), :func:`build_image_from_dockerfile`,
  :func:`distribute_image` (copy an image to the other hosts).
- ``vime-agent sandbox build-base | gc [--all | --run ID]``.

Example (the pool part runs against the project's dockerd):
    >>> from vime.sandbox import SandboxConfig, SandboxPool
    >>> SandboxConfig().network
    False
    >>> with SandboxPool(SandboxConfig(), size=1) as pool:
    ...     with pool.session(timeout=60) as sb:
    ...         sb.write_file("/workspace/t.py", "print(6 * 7)")
    ...         sb.exec("python3 t.py", timeout=10).stdout
    '42\\n'
"""

from __future__ import annotations

from vime.sandbox.base import ExecResult, Sandbox
from vime.sandbox.config import SandboxConfig
from vime.sandbox.docker import DockerSandbox
from vime.sandbox.image_pools import ImagePools
from vime.sandbox.images import (
    BaseImageRecipe,
    base_image_tag,
    build_base_image,
    build_image_from_dockerfile,
    build_layered_image,
    distribute_image,
)
from vime.sandbox.pool import SandboxPool

__all__ = [
    "BaseImageRecipe",
    "DockerSandbox",
    "ExecResult",
    "ImagePools",
    "Sandbox",
    "SandboxConfig",
    "SandboxPool",
    "base_image_tag",
    "build_base_image",
    "build_image_from_dockerfile",
    "build_layered_image",
    "distribute_image",
]
