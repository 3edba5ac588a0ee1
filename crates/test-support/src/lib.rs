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
