"""Starts a real `lethe serve` for a test: a fresh config and journal in a temp dir, port 0, the
bound address read from what the server prints. The binary is $LETHE_BIN, else
<repo>/target/debug/lethe (tests/e2e/python_client.sh builds it)."""

from __future__ import annotations

import os
import re
import secrets
import shutil
import subprocess
import tempfile
import threading
import time
from pathlib import Path

import lethe_gate

REPO = Path(__file__).resolve().parents[3]
FIXTURE_TARGET = """
[[target]]
name = "memories"
kind = "langgraph-sqlite-store"
class = "primary"
path = "store.db"
namespace = ["{tenant}", "{subject}"]
"""
ADDR = re.compile(rb"(127\.0\.0\.1:\d+)")


def lethe_bin() -> str:
    b = os.environ.get("LETHE_BIN") or str(REPO / "target" / "debug" / "lethe")
    if not os.access(b, os.X_OK):
        raise RuntimeError(f"no lethe binary at {b}: run `cargo build -p lethe-cli` or set LETHE_BIN")
    return b


class Server:
    """A `lethe serve` process with a runtime and an operator token."""

    def __init__(self, extra_toml: str | None = None, serve_toml: str = "") -> None:
        self.dir = tempfile.TemporaryDirectory(prefix="lethe-pyclient-")
        d = Path(self.dir.name)
        self.runtime_token = "rt-" + secrets.token_hex(16)
        self.operator_token = "op-" + secrets.token_hex(16)
        if extra_toml is None:
            # Lethe wants at least one target: a copy of the store LangGraph wrote for the
            # fixtures (the tests' own subjects are random, so an erasure finds nothing there).
            shutil.copy(REPO / "tests/fixtures/langgraph-sqlite/store.db", d / "store.db")
            extra_toml = FIXTURE_TARGET
        for name, token in (("runtime.token", self.runtime_token), ("operator.token", self.operator_token)):
            (d / name).write_text(token + "\n")
            (d / name).chmod(0o600)  # lethe serve refuses a token file others can read
        self.config = d / "lethe.toml"
        self.config.write_text(
            f"""[control]
journal = "sqlite:journal.db"
policy_version = "pyclient-test"

[serve]
listen = "127.0.0.1:0"
{serve_toml}

[[serve.token]]
role = "runtime"
token_file = "runtime.token"

[[serve.token]]
role = "operator"
token_file = "operator.token"
{extra_toml}"""
        )
        self.log = d / "serve.log"
        self._log = open(self.log, "ab")
        self._start("127.0.0.1:0")

    def _start(self, listen: str) -> None:
        self.proc = subprocess.Popen(
            [lethe_bin(), "--config", str(self.config), "serve", "--listen", listen],
            stdout=subprocess.PIPE,
            stderr=self._log,
            cwd=self.dir.name,
        )
        self.url = self._read_address(timeout=30)

    def restart(self) -> None:
        """Stops the process (SIGTERM: graceful) and starts it again on the same address and
        journal."""
        self._terminate()
        self._start(self.url.split("://", 1)[1])

    def _read_address(self, timeout: float) -> str:
        found: list[str] = []
        done = threading.Event()

        def read() -> None:
            for line in self.proc.stdout:  # type: ignore[union-attr]
                m = ADDR.search(line)
                if m and not found:
                    scheme = "https" if b"https://" in line else "http"
                    found.append(f"{scheme}://" + m.group(1).decode())
                    done.set()
            done.set()

        threading.Thread(target=read, daemon=True).start()
        if not done.wait(timeout) or not found:
            self.proc.kill()
            self.proc.wait()
            self._log.flush()
            log = self.log.read_text(errors="replace")
            self.stop()
            raise RuntimeError(f"lethe serve printed no address; its stderr:\n{log}")
        return found[0]

    def client(self, operator: bool = False, **kw) -> lethe_gate.GateClient:
        return lethe_gate.GateClient(self.url, self.operator_token if operator else self.runtime_token, **kw)

    def wait_job(self, op: lethe_gate.GateClient, job_id: str, states=("COMPLETE",), timeout: float = 20) -> dict:
        """Polls the job until it is in one of ``states``."""
        deadline = time.monotonic() + timeout
        while True:
            j = op.job(job_id)
            if j["state"] in states:
                return j
            if time.monotonic() > deadline:
                raise AssertionError(f"job {job_id} is {j['state']}, not {states}, after {timeout} s")
            time.sleep(0.02)

    def _terminate(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        if self.proc.stdout is not None:
            self.proc.stdout.close()

    def stop(self) -> None:
        self._terminate()
        self._log.close()
        self.dir.cleanup()
