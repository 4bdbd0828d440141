"""vime/SWE-v0: fix a bug in a small repository inside a Docker sandbox; graded by hidden tests.

See ``envs/swe/README.md``.
"""
