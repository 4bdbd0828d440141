"""Container removal that survives a daemon outage: a removal that fails (the daemon is
down or unreachable) is remembered per host and retried when a sandbox next starts on
that host, and at exit; ``vime-agent sandbox gc`` is the last resort.

When such a host answers again, this process's containers that its daemon left ``dead``
or stopped are removed too: a daemon killed mid-removal restores the container as
``dead`` and leaves it to the client (moby), whichever side was removing it. A removal
that fails while the host answers (a dead container's filesystem still busy), or a
container the daemon leaves dead a little later, is retried in the background for about
a minute after the host is back (``RETRY_DELAYS_S``), not only when the next sandbox
starts there.

Example:
    >>> remove_unremoved("unix:///nonexistent.sock")
    []
"""

from __future__ import annotations

import threading
import time

from vime.sandbox.client import docker_client
from vime.sandbox.config import owner_labels

# Containers whose removal failed (their daemon was down): host -> ids. Retried when a
# sandbox next starts on that host, and at exit; `vime-agent sandbox gc` is the last resort.
_unremoved: dict[str, set[str]] = {}
_unremoved_lock = threading.Lock()
# After a retry that leaves some behind on a host that answers: retry again after these
# delays (a dead container's rootfs can stay busy for seconds after its shim exits).
RETRY_DELAYS_S = (1.0, 2.0, 4.0, 8.0, 16.0, 32.0)
_retrying: set[str] = set()  # hosts with a background retry pending


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
            # Back from an outage: a dead container's filesystem can stay busy, and the
            # restarted daemon can leave more dead ones a little later; look again soon.
            _retry_in_background(h)
    return left


def _retry_in_background(host: str) -> None:
    """After each of ``RETRY_DELAYS_S``: retry ``host``'s queued removals and remove this
    process's dead or stopped containers there (one daemon thread per host at a time: it
    cannot delay exit)."""
    with _unremoved_lock:
        if host in _retrying:
            return
        _retrying.add(host)

    def retry() -> None:
        try:
            for delay in RETRY_DELAYS_S:
                time.sleep(delay)
                with _unremoved_lock:
                    queued = sorted(_unremoved.get(host, ()))
                for container in queued + _left_behind(host):
                    remove_container(host, container)
        finally:
            with _unremoved_lock:
                _retrying.discard(host)

    threading.Thread(target=retry, name="vime-removal-retry", daemon=True).start()


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
