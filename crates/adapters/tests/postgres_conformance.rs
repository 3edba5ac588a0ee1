//! The conformance suite on LangGraph's PostgreSQL schema, on PostgreSQL 15 (no vector index)
//! and PostgreSQL 18 with pgvector (`store_vectors` populated), against data written by real
//! LangGraph (`scripts/pg seed-small`, run by `scripts/test` into a template database). Each test
//! clones its own database from the template.
//!
//! Environment (set by scripts/test; defaults in brackets): LETHE_PG15_URL
//! [postgres://postgres@127.0.0.1:5432/postgres], LETHE_PG18_URL [...:54318/postgres],
//! LETHE_PG_TEMPLATE [lethe_tpl], LETHE_PG15_MANIFEST / LETHE_PG18_MANIFEST
//! [target/pg{15,18}-manifest.json].
//!
//! TLS and password checks run against the TLS-only server of `scripts/pg start-tls`:
//! LETHE_PG_TLS_URL [postgres://postgres@127.0.0.1:54319/postgres], LETHE_PG_TLS_CA
//! [/var/tmp/lethe-pgtls.certs/ca.pem], LETHE_PG_TLS_PASSWORD_FILE
//! [/var/tmp/lethe-pgtls.certs/lethe_app.password], LETHE_PG_TLS_MANIFEST
//! [target/pgtls-manifest.json].

use std::collections::HashMap;
use std::path::Path;
use std::sync::atomic::{AtomicUsize, Ordering};

use lethe_adapters::conformance::{self, Case, Row};
use lethe_adapters::{Adapter, AdapterError, Applicability, Target};
use lethe_core::{MemoryId, Scope, Subject, Tenant, Version};
use postgres::Client;

/// Opens a test's own connection the way Lethe does (`sslmode` and `sslrootcert` honoured), so
/// the same helpers reach the plain servers and the TLS-only one.
fn connect(url: &str) -> Result<Client, postgres::Error> {
    lethe_postgres::Settings::from_url(url, Path::new("."))
        .expect("a valid test URL")
        .connect()
}

struct Server {
    admin: String,
    manifest: serde_json::Value,
}

fn server(version: u32) -> Server {
    let default_port = if version == 15 { 5432 } else { 54318 };
    let admin = std::env::var(format!("LETHE_PG{version}_URL"))
        .unwrap_or_else(|_| format!("postgres://postgres@127.0.0.1:{default_port}/postgres"));
    load_server(admin, &version.to_string())
}

/// The TLS-only server, its admin URL checked with `verify-full` against its CA.
fn tls_server() -> Server {
    let admin = std::env::var("LETHE_PG_TLS_URL")
        .unwrap_or_else(|_| "postgres://postgres@127.0.0.1:54319/postgres".into());
    load_server(
        format!("{admin}?sslmode=verify-full&sslrootcert={}", tls_ca()),
        "_TLS",
    )
}

fn tls_ca() -> String {
    std::env::var("LETHE_PG_TLS_CA").unwrap_or_else(|_| "/var/tmp/lethe-pgtls.certs/ca.pem".into())
}

fn load_server(admin: String, version: &str) -> Server {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("../..");
    let file = format!(
        "pg{}-manifest.json",
        version.trim_start_matches('_').to_lowercase()
    );
    let path = std::env::var(format!("LETHE_PG{version}_MANIFEST"))
        .map(Into::into)
        .unwrap_or_else(|_| root.join(format!("target/{file}")));
    let text = std::fs::read_to_string(&path).unwrap_or_else(|e| {
        panic!(
            "{}: {e}; run scripts/test, which seeds PostgreSQL {version} through real LangGraph",
            path.display()
        )
    });
    Server {
        admin,
        manifest: serde_json::from_str(&text).unwrap(),
    }
}

/// A database cloned from the template, dropped at the end.
struct Db {
    admin: String,
    name: String,
    url: String,
}

static COUNTER: AtomicUsize = AtomicUsize::new(0);

impl Db {
    fn new(s: &Server) -> Self {
        let template = std::env::var("LETHE_PG_TEMPLATE").unwrap_or_else(|_| "lethe_tpl".into());
        let name = format!(
            "lethe_t_{}_{}",
            std::process::id(),
            COUNTER.fetch_add(1, Ordering::SeqCst)
        );
        let mut admin = connect(&s.admin).expect("PostgreSQL reachable (scripts/test starts it)");
        // Clones serialize on the template; retry while another clone holds it.
        for attempt in 0.. {
            match admin.batch_execute(&format!("CREATE DATABASE {name} TEMPLATE {template}")) {
                Ok(()) => break,
                Err(e) if attempt < 50 && e.to_string().contains("being accessed") => {
                    std::thread::yield_now()
                }
                Err(e) => panic!("cloning the template: {e}"),
            }
        }
        let (head, query) = s.admin.split_once('?').unwrap_or((&s.admin, ""));
        let url = match head.rsplit_once('/') {
            Some((base, _)) if query.is_empty() => format!("{base}/{name}"),
            Some((base, _)) => format!("{base}/{name}?{query}"),
            None => unreachable!("admin URL names a database"),
        };
        Db {
            admin: s.admin.clone(),
            name,
            url,
        }
    }

    fn client(&self) -> Client {
        connect(&self.url).unwrap()
    }
}

impl Drop for Db {
    fn drop(&mut self) {
        if let Ok(mut c) = connect(&self.admin) {
            let _ = c.batch_execute(&format!(
                "DROP DATABASE IF EXISTS {} WITH (FORCE)",
                self.name
            ));
        }
    }
}

fn target(toml_text: &str) -> Target {
    lethe_adapters::build(1, toml::from_str(toml_text).unwrap(), Path::new(".")).unwrap()
}

fn checkpointer(db: &Db) -> Target {
    checkpointer_with(db, "public.thread_registry", true)
}

/// The checkpointer with its registry in `table`, with or without the metadata keys.
fn checkpointer_with(db: &Db, table: &str, metadata: bool) -> Target {
    let metadata = if metadata {
        r#"metadata = { tenant = "tenant_id", subject = "user_id" }"#
    } else {
        ""
    };
    target(&format!(
        r#"
name = "checkpoints"
kind = "langgraph-postgres-checkpointer"
class = "primary"
url = "{}"
registry = {{ table = "{table}", tenant = "tenant_id", subject = "user_id", thread = "thread_id" }}
{metadata}
"#,
        db.url
    ))
}

fn store(db: &Db) -> Target {
    target(&format!(
        r#"
name = "memories"
kind = "langgraph-postgres-store"
class = "primary"
url = "{}"
namespace = ["{{tenant}}", "{{subject}}"]
"#,
        db.url
    ))
}

fn none() -> (String, String) {
    (String::new(), String::new())
}

/// Every row of a table as its text form (`row::text`: every column, bytea as hex), with an
/// owner computed by `owner` from the row.
fn dump(
    c: &mut Client,
    table: &str,
    owner_cols: &str,
    owner: &dyn Fn(&postgres::Row) -> (String, String),
) -> Vec<Row> {
    let exists: bool = c
        .query_one("SELECT to_regclass($1) IS NOT NULL", &[&table])
        .unwrap()
        .get(0);
    if !exists {
        return Vec::new();
    }
    let mut rows: Vec<Row> = c
        .query(&format!("SELECT t::text, {owner_cols} FROM {table} t"), &[])
        .unwrap()
        .iter()
        .map(|r| Row {
            table: table.to_string(),
            bytes: r.get::<_, String>(0).into_bytes(),
            owner: owner(r),
        })
        .collect();
    rows.sort();
    rows
}

struct CheckpointerCase<'a> {
    db: &'a Db,
    adapter: Target,
    threads: HashMap<String, (String, String)>,
}

impl Case for CheckpointerCase<'_> {
    fn adapter(&self) -> &dyn Adapter {
        self.adapter.adapter.as_ref()
    }
    fn snapshot(&self) -> Vec<Row> {
        let mut c = self.db.client();
        let by_thread = |r: &postgres::Row| {
            self.threads
                .get(&r.get::<_, String>(1))
                .cloned()
                .unwrap_or_else(none)
        };
        let mut rows = Vec::new();
        for t in ["checkpoints", "checkpoint_blobs", "checkpoint_writes"] {
            rows.extend(dump(&mut c, t, "thread_id", &by_thread));
        }
        rows.extend(dump(
            &mut c,
            "thread_registry",
            "tenant_id, user_id",
            &|r| (r.get(1), r.get(2)),
        ));
        rows.extend(dump(&mut c, "checkpoint_migrations", "1", &|_| none()));
        rows.sort();
        rows
    }
}

struct StoreCase<'a> {
    db: &'a Db,
    adapter: Target,
}

fn label_owner(r: &postgres::Row) -> (String, String) {
    let prefix: String = r.get(1);
    let mut l = prefix.split('.');
    (
        l.next().unwrap_or("").to_string(),
        l.next().unwrap_or("").to_string(),
    )
}

impl Case for StoreCase<'_> {
    fn adapter(&self) -> &dyn Adapter {
        self.adapter.adapter.as_ref()
    }
    fn snapshot(&self) -> Vec<Row> {
        let mut c = self.db.client();
        let mut rows = dump(&mut c, "store", "prefix", &label_owner);
        rows.extend(dump(&mut c, "store_vectors", "prefix", &label_owner));
        rows.extend(dump(&mut c, "store_migrations", "1", &|_| none()));
        rows.sort();
        rows
    }
}

fn thread_owners(m: &serde_json::Value) -> HashMap<String, (String, String)> {
    let mut out = HashMap::new();
    for s in m["subjects"].as_array().unwrap() {
        let o = (
            s["tenant_id"].as_str().unwrap().to_string(),
            s["user_id"].as_str().unwrap().to_string(),
        );
        for t in s["threads"].as_array().unwrap() {
            out.insert(t["thread_id"].as_str().unwrap().to_string(), o.clone());
        }
    }
    out
}

/// The id of a checkpointer inventory's first thread that has rows (its locator is `0:<id>`).
fn a_thread_with_rows(inv: &lethe_adapters::Inventory) -> String {
    inv.locators
        .iter()
        .find(|(l, n)| l.starts_with("0:") && *n > 0)
        .expect("a thread with rows")
        .0[2..]
        .to_string()
}

fn subject_scope(t: &str, s: &str) -> Scope {
    Scope::Subject {
        tenant: Tenant::new(t).unwrap(),
        subject: Subject::new(s).unwrap(),
    }
}

fn erase_every_subject(version: u32) {
    let srv = server(version);
    let subjects = srv.manifest["subjects"].as_array().unwrap().clone();
    assert!(subjects.len() >= 10);
    for s in &subjects {
        let (t, u) = (
            s["tenant_id"].as_str().unwrap(),
            s["user_id"].as_str().unwrap(),
        );
        let db = Db::new(&srv);
        let scope = subject_scope(t, u);
        let me = (t.to_string(), u.to_string());
        let in_scope = |o: &(String, String)| *o == me;
        let counts = &s["counts"];
        let n = |k: &str| counts[k].as_u64().unwrap();

        let case = CheckpointerCase {
            db: &db,
            adapter: checkpointer(&db),
            threads: thread_owners(&srv.manifest),
        };
        let out = conformance::run(&case, &scope, &in_scope, 2);
        assert_eq!(
            out.inventoried,
            n("checkpoints_rows")
                + n("checkpoint_blobs_rows")
                + n("checkpoint_writes_rows")
                + n("registry_rows")
        );

        let case = StoreCase {
            db: &db,
            adapter: store(&db),
        };
        let out = conformance::run(&case, &scope, &in_scope, 2);
        assert_eq!(
            out.inventoried,
            n("store_rows") + n("store_vectors_rows"),
            "expired items and vectors are counted"
        );
    }
}

#[test]
fn pg15_erases_each_subject_exactly_and_keeps_the_others_byte_for_byte() {
    erase_every_subject(15);
}

#[test]
fn pg18_with_pgvector_erases_each_subject_and_its_vectors_exactly() {
    let srv = server(18);
    let vectors: u64 = srv.manifest["subjects"]
        .as_array()
        .unwrap()
        .iter()
        .map(|s| s["counts"]["store_vectors_rows"].as_u64().unwrap())
        .sum();
    assert!(
        vectors > 0,
        "the PostgreSQL 18 template has store_vectors rows"
    );
    erase_every_subject(18);
}

#[test]
fn tenant_scope_takes_the_tenant_and_never_its_prefix_neighbour() {
    for v in [15, 18] {
        let srv = server(v);
        let db = Db::new(&srv);
        let scope = Scope::Tenant {
            tenant: Tenant::new("a").unwrap(),
        };
        let in_scope = |o: &(String, String)| o.0 == "a";
        let case = CheckpointerCase {
            db: &db,
            adapter: checkpointer(&db),
            threads: thread_owners(&srv.manifest),
        };
        conformance::run(&case, &scope, &in_scope, 3);
        let case = StoreCase {
            db: &db,
            adapter: store(&db),
        };
        conformance::run(&case, &scope, &in_scope, 3);
        let left = store(&db)
            .adapter
            .inventory(&Scope::Tenant {
                tenant: Tenant::new("ab").unwrap(),
            })
            .unwrap();
        assert!(left.count > 0, "tenant ab is untouched");
    }
}

#[test]
fn memory_scope_erases_one_item_and_its_vectors() {
    let srv = server(18);
    let db = Db::new(&srv);
    let st = store(&db);
    let mut c = db.client();
    let key: String = c
        .query_one(
            "SELECT s.key FROM store s WHERE s.prefix = 'acme.alice.memories'
               AND EXISTS (SELECT 1 FROM store_vectors v WHERE v.prefix = s.prefix AND v.key = s.key) ORDER BY s.key LIMIT 1",
            &[],
        )
        .unwrap()
        .get(0);
    let mk = |v: Option<String>| Scope::Memory {
        tenant: Tenant::new("acme").unwrap(),
        subject: Subject::new("alice").unwrap(),
        memory: MemoryId::new(format!("memories/{key}")).unwrap(),
        version: v.map(|v| Version::new(v).unwrap()),
    };
    let version = st
        .adapter
        .current_version(&mk(None))
        .unwrap()
        .expect("the item exists");
    assert!(version.as_str().ends_with('Z'), "UTC version");
    assert_eq!(
        st.adapter
            .inventory(&mk(Some("1999-01-01T00:00:00.000000Z".into())))
            .unwrap()
            .count,
        0,
        "another version is not in scope"
    );
    let scope = mk(Some(version.as_str().to_string()));
    let case = StoreCase {
        db: &db,
        adapter: store(&db),
    };
    let before = case.snapshot();
    let inv = st.adapter.inventory(&scope).unwrap();
    assert!(inv.count >= 2, "item and vectors");
    assert_eq!(
        st.adapter.erase_batch(&scope, &inv.locators).unwrap(),
        inv.count
    );
    assert_eq!(st.adapter.verify(&scope, &inv.locators).unwrap(), 0);
    let item = format!("(acme.alice.memories,{key},");
    conformance::assert_only_removed(&before, &case.snapshot(), inv.count as usize, &|r| {
        String::from_utf8_lossy(&r.bytes).starts_with(&item)
    });
}

#[test]
fn a_writer_during_the_erase_is_stopped_not_chased() {
    // Another connection keeps writing checkpoints into one of alice's frozen threads while the
    // erase runs. Whatever the interleaving, Lethe never deletes more than the inventory: the
    // batch either rolls back (anomalous volume) or deletes exactly the frozen rows, and the
    // late rows are then residue that verification reports.
    for v in [15, 18] {
        let srv = server(v);
        let db = Db::new(&srv);
        let cp = checkpointer(&db);
        let scope = subject_scope("acme", "alice");
        let inv = cp.adapter.inventory(&scope).unwrap();
        let thread = a_thread_with_rows(&inv);
        let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
        let writer = {
            let (url, stop, thread) = (db.url.clone(), stop.clone(), thread.clone());
            std::thread::spawn(move || {
                let mut c = connect(&url).unwrap();
                let mut i = 0;
                while !stop.load(Ordering::SeqCst) && i < 10_000 {
                    c.execute(
                        "INSERT INTO checkpoints (thread_id, checkpoint_ns, checkpoint_id, checkpoint, metadata)
                         VALUES ($1, '', $2, '{}', '{\"tenant_id\": \"acme\", \"user_id\": \"alice\"}')",
                        &[&thread, &format!("late-{i}")],
                    )
                    .unwrap();
                    i += 1;
                }
                i
            })
        };
        // Let the writer get going: wait until it has written at least one row.
        let mut c = db.client();
        while c
            .query_one(
                "SELECT count(*) FROM checkpoints WHERE checkpoint_id LIKE 'late-%'",
                &[],
            )
            .unwrap()
            .get::<_, i64>(0)
            == 0
        {
            std::thread::yield_now();
        }
        let expected: u64 = inv
            .locators
            .iter()
            .filter(|(l, _)| l.starts_with("0:"))
            .map(|(_, n)| n)
            .sum();
        let threads: Vec<_> = inv
            .locators
            .iter()
            .filter(|(l, _)| l.starts_with("0:"))
            .cloned()
            .collect();
        match cp.adapter.erase_batch(&scope, &threads) {
            Err(AdapterError::AnomalousVolume {
                expected: e, found, ..
            }) => assert!(found > e),
            Ok(n) => assert!(n <= expected, "deleted {n} > inventory {expected}"),
            Err(e) => panic!("unexpected {e}"),
        }
        stop.store(true, Ordering::SeqCst);
        assert!(writer.join().unwrap() > 0);
        assert!(
            cp.adapter.verify(&scope, &inv.locators).unwrap() > 0,
            "the late rows are residue, reported"
        );
    }
}

#[test]
fn a_thread_whose_checkpoints_name_two_owners_is_refused_and_nothing_is_touched() {
    // One checkpoint of one of alice's threads says it is bob's (same tenant), or names another
    // tenant: erasing alice's threads would erase it. The inventory refuses, naming no one.
    for (v, metadata) in [
        (15, r#"{"tenant_id": "acme", "user_id": "bob"}"#),
        (18, r#"{"tenant_id": "globex", "user_id": "alice"}"#),
        // Another subject and no tenant key: another owner's checkpoint all the same.
        (15, r#"{"user_id": "bob"}"#),
    ] {
        let srv = server(v);
        let db = Db::new(&srv);
        let case = CheckpointerCase {
            db: &db,
            adapter: checkpointer(&db),
            threads: thread_owners(&srv.manifest),
        };
        let scope = subject_scope("acme", "alice");
        let thread = a_thread_with_rows(&case.adapter.adapter.inventory(&scope).unwrap());
        let n = db
            .client()
            .execute(
                "UPDATE checkpoints SET metadata = $2::text::jsonb
                  WHERE (thread_id, checkpoint_ns, checkpoint_id) =
                        (SELECT thread_id, checkpoint_ns, checkpoint_id FROM checkpoints
                          WHERE thread_id = $1 ORDER BY checkpoint_id LIMIT 1)",
                &[&thread, &metadata],
            )
            .unwrap();
        assert_eq!(n, 1);
        let before = case.snapshot();
        // Refused for alice, and for the other owner, whose scope now reaches the thread
        // through that checkpoint's metadata.
        let other: serde_json::Value = serde_json::from_str(metadata).unwrap();
        let scopes = match other["tenant_id"].as_str() {
            Some(t) => vec![
                scope.clone(),
                subject_scope(t, other["user_id"].as_str().unwrap()),
            ],
            // Without a tenant the checkpoint names no owner a scope reaches it by.
            None => vec![scope.clone()],
        };
        for s in &scopes {
            match case.adapter.adapter.inventory(s) {
                Err(AdapterError::Failed { why, .. }) => {
                    assert!(
                        why.contains("checkpoints whose metadata names another owner"),
                        "{why}"
                    );
                    for id in ["alice", "bob", "acme", "globex"] {
                        assert!(!why.contains(id), "no identifier in the error: {why}");
                    }
                }
                other => panic!("PostgreSQL {v}: expected a refusal, got {other:?}"),
            }
        }
        assert!(case.snapshot() == before, "PostgreSQL {v}: nothing touched");
    }
}

#[test]
fn identifiers_with_like_metacharacters_match_only_themselves() {
    // `u_0` as a raw LIKE pattern would match `u10`; `u%` would match everything under `a.u`.
    let srv = server(15);
    let db = Db::new(&srv);
    let st = store(&db);
    for (victim, neighbour) in [("u_0", "u10"), ("u%", "u1")] {
        let before = st
            .adapter
            .inventory(&subject_scope("a", neighbour))
            .unwrap();
        assert!(before.count > 0);
        let inv = st.adapter.inventory(&subject_scope("a", victim)).unwrap();
        assert!(inv.count > 0, "the fixture has {victim}");
        st.adapter
            .erase_batch(&subject_scope("a", victim), &inv.locators)
            .unwrap();
        assert_eq!(
            st.adapter
                .inventory(&subject_scope("a", neighbour))
                .unwrap(),
            before,
            "{neighbour} untouched by erasing {victim}"
        );
    }
}

#[test]
fn unreachable_database_is_retryable() {
    let t = target(
        r#"
name = "memories"
kind = "langgraph-postgres-store"
class = "primary"
url = "postgres://postgres@127.0.0.1:1/nowhere"
namespace = ["{tenant}", "{subject}"]
"#,
    );
    match t.adapter.probe() {
        Err(e @ AdapterError::Unavailable { .. }) => {
            assert!(e.is_retryable());
            assert!(e.to_string().contains("memories"), "names the target: {e}");
        }
        other => panic!("expected Unavailable, got {other:?}"),
    }
}

// ------------------------------------------------------------------ TLS and passwords
// Against `scripts/pg start-tls`: a server that refuses plain text (`hostnossl ... reject`),
// whose certificate names localhost and 127.0.0.1 but not 127.0.0.2 (it listens on both), and
// whose role `lethe_app` must send its password (scram-sha-256).

fn tls_password_file() -> String {
    std::env::var("LETHE_PG_TLS_PASSWORD_FILE")
        .unwrap_or_else(|_| "/var/tmp/lethe-pgtls.certs/lethe_app.password".into())
}

/// The URL of `db` on the TLS server, without options.
fn tls_db_url(db: &Db) -> String {
    db.url
        .split_once('?')
        .map_or(&*db.url, |(h, _)| h)
        .to_string()
}

/// A store target at `url`, with an optional password file.
fn store_at(url: &str, password_file: Option<&str>) -> Target {
    let pw = password_file
        .map(|p| format!("password_file = \"{p}\"\n"))
        .unwrap_or_default();
    target(&format!(
        r#"
name = "memories"
kind = "langgraph-postgres-store"
class = "primary"
url = "{url}"
{pw}namespace = ["{{tenant}}", "{{subject}}"]
"#
    ))
}

#[test]
fn verify_full_over_tls_as_a_password_checked_role_erases_one_subject_and_keeps_the_others() {
    let srv = tls_server();
    let db = Db::new(&srv);
    db.client()
        .batch_execute(
            "GRANT SELECT, INSERT, UPDATE, DELETE ON ALL TABLES IN SCHEMA public TO lethe_app",
        )
        .unwrap();
    let url = format!(
        "{}?sslmode=verify-full&sslrootcert={}",
        tls_db_url(&db).replacen("://postgres@", "://lethe_app@", 1),
        tls_ca()
    );
    let pw = tls_password_file();
    let checkpoints = target(&format!(
        r#"
name = "checkpoints"
kind = "langgraph-postgres-checkpointer"
class = "primary"
url = "{url}"
password_file = "{pw}"
registry = {{ table = "public.thread_registry", tenant = "tenant_id", subject = "user_id", thread = "thread_id" }}
metadata = {{ tenant = "tenant_id", subject = "user_id" }}
"#
    ));
    let scope = subject_scope("acme", "alice");
    let me = ("acme".to_string(), "alice".to_string());
    let in_scope = |o: &(String, String)| *o == me;
    let case = CheckpointerCase {
        db: &db,
        adapter: checkpoints,
        threads: thread_owners(&srv.manifest),
    };
    let out = conformance::run(&case, &scope, &in_scope, 2);
    assert!(out.inventoried > 0, "alice has checkpoints");
    let case = StoreCase {
        db: &db,
        adapter: store_at(&url, Some(&pw)),
    };
    let out = conformance::run(&case, &scope, &in_scope, 2);
    assert!(out.inventoried > 0, "alice has store items");
    // The role really is lethe_app, over TLS.
    let mut c = connect(&db.url).unwrap();
    let n: i64 = c
        .query_one(
            "SELECT count(*) FROM pg_stat_activity a JOIN pg_stat_ssl s USING (pid)
              WHERE a.usename = 'lethe_app' AND a.datname = current_database() AND s.ssl",
            &[],
        )
        .unwrap()
        .get(0);
    assert!(
        n >= 1,
        "the targets' connections are lethe_app's, encrypted"
    );
}

#[test]
fn sslmode_is_honoured_as_libpq_does_and_never_downgraded() {
    let srv = tls_server();
    let db = Db::new(&srv);
    let base = tls_db_url(&db);
    let ca = tls_ca();
    let other = Path::new(&ca).with_file_name("other-ca.pem");
    let other = other.display();
    let probe = |url: String| store_at(&url, None).adapter.probe();
    let refused = |url: String, why: &str| match probe(url.clone()) {
        Err(e) => {
            let m = e.to_string();
            assert!(m.contains("memories"), "names the target: {m}");
            assert!(m.contains(why), "{url}: expected '{why}' in: {m}");
        }
        Ok(()) => panic!("{url} connected"),
    };
    // The server refuses plain text, so every success below was encrypted.
    probe(format!("{base}?sslmode=verify-full&sslrootcert={ca}")).unwrap();
    probe(format!("{base}?sslmode=verify-ca&sslrootcert={ca}")).unwrap();
    probe(format!("{base}?sslmode=require")).unwrap();
    probe(base.clone()).unwrap(); // prefer, the default
    refused(format!("{base}?sslmode=disable"), "no encryption");
    // The wrong CA: refused under verify-*, and under require too once a root file is given.
    for mode in ["verify-full", "verify-ca", "require", "prefer"] {
        refused(
            format!("{base}?sslmode={mode}&sslrootcert={other}"),
            "certificate verify failed",
        );
    }
    // No sslrootcert under verify-*: the system's roots, which do not know the throwaway CA.
    for mode in ["verify-full", "verify-ca"] {
        refused(
            format!("{base}?sslmode={mode}"),
            "certificate verify failed",
        );
    }
    // The certificate names 127.0.0.1, not 127.0.0.2: only verify-full checks the name.
    let other_host = base.replacen("@127.0.0.1:", "@127.0.0.2:", 1);
    assert_ne!(other_host, base, "the TLS server is at 127.0.0.1");
    probe(format!("{other_host}?sslmode=verify-ca&sslrootcert={ca}")).unwrap();
    refused(
        format!("{other_host}?sslmode=verify-full&sslrootcert={ca}"),
        "certificate verify failed",
    );
    // A server without TLS (PostgreSQL 18 here): require is refused, prefer goes plain.
    let plain = server(18);
    let pdb = Db::new(&plain);
    assert!(!connect(&pdb.url)
        .unwrap()
        .query_one(
            "SELECT ssl FROM pg_stat_ssl WHERE pid = pg_backend_pid()",
            &[]
        )
        .unwrap()
        .get::<_, bool>(0));
    probe(format!("{}?sslmode=prefer", pdb.url)).unwrap();
    for mode in ["require", "verify-ca", "verify-full"] {
        refused(
            format!("{}?sslmode={mode}&sslrootcert={ca}", pdb.url),
            "TLS",
        );
    }
}

#[test]
fn a_wrong_password_is_refused_naming_the_target_and_never_the_password() {
    let srv = tls_server();
    let db = Db::new(&srv);
    let dir = tempfile::tempdir().unwrap();
    let wrong = dir.path().join("wrong.password");
    std::fs::write(&wrong, "not-the-password-7f3a\n").unwrap();
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(&wrong, std::fs::Permissions::from_mode(0o600)).unwrap();
    let url = format!(
        "{}?sslmode=verify-full&sslrootcert={}",
        tls_db_url(&db).replacen("://postgres@", "://lethe_app@", 1),
        tls_ca()
    );
    match store_at(&url, Some(&wrong.display().to_string()))
        .adapter
        .probe()
    {
        Err(e @ AdapterError::Failed { .. }) => {
            let m = e.to_string();
            assert!(m.contains("memories"), "names the target: {m}");
            assert!(m.contains("password authentication failed"), "{m}");
            assert!(!m.contains("not-the-password"), "no password: {m}");
            assert!(!e.is_retryable(), "a wrong password does not fix itself");
        }
        other => panic!("expected Failed, got {other:?}"),
    }
    // And the right one, read from its file, is accepted.
    store_at(&url, Some(&tls_password_file()))
        .adapter
        .probe()
        .unwrap();
}

/// A registry column with a nondeterministic collation (`Bob` equals `bob` under it) is compared
/// byte for byte; a thread the registry gives to two owners is refused for both.
#[test]
fn registry_rows_compare_bytes_and_a_thread_registered_to_two_owners_is_refused() {
    let srv = server(15);
    let db = Db::new(&srv);
    let mut c = db.client();
    c.batch_execute(
        "CREATE COLLATION ci (provider = icu, locale = 'und-u-ks-level2', deterministic = false);
         CREATE TABLE reg_ci (tenant_id text, user_id text COLLATE ci, thread_id text);
         INSERT INTO reg_ci SELECT tenant_id, user_id, thread_id FROM thread_registry;
         INSERT INTO reg_ci VALUES ('acme', 'Alice', 't-Alice-1'), ('acme', 'ALICE', 't-ALICE-1');
         CREATE INDEX ON reg_ci (tenant_id, user_id);",
    )
    .unwrap();
    let others = |c: &mut Client| -> Vec<String> {
        c.query(
            "SELECT concat_ws('|', tenant_id, user_id, thread_id) FROM reg_ci
              WHERE NOT (tenant_id = 'acme' AND user_id COLLATE \"C\" = 'alice') ORDER BY 1",
            &[],
        )
        .unwrap()
        .iter()
        .map(|r| r.get(0))
        .collect()
    };
    let before = others(&mut c);
    // Every row of a thread the registry does not give alice, byte for byte.
    let threads_kept = |c: &mut Client| -> Vec<String> {
        ["checkpoints", "checkpoint_blobs", "checkpoint_writes"]
            .iter()
            .map(|t| {
                c.query_one(
                    &format!(
                        "SELECT coalesce(md5(string_agg(x::text, '|' ORDER BY x::text)), '') FROM {t} x
                          WHERE thread_id NOT IN (SELECT thread_id FROM thread_registry
                                                   WHERE tenant_id = 'acme' AND user_id = 'alice')"
                    ),
                    &[],
                )
                .unwrap()
                .get(0)
            })
            .collect()
    };
    let threads_before = threads_kept(&mut c);
    let tg = checkpointer_with(&db, "public.reg_ci", false);
    let alice = subject_scope("acme", "alice");
    let inv = tg.adapter.inventory(&alice).unwrap();
    let registry: Vec<&str> = inv
        .locators
        .iter()
        .filter_map(|(l, _)| l.strip_prefix("1:"))
        .collect();
    assert!(!registry.is_empty());
    assert!(
        !registry
            .iter()
            .any(|t| t.starts_with("t-Alice") || t.starts_with("t-ALICE")),
        "{registry:?}"
    );
    tg.adapter.erase_batch(&alice, &inv.locators).unwrap();
    assert_eq!(tg.adapter.verify(&alice, &inv.locators).unwrap(), 0);
    assert_eq!(
        others(&mut c),
        before,
        "Alice's and ALICE's rows and everyone else's kept"
    );
    assert_eq!(
        threads_kept(&mut c),
        threads_before,
        "every other thread kept"
    );

    // The same thread registered to alice and to bob.
    let thread: String = c
        .query_one(
            "SELECT thread_id FROM thread_registry WHERE tenant_id = 'acme' AND user_id = 'bob' ORDER BY 1 LIMIT 1",
            &[],
        )
        .unwrap()
        .get(0);
    c.batch_execute(&format!(
        "CREATE TABLE reg_multi AS SELECT tenant_id, user_id, thread_id FROM thread_registry;
         INSERT INTO reg_multi VALUES ('acme', 'alice', '{thread}');"
    ))
    .unwrap();
    let tg = checkpointer_with(&db, "public.reg_multi", false);
    for who in ["alice", "bob"] {
        match tg.adapter.inventory(&subject_scope("acme", who)) {
            Err(AdapterError::Failed { why, .. }) => {
                assert!(why.contains("registered to another owner"), "{why}")
            }
            other => panic!("{who}: expected a refusal, got {other:?}"),
        }
    }
    let n: i64 = c
        .query_one(
            "SELECT count(*) FROM checkpoints WHERE thread_id = $1",
            &[&thread],
        )
        .unwrap()
        .get(0);
    assert!(n > 0, "the shared thread is untouched");
}

/// A memory id `a/b` also names key `a/b` one label up: when the store holds both readings (or
/// only the other one), the scope is refused before anything is touched.
#[test]
fn a_memory_id_that_names_two_items_is_refused() {
    let srv = server(15);
    let db = Db::new(&srv);
    let st = store(&db);
    let mut c = db.client();
    let mk = || Scope::Memory {
        tenant: Tenant::new("acme").unwrap(),
        subject: Subject::new("alice").unwrap(),
        memory: MemoryId::new("notes/1").unwrap(),
        version: None,
    };
    c.execute(
        "INSERT INTO store (prefix, key, value) VALUES ('acme.alice.notes', '1', '{}')",
        &[],
    )
    .unwrap();
    assert!(matches!(
        st.adapter.check_scope(&mk()),
        Ok(Applicability::Applies)
    ));
    c.execute(
        "INSERT INTO store (prefix, key, value) VALUES ('acme.alice', 'notes/1', '{}')",
        &[],
    )
    .unwrap();
    match st.adapter.check_scope(&mk()) {
        Err(AdapterError::Inexpressible { why, .. }) => {
            assert!(why.contains("more than one item"), "{why}")
        }
        other => panic!("expected a refusal, got {other:?}"),
    }
    c.execute(
        "DELETE FROM store WHERE prefix = 'acme.alice.notes' AND key = '1'",
        &[],
    )
    .unwrap();
    assert!(
        st.adapter.check_scope(&mk()).is_err(),
        "only the other reading exists: still refused"
    );
}

/// What would make an erase reach beyond the target's tables, or a count miss rows, is refused
/// before anything is read or deleted: an application table that
/// cascades from the store, the checkpoints or the registry (an erase of one subject deleted
/// another's row, uncounted), a DELETE trigger, and row-level security that hides rows from
/// Lethe's role (inventory and verify said 0 while the row stayed). A RESTRICT foreign key,
/// LangGraph's own store_vectors cascade and a superuser's view are fine.
#[test]
fn what_would_reach_beyond_the_tables_or_hide_rows_is_refused_before_anything_runs() {
    let srv = server(15);
    let refused = |t: &Target, what: &str| {
        let e = t.adapter.probe().expect_err(what);
        let m = e.to_string();
        assert!(!e.is_retryable(), "{what}: {m}");
        m
    };
    // The store: a cascading foreign key from an application table.
    let db = Db::new(&srv);
    let st = store(&db);
    st.adapter
        .probe()
        .expect("the fixture as LangGraph made it");
    let mut c = db.client();
    c.batch_execute(
        "CREATE TABLE shared_notes (owner TEXT, prefix TEXT, key TEXT,
           FOREIGN KEY (prefix, key) REFERENCES store (prefix, key) ON DELETE RESTRICT)",
    )
    .unwrap();
    st.adapter
        .probe()
        .expect("RESTRICT changes nothing: the delete fails");
    c.batch_execute(
        "ALTER TABLE shared_notes DROP CONSTRAINT shared_notes_prefix_key_fkey;
         ALTER TABLE shared_notes ADD CONSTRAINT notes_follow FOREIGN KEY (prefix, key)
           REFERENCES store (prefix, key) ON DELETE CASCADE",
    )
    .unwrap();
    let m = refused(&st, "a cascade");
    assert!(m.contains("notes_follow") && m.contains("CASCADE"), "{m}");
    c.batch_execute("DROP TABLE shared_notes").unwrap();
    // A DELETE trigger, a DELETE rule: each refused, then dropped.
    c.batch_execute(
        "CREATE FUNCTION audit() RETURNS trigger LANGUAGE plpgsql AS $$BEGIN RETURN OLD; END$$;
         CREATE TABLE deleted_log (k TEXT)",
    )
    .unwrap();
    for (what, name, create, drop) in [
        (
            "a DELETE trigger",
            "store_audit",
            "CREATE TRIGGER store_audit BEFORE DELETE ON store FOR EACH ROW EXECUTE FUNCTION audit()",
            "DROP TRIGGER store_audit ON store",
        ),
        (
            "a DELETE rule",
            "keep_log",
            "CREATE RULE keep_log AS ON DELETE TO store DO ALSO INSERT INTO deleted_log VALUES (old.key)",
            "DROP RULE keep_log ON store",
        ),
    ] {
        c.batch_execute(create).unwrap();
        let m = refused(&st, what);
        assert!(m.contains(name), "{m}");
        c.batch_execute(drop).unwrap();
        st.adapter.probe().unwrap();
    }
    // Row-level security: refused for a role it applies to, not for a superuser.
    c.batch_execute(
        "ALTER TABLE store ENABLE ROW LEVEL SECURITY;
         CREATE POLICY only_acme ON store USING (prefix LIKE 'acme.%')",
    )
    .unwrap();
    st.adapter
        .probe()
        .expect("a superuser bypasses row-level security");
    let role = format!("{}_reader", db.name);
    c.batch_execute(&format!(
        "CREATE ROLE {role} LOGIN; GRANT SELECT, DELETE ON ALL TABLES IN SCHEMA public TO {role}"
    ))
    .unwrap();
    let as_role = store_at(&db.url.replacen("postgres@", &format!("{role}@"), 1), None);
    let m = refused(&as_role, "row-level security");
    assert!(m.contains("row-level security"), "{m}");
    drop(as_role);
    // The checkpointer: a cascade from its registry, and one from its checkpoints.
    let ck = checkpointer(&db);
    ck.adapter.probe().unwrap();
    c.batch_execute(
        "ALTER TABLE thread_registry ADD CONSTRAINT registry_thread UNIQUE (thread_id);
         CREATE TABLE participants (who TEXT, thread_id TEXT REFERENCES thread_registry (thread_id) ON DELETE CASCADE)",
    )
    .unwrap();
    let m = refused(&ck, "a cascade from the registry");
    assert!(m.contains("participants"), "{m}");
    c.batch_execute(
        "DROP TABLE participants;
         CREATE TABLE run_notes (thread_id TEXT, checkpoint_ns TEXT, checkpoint_id TEXT,
           FOREIGN KEY (thread_id, checkpoint_ns, checkpoint_id)
           REFERENCES checkpoints (thread_id, checkpoint_ns, checkpoint_id) ON DELETE SET NULL)",
    )
    .unwrap();
    let m = refused(&ck, "a SET NULL from the checkpoints");
    assert!(m.contains("run_notes"), "{m}");
    c.batch_execute(&format!(
        "DROP TABLE run_notes; REVOKE ALL ON ALL TABLES IN SCHEMA public FROM {role}; DROP ROLE {role}"
    ))
    .unwrap();
    ck.adapter.probe().unwrap();
    // A partitioned registry: a DELETE on it runs its partitions' triggers and their foreign
    // keys' actions, so those are looked at too; a registry that is a view is refused.
    c.batch_execute(
        "CREATE TABLE part_registry (tenant_id TEXT, user_id TEXT, thread_id TEXT) PARTITION BY LIST (tenant_id);
         CREATE TABLE reg_acme PARTITION OF part_registry FOR VALUES IN ('acme');
         CREATE TABLE reg_rest PARTITION OF part_registry DEFAULT;
         INSERT INTO part_registry SELECT tenant_id, user_id, thread_id FROM thread_registry;",
    )
    .unwrap();
    let parted = checkpointer_with(&db, "public.part_registry", true);
    parted
        .adapter
        .probe()
        .expect("a partitioned registry as such");
    c.batch_execute(
        "CREATE TRIGGER acme_audit AFTER DELETE ON reg_acme FOR EACH ROW EXECUTE FUNCTION audit()",
    )
    .unwrap();
    let m = refused(&parted, "a trigger on a partition");
    assert!(m.contains("acme_audit"), "{m}");
    c.batch_execute(
        "DROP TRIGGER acme_audit ON reg_acme;
         ALTER TABLE reg_acme ADD CONSTRAINT acme_thread UNIQUE (thread_id);
         CREATE TABLE acme_notes (thread_id TEXT REFERENCES reg_acme (thread_id) ON DELETE CASCADE);",
    )
    .unwrap();
    let m = refused(&parted, "a cascade from a partition");
    assert!(m.contains("acme_notes"), "{m}");
    c.batch_execute(
        "CREATE VIEW registry_view AS SELECT tenant_id, user_id, thread_id FROM thread_registry",
    )
    .unwrap();
    let m = refused(
        &checkpointer_with(&db, "public.registry_view", true),
        "a view",
    );
    assert!(
        m.contains("registry_view") && m.contains("not a table"),
        "{m}"
    );
}

/// Many jobs' batches in one transaction (`erase_many`, a batch's erase): each job gets what
/// its own `erase_batch` would; a job whose thread gained a row since its inventory (alice)
/// fails alone with `anomalous_volume` and keeps every row, the others are erased; every row
/// of every other subject is kept byte for byte.
#[test]
fn erase_many_fails_a_job_over_its_inventory_alone() {
    let srv = server(15);
    let scopes = [
        subject_scope("acme", "alice"),
        subject_scope("acme", "bob"),
        subject_scope("globex", "carol"),
    ];
    // Every row of anyone but the three, as text.
    let others = |c: &mut Client| -> Vec<String> {
        c.query(
            "SELECT 'c' || c::text FROM checkpoints c
              WHERE NOT (metadata->>'user_id' IN ('alice', 'bob', 'carol'))
                AND thread_id NOT IN (SELECT thread_id FROM thread_registry WHERE user_id IN ('alice', 'bob', 'carol'))
             UNION ALL SELECT 'r' || r::text FROM thread_registry r WHERE user_id NOT IN ('alice', 'bob', 'carol')
             UNION ALL SELECT 's' || s::text FROM store s
              WHERE prefix NOT LIKE 'acme.alice%' AND prefix NOT LIKE 'acme.bob%' AND prefix NOT LIKE 'globex.carol%'
             ORDER BY 1",
            &[],
        )
        .unwrap()
        .iter()
        .map(|r| r.get(0))
        .collect()
    };
    for (kind, late) in [
        ("checkpointer", false),
        ("store", false),
        ("checkpointer", true),
    ] {
        let db = Db::new(&srv);
        let t = if kind == "store" {
            store(&db)
        } else {
            checkpointer(&db)
        };
        let work: Vec<(Scope, Vec<lethe_adapters::Locator>)> = scopes
            .iter()
            .map(|s| (s.clone(), t.adapter.inventory(s).unwrap().locators))
            .collect();
        let expected: Vec<u64> = work
            .iter()
            .map(|(_, l)| l.iter().map(|(_, n)| n).sum())
            .collect();
        assert!(expected.iter().all(|n| *n > 0), "{kind}: {expected:?}");
        let mut c = db.client();
        if late {
            let thread = a_thread_with_rows(&t.adapter.inventory(&scopes[0]).unwrap());
            c.execute(
                "INSERT INTO checkpoints (thread_id, checkpoint_ns, checkpoint_id, checkpoint, metadata)
                 VALUES ($1, '', 'late', '{}', '{\"tenant_id\": \"acme\", \"user_id\": \"alice\"}')",
                &[&thread],
            )
            .unwrap();
        }
        let before = others(&mut c);
        let got = t.adapter.erase_many(&work);
        if late {
            assert!(
                matches!(got[0], Err(AdapterError::AnomalousVolume { .. })),
                "{:?}",
                got[0].as_ref().err()
            );
            assert_eq!(got[1].as_ref().ok(), Some(&expected[1]));
            assert_eq!(got[2].as_ref().ok(), Some(&expected[2]));
            assert_eq!(
                t.adapter.verify(&scopes[0], &work[0].1).unwrap(),
                expected[0] + 1,
                "alice's rows are all still there, and the late one"
            );
        } else {
            let got: Vec<u64> = got.into_iter().map(Result::unwrap).collect();
            assert_eq!(got, expected, "{kind}");
            assert_eq!(t.adapter.verify(&scopes[0], &work[0].1).unwrap(), 0);
        }
        for (s, l) in &work[1..] {
            assert_eq!(t.adapter.verify(s, l).unwrap(), 0, "{kind}");
        }
        assert_eq!(others(&mut c), before, "{kind}: every other subject kept");
    }
}

/// A batch's inventory and verification read the checkpoints' metadata once for all its
/// subjects (`inventory_many`, `verify_many`), and each scope's result is what its own
/// `inventory` and `verify` give: every seeded subject (awkward identifiers among them), one
/// that holds nothing, and a tenant scope (read alone); after some are erased, a row written
/// again under an erased subject's thread is residue of that subject only.
#[test]
fn a_batch_reads_the_metadata_once_and_each_scope_gets_its_own_answer() {
    for v in [15, 18] {
        let srv = server(v);
        let db = Db::new(&srv);
        let cp = checkpointer(&db);
        let a = cp.adapter.as_ref();
        let mut scopes: Vec<Scope> = srv.manifest["subjects"]
            .as_array()
            .unwrap()
            .iter()
            .map(|s| {
                subject_scope(
                    s["tenant_id"].as_str().unwrap(),
                    s["user_id"].as_str().unwrap(),
                )
            })
            .collect();
        scopes.push(subject_scope("acme", "nobody-here"));
        scopes.push(Scope::Tenant {
            tenant: Tenant::new("globex").unwrap(),
        });
        let alone: Vec<_> = scopes.iter().map(|s| a.inventory(s).unwrap()).collect();
        let many: Vec<_> = a
            .inventory_many(&scopes)
            .into_iter()
            .map(Result::unwrap)
            .collect();
        assert!(
            alone == many,
            "PostgreSQL {v}: the batch's inventories differ"
        );
        assert!(many.iter().filter(|i| i.count > 0).count() >= 10);
        // Every row outside the first three subjects' threads, as text: what their erase
        // must leave byte for byte.
        let erased: Vec<String> = many[..3]
            .iter()
            .flat_map(|i| i.locators.iter())
            .map(|(l, _)| l[2..].to_string())
            .collect();
        let others = |c: &mut Client| -> Vec<String> {
            c.query(
                "SELECT 'c' || c::text FROM checkpoints c WHERE thread_id <> ALL($1)
                 UNION ALL SELECT 'b' || b::text FROM checkpoint_blobs b WHERE thread_id <> ALL($1)
                 UNION ALL SELECT 'w' || w::text FROM checkpoint_writes w WHERE thread_id <> ALL($1)
                 UNION ALL SELECT 'r' || r::text FROM thread_registry r WHERE thread_id <> ALL($1)
                 ORDER BY 1",
                &[&erased],
            )
            .unwrap()
            .iter()
            .map(|r| r.get(0))
            .collect()
        };
        let before = others(&mut db.client());
        // Erase the first three subjects, then write a row again on the first one's thread.
        for (s, i) in scopes.iter().zip(&many).take(3) {
            a.erase_batch(s, &i.locators).unwrap();
        }
        let thread = a_thread_with_rows(&many[0]);
        db.client()
            .execute(
                "INSERT INTO checkpoint_writes (thread_id, checkpoint_ns, checkpoint_id, task_id, idx, channel, type, blob)
                 VALUES ($1, '', 'again', 't', 0, 'c', 'json', '\\x00')",
                &[&thread],
            )
            .unwrap();
        let work: Vec<(Scope, Vec<lethe_adapters::Locator>)> = scopes
            .iter()
            .cloned()
            .zip(many.iter().map(|i| i.locators.clone()))
            .collect();
        let alone: Vec<u64> = work.iter().map(|(s, f)| a.verify(s, f).unwrap()).collect();
        let batch: Vec<u64> = a
            .verify_many(&work)
            .into_iter()
            .map(Result::unwrap)
            .collect();
        assert_eq!(batch, alone, "PostgreSQL {v}");
        assert_eq!(
            batch[0], 1,
            "the row written again is the first subject's residue"
        );
        assert_eq!(&batch[1..3], &[0, 0]);
        assert_eq!(
            others(&mut db.client()),
            before,
            "PostgreSQL {v}: every other subject kept every row"
        );
    }
}
