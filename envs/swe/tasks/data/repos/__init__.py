"""Bundled SWE tasks that share a repository: one module per repository, many issues each.

Each module defines a :class:`~._kit.Repo` (the package in its correct state, with its
own test suite) and ``TASKS``: one task per :class:`~._kit.Issue` (a bug put back into the
repository, a hidden test module and the split it belongs to). The reference fix of an
issue is its bug reversed, so a repository is written once, not once per task.
"""

from . import datekit, inikit, money, pqueue, router, textfmt, tmpl, units

TASKS = [
    *datekit.TASKS,
    *inikit.TASKS,
    *textfmt.TASKS,
    *router.TASKS,
    *money.TASKS,
    *pqueue.TASKS,
    *tmpl.TASKS,
    *units.TASKS,
]
