"""Crypto-shredding for LangGraph checkpoints: a cipher for LangGraph's ``EncryptedSerializer``
that encrypts each payload with the data key of the subject the run works for, fetched through
the gate under the run's lease.

    from langgraph.checkpoint.serde.encrypted import EncryptedSerializer
    from lethe_gate.crypto import SubjectCipher, lease

    saver = PostgresSaver(conn, serde=EncryptedSerializer(SubjectCipher(client)))
    with client.take_lease("acme", "alice") as l, lease(l):
        graph.invoke(inputs, config)

Erasing the subject destroys its key at the gate: every checkpoint blob and write encrypted
under it, in the database and in every backup of it, can no longer be decrypted (a read raises
:class:`~lethe_gate.errors.KeyDestroyed`).

What it does not cover: the checkpoint's ``metadata`` (JSON, unencrypted by LangGraph) and
channel values that ``PostgresSaver`` keeps inline in the checkpoint's JSON (``None``, ``str``,
``int``, ``float`` and ``bool``: no serializer sees them). Keep personal text in messages or
objects, or those copies are not shredded.

Needs ``pycryptodome`` (AES-GCM), as LangGraph's own ``from_pycryptodome_aes`` does.
"""

from __future__ import annotations

import contextvars
import os
import threading
import time
from contextlib import contextmanager
from typing import Iterator

from .client import GateClient, Lease

#: The cipher name ciphertexts carry, before the key's id: ``lethe-aesgcm.dk-...``.
NAME = "lethe-aesgcm"
_AAD = b"lethe-aesgcm/1"

_current: contextvars.ContextVar[int | None] = contextvars.ContextVar("lethe_crypto_lease", default=None)


@contextmanager
def lease(current: Lease | int) -> Iterator[None]:
    """Runs the block's checkpoint writes and reads under ``current``'s subject key. LangGraph
    writes checkpoints from a context copied from the caller's, so the binding reaches them."""
    token = _current.set(int(current.lease_id if isinstance(current, Lease) else current))
    try:
        yield
    finally:
        _current.reset(token)


class SubjectCipher:
    """LangGraph's ``CipherProtocol``: AES-256-GCM under the current lease's subject key.

    Keys are cached per lease and key id no longer than the lease lives (the gate's
    ``expires_ms``), so a key is not used after the lease that fetched it ended.
    """

    def __init__(self, client: GateClient) -> None:
        from Crypto.Cipher import AES  # pycryptodome, as LangGraph's own AES cipher

        self._aes = AES
        self._client = client
        self._lock = threading.Lock()
        self._cache: dict[tuple[int, str | None], tuple[str, bytes, int]] = {}

    def _key(self, key_id: str | None) -> tuple[str, bytes]:
        lease_id = _current.get()
        if lease_id is None:
            raise RuntimeError(
                "no lease is bound: run the graph inside `with lethe_gate.crypto.lease(lease):`"
            )
        now_ms = int(time.time() * 1000)
        with self._lock:
            hit = self._cache.get((lease_id, key_id))
            if hit is not None and hit[2] > now_ms:
                return hit[0], hit[1]
        kid, key, expires_ms = self._client.data_key(lease_id, key_id)
        with self._lock:
            self._cache = {k: v for k, v in self._cache.items() if v[2] > now_ms}
            self._cache[(lease_id, key_id)] = (kid, key, expires_ms)
            self._cache[(lease_id, kid)] = (kid, key, expires_ms)
        return kid, key

    def encrypt(self, plaintext: bytes) -> tuple[str, bytes]:
        key_id, key = self._key(None)
        nonce = os.urandom(12)
        c = self._aes.new(key, self._aes.MODE_GCM, nonce=nonce)
        c.update(_AAD + key_id.encode())
        body, tag = c.encrypt_and_digest(plaintext)
        return f"{NAME}.{key_id}", nonce + tag + body

    def decrypt(self, ciphername: str, ciphertext: bytes) -> bytes:
        prefix = NAME + "."
        if not ciphername.startswith(prefix):
            raise ValueError(f"not a Lethe subject-key ciphertext ({ciphername.split('.')[0]})")
        key_id = ciphername[len(prefix):]
        _, key = self._key(key_id)
        nonce, tag, body = ciphertext[:12], ciphertext[12:28], ciphertext[28:]
        c = self._aes.new(key, self._aes.MODE_GCM, nonce=nonce)
        c.update(_AAD + key_id.encode())
        return c.decrypt_and_verify(body, tag)
