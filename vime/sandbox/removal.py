"""Container removal that survives a daemon outage: a removal that fails (the daemon is
down or unreachable) is remembered per host and retried when a sandbox next starts on
that host, and at exit; ``vime-agent sandbox gc`` is the last resort.

When such a host answers again, this process's containers that its daemon left ``dead``
or stopped are removed too: a daemon killed mid-removal restores the container as
``dead`` and leaves it to the client (moby), whichever side was removing it.

Example:
    >>> remove_unremoved("unix:///nonexistent.sock")
    []
"""

from __future__ import annotations

import threading

from vime.sandbox.client import docker_client
from vime.sandbox.config import owner_labels

# Containers whose removal failed (their daemon was down): host -> ids. Retried when a
# sandbox next starts on that host, and at exit; `vime-agent sandbox gc` is the last resort.
_unremoved: dict[str, set[str]] = {}
_unremoved_lock = threading.Lock()


def remove_container(host: str, container_id: str) -> bool:
    """Force-remove one container (its id or name); True once it is gone, else it is
    queued for a retry."""
    import docker.errors

    try:
        docker_client(host).api.remove_container(container_id, force=True, v=True)
        gone = True
    except docker.errors.NotFound:
        gone = True
    except docker.errors.APIError as err:  # 409: auto-remove is already removing it
        gone = err.status_code == 409
    except Exception:  # the daemon is down or unreachable
        gone = False
    with _unremoved_lock:
        if gone:
            _unremoved.get(host, set()).discard(container_id)
        else:
            _unremoved.setdefault(host, set()).add(container_id)
    return gone


def remove_unremoved(host: str | None = None) -> list[str]:
    """Retry the removals that failed earlier (on ``host``, or every host); return the ids
    still not removed.

    Example:
        >>> remove_unremoved("unix:///nonexistent.sock")
        []
    """
    with _unremoved_lock:
        todo = {h: sorted(ids) for h, ids in _unremoved.items() if host in (None, h) and ids}
    left = []
    for h, ids in todo.items():
        for i, container in enumerate(ids):
            if not remove_container(h, container):
                left += ids[i:]  # the host is still down: one try per host, not one per id
                break
        else:
            left += [c for c in _left_behind(h) if not remove_container(h, c)]
    return left


def _left_behind(host: str) -> list[str]:
    """Ids of this process's containers on ``host`` that are ``dead`` or stopped (none of
    them serves a sandbox: a stopped one is auto-removed, unless its daemon failed to)."""
    mine = [f"{name}={value}" for name, value in owner_labels().items()]
    try:
        found = docker_client(host).api.containers(
            all=True, filters={"label": mine, "status": ["dead", "exited"]}
        )
    except Exception:  # down again: the next retry looks
        return []
    return [c["Id"] for c in found]
