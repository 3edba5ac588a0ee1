//! The conformance suite on LangGraph's PostgreSQL schema, on PostgreSQL 15 (no vector index)
//! and PostgreSQL 18 with pgvector (`store_vectors` populated), against data written by real
//! LangGraph (`scripts/pg seed-small`, run by `scripts/test` into a template database). Each test
//! clones its own database from the template.
//!
//! Environment (set by scripts/test; defaults in brackets): LETHE_PG15_URL
//! [postgres://postgres@127.0.0.1:5432/postgres], LETHE_PG18_URL [...:54318/postgres],
//! LETHE_PG_TEMPLATE [lethe_tpl], LETHE_PG15_MANIFEST / LETHE_PG18_MANIFEST
//! [target/pg{15,18}-manifest.json].

use std::collections::HashMap;
use std::path::Path;
use std::sync::atomic::{AtomicUsize, Ordering};

use lethe_adapters::conformance::{self, Case, Row};
use lethe_adapters::{Adapter, AdapterError, Target};
use lethe_core::{MemoryId, Scope, Subject, Tenant, Version};
use postgres::{Client, NoTls};

struct Server {
    admin: String,
    manifest: serde_json::Value,
}

fn server(version: u32) -> Server {
    let default_port = if version == 15 { 5432 } else { 54318 };
    let admin = std::env::var(format!("LETHE_PG{version}_URL"))
        .unwrap_or_else(|_| format!("postgres://postgres@127.0.0.1:{default_port}/postgres"));
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("../..");
    let path = std::env::var(format!("LETHE_PG{version}_MANIFEST"))
        .map(Into::into)
        .unwrap_or_else(|_| root.join(format!("target/pg{version}-manifest.json")));
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
        let mut admin = Client::connect(&s.admin, NoTls)
            .expect("PostgreSQL reachable (scripts/test starts it)");
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
        let url = match s.admin.rsplit_once('/') {
            Some((base, _)) => format!("{base}/{name}"),
            None => unreachable!("admin URL names a database"),
        };
        Db {
            admin: s.admin.clone(),
            name,
            url,
        }
    }

    fn client(&self) -> Client {
        Client::connect(&self.url, NoTls).unwrap()
    }
}

impl Drop for Db {
    fn drop(&mut self) {
        if let Ok(mut c) = Client::connect(&self.admin, NoTls) {
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
    target(&format!(
        r#"
name = "checkpoints"
kind = "langgraph-postgres-checkpointer"
class = "primary"
url = "{}"
registry = {{ table = "public.thread_registry", tenant = "tenant_id", subject = "user_id", thread = "thread_id" }}
metadata = {{ tenant = "tenant_id", subject = "user_id" }}
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
        let thread = inv
            .locators
            .iter()
            .find(|(l, n)| l.starts_with("0:") && *n > 0)
            .unwrap()
            .0[2..]
            .to_string();
        let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
        let writer = {
            let (url, stop, thread) = (db.url.clone(), stop.clone(), thread.clone());
            std::thread::spawn(move || {
                let mut c = Client::connect(&url, NoTls).unwrap();
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
