"""Sandbox images without a registry: an offline base image, task layers on top, Dockerfiles.

- :func:`build_base_image`: ``debootstrap --variant=minbase`` a Debian rootfs from the
  machine's own apt mirror, tar it (cached under ``<project>/.cache/sandbox/``), and
  ``docker import`` it as ``vime/base:<recipe hash>``. Nothing happens if the tag exists.
- :func:`build_layered_image`: files (and optional build commands) on top of an image,
  committed as ``vime/layer:<content hash>``; a second call with the same content is free.
- :func:`build_image_from_dockerfile`: for users whose Dockerfile can pull its ``FROM``.

Example:
    >>> recipe = BaseImageRecipe()
    >>> base_image_tag(recipe).startswith("vime/base:")
    True
"""

from __future__ import annotations

import dataclasses
import hashlib
import io
import os
import re
import shutil
import subprocess
import tarfile
import tempfile
from collections.abc import Mapping, Sequence
from pathlib import Path

from vime.config import require
from vime.errors import SandboxError
from vime.paths import cache_dir
from vime.sandbox.client import docker_client, docker_errors
from vime.sandbox.config import LABEL_PID, LABEL_ROLE, LABEL_SANDBOX

# Bump when the build steps below change what lands in the image for the same recipe.
BUILDER_VERSION = 1

_DEFAULT_MIRROR = "http://deb.debian.org/debian"


@dataclasses.dataclass(frozen=True)
class BaseImageRecipe:
    """What goes into the base image. Every field except ``mirror`` is in the tag's hash.

    Example:
        >>> BaseImageRecipe(include=("python3", "git", "make")).suite
        'bookworm'
    """

    suite: str = "bookworm"
    variant: str = "minbase"
    # python3 runs agents' code and tests; git lets SWE tasks diff and reset a repo;
    # python3-pytest runs the bundled SWE repositories whose suites are pytest suites.
    include: tuple[str, ...] = ("python3", "git", "python3-pytest")
    # None: the first Debian mirror configured for apt on this machine (it is reachable
    # where apt works), else deb.debian.org.
    mirror: str | None = None

    def __post_init__(self) -> None:
        require(
            bool(re.fullmatch(r"[a-z]+", self.suite)),
            "recipe.suite",
            "must be a Debian suite name like 'bookworm'",
        )
        require(
            self.variant in ("minbase", "buildd"), "recipe.variant", "must be 'minbase' or 'buildd'"
        )
        for pkg in self.include:
            require(
                bool(re.fullmatch(r"[a-z0-9][a-z0-9+.-]*", pkg)),
                "recipe.include",
                f"{pkg!r} is not a Debian package name",
            )

    def key(self) -> str:
        """A short content hash of the recipe (the image tag and the tarball name)."""
        text = f"{BUILDER_VERSION}|{self.suite}|{self.variant}|{','.join(sorted(self.include))}"
        return hashlib.sha256(text.encode()).hexdigest()[:12]


def base_image_tag(recipe: BaseImageRecipe | None = None) -> str:
    """The tag the base image of ``recipe`` gets: ``vime/base:<hash>``.

    Example:
        >>> base_image_tag() == base_image_tag(BaseImageRecipe())
        True
    """
    return f"vime/base:{(recipe or BaseImageRecipe()).key()}"


def rootfs_cache() -> Path:
    """Where rootfs tarballs are cached: ``sandbox/`` in vime's cache (:mod:`vime.paths`).

    Example:
        >>> rootfs_cache().name
        'sandbox'
    """
    return cache_dir() / "sandbox"


def apt_mirror() -> str:
    """The first Debian mirror apt is configured with here (deb822 or one-line format).

    Example:
        >>> apt_mirror().startswith("http")
        True
    """
    files = [Path("/etc/apt/sources.list"), *sorted(Path("/etc/apt/sources.list.d").glob("*"))]
    for path in files:
        if not path.is_file() or path.suffix not in ("", ".list", ".sources"):
            continue
        try:
            text = path.read_text()
        except OSError:
            continue
        for line in text.splitlines():
            line = line.strip()
            found = re.match(r"^URIs:\s*(\S+)", line) or re.match(
                r"^deb\s+(?:\[[^]]*\]\s+)?(\S+)", line
            )
            if found and found.group(1).rstrip("/").endswith("/debian"):
                return found.group(1).rstrip("/")
    return _DEFAULT_MIRROR


def image_exists(tag: str, *, host: str | None = None) -> bool:
    """Whether ``tag`` is present on the docker host.

    Example (the doctests of this module run against the project's dockerd):
        >>> image_exists("vime/base:nonexistent")
        False
    """
    import docker.errors

    client = docker_client(host)
    with docker_errors(f"looking up image {tag}", host=host):
        try:
            client.images.get(tag)
            return True
        except docker.errors.ImageNotFound:
            return False


def build_rootfs_tarball(recipe: BaseImageRecipe | None = None, *, log=print) -> Path:
    """Debootstrap the recipe's rootfs and tar it, or return the cached tarball.

    Needs root, ``debootstrap`` and the Debian mirror (about 35-60 s the first time).
    The tarball is written atomically, so an interrupted build leaves no broken cache.
    Usage: ``build_rootfs_tarball()`` returns the tarball's path (no doctest: a machine
    without the cached tarball would debootstrap for ~35 s).
    """
    recipe = recipe or BaseImageRecipe()
    out = rootfs_cache() / f"rootfs-{recipe.suite}-{recipe.key()}.tar"
    if out.exists():
        return out
    if shutil.which("debootstrap") is None:
        raise SandboxError(
            "debootstrap is not installed; run `apt-get install -y debootstrap` "
            "(scripts/setup.sh does this)"
        )
    if os.geteuid() != 0:
        raise SandboxError(
            "building the base image runs debootstrap, which needs root; run it as root"
        )
    out.parent.mkdir(parents=True, exist_ok=True)
    work = Path(tempfile.mkdtemp(prefix="rootfs-", dir=out.parent))
    rootfs = work / "rootfs"
    mirror = recipe.mirror or apt_mirror()
    cmd = [
        "debootstrap",
        f"--variant={recipe.variant}",
        f"--include={','.join(recipe.include)}",
        recipe.suite,
        str(rootfs),
        mirror,
    ]
    log(f"[vime sandbox] {' '.join(cmd)}")
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True)
        if proc.returncode != 0:
            tail = "\n".join((proc.stdout + proc.stderr).splitlines()[-15:])
            raise SandboxError(
                f"debootstrap failed (exit {proc.returncode}) with mirror {mirror}; "
                f"check that apt works here (`apt-get update`). Last lines:\n{tail}"
            )
        # Downloaded .debs and apt lists are dead weight in every container.
        for sub in ("var/cache/apt/archives", "var/lib/apt/lists"):
            for p in (rootfs / sub).glob("*"):
                if p.is_file():
                    p.unlink()
        tmp_tar = work / "rootfs.tar"
        proc = subprocess.run(
            ["tar", "-C", str(rootfs), "--numeric-owner", "-cf", str(tmp_tar), "."],
            capture_output=True,
            text=True,
        )
        if proc.returncode != 0:
            raise SandboxError(f"tar of the rootfs failed: {proc.stderr.strip()[-500:]}")
        os.replace(tmp_tar, out)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    return out


def build_base_image(
    recipe: BaseImageRecipe | None = None, *, host: str | None = None, log=print
) -> str:
    """Make sure the offline base image exists on ``host``; return its tag.

    Skips everything if the tag exists; otherwise imports the cached rootfs tarball
    (a few seconds) or debootstraps it first.

    Example (~40 s the first time on a machine, then a look-up):
        >>> build_base_image(log=lambda msg: None)
        'vime/base:...'
    """
    recipe = recipe or BaseImageRecipe()
    tag = base_image_tag(recipe)
    if image_exists(tag, host=host):
        return tag
    tarball = build_rootfs_tarball(recipe, log=log)
    repo, _, version = tag.partition(":")
    log(f"[vime sandbox] importing {tarball.name} as {tag}")
    client = docker_client(host)
    with docker_errors(f"importing {tarball} as {tag}", host=host):
        client.api.import_image_from_file(
            str(tarball),
            repository=repo,
            tag=version,
            changes=[
                "ENV PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
                "ENV LANG=C.UTF-8",
                'CMD ["/bin/bash"]',
            ],
        )
    if not image_exists(tag, host=host):
        raise SandboxError(f"docker import of {tarball} reported success but {tag} is missing")
    return tag


def _tar_of(files: Mapping[str, bytes | str | Path]) -> bytes:
    """A tar archive (in memory) of ``{path in image: content or local file/dir}``."""
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w") as tar:
        for dest, src in sorted(files.items()):
            arcname = dest.lstrip("/")
            if isinstance(src, Path):
                tar.add(str(src), arcname=arcname)
                continue
            data = src.encode() if isinstance(src, str) else src
            info = tarfile.TarInfo(arcname)
            info.size = len(data)
            info.mode = 0o644
            tar.addfile(info, io.BytesIO(data))
    return buf.getvalue()


def _content_hash(
    base_id: str, files: Mapping[str, bytes | str | Path], commands: Sequence[str]
) -> str:
    h = hashlib.sha256(f"{BUILDER_VERSION}|{base_id}".encode())
    for dest, src in sorted(files.items()):
        h.update(f"\0file:{dest}\0".encode())
        if isinstance(src, Path):
            paths = sorted(src.rglob("*")) if src.is_dir() else [src]
            for p in paths:
                if p.is_file():
                    h.update(f"{p.relative_to(src) if src.is_dir() else ''}\0".encode())
                    h.update(p.read_bytes())
        else:
            h.update(src.encode() if isinstance(src, str) else src)
    for cmd in commands:
        h.update(f"\0cmd:{cmd}".encode())
    return h.hexdigest()[:12]


def build_layered_image(
    base: str,
    files: Mapping[str, bytes | str | Path] | None = None,
    *,
    commands: Sequence[str] = (),
    network: bool = False,
    host: str | None = None,
) -> str:
    """Commit ``files`` (and the output of ``commands``) on top of ``base``; return the tag.

    ``files`` maps absolute paths in the image to bytes, text, or a local file or folder
    (a repository checkout, say). ``commands`` run as root with ``/bin/sh -c`` after the
    files are copied (``pip install -e /repo``, ``git init``); ``network`` lets them reach
    out (off by default: the build should be as offline as the sandbox). The tag is
    ``vime/layer:<hash of base image id, files and commands>``, so an unchanged task
    reuses its image. Put task files outside the sandbox workspace (``/task``, ``/opt``):
    every sandbox mounts a fresh, empty tmpfs there, hiding what the image holds.

    Example (a second call finds the tag and builds nothing):
        >>> base = build_base_image(log=lambda msg: None)
        >>> build_layered_image(base, {"/task/test.py": "assert True"})
        'vime/layer:...'
    """
    files = dict(files or {})
    for dest in files:
        if not dest.startswith("/"):
            raise SandboxError(
                f"build_layered_image: file destination {dest!r} must be an absolute path"
            )
    client = docker_client(host)
    with docker_errors(f"looking up base image {base}", host=host):
        base_id = client.images.get(base).id
    tag = f"vime/layer:{_content_hash(base_id, files, commands)}"
    if image_exists(tag, host=host):
        return tag
    repo, _, version = tag.partition(":")
    with docker_errors(f"building {tag} from {base}", host=host):
        container = client.containers.create(
            base,
            command=["sleep", "infinity"],
            network_mode="bridge" if network else "none",
            labels={LABEL_SANDBOX: "1", LABEL_PID: str(os.getpid()), LABEL_ROLE: "build"},
        )
        try:
            # put_archive on a created container writes straight into its rootfs layer.
            if files and not container.put_archive("/", _tar_of(files)):
                raise SandboxError(f"copying files into the build container of {tag} failed")
            if commands:
                container.start()
                for cmd in commands:
                    code, output = container.exec_run(["/bin/sh", "-c", cmd], user="0:0")
                    if code != 0:
                        text = output.decode(errors="replace")[-2000:]
                        raise SandboxError(
                            f"build_layered_image: command {cmd!r} failed with exit {code}:\n{text}"
                        )
                container.stop(timeout=1)
            container.commit(repository=repo, tag=version)
        finally:
            container.remove(force=True)
    return tag


def distribute_image(tag: str, hosts: Sequence[str]) -> list[str]:
    """Copy ``tag`` to every host in ``hosts`` that lacks it (docker save → load, streamed).

    The image must exist on at least one of the hosts. Returns the hosts it was copied to.
    This is how a task image built on one machine reaches the other sandbox hosts
    without a registry.

    Usage (no doctest: it needs several dockerds): ``distribute_image(tag,
    ["unix:///a.sock", "tcp://b:2375"])`` returns ``["tcp://b:2375"]`` when only the
    first host had the image.
    """
    unique = list(dict.fromkeys(hosts))
    have = [h for h in unique if image_exists(tag, host=h)]
    missing = [h for h in unique if h not in have]
    if not missing:
        return []
    if not have:
        raise SandboxError(
            f"distribute_image: {tag} exists on none of {unique}; build it on one of them first"
        )
    source = docker_client(have[0])
    for host in missing:
        with docker_errors(f"copying image {tag} from {have[0]}", host=host):
            docker_client(host).api.load_image(source.api.get_image(tag))
        if not image_exists(tag, host=host):
            raise SandboxError(
                f"distribute_image: loading {tag} on {host} reported success but it is missing"
            )
    return missing


def build_image_from_dockerfile(
    path: str | Path, *, tag: str | None = None, host: str | None = None
) -> str:
    """Build a local Dockerfile folder (its ``FROM`` must be reachable); return the tag.

    Without ``tag`` the image is tagged ``vime/dockerfile:<hash of the folder>``.

    Usage (no doctest: a Dockerfile's ``FROM`` usually needs a registry):
    ``build_image_from_dockerfile("docker/swe")`` returns e.g.
    ``'vime/dockerfile:0a1b2c3d4e5f'``.
    """
    folder = Path(path)
    if folder.is_file():
        folder = folder.parent
    if not (folder / "Dockerfile").is_file():
        raise SandboxError(
            f"build_image_from_dockerfile: no Dockerfile in {folder}; pass the folder that holds it"
        )
    if tag is None:
        tag = f"vime/dockerfile:{_content_hash('dockerfile', {'/': folder}, ())}"
    client = docker_client(host)
    with docker_errors(f"building {folder}/Dockerfile as {tag}", host=host):
        client.images.build(path=str(folder), tag=tag, rm=True, forcerm=True)
    return tag
