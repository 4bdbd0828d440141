"""Which packages vime installs, and from which folders (the rest is in pyproject.toml).

- ``vime/`` installs as ``vime``.
- ``envs/``, the bundled environment suites, installs as ``vime.suites``: ``envs/math``
  becomes ``vime.suites.math``, so entry points read ``"vime.suites.math.env:MathEnv"``.
  Installing vime thus adds no top-level ``envs`` package to site-packages, where it
  would collide with other projects' ``envs``.

pyproject.toml cannot name the packages found under a folder that installs under another
name, so they are listed here. This works for ``pip install -e .`` (setuptools maps
``vime.suites`` to ``envs/`` with an import hook) and for wheels (files are copied under
``vime/suites/``).
"""

from setuptools import find_namespace_packages, find_packages, setup

SUITES = "vime.suites"

setup(
    packages=[
        *find_packages(include=["vime", "vime.*"]),
        SUITES,
        # Namespace discovery: folders without __init__.py (tests, task data) come too.
        *(f"{SUITES}.{name}" for name in find_namespace_packages("envs")),
    ],
    package_dir={SUITES: "envs"},
    # Task files, eval suites (eval/suite.yaml) and each suite's README travel with the code.
    # The bundled chat templates (model.chat_template) and the train config's group
    # options (vime/conf/<group>/<option>.yaml) too.
    package_data={
        # Harbor task folders travel whole (task.toml, Dockerfile, scripts, data).
        SUITES: ["**/*.jsonl", "**/*.md", "**/*.yaml", "harbor/tasks/**/*"],
        "vime.models.templates": ["*.jinja"],
        "vime.conf": ["*/*.yaml"],
    },
)
