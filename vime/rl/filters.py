"""Filters of samples and groups as extension points (``rollout.sample_filter``,
``rollout.group_filter``), beyond ``rollout.filter_groups``.

- ``sample_filter(episode) -> bool``: False leaves a finished episode out of training
  (before its group is formed, so a group's advantages use the episodes kept);
- ``group_filter(episodes) -> bool``: False leaves a whole GRPO group out, after
  ``filter_groups`` (which drops groups whose rewards are all equal).

Both are plain functions, called in the loop for every step's episodes (also when the
async stream decides whether a group carries signal, and when a sync step decides to
refill); what is left out is still buffered (the step's record), and counted in
``samples/filtered_out`` and ``samples/groups_filtered_out``. They are loaded and
checked when the run starts (:func:`load_filters`).

Example:
    >>> sample_keep, group_keep = load_filters("", "json:loads")
    >>> sample_keep is None, group_keep.__name__
    (True, 'loads')
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

from vime.extensions import load_function

SAMPLE_SIGNATURE = "sample_filter(episode) -> bool (False: not trained on)"
GROUP_SIGNATURE = "group_filter(episodes) -> bool (False: the group is not trained on)"
Keep = Callable[..., Any]


@functools.lru_cache(maxsize=8)
def load_filters(sample: str, group: str) -> tuple[Keep | None, Keep | None]:
    """The functions ``rollout.sample_filter`` and ``rollout.group_filter`` name (None for
    ""), checked; loaded once per process (every step calls this).

    Example:
        >>> load_filters("", "")
        (None, None)
    """
    sample_keep = group_keep = None
    if sample:
        sample_keep = load_function(
            sample, "rollout.sample_filter", signature=SAMPLE_SIGNATURE, positional=1
        )
    if group:
        group_keep = load_function(
            group, "rollout.group_filter", signature=GROUP_SIGNATURE, positional=1
        )
    return sample_keep, group_keep
