"""The SSE parser on byte streams (no server: the parser is pure). The stream itself is tested
against a real `lethe serve` in test_gate.py."""

import unittest

from lethe_gate.sse import Event, SseParser

STREAM = (
    b": keepalive\n\n"
    b"event: revoked\ndata: {\"lease_id\": 17}\n\n"
    b"event: revoked\r\ndata: {\"lease_id\": 18}\r\n\r\n"
    b"data: a\rdata: b\r\r"
    b"id: 5\nevent: other\ndata:x\n\n"
    b"event: empty\n\n"
)
WANT = [
    Event("revoked", '{"lease_id": 17}'),
    Event("revoked", '{"lease_id": 18}'),
    Event("message", "a\nb"),
    Event("other", "x", "5"),
]


class SseParserTest(unittest.TestCase):
    def test_whole_stream_gives_every_event_and_counts_comments(self):
        p = SseParser()
        self.assertEqual(p.feed(STREAM), WANT)
        self.assertEqual(p.comments, 1)

    def test_any_split_gives_the_same_events(self):
        # Every split point, CR/LF pairs included: chunk boundaries must not change events.
        for i in range(len(STREAM) + 1):
            p = SseParser()
            got = p.feed(STREAM[:i]) + p.feed(STREAM[i:])
            self.assertEqual(got, WANT, f"split at byte {i}")

    def test_byte_at_a_time(self):
        p = SseParser()
        got = []
        for b in STREAM:
            got += p.feed(bytes([b]))
        self.assertEqual(got, WANT)

    def test_incomplete_event_is_not_dispatched(self):
        p = SseParser()
        self.assertEqual(p.feed(b"event: revoked\ndata: {\"lease_id\": 1}\n"), [])
        self.assertEqual(p.feed(b"\n"), [Event("revoked", '{"lease_id": 1}')])

    def test_retry_field_is_kept(self):
        p = SseParser()
        p.feed(b"retry: 250\n\n")
        self.assertEqual(p.retry_ms, 250)


if __name__ == "__main__":
    unittest.main()
