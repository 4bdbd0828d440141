"""An image per SWE-bench instance, built offline from a local repository snapshot.

The snapshot is a folder under ``repos_dir`` (named after the instance, ``owner__name``,
``owner/name`` or ``name``): a git repository, exported at the record's ``base_commit``
(``git archive``: no history, so no later commit with the fix), or a plain folder used
as it is. The install commands come from an install spec per repo and version::

    {"psf/requests": {"2.0": {"install": ["python3 -m pip install ."], "test_cmd": "..."},
                      "*": {...}}}

(a ``.json`` or ``.yaml`` file, or the record's own ``install`` field). They run as root
in ``/testbed`` on top of vime's offline base image (:mod:`vime.sandbox.images`), and the
result is committed as ``vime/layer:<hash of the tree, the wheels and the commands>``: an
unchanged instance reuses its image. With ``wheels_dir`` the wheels are in the image at
``/opt/vime/wheels`` and pip installs from there only (``PIP_NO_INDEX``); a ``pip`` wheel
among them gives the image pip, which the base image lacks.

Example:
    >>> spec_for({"a/b": {"*": {"install": ["make"]}}}, "a/b", "1.0")
    {'install': ['make']}
"""

from __future__ import annotations

import shutil
import subprocess
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from vime.errors import DataError, SandboxError

WHEELS_IN_IMAGE = "/opt/vime/wheels"
REPO_IN_IMAGE = "/testbed"
SPEC_KEYS = ("install", "test_cmd")


@dataclass(frozen=True)
class InstancePlan:
    """What one instance image is built from (equal plans share an image).

    Example:
        >>> a = InstancePlan(Path("/r/o__r"), "abc", ("make",), {"test_cmd": "x"})
        >>> a == InstancePlan(Path("/r/o__r"), "abc", ("make",)), a.key[1]
        (True, 'abc')
    """

    snapshot: Path
    base_commit: str
    install: tuple[str, ...]
    spec: dict[str, Any] = field(default_factory=dict, compare=False, hash=False)
    # The record it was planned for (named when its build fails).
    where: str = field(default="", compare=False)

    @property
    def key(self) -> tuple[str, str, tuple[str, ...]]:
        return (str(self.snapshot), self.base_commit, self.install)


def _commands(value: Any, where: str) -> list[str]:
    if isinstance(value, str):
        return [value] if value.strip() else []
    if not isinstance(value, list) or not all(isinstance(c, str) for c in value):
        raise DataError(f"{where}: 'install' must be a command or a list of commands")
    return value


def load_install_specs(specs: str | Path | dict[str, Any] | None) -> dict[str, Any]:
    """The install specs from a ``.json``/``.yaml`` file (or a dict), checked.

    Example:
        >>> load_install_specs({"a/b": {"1.0": {"install": "make", "test_cmd": "pytest"}}})
        {'a/b': {'1.0': {'install': ['make'], 'test_cmd': 'pytest'}}}
    """
    if not specs:
        return {}
    where = "install specs"
    if not isinstance(specs, dict):
        path = Path(specs)
        where = f"install specs {path}"
        if not path.is_file():
            raise DataError(f"{where}: file not found (swe.install_specs)")
        import yaml

        try:
            specs = yaml.safe_load(path.read_text())  # JSON is YAML too
        except yaml.YAMLError as err:
            raise DataError(f"{where}: not JSON or YAML: {err}") from None
    if not isinstance(specs, dict):
        raise DataError(f"{where}: must map 'owner/name' to {{version: spec}}")
    out: dict[str, Any] = {}
    for repo, versions in specs.items():
        if not isinstance(versions, dict):
            raise DataError(f"{where}: {repo!r} must map versions (or '*') to specs")
        out[repo] = {}
        for version, spec in versions.items():
            at = f"{where}: {repo!r} version {version!r}"
            if not isinstance(spec, dict) or set(spec) - set(SPEC_KEYS):
                raise DataError(f"{at}: a spec holds only {SPEC_KEYS}")
            if not isinstance(spec.get("test_cmd", ""), str):
                raise DataError(f"{at}: 'test_cmd' must be a string")
            out[repo][str(version)] = {**spec, "install": _commands(spec.get("install", []), at)}
    return out


def spec_for(specs: dict[str, Any], repo: str, version: str) -> dict[str, Any]:
    """The spec of ``repo`` at ``version``, else its ``"*"`` spec, else ``{}``.

    Example:
        >>> spec_for({"a/b": {"1.0": {"test_cmd": "t"}}}, "a/b", "2.0")
        {}
    """
    versions = specs.get(repo, {})
    return dict(versions.get(version) or versions.get("*") or {})


def find_snapshot(repos_dir: str | Path, record: dict[str, Any], where: str) -> Path:
    """The record's repository folder under ``repos_dir``.

    Example:
        >>> import tempfile
        >>> root = Path(tempfile.mkdtemp()); (root / "o__r").mkdir()
        >>> find_snapshot(root, {"instance_id": "o__r-1", "repo": "o/r"}, "r").name
        'o__r'
    """
    root = Path(repos_dir)
    repo = record.get("repo") or ""
    names = [record["instance_id"]]
    if repo:
        names += [repo.replace("/", "__"), repo, repo.rsplit("/", 1)[-1]]
    for name in names:
        if (root / name).is_dir():
            return root / name
    raise DataError(
        f"{where}: no repository snapshot for field 'repo' {repo!r} in swe.repos_dir "
        f"{root} (looked for {names}); put a checkout there"
    )


def _git(snapshot: Path, *args: str) -> subprocess.CompletedProcess[bytes]:
    return subprocess.run(["git", "-C", str(snapshot), *args], capture_output=True)


def plan_instance(
    record: dict[str, Any], spec: dict[str, Any], repos_dir: str | Path, where: str
) -> InstancePlan:
    """Check that the instance can be built (snapshot, ``base_commit``) and say from what.

    Example:
        >>> root = Path(tempfile.mkdtemp()); (root / "o__r").mkdir()
        >>> plan_instance({"instance_id": "o__r-1", "repo": "o/r"}, {"install": ["make"]},
        ...               root, "r").install
        ('make',)
    """
    snapshot = find_snapshot(repos_dir, record, where).resolve()
    commit = record.get("base_commit") or ""
    if (snapshot / ".git").exists():
        if not commit:
            raise DataError(f"{where}: field 'base_commit' is missing ({snapshot} is a git repo)")
        if _git(snapshot, "cat-file", "-e", f"{commit}^{{commit}}").returncode != 0:
            raise DataError(
                f"{where}: field 'base_commit' {commit!r} is not a commit of {snapshot}; "
                "fetch it there (git fetch) or fix the record"
            )
    install = _commands(record.get("install", spec.get("install", [])), where)
    return InstancePlan(snapshot, commit, tuple(install), spec, where)


def _export(plan: InstancePlan, dest: Path) -> None:
    """The snapshot's tree (at ``base_commit`` for a git repo) into ``dest``, without .git."""
    if not (plan.snapshot / ".git").exists():
        shutil.copytree(plan.snapshot, dest, symlinks=True, ignore=shutil.ignore_patterns(".git"))
        return
    dest.mkdir(parents=True)
    archive = _git(plan.snapshot, "archive", "--format=tar", plan.base_commit)
    if archive.returncode != 0:
        raise DataError(f"git archive of {plan.snapshot} at {plan.base_commit} failed")
    subprocess.run(["tar", "-x", "-C", str(dest)], input=archive.stdout, check=True)


def _install_script(plan: InstancePlan, wheels: bool) -> list[str]:
    env = ["export PIP_BREAK_SYSTEM_PACKAGES=1 PIP_DISABLE_PIP_VERSION_CHECK=1"]
    if wheels:
        w = WHEELS_IN_IMAGE
        env.append(f"export PIP_NO_INDEX=1 PIP_FIND_LINKS={w}")
        # pip run from its own wheel installs pip (Debian's python3 comes without it).
        env.append(
            f"python3 -m pip --version >/dev/null 2>&1 || for whl in {w}/pip-*.whl; do "
            f'[ -f "$whl" ] && python3 "$whl/pip" install -q pip; break; done'
        )
    prefix = "; ".join(env)
    return [f"{prefix}; cd {REPO_IN_IMAGE} && {cmd}" for cmd in plan.install]


def build_instance_images(
    plans: list[InstancePlan],
    *,
    wheels_dir: str | Path = "",
    network: bool = False,
    hosts: list[str] | None = None,
    log: Any = print,
) -> dict[tuple[str, str, tuple[str, ...]], str]:
    """Build (or find, by content hash) the image of every plan; ``{plan.key: tag}``.

    Built on the first of ``hosts`` (default: the current Docker host) and copied to the
    others, so a sandbox leased on any of them finds it.

    Usage (no doctest: each image installs a repository's environment, minutes):
    ``build_instance_images([plan])`` returns e.g.
    ``{('/repos/o__r', 'abc123', ('make',)): 'vime/layer:1f2e3d4c5b6a'}``.
    """
    if not plans:
        return {}
    from vime.sandbox import build_base_image, build_layered_image
    from vime.sandbox.images import distribute_image

    wheels = Path(wheels_dir) if wheels_dir else None
    if wheels is not None and not wheels.is_dir():
        raise DataError(f"swe.wheels_dir {wheels} is not a folder of wheels")
    host = hosts[0] if hosts else None
    base = build_base_image(host=host, log=log)
    tags: dict[tuple[str, str, tuple[str, ...]], str] = {}
    for plan in plans:
        if plan.key in tags:
            continue
        with tempfile.TemporaryDirectory(prefix="vime-instance-") as tmp:
            tree = Path(tmp) / "repo"
            _export(plan, tree)
            files: dict[str, Any] = {REPO_IN_IMAGE: tree}
            if wheels is not None:
                files[WHEELS_IN_IMAGE] = wheels
            try:
                tags[plan.key] = build_layered_image(
                    base,
                    files,
                    commands=_install_script(plan, wheels is not None),
                    network=network,
                    host=host,
                )
            except SandboxError as err:
                raise DataError(
                    f"{plan.where}: building its image failed in field 'install' (or its "
                    f"install spec): {err}"
                ) from None
        if hosts and len(set(hosts)) > 1:
            distribute_image(tags[plan.key], hosts)
    return tags
