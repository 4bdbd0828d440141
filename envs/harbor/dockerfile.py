"""A Harbor task's ``environment/Dockerfile`` replayed offline on vime's base image.

Nothing is pulled: ``FROM`` is replaced by the base image (:func:`vime.sandbox.build_base_image`),
and the instructions become layers of :func:`vime.sandbox.build_layered_image` (each
cached by content, so an unchanged task builds once): ``COPY``/``ADD`` files from the
build context (``environment/``), ``RUN`` commands (as root, no network, after
``WORKDIR``'s ``cd`` and the ``ENV``/``ARG`` values so far). ``WORKDIR`` and ``ENV`` also
set the agent's working folder and environment. A ``RUN`` that needs the network (``apt-get
install``, ``pip install``) fails the build with its output.

Example:
    >>> plan = plan_dockerfile("FROM python:3.11\\nWORKDIR /app\\nENV A=1\\nRUN echo $A > a.txt\\n")
    >>> plan.workdir, plan.env, plan.layers[0].commands
    ('/app', {'A': '1'}, ['mkdir -p /app && cd /app && export A=1 && echo $A > a.txt'])
"""

from __future__ import annotations

import json
import posixpath
import shlex
import threading
from dataclasses import dataclass, field
from pathlib import Path

from vime.errors import DataError

# Instructions that change nothing the sandbox uses (it runs vime's own PID 1, no ports).
IGNORED = {"LABEL", "EXPOSE", "CMD", "ENTRYPOINT", "HEALTHCHECK", "STOPSIGNAL", "VOLUME", "SHELL"}


@dataclass
class Layer:
    """Files (path in the image -> local file or folder), then commands, of one build step."""

    files: dict[str, Path] = field(default_factory=dict)
    commands: list[str] = field(default_factory=list)


@dataclass
class DockerfilePlan:
    """What replaying a Dockerfile does: its layers, and the agent's workdir and env.

    Example:
        >>> DockerfilePlan().workdir
        '/'
    """

    layers: list[Layer] = field(default_factory=list)
    workdir: str = "/"
    env: dict[str, str] = field(default_factory=dict)
    base: str = ""  # the FROM it replaced (shown in errors)


def _logical_lines(text: str) -> list[str]:
    """Instruction lines: comments dropped, backslash continuations joined."""
    out: list[str] = []
    pending = ""
    for raw in text.splitlines():
        line = raw.strip()
        if not pending and (not line or line.startswith("#")):
            continue
        if line.startswith("#"):  # a comment inside a continued instruction
            continue
        if line.endswith("\\"):
            pending += line[:-1] + " "
            continue
        out.append(pending + line)
        pending = ""
    if pending.strip():
        out.append(pending)
    return out


def _pairs(args: str) -> dict[str, str]:
    """``ENV``/``ARG`` arguments: ``K=V K2="v 2"`` or the old ``K value with spaces``."""
    words = shlex.split(args)
    if words and "=" not in words[0]:
        return {words[0]: " ".join(words[1:])}
    return {w.partition("=")[0]: w.partition("=")[2] for w in words}


def plan_dockerfile(text: str, context: Path | None = None) -> DockerfilePlan:
    """Turn a Dockerfile's text into :class:`DockerfilePlan` (``context``: where COPY reads).

    Example:
        >>> context = Path(__file__).parent / "tasks" / "count-words" / "environment"
        >>> files = plan_dockerfile("FROM x\\nCOPY words.txt /app/\\n", context).layers[0].files
        >>> {dest: src.name for dest, src in files.items()}
        {'/app/words.txt': 'words.txt'}
    """
    plan = DockerfilePlan()
    values: dict[str, str] = {}  # ENV and ARG values, as RUN sees them
    layer = Layer()
    made = False  # whether a RUN after the last WORKDIR made it
    for line in _logical_lines(text):
        op, _, args = line.partition(" ")
        op, args = op.upper(), args.strip()
        if op == "FROM":
            if plan.base:
                raise DataError("multi-stage Dockerfiles (a second FROM) are not supported")
            plan.base = args
        elif op in ("ENV", "ARG"):
            pairs = _pairs(args)
            values.update({k: v for k, v in pairs.items() if not (op == "ARG" and k in values)})
            if op == "ENV":
                plan.env.update(pairs)
        elif op == "WORKDIR":
            plan.workdir = posixpath.normpath(posixpath.join(plan.workdir, args))
            made = False
        elif op == "RUN":
            if args.startswith("["):
                args = shlex.join(json.loads(args))
            exports = "".join(f"export {k}={shlex.quote(v)} && " for k, v in values.items())
            where = shlex.quote(plan.workdir)
            layer.commands.append(f"mkdir -p {where} && cd {where} && {exports}{args}")
            made = True
        elif op in ("COPY", "ADD"):
            if layer.commands:  # files after commands: a new layer keeps the order
                plan.layers.append(layer)
                layer = Layer()
            layer.files.update(_copies(op, args, plan.workdir, context))
        elif op == "USER":
            if args.split(":")[0] not in ("root", "0"):
                raise DataError(f"USER {args}: vime runs Harbor tasks as root, as Harbor does")
        elif op not in IGNORED:
            raise DataError(f"Dockerfile instruction {op} is not supported by the offline replay")
    if not plan.base:
        raise DataError("the Dockerfile has no FROM")
    if plan.workdir != "/" and not made:  # docker makes the last WORKDIR even without a RUN
        layer.commands.append(f"mkdir -p {shlex.quote(plan.workdir)}")
    if layer.files or layer.commands:
        plan.layers.append(layer)
    return plan


def _copies(op: str, args: str, workdir: str, context: Path | None) -> dict[str, Path]:
    words = [w for w in shlex.split(args) if not w.startswith("--")]  # --chown: all is root's
    if args.lstrip().startswith("["):
        words = json.loads(args)
    if len(words) < 2:
        raise DataError(f"{op} {args}: needs a source and a destination")
    *sources, dest = words
    if context is None:
        context = Path(".")
    dest = posixpath.normpath(posixpath.join(workdir, dest)) + ("/" if dest.endswith("/") else "")
    files: dict[str, Path] = {}
    for src in sources:
        if "://" in src:
            raise DataError(f"{op} {src}: a URL needs the network; put the file in environment/")
        matches = sorted(context.glob(src)) if any(c in src for c in "*?[") else [context / src]
        for local in matches:
            if not local.resolve().is_relative_to(context.resolve()):
                raise DataError(f"{op} {src}: outside the build context")
            if not local.exists():
                raise DataError(f"{op} {src}: {local} is not in the build context")
            into_dir = dest.endswith("/") or len(sources) > 1 or len(matches) > 1
            target = posixpath.join(dest, local.name) if into_dir and local.is_file() else dest
            files[target.rstrip("/") or "/"] = local
    return files


_BUILT: dict[tuple[str, str, int], tuple[str, DockerfilePlan]] = {}
# Episodes run in threads: the first builds, the others wait for its tag.
_BUILD_LOCK = threading.Lock()


def build_task_image(dockerfile: Path, *, host: str | None = None) -> tuple[str, DockerfilePlan]:
    """Replay ``dockerfile`` on the base image of ``host``; the image tag and the plan.

    Built once per process and Dockerfile (and once per content on the host: layers are
    cached by :func:`vime.sandbox.build_layered_image`).

    Example (on the doctests' ``DOCKER_HOST``, the project's dockerd):
        >>> build_task_image(Path("envs/harbor/tasks/count-words/environment/Dockerfile"))
        ('vime/layer:...', DockerfilePlan(...))
    """
    key = (str(dockerfile.resolve()), host or "", dockerfile.stat().st_mtime_ns)
    with _BUILD_LOCK:
        if key not in _BUILT:
            _BUILT[key] = _build(dockerfile, host)
    return _BUILT[key]


def _build(dockerfile: Path, host: str | None) -> tuple[str, DockerfilePlan]:
    from vime.sandbox import build_base_image, build_layered_image

    plan = plan_dockerfile(dockerfile.read_text(), dockerfile.parent)
    tag = build_base_image(host=host, log=lambda msg: None)
    for layer in plan.layers:
        files: dict[str, bytes | str | Path] = dict(layer.files)
        tag = build_layered_image(tag, files, commands=layer.commands, host=host)
    return tag, plan
