"""The sandbox's wire format: length-prefixed JSON frames over a pipe.

A 4-byte big-endian length, then that many bytes of UTF-8 JSON. Hand-written because it is
ten lines and the two ends are ours; a frame over ``MAX_FRAME_BYTES`` is a protocol error.
"""

from __future__ import annotations

import json
import os
import struct
from typing import Any

MAX_FRAME_BYTES = 16 * 1024 * 1024
_HEADER = struct.Struct(">I")


class ProtocolError(Exception):
    """The other end closed the pipe or sent something that is not a frame."""


def write_frame(fd: int, message: Any) -> None:
    """Write one message (JSON-serializable) to ``fd``."""
    body = json.dumps(message, ensure_ascii=False, default=str).encode("utf-8")
    if len(body) > MAX_FRAME_BYTES:
        raise ProtocolError(f"frame of {len(body)} bytes is over the {MAX_FRAME_BYTES} byte limit")
    data = memoryview(_HEADER.pack(len(body)) + body)
    while data:
        written = os.write(fd, data)
        data = data[written:]


def read_exact(fd: int, size: int) -> bytes:
    """Exactly ``size`` bytes from ``fd``; ProtocolError at end of file."""
    chunks: list[bytes] = []
    while size:
        chunk = os.read(fd, min(size, 1 << 20))
        if not chunk:
            raise ProtocolError("the pipe was closed")
        chunks.append(chunk)
        size -= len(chunk)
    return b"".join(chunks)


def read_frame(fd: int) -> Any:
    """Read one message from ``fd`` (blocking)."""
    (size,) = _HEADER.unpack(read_exact(fd, _HEADER.size))
    if size > MAX_FRAME_BYTES:
        raise ProtocolError(f"frame of {size} bytes is over the {MAX_FRAME_BYTES} byte limit")
    try:
        return json.loads(read_exact(fd, size))
    except ValueError as exc:
        raise ProtocolError(f"not JSON: {exc}") from exc
