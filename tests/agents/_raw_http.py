"""A hand-written HTTP answer for the tests' raw asyncio servers (they drop, hold or
refuse connections on purpose, which a real web framework would not let them do).

Example:
    >>> class Sink:
    ...     data = b""
    ...     def write(self, b): self.data += b
    ...     async def drain(self): pass
    >>> import asyncio; sink = Sink(); asyncio.run(answer_json(sink, {"ok": 1}))
    >>> sink.data.split(b"\\r\\n")[0], sink.data.endswith(b'{"ok": 1}')
    (b'HTTP/1.1 200 OK', True)
"""

from __future__ import annotations

import json
from typing import Any


async def answer_json(writer: Any, data: Any) -> None:
    """Write ``data`` as a 200 JSON response on ``writer`` (a keep-alive connection)."""
    payload = json.dumps(data).encode()
    writer.write(
        b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\n"
        + f"content-length: {len(payload)}\r\n\r\n".encode()
        + payload
    )
    await writer.drain()
