//! The conformance suite on LangGraph's SQLite schema, against files written by real LangGraph
//! (tests/fixtures), for every subject of both fixture sets: the demo subjects and the awkward
//! identifiers (`%`, `_`, `*`, `?`, `[`, `'`, `:`, `/`, spaces, non-ASCII, prefix neighbours).
//!
//! Ownership comes from the fixture manifest and from splitting namespace labels in Rust, never
//! from the adapters' own SQL, so an adapter that matches too much or too little is caught.

use std::collections::HashMap;
use std::path::{Path, PathBuf};

use lethe_adapters::conformance::{self, Case, Row};
use lethe_adapters::{Adapter, AdapterError, Applicability, Target};
use lethe_core::{MemoryId, Scope, Subject, Tenant, Version};
use rusqlite::Connection;

fn fixtures(set: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../../tests/fixtures")
        .join(set)
}

/// A fresh copy of a fixture set in a temp dir.
struct Copy {
    dir: tempfile::TempDir,
    manifest: serde_json::Value,
}

fn copy(set: &str) -> Copy {
    let dir = tempfile::tempdir().unwrap();
    for f in ["checkpoints.db", "store.db", "app.db"] {
        std::fs::copy(fixtures(set).join(f), dir.path().join(f)).unwrap();
    }
    let manifest = serde_json::from_str(
        &std::fs::read_to_string(fixtures(set).join("manifest.json")).unwrap(),
    )
    .unwrap();
    Copy { dir, manifest }
}

fn target(dir: &Path, toml_text: &str) -> Target {
    let table: toml::Table = toml::from_str(toml_text).unwrap();
    lethe_adapters::build(1, table, dir).unwrap()
}

const CHECKPOINTER: &str = r#"
name = "checkpoints"
kind = "langgraph-sqlite-checkpointer"
class = "primary"
path = "checkpoints.db"
registry = { path = "app.db", table = "thread_registry", tenant = "tenant_id", subject = "user_id", thread = "thread_id" }
metadata = { tenant = "tenant_id", subject = "user_id" }
"#;

const STORE: &str = r#"
name = "memories"
kind = "langgraph-sqlite-store"
class = "primary"
path = "store.db"
namespace = ["{tenant}", "{subject}"]
"#;

/// Every row of `tables` in a file, as `quote()`d column text, in primary-key order.
fn dump(
    path: &Path,
    tables: &[&str],
    owner: &dyn Fn(&str, &Connection, &str) -> (String, String),
) -> Vec<Row> {
    let conn = Connection::open(path).unwrap();
    let mut out = Vec::new();
    for t in tables {
        let cols: Vec<String> = conn
            .prepare(&format!("SELECT name FROM pragma_table_info('{t}')"))
            .unwrap()
            .query_map([], |r| r.get(0))
            .unwrap()
            .collect::<Result<_, _>>()
            .unwrap();
        let expr = cols
            .iter()
            .map(|c| format!("quote(\"{c}\")"))
            .collect::<Vec<_>>()
            .join(" || ',' || ");
        let mut stmt = conn
            .prepare(&format!("SELECT rowid, {expr} FROM \"{t}\" ORDER BY rowid"))
            .unwrap();
        let rows: Vec<(i64, String)> = stmt
            .query_map([], |r| Ok((r.get(0)?, r.get(1)?)))
            .unwrap()
            .collect::<Result<_, _>>()
            .unwrap();
        for (rowid, text) in rows {
            let o = owner(t, &conn, &rowid.to_string());
            out.push(Row {
                table: t.to_string(),
                bytes: text.into_bytes(),
                owner: o,
            });
        }
    }
    out.sort();
    out
}

fn none() -> (String, String) {
    (String::new(), String::new())
}

/// The owner of a store row: its first two namespace labels.
fn label_owner(t: &str, conn: &Connection, rowid: &str) -> (String, String) {
    if t != "store" && t != "store_vectors" {
        return none();
    }
    let prefix: String = conn
        .query_row(
            &format!("SELECT prefix FROM {t} WHERE rowid = {rowid}"),
            [],
            |r| r.get(0),
        )
        .unwrap();
    let labels: Vec<&str> = prefix.split('.').collect();
    (
        labels[0].to_string(),
        labels.get(1).unwrap_or(&"").to_string(),
    )
}

struct CheckpointerCase {
    dir: PathBuf,
    adapter: Target,
    thread_owner: HashMap<String, (String, String)>,
}

impl Case for CheckpointerCase {
    fn adapter(&self) -> &dyn Adapter {
        self.adapter.adapter.as_ref()
    }
    fn snapshot(&self) -> Vec<Row> {
        let threads = &self.thread_owner;
        let mut rows = dump(
            &self.dir.join("checkpoints.db"),
            &["checkpoints", "writes"],
            &|t, c, rowid| {
                let th: String = c
                    .query_row(
                        &format!("SELECT thread_id FROM {t} WHERE rowid = {rowid}"),
                        [],
                        |r| r.get(0),
                    )
                    .unwrap();
                threads.get(&th).cloned().unwrap_or_else(none)
            },
        );
        rows.extend(dump(
            &self.dir.join("app.db"),
            &["thread_registry"],
            &|_, c, rowid| {
                c.query_row(
                    &format!(
                        "SELECT tenant_id, user_id FROM thread_registry WHERE rowid = {rowid}"
                    ),
                    [],
                    |r| Ok((r.get(0)?, r.get(1)?)),
                )
                .unwrap()
            },
        ));
        rows.sort();
        rows
    }
}

struct StoreCase {
    dir: PathBuf,
    adapter: Target,
}

impl Case for StoreCase {
    fn adapter(&self) -> &dyn Adapter {
        self.adapter.adapter.as_ref()
    }
    fn snapshot(&self) -> Vec<Row> {
        dump(
            &self.dir.join("store.db"),
            &[
                "store",
                "store_vectors",
                "store_migrations",
                "vector_migrations",
            ],
            &label_owner,
        )
    }
}

fn subjects(m: &serde_json::Value) -> Vec<(String, String)> {
    m["subjects"]
        .as_array()
        .unwrap()
        .iter()
        .map(|s| {
            (
                s["tenant_id"].as_str().unwrap().into(),
                s["user_id"].as_str().unwrap().into(),
            )
        })
        .collect()
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

/// Erases each subject of a fixture set in its own fresh copy, through both adapters.
fn erase_every_subject(set: &str, batch: usize) {
    let probe = copy(set);
    let subs = subjects(&probe.manifest);
    assert!(subs.len() >= 3, "fixture has several subjects");
    for (t, s) in &subs {
        let c = copy(set);
        let scope = subject_scope(t, s);
        let me = (t.clone(), s.clone());
        let in_scope = |o: &(String, String)| *o == me;

        let case = CheckpointerCase {
            dir: c.dir.path().into(),
            adapter: target(c.dir.path(), CHECKPOINTER),
            thread_owner: thread_owners(&c.manifest),
        };
        let out = conformance::run(&case, &scope, &in_scope, batch);
        let counts = &c.manifest["subjects"]
            .as_array()
            .unwrap()
            .iter()
            .find(|x| x["tenant_id"] == t.as_str() && x["user_id"] == s.as_str())
            .unwrap()["counts"];
        let want = counts["checkpoints_rows"].as_u64().unwrap()
            + counts["writes_rows"].as_u64().unwrap()
            + counts["registry_rows"].as_u64().unwrap();
        assert_eq!(
            out.inventoried, want,
            "checkpointer inventory matches the manifest for a subject of {set}"
        );

        let case = StoreCase {
            dir: c.dir.path().into(),
            adapter: target(c.dir.path(), STORE),
        };
        let out = conformance::run(&case, &scope, &in_scope, batch);
        let want =
            counts["store_rows"].as_u64().unwrap() + counts["store_vectors_rows"].as_u64().unwrap();
        assert_eq!(
            out.inventoried, want,
            "store inventory matches the manifest (expired rows included) for a subject of {set}"
        );
    }
}

#[test]
fn erases_each_demo_subject_exactly_and_keeps_the_others_byte_for_byte() {
    erase_every_subject("langgraph-sqlite", 500);
}

#[test]
fn erases_each_awkward_identifier_exactly_in_batches_of_one() {
    // Batches of one locator also exercise the registry-last ordering across transactions.
    erase_every_subject("langgraph-sqlite-tricky", 1);
}

#[test]
fn finds_threads_only_in_metadata_and_only_in_the_registry() {
    let c = copy("langgraph-sqlite");
    let alice = c.manifest["subjects"]
        .as_array()
        .unwrap()
        .iter()
        .find(|x| x["user_id"] == "alice")
        .unwrap()
        .clone();
    let threads = alice["threads"].as_array().unwrap();
    assert!(
        threads
            .iter()
            .any(|t| t["in_registry"] == false && t["in_metadata"] == true),
        "fixture has a metadata-only thread"
    );
    assert!(
        threads
            .iter()
            .any(|t| t["in_registry"] == true && t["in_metadata"] == false),
        "fixture has a registry-only thread"
    );
    let tg = target(c.dir.path(), CHECKPOINTER);
    let inv = tg
        .adapter
        .inventory(&subject_scope("acme", "alice"))
        .unwrap();
    for t in threads {
        let loc = format!("0:{}", t["thread_id"].as_str().unwrap());
        assert!(
            inv.locators.iter().any(|(l, n)| *l == loc && *n > 0),
            "every thread of the subject is in the inventory"
        );
    }
    // Registry only: the metadata-only thread is missed. Metadata only: the registry-only one.
    for (cfg, missing) in [
        (CHECKPOINTER.replace("metadata = { tenant = \"tenant_id\", subject = \"user_id\" }", ""), "in_registry"),
        (CHECKPOINTER.replace("registry = { path = \"app.db\", table = \"thread_registry\", tenant = \"tenant_id\", subject = \"user_id\", thread = \"thread_id\" }", ""), "in_metadata"),
    ] {
        let inv = target(c.dir.path(), &cfg).adapter.inventory(&subject_scope("acme", "alice")).unwrap();
        let only_other = threads.iter().find(|t| t[missing] == false).unwrap();
        let loc = format!("0:{}", only_other["thread_id"].as_str().unwrap());
        assert!(!inv.locators.iter().any(|(l, _)| *l == loc), "a single source misses what only the other knows");
    }
    // Python's `json.dumps`, which `SqliteSaver.put` uses, writes a run config's infinite or
    // not-a-number float as `Infinity` or `NaN`: outside strict JSON, still the owner's thread.
    let only_meta = threads.iter().find(|t| t["in_registry"] == false).unwrap()["thread_id"]
        .as_str()
        .unwrap();
    let before = inv.count;
    Connection::open(c.dir.path().join("checkpoints.db"))
        .unwrap()
        .execute(
            "UPDATE checkpoints SET metadata = CAST(replace(CAST(metadata AS TEXT), '{', \
             '{\"max_cost\": Infinity, \"ratio\": NaN, ') AS BLOB) WHERE thread_id = ?1",
            [only_meta],
        )
        .unwrap();
    let case = CheckpointerCase {
        dir: c.dir.path().to_path_buf(),
        adapter: target(c.dir.path(), CHECKPOINTER),
        thread_owner: thread_owners(&c.manifest),
    };
    let others = || case.others("acme", "alice");
    let kept = others();
    let s = subject_scope("acme", "alice");
    let inv = tg.adapter.inventory(&s).unwrap();
    assert_eq!(inv.count, before, "the thread is still found");
    assert_eq!(tg.adapter.erase_batch(&s, &inv.locators).unwrap(), before);
    assert_eq!(tg.adapter.verify(&s, &inv.locators).unwrap(), 0);
    assert_eq!(others(), kept, "every other subject's rows, byte for byte");
}

#[test]
fn tenant_scope_takes_the_tenant_and_never_its_prefix_neighbour() {
    let c = copy("langgraph-sqlite-tricky");
    let scope = Scope::Tenant {
        tenant: Tenant::new("a").unwrap(),
    };
    let in_scope = |o: &(String, String)| o.0 == "a";
    let case = CheckpointerCase {
        dir: c.dir.path().into(),
        adapter: target(c.dir.path(), CHECKPOINTER),
        thread_owner: thread_owners(&c.manifest),
    };
    conformance::run(&case, &scope, &in_scope, 3);
    let case = StoreCase {
        dir: c.dir.path().into(),
        adapter: target(c.dir.path(), STORE),
    };
    conformance::run(&case, &scope, &in_scope, 3);
    // Tenant `ab` is still whole (conformance::run checked it byte for byte); say so plainly.
    let left = target(c.dir.path(), STORE)
        .adapter
        .inventory(&Scope::Tenant {
            tenant: Tenant::new("ab").unwrap(),
        })
        .unwrap();
    assert!(left.count > 0);
}

#[test]
fn refuses_an_identifier_the_namespace_layout_cannot_express() {
    let c = copy("langgraph-sqlite");
    let before = std::fs::read(c.dir.path().join("store.db")).unwrap();
    let store = target(c.dir.path(), STORE);
    for scope in [
        subject_scope("acme", "al.ice"),
        subject_scope("ac.me", "alice"),
    ] {
        match store.adapter.check_scope(&scope) {
            Err(AdapterError::Inexpressible { why, .. }) => {
                assert!(why.contains("'.'"), "the message says what is wrong: {why}");
                assert!(
                    !why.contains("al.ice") && !why.contains("ac.me"),
                    "and never echoes the identifier"
                );
            }
            other => panic!("expected Inexpressible, got {other:?}"),
        }
    }
    assert_eq!(
        std::fs::read(c.dir.path().join("store.db")).unwrap(),
        before
    );
    // The checkpointer matches by SQL parameter, so the same scope is expressible there.
    assert_eq!(
        target(c.dir.path(), CHECKPOINTER)
            .adapter
            .check_scope(&subject_scope("acme", "al.ice"))
            .unwrap(),
        Applicability::Applies
    );
}

#[test]
fn anomaly_guard_rolls_back_a_batch_that_would_erase_more_than_its_inventory() {
    let c = copy("langgraph-sqlite");
    let scope = subject_scope("acme", "alice");
    for cfg in [CHECKPOINTER, STORE] {
        let tg = target(c.dir.path(), cfg);
        let inv = tg.adapter.inventory(&scope).unwrap();
        let file = if cfg == STORE {
            "store.db"
        } else {
            "checkpoints.db"
        };
        let before = std::fs::read(c.dir.path().join(file)).unwrap();
        // An inventory that understates one locator's rows: the delete finds more.
        let mut understated = inv.locators.clone();
        let i = understated.iter().position(|(_, n)| *n > 0).unwrap();
        understated[i].1 -= 1;
        match tg.adapter.erase_batch(&scope, &understated) {
            Err(AdapterError::AnomalousVolume {
                expected, found, ..
            }) => assert!(found > expected),
            other => panic!("expected AnomalousVolume, got {other:?}"),
        }
        assert_eq!(
            tg.adapter.inventory(&scope).unwrap(),
            inv,
            "nothing of the batch was committed"
        );
        assert_eq!(std::fs::read(c.dir.path().join(file)).unwrap(), before);
    }
}

#[test]
fn memory_scope_erases_one_item_and_its_vectors_and_nothing_else() {
    let c = copy("langgraph-sqlite");
    let store = target(c.dir.path(), STORE);
    let conn = Connection::open(c.dir.path().join("store.db")).unwrap();
    // An alice item with vectors, in the `memories` namespace.
    let (key, updated): (String, String) = conn
        .query_row(
            "SELECT s.key, s.updated_at FROM store s WHERE s.prefix = 'acme.alice.memories'
               AND EXISTS (SELECT 1 FROM store_vectors v WHERE v.prefix = s.prefix AND v.key = s.key) LIMIT 1",
            [],
            |r| Ok((r.get(0)?, r.get(1)?)),
        )
        .unwrap();
    // `SqliteStore` stores `CURRENT_TIMESTAMP` text; the version is that time in UTC with
    // microseconds, as on PostgreSQL and as the Python client's `item_version` writes it.
    assert_eq!(updated.len(), 19, "{updated}");
    let updated = format!("{}.000000Z", updated.replace(' ', "T"));
    let memory = MemoryId::new(format!("memories/{key}")).unwrap();
    let mk = |v: Option<&str>| Scope::Memory {
        tenant: Tenant::new("acme").unwrap(),
        subject: Subject::new("alice").unwrap(),
        memory: memory.clone(),
        version: v.map(|v| Version::new(v).unwrap()),
    };
    assert_eq!(
        store
            .adapter
            .current_version(&mk(None))
            .unwrap()
            .unwrap()
            .as_str(),
        updated
    );
    // Another version of the same memory is another memory version: nothing to erase.
    assert_eq!(
        store
            .adapter
            .inventory(&mk(Some("1999-01-01T00:00:00.000000Z")))
            .unwrap()
            .count,
        0
    );
    let scope = mk(Some(&updated));
    let owner_key = key.clone();
    let case = StoreCase {
        dir: c.dir.path().into(),
        adapter: target(c.dir.path(), STORE),
    };
    let before = case.snapshot();
    let inv = store.adapter.inventory(&scope).unwrap();
    assert!(inv.count >= 2, "the item and at least one vector");
    assert_eq!(
        store.adapter.erase_batch(&scope, &inv.locators).unwrap(),
        inv.count
    );
    assert_eq!(store.adapter.verify(&scope, &inv.locators).unwrap(), 0);
    let after = case.snapshot();
    let quoted = format!("'acme.alice.memories','{owner_key}'");
    conformance::assert_only_removed(&before, &after, inv.count as usize, &|r| {
        String::from_utf8_lossy(&r.bytes).starts_with(&quoted)
    });
    let still = |k: &str| {
        conn.query_row(
            "SELECT count(*) FROM store WHERE prefix = 'acme.alice.memories' AND key = ?1",
            [k],
            |r| r.get::<_, i64>(0),
        )
        .unwrap()
    };
    assert_eq!(still(&owner_key), 0);
    let others: i64 = conn
        .query_row(
            "SELECT count(*) FROM store WHERE prefix LIKE 'acme.alice%'",
            [],
            |r| r.get(0),
        )
        .unwrap();
    assert!(others > 0, "alice's other memories stay");
}

#[test]
fn orphaned_vectors_left_by_langgraph_delete_are_residue_and_get_erased() {
    let c = copy("langgraph-sqlite");
    // What SqliteStore.delete does: the item goes, its vectors stay (foreign keys are off on
    // LangGraph's connections; the bundled SQLite here defaults them on, so turn them off).
    let conn = Connection::open(c.dir.path().join("store.db")).unwrap();
    conn.pragma_update(None, "foreign_keys", "OFF").unwrap();
    let orphaned = conn
        .execute("DELETE FROM store WHERE prefix = 'acme.alice.memories'", [])
        .unwrap();
    assert!(orphaned > 0);
    let vectors: i64 = conn
        .query_row(
            "SELECT count(*) FROM store_vectors WHERE prefix = 'acme.alice.memories'",
            [],
            |r| r.get(0),
        )
        .unwrap();
    assert!(vectors > 0, "fixture items have vectors");
    let store = target(c.dir.path(), STORE);
    let scope = subject_scope("acme", "alice");
    assert!(
        store.adapter.verify(&scope, &[]).unwrap() >= vectors as u64,
        "verify counts orphaned vectors"
    );
    let case = StoreCase {
        dir: c.dir.path().into(),
        adapter: target(c.dir.path(), STORE),
    };
    conformance::run(
        &case,
        &scope,
        &|o| *o == ("acme".to_string(), "alice".to_string()),
        500,
    );
}

#[test]
fn identifiers_of_256_bytes_match_exactly() {
    let c = copy("langgraph-sqlite");
    let long = "é".repeat(128); // 256 bytes of UTF-8
    let shorter = "é".repeat(127);
    let conn = Connection::open(c.dir.path().join("store.db")).unwrap();
    for (s, k) in [(&long, "k1"), (&shorter, "k2")] {
        conn.execute(
            "INSERT INTO store (prefix, key, value) VALUES (?1, ?2, '{}')",
            [format!("acme.{s}.memories"), k.to_string()],
        )
        .unwrap();
    }
    let scope = subject_scope("acme", &long);
    let case = StoreCase {
        dir: c.dir.path().into(),
        adapter: target(c.dir.path(), STORE),
    };
    let out = conformance::run(
        &case,
        &scope,
        &|o| *o == ("acme".to_string(), long.clone()),
        500,
    );
    assert_eq!(out.inventoried, 1);
}

#[test]
fn an_application_table_cascading_from_store_is_not_deleted_behind_the_count() {
    // With foreign keys on (the bundled SQLite's default), deleting a store item would cascade
    // into this table uncounted. Lethe's connections keep them off, as LangGraph's do.
    let c = copy("langgraph-sqlite");
    let conn = Connection::open(c.dir.path().join("store.db")).unwrap();
    conn.execute_batch(
        "CREATE TABLE app_notes (prefix TEXT, key TEXT, note TEXT,
           FOREIGN KEY (prefix, key) REFERENCES store (prefix, key) ON DELETE CASCADE);
         INSERT INTO app_notes SELECT prefix, key, 'n' FROM store;",
    )
    .unwrap();
    let notes = |conn: &Connection| {
        conn.query_row("SELECT count(*) FROM app_notes", [], |r| r.get::<_, i64>(0))
            .unwrap()
    };
    let n = notes(&conn);
    let store = target(c.dir.path(), STORE);
    let scope = subject_scope("acme", "alice");
    let inv = store.adapter.inventory(&scope).unwrap();
    assert_eq!(
        store.adapter.erase_batch(&scope, &inv.locators).unwrap(),
        inv.count
    );
    assert_eq!(notes(&conn), n, "no uncounted cascade");
}

#[test]
fn a_thread_whose_checkpoints_name_two_owners_is_refused_not_erased() {
    let c = copy("langgraph-sqlite");
    let conn = Connection::open(c.dir.path().join("checkpoints.db")).unwrap();
    // One of alice's threads gets a checkpoint that says it is bob's.
    let n = conn
        .execute(
            "UPDATE checkpoints SET metadata = CAST(replace(CAST(metadata AS TEXT), '\"alice\"', '\"bob\"') AS BLOB)
              WHERE rowid = (SELECT min(rowid) FROM checkpoints
                              WHERE json_extract(CAST(metadata AS TEXT), '$.user_id') = 'alice')",
            [],
        )
        .unwrap();
    assert_eq!(n, 1);
    let before = std::fs::read(c.dir.path().join("checkpoints.db")).unwrap();
    let tg = target(c.dir.path(), CHECKPOINTER);
    refused_as_anothers(&tg, "alice", "another owner");
    assert_eq!(
        std::fs::read(c.dir.path().join("checkpoints.db")).unwrap(),
        before
    );
}

/// The inventory of acme/`who` is refused, naming `why`.
fn refused_as_anothers(tg: &Target, who: &str, why: &str) {
    match tg.adapter.inventory(&subject_scope("acme", who)) {
        Err(AdapterError::Failed { why: w, .. }) => assert!(w.contains(why), "{who}: {w}"),
        other => panic!("{who}: expected a refusal, got {other:?}"),
    }
}

/// A subject's threads, from the fixture manifest.
fn threads_of(c: &Copy, tenant: &str, subject: &str) -> Vec<String> {
    c.manifest["subjects"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|x| x["tenant_id"] == tenant && x["user_id"] == subject)
        .flat_map(|x| x["threads"].as_array().unwrap().iter())
        .map(|t| t["thread_id"].as_str().unwrap().to_string())
        .collect()
}

/// Every checkpoint and write of a thread not in `threads`, byte for byte.
fn rows_not_of(c: &Copy, threads: &[String]) -> Vec<Row> {
    dump(
        &c.dir.path().join("checkpoints.db"),
        &["checkpoints", "writes"],
        &|_, _, _| none(),
    )
    .into_iter()
    .filter(|r| {
        let text = String::from_utf8_lossy(&r.bytes);
        !threads.iter().any(|t| text.contains(t.as_str()))
    })
    .collect()
}

/// The checkpointer with its registry in table `table` of app.db, registry only or with the
/// metadata keys too.
fn checkpointer_with_registry(table: &str, metadata: bool) -> String {
    let c = CHECKPOINTER.replace(
        "table = \"thread_registry\"",
        &format!("table = \"{table}\""),
    );
    if metadata {
        c
    } else {
        c.replace(
            "metadata = { tenant = \"tenant_id\", subject = \"user_id\" }",
            "",
        )
    }
}

/// A registry column compares under its own collation (`NOCASE`) or affinity (`INTEGER`) unless
/// the adapter compares bytes: `alice` must not take `Alice`'s row, nor `007` user 7's.
#[test]
fn a_registry_column_with_its_own_collation_or_affinity_never_widens_the_scope() {
    let c = copy("langgraph-sqlite");
    let app = Connection::open(c.dir.path().join("app.db")).unwrap();
    app.execute_batch(
        "CREATE TABLE reg_nocase (tenant_id TEXT, user_id TEXT COLLATE NOCASE, thread_id TEXT);
         INSERT INTO reg_nocase SELECT tenant_id, user_id, thread_id FROM thread_registry;
         INSERT INTO reg_nocase VALUES ('acme', 'Alice', 't-Alice-1'), ('ACME', 'alice', 't-ACME-1');
         CREATE INDEX reg_nocase_owner ON reg_nocase (tenant_id, user_id);
         CREATE TABLE reg_int (tenant_id TEXT, user_id INTEGER, thread_id TEXT);
         INSERT INTO reg_int VALUES ('acme', 7, 't-7'), ('acme', 7, 't-7b'), ('acme', 8, 't-8');",
    )
    .unwrap();
    drop(app);
    let rows = |table: &str| -> Vec<String> {
        let app = Connection::open(c.dir.path().join("app.db")).unwrap();
        let mut st = app
            .prepare(&format!("SELECT quote(tenant_id) || quote(user_id) || quote(thread_id) FROM {table} ORDER BY 1"))
            .unwrap();
        let r = st
            .query_map([], |r| r.get(0))
            .unwrap()
            .map(Result::unwrap)
            .collect();
        r
    };

    // Every checkpoint and write of a thread that is not alice's, byte for byte.
    let alice_threads = threads_of(&c, "acme", "alice");
    let not_alices = || rows_not_of(&c, &alice_threads);
    let kept = not_alices();
    assert!(!kept.is_empty());
    let tg = target(
        c.dir.path(),
        &checkpointer_with_registry("reg_nocase", false),
    );
    let alice = subject_scope("acme", "alice");
    let inv = tg.adapter.inventory(&alice).unwrap();
    let registry: Vec<&str> = inv
        .locators
        .iter()
        .filter_map(|(l, _)| l.strip_prefix("1:"))
        .collect();
    assert_eq!(
        registry.len(),
        3,
        "alice's three rows, not Alice's or ACME's: {registry:?}"
    );
    assert!(!registry.contains(&"t-Alice-1") && !registry.contains(&"t-ACME-1"));
    let others = rows("reg_nocase")
        .into_iter()
        .filter(|r| !r.starts_with("'acme''alice'"))
        .collect::<Vec<_>>();
    tg.adapter.erase_batch(&alice, &inv.locators).unwrap();
    assert_eq!(tg.adapter.verify(&alice, &inv.locators).unwrap(), 0);
    assert_eq!(
        rows("reg_nocase"),
        others,
        "every other row kept, Alice's and ACME's included"
    );
    assert!(
        not_alices() == kept,
        "every other thread's rows kept byte for byte"
    );

    let tg = target(c.dir.path(), &checkpointer_with_registry("reg_int", false));
    let inv = tg.adapter.inventory(&subject_scope("acme", "007")).unwrap();
    assert!(inv.locators.is_empty(), "007 is not 7: {:?}", inv.locators);
    let seven = subject_scope("acme", "7");
    let inv = tg.adapter.inventory(&seven).unwrap();
    let registry = inv
        .locators
        .iter()
        .filter(|(l, _)| l.starts_with("1:"))
        .count();
    assert_eq!(registry, 2, "{:?}", inv.locators);
    tg.adapter.erase_batch(&seven, &inv.locators).unwrap();
    assert_eq!(rows("reg_int"), ["'acme'8't-8'"]);
}

/// A thread in scope that the registry also gives to another owner, or whose checkpoint names
/// another subject without naming a tenant, is refused, not erased.
#[test]
fn a_thread_another_owner_holds_by_registry_or_by_subject_alone_is_refused() {
    let c = copy("langgraph-sqlite");
    let shared = "b686140c-73aa-581f-8876-11535da350c4"; // alice's, in registry and metadata
    let app = Connection::open(c.dir.path().join("app.db")).unwrap();
    app.execute_batch(&format!(
        "CREATE TABLE reg_multi (tenant_id TEXT, user_id TEXT, thread_id TEXT);
         INSERT INTO reg_multi SELECT tenant_id, user_id, thread_id FROM thread_registry;
         INSERT INTO reg_multi VALUES ('acme', 'bob', '{shared}');"
    ))
    .unwrap();
    drop(app);
    let before: Vec<Vec<u8>> = ["checkpoints.db", "app.db"]
        .iter()
        .map(|f| std::fs::read(c.dir.path().join(f)).unwrap())
        .collect();
    for metadata in [false, true] {
        let tg = target(
            c.dir.path(),
            &checkpointer_with_registry("reg_multi", metadata),
        );
        for who in ["alice", "bob"] {
            refused_as_anothers(&tg, who, "registered to another owner");
        }
    }
    // A checkpoint of alice's thread that names bob and no tenant.
    let conn = Connection::open(c.dir.path().join("checkpoints.db")).unwrap();
    let n = conn
        .execute(
            "UPDATE checkpoints SET metadata = CAST(json_set(json_remove(CAST(metadata AS TEXT), '$.tenant_id'), '$.user_id', 'bob') AS BLOB)
              WHERE rowid = (SELECT min(rowid) FROM checkpoints WHERE thread_id = ?1)",
            [shared],
        )
        .unwrap();
    assert_eq!(n, 1);
    drop(conn);
    let before_cp = std::fs::read(c.dir.path().join("checkpoints.db")).unwrap();
    let tg = target(c.dir.path(), CHECKPOINTER);
    refused_as_anothers(&tg, "alice", "another owner");
    assert_eq!(
        std::fs::read(c.dir.path().join("checkpoints.db")).unwrap(),
        before_cp
    );
    assert_eq!(
        std::fs::read(c.dir.path().join("app.db")).unwrap(),
        before[1]
    );
}

/// Metadata that spells the owner with a JSON escape (`\u0061lice`) or as a number names the
/// same owner: the byte pre-filter must not skip it.
#[test]
fn metadata_that_escapes_the_owner_or_gives_it_as_a_number_is_found() {
    let c = copy("langgraph-sqlite");
    let only_meta = "cb71b0fe-18db-56ff-bda1-2e7860b6319c"; // alice's, metadata only
    let conn = Connection::open(c.dir.path().join("checkpoints.db")).unwrap();
    let n = conn
        .execute(
            "UPDATE checkpoints SET metadata = CAST(replace(CAST(metadata AS TEXT), '\"alice\"', '\"\\u0061lice\"') AS BLOB)
              WHERE thread_id = ?1",
            [only_meta],
        )
        .unwrap();
    assert!(n > 0);
    drop(conn);
    let alice_threads = threads_of(&c, "acme", "alice");
    let kept = rows_not_of(&c, &alice_threads);
    let cfg = checkpointer_with_registry("thread_registry", true);
    let tg = target(c.dir.path(), &cfg);
    let alice = subject_scope("acme", "alice");
    let inv = tg.adapter.inventory(&alice).unwrap();
    let loc = format!("0:{only_meta}");
    assert!(
        inv.locators.iter().any(|(l, n)| *l == loc && *n > 0),
        "{:?}",
        inv.locators
    );
    tg.adapter.erase_batch(&alice, &inv.locators).unwrap();
    assert_eq!(tg.adapter.verify(&alice, &inv.locators).unwrap(), 0);
    assert!(
        rows_not_of(&c, &alice_threads) == kept,
        "every other thread's rows kept byte for byte"
    );

    // A numeric owner: `7` names subject "7", as PostgreSQL's `->>` reads it.
    let conn = Connection::open(c.dir.path().join("checkpoints.db")).unwrap();
    let bob_thread: String = conn
        .query_row(
            "SELECT thread_id FROM checkpoints WHERE json_extract(CAST(metadata AS TEXT), '$.user_id') = 'bob' LIMIT 1",
            [],
            |r| r.get(0),
        )
        .unwrap();
    conn.execute(
        "UPDATE checkpoints SET metadata = CAST(json_set(CAST(metadata AS TEXT), '$.user_id', 7) AS BLOB) WHERE thread_id = ?1",
        [&bob_thread],
    )
    .unwrap();
    drop(conn);
    // Metadata only: the registry still gives that thread to bob, which would refuse it.
    let cfg = CHECKPOINTER.replace("registry = { path = \"app.db\", table = \"thread_registry\", tenant = \"tenant_id\", subject = \"user_id\", thread = \"thread_id\" }", "");
    let tg = target(c.dir.path(), &cfg);
    let inv = tg.adapter.inventory(&subject_scope("acme", "7")).unwrap();
    assert!(
        inv.locators
            .iter()
            .any(|(l, _)| *l == format!("0:{bob_thread}")),
        "{:?}",
        inv.locators
    );

    // An integer past i64 names the subject of its digits (it was read as a float, never
    // found, and certified gone); `true` names subject "true", never "1" (it was read as 1).
    for (value, owner, not_owner) in [
        (
            "18446744073709551615",
            "18446744073709551615",
            "1.84467440737096e+19",
        ),
        ("true", "true", "1"),
    ] {
        let conn = Connection::open(c.dir.path().join("checkpoints.db")).unwrap();
        conn.execute(
            &format!(
                "UPDATE checkpoints SET metadata = CAST(json_set(CAST(metadata AS TEXT), '$.user_id', json('{value}')) AS BLOB) WHERE thread_id = ?1"
            ),
            [&bob_thread],
        )
        .unwrap();
        drop(conn);
        let has = |subject: &str| {
            tg.adapter
                .inventory(&subject_scope("acme", subject))
                .unwrap()
                .locators
                .iter()
                .any(|(l, _)| *l == format!("0:{bob_thread}"))
        };
        assert!(has(owner), "{value} names {owner}");
        assert!(!has(not_owner), "{value} does not name {not_owner}");
        let scope = subject_scope("acme", owner);
        let inv = tg.adapter.inventory(&scope).unwrap();
        assert!(
            tg.adapter.verify(&scope, &inv.locators).unwrap() > 0,
            "{value}: not clean before"
        );
    }
    // A number PostgreSQL spells otherwise (`1e3` is `1000` there) names no one here: neither
    // its digits as written nor PostgreSQL's.
    let conn = Connection::open(c.dir.path().join("checkpoints.db")).unwrap();
    conn.execute(
        "UPDATE checkpoints SET metadata = CAST(json_set(CAST(metadata AS TEXT), '$.user_id', json('1e3')) AS BLOB) WHERE thread_id = ?1",
        [&bob_thread],
    )
    .unwrap();
    drop(conn);
    for subject in ["1e3", "1000"] {
        let inv = tg
            .adapter
            .inventory(&subject_scope("acme", subject))
            .unwrap();
        assert!(
            !inv.locators
                .iter()
                .any(|(l, _)| *l == format!("0:{bob_thread}")),
            "1e3 named {subject}"
        );
    }
}

/// A UTF-16 SQLite file is refused: its text compares as 16-bit units, so a namespace range
/// reached another subject's label and UTF-8 metadata matched no one.
#[test]
fn a_utf16_file_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("store.db");
    let conn = Connection::open(&path).unwrap();
    conn.execute_batch(
        "PRAGMA encoding = 'UTF-16le';
         CREATE TABLE store (prefix TEXT, key TEXT, value TEXT, created_at TEXT, updated_at TEXT, expires_at TEXT, ttl_minutes REAL, PRIMARY KEY (prefix, key));",
    )
    .unwrap();
    drop(conn);
    let tg = target(
        dir.path(),
        r#"
name = "memories"
kind = "langgraph-sqlite-store"
class = "primary"
path = "store.db"
namespace = ["{tenant}", "{subject}"]
"#,
    );
    let e = tg.adapter.probe().unwrap_err().to_string();
    assert!(e.contains("UTF-16le") && e.contains("UTF-8"), "{e}");
    let e = tg
        .adapter
        .inventory(&subject_scope("acme", "alice"))
        .unwrap_err()
        .to_string();
    assert!(e.contains("UTF-16le"), "{e}");
}

/// A memory id `a/b` also names key `a/b` one label up: when the store holds both readings (or
/// only the other one), the scope is refused before anything is touched.
#[test]
fn a_memory_id_that_names_two_items_is_refused() {
    let c = copy("langgraph-sqlite");
    let tg = target(c.dir.path(), STORE);
    let mk = || Scope::Memory {
        tenant: Tenant::new("acme").unwrap(),
        subject: Subject::new("alice").unwrap(),
        memory: MemoryId::new("notes/1").unwrap(),
        version: None,
    };
    let conn = Connection::open(c.dir.path().join("store.db")).unwrap();
    conn.execute(
        "INSERT INTO store (prefix, key, value) VALUES ('acme.alice.notes', '1', '{}')",
        [],
    )
    .unwrap();
    assert!(matches!(
        tg.adapter.check_scope(&mk()),
        Ok(Applicability::Applies)
    ));
    conn.execute(
        "INSERT INTO store (prefix, key, value) VALUES ('acme.alice', 'notes/1', '{}')",
        [],
    )
    .unwrap();
    match tg.adapter.check_scope(&mk()) {
        Err(AdapterError::Inexpressible { why, .. }) => {
            assert!(why.contains("more than one item"), "{why}")
        }
        other => panic!("expected a refusal, got {other:?}"),
    }
}

/// A trigger that runs on DELETE on a target's tables (the registry's included) is refused
/// before anything runs: an erase would run it, and what it changed would go uncounted (foreign
/// keys are off on Lethe's connections; triggers are not). A trigger on writes is fine.
#[test]
fn a_delete_trigger_on_a_targets_tables_is_refused() {
    let c = copy("langgraph-sqlite");
    let store = target(c.dir.path(), STORE);
    let checkpoints = target(c.dir.path(), CHECKPOINTER);
    store.adapter.probe().unwrap();
    checkpoints.adapter.probe().unwrap();
    let run = |file: &str, sql: &str| {
        Connection::open(c.dir.path().join(file))
            .unwrap()
            .execute_batch(sql)
            .unwrap()
    };
    run(
        "store.db",
        "CREATE TABLE audit (k TEXT);
         CREATE TRIGGER on_write AFTER INSERT ON store BEGIN INSERT INTO audit VALUES (new.key); END;",
    );
    store
        .adapter
        .probe()
        .expect("a trigger on writes runs no erase");
    // Every spelling SQLite accepts (a first version read the text and missed most).
    for (file, table, checked, on) in [
        ("store.db", "store", &store, "\n  AFTER\n delete  on store"),
        ("store.db", "store", &store, " DELETE ON\"store\""),
        ("store.db", "store", &store, " DELETE/**/ON store"),
        ("store.db", "store", &store, " DELETE -- c\n ON [store]"),
        (
            "checkpoints.db",
            "writes",
            &checkpoints,
            " BEFORE DELETE ON writes",
        ),
        (
            "app.db",
            "thread_registry",
            &checkpoints,
            " DELETE ON `thread_registry`",
        ),
    ] {
        run(
            file,
            &format!(
                "CREATE TABLE IF NOT EXISTS audit (k TEXT);
                 CREATE TRIGGER gone{on} BEGIN INSERT INTO audit VALUES ('x'); END;"
            ),
        );
        let e = checked.adapter.probe().unwrap_err().to_string();
        assert!(e.contains("gone") && e.contains(table), "{on}: {e}");
        run(file, "DROP TRIGGER gone");
        checked.adapter.probe().unwrap();
    }
}
