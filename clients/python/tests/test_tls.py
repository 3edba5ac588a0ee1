"""The client against `lethe serve` over TLS (`[serve] tls`): answered when it trusts the
deployment's CA (``ca_file``); refused, before any request is sent, when it trusts another CA
or only the system's roots. Certificates made by the openssl CLI for the test."""

from __future__ import annotations

import ssl
import subprocess
import tempfile
import unittest
from pathlib import Path

import lethe_gate

from .server import Server


def openssl(cwd: Path, *args: str) -> None:
    subprocess.run(["openssl", *args], cwd=cwd, check=True, capture_output=True)


def certificates(d: Path) -> None:
    for ca in ("ca", "wrong-ca"):
        openssl(d, "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "2", "-subj",
                f"/CN=lethe test {ca}", "-keyout", f"{ca}.key", "-out", f"{ca}.crt")
    (d / "server.ext").write_text(
        "subjectAltName=IP:127.0.0.1,DNS:localhost\nbasicConstraints=CA:FALSE\nextendedKeyUsage=serverAuth\n"
    )
    openssl(d, "req", "-newkey", "rsa:2048", "-nodes", "-subj", "/CN=127.0.0.1",
            "-keyout", "server.key", "-out", "server.csr")
    openssl(d, "x509", "-req", "-in", "server.csr", "-CA", "ca.crt", "-CAkey", "ca.key",
            "-CAcreateserial", "-days", "2", "-extfile", "server.ext", "-out", "server.crt")


class TlsTest(unittest.TestCase):
    def setUp(self) -> None:
        self.certs = tempfile.TemporaryDirectory(prefix="lethe-pytls-")
        self.d = Path(self.certs.name)
        certificates(self.d)
        self.server = Server(
            serve_toml=f'tls = {{ cert_file = "{self.d / "server.crt"}", key_file = "{self.d / "server.key"}" }}'
        )

    def tearDown(self) -> None:
        self.server.stop()
        self.certs.cleanup()

    def test_the_client_verifies_the_server(self) -> None:
        self.assertTrue(self.server.url.startswith("https://127.0.0.1:"), self.server.url)
        ok = lethe_gate.GateClient(self.server.url, self.server.runtime_token, watch=False,
                                   ca_file=str(self.d / "ca.crt"))
        lease = ok.take_lease("acme", "tls-subject")
        self.assertFalse(lease.refresh())
        ok.close()
        for ca in (str(self.d / "wrong-ca.crt"), None):
            c = lethe_gate.GateClient(self.server.url, self.server.runtime_token, watch=False, ca_file=ca)
            with self.assertRaises((ssl.SSLError, lethe_gate.Unavailable)) as caught:
                c.take_lease("acme", "tls-subject")
            self.assertIn("certificate", repr(caught.exception).lower() + repr(caught.exception.__cause__).lower())
            c.close()


if __name__ == "__main__":
    unittest.main()
