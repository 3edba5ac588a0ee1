//! The database guard on real PostgreSQL 15 and 18, over data written by real LangGraph
//! (`scripts/pg seed-small`, the template database `scripts/test` makes). Each test clones its
//! own database. The refusals are checked with plain SQL writes shaped like LangGraph's; the
//! same through LangGraph's own `PostgresSaver` and `PostgresStore` is
//! `tests/e2e/guard_stale_writer.sh`.
//!
//! Environment: as `postgres_conformance.rs` (LETHE_PG15_URL, LETHE_PG18_URL,
//! LETHE_PG_TEMPLATE, LETHE_PG15_MANIFEST, LETHE_PG18_MANIFEST).

use std::collections::BTreeSet;
use std::path::Path;
use std::sync::atomic::{AtomicUsize, Ordering};

use lethe_adapters::{Fence, Guard, Target};
use lethe_core::keys::{DeploymentKey, GuardKey};
use lethe_core::{MemoryId, Scope, Subject, Tenant};
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
            "lethe_guard_t_{}_{}",
            std::process::id(),
            COUNTER.fetch_add(1, Ordering::SeqCst)
        );
        let mut admin = Client::connect(&s.admin, NoTls).expect("PostgreSQL reachable");
        for attempt in 0.. {
            match admin.batch_execute(&format!("CREATE DATABASE {name} TEMPLATE {template}")) {
                Ok(()) => break,
                // Clones serialize on the template; retry while another clone holds it.
                Err(e) if attempt < 5_000 && e.to_string().contains("being accessed") => {
                    std::thread::yield_now()
                }
                Err(e) => panic!("cloning the template: {e}"),
            }
        }
        let url = format!("{}/{name}", s.admin.rsplit_once('/').unwrap().0);
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

fn checkpointer(url: &str, schema: &str) -> Target {
    target(&format!(
        r#"
name = "checkpoints"
kind = "langgraph-postgres-checkpointer"
class = "primary"
url = "{url}"
schema = {schema:?}
metadata = {{ tenant = "tenant_id", subject = "user_id" }}
"#
    ))
}

fn store(url: &str, schema: &str) -> Target {
    target(&format!(
        r#"
name = "memories"
kind = "langgraph-postgres-store"
class = "primary"
url = "{url}"
schema = {schema:?}
namespace = ["{{tenant}}", "{{subject}}"]
"#
    ))
}

fn guard(t: &Target) -> &dyn Guard {
    t.adapter.guard().expect("PostgreSQL targets have a guard")
}

fn scope(t: &str, s: &str) -> Scope {
    Scope::Subject {
        tenant: Tenant::new(t).unwrap(),
        subject: Subject::new(s).unwrap(),
    }
}

/// Every row of every LangGraph table not owned by `(tenant, subject)`, as `row::text`.
/// Threads named `fresh-*` are the tests' own new threads for that subject.
fn others(c: &mut Client, m: &serde_json::Value, tenant: &str, subject: &str) -> Vec<String> {
    let mine: Vec<String> = m["subjects"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|s| s["tenant_id"] == tenant && s["user_id"] == subject)
        .flat_map(|s| s["threads"].as_array().unwrap().clone())
        .map(|t| t["thread_id"].as_str().unwrap().to_string())
        .collect();
    let prefix = format!("{tenant}.{subject}");
    let mut out = Vec::new();
    for t in ["checkpoints", "checkpoint_blobs", "checkpoint_writes"] {
        for r in c
            .query(
                &format!("SELECT x::text FROM {t} x WHERE NOT (thread_id = ANY($1)) AND thread_id NOT LIKE 'fresh-%' ORDER BY 1"),
                &[&mine],
            )
            .unwrap()
        {
            out.push(format!("{t}:{}", r.get::<_, String>(0)));
        }
    }
    for t in ["store", "store_vectors", "thread_registry"] {
        let exists: bool = c
            .query_one("SELECT to_regclass($1) IS NOT NULL", &[&t])
            .unwrap()
            .get(0);
        if !exists {
            continue;
        }
        let cond = if t == "thread_registry" {
            "NOT (tenant_id = $1 AND user_id = $2)"
        } else {
            "NOT (prefix = $3 OR starts_with(prefix, $3 || '.'))"
        };
        let sql = format!(
            "SELECT x::text FROM {t} x WHERE {cond} AND $1::text IS NOT NULL AND $2::text IS NOT NULL AND $3::text IS NOT NULL ORDER BY 1"
        );
        for r in c.query(&sql, &[&tenant, &subject, &prefix]).unwrap() {
            out.push(format!("{t}:{}", r.get::<_, String>(0)));
        }
    }
    out
}

/// The SQLSTATE of a write, `None` when admitted.
fn write(
    c: &mut Client,
    sql: &str,
    params: &[&(dyn postgres::types::ToSql + Sync)],
) -> Option<String> {
    match c.execute(sql, params) {
        Ok(_) => None,
        Err(e) => Some(
            e.code()
                .map(|c| c.code().to_string())
                .unwrap_or_else(|| panic!("not a database error: {e}")),
        ),
    }
}

const PUT_CHECKPOINT: &str = "INSERT INTO checkpoints (thread_id, checkpoint_ns, checkpoint_id, checkpoint, metadata)
     VALUES ($1, '', $2, '{}', $3::text::jsonb)
     ON CONFLICT (thread_id, checkpoint_ns, checkpoint_id) DO UPDATE SET checkpoint = EXCLUDED.checkpoint, metadata = EXCLUDED.metadata";
const PUT_WRITE: &str = "INSERT INTO checkpoint_writes (thread_id, checkpoint_ns, checkpoint_id, task_id, idx, channel, type, blob)
     VALUES ($1, '', $2, 'task', 0, 'messages', 'json', '\\x00')
     ON CONFLICT (thread_id, checkpoint_ns, checkpoint_id, task_id, idx) DO UPDATE SET blob = EXCLUDED.blob";
const PUT_BLOB: &str =
    "INSERT INTO checkpoint_blobs (thread_id, checkpoint_ns, channel, version, type, blob)
     VALUES ($1, '', 'messages', $2, 'json', '\\x00') ON CONFLICT DO NOTHING";
const PUT_ITEM: &str = "INSERT INTO store (prefix, key, value) VALUES ($1, $2, $3::text::jsonb)
     ON CONFLICT (prefix, key) DO UPDATE SET value = EXCLUDED.value, updated_at = now()";

/// The deployment's guard key in these tests, as `lethe guard install` and the gate take it.
fn key() -> GuardKey {
    DeploymentKey::from_bytes([5; 32]).guard_key()
}

/// The token the gate issues with lease 1 of `(tenant, subject)` at `epoch` (tenant epoch 0).
fn token(tenant: &str, subject: &str, epoch: i64) -> String {
    token_of(1, epoch as u64, 0, tenant, subject)
}

/// The token the gate issues with `lease` at these epochs.
fn token_of(lease: i64, epoch: u64, tenant_epoch: u64, tenant: &str, subject: &str) -> String {
    key().token(lease, epoch, tenant_epoch, tenant, subject)
}

/// Checkpoint metadata a runtime writes; with an epoch, the gate's token for it too.
fn meta(tenant: &str, subject: &str, epoch: Option<i64>) -> String {
    let mut m =
        serde_json::json!({"tenant_id": tenant, "user_id": subject, "source": "loop", "step": 1});
    if let Some(e) = epoch {
        m["lethe_epoch"] = e.into();
        m["lethe_token"] = token(tenant, subject, e).into();
    }
    m.to_string()
}

/// A store value of acme/alice's; with an epoch, the gate's token for it too.
fn value(epoch: Option<i64>) -> String {
    let mut v = serde_json::json!({"text": "a new memory"});
    if let Some(e) = epoch {
        v["lethe_epoch"] = e.into();
        v["lethe_token"] = token("acme", "alice", e).into();
    }
    v.to_string()
}

/// A thread of alice's, from the manifest.
fn a_thread(m: &serde_json::Value, tenant: &str, subject: &str) -> String {
    m["subjects"]
        .as_array()
        .unwrap()
        .iter()
        .find(|s| s["tenant_id"] == tenant && s["user_id"] == subject)
        .unwrap()["threads"][0]["thread_id"]
        .as_str()
        .unwrap()
        .to_string()
}

/// Catalog objects outside LangGraph's own: schemas, functions, triggers, tables.
fn catalog(c: &mut Client) -> BTreeSet<String> {
    let sql = "SELECT 'schema ' || nspname FROM pg_namespace WHERE nspname NOT LIKE 'pg\\_%' AND nspname <> 'information_schema'
               UNION ALL SELECT 'trigger ' || tgrelid::regclass::text || ' ' || tgname FROM pg_trigger WHERE NOT tgisinternal
               UNION ALL SELECT 'function ' || p.oid::regprocedure::text FROM pg_proc p JOIN pg_namespace n ON n.oid = p.pronamespace
                          WHERE n.nspname NOT IN ('pg_catalog', 'information_schema')
               UNION ALL SELECT 'relation ' || c.oid::regclass::text FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace
                          WHERE n.nspname NOT LIKE 'pg\\_%' AND n.nspname <> 'information_schema'";
    c.query(sql, &[])
        .unwrap()
        .iter()
        .map(|r| r.get(0))
        .collect()
}

fn install_is_idempotent_and_uninstall_leaves_the_database_as_it_was(version: u32) {
    let srv = server(version);
    let db = Db::new(&srv);
    let mut c = db.client();
    let before = catalog(&mut c);
    let data_before = others(&mut c, &srv.manifest, "-", "-");
    let (cp, st) = (checkpointer(&db.url, "public"), store(&db.url, "public"));
    assert!(!guard(&cp).status().unwrap().installed);
    for _ in 0..2 {
        guard(&cp).install(&key()).unwrap();
        guard(&st).install(&key()).unwrap();
    }
    let installed = catalog(&mut c);
    assert!(installed.contains("schema lethe_guard"));
    assert_eq!(
        installed
            .iter()
            .filter(|o| o.starts_with("trigger ") && o.ends_with(" lethe_guard"))
            .count(),
        4,
        "one trigger per guarded table"
    );
    // Two triggers a table: `lethe_guard`, and `lethe_guard_reown` for re-owning UPDATEs.
    for (t, n) in [(&cp, 6), (&st, 2)] {
        let s = guard(t).status().unwrap();
        assert!(s.installed);
        assert_eq!(s.version.as_deref(), Some(lethe_adapters::GUARD_VERSION));
        assert_eq!((s.triggers, s.triggers_needed), (n, n));
        assert_eq!(s.fenced_subjects + s.erased_threads + s.erased_items, 0);
    }
    // An older guard is brought up to date in place by installing again, its state kept. A
    // version 2 database has no `known` index of digests and no `lethe_guard_reown` triggers
    // (version 5): made here as version 2 left it.
    c.batch_execute(
        "UPDATE lethe_guard.meta SET value = '2' WHERE key = 'version';
         DROP TRIGGER lethe_guard_reown ON public.checkpoints;
         DROP TRIGGER lethe_guard_reown ON public.checkpoint_blobs;
         DROP TRIGGER lethe_guard_reown ON public.checkpoint_writes;
         DROP TRIGGER known ON lethe_guard.subject_fence;
         DROP TRIGGER known ON lethe_guard.tenant_fence;
         DROP TRIGGER known ON lethe_guard.erased_thread;
         DROP TRIGGER known ON lethe_guard.erased_item;
         DROP FUNCTION lethe_guard.remember();
         DROP TABLE lethe_guard.known;
         DROP TABLE lethe_guard.key CASCADE;
         INSERT INTO lethe_guard.erased_thread VALUES (sha256(convert_to('old', 'UTF8')))",
    )
    .unwrap();
    let s = guard(&cp).status().unwrap();
    assert_eq!((s.version.as_deref(), s.installed), (Some("2"), false));
    guard(&cp).install(&key()).unwrap();
    let s = guard(&cp).status().unwrap();
    assert_eq!(
        (s.version.as_deref(), s.erased_threads, s.installed),
        (Some(lethe_adapters::GUARD_VERSION), 1, true)
    );
    // The thread erased under version 2 (its digest unkeyed, as version 6 and earlier stored
    // them) is keyed in place and in the new index, so its writes are still refused.
    assert_eq!(
        write(&mut c, "INSERT INTO checkpoints (thread_id, checkpoint_ns, checkpoint_id, checkpoint, metadata) VALUES ('old', '', 'c1', '{}', '{}')", &[]),
        Some("LT003".to_string()),
        "a thread erased before the update stays refused"
    );
    // The update's re-owning check is in place: a fenced subject's row cannot change owner.
    let alice = scope("acme", "alice");
    let f = Fence::of(&alice, Some(1), None);
    assert!(guard(&cp).close(&f).unwrap());
    let alice_thread = a_thread(&srv.manifest, "acme", "alice");
    assert_eq!(
        write(
            &mut c,
            "UPDATE checkpoints SET metadata = metadata - 'user_id' WHERE thread_id = $1",
            &[&alice_thread]
        ),
        Some("LT001".to_string()),
    );
    assert!(guard(&cp).open(&f).unwrap());
    // Uninstalling one target keeps the schema for the other; the second removes everything.
    guard(&st).uninstall().unwrap();
    assert!(!guard(&st).status().unwrap().installed);
    assert!(guard(&cp).status().unwrap().installed);
    guard(&cp).uninstall().unwrap();
    guard(&cp).uninstall().unwrap();
    assert_eq!(
        catalog(&mut c),
        before,
        "uninstall removes exactly what install added"
    );
    assert_eq!(
        others(&mut c, &srv.manifest, "-", "-"),
        data_before,
        "no LangGraph row touched"
    );
    // Nothing installed: the engine's calls are no-ops.
    let s = scope("acme", "alice");
    assert!(!guard(&cp).close(&Fence::of(&s, Some(1), None)).unwrap());
}

fn uninstall_is_refused_while_a_fence_is_closed(version: u32) {
    let srv = server(version);
    let db = Db::new(&srv);
    let cp = checkpointer(&db.url, "public");
    let g = guard(&cp);
    g.install(&key()).unwrap();
    let s = scope("acme", "alice");
    let f = Fence::of(&s, Some(1), None);
    assert!(g.close(&f).unwrap());
    assert!(g.close(&f).unwrap(), "closing twice is fine");
    assert_eq!(g.status().unwrap().fenced_subjects, 1);
    let e = g.uninstall().unwrap_err();
    assert!(e.to_string().contains("erasure is running"), "{e}");
    assert!(g.status().unwrap().installed);
    g.open(&f).unwrap();
    g.uninstall().unwrap();
}

/// A guard shared by two journals: journal B's job (epoch 1) closes a fence journal A's jobs
/// already took to epoch 2, and cannot open it (it opens up to its own epoch). Its `open`
/// fails, naming the target and the cause, instead of leaving the fence closed for good
/// behind a COMPLETE job; the fence stays closed until A's epoch opens it.
fn a_fence_left_closed_with_a_later_epoch_fails_the_open(version: u32) {
    let srv = server(version);
    let db = Db::new(&srv);
    let (cp, st) = (checkpointer(&db.url, "public"), store(&db.url, "public"));
    guard(&cp).install(&key()).unwrap();
    guard(&st).install(&key()).unwrap();
    let s = scope("acme", "alice");
    let t = Scope::Tenant {
        tenant: Tenant::new("acme").unwrap(),
    };
    let fenced = |g: &dyn Guard| {
        let st = g.status().unwrap();
        st.fenced_subjects + st.fenced_tenants
    };
    for (g, a1, a2, b1) in [
        (
            guard(&cp),
            Fence::of(&s, Some(1), None),
            Fence::of(&s, Some(2), None),
            Fence::of(&s, Some(1), None),
        ),
        (
            guard(&st),
            Fence::of(&t, None, Some(1)),
            Fence::of(&t, None, Some(2)),
            Fence::of(&t, None, Some(1)),
        ),
    ] {
        // Journal A: two jobs.
        for f in [&a1, &a2] {
            assert!(g.close(f).unwrap());
            assert!(g.open(f).unwrap());
        }
        assert!(g.open(&b1).unwrap(), "opening an open fence again is fine");
        // Journal B: one job, epoch 1.
        assert!(g.close(&b1).unwrap());
        let e = g.open(&b1).unwrap_err();
        assert!(!e.is_retryable());
        let msg = e.to_string();
        assert!(
            msg.contains("another journal")
                && msg.contains(if matches!(b1, Fence::Subject { .. }) {
                    "checkpoints"
                } else {
                    "memories"
                }),
            "{msg}"
        );
        for id in ["acme", "alice"] {
            assert!(!msg.contains(id), "{msg}");
        }
        assert_eq!(fenced(g), 1, "the fence stays closed");
        assert!(g.open(&a2).unwrap(), "the later epoch opens it");
        assert_eq!(fenced(g), 0);
    }
}

/// The whole life of a subject erasure, at the SQL level: fence window, erased lists, tokens.
fn refuses_fenced_erased_and_stale_writes_and_admits_current_ones(version: u32) {
    let srv = server(version);
    let m = &srv.manifest;
    let db = Db::new(&srv);
    let mut c = db.client();
    let (cp, st) = (checkpointer(&db.url, "public"), store(&db.url, "public"));
    guard(&cp).install(&key()).unwrap();
    guard(&st).install(&key()).unwrap();
    let bystanders = others(&mut c, m, "acme", "alice");
    let alice_thread = a_thread(m, "acme", "alice");
    let bob_thread = a_thread(m, "acme", "bob");

    // Before any erasure: no token needed, nothing changes for the application.
    assert_eq!(
        write(
            &mut c,
            PUT_CHECKPOINT,
            &[&"fresh-0", &"c0", &meta("acme", "alice", None)]
        ),
        None
    );

    // FROZEN: the job (epoch 1) closes the fence.
    let s = scope("acme", "alice");
    let f = Fence::of(&s, Some(1), None);
    assert!(guard(&cp).close(&f).unwrap());
    let lt001 = Some("LT001".to_string());
    assert_eq!(
        write(
            &mut c,
            PUT_CHECKPOINT,
            &[&"fresh-1", &"c1", &meta("acme", "alice", Some(1))]
        ),
        lt001,
        "even a current token waits for COMPLETE"
    );
    let alice_checkpoint: String = c
        .query_one(
            "SELECT checkpoint_id FROM checkpoints WHERE thread_id = $1 LIMIT 1",
            &[&alice_thread],
        )
        .unwrap()
        .get(0);
    assert_eq!(
        write(&mut c, PUT_WRITE, &[&alice_thread, &alice_checkpoint]),
        lt001,
        "writes of a fenced subject's thread"
    );
    assert_eq!(
        write(&mut c, PUT_BLOB, &[&alice_thread, &"99"]),
        lt001,
        "blobs of a fenced subject's thread"
    );
    assert_eq!(
        write(
            &mut c,
            PUT_ITEM,
            &[&"acme.alice.memories", &"new", &value(Some(1))]
        ),
        lt001
    );
    assert_eq!(
        write(&mut c, PUT_ITEM, &[&"acme.alice", &"top", &value(None)]),
        lt001,
        "the namespace itself"
    );

    // Inventory, record (journal before act), erase.
    for t in [&cp, &st] {
        let inv = t.adapter.inventory(&s).unwrap();
        assert!(inv.count > 0);
        assert!(guard(t).record_erased(&f, &inv.locators).unwrap());
        let n = t.adapter.erase_batch(&s, &inv.locators).unwrap();
        assert_eq!(n, inv.count);
        assert_eq!(t.adapter.verify(&s, &inv.locators).unwrap(), 0);
    }
    let erased_item = {
        let r = c
            .query_one(
                "SELECT count(*) FROM store WHERE prefix LIKE 'acme.alice%'",
                &[],
            )
            .unwrap();
        assert_eq!(r.get::<_, i64>(0), 0);
        m["subjects"][0]["store_items"][0].clone()
    };
    // COMPLETE opens the fence; epoch and erased lists stay.
    assert!(guard(&cp).open(&f).unwrap());
    let st_status = guard(&st).status().unwrap();
    assert_eq!((st_status.fenced_subjects, st_status.erased_owners), (0, 1));
    assert!(st_status.erased_threads > 0 && st_status.erased_items > 0);

    // Issue 7206: a late put / put_writes to an erased thread is refused, token or not.
    let lt003 = Some("LT003".to_string());
    for e in [None, Some(0), Some(1), Some(2)] {
        assert_eq!(
            write(
                &mut c,
                PUT_CHECKPOINT,
                &[&alice_thread, &"late", &meta("acme", "alice", e)]
            ),
            lt003
        );
    }
    assert_eq!(write(&mut c, PUT_WRITE, &[&alice_thread, &"late"]), lt003);
    assert_eq!(write(&mut c, PUT_BLOB, &[&alice_thread, &"late"]), lt003);
    // A new thread for alice: no token or a stale one is refused; a current one is admitted.
    let lt002 = Some("LT002".to_string());
    assert_eq!(
        write(
            &mut c,
            PUT_CHECKPOINT,
            &[&"fresh-2", &"c1", &meta("acme", "alice", None)]
        ),
        lt002
    );
    assert_eq!(
        write(
            &mut c,
            PUT_CHECKPOINT,
            &[&"fresh-2", &"c1", &meta("acme", "alice", Some(0))]
        ),
        lt002
    );
    assert_eq!(write(&mut c, "INSERT INTO checkpoints (thread_id, checkpoint_ns, checkpoint_id, checkpoint, metadata) VALUES ('fresh-2', '', 'c1', '{}', '{\"tenant_id\": \"acme\", \"user_id\": \"alice\", \"lethe_epoch\": \"1\"}')", &[]), lt002, "a malformed token is not no token");
    assert_eq!(
        write(
            &mut c,
            PUT_CHECKPOINT,
            &[&"fresh-2", &"c1", &meta("acme", "alice", Some(1))]
        ),
        None
    );
    assert_eq!(write(&mut c, PUT_WRITE, &[&"fresh-2", &"c1"]), None);
    // A write naming a checkpoint not (yet) there cannot be attributed: admitted (LangGraph's
    // async durability may write it before its checkpoint). The known limit in the README.
    assert_eq!(write(&mut c, PUT_WRITE, &[&"fresh-3", &"not-yet"]), None);
    // The erased store item: written again only under a lease taken after the erasure.
    let (ns, key) = (
        erased_item["prefix"].as_str().unwrap(),
        erased_item["key"].as_str().unwrap(),
    );
    let lt004 = Some("LT004".to_string());
    assert_eq!(write(&mut c, PUT_ITEM, &[&ns, &key, &value(None)]), lt004);
    assert_eq!(
        write(&mut c, PUT_ITEM, &[&ns, &key, &value(Some(0))]),
        lt004
    );
    assert_eq!(write(&mut c, PUT_ITEM, &[&ns, &key, &value(Some(1))]), None);
    assert_eq!(
        write(&mut c, PUT_ITEM, &[&ns, &key, &value(Some(1))]),
        None,
        "the upsert's UPDATE too"
    );
    // A new key for alice: stale refused, current admitted; a TTL refresh is not a write.
    assert_eq!(
        write(
            &mut c,
            PUT_ITEM,
            &[&"acme.alice.memories", &"k-new", &value(Some(0))]
        ),
        lt002
    );
    assert_eq!(
        write(
            &mut c,
            PUT_ITEM,
            &[&"acme.alice.memories", &"k-new", &value(Some(1))]
        ),
        None
    );
    assert_eq!(write(&mut c, "UPDATE store SET expires_at = now() + interval '1 day' WHERE prefix = 'acme.alice.memories'", &[]), None);

    // Everyone else: every row byte for byte, and writes without any token still admitted.
    let after = others(&mut c, m, "acme", "alice");
    let changed: Vec<_> = after.iter().filter(|r| !bystanders.contains(r)).collect();
    assert!(
        changed.is_empty() && after.len() == bystanders.len(),
        "other subjects changed: {changed:?}"
    );
    assert_eq!(
        write(
            &mut c,
            PUT_CHECKPOINT,
            &[&bob_thread, &"c-new", &meta("acme", "bob", None)]
        ),
        None
    );
    assert_eq!(write(&mut c, PUT_WRITE, &[&bob_thread, &"c-new"]), None);
    assert_eq!(
        write(
            &mut c,
            PUT_ITEM,
            &[&"acme.bob.memories", &"k", &value(None)]
        ),
        None
    );
    assert_eq!(
        write(&mut c, PUT_ITEM, &[&"acme.alice2", &"k", &value(None)]),
        None,
        "a prefix neighbour is someone else"
    );
    assert_eq!(
        write(&mut c, PUT_ITEM, &[&"globex.alice", &"k", &value(None)]),
        None,
        "same subject id, other tenant"
    );

    // Refusals name no identifier.
    let e = c
        .execute(
            PUT_CHECKPOINT,
            &[&alice_thread, &"late", &meta("acme", "alice", Some(1))],
        )
        .unwrap_err();
    let msg = e.as_db_error().unwrap().message().to_string();
    assert!(msg.starts_with("lethe guard:"), "{msg}");
    for id in ["acme", "alice", alice_thread.as_str()] {
        assert!(!msg.contains(id), "{msg}");
    }
}

/// An UPDATE that moves a row to another owner, thread or item is a write for the row it
/// leaves too: while a subject's fence is closed none of its rows can be re-owned out of the
/// erasure (the triggers judged only NEW, so the job certified such rows gone), and after the
/// erasure an erased thread's or item's row, or the erased owner's, is moved only as any write
/// of that owner is admitted.
fn an_update_cannot_move_rows_out_of_a_fenced_or_erased_owner(version: u32) {
    let srv = server(version);
    let m = &srv.manifest;
    let db = Db::new(&srv);
    let mut c = db.client();
    let (cp, st) = (checkpointer(&db.url, "public"), store(&db.url, "public"));
    guard(&cp).install(&key()).unwrap();
    guard(&st).install(&key()).unwrap();
    let bystanders = others(&mut c, m, "acme", "alice");
    let alice_thread = a_thread(m, "acme", "alice");
    let s = scope("acme", "alice");
    let before: Vec<u64> = [&cp, &st]
        .iter()
        .map(|t| t.adapter.inventory(&s).unwrap().count)
        .collect();
    let f = Fence::of(&s, Some(1), None);
    assert!(guard(&cp).close(&f).unwrap());

    let lt001 = Some("LT001".to_string());
    let alice_items = "(prefix = 'acme.alice' OR starts_with(prefix, 'acme.alice.'))";
    for sql in [
        "UPDATE checkpoints SET metadata = metadata - 'user_id' - 'tenant_id' WHERE thread_id = $1",
        "UPDATE checkpoints SET metadata = jsonb_set(metadata, '{user_id}', '\"zed\"') WHERE thread_id = $1",
        "UPDATE checkpoints SET metadata = jsonb_set(metadata, '{tenant_id}', '\"globex\"') WHERE thread_id = $1",
        "UPDATE checkpoints SET thread_id = 'moved-1' WHERE thread_id = $1",
        "UPDATE checkpoint_blobs SET thread_id = 'moved-2' WHERE thread_id = $1",
        "UPDATE checkpoint_writes SET thread_id = 'moved-3' WHERE thread_id = $1",
    ] {
        assert_eq!(write(&mut c, sql, &[&alice_thread]), lt001, "{sql}");
    }
    for set in [
        "prefix = 'acme.zed'",
        "prefix = 'acme.zed', key = 'moved-' || key",
        "prefix = 'acme.alice2'",
    ] {
        let sql = format!("UPDATE store SET {set} WHERE {alice_items}");
        assert_eq!(write(&mut c, &sql, &[]), lt001, "{sql}");
    }
    // Nor once the thread's checkpoints were deleted earlier in the same transaction: the
    // rows' owner cannot be read then, and while an erasure runs they stay on their thread.
    for table in ["checkpoint_blobs", "checkpoint_writes"] {
        let mut tx = c.transaction().unwrap();
        tx.execute(
            "DELETE FROM checkpoints WHERE thread_id = $1",
            &[&alice_thread],
        )
        .unwrap();
        let e = tx
            .execute(
                &format!("UPDATE {table} SET thread_id = 'moved-4' WHERE thread_id = $1"),
                &[&alice_thread],
            )
            .unwrap_err();
        assert_eq!(e.code().map(|c| c.code()), Some("LT001"), "{table}");
        tx.rollback().unwrap();
    }
    // The erasure finds every row it had before, and erases them.
    for (t, n) in [&cp, &st].into_iter().zip(before) {
        let inv = t.adapter.inventory(&s).unwrap();
        assert_eq!(inv.count, n, "no row moved out of the scope");
        assert!(guard(t).record_erased(&f, &inv.locators).unwrap());
        assert_eq!(t.adapter.erase_batch(&s, &inv.locators).unwrap(), n);
        assert_eq!(t.adapter.verify(&s, &inv.locators).unwrap(), 0);
    }
    assert!(guard(&cp).open(&f).unwrap());

    // After the erasure: alice's new rows (written under a lease taken after it) move only with
    // a current token, as any write of hers.
    assert_eq!(
        write(
            &mut c,
            PUT_CHECKPOINT,
            &[&"fresh-1", &"c1", &meta("acme", "alice", Some(1))]
        ),
        None
    );
    let lt002 = Some("LT002".to_string());
    assert_eq!(
        write(
            &mut c,
            "UPDATE checkpoints SET metadata = metadata - 'user_id' - 'tenant_id' - 'lethe_epoch' WHERE thread_id = 'fresh-1'",
            &[]
        ),
        lt002,
        "no token"
    );
    assert_eq!(
        write(
            &mut c,
            "UPDATE checkpoints SET metadata = metadata - 'user_id' - 'tenant_id' WHERE thread_id = 'fresh-1'",
            &[]
        ),
        None,
        "the current token"
    );
    // An erased item written again under a current lease: moved only with its token.
    let item = &m["subjects"][0]["store_items"][0];
    let (ns, key) = (
        item["prefix"].as_str().unwrap(),
        item["key"].as_str().unwrap(),
    );
    assert_eq!(write(&mut c, PUT_ITEM, &[&ns, &key, &value(Some(1))]), None);
    let lt004 = Some("LT004".to_string());
    assert_eq!(
        write(
            &mut c,
            "UPDATE store SET prefix = 'acme.zed', value = value - 'lethe_epoch' WHERE prefix = $1 AND key = $2",
            &[&ns, &key]
        ),
        lt004
    );
    // A row of an erased thread (written around the guard, as its owner could) cannot be
    // moved to another thread either.
    c.batch_execute(&format!(
        "SET session_replication_role = replica;
         INSERT INTO checkpoint_blobs (thread_id, checkpoint_ns, channel, version, type, blob)
              VALUES ('{alice_thread}', '', 'messages', 'around', 'json', '\\x00');
         SET session_replication_role = DEFAULT;"
    ))
    .unwrap();
    assert_eq!(
        write(
            &mut c,
            "UPDATE checkpoint_blobs SET thread_id = 'moved-4' WHERE thread_id = $1",
            &[&alice_thread]
        ),
        Some("LT003".to_string())
    );

    // Everyone else's rows as they were; their own rows still move freely.
    let after = others(&mut c, m, "acme", "alice");
    let changed: Vec<_> = after.iter().filter(|r| !bystanders.contains(r)).collect();
    assert!(
        changed.is_empty() && after.len() == bystanders.len(),
        "other subjects changed: {changed:?}"
    );
    let bob_thread = a_thread(m, "acme", "bob");
    for sql in [
        "UPDATE checkpoints SET metadata = jsonb_set(metadata, '{user_id}', '\"zed\"') WHERE thread_id = $1",
        "UPDATE checkpoint_blobs SET thread_id = 'bob-moved' WHERE thread_id = $1",
        "UPDATE checkpoint_writes SET thread_id = 'bob-moved' WHERE thread_id = $1",
    ] {
        assert_eq!(write(&mut c, sql, &[&bob_thread]), None, "{sql}");
    }
    assert_eq!(
        write(
            &mut c,
            "UPDATE store SET prefix = 'acme.zed' WHERE prefix = 'acme.bob'",
            &[]
        ),
        None
    );
}

fn tenant_and_memory_scopes(version: u32) {
    let srv = server(version);
    let db = Db::new(&srv);
    let mut c = db.client();
    let st = store(&db.url, "public");
    guard(&st).install(&key()).unwrap();
    // Memory scope: the item is erased for good (no epoch tells a stale writer from a new one).
    let item = srv.manifest["subjects"][1]["store_items"][0].clone();
    let (ns, key) = (
        item["prefix"].as_str().unwrap(),
        item["key"].as_str().unwrap(),
    );
    let mem = Scope::Memory {
        tenant: Tenant::new("acme").unwrap(),
        subject: Subject::new("bob").unwrap(),
        memory: MemoryId::new(format!(
            "{}/{key}",
            ns.split('.').skip(2).collect::<Vec<_>>().join("/")
        ))
        .unwrap(),
        version: None,
    };
    let inv = st.adapter.inventory(&mem).unwrap();
    assert_eq!(inv.locators.len(), 1, "one item");
    guard(&st)
        .record_erased(&Fence::of(&mem, Some(0), None), &inv.locators)
        .unwrap();
    st.adapter.erase_batch(&mem, &inv.locators).unwrap();
    assert_eq!(
        write(&mut c, PUT_ITEM, &[&ns, &key, &value(Some(99))]),
        Some("LT004".into())
    );
    assert_eq!(
        write(&mut c, PUT_ITEM, &[&ns, &"another-key", &value(None)]),
        None,
        "bob himself is not fenced"
    );
    // Tenant scope: every subject of the tenant, and only that tenant.
    let t = Scope::Tenant {
        tenant: Tenant::new("a").unwrap(),
    };
    let f = Fence::of(&t, None, Some(3));
    guard(&st).close(&f).unwrap();
    assert_eq!(
        write(&mut c, PUT_ITEM, &[&"a.u1", &"k", &value(None)]),
        Some("LT001".into())
    );
    assert_eq!(
        write(&mut c, PUT_ITEM, &[&"ab.u1", &"k", &value(None)]),
        None,
        "the tenant's prefix neighbour"
    );
    guard(&st).open(&f).unwrap();
    assert_eq!(
        write(&mut c, PUT_ITEM, &[&"a.u1", &"k", &value(None)]),
        Some("LT002".into())
    );
    assert_eq!(
        write(
            &mut c,
            PUT_ITEM,
            &[
                &"a.u1",
                &"k",
                &serde_json::json!({"lethe_tenant_epoch": 2}).to_string()
            ]
        ),
        Some("LT002".into())
    );
    assert_eq!(
        write(
            &mut c,
            PUT_ITEM,
            &[
                &"a.u1",
                &"k",
                &serde_json::json!({"lethe_tenant_epoch": 3, "lethe_token": token_of(1, 0, 3, "a", "u1")}).to_string()
            ]
        ),
        None
    );
}

/// Identifiers from config reach SQL only through format('%I'): a schema named with a quote,
/// a space and a dot-free oddity still gets its triggers, and nothing else does.
fn a_schema_name_that_needs_quoting_is_quoted(version: u32) {
    let srv = server(version);
    let db = Db::new(&srv);
    let mut c = db.client();
    c.batch_execute(
        "CREATE SCHEMA \"we\"\"ird s\";
         CREATE TABLE \"we\"\"ird s\".store (LIKE public.store INCLUDING ALL);",
    )
    .unwrap();
    let st = store(&db.url, "we\"ird s");
    guard(&st).install(&key()).unwrap();
    assert!(guard(&st).status().unwrap().installed);
    let s = scope("acme", "alice");
    let f = Fence::of(&s, Some(1), None);
    guard(&st).close(&f).unwrap();
    let odd =
        "INSERT INTO \"we\"\"ird s\".store (prefix, key, value) VALUES ('acme.alice', 'k', '{}')";
    assert_eq!(write(&mut c, odd, &[]), Some("LT001".into()));
    assert_eq!(
        write(&mut c, PUT_ITEM, &[&"acme.alice", &"k", &value(None)]),
        None,
        "public.store has no trigger"
    );
    guard(&st).open(&f).unwrap();
    guard(&st).uninstall().unwrap();
    let left: i64 = c
        .query_one(
            "SELECT count(*) FROM pg_namespace WHERE nspname = 'lethe_guard'",
            &[],
        )
        .unwrap()
        .get(0);
    assert_eq!(left, 0);
}

/// A cluster role for one test, dropped at the end (after the test's database, which holds its
/// privileges: declare it first).
struct Role {
    admin: String,
    name: String,
}

impl Drop for Role {
    fn drop(&mut self) {
        if let Ok(mut c) = Client::connect(&self.admin, NoTls) {
            let _ = c.batch_execute(&format!("DROP ROLE IF EXISTS {}", self.name));
        }
    }
}

/// The application usually connects as its own role, with rights on LangGraph's tables only.
/// The guard must guard its writes (the triggers run as the installer's role), and the role
/// must not be able to read or change the fence state.
fn an_application_role_without_rights_on_the_guard_is_guarded(version: u32) {
    let srv = server(version);
    let role = Role {
        admin: srv.admin.clone(),
        name: format!(
            "lethe_guard_app_{}_{}",
            std::process::id(),
            COUNTER.fetch_add(1, Ordering::SeqCst)
        ),
    };
    let db = Db::new(&srv);
    let mut c = db.client();
    let (cp, st) = (checkpointer(&db.url, "public"), store(&db.url, "public"));
    guard(&cp).install(&key()).unwrap();
    guard(&st).install(&key()).unwrap();
    c.batch_execute(&format!(
        "CREATE ROLE {r} LOGIN;
         GRANT CONNECT ON DATABASE {d} TO {r};
         GRANT USAGE ON SCHEMA public TO {r};
         GRANT SELECT, INSERT, UPDATE ON checkpoints, checkpoint_blobs, checkpoint_writes, store TO {r};",
        r = role.name,
        d = db.name
    ))
    .unwrap();
    let app_url = db.url.replacen("postgres@", &format!("{}@", role.name), 1);
    assert_ne!(app_url, db.url, "the admin URL names user postgres");
    let mut app = Client::connect(&app_url, NoTls).unwrap();

    // Ordinary writes are admitted as before.
    assert_eq!(
        write(
            &mut app,
            PUT_CHECKPOINT,
            &[&"app-1", &"c1", &meta("acme", "bob", None)]
        ),
        None
    );
    assert_eq!(write(&mut app, PUT_BLOB, &[&"app-1", &"1"]), None);
    assert_eq!(write(&mut app, PUT_WRITE, &[&"app-1", &"c1"]), None);
    assert_eq!(
        write(
            &mut app,
            PUT_ITEM,
            &[&"acme.bob.memories", &"app-k", &value(None)]
        ),
        None
    );
    // An erasure's fence refuses the application's writes for that subject, and only those;
    // a refused write leaves every row of every subject as it was.
    let s = scope("acme", "alice");
    let f = Fence::of(&s, Some(1), None);
    assert!(guard(&cp).close(&f).unwrap());
    let all_before = others(&mut c, &srv.manifest, "-", "-");
    let lt001 = Some("LT001".to_string());
    assert_eq!(
        write(
            &mut app,
            PUT_CHECKPOINT,
            &[&"app-2", &"c1", &meta("acme", "alice", Some(1))]
        ),
        lt001
    );
    assert_eq!(
        write(
            &mut app,
            PUT_ITEM,
            &[&"acme.alice.memories", &"app-k", &value(Some(1))]
        ),
        lt001
    );
    assert_eq!(
        others(&mut c, &srv.manifest, "-", "-"),
        all_before,
        "refused writes change nothing"
    );
    assert_eq!(
        write(
            &mut app,
            PUT_ITEM,
            &[&"acme.bob.memories", &"app-k2", &value(None)]
        ),
        None
    );
    guard(&cp).open(&f).unwrap();
    // The fence state is out of the application's reach.
    let denied = Some("42501".to_string());
    for sql in [
        "SELECT count(*) FROM lethe_guard.subject_fence",
        "SELECT ipad FROM lethe_guard.key",
        "DELETE FROM lethe_guard.known",
        "UPDATE lethe_guard.subject_fence SET fenced = false",
    ] {
        assert_eq!(write(&mut app, sql, &[]), denied, "{sql}");
    }
    drop(app);
}

macro_rules! both {
    ($($name:ident),* $(,)?) => {
        mod pg15 { $( #[test] fn $name() { super::$name(15) } )* }
        mod pg18 { $( #[test] fn $name() { super::$name(18) } )* }
    };
}

/// A transaction that wrote before the fence closed was admitted then; closing the fence waits
/// for it to end, so its rows are committed before the inventory and erased with the rest
/// (without the wait, an application transaction that committed after COMPLETE left them).
fn a_fence_waits_for_transactions_that_wrote_before_it(version: u32) {
    let srv = server(version);
    let db = Db::new(&srv);
    let cp = checkpointer(&db.url, "public");
    guard(&cp).install(&key()).unwrap();
    let mut app = db.client();
    let mut tx = app.transaction().unwrap();
    tx.execute(
        PUT_CHECKPOINT,
        &[&"late-1", &"c0", &meta("acme", "alice", None)],
    )
    .unwrap();
    let s = scope("acme", "alice");
    let f = Fence::of(&s, Some(1), None);
    std::thread::scope(|sc| {
        let closing = sc.spawn(|| guard(&cp).close(&f));
        let mut watch = db.client();
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(20);
        loop {
            let waiting: i64 = watch
                .query_one(
                    "SELECT count(*) FROM pg_locks WHERE NOT granted AND mode = 'ShareLock' AND locktype = 'relation'",
                    &[],
                )
                .unwrap()
                .get(0);
            if waiting > 0 {
                break;
            }
            assert!(
                !closing.is_finished(),
                "the fence closed without waiting for the open writer"
            );
            assert!(std::time::Instant::now() < deadline, "never waited");
            std::thread::yield_now();
        }
        tx.commit().unwrap();
        assert!(closing.join().unwrap().unwrap());
    });
    let inv = cp.adapter.inventory(&s).unwrap();
    assert!(
        inv.locators.iter().any(|(l, n)| l == "0:late-1" && *n == 1),
        "the late writer's thread is in the inventory"
    );
}

/// Closing a fence waits for earlier writers one table at a time, holding at most one lock: a
/// writer in the middle of LangGraph's `put` (its blobs written, its checkpoint next) for
/// another subject is not deadlocked by the wait (locking the three tables in one transaction
/// held `checkpoints` while waiting for `checkpoint_blobs`: 40P01 for one of the two).
fn a_fence_does_not_deadlock_a_put_in_flight(version: u32) {
    let srv = server(version);
    let db = Db::new(&srv);
    let cp = checkpointer(&db.url, "public");
    guard(&cp).install(&key()).unwrap();
    let mut app = db.client();
    let mut tx = app.transaction().unwrap();
    tx.execute(PUT_BLOB, &[&"put-1", &"1"]).unwrap();
    let s = scope("acme", "alice");
    let f = Fence::of(&s, Some(1), None);
    std::thread::scope(|sc| {
        let closing = sc.spawn(|| guard(&cp).close(&f));
        let mut watch = db.client();
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(20);
        // The wait has reached the blobs, which the writer holds.
        loop {
            let waiting: i64 = watch
                .query_one(
                    "SELECT count(*) FROM pg_locks WHERE NOT granted AND mode = 'ShareLock'
                        AND relation = 'public.checkpoint_blobs'::regclass",
                    &[],
                )
                .unwrap()
                .get(0);
            if waiting > 0 {
                break;
            }
            assert!(
                !closing.is_finished(),
                "the fence did not wait for the writer"
            );
            assert!(std::time::Instant::now() < deadline, "never waited");
            std::thread::yield_now();
        }
        // The put's next statement: its checkpoint, another subject's.
        tx.execute(
            PUT_CHECKPOINT,
            &[&"put-1", &"c1", &meta("acme", "bob", None)],
        )
        .expect("the writer's checkpoint is admitted, not deadlocked");
        tx.commit().unwrap();
        assert!(
            closing
                .join()
                .unwrap()
                .expect("the fence closes, not deadlocked"),
            "closed"
        );
    });
    let mut c = db.client();
    let n: i64 = c
        .query_one(
            "SELECT (SELECT count(*) FROM checkpoints WHERE thread_id = 'put-1')
                  + (SELECT count(*) FROM checkpoint_blobs WHERE thread_id = 'put-1')",
            &[],
        )
        .unwrap()
        .get(0);
    assert_eq!(n, 2, "the put committed whole");
    assert_eq!(
        write(
            &mut c,
            PUT_CHECKPOINT,
            &[&"put-2", &"c1", &meta("acme", "alice", None)]
        ),
        Some("LT001".to_string()),
        "the fence is closed"
    );
}

/// A REPEATABLE READ transaction whose snapshot predates the fence would read the fence state
/// as it was: its write is refused with a serialization failure (retry), and the retry, with a
/// new snapshot, meets the fence. READ COMMITTED writers are judged as before.
fn a_transaction_whose_snapshot_predates_the_fence_is_refused(version: u32) {
    old_snapshot_is_refused_then_fenced(version, false);
}

/// The same with a snapshot taken before the guard was installed, which sees no fence state at
/// all (not even the generation row). Found by review: the missing row compared as NULL, the
/// write was judged on the empty fence tables of its snapshot and admitted, and the job
/// completed over it.
fn a_snapshot_older_than_the_install_is_refused(version: u32) {
    old_snapshot_is_refused_then_fenced(version, true);
}

/// A REPEATABLE READ snapshot taken (before the install when `before_install`), then alice's
/// fence closed: her write gets `40001`, the retry `LT001`, and bob writes as before.
fn old_snapshot_is_refused_then_fenced(version: u32, before_install: bool) {
    let srv = server(version);
    let db = Db::new(&srv);
    let cp = checkpointer(&db.url, "public");
    if !before_install {
        guard(&cp).install(&key()).unwrap();
    }
    let mut app = db.client();
    app.batch_execute("BEGIN ISOLATION LEVEL REPEATABLE READ; SELECT count(*) FROM checkpoints")
        .unwrap();
    if before_install {
        guard(&cp).install(&key()).unwrap();
    }
    let s = scope("acme", "alice");
    assert!(guard(&cp).close(&Fence::of(&s, Some(1), None)).unwrap());
    assert_eq!(
        write(
            &mut app,
            PUT_CHECKPOINT,
            &[&"rr-1", &"c0", &meta("acme", "alice", None)]
        ),
        Some("40001".to_string()),
        "a snapshot from before the fence (install first: {}) is refused",
        !before_install
    );
    app.batch_execute("ROLLBACK").unwrap();
    assert_eq!(
        write(
            &mut app,
            PUT_CHECKPOINT,
            &[&"rr-1", &"c0", &meta("acme", "alice", None)]
        ),
        Some("LT001".to_string()),
        "the retry meets the fence"
    );
    assert_eq!(
        write(
            &mut app,
            PUT_CHECKPOINT,
            &[&"rr-2", &"c0", &meta("acme", "bob", None)]
        ),
        None,
        "others write as before"
    );
    let n: i64 = app
        .query_one(
            "SELECT count(*) FROM checkpoints WHERE thread_id = 'rr-1'",
            &[],
        )
        .unwrap()
        .get(0);
    assert_eq!(n, 0);
}

/// A fence change whose transaction died after it drew its generation (Lethe killed mid-change)
/// leaves the generation ahead of every snapshot: the next REPEATABLE READ write repairs it and
/// is judged as usual, where every such write was refused with `40001` until the next change
/// (review). A change that did commit since the snapshot is still refused.
fn a_generation_drawn_by_a_dead_change_is_repaired(version: u32) {
    let srv = server(version);
    let db = Db::new(&srv);
    let cp = checkpointer(&db.url, "public");
    guard(&cp).install(&key()).unwrap();
    let mut c = db.client();
    // A draw whose transaction rolls back: sequences are not transactional.
    c.batch_execute("BEGIN; SELECT nextval('lethe_guard.gen'); ROLLBACK")
        .unwrap();
    let mut app = db.client();
    for (i, who) in ["bob", "carol"].iter().enumerate() {
        app.batch_execute("BEGIN ISOLATION LEVEL REPEATABLE READ")
            .unwrap();
        assert_eq!(
            write(
                &mut app,
                PUT_CHECKPOINT,
                &[&format!("dead-{i}"), &"c0", &meta("acme", who, None)]
            ),
            None,
            "write {i} after a dead draw is admitted"
        );
        app.batch_execute("COMMIT").unwrap();
    }
    // A change committed after a snapshot still refuses it.
    app.batch_execute("BEGIN ISOLATION LEVEL REPEATABLE READ; SELECT count(*) FROM checkpoints")
        .unwrap();
    let s = scope("acme", "alice");
    assert!(guard(&cp).close(&Fence::of(&s, Some(1), None)).unwrap());
    assert_eq!(
        write(
            &mut app,
            PUT_CHECKPOINT,
            &[&"dead-9", &"c0", &meta("acme", "bob", None)]
        ),
        Some("40001".to_string())
    );
    app.batch_execute("ROLLBACK").unwrap();
}

both!(
    a_generation_drawn_by_a_dead_change_is_repaired,
    a_snapshot_older_than_the_install_is_refused,
    an_update_cannot_move_rows_out_of_a_fenced_or_erased_owner,
    a_fence_left_closed_with_a_later_epoch_fails_the_open,
    a_fence_does_not_deadlock_a_put_in_flight,
    a_transaction_whose_snapshot_predates_the_fence_is_refused,
    a_fence_waits_for_transactions_that_wrote_before_it,
    install_is_idempotent_and_uninstall_leaves_the_database_as_it_was,
    uninstall_is_refused_while_a_fence_is_closed,
    refuses_fenced_erased_and_stale_writes_and_admits_current_ones,
    tenant_and_memory_scopes,
    a_schema_name_that_needs_quoting_is_quoted,
    an_application_role_without_rights_on_the_guard_is_guarded,
    only_a_token_the_gate_issued_is_admitted,
);

/// The fencing token is the gate's MAC, not a number a writer can copy. After alice's erasure
/// (epoch 1), a checkpoint or store write carrying the current epoch is refused with a token
/// made up, one the gate issued to bob's lease, her own older lease's with its epoch raised,
/// another lease id's, or one made under another deployment's key; the gate's own token for her
/// is admitted. A guard keyed under another deployment key is not reinstalled over. Every
/// other subject's rows are unchanged, byte for byte.
fn only_a_token_the_gate_issued_is_admitted(version: u32) {
    let srv = server(version);
    let db = Db::new(&srv);
    let mut c = db.client();
    let (cp, st) = (checkpointer(&db.url, "public"), store(&db.url, "public"));
    guard(&cp).install(&key()).unwrap();
    guard(&st).install(&key()).unwrap();
    let bystanders = others(&mut c, &srv.manifest, "acme", "alice");
    let alice = scope("acme", "alice");
    let f = Fence::of(&alice, Some(1), None);
    for g in [&cp, &st] {
        assert!(guard(g).close(&f).unwrap());
        assert!(guard(g).open(&f).unwrap());
    }
    let genuine = token("acme", "alice", 1);
    let (lease, macs) = genuine.split_once('.').unwrap();
    assert_eq!(lease, "1");
    let forged: [(&str, serde_json::Value); 7] = [
        ("no token", serde_json::Value::Null),
        (
            "made up",
            format!("1.{}.{}", "0".repeat(64), "0".repeat(64)).into(),
        ),
        ("not a string", 7.into()),
        ("bob's lease's", token("acme", "bob", 1).into()),
        (
            "an older lease's, epoch raised",
            token("acme", "alice", 0).into(),
        ),
        ("another lease id's", format!("2.{macs}").into()),
        (
            "another deployment's",
            DeploymentKey::from_bytes([6; 32])
                .guard_key()
                .token(1, 1, 0, "acme", "alice")
                .into(),
        ),
    ];
    let lt002 = Some("LT002".to_string());
    for (n, (what, tok)) in forged.iter().enumerate() {
        let md = serde_json::json!({"tenant_id": "acme", "user_id": "alice", "lethe_epoch": 1, "lethe_token": tok});
        assert_eq!(
            write(
                &mut c,
                PUT_CHECKPOINT,
                &[&format!("forged-{n}"), &"c1", &md.to_string()]
            ),
            lt002,
            "a checkpoint with {what} token"
        );
        let v = serde_json::json!({"text": "back", "lethe_epoch": 1, "lethe_token": tok});
        assert_eq!(
            write(
                &mut c,
                PUT_ITEM,
                &[
                    &"acme.alice.memories",
                    &format!("forged-{n}"),
                    &v.to_string()
                ]
            ),
            lt002,
            "a store item with {what} token"
        );
    }
    assert_eq!(
        write(
            &mut c,
            PUT_CHECKPOINT,
            &[&"issued", &"c1", &meta("acme", "alice", Some(1))]
        ),
        None,
        "the gate's token"
    );
    assert_eq!(
        write(
            &mut c,
            PUT_ITEM,
            &[&"acme.alice.memories", &"issued", &value(Some(1))]
        ),
        None,
        "the gate's token"
    );
    let n: i64 = c
        .query_one(
            "SELECT count(*) FROM checkpoints WHERE thread_id LIKE 'forged-%'",
            &[],
        )
        .unwrap()
        .get(0);
    assert_eq!(n, 0);
    // Another deployment's key does not replace this one.
    let other = DeploymentKey::from_bytes([6; 32]).guard_key();
    let e = guard(&cp).install(&other).unwrap_err().to_string();
    assert!(e.contains("another deployment key"), "{e}");
    guard(&cp).install(&key()).unwrap();
    // The two rows this test wrote for alice, then everyone else's, byte for byte.
    c.batch_execute("DELETE FROM checkpoints WHERE thread_id = 'issued'; DELETE FROM store WHERE key = 'issued'")
        .unwrap();
    assert_eq!(others(&mut c, &srv.manifest, "acme", "alice"), bystanders);
}
