"""vime/Tools-v0: multi-turn tool use (calculator, Python and files in a sandbox, submit).

Add a tool with one decorated function, see :func:`vime.envs.toolkit.tool` and
``envs/tools/README.md``.
"""
