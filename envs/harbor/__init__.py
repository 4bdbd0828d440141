"""vime/Harbor-v0: Harbor task folders (Terminal-Bench's format), built offline and graded
by their own tests. See ``envs/harbor/README.md``.
"""
