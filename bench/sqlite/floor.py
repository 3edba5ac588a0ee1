#!/usr/bin/env python3
"""The floor: the target's rows deleted by hand-written, set-based SQL (standard library only).

Deletes exactly the rows Lethe erases for TENANT/SUBJECT in a deployment folder:
  checkpoints.db  checkpoints and writes of the threads in (registry threads UNION threads whose
                  checkpoint metadata names the owner): the same union Lethe resolves, with the
                  same byte pre-filter before json_extract; one transaction
  app.db          the owner's thread_registry rows; one transaction
  store.db        store rows whose prefix is 'T.S' or starts with 'T.S.' (a range on the
                  primary key) and their store_vectors rows; one transaction
No journal, no freeze, no verification, no certificate. Prints JSON: rows deleted per table
and the in-process seconds of the SQL alone (connections opened to commits done).
--secure-delete sets PRAGMA secure_delete=ON first (deleted content overwritten with zeros in
the file), as Lethe's target connections do.

Usage: floor.py DIR TENANT SUBJECT [--secure-delete]
"""
import json
import os
import sqlite3
import sys
import time


def main() -> int:
    d, tenant, subject = sys.argv[1:4]
    secure = "--secure-delete" in sys.argv[4:]
    t0 = time.perf_counter()
    out = {}
    app = os.path.join(d, "app.db")

    c = sqlite3.connect(os.path.join(d, "checkpoints.db"), isolation_level=None)
    if secure:
        c.execute("PRAGMA secure_delete=ON")  # before ATTACH: the attached file inherits it
    c.execute("ATTACH DATABASE ? AS app", (app,))
    c.execute("BEGIN IMMEDIATE")
    c.execute("CREATE TEMP TABLE doomed(thread_id TEXT PRIMARY KEY)")
    c.execute(
        """INSERT INTO doomed
           SELECT thread_id FROM app.thread_registry WHERE tenant_id = :t AND user_id = :s
           UNION
           SELECT thread_id FROM main.checkpoints
            WHERE instr(metadata, CAST(:s AS BLOB)) > 0
              AND json_extract(CAST(metadata AS TEXT), '$.tenant_id') = :t
              AND json_extract(CAST(metadata AS TEXT), '$.user_id') = :s""",
        {"t": tenant, "s": subject},
    )
    out["threads"] = c.execute("SELECT count(*) FROM doomed").fetchone()[0]
    out["checkpoints"] = c.execute(
        "DELETE FROM main.checkpoints WHERE thread_id IN (SELECT thread_id FROM doomed)").rowcount
    out["writes"] = c.execute(
        "DELETE FROM main.writes WHERE thread_id IN (SELECT thread_id FROM doomed)").rowcount
    c.execute("COMMIT")
    c.execute("BEGIN IMMEDIATE")
    out["thread_registry"] = c.execute(
        "DELETE FROM app.thread_registry WHERE tenant_id = ? AND user_id = ?", (tenant, subject)).rowcount
    c.execute("COMMIT")
    c.close()

    ns = f"{tenant}.{subject}"
    inside = "(prefix = :ns OR (prefix >= :ns || '.' AND prefix < :ns || '/'))"
    s = sqlite3.connect(os.path.join(d, "store.db"), isolation_level=None)
    if secure:
        s.execute("PRAGMA secure_delete=ON")
    s.execute("BEGIN IMMEDIATE")
    out["store"] = s.execute(f"DELETE FROM store WHERE {inside}", {"ns": ns}).rowcount
    out["store_vectors"] = s.execute(f"DELETE FROM store_vectors WHERE {inside}", {"ns": ns}).rowcount
    s.execute("COMMIT")
    s.close()
    out["sql_seconds"] = time.perf_counter() - t0
    print(json.dumps(out))
    return 0


if __name__ == "__main__":
    sys.exit(main())
