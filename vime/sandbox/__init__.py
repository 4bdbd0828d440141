"""Sandboxes for agent code: the :class:`Sandbox` protocol, Docker sandboxes, a warm pool,
and offline images.

Example:
    >>> from vime.sandbox import SandboxConfig, SandboxPool
    >>> SandboxConfig().network
    False
"""

from __future__ import annotations

from vime.sandbox.base import ExecResult, Sandbox
from vime.sandbox.config import SandboxConfig
from vime.sandbox.docker import DockerSandbox
from vime.sandbox.images import (
    BaseImageRecipe,
    base_image_tag,
    build_base_image,
    build_image_from_dockerfile,
    build_layered_image,
    distribute_image,
)
from vime.sandbox.pool import ImagePools, SandboxPool

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
