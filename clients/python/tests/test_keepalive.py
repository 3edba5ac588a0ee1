"""The client's keep-alive rules against a scripted server on a real socket: a connection the
server closed is replaced before a request is sent; a lost answer makes a keyed permit take or
end go again with its key, and nothing else that may have been acted on (an unkeyed end)."""

from __future__ import annotations

import json
import socket
import threading
import unittest

import lethe_gate
from lethe_gate import Unavailable


def read_request(f) -> tuple[str, bytes]:
    """Reads one request from a socket file; returns its request line and body."""
    first = f.readline().decode().rstrip("\r\n")
    length = 0
    while True:
        line = f.readline()
        if line in (b"\r\n", b""):
            break
        name, _, value = line.decode().partition(":")
        if name.strip().lower() == "content-length":
            length = int(value)
    return first, f.read(length)


def take_answered(conn: socket.socket, f, permit_id: int) -> str:
    """Reads a permit take, answers it with `permit_id`; returns the key the take carried."""
    line, body = read_request(f)
    assert line == "POST /v1/permits HTTP/1.1", line
    answer(conn, f'{{"permit_id": {permit_id}}}')
    return json.loads(body)["key"]


def answer(conn: socket.socket, body: str, status: str = "201 Created") -> None:
    conn.sendall(
        f"HTTP/1.1 {status}\r\nContent-Type: application/json\r\nContent-Length: {len(body)}\r\n\r\n{body}".encode()
    )


class KeepAliveTest(unittest.TestCase):
    def setUp(self) -> None:
        # Every socket the scripted server accepts reads with a timeout: a request the client
        # does not send (a regression) fails the test instead of hanging it.
        previous = socket.getdefaulttimeout()
        socket.setdefaulttimeout(10)
        self.addCleanup(socket.setdefaulttimeout, previous)
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.addCleanup(self.listener.close)
        port = self.listener.getsockname()[1]
        self.client = lethe_gate.GateClient(f"http://127.0.0.1:{port}", "t", watch=False)
        self.addCleanup(self.client.close)

    def test_a_connection_the_server_closed_is_replaced_before_the_request_is_sent(self):
        results: list = []
        closed = threading.Event()

        def run() -> None:
            results.append(self.client.take_permit(7, "tool"))
            closed.wait(10)
            results.append(self.client.release_permit(1))

        t = threading.Thread(target=run)
        t.start()
        one, _ = self.listener.accept()
        with one, one.makefile("rb") as f:
            key = take_answered(one, f, 1)
            one.shutdown(socket.SHUT_RDWR)
        closed.set()
        self.listener.settimeout(10)
        two, _ = self.listener.accept()
        with two, two.makefile("rb") as f:
            # The release shows the key its take carried.
            self.assertEqual(read_request(f)[0], f"DELETE /v1/permits/1?key={key} HTTP/1.1")
            answer(two, "", "204 No Content")
            t.join(10)
        self.assertEqual(results, [1, None])

    def test_a_keyed_release_cut_after_it_was_sent_goes_again_and_no_such_permit_then_means_done(self):
        results: list = []

        def run() -> None:
            results.append(self.client.take_permit(7, "tool"))
            results.append(self.client.release_permit(1))

        t = threading.Thread(target=run)
        t.start()
        gone = '{"error": "no_such_permit", "message": "no active permit 1"}'
        one, _ = self.listener.accept()
        with one, one.makefile("rb") as f:
            key = take_answered(one, f, 1)
            self.assertEqual(read_request(f)[0], f"DELETE /v1/permits/1?key={key} HTTP/1.1")
            one.shutdown(socket.SHUT_RDWR)
        self.listener.settimeout(10)
        two, _ = self.listener.accept()
        with two, two.makefile("rb") as f:
            self.assertEqual(read_request(f)[0], f"DELETE /v1/permits/1?key={key} HTTP/1.1", "sent again")
            answer(two, gone, "404 Not Found")
            t.join(10)
        self.assertEqual(results, [1, None], "the first sending ended it")

    def test_an_unkeyed_release_cut_after_it_was_sent_is_not_sent_again(self):
        results: list = []

        def run() -> None:
            try:
                results.append(self.client.release_permit(1))  # not taken by this client: no key
            except Unavailable as e:
                results.append(e)

        t = threading.Thread(target=run)
        t.start()
        one, _ = self.listener.accept()
        with one, one.makefile("rb") as f:
            self.assertEqual(read_request(f)[0], "DELETE /v1/permits/1 HTTP/1.1")
            one.shutdown(socket.SHUT_RDWR)
        t.join(10)
        self.assertFalse(t.is_alive(), "the client waits on a resent request")
        self.assertIsInstance(results[0], Unavailable)
        self.listener.setblocking(False)
        with self.assertRaises(BlockingIOError, msg="the release was sent again on a new connection"):
            self.listener.accept()

    def test_no_such_permit_to_a_first_sending_is_an_error(self):
        errors: list = []

        def run() -> None:
            self.client.take_permit(7, "tool")
            try:
                self.client.release_permit(1)
            except lethe_gate.NoSuchPermit as e:
                errors.append(e)

        t = threading.Thread(target=run)
        t.start()
        one, _ = self.listener.accept()
        with one, one.makefile("rb") as f:
            take_answered(one, f, 1)
            read_request(f)
            answer(one, '{"error": "no_such_permit", "message": "m"}', "404 Not Found")
            t.join(10)
        self.assertEqual(len(errors), 1)

    def test_a_permit_take_cut_after_it_was_sent_goes_again_with_its_key(self):
        results: list = []
        t = threading.Thread(target=lambda: results.extend([self.client.take_permit(7, "tool"),
                                                             self.client.take_permit(7, "tool")]))
        t.start()
        one, _ = self.listener.accept()
        with one, one.makefile("rb") as f:
            line, body = read_request(f)
            self.assertEqual(line, "POST /v1/permits HTTP/1.1")
            first_key = json.loads(body)["key"]
            one.shutdown(socket.SHUT_RDWR)
        self.listener.settimeout(10)
        two, _ = self.listener.accept()
        with two, two.makefile("rb") as f:
            self.assertEqual(json.loads(read_request(f)[1])["key"], first_key, "sent again with its key")
            answer(two, '{"permit_id": 5}')
            second_key = json.loads(read_request(f)[1])["key"]
            answer(two, '{"permit_id": 6}')
            t.join(10)
        self.assertNotEqual(second_key, first_key, "a new take, a new key")
        self.assertEqual(results, [5, 6])


    def test_a_keyed_take_or_release_goes_again_after_a_timeout_or_a_503_once(self):
        port = self.listener.getsockname()[1]
        client = lethe_gate.GateClient(f"http://127.0.0.1:{port}", "t", watch=False, timeout=0.5)
        self.addCleanup(client.close)
        results: list = []

        def run() -> None:
            results.append(client.take_permit(7, "tool"))
            results.append(client.take_permit(7, "tool"))
            try:
                client.release_permit(results[1])
            except Unavailable as e:
                results.append(e)

        t = threading.Thread(target=run)
        t.start()
        self.listener.settimeout(10)
        one, _ = self.listener.accept()
        with one, one.makefile("rb") as f:
            key = json.loads(read_request(f)[1])["key"]
            # No answer: the client's 0.5 s timeout passes and it sends the take again.
            two, _ = self.listener.accept()
        with two, two.makefile("rb") as f:
            self.assertEqual(json.loads(read_request(f)[1])["key"], key, "sent again with its key")
            answer(two, '{"permit_id": 4}')
            key = json.loads(read_request(f)[1])["key"]
            answer(two, '{"error": "unavailable", "message": "m"}', "503 Service Unavailable")
            self.assertEqual(json.loads(read_request(f)[1])["key"], key, "sent again after a 503")
            answer(two, '{"permit_id": 5}')
            for _ in range(2):  # the release, and the release sent again after its 503
                self.assertEqual(read_request(f)[0], f"DELETE /v1/permits/5?key={key} HTTP/1.1")
                answer(two, '{"error": "unavailable", "message": "m"}', "503 Service Unavailable")
            t.join(10)
        self.assertEqual(results[:2], [4, 5])
        self.assertIsInstance(results[2], Unavailable)
        self.listener.setblocking(False)
        with self.assertRaises(BlockingIOError, msg="the release was sent a third time"):
            self.listener.accept()


if __name__ == "__main__":
    unittest.main()
