//! The control store's tables. One version number; migrations are additive.

use rusqlite::Connection;

const VERSION: i64 = 1;

pub(crate) fn migrate(conn: &Connection) -> rusqlite::Result<()> {
    conn.execute_batch(
        r#"
        CREATE TABLE IF NOT EXISTS lethe_meta (k TEXT PRIMARY KEY, v TEXT NOT NULL);

        -- The append-only chain. seq is contiguous from 1; each hash covers the previous one.
        CREATE TABLE IF NOT EXISTS journal (
            seq       INTEGER PRIMARY KEY,
            format    INTEGER NOT NULL,
            at        TEXT NOT NULL,
            job_id    TEXT,
            kind      TEXT NOT NULL,
            body      TEXT NOT NULL,
            prev_hash TEXT NOT NULL,
            hash      TEXT NOT NULL
        );

        -- A projection of the chain: each job's current state, for fast reads.
        CREATE TABLE IF NOT EXISTS jobs (
            job_id         TEXT PRIMARY KEY,
            scope_hash     TEXT NOT NULL,
            scope          TEXT NOT NULL,
            state          TEXT NOT NULL,
            blocked_reason TEXT,
            blocked_target TEXT,
            basis          TEXT NOT NULL,
            policy_version TEXT NOT NULL,
            deadline       TEXT NOT NULL,
            requested_at   TEXT NOT NULL,
            updated_at     TEXT NOT NULL,
            subject_epoch  INTEGER,
            tenant_epoch   INTEGER,
            tombstone_version TEXT,
            certificate    TEXT
        );
        CREATE INDEX IF NOT EXISTS jobs_scope_hash ON jobs (scope_hash);

        -- Each target's frozen inventory: locators and the rows each accounts for. Dropped when
        -- the job completes; the chain keeps the count and a keyed digest.
        CREATE TABLE IF NOT EXISTS inventory (
            job_id  TEXT NOT NULL,
            target  TEXT NOT NULL,
            locator TEXT NOT NULL,
            rows    INTEGER NOT NULL,
            PRIMARY KEY (job_id, target, locator)
        );
        CREATE TABLE IF NOT EXISTS target_progress (
            job_id  TEXT NOT NULL,
            target  TEXT NOT NULL,
            inventoried INTEGER,
            erased  INTEGER,
            residue INTEGER,
            PRIMARY KEY (job_id, target)
        );

        CREATE TABLE IF NOT EXISTS holds (
            hold_id     TEXT PRIMARY KEY,
            tenant      TEXT NOT NULL,
            subject     TEXT,
            reason      TEXT,
            created_at  TEXT NOT NULL,
            released_at TEXT
        );

        -- The gate. subject = '' stands for the tenant itself (identifiers are never empty).
        CREATE TABLE IF NOT EXISTS epochs (
            tenant  TEXT NOT NULL,
            subject TEXT NOT NULL,
            epoch   INTEGER NOT NULL,
            PRIMARY KEY (tenant, subject)
        );
        CREATE TABLE IF NOT EXISTS tombstones (
            tenant    TEXT NOT NULL,
            subject   TEXT NOT NULL,
            memory_id TEXT NOT NULL,
            version   TEXT NOT NULL,
            job_id    TEXT NOT NULL,
            PRIMARY KEY (tenant, subject, memory_id, version)
        );
        CREATE TABLE IF NOT EXISTS fences (
            job_id  TEXT PRIMARY KEY,
            tenant  TEXT NOT NULL,
            subject TEXT NOT NULL
        );
        CREATE TABLE IF NOT EXISTS leases (
            lease_id     INTEGER PRIMARY KEY AUTOINCREMENT,
            tenant       TEXT NOT NULL,
            subject      TEXT NOT NULL,
            epoch        INTEGER NOT NULL,
            tenant_epoch INTEGER NOT NULL,
            expires_ms   INTEGER NOT NULL,
            revoked_by   TEXT
        );
        CREATE INDEX IF NOT EXISTS leases_subject ON leases (tenant, subject);
        CREATE TABLE IF NOT EXISTS lease_reads (
            lease_id  INTEGER NOT NULL REFERENCES leases (lease_id),
            memory_id TEXT NOT NULL,
            version   TEXT NOT NULL,
            PRIMARY KEY (lease_id, memory_id, version)
        );
        CREATE INDEX IF NOT EXISTS lease_reads_memory ON lease_reads (memory_id, version);
        CREATE TABLE IF NOT EXISTS permits (
            permit_id INTEGER PRIMARY KEY AUTOINCREMENT,
            lease_id  INTEGER NOT NULL REFERENCES leases (lease_id),
            sink      TEXT NOT NULL,
            state     TEXT NOT NULL CHECK (state IN ('active', 'released', 'cancelled')),
            issued_ms INTEGER NOT NULL
        );
        -- The permits a job's freeze found active: the job cannot leave FROZEN until each is
        -- released or confirmed cancelled.
        CREATE TABLE IF NOT EXISTS drain (
            job_id    TEXT NOT NULL,
            permit_id INTEGER NOT NULL REFERENCES permits (permit_id),
            PRIMARY KEY (job_id, permit_id)
        );
        CREATE INDEX IF NOT EXISTS permits_lease ON permits (lease_id, state);
        "#,
    )?;
    conn.execute(
        "INSERT INTO lethe_meta (k, v) VALUES ('schema_version', ?1) ON CONFLICT (k) DO NOTHING",
        [VERSION.to_string()],
    )?;
    Ok(())
}
