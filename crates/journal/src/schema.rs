//! The control store's tables, one definition for both dialects. One version number;
//! migrations are additive.

use sha2::{Digest, Sha256};

use crate::db::{Tx, V};

/// 3: on PostgreSQL, frozen locators in `inventory_parts`; a Lethe of version 2 would find a
/// job frozen by version 3 without locators. 4: a permit's `request_key` (a take sent again
/// returns the permit its first sending registered; a keyed permit ends only with its key),
/// and `lethe_gate_batch` and `lethe_end_permit` take the keys. 5: `lethe_gate_batch` refuses a
/// take whose lease its first statement did not see even when it saw none (a version-4 process
/// would put back the function that let it through unlocked, so it must not open a version-5
/// store).
/// 6: `lineage`, the edges runtimes record from a derived artifact to the memories it came from;
/// a version-5 process would erase without following them, so it must not open a version-6
/// store.
/// 7: `requests`, erasure requests waiting for an approver (and their decisions), and the
/// intake switch in `lethe_meta`; a version-6 process would run jobs past a paused intake and
/// could not read the journal's request entries, so it must not open a version-7 store.
/// 9: `final_certificates`, a job's certificate reissued once its backups expired, and the
/// `backups_expired` entry after `completed`, which an older `journal verify` reports as
/// tampering; `recoveries`, replays of completed erasures into restored targets, whose fences
/// an older process would not know to keep closed; `subject_keys`, the wrapped per-subject data
/// keys of crypto-shredding, which an older process would leave when it erases;
/// `lineage_links`, artifacts derived from artifacts, which an older process would not follow.
/// Recorded at every migration; an open refuses a store of a newer version than its own.
const VERSION: i64 = 9;

/// Which SQL spelling of integer columns to use.
#[derive(Clone, Copy)]
pub(crate) enum Dialect {
    Sqlite,
    Postgres,
}

const TABLES: &str = r#"
CREATE TABLE IF NOT EXISTS lethe_meta (k TEXT PRIMARY KEY, v TEXT NOT NULL);

-- The append-only chain. seq is contiguous from 1; each hash covers the previous one.
CREATE TABLE IF NOT EXISTS journal (
    seq       {INT} PRIMARY KEY,
    format    {INT} NOT NULL,
    at        TEXT NOT NULL,
    job_id    TEXT,
    kind      TEXT NOT NULL,
    body      TEXT NOT NULL,
    prev_hash TEXT NOT NULL,
    hash      TEXT NOT NULL
);
-- A job's entries, read before its certificate is signed (`projection_problems`).
CREATE INDEX IF NOT EXISTS journal_job ON journal (job_id);

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
    subject_epoch  {INT},
    tenant_epoch   {INT},
    tombstone_version TEXT,
    certificate    TEXT
);
CREATE INDEX IF NOT EXISTS jobs_scope_hash ON jobs (scope_hash);

-- One row per job, locked FOR UPDATE by the process running it (PostgreSQL): the lock dies
-- with the process's connection, so another process can resume a job whose runner was killed.
CREATE TABLE IF NOT EXISTS job_claims (job_id TEXT PRIMARY KEY);

-- Each target's frozen inventory: locators and the rows each accounts for. Dropped when the
-- job completes; the chain keeps the count and a keyed digest.
CREATE TABLE IF NOT EXISTS inventory (
    job_id  TEXT NOT NULL,
    target  TEXT NOT NULL,
    locator TEXT NOT NULL,
    rows    {INT} NOT NULL,
    PRIMARY KEY (job_id, target, locator)
){WITHOUT_ROWID};
CREATE TABLE IF NOT EXISTS target_progress (
    job_id      TEXT NOT NULL,
    target      TEXT NOT NULL,
    inventoried {INT},
    erased      {INT},
    residue     {INT},
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
    epoch   {INT} NOT NULL,
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
-- A COMPLETE job's final certificate, issued when every backup artifact it waited for is
-- gone; the first one stays in jobs.certificate.
CREATE TABLE IF NOT EXISTS final_certificates (
    job_id      TEXT PRIMARY KEY,
    certificate TEXT NOT NULL,
    issued_at   TEXT NOT NULL
);
-- Replays of completed erasures into a restored target (`lethe recovery`). While one is
-- RUNNING, its fences (job_id `<recovery_id>:<n>`) keep every replayed scope closed.
CREATE TABLE IF NOT EXISTS recoveries (
    recovery_id TEXT PRIMARY KEY,
    target      TEXT NOT NULL,
    since       TEXT,
    state       TEXT NOT NULL,
    started_at  TEXT NOT NULL,
    finished_at TEXT,
    report      TEXT
);
-- Crypto-shredding: each subject's data key, wrapped by the key-encryption key (never stored
-- here). Destroyed, in the journaled step of the erasure, to make every copy written under it
-- unreadable, backups included.
CREATE TABLE IF NOT EXISTS subject_keys (
    tenant     TEXT NOT NULL,
    subject    TEXT NOT NULL,
    key_id     TEXT NOT NULL UNIQUE,
    wrapped    TEXT NOT NULL,
    created_at TEXT NOT NULL,
    PRIMARY KEY (tenant, subject)
);
CREATE TABLE IF NOT EXISTS fences (
    job_id  TEXT PRIMARY KEY,
    tenant  TEXT NOT NULL,
    subject TEXT NOT NULL
);
-- Every permit and lease looks its scope up here (a subject's fence and its tenant's).
CREATE INDEX IF NOT EXISTS fences_scope ON fences (tenant, subject);
CREATE TABLE IF NOT EXISTS leases (
    lease_id     {SERIAL},
    tenant       TEXT NOT NULL,
    subject      TEXT NOT NULL,
    epoch        {INT} NOT NULL,
    tenant_epoch {INT} NOT NULL,
    expires_ms   {INT} NOT NULL,
    revoked_by   TEXT
);
CREATE INDEX IF NOT EXISTS leases_subject ON leases (tenant, subject);
CREATE TABLE IF NOT EXISTS lease_reads (
    lease_id  {INT} NOT NULL REFERENCES leases (lease_id),
    memory_id TEXT NOT NULL,
    version   TEXT NOT NULL,
    PRIMARY KEY (lease_id, memory_id, version)
);
CREATE INDEX IF NOT EXISTS lease_reads_memory ON lease_reads (memory_id, version);
CREATE TABLE IF NOT EXISTS permits (
    permit_id {SERIAL},
    lease_id  {INT} NOT NULL REFERENCES leases (lease_id),
    sink      TEXT NOT NULL,
    state     TEXT NOT NULL CHECK (state IN ('active', 'released', 'cancelled')),
    issued_ms {INT} NOT NULL,
    -- The client's name for this take, unique within the lease (`permits_request_key`, made
    -- in `migrate`, also serves lookups by lease).
    request_key TEXT
);
-- Lineage: an artifact in a target (its locator, as the target's adapter resolves it) derived
-- from a subject's memory. One row per memory it came from; memory_id = '' stands for the
-- subject's memory as a whole, version = '' for any version. Never in the chain or a log.
CREATE TABLE IF NOT EXISTS lineage (
    tenant    TEXT NOT NULL,
    subject   TEXT NOT NULL,
    target    TEXT NOT NULL,
    locator   TEXT NOT NULL,
    memory_id TEXT NOT NULL,
    version   TEXT NOT NULL,
    PRIMARY KEY (tenant, subject, target, locator, memory_id, version)
){WITHOUT_ROWID};
-- Lineage between artifacts: the artifact (target, locator) was derived from the artifact
-- (from_target, from_locator), a summary of a summary. An erasure that reaches the second
-- reaches the first; followed transitively.
CREATE TABLE IF NOT EXISTS lineage_links (
    tenant       TEXT NOT NULL,
    subject      TEXT NOT NULL,
    target       TEXT NOT NULL,
    locator      TEXT NOT NULL,
    from_target  TEXT NOT NULL,
    from_locator TEXT NOT NULL,
    PRIMARY KEY (tenant, from_target, from_locator, target, locator)
){WITHOUT_ROWID};
-- Erasure requests (`POST /v1/requests`, `lethe request create`): the scope's identifiers
-- stay here, as a job's do in `jobs`; the chain holds the request's id, scope hash and the
-- names of who asked and who decided, never an identifier. state: PENDING, APPROVED, REJECTED.
-- received_seq: the chain's entry of its receipt, which an approval checks the row against.
CREATE TABLE IF NOT EXISTS requests (
    request_id        TEXT PRIMARY KEY,
    scope             TEXT NOT NULL,
    scope_hash        TEXT NOT NULL,
    basis             TEXT NOT NULL,
    ticket            TEXT NOT NULL,
    received_at       TEXT NOT NULL,
    deadline          TEXT NOT NULL,
    extension_reason  TEXT,
    identity_verified {INT} NOT NULL,
    requested_by      TEXT NOT NULL,
    created_at        TEXT NOT NULL,
    state             TEXT NOT NULL,
    decided_by        TEXT,
    decided_at        TEXT,
    reject_reason     TEXT,
    job_id            TEXT,
    received_seq      {INT} NOT NULL
);
-- The permits a job's freeze found active: the job cannot leave FROZEN until each is released
-- or confirmed cancelled.
CREATE TABLE IF NOT EXISTS drain (
    job_id    TEXT NOT NULL,
    permit_id {INT} NOT NULL REFERENCES permits (permit_id),
    PRIMARY KEY (job_id, permit_id)
);
"#;

/// The gate's hot paths on PostgreSQL, each one statement (one round trip, one transaction).
/// They take per-scope advisory locks instead of the journal's one write lock, so permits for
/// different subjects do not queue behind each other, while a freeze (which takes the same
/// locks exclusively) still linearizes with every permit and lease of its scope:
/// - class 1818588264, key hashtext(tenant): shared by every gate operation of the tenant,
///   exclusive for a tenant-scope freeze;
/// - class 1818588265, key hashtext(tenant, US, subject): shared by permits and leases,
///   exclusive for a subject- or memory-scope freeze.
///
/// A hash collision only makes two scopes queue behind each other. Every statement inside a
/// VOLATILE plpgsql function takes a new snapshot, so what runs after the lock sees every
/// freeze that committed before the lock was granted.
const PG_GATE_FUNCTIONS: [&str; 4] = [
    r#"CREATE OR REPLACE FUNCTION lethe_gate_lock(p_tenant TEXT, p_subject TEXT, p_exclusive BOOLEAN)
RETURNS VOID LANGUAGE plpgsql AS $f$
BEGIN
    IF p_subject = '' AND p_exclusive THEN
        PERFORM pg_advisory_xact_lock(1818588264, hashtext(p_tenant));
        RETURN;
    END IF;
    PERFORM pg_advisory_xact_lock_shared(1818588264, hashtext(p_tenant));
    IF p_subject <> '' THEN
        IF p_exclusive THEN
            PERFORM pg_advisory_xact_lock(1818588265, hashtext(p_tenant || chr(31) || p_subject));
        ELSE
            PERFORM pg_advisory_xact_lock_shared(1818588265, hashtext(p_tenant || chr(31) || p_subject));
        END IF;
    END IF;
END $f$"#,
    // Takes permits, one per (lease, sink) pair, and ends permits, one per (permit, state)
    // pair ('released' or 'cancelled'), in one transaction. Returns one result per request,
    // takes first, in order: a take's new permit id or refusal code (-1 no such lease,
    // -2 revoked, -3 expired, -4 stale epoch, -5 fenced, -6 tombstoned, -7 key used), then an end's 1, or 0
    // if the permit was not active. `lethe serve` sends the gate requests that arrive while
    // its connection is busy in one call (one commit, one WAL flush for them all); the journal
    // sends one permit at a time. First the locks of every lease's scope, shared, in one
    // global order (every tenant key ascending, then every subject key ascending; a freeze
    // takes at most one of each, tenant first), so no two transactions wait on each other in
    // a cycle; then each take is checked and registered in a statement of its own (a new
    // snapshot: it sees every freeze that committed before the locks were granted). A lease
    // the first statement did not see (created since) was not locked, and is refused. (One
    // statement for all takes was measured too: cheaper from about four takes a batch, dearer
    // below, and it needs a generic plan forced.)
    //
    // A take with a key (p_keys[n], NULL for none) that a permit of the same lease already
    // carries returns that permit, whatever the fence now says: it is the same take sent again
    // after its answer was lost, and its permit was issued (and, if a freeze came since, is in
    // its drain set). The unique index makes two sendings racing one permit: the second's
    // insert finds the first's row and returns it.
    r#"CREATE OR REPLACE FUNCTION lethe_gate_batch(p_leases BIGINT[], p_sinks TEXT[], p_keys TEXT[], p_now BIGINT, p_ends BIGINT[], p_end_states TEXT[], p_end_keys TEXT[])
RETURNS BIGINT[] LANGUAGE plpgsql AS $f$
#variable_conflict use_column
DECLARE
    seen BIGINT[];
    ids BIGINT[] := '{}';
    p_lease BIGINT;
    p_sink TEXT;
    p_key TEXT;
    id BIGINT;
    found_id BIGINT;
    found_state TEXT;
    found_sink TEXT;
    changed BIGINT;
BEGIN
    -- Ends alone need not wait for the WAL flush: losing one in a crash leaves the permit
    -- active, which keeps a job BLOCKED (safe), and the next synchronous commit flushes it.
    IF p_leases = '{}' THEN
        PERFORM set_config('synchronous_commit', 'off', true);
    END IF;
    WITH ls AS MATERIALIZED (
            SELECT l.lease_id, l.tenant, l.subject FROM leases l WHERE l.lease_id = ANY(p_leases)),
         k AS (SELECT 1818588264 AS c, hashtext(ls.tenant) AS key FROM ls
               UNION SELECT 1818588265, hashtext(ls.tenant || chr(31) || ls.subject) FROM ls),
         locked AS (SELECT count(*) FILTER (WHERE pg_advisory_xact_lock_shared(o.c, o.key) IS NOT NULL) AS n
                      FROM (SELECT k.c, k.key FROM k ORDER BY k.c, k.key) o)
    SELECT array_agg(ls.lease_id) INTO seen FROM locked, ls;
    -- No lease seen: array_agg gives NULL, and `p_lease = ANY(NULL)` is NULL, not false, which
    -- would let a lease committed since through its checks with no lock held (version 5).
    seen := COALESCE(seen, '{}');
    FOR n IN 1 .. COALESCE(array_length(p_leases, 1), 0) LOOP
        p_lease := p_leases[n];
        p_sink := p_sinks[n];
        p_key := p_keys[n];
        -- After the locks, in one statement of its own (a new snapshot): every check, in the
        -- order the codes are documented, and the insert when all pass.
        WITH c AS (
            SELECT CASE
                     WHEN NOT (p_lease = ANY(seen)) THEN -1
                     WHEN l.revoked_by IS NOT NULL THEN -2
                     WHEN l.expires_ms <= p_now THEN -3
                     WHEN l.epoch <> COALESCE((SELECT e.epoch FROM epochs e WHERE e.tenant = l.tenant AND e.subject = l.subject), 0)
                       OR l.tenant_epoch <> COALESCE((SELECT e.epoch FROM epochs e WHERE e.tenant = l.tenant AND e.subject = ''), 0) THEN -4
                     WHEN EXISTS (SELECT 1 FROM fences f WHERE f.tenant = l.tenant AND f.subject IN (l.subject, '')) THEN -5
                     WHEN EXISTS (SELECT 1 FROM lease_reads r JOIN tombstones tb ON tb.memory_id = r.memory_id AND tb.version = r.version
                                   WHERE r.lease_id = l.lease_id AND tb.tenant = l.tenant AND tb.subject = l.subject) THEN -6
                     ELSE 0
                   END AS code
              FROM leases l WHERE l.lease_id = p_lease),
        ins AS (
            INSERT INTO permits (lease_id, sink, state, issued_ms, request_key)
            SELECT p_lease, p_sink, 'active', p_now, p_key FROM c WHERE c.code = 0
            ON CONFLICT (lease_id, request_key) DO NOTHING
            RETURNING permit_id)
        SELECT COALESCE((SELECT i.permit_id FROM ins i), (SELECT c.code FROM c), -1) INTO id;
        -- Only a take that found a permit with its key already (0: the insert was skipped), or
        -- was refused, looks for it: the first sending of a take costs no lookup. A new
        -- snapshot sees a sending that committed meanwhile. The permit found is returned only
        -- while active and for the same sink (the same take sent again); otherwise the key
        -- was reused (-7), which must not grant a permit no drain set tracks. A row gone since
        -- the conflict (swept: it had ended) is a reused key too.
        IF p_key IS NOT NULL AND id <= 0 THEN
            SELECT p.permit_id, p.state, p.sink INTO found_id, found_state, found_sink FROM permits p
             WHERE p.lease_id = p_lease AND p.request_key = p_key;
            IF found_id IS NOT NULL THEN
                id := CASE WHEN found_state = 'active' AND found_sink = p_sink THEN found_id ELSE -7 END;
            ELSIF id = 0 THEN
                id := -7;
            END IF;
        END IF;
        ids := ids || id;
    END LOOP;
    FOR n IN 1 .. COALESCE(array_length(p_ends, 1), 0) LOOP
        UPDATE permits SET state = p_end_states[n]
         WHERE permit_id = p_ends[n] AND state = 'active' AND request_key IS NOT DISTINCT FROM p_end_keys[n];
        GET DIAGNOSTICS changed = ROW_COUNT;
        ids := ids || changed;
    END LOOP;
    RETURN ids;
END $f$"#,
    // Ends an active permit (state 'released' or 'cancelled'); returns 1, or 0 if it was not
    // active. Its commit does not wait for the WAL flush: losing it in a server crash leaves
    // the permit active, which keeps a job BLOCKED (safe), and the next synchronous commit (a
    // freeze) flushes it anyway.
    r#"CREATE OR REPLACE FUNCTION lethe_end_permit(p_permit BIGINT, p_state TEXT, p_key TEXT)
RETURNS BIGINT LANGUAGE plpgsql AS $f$
DECLARE
    n BIGINT;
BEGIN
    PERFORM set_config('synchronous_commit', 'off', true);
    UPDATE permits SET state = p_state
     WHERE permit_id = p_permit AND state = 'active' AND request_key IS NOT DISTINCT FROM p_key;
    GET DIAGNOSTICS n = ROW_COUNT;
    RETURN n;
END $f$"#,
    // Returns (lease id, epoch, tenant epoch), or (-5, 0, 0) when fenced. p_reads is a JSON
    // array of [memory_id, version] pairs.
    r#"CREATE OR REPLACE FUNCTION lethe_take_lease(p_tenant TEXT, p_subject TEXT, p_expires BIGINT, p_reads TEXT)
RETURNS TABLE (lease_id BIGINT, epoch BIGINT, tenant_epoch BIGINT) LANGUAGE plpgsql AS $f$
#variable_conflict use_column
DECLARE
    e BIGINT;
    te BIGINT;
    id BIGINT;
BEGIN
    PERFORM lethe_gate_lock(p_tenant, p_subject, false);
    IF EXISTS (SELECT 1 FROM fences f WHERE f.tenant = p_tenant AND f.subject IN (p_subject, '')) THEN
        RETURN QUERY SELECT CAST(-5 AS BIGINT), CAST(0 AS BIGINT), CAST(0 AS BIGINT);
        RETURN;
    END IF;
    e := COALESCE((SELECT x.epoch FROM epochs x WHERE x.tenant = p_tenant AND x.subject = p_subject), 0);
    te := COALESCE((SELECT x.epoch FROM epochs x WHERE x.tenant = p_tenant AND x.subject = ''), 0);
    INSERT INTO leases (tenant, subject, epoch, tenant_epoch, expires_ms)
        VALUES (p_tenant, p_subject, e, te, p_expires) RETURNING leases.lease_id INTO id;
    INSERT INTO lease_reads (lease_id, memory_id, version)
        SELECT id, r ->> 0, r ->> 1 FROM jsonb_array_elements(CAST(p_reads AS jsonb)) AS r
        ON CONFLICT DO NOTHING;
    RETURN QUERY SELECT id, e, te;
END $f$"#,
];

/// Tables only PostgreSQL has.
const PG_TABLES: &str = r#"
-- A target's frozen locators, one row per inventory or extension of it: a locator's allowance is
-- the sum of its rows over the parts.
CREATE TABLE IF NOT EXISTS inventory_parts (
    job_id   TEXT NOT NULL,
    target   TEXT NOT NULL,
    part     BIGINT GENERATED BY DEFAULT AS IDENTITY,
    locators TEXT[] NOT NULL,
    rows     BIGINT[] NOT NULL,
    PRIMARY KEY (job_id, target, part)
);
ALTER TABLE inventory_parts ALTER COLUMN locators SET STORAGE EXTERNAL;
ALTER TABLE inventory_parts ALTER COLUMN rows SET STORAGE EXTERNAL;
"#;

/// Creates what is missing. Runs inside a write transaction, so concurrent openers serialize.
pub(crate) fn migrate(tx: &mut dyn Tx, dialect: Dialect) -> Result<(), String> {
    let (ddl, functions) = schema_text(dialect);
    let fingerprint = fingerprint(&ddl, functions);
    if is_current(tx, dialect, &fingerprint)? {
        return Ok(());
    }
    for stmt in ddl.split(';').map(str::trim).filter(|s| !s.is_empty()) {
        tx.exec(stmt, &[])?;
    }
    upgrade_permits(tx, dialect)?;
    for f in functions {
        tx.exec(f, &[])?;
    }
    if let Dialect::Postgres = dialect {
        // A Lethe older than version 3 that completed a job knew nothing of its parts and left
        // them; completion drops a job's locators, so any still here are such leftovers.
        tx.exec(
            "DELETE FROM inventory_parts WHERE job_id IN \
             (SELECT j.job_id FROM jobs j WHERE j.state = 'COMPLETE')",
            &[],
        )?;
    }
    tx.exec(
        "INSERT INTO lethe_meta (k, v) VALUES ('schema_version', $1) ON CONFLICT (k) DO UPDATE SET v = excluded.v",
        &[V::T(VERSION.to_string())],
    )?;
    tx.exec(
        "INSERT INTO lethe_meta (k, v) VALUES ('schema_fingerprint', $1) \
         ON CONFLICT (k) DO UPDATE SET v = excluded.v",
        &[V::T(fingerprint)],
    )?;
    Ok(())
}

/// The dialect's DDL, without comments (they may hold a ';'), and its gate functions.
fn schema_text(dialect: Dialect) -> (String, &'static [&'static str]) {
    let (int, serial) = match dialect {
        Dialect::Sqlite => ("INTEGER", "INTEGER PRIMARY KEY AUTOINCREMENT"),
        Dialect::Postgres => (
            "BIGINT",
            "BIGINT GENERATED BY DEFAULT AS IDENTITY PRIMARY KEY",
        ),
    };
    // On SQLite the inventory is clustered on its key (`WITHOUT ROWID`): a table with a rowid
    // stores every locator twice, in the table and in its key's index, and a job writes,
    // deletes and checkpoints both (measured, bench/README.md "Redis"). A journal made before
    // keeps its table, which works the same.
    let without_rowid = match dialect {
        Dialect::Sqlite => " WITHOUT ROWID",
        Dialect::Postgres => "",
    };
    let ddl = TABLES
        .replace("{SERIAL}", serial)
        .replace("{INT}", int)
        .replace("{WITHOUT_ROWID}", without_rowid);
    // On PostgreSQL a target's frozen locators go in one row of two arrays (`inventory_parts`,
    // see `PgTx::insert_locators`), stored out of line and uncompressed; `inventory` stays for
    // jobs frozen before, and for SQLite.
    let ddl = match dialect {
        Dialect::Sqlite => ddl,
        Dialect::Postgres => ddl + PG_TABLES,
    };
    let ddl = ddl
        .lines()
        .filter(|l| !l.trim_start().starts_with("--"))
        .collect::<Vec<_>>()
        .join("\n");
    let functions: &'static [&'static str] = match dialect {
        Dialect::Sqlite => &[],
        Dialect::Postgres => &PG_GATE_FUNCTIONS,
    };
    (ddl, functions)
}

/// The schema's fingerprint: its DDL, its version and its functions. Any change to their text
/// changes it.
fn fingerprint(ddl: &str, functions: &[&str]) -> String {
    let mut h = Sha256::new();
    h.update(ddl.as_bytes());
    // The version too: a matching fingerprint then implies the same version, so the shortcut
    // in `is_current` never skips the version check.
    h.update(VERSION.to_string().as_bytes());
    for f in functions {
        h.update(f.as_bytes());
    }
    hex::encode(h.finalize())
}

/// Whether the store records this exact schema, so no DDL runs. Skipping it matters on
/// PostgreSQL, where every `CREATE OR REPLACE FUNCTION` rewrites the catalog and makes every
/// other session (a running `lethe serve`) re-plan the gate functions, and each open paid for
/// some 25 DDL statements. Refuses a schema a newer Lethe wrote, or a version no Lethe wrote.
fn is_current(tx: &mut dyn Tx, dialect: Dialect, fingerprint: &str) -> Result<bool, String> {
    let meta_exists = match dialect {
        Dialect::Sqlite => tx
            .row(
                "SELECT 1 FROM sqlite_master WHERE type = 'table' AND name = 'lethe_meta'",
                &[],
            )?
            .is_some(),
        Dialect::Postgres => {
            tx.one(
                "SELECT CAST(to_regclass('lethe_meta') IS NOT NULL AS INTEGER)",
                &[],
            )?
            .i() == Some(1)
        }
    };
    if !meta_exists {
        return Ok(false);
    }
    let recorded = tx.row(
        "SELECT v FROM lethe_meta WHERE k = 'schema_fingerprint'",
        &[],
    )?;
    if recorded.is_some_and(|r| r[0].text() == fingerprint) {
        return Ok(true);
    }
    // A recorded version that is not a number was not written by any Lethe: refuse it rather
    // than read it as "no version" and migrate over it.
    let version = match tx.row("SELECT v FROM lethe_meta WHERE k = 'schema_version'", &[])? {
        None => None,
        Some(r) => Some(r[0].text().parse::<i64>().map_err(|_| {
            "this journal's recorded schema version is not a number; it was not written \
             by Lethe, so it is left as it is (check the journal's lethe_meta table)"
                .to_string()
        })?),
    };
    if let Some(v) = version.filter(|v| *v > VERSION) {
        return Err(format!(
            "this journal's schema is version {v}, newer than this Lethe's ({VERSION}): \
             a newer Lethe uses it; upgrade this one (every process sharing a journal runs \
             the same version)"
        ));
    }
    Ok(false)
}

/// Version 4: a permit's request key, on a permits table made before, and the index by lease
/// that is unique with it.
fn upgrade_permits(tx: &mut dyn Tx, dialect: Dialect) -> Result<(), String> {
    match dialect {
        Dialect::Sqlite => {
            let has_key =
                tx.one(
                    "SELECT count(*) FROM pragma_table_info('permits') WHERE name = 'request_key'",
                    &[],
                )?
                .i() == Some(1);
            if !has_key {
                tx.exec("ALTER TABLE permits ADD COLUMN request_key TEXT", &[])?;
            }
        }
        Dialect::Postgres => {
            tx.exec(
                "ALTER TABLE permits ADD COLUMN IF NOT EXISTS request_key TEXT",
                &[],
            )?;
            // Version 3's, without the keys: replaced, not overloaded.
            for old in [
                "lethe_gate_batch(BIGINT[], TEXT[], BIGINT, BIGINT[], TEXT[])",
                "lethe_gate_batch(BIGINT[], TEXT[], TEXT[], BIGINT, BIGINT[], TEXT[])",
                "lethe_end_permit(BIGINT, TEXT)",
            ] {
                tx.exec(&format!("DROP FUNCTION IF EXISTS {old}"), &[])?;
            }
        }
    }
    // One index by lease, unique with the key (NULLs are distinct: unkeyed permits pass). It
    // replaces version 3's (lease_id, state): with no index on `state`, a release can update
    // its row in place on PostgreSQL (a HOT update, no index entry written), which pays for
    // the key's index entry at the take (measured, bench/README.md "Gate").
    tx.exec("DROP INDEX IF EXISTS permits_lease", &[])?;
    tx.exec(
        "CREATE UNIQUE INDEX IF NOT EXISTS permits_request_key ON permits (lease_id, request_key)",
        &[],
    )?;
    Ok(())
}
