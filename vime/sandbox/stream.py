"""The exec stream: docker's multiplexed frames, read with a deadline, capped in bytes.

Docker sends an exec's stdout and stderr over one socket as frames: an 8-byte header
(stream id, 3 zero bytes, big-endian length) then the payload. Reading it ourselves,
instead of through the SDK's blocking helpers, is what lets ``exec`` stop at a deadline
and drop output past a byte cap while still draining the stream.

Example:
    >>> out, err = Capped(5), Capped(None)
    >>> Demux(out, err).feed(bytes([1, 0, 0, 0, 0, 0, 0, 7]) + b"abcdefg")
    >>> out.bytes(), out.dropped
    (b'abcde', 2)
"""

from __future__ import annotations

import selectors
import socket
import struct
import time
from typing import Any

_STDOUT, _STDERR = 1, 2


class Capped:
    """A byte buffer that keeps the first ``cap`` bytes (None: all) and counts the rest.

    Example:
        >>> c = Capped(3); c.add(b"hello"); c.text()
        'hel\\n[vime: 2 bytes of output dropped]\\n'
    """

    def __init__(self, cap: int | None) -> None:
        self.cap = cap
        self.parts: list[bytes] = []
        self.kept = 0
        self.dropped = 0

    def add(self, data: bytes) -> None:
        if self.cap is None:
            self.parts.append(data)
            return
        room = self.cap - self.kept
        if room > 0:
            self.parts.append(data[:room])
            self.kept += min(room, len(data))
        self.dropped += max(0, len(data) - max(room, 0))

    def bytes(self) -> bytes:
        return b"".join(self.parts)

    def text(self) -> str:
        text = self.bytes().decode("utf-8", errors="replace")
        if self.dropped:
            text += f"\n[vime: {self.dropped} bytes of output dropped]\n"
        return text


class Demux:
    """Splits docker's multiplexed exec stream (8-byte frame headers) into stdout/stderr.

    Chunks may split frames anywhere; the partial frame waits in ``buf``.

    Example:
        >>> out, err = Capped(None), Capped(None)
        >>> Demux(out, err).feed(bytes([2, 0, 0, 0, 0, 0, 0, 2]) + b"no")
        >>> err.bytes()
        b'no'
    """

    def __init__(self, out: Capped, err: Capped) -> None:
        self.out, self.err = out, err
        self.buf = b""

    def feed(self, chunk: bytes) -> None:
        buf = self.buf + chunk if self.buf else chunk
        pos = 0
        while len(buf) - pos >= 8:
            kind = buf[pos]
            size = struct.unpack(">I", buf[pos + 4 : pos + 8])[0]
            if len(buf) - pos < 8 + size:
                break
            (self.err if kind == _STDERR else self.out).add(buf[pos + 8 : pos + 8 + size])
            pos += 8 + size
        self.buf = buf[pos:]


def send_stdin(raw: Any, data: bytes, deadline: float) -> bool:
    """Send ``data`` then EOF; False if the command did not take it before ``deadline``.

    Example (a socket pair stands in for the exec socket):
        >>> ours, command = socket.socketpair()
        >>> send_stdin(ours, b"file contents", time.monotonic() + 10)
        True
        >>> command.recv(100), command.recv(100)  # the data, then EOF
        (b'file contents', b'')
        >>> ours.close(); command.close()
    """
    raw.settimeout(max(0.01, deadline - time.monotonic()))
    try:
        raw.sendall(data)
        # Half-close: the command sees EOF on stdin and can finish.
        raw.shutdown(socket.SHUT_WR)
    except TimeoutError:
        return False
    except (BrokenPipeError, ConnectionResetError):
        pass  # the command exited without reading it all: its exit status says why
    finally:
        raw.settimeout(None)
    return True


def pump(raw: Any, demux: Demux, deadline: float) -> bool:
    """Read multiplexed frames into ``demux`` until EOF (True) or ``deadline`` (False).

    Example (a socket pair stands in for the exec socket):
        >>> ours, docker = socket.socketpair()
        >>> docker.sendall(bytes([1, 0, 0, 0, 0, 0, 0, 3]) + b"hi\\n"); docker.close()
        >>> out, err = Capped(None), Capped(None)
        >>> pump(ours, Demux(out, err), time.monotonic() + 5), out.bytes()
        (True, b'hi\\n')
        >>> ours.close()
    """
    sel = selectors.DefaultSelector()
    sel.register(raw, selectors.EVENT_READ)
    try:
        while True:
            pending = getattr(raw, "pending", lambda: 0)()  # TLS sockets buffer inside
            if not pending:
                remaining = deadline - time.monotonic()
                if remaining <= 0 or not sel.select(timeout=remaining):
                    return False
            chunk = raw.recv(1 << 16)
            if not chunk:
                return True
            demux.feed(chunk)
    finally:
        sel.close()


def read_ahead(sock: Any, raw: Any) -> bytes:
    """The exec stream's first bytes, if the docker SDK already took them off the socket.

    The SDK reads the response's headers through a buffered reader, which reads ahead: when
    a quick command's output is already there, its frames go into that buffer with the
    headers, and reading the raw socket never sees them (1 exec in 900 returned exit 0 and
    an empty stdout with 6 sandboxes busy on 2 loaded cores; SWE's repository setup then
    parsed no commit). Only what is buffered or readable now is taken: no wait.
    """
    response = getattr(sock, "_response", None)
    reader: Any = getattr(getattr(getattr(response, "raw", None), "_fp", None), "fp", None)
    if not hasattr(reader, "read1"):
        return b""
    raw.settimeout(0.0)
    try:
        return bytes(reader.read1(1 << 16) or b"")
    except (BlockingIOError, InterruptedError):
        return b""
    finally:
        raw.settimeout(None)
