//! What Lethe's test suites share, written once: the demo's two targets over copies of the
//! real-LangGraph SQLite fixtures, and PostgreSQL test databases of their own. A
//! dev-dependency only; nothing in a release build depends on it.

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicUsize, Ordering};

/// The demo's two targets, as `[[target]]` tables: LangGraph's SQLite checkpointer (with the
/// application's thread registry and the owner keys in the checkpoint metadata) and its SQLite
/// store, over the files [`copy_memory`] puts in `memory/`: the demo's own
/// (`tests/fixtures/langgraph-sqlite/targets.toml`).
pub const TARGETS: &str = include_str!("../../../tests/fixtures/langgraph-sqlite/targets.toml");

/// The fixture files [`copy_memory`] copies.
pub const MEMORY_FILES: [&str; 3] = ["checkpoints.db", "store.db", "app.db"];

/// The folder of the SQLite fixtures real LangGraph wrote (`tests/fixtures/langgraph-sqlite`).
pub fn fixtures() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../../tests/fixtures/langgraph-sqlite")
}

/// Copies the fixture files into `dir/memory/` (made here), where [`TARGETS`] finds them.
pub fn copy_memory(dir: &Path) {
    let memory = dir.join("memory");
    std::fs::create_dir(&memory).expect("a new memory folder");
    for f in MEMORY_FILES {
        std::fs::copy(fixtures().join(f), memory.join(f)).expect("the fixture copies");
    }
}

/// The test PostgreSQL's admin URL: `LETHE_PG15_URL`, or the machine's own server.
pub fn pg_admin() -> String {
    std::env::var("LETHE_PG15_URL")
        .unwrap_or_else(|_| "postgres://postgres@127.0.0.1:5432/postgres".into())
}

static N: AtomicUsize = AtomicUsize::new(0);

/// A new, empty database on the test PostgreSQL, named `PREFIX_<pid>_<n>` so that tests running
/// at once never share one; its name and URL.
pub fn new_database(prefix: &str) -> (String, String) {
    let admin = pg_admin();
    let name = format!(
        "{prefix}_{}_{}",
        std::process::id(),
        N.fetch_add(1, Ordering::SeqCst)
    );
    postgres::Client::connect(&admin, postgres::NoTls)
        .expect("PostgreSQL reachable (scripts/test)")
        .batch_execute(&format!("CREATE DATABASE {name}"))
        .expect("a new database");
    let url = format!("{}/{name}", admin.rsplit_once('/').expect("a URL").0);
    (name, url)
}

/// Drops a database [`new_database`] made, its connections with it.
pub fn drop_database(name: &str) {
    if let Ok(mut c) = postgres::Client::connect(&pg_admin(), postgres::NoTls) {
        let _ = c.batch_execute(&format!("DROP DATABASE IF EXISTS {name} WITH (FORCE)"));
    }
}

/// Every row of the fixture's subjects but `erased` in a [`copy_memory`] folder, byte for
/// byte (rows read with `quote()`), found through the fixture manifest, not through Lethe:
/// what an erase test compares before and after.
pub fn rows_except(dir: &Path, erased: &[&str]) -> Vec<String> {
    let manifest: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(fixtures().join("manifest.json")).unwrap())
            .unwrap();
    let mut out = Vec::new();
    let cp = rusqlite::Connection::open(dir.join("memory/checkpoints.db")).unwrap();
    let st = rusqlite::Connection::open(dir.join("memory/store.db")).unwrap();
    let app = rusqlite::Connection::open(dir.join("memory/app.db")).unwrap();
    for s in manifest["subjects"].as_array().unwrap() {
        let (t, u) = (
            s["tenant_id"].as_str().unwrap(),
            s["user_id"].as_str().unwrap(),
        );
        if erased.contains(&u) {
            continue;
        }
        for th in s["threads"].as_array().unwrap() {
            let th = th["thread_id"].as_str().unwrap();
            for (table, cols) in [("checkpoints", "quote(checkpoint_ns)||quote(checkpoint_id)||quote(parent_checkpoint_id)||quote(type)||quote(checkpoint)||quote(metadata)"), ("writes", "quote(checkpoint_ns)||quote(checkpoint_id)||quote(task_id)||quote(idx)||quote(channel)||quote(type)||quote(value)")] {
                let mut stmt = cp.prepare(&format!("SELECT {cols} FROM {table} WHERE thread_id = ?1 ORDER BY rowid")).unwrap();
                out.extend(stmt.query_map([th], |r| r.get::<_, String>(0)).unwrap().map(|r| format!("{table}:{th}:{}", r.unwrap())));
            }
        }
        let mut stmt = app.prepare("SELECT quote(thread_id) FROM thread_registry WHERE tenant_id = ?1 AND user_id = ?2 ORDER BY rowid").unwrap();
        out.extend(
            stmt.query_map([t, u], |r| r.get::<_, String>(0))
                .unwrap()
                .map(|r| r.unwrap()),
        );
        let p = format!("{t}.{u}");
        for (table, cols) in [("store", "quote(prefix)||quote(key)||quote(value)||quote(created_at)||quote(updated_at)||quote(expires_at)||quote(ttl_minutes)"), ("store_vectors", "quote(prefix)||quote(key)||quote(field_name)||quote(embedding)")] {
            let mut stmt = st.prepare(&format!("SELECT {cols} FROM {table} WHERE prefix = ?1 OR substr(prefix, 1, length(?1) + 1) = ?1 || '.' ORDER BY rowid")).unwrap();
            out.extend(stmt.query_map([&p], |r| r.get::<_, String>(0)).unwrap().map(|r| r.unwrap()));
        }
    }
    // bob and carol hold over 100 rows; bob alone over 10.
    let least = if erased.len() == 1 { 100 } else { 10 };
    assert!(
        out.len() > least,
        "the oracle sees the other subjects' rows"
    );
    out
}
