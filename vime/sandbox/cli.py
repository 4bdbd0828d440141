"""``vime-agent sandbox``: build the offline base image, and remove orphaned containers.

    vime-agent sandbox build-base        # prints the tag, e.g. vime/base:f56e2cd8100d
    vime-agent sandbox gc                # remove sandboxes whose owning process is dead
    vime-agent sandbox gc --all          # remove every vime sandbox on the host(s)

Example (the doctests of this module run against the project's dockerd):
    >>> main(["gc", "--run", "doctest-no-such-run"])
    removed 0 container(s)
    0
"""

from __future__ import annotations

import argparse
import socket
import sys
from datetime import datetime

from vime.sandbox.client import default_host, docker_client, docker_errors
from vime.sandbox.config import LABEL_HOSTNAME, LABEL_PID, LABEL_RUN, LABEL_SANDBOX


def _owner_alive(pid: int, created: float) -> bool:
    """Whether ``pid`` is still the process that created a container at ``created``."""
    import psutil

    try:
        proc = psutil.Process(pid)
        # A pid recycled by a process started after the container is not the owner.
        return proc.create_time() <= created + 1.0 and proc.status() != psutil.STATUS_ZOMBIE
    except (psutil.NoSuchProcess, psutil.ZombieProcess):
        return False
    except psutil.AccessDenied:
        return True


def _created_ts(text: str) -> float:
    # Docker gives RFC 3339 with nanoseconds: keep microseconds for fromisoformat.
    head, _, frac = text.rstrip("Z").partition(".")
    micro = (frac[:6] if frac else "0").ljust(6, "0")
    return datetime.fromisoformat(f"{head}.{micro}+00:00").timestamp()


def gc(
    hosts: list[str] | None = None, *, remove_all: bool = False, run_id: str | None = None
) -> list[str]:
    """Remove labelled vime containers that no live process owns; return their ids.

    A container is an orphan when its ``vime.hostname`` label is this machine and its
    ``vime.pid`` process is dead (or recycled). Containers made on other machines are
    left alone unless ``remove_all``; ``run_id`` limits removal to one run's containers.

    Example (``remove_all=True`` would remove every vime sandbox on the host, other
    runs' too):
        >>> gc(run_id="doctest-no-such-run")
        []
    """
    removed: list[str] = []
    me = socket.gethostname()
    for host in hosts or [default_host()]:
        client = docker_client(host)
        labels = [f"{LABEL_SANDBOX}=1"] + ([f"{LABEL_RUN}={run_id}"] if run_id else [])
        with docker_errors("listing vime containers", host=host):
            found = client.api.containers(all=True, filters={"label": labels})
        for info in found:
            cid = info["Id"]
            lab = info.get("Labels") or {}
            if not remove_all and not run_id:
                if lab.get(LABEL_HOSTNAME) not in (None, me):
                    continue
                try:
                    pid = int(lab.get(LABEL_PID, "0"))
                except ValueError:
                    pid = 0
                with docker_errors("inspecting a vime container", host=host, container=cid):
                    created = _created_ts(client.api.inspect_container(cid)["Created"])
                if pid > 0 and _owner_alive(pid, created):
                    continue
            with docker_errors("removing a vime container", host=host, container=cid):
                try:
                    client.api.remove_container(cid, force=True, v=True)
                except Exception as err:  # removed concurrently by its owner: fine
                    if "No such container" not in str(err) and "already in progress" not in str(
                        err
                    ):
                        raise
            removed.append(cid)
    return removed


def main(argv: list[str]) -> int:
    """Entry point of ``vime-agent sandbox``.

    Example (~40 s the first time on a machine, then a look-up):
        >>> main(["build-base"])
        vime/base:...
        0
    """
    parser = argparse.ArgumentParser(
        prog="vime-agent sandbox", description="Docker sandbox images and cleanup."
    )
    sub = parser.add_subparsers(dest="cmd", required=True)
    build = sub.add_parser(
        "build-base", help="build/import the offline base image and print its tag"
    )
    build.add_argument(
        "--host", action="append", help="DOCKER_HOST URL (repeatable; default $DOCKER_HOST)"
    )
    collect = sub.add_parser(
        "gc", help="remove vime sandbox containers whose owning process is dead"
    )
    collect.add_argument(
        "--all", action="store_true", help="remove every vime sandbox, owned or not"
    )
    collect.add_argument("--run", help="remove the containers of this run id")
    collect.add_argument(
        "--host", action="append", help="DOCKER_HOST URL (repeatable; default $DOCKER_HOST)"
    )
    args = parser.parse_args(argv)
    if args.cmd == "build-base":
        from vime.sandbox.images import build_base_image

        for host in args.host or [default_host()]:
            print(build_base_image(host=host, log=lambda msg: print(msg, file=sys.stderr)))
        return 0
    removed = gc(args.host, remove_all=args.all, run_id=args.run)
    print(
        f"removed {len(removed)} container(s)"
        + (f": {' '.join(c[:12] for c in removed)}" if removed else "")
    )
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
