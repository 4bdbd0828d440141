"""How vime patches vLLM's classes inside vLLM's own processes, one patch at a time.

Each patch (:mod:`vime.engine.cpu_seed_rewind`, :mod:`vime.engine.cpu_eager_ranks`,
:mod:`vime.engine.cpu_moe_reload`, :mod:`vime.engine.routed_experts`,
:mod:`vime.engine.vllm_plugin`) replaces a few vLLM methods (or module functions), and
only where vime's launcher asked for it through an environment variable
(:func:`vime.engine.launch.environment`). :func:`replace_methods` is their common part:
it applies nothing unless asked, warns and leaves vLLM alone where vLLM's classes have
changed shape, applies a patch once however often it is called, and says in the server
log what it changed.

Example (a class standing in for vLLM's):
    >>> import os
    >>> class Runner:
    ...     def step(self):
    ...         return 1
    >>> def wrap(step):
    ...     return [lambda self: step(self) + 1]
    >>> os.environ["VIME_EXAMPLE_PATCH"] = "1"
    >>> replace_methods("VIME_EXAMPLE_PATCH", lambda: [(Runner, "step")], wrap,
    ...                 missing="a runner", moved="Runner.step moved", done="steps add one")
    True
    >>> Runner().step()
    2
    >>> replace_methods("VIME_EXAMPLE_PATCH", lambda: [(Runner, "step")], wrap,
    ...                 missing="a runner", moved="Runner.step moved", done="steps add one")
    True
    >>> Runner().step()  # applied once
    2
    >>> del os.environ["VIME_EXAMPLE_PATCH"]
"""

from __future__ import annotations

import logging
import os
from collections.abc import Callable, Sequence
from typing import Any

# A child of vLLM's logger: vLLM's processes print it, with their pid, in the server log.
log = logging.getLogger("vllm.vime_plugin")

# Set on each replacement to the variable that asked for it: a second call finds it.
MARK = "_vime_patch"


def replace_methods(
    env: str,
    targets: Callable[[], Sequence[tuple[Any, str]]],
    wrap: Callable[..., Sequence[Callable[..., Any]]],
    *,
    missing: str,
    moved: str,
    done: str,
    asked: bool | None = None,
) -> bool:
    """Replace vLLM's methods where ``env`` asks for it; True if they are replaced.

    ``targets()`` imports vLLM and names the methods as ``(class, name)`` pairs;
    ``wrap(*originals)`` returns their replacements in the same order, and a method it
    returns unchanged is only required to exist. ``asked`` overrides the test of ``env``
    (``"1"``) for a variable that carries a value. The warnings name ``missing`` (the vLLM
    parts an ImportError means are gone) and say ``moved`` (where a method is absent);
    ``done`` is logged once applied. See the module example.
    """
    if not (os.environ.get(env, "") == "1" if asked is None else asked):
        return False
    try:
        pairs = targets()
    except ImportError as err:
        log.warning("vime: %s is set but this vLLM lacks %s (%s)", env, missing, err)
        return False
    originals = [getattr(owner, name, None) for owner, name in pairs]
    if any(original is None for original in originals):
        log.warning("vime: %s", moved)
        return False
    if any(getattr(original, MARK, None) == env for original in originals):
        return True  # applied already (vLLM imports its plugins more than once)
    for (owner, name), original, new in zip(pairs, originals, wrap(*originals), strict=True):
        if new is not original:
            setattr(new, MARK, env)
            setattr(owner, name, new)
    log.info("vime: %s", done)
    return True
