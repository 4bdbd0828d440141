"""Small networking helpers shared by the engine launcher and the trainer.

It sits at the bottom of the package (standard library only), so that neither
:mod:`vime.engine` nor :mod:`vime.trainer` has to import the other to pick a port.

Example:
    >>> 0 < free_port() < 65536
    True
"""

from __future__ import annotations

import socket


def free_port(host: str = "127.0.0.1") -> int:
    """A TCP port that was free on ``host`` a moment ago (the OS picks it).

    Example:
        >>> 0 < free_port("127.0.0.1") < 65536
        True
    """
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
