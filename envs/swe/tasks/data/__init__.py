"""The bundled SWE task suite: one module per task, written by hand for vime.

Each module defines plain constants (no imports needed):

- ``ID``: the task id (unique, kebab-case);
- ``STATEMENT``: the issue text the agent sees;
- ``FILES``: the repository snapshot, ``{relative path: content}``;
- ``HIDDEN_TESTS``: test files added only inside the grading container;
- ``FAIL_TO_PASS`` / ``PASS_TO_PASS``: unittest ids (``tests.test_x.Class.test_y``);
- ``SOLUTION``: the reference fix as ``(path, old, new)`` string replacements.

The ``repos`` package holds tasks that share a repository (several issues in one small
package with its own test suite, unittest or pytest); its ``TASKS`` list is loaded after
the one-task modules. Each of those tasks names its ``split``: ``"train"`` or ``"eval"``
(held back: training never draws it). Modules are loaded by
:func:`vime.suites.swe.tasks.load_bundled`.
"""
