"""A server-sent events parser (the WHATWG ``text/event-stream`` format), fed bytes as they
arrive. It knows nothing about the gate; :mod:`lethe_gate.client` reads ``revoked`` events
with it.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Event:
    """One dispatched event: its type (``message`` when the stream named none) and data."""

    event: str
    data: str
    id: str | None = None


class SseParser:
    """Incremental parser: ``feed`` it chunks of any size, get the completed events back.

    Lines end in LF, CRLF or CR; a line starting with ``:`` is a comment (the gate's
    keepalive); a blank line dispatches the event; ``data`` lines are joined with LF; an event
    without data is dropped, as the standard says.
    """

    def __init__(self) -> None:
        self._buf = b""
        self._event = ""
        self._data: list[str] = []
        self._id: str | None = None
        self.comments = 0  # comment lines seen (keepalives), for liveness checks and tests
        self.retry_ms: int | None = None  # the server's last `retry:` advice

    def feed(self, chunk: bytes) -> list[Event]:
        self._buf += chunk
        out: list[Event] = []
        while True:
            line, rest = _split_line(self._buf)
            if line is None:
                break
            self._buf = rest
            ev = self._line(line.decode("utf-8", errors="replace"))
            if ev is not None:
                out.append(ev)
        return out

    def _line(self, line: str) -> Event | None:
        if line == "":
            if not self._data:
                self._event = ""
                return None
            ev = Event(self._event or "message", "\n".join(self._data), self._id)
            self._event, self._data = "", []
            return ev
        if line.startswith(":"):
            self.comments += 1
            return None
        field, _, value = line.partition(":")
        if value.startswith(" "):
            value = value[1:]
        if field == "event":
            self._event = value
        elif field == "data":
            self._data.append(value)
        elif field == "id" and "\0" not in value:
            self._id = value
        elif field == "retry" and value.isdigit():
            self.retry_ms = int(value)
        return None


def _split_line(buf: bytes) -> tuple[bytes | None, bytes]:
    """The first complete line of ``buf`` and the rest. A lone CR at the very end may be the
    first half of a CRLF split across chunks, so it waits for the next byte."""
    for i, b in enumerate(buf):
        if b == 0x0A:
            return buf[:i], buf[i + 1 :]
        if b == 0x0D:
            if i + 1 == len(buf):
                return None, buf
            skip = 2 if buf[i + 1] == 0x0A else 1
            return buf[:i], buf[i + skip :]
    return None, buf
