"""Crypto-shredding end to end with real LangGraph: PostgresSaver writes alice's and bob's
checkpoints through ``EncryptedSerializer(SubjectCipher(...))``, each under its subject's data
key fetched from a real ``lethe serve``; a real ``pg_dump`` of the database is the backup.
After alice's erasure, her checkpoints restored from that backup cannot be decrypted, bob's
still can, and the certificate says SHREDDED for the backup target.

Needs PostgreSQL ($LETHE_PG15_URL) with ``pg_dump``/``pg_restore``, and pycryptodome (the venv
of scripts/pg)."""

from __future__ import annotations

import operator
import os
import secrets
import subprocess
import unittest
from pathlib import Path
from typing import Annotated, TypedDict

import psycopg
from langgraph.checkpoint.postgres import PostgresSaver
from langgraph.checkpoint.serde.encrypted import EncryptedSerializer
from langgraph.graph import END, START, StateGraph

import lethe_gate
from lethe_gate import crypto

from .server import Server

PG = os.environ.get("LETHE_PG15_URL", "postgres://postgres@127.0.0.1:5432/postgres")


class Notes(TypedDict):
    notes: Annotated[list[str], operator.add]


def graph(saver):
    g = StateGraph(Notes)
    g.add_node("remember", lambda s: {"notes": [f"noted: {s['notes'][-1]}"]})
    g.add_edge(START, "remember")
    g.add_edge("remember", END)
    return g.compile(checkpointer=saver)


def url_of(db: str) -> str:
    return PG.rsplit("/", 1)[0] + "/" + db


class CryptoShreddingTest(unittest.TestCase):
    @classmethod
    def setUpClass(cls) -> None:
        tag = secrets.token_hex(4)
        cls.db, cls.restored = "pycrypto_" + tag, "pycrypto_restored_" + tag
        with psycopg.connect(PG, autocommit=True) as c:
            c.execute(f'CREATE DATABASE "{cls.db}"')
            c.execute(f'CREATE DATABASE "{cls.restored}"')
        with psycopg.connect(url_of(cls.db), autocommit=True) as c:
            PostgresSaver(c).setup()
        cls.server = Server(
            f"""
[keys]
kek_file = "lethe.kek"
encrypted = ["checkpoints"]

[[target]]
name = "checkpoints"
kind = "langgraph-postgres-checkpointer"
class = "primary"
url = "{url_of(cls.db)}"
metadata = {{ tenant = "tenant_id", subject = "user_id" }}

[[target]]
name = "nightly"
kind = "backup-files"
class = "backup"
path = "backups"
retention_days = 30
covers = ["checkpoints"]
"""
        )
        cls.backups = Path(cls.server.dir.name) / "backups"
        cls.backups.mkdir()

    @classmethod
    def tearDownClass(cls) -> None:
        cls.server.stop()
        with psycopg.connect(PG, autocommit=True) as c:
            for db in (cls.db, cls.restored):
                c.execute(f'DROP DATABASE IF EXISTS "{db}" WITH (FORCE)')

    def run_for(self, rt, saver, subject: str) -> dict:
        config = {
            "configurable": {"thread_id": f"t-{subject}"},
            "metadata": {"tenant_id": "acme", "user_id": subject},
        }
        with rt.take_lease("acme", subject) as lease, crypto.lease(lease):
            graph(saver).invoke({"notes": [f"{subject} told me the secret {subject}-4711"]}, config)
            return graph(saver).get_state({"configurable": {"thread_id": f"t-{subject}"}}).values

    def test_an_erased_subjects_backed_up_checkpoints_cannot_be_decrypted_and_the_others_can(self):
        rt = self.server.client()
        op = self.server.client(operator=True, watch=False)
        cipher = crypto.SubjectCipher(rt)
        try:
            with psycopg.connect(url_of(self.db), autocommit=True) as conn:
                saver = PostgresSaver(conn, serde=EncryptedSerializer(cipher))
                values = {s: self.run_for(rt, saver, s) for s in ("alice", "bob")}
            self.assertIn("alice told me the secret alice-4711", values["alice"]["notes"])
            # What LangGraph stored is ciphertext under the subject's key, not the text.
            with psycopg.connect(url_of(self.db)) as c:
                blobs = c.execute("SELECT type, blob FROM checkpoint_blobs WHERE blob IS NOT NULL").fetchall()
                writes = c.execute("SELECT type, blob FROM checkpoint_writes").fetchall()
            self.assertTrue(blobs and writes)
            for typ, blob in blobs + writes:
                self.assertIn("+lethe-aesgcm.dk-", typ)
                self.assertNotIn(b"secret", bytes(blob))

            # Last night's backup: a real pg_dump archive in the backup target's folder.
            dump = self.backups / "langgraph.dump"
            subprocess.run(["pg_dump", "-Fc", "-f", str(dump), url_of(self.db)], check=True)

            job = op.start_job("acme", "alice", ticket="T-SHRED")["job_id"]
            done = self.server.wait_job(op, job)
            cert = done["certificate"]
            self.assertEqual(cert["targets"]["nightly"]["status"], "SHREDDED", cert)
            self.assertEqual(cert["targets"]["nightly"]["artifacts"], 1)
            self.assertIn("expires", cert["targets"]["nightly"])
            self.assertEqual(cert["keys_destroyed"], 1)
            self.assertEqual(cert["targets"]["checkpoints"]["status"], "DONE")

            # The backup restored into a fresh database: alice's checkpoint is there, unreadable.
            subprocess.run(["pg_restore", "--no-owner", "-d", url_of(self.restored), str(dump)], check=True)
            with psycopg.connect(url_of(self.restored), autocommit=True) as conn:
                saver = PostgresSaver(conn, serde=EncryptedSerializer(crypto.SubjectCipher(rt)))
                self.assertIsNotNone(conn.execute("SELECT 1 FROM checkpoints WHERE thread_id = 't-alice'").fetchone())
                with rt.take_lease("acme", "alice") as lease, crypto.lease(lease):
                    with self.assertRaises(lethe_gate.KeyDestroyed):
                        saver.get_tuple({"configurable": {"thread_id": "t-alice"}})
                # Bob's, from the same backup, reads back whole.
                with rt.take_lease("acme", "bob") as lease, crypto.lease(lease):
                    state = graph(saver).get_state({"configurable": {"thread_id": "t-bob"}}).values
                self.assertEqual(state, values["bob"])
                # A key is bound to its subject: bob's key is not given under alice's lease.
                typ = conn.execute("SELECT type FROM checkpoint_writes WHERE thread_id = 't-bob' LIMIT 1").fetchone()[0]
                bob_key = typ.split("+lethe-aesgcm.")[1]
                with rt.take_lease("acme", "bob") as lease:
                    self.assertEqual(rt.data_key(lease.lease_id, bob_key)[0], bob_key)
                with rt.take_lease("acme", "alice") as lease:
                    with self.assertRaises(lethe_gate.KeyDestroyed):
                        rt.data_key(lease.lease_id, bob_key)
        finally:
            rt.close()
            op.close()

    def test_no_key_without_a_live_lease(self):
        rt = self.server.client()
        try:
            lease = rt.take_lease("acme", "carol")
            kid, key, expires = rt.data_key(lease.lease_id)
            self.assertEqual(len(key), 32)
            self.assertTrue(kid.startswith("dk-"))
            self.assertEqual(rt.data_key(lease.lease_id, kid)[1], key)
            with self.assertRaises(lethe_gate.NoSuchLease):
                rt.data_key(10_000_000)
            with self.assertRaises(lethe_gate.BadRequest):
                rt.data_key(lease.lease_id, "not-a-key")
        finally:
            rt.close()


if __name__ == "__main__":
    unittest.main()
