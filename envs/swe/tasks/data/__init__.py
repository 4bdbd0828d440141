"""The bundled SWE task suite: one module per task, written by hand for vime.

Each module defines plain constants (no imports needed):

- ``ID``: the task id (unique, kebab-case);
- ``STATEMENT``: the issue text the agent sees;
- ``FILES``: the repository snapshot, ``{relative path: content}``;
- ``HIDDEN_TESTS``: test files added only inside the grading container;
- ``FAIL_TO_PASS`` / ``PASS_TO_PASS``: unittest ids (``tests.test_x.Class.test_y``);
- ``SOLUTION``: the reference fix as ``(path, old, new)`` string replacements.

Modules are loaded by :func:`vime.suites.swe.tasks.load_bundled`.
"""
