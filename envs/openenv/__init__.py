"""vime/OpenEnv-v0: an OpenEnv environment server played through OpenEnv's own client
(needs the optional extra: ``pip install 'vime[openenv]'``). See ``envs/openenv/README.md``.
"""
