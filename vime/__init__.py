"""vime: RL post-training of LLM agents.

The names users touch most are re-exported here. Importing vime registers the bundled
environment suites with vime and with Gymnasium, by entry-point string: no env code is
imported until an env is made, so ``import vime`` costs about what ``import gymnasium``
does.

Example:
    >>> import gymnasium, vime
    >>> "vime/Math-v0" in gymnasium.registry and "vime/Math-v0" in vime.registry
    True
"""

from __future__ import annotations

# vime.envs registers the bundled suites on import (vime.envs.registration.BUNDLED): without
# it here, gymnasium.make("vime/Math-v0") failed with NamespaceNotFound until the first
# vime.make.
from vime.envs import Env, check_env, make, register, registry

__version__ = "0.1.0"

__all__ = ["Env", "__version__", "check_env", "make", "register", "registry"]
