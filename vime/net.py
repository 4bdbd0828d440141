"""Small networking helpers shared by the engine launcher, its clients and the trainer.

It sits at the bottom of the package (standard library only), so that neither
:mod:`vime.engine` nor :mod:`vime.trainer` has to import the other to pick a port, and
every client of an engine finds the engine's key here (:func:`engine_headers`).

Example:
    >>> 0 < free_port() < 65536
    True
"""

from __future__ import annotations

import random
import secrets
import socket
import threading
from collections.abc import Iterable
from pathlib import Path

EPHEMERAL_RANGE = Path("/proc/sys/net/ipv4/ip_local_port_range")
"""Where Linux keeps the ports it gives outgoing connections (and ``bind(0)``)."""


def ephemeral_ports() -> tuple[int, int]:
    """The kernel's ephemeral port range (Linux's default where it cannot be read).

    Example:
        >>> low, high = ephemeral_ports()
        >>> 1024 <= low < high <= 65535
        True
    """
    try:
        low, high = (int(x) for x in EPHEMERAL_RANGE.read_text().split())
        return low, high
    except (OSError, ValueError):
        return 32768, 60999


def free_port(host: str = "127.0.0.1") -> int:
    """A TCP port free on ``host`` now, picked at random below the ephemeral range.

    The port goes to a server that binds it seconds later (vLLM, after its imports). A
    port from ``bind(0)`` lies in the ephemeral range, where any outgoing connection of the
    machine may take it meanwhile: a test's engine once died "Address already in use"
    that way, beside another test worker's traffic. Below the range only another bind can
    take it, and a random pick makes two launchers meeting unlikely. Where the range
    leaves too little room below it, the OS picks.

    Example:
        >>> port = free_port("127.0.0.1")
        >>> 1024 <= port < ephemeral_ports()[0]
        True
    """
    low = ephemeral_ports()[0]
    pick = random.SystemRandom()
    if low - 1024 >= 4096:
        for _ in range(64):
            port = pick.randrange(max(1024, low - 12000), low)
            with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
                try:
                    s.bind((host, port))
                except OSError:
                    continue  # in use (or in TIME_WAIT): another
                return port
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((host, 0))
        return int(s.getsockname()[1])


def address_towards(peer: str) -> str:
    """This machine's address on the route to ``peer`` (what ``peer`` can reach it at).

    Example:
        >>> address_towards("127.0.0.1")
        '127.0.0.1'
    """
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        s.connect((peer, 9))  # UDP connect sends nothing; it only picks the route
        return str(s.getsockname()[0])


# ---------------------------------------------------------------- engine keys
#
# A run's engines require a key (vime.engine.vllm_auth says what the engine checks). This
# process remembers each engine URL's key where it learns it: the engines it launches, the
# URLs the other nodes send at rendezvous (vime.placement.ranks), external engines
# (engine.api_key), a rollout worker's run spec (vime.store.postgres). Every vime client
# of an engine (EngineClient, the policy client's transport and probes, the weight sync,
# the profiler trace) sends engine_headers(url) for the URL it calls, so a key learnt once
# reaches all of them. It lives here, at the bottom, because all of those use it.

_ENGINE_KEYS: dict[str, str] = {}  # engine base URL (no trailing slash) -> its key
_KEYS_LOCK = threading.Lock()  # the collector's threads read while the loop writes


def new_engine_key() -> str:
    """A fresh random engine key (256 bits, URL-safe).

    Example:
        >>> len(new_engine_key()) >= 43
        True
    """
    return secrets.token_urlsafe(32)


def remember_engine_key(urls: Iterable[str], key: str) -> None:
    """The engines at ``urls`` require ``key`` (an empty key: nothing is recorded).

    Example:
        >>> remember_engine_key(["http://10.0.0.9:1/"], "k"); engine_key("http://10.0.0.9:1")
        'k'
    """
    if not key:
        return
    with _KEYS_LOCK:
        for url in urls:
            _ENGINE_KEYS[url.rstrip("/")] = key


def engine_key(url: str) -> str:
    """The key the engine at ``url`` requires, '' if none is known.

    Example:
        >>> engine_key("http://nowhere:1")
        ''
    """
    with _KEYS_LOCK:
        return _ENGINE_KEYS.get(url.rstrip("/"), "")


def engine_keys(urls: Iterable[str]) -> dict[str, str]:
    """``{url: key}`` for those of ``urls`` whose key is known (what a run spec carries).

    Example:
        >>> remember_engine_key(["http://10.0.0.10:1"], "k")
        >>> engine_keys(["http://10.0.0.10:1", "http://x:2"])
        {'http://10.0.0.10:1': 'k'}
    """
    return {url: key for url in urls if (key := engine_key(url))}


def engine_headers(url: str) -> dict[str, str]:
    """The ``Authorization`` header for the engine at ``url`` (empty if it needs no key).

    Example:
        >>> remember_engine_key(["http://10.0.0.7:8000"], "k1")
        >>> engine_headers("http://10.0.0.7:8000/"), engine_headers("http://nowhere:1")
        ({'Authorization': 'Bearer k1'}, {})
    """
    key = engine_key(url)
    return {"Authorization": f"Bearer {key}"} if key else {}
