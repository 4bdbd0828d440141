"""Container removal that survives a daemon outage: a removal that fails is remembered per
host and retried until docker says the container is gone; ``vime-agent sandbox gc`` is
the last resort.

A removal is done only once docker answers it or says "no such container". A 409 (the
daemon is removing it itself: auto-remove) or any other refusal (500: its filesystem
busy) queues the container like a daemon that is down does: moby gives up on a removal
that fails and leaves the container ``dead`` to the client. A daemon restarted after a
SIGKILL auto-removes the containers that stopped meanwhile while its restore still
writes their files ("unable to remove filesystem ... directory not empty": once in 10
runs of ``test_dockerd_sigkilled_mid_step``); a client that took its 409 for "removed",
or gave up after one refusal, left that container dead.

Retries: a queued removal on a host that answers is retried in the background (one
daemon thread per host: after each of ``RETRY_DELAYS_S``, then every ``RETRY_EVERY_S``
while any is queued, for at most ``RETRY_FOR_S``); one on a host that is down, when a
sandbox next starts there and at exit. Once a host answers again, this process's
containers there that are dead, stopped or listed "removing" are removed too, during
``RETRY_DELAYS_S`` (the restarted daemon can leave more a little later).

Example:
    >>> remove_unremoved("unix:///nonexistent.sock")
    []
"""

from __future__ import annotations

import threading
import time
from enum import Enum

from vime.sandbox.client import docker_client
from vime.sandbox.config import owner_labels

# Containers not known to be removed yet: host -> ids (or the names vime gave them).
_unremoved: dict[str, set[str]] = {}
_unremoved_lock = threading.Lock()
# After a host answers again: look for queued and left-behind containers after each of
# these delays (a dead container's rootfs can stay busy for seconds after its shim exits).
RETRY_DELAYS_S = (1.0, 2.0, 4.0, 8.0, 16.0, 32.0)
# Then, while some removal is still queued there, every RETRY_EVERY_S up to RETRY_FOR_S
# after the thread started (it is a daemon thread: it never delays exit).
RETRY_EVERY_S = 30.0
RETRY_FOR_S = 600.0
# Hosts with a background retry running -> whether it also looks for left-behind ones.
_retrying: dict[str, bool] = {}


class _Outcome(Enum):
    GONE = "gone"  # removed, or docker has no such container
    REFUSED = "refused"  # the host answered but the container is not removed (yet)
    DOWN = "down"  # the host did not answer


def remove_container(host: str, container_id: str) -> bool:
    """Force-remove one container (its id or name); True once docker says it is gone,
    else it is queued for a retry (in the background when the host answers)."""
    return _remove(host, container_id) is _Outcome.GONE


def _remove(host: str, container_id: str) -> _Outcome:
    """One force-removal; the queue is updated, and a refusal schedules the retry."""
    import docker.errors

    try:
        docker_client(host).api.remove_container(container_id, force=True, v=True)
        outcome = _Outcome.GONE
    except docker.errors.NotFound:
        outcome = _Outcome.GONE
    except docker.errors.APIError:
        # 409: a removal is in progress (auto-remove); it can still fail and leave the
        # container dead. 500: e.g. its filesystem is still busy. Look again later.
        outcome = _Outcome.REFUSED
    except Exception:  # the daemon is down or unreachable
        outcome = _Outcome.DOWN
    with _unremoved_lock:
        if outcome is _Outcome.GONE:
            _unremoved.get(host, set()).discard(container_id)
        else:
            _unremoved.setdefault(host, set()).add(container_id)
    if outcome is _Outcome.REFUSED:
        _retry_in_background(host)
    return outcome


def remove_unremoved(host: str | None = None) -> list[str]:
    """Retry the removals that failed earlier (on ``host``, or every host); return the ids
    still not removed. On a host that answers, this process's dead or stopped containers
    are removed too, and looked for again in the background.

    Example:
        >>> remove_unremoved("unix:///nonexistent.sock")
        []
    """
    with _unremoved_lock:
        todo = {h: sorted(ids) for h, ids in _unremoved.items() if host in (None, h) and ids}
    left = []
    for h, ids in todo.items():
        # One try per host while it is down, not one per id.
        if all(_remove(h, container) is not _Outcome.DOWN for container in ids):
            # Back from an outage: the restarted daemon can leave more dead ones a
            # little later; look again soon.
            for container in _left_behind(h):
                _remove(h, container)
            _retry_in_background(h, scan=True)
        with _unremoved_lock:
            left += sorted(_unremoved.get(h, ()))
    return left


def _retry_in_background(host: str, scan: bool = False) -> None:
    """Retry ``host``'s queued removals: after each of ``RETRY_DELAYS_S``, then every
    ``RETRY_EVERY_S``, while any is queued, up to ``RETRY_FOR_S`` (one daemon thread per
    host at a time). With ``scan`` (the host is back from an outage) this process's dead,
    stopped or "removing" containers there are removed too, through all of
    ``RETRY_DELAYS_S``."""
    with _unremoved_lock:
        running = host in _retrying
        _retrying[host] = _retrying.get(host, False) or scan
        if running:
            return
    try:
        threading.Thread(
            target=_retry, args=(host,), name="vime-removal-retry", daemon=True
        ).start()
    except RuntimeError:  # at interpreter exit no thread may start: the atexit try remains
        with _unremoved_lock:
            _retrying.pop(host, None)


def _retry(host: str) -> None:
    deadline = time.monotonic() + RETRY_FOR_S
    delays = list(RETRY_DELAYS_S)
    while True:
        time.sleep(delays.pop(0) if delays else RETRY_EVERY_S)
        with _unremoved_lock:
            queued = sorted(_unremoved.get(host, ()))
            scan = _retrying.get(host, False)
        for container in queued + (_left_behind(host) if scan else []):
            _remove(host, container)
        with _unremoved_lock:
            # Decided under the lock: a removal queued after this starts a new thread.
            done = not _unremoved.get(host) and not (scan and delays)
            if done or time.monotonic() > deadline:
                _retrying.pop(host, None)
                return


def _left_behind(host: str) -> list[str]:
    """Ids of this process's containers on ``host`` that are ``dead``, stopped or being
    removed (none of them serves a sandbox: a stopped one is auto-removed, unless its
    daemon failed to). "removing" is in the list because docker's list shows a container
    whose removal failed as "removing" until something saves its state again (its inspect
    says dead); one that is really being removed answers 409 and is looked at again."""
    mine = [f"{name}={value}" for name, value in owner_labels().items()]
    try:
        found = docker_client(host).api.containers(
            all=True, filters={"label": mine, "status": ["dead", "exited", "removing"]}
        )
    except Exception:  # down again: the next retry looks
        return []
    return [c["Id"] for c in found]
