"""``ImagePools``: one warm :class:`~vime.sandbox.pool.SandboxPool` per task image, with a
cap on how many images keep one (SWE suites bring an image a task).

Example (the doctests of this module run against the project's dockerd):
    >>> pools = ImagePools(SandboxConfig(), size_per_image=1, warm=0)
    >>> pools.pool("vime/base:any").size
    1
    >>> pools.close()
"""

from __future__ import annotations

import collections
import dataclasses
import threading

from vime.config import require
from vime.errors import SandboxError
from vime.sandbox.docker import DockerSandbox, SandboxConfig
from vime.sandbox.pool import SandboxPool


class ImagePools:
    """One warm :class:`SandboxPool` per image, made on first use (task images differ).

    At most ``max_images`` pools stay warm; past that, the least recently used pool with
    nothing leased is closed. ``warm``: sandboxes each pool starts up front (default:
    all ``size_per_image``; fewer, and a pool grows on demand); ``idle_s``: seconds an
    idle sandbox above ``warm`` is kept (0: for good).

    Example (the base image as the task image):
        >>> from vime.sandbox.images import base_image_tag
        >>> pools = ImagePools(SandboxConfig(), size_per_image=2, warm=0)
        >>> sb = pools.acquire(base_image_tag(), timeout=60)
        >>> sb.image == base_image_tag()
        True
        >>> pools.release(sb); pools.close()
    """

    def __init__(
        self,
        config: SandboxConfig | None = None,
        size_per_image: int = 2,
        max_images: int = 8,
        warm: int | None = None,
        idle_s: float = 0.0,
    ) -> None:
        require(size_per_image >= 1, "pool.size_per_image", f"must be >= 1, got {size_per_image}")
        require(max_images >= 1, "pool.max_images", f"must be >= 1, got {max_images}")
        self.config = config or SandboxConfig()
        self.size_per_image = size_per_image
        self.max_images = max_images
        self.warm = warm
        self.idle_s = idle_s
        self._pools: collections.OrderedDict[str, SandboxPool] = collections.OrderedDict()
        self._lock = threading.Lock()
        self._closed = False

    def pool(self, image: str) -> SandboxPool:
        """The pool of ``image`` (created and started if needed).

        Example (``warm=0``: made, nothing started):
            >>> pools = ImagePools(SandboxConfig(), size_per_image=2, warm=0)
            >>> pools.pool("vime/base:any") is pools.pool("vime/base:any")
            True
            >>> pools.close()
        """
        evicted: list[SandboxPool] = []
        with self._lock:
            if self._closed:
                raise SandboxError("ImagePools: closed")
            pool = self._pools.get(image)
            if pool is None:
                cfg = dataclasses.replace(self.config, image=image)
                pool = self._pools[image] = SandboxPool(
                    cfg, size=self.size_per_image, warm=self.warm, idle_s=self.idle_s
                )
            self._pools.move_to_end(image)
            for name in list(self._pools):
                if len(self._pools) <= self.max_images:
                    break
                if name != image and self._pools[name].in_use == 0:
                    evicted.append(self._pools.pop(name))
        for old in evicted:
            old.close()
        return pool

    def acquire(self, image: str, timeout: float | None = None) -> DockerSandbox:
        """A warm sandbox of ``image`` (the class example acquires one)."""
        return self.pool(image).acquire(timeout)

    def release(self, sb: DockerSandbox, reset: bool = True) -> None:
        """Give ``sb`` back to its image's pool (closed if that pool is gone)."""
        with self._lock:
            pool = self._pools.get(sb.image)
        if pool is None:
            sb.close()
        else:
            pool.release(sb, reset=reset)

    def close(self) -> None:
        """Close every pool. Idempotent."""
        with self._lock:
            self._closed = True
            pools, self._pools = list(self._pools.values()), collections.OrderedDict()
        for pool in pools:
            pool.close()

    def __enter__(self) -> ImagePools:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
