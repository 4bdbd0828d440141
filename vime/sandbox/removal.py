"""Container removal that survives a daemon outage: a removal that fails (the daemon is
down or unreachable) is remembered per host and retried when a sandbox next starts on
that host, and at exit; ``vime-agent sandbox gc`` is the last resort.

Example:
    >>> remove_unremoved("unix:///nonexistent.sock")
    []
"""

from __future__ import annotations

import threading

from vime.sandbox.client import docker_client

# Containers whose removal failed (their daemon was down): host -> ids. Retried when a
# sandbox next starts on that host, and at exit; `vime-agent sandbox gc` is the last resort.
_unremoved: dict[str, set[str]] = {}
_unremoved_lock = threading.Lock()


def remove_container(host: str, container_id: str) -> bool:
    """Force-remove one container; True once it is gone, else it is queued for a retry."""
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
        todo = [(h, c) for h, ids in _unremoved.items() if host in (None, h) for c in ids]
    return [c for h, c in todo if not remove_container(h, c)]
