//! The recovery gate end to end on real stores: a real `pg_dump` of the LangGraph PostgreSQL
//! database and a real Redis RDB file are taken, acme/alice is erased, both are restored into
//! fresh stores (a new database from `pg_restore`; a new `redis-server` that loads the RDB
//! file), and `lethe recovery` per target brings alice's erasure back into them: alice gone
//! everywhere, bob and carol (and alice's neighbours) kept byte for byte, and the gate refusing
//! leases for alice until the recovery verified, across a kill of the first run.
//!
//! Needs PostgreSQL 15 with the LangGraph template (scripts/test: LETHE_PG15_URL,
//! LETHE_PG_TEMPLATE), `pg_dump`/`pg_restore` of the same major version, and `redis-server` and
//! `redis-cli` on the PATH.

mod common;

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};

use serde_json::Value;

fn admin() -> String {
    std::env::var("LETHE_PG15_URL")
        .unwrap_or_else(|_| "postgres://postgres@127.0.0.1:5432/postgres".into())
}

fn url_of(db: &str) -> String {
    format!("{}/{db}", admin().rsplit_once('/').unwrap().0)
}

/// A database dropped when dropped.
struct Db(String);

impl Db {
    /// A clone of the LangGraph template.
    fn from_template(name: String) -> Self {
        let template = std::env::var("LETHE_PG_TEMPLATE").unwrap_or_else(|_| "lethe_tpl".into());
        let mut c = postgres::Client::connect(&admin(), postgres::NoTls).unwrap();
        c.batch_execute(&format!("DROP DATABASE IF EXISTS {name} WITH (FORCE)"))
            .unwrap();
        for attempt in 0.. {
            match c.batch_execute(&format!("CREATE DATABASE {name} TEMPLATE {template}")) {
                Ok(()) => break,
                // Clones serialize on the template; retry while another holds it.
                Err(e) if attempt < 5_000 && e.to_string().contains("being accessed") => {
                    std::thread::yield_now()
                }
                Err(e) => panic!("cloning the LangGraph template (scripts/test makes it): {e}"),
            }
        }
        Db(name)
    }

    fn empty(name: String) -> Self {
        let mut c = postgres::Client::connect(&admin(), postgres::NoTls).unwrap();
        c.batch_execute(&format!("DROP DATABASE IF EXISTS {name} WITH (FORCE)"))
            .unwrap();
        c.batch_execute(&format!("CREATE DATABASE {name}")).unwrap();
        Db(name)
    }

    fn client(&self) -> postgres::Client {
        postgres::Client::connect(&url_of(&self.0), postgres::NoTls).unwrap()
    }

    /// acme/alice's rows in every LangGraph table, by the manifest's definitions.
    fn alices_rows(&self) -> i64 {
        self.client()
            .query_one(
                "WITH t AS (SELECT thread_id FROM thread_registry WHERE tenant_id = 'acme' AND user_id = 'alice'
                            UNION SELECT thread_id FROM checkpoints
                             WHERE metadata->>'tenant_id' = 'acme' AND metadata->>'user_id' = 'alice')
                 SELECT (SELECT count(*) FROM checkpoints WHERE thread_id IN (SELECT * FROM t))
                      + (SELECT count(*) FROM checkpoint_blobs WHERE thread_id IN (SELECT * FROM t))
                      + (SELECT count(*) FROM checkpoint_writes WHERE thread_id IN (SELECT * FROM t))
                      + (SELECT count(*) FROM thread_registry WHERE tenant_id = 'acme' AND user_id = 'alice')
                      + (SELECT count(*) FROM store WHERE prefix = 'acme.alice' OR prefix LIKE 'acme.alice.%')",
                &[],
            )
            .unwrap()
            .get(0)
    }

    /// Every row not acme/alice's, as text, in one digest.
    fn others(&self) -> String {
        self.client()
            .query_one(
                "WITH t AS (SELECT thread_id FROM thread_registry WHERE tenant_id = 'acme' AND user_id = 'alice'
                            UNION SELECT thread_id FROM checkpoints
                             WHERE metadata->>'tenant_id' = 'acme' AND metadata->>'user_id' = 'alice')
                 SELECT md5(coalesce(string_agg(x, '|' ORDER BY x), '')) || ':' || count(*) FROM (
                   SELECT 'c' || c::text AS x FROM checkpoints c WHERE thread_id NOT IN (SELECT * FROM t)
                   UNION ALL SELECT 'b' || b::text FROM checkpoint_blobs b WHERE thread_id NOT IN (SELECT * FROM t)
                   UNION ALL SELECT 'w' || w::text FROM checkpoint_writes w WHERE thread_id NOT IN (SELECT * FROM t)
                   UNION ALL SELECT 'r' || r::text FROM thread_registry r
                              WHERE NOT (tenant_id = 'acme' AND user_id = 'alice')
                   UNION ALL SELECT 's' || s::text FROM store s
                              WHERE prefix <> 'acme.alice' AND prefix NOT LIKE 'acme.alice.%') q",
                &[],
            )
            .unwrap()
            .get(0)
    }
}

impl Drop for Db {
    fn drop(&mut self) {
        if let Ok(mut c) = postgres::Client::connect(&admin(), postgres::NoTls) {
            let _ = c.batch_execute(&format!("DROP DATABASE IF EXISTS {} WITH (FORCE)", self.0));
        }
    }
}

/// A `redis-server` of this test's own, on a free port, stopped when dropped.
struct Redis {
    port: u16,
    child: Child,
}

impl Redis {
    /// Started in `dir`, loading `dir/dump.rdb` if it is there; persisting nothing itself.
    fn start(dir: &Path) -> Self {
        let port = std::net::TcpListener::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap()
            .port();
        let child = Command::new("redis-server")
            .args([
                "--port",
                &port.to_string(),
                "--bind",
                "127.0.0.1",
                "--save",
                "",
            ])
            .args(["--appendonly", "no", "--dbfilename", "dump.rdb", "--dir"])
            .arg(dir)
            .stdout(Stdio::null())
            .spawn()
            .expect("redis-server on the PATH");
        let r = Redis { port, child };
        for _ in 0..50_000 {
            if r.cli(&["PING"]).trim() == "PONG" {
                return r;
            }
            std::thread::yield_now();
        }
        panic!("redis-server did not start on {port}");
    }

    fn cli(&self, args: &[&str]) -> String {
        let o = Command::new("redis-cli")
            .args(["-p", &self.port.to_string()])
            .args(args)
            .output()
            .expect("redis-cli on the PATH");
        String::from_utf8_lossy(&o.stdout).into_owned()
    }

    /// Every key and its value (strings and hashes), sorted, for byte-for-byte comparisons.
    fn dump(&self, pattern: &str) -> Vec<(String, String)> {
        let mut keys: Vec<String> = self
            .cli(&["--scan", "--pattern", pattern])
            .lines()
            .map(str::to_owned)
            .collect();
        keys.sort();
        keys.into_iter()
            .map(|k| {
                let v = match self.cli(&["TYPE", &k]).trim() {
                    "hash" => self.cli(&["HGETALL", &k]),
                    _ => self.cli(&["GET", &k]),
                };
                (k, v)
            })
            .collect()
    }
}

impl Drop for Redis {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

struct Env {
    dir: tempfile::TempDir,
}

impl Env {
    fn path(&self) -> &Path {
        self.dir.path()
    }

    /// Targets on the database `db` and the Redis on `port`, and a backup folder covering them.
    fn config(&self, db: &str, port: u16) {
        let url = url_of(db);
        std::fs::write(
            self.path().join("lethe.toml"),
            format!(
                r#"[control]
journal = "sqlite:journal.db"

[[target]]
name = "checkpoints"
kind = "langgraph-postgres-checkpointer"
class = "primary"
url = "{url}?sslmode=disable"
registry = {{ table = "public.thread_registry", tenant = "tenant_id", subject = "user_id", thread = "thread_id" }}
metadata = {{ tenant = "tenant_id", subject = "user_id" }}

[[target]]
name = "memories"
kind = "langgraph-postgres-store"
class = "primary"
url = "{url}?sslmode=disable"
namespace = ["{{tenant}}", "{{subject}}"]

[[target]]
name = "cache"
kind = "redis"
class = "cache"
url = "redis://127.0.0.1:{port}"
pattern = "{{tenant}}:{{subject}}:*"

[[target]]
name = "nightly"
kind = "backup-files"
class = "backup"
path = "backups"
retention_days = 7
covers = ["checkpoints", "memories", "cache"]
"#
            ),
        )
        .unwrap();
    }

    fn cmd(&self, args: &[&str]) -> Command {
        common::lethe(self.path(), args)
    }

    fn run(&self, args: &[&str]) -> Output {
        common::run(self.path(), args)
    }

    fn json(&self, args: &[&str]) -> (i32, Value) {
        common::json(self.path(), args)
    }

    /// A lease for acme/`subject` through the journal, as a runtime's gate call would take it.
    fn lease(&self, subject: &str) -> Result<(), String> {
        let j = lethe_journal::Journal::open(&self.path().join("journal.db")).unwrap();
        j.take_lease(
            time::OffsetDateTime::now_utc(),
            &lethe_core::Tenant::new("acme").unwrap(),
            &lethe_core::Subject::new(subject).unwrap(),
            &[],
            std::time::Duration::from_secs(30),
        )
        .map(|_| ())
        .map_err(|e| e.to_string())
    }
}

fn run_ok(c: &mut Command) {
    let o = c.output().unwrap();
    assert!(
        o.status.success(),
        "{c:?}: {}",
        String::from_utf8_lossy(&o.stderr)
    );
}

/// Seeds the Redis with three subjects' keys and alice's neighbours.
fn seed_redis(r: &Redis) {
    for (s, n) in [
        ("alice", 4),
        ("bob", 3),
        ("carol", 2),
        ("alice2", 1),
        ("Alice", 1),
    ] {
        for k in 0..n {
            r.cli(&[
                "SET",
                &format!("acme:{s}:session:{k}"),
                &format!("{s} said {k}"),
            ]);
        }
        r.cli(&[
            "HSET",
            &format!("acme:{s}:profile"),
            "name",
            s,
            "plan",
            "pro",
        ]);
    }
    r.cli(&["SET", "globex:alice:session:0", "another tenant's alice"]);
}

#[test]
fn a_restore_of_a_pg_dump_and_an_rdb_file_gets_the_erasure_replayed_before_alice_can_come_back() {
    let env = Env {
        dir: tempfile::tempdir().unwrap(),
    };
    let backups = env.path().join("backups");
    std::fs::create_dir(&backups).unwrap();
    let pid = std::process::id();
    let src = Db::from_template(format!("rcv_src_{pid}"));
    let redis_dir = env.path().join("redis-live");
    std::fs::create_dir(&redis_dir).unwrap();
    let live = Redis::start(&redis_dir);
    seed_redis(&live);
    let others_pg = src.others();
    let others_redis: Vec<_> = [
        "acme:bob:*",
        "acme:carol:*",
        "acme:alice2:*",
        "acme:Alice:*",
        "globex:*",
    ]
    .iter()
    .flat_map(|p| live.dump(p))
    .collect();
    assert!(src.alices_rows() > 0 && others_redis.len() >= 9);

    // Last night's backups: a real pg_dump archive and the server's RDB file.
    run_ok(
        Command::new("pg_dump")
            .args(["-Fc", "-f"])
            .arg(backups.join("langgraph.dump"))
            .arg(url_of(&src.0)),
    );
    run_ok(
        Command::new("redis-cli")
            .args(["-p", &live.port.to_string(), "--rdb"])
            .arg(backups.join("cache.rdb")),
    );

    // The erasure, on the live stores.
    env.config(&src.0, live.port);
    let (code, out) = env.json(&[
        "erase",
        "--tenant",
        "acme",
        "--subject",
        "alice",
        "--basis",
        "gdpr-art17",
        "--ticket",
        "DSR-9",
        "--json",
    ]);
    assert_eq!(code, 0, "{out}");
    assert_eq!(
        out["certificate"]["targets"]["nightly"]["status"],
        "PENDING_EXPIRY"
    );
    assert_eq!(out["certificate"]["targets"]["nightly"]["artifacts"], 2);
    assert_eq!(src.alices_rows(), 0);

    // The disaster: both stores restored from the backups into fresh ones. Alice is back.
    let dst = Db::empty(format!("rcv_dst_{pid}"));
    run_ok(
        Command::new("pg_restore")
            .args(["--no-owner", "-d"])
            .arg(url_of(&dst.0))
            .arg(backups.join("langgraph.dump")),
    );
    let restored_dir = env.path().join("redis-restored");
    std::fs::create_dir(&restored_dir).unwrap();
    std::fs::copy(backups.join("cache.rdb"), restored_dir.join("dump.rdb")).unwrap();
    let restored = Redis::start(&restored_dir);
    drop(live);
    assert!(dst.alices_rows() > 0, "the restore brought alice back");
    assert_eq!(
        restored.dump("acme:alice:*").len(),
        5,
        "the restore brought alice back"
    );
    env.config(&dst.0, restored.port);
    assert!(
        env.lease("alice").is_ok(),
        "before any recovery, nothing fences alice"
    );

    // The first recovery run is killed once it has fenced: alice is refused, bob is not.
    let marker = env.path().join("paused");
    let mut child = env
        .cmd(&["recovery", "--target", "checkpoints"])
        .env("LETHE_TEST_PAUSE_AT", "recovery-fenced")
        .env("LETHE_TEST_PAUSE_FILE", &marker)
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(60);
    while !marker.exists() {
        assert!(
            child.try_wait().unwrap().is_none(),
            "the recovery ended before it fenced"
        );
        assert!(
            std::time::Instant::now() < deadline,
            "the recovery never fenced"
        );
        std::thread::yield_now();
    }
    let refused = env.lease("alice").unwrap_err();
    assert!(
        refused.contains("fenced") || refused.contains("erasure"),
        "{refused}"
    );
    assert!(env.lease("bob").is_ok());
    child.kill().unwrap();
    child.wait().unwrap();
    assert!(
        env.lease("alice").is_err(),
        "a killed recovery leaves its fences closed"
    );
    assert!(dst.alices_rows() > 0);

    // Run again: it resumes the same recovery, replays, verifies and opens the fences.
    let o = env.run(&["recovery", "--target", "checkpoints"]);
    assert_eq!(
        o.status.code(),
        Some(0),
        "{}",
        String::from_utf8_lossy(&o.stderr)
    );
    assert!(String::from_utf8_lossy(&o.stderr).contains("Resuming"));
    for target in ["memories", "cache"] {
        let (code, report) = env.json(&["recovery", "--target", target, "--json"]);
        assert_eq!(code, 0, "{report}");
        assert_eq!(report["target"], target);
        assert_eq!(report["scopes"].as_array().unwrap().len(), 1);
        assert_eq!(report["scopes"][0]["job_id"], out["job_id"]);
        assert_eq!(
            report["scopes"][0]["scope_hash"],
            out["certificate"]["scope_hash"]
        );
        assert!(report["erased"].as_u64().unwrap() > 0, "{report}");
        let text = report.to_string();
        assert!(
            !text.contains("alice") && !text.contains("acme"),
            "no identifier: {text}"
        );
    }
    assert!(
        env.lease("alice").is_ok(),
        "verified: alice's fences are open again"
    );

    // Alice is gone from both restored stores; everyone else is as they were, byte for byte.
    assert_eq!(dst.alices_rows(), 0);
    assert_eq!(restored.dump("acme:alice:*").len(), 0);
    assert_eq!(dst.others(), others_pg);
    let kept: Vec<_> = [
        "acme:bob:*",
        "acme:carol:*",
        "acme:alice2:*",
        "acme:Alice:*",
        "globex:*",
    ]
    .iter()
    .flat_map(|p| restored.dump(p))
    .collect();
    assert_eq!(kept, others_redis);
    let (code, v) = env.json(&["verify", "--tenant", "acme", "--subject", "alice", "--json"]);
    assert_eq!(code, 0, "{v}");

    // Each recovery's signed report is in the certificates folder and verifies; the journal
    // holds them and verifies.
    let reports: Vec<PathBuf> = std::fs::read_dir(env.path().join("certificates"))
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.file_name().unwrap().to_string_lossy().starts_with("rcv-"))
        .collect();
    assert_eq!(reports.len(), 3);
    for r in &reports {
        let o = env.run(&["certificate", "verify", r.to_str().unwrap()]);
        assert_eq!(
            o.status.code(),
            Some(0),
            "{}",
            String::from_utf8_lossy(&o.stderr)
        );
    }
    let (code, j) = env.json(&["journal", "verify", "--json"]);
    assert_eq!((code, &j["intact"]), (0, &Value::Bool(true)), "{j}");
}

#[test]
fn recovery_of_an_unknown_backup_or_unreachable_target_is_refused_touching_nothing() {
    let env = Env {
        dir: tempfile::tempdir().unwrap(),
    };
    std::fs::create_dir(env.path().join("backups")).unwrap();
    let db = Db::from_template(format!("rcv_bad_{}", std::process::id()));
    // A port nothing listens on.
    let closed = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    env.config(&db.0, closed);
    let o = env.run(&["recovery", "--target", "checkpoint"]);
    assert_eq!(o.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&o.stderr).contains("no target named checkpoint"));
    let o = env.run(&["recovery", "--target", "nightly"]);
    assert_eq!(o.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&o.stderr).contains("is a backup target"));
    let o = env.run(&["recovery", "--target", "cache", "--since", "2999-01-01"]);
    assert_eq!(o.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&o.stderr).contains("in the future"));
    let o = env.run(&["recovery", "--target", "cache", "--since", "yesterday"]);
    assert_eq!(o.status.code(), Some(2));
    let o = env.run(&["recovery", "--target", "cache"]);
    assert_eq!(
        o.status.code(),
        Some(1),
        "{}",
        String::from_utf8_lossy(&o.stderr)
    );
    assert!(String::from_utf8_lossy(&o.stderr).contains("unavailable"));
    // Nothing was journaled: no recovery, so nothing fences anyone.
    let j = lethe_journal::Journal::open(&env.path().join("journal.db")).unwrap();
    assert!(j.recoveries().unwrap().is_empty());
    assert!(env.lease("alice").is_ok());
    assert!(!env.path().join("certificates").exists());
}

/// `dead_rows` on the LangGraph PostgreSQL kinds: `vacuum` vacuums the target's tables after
/// the erase and certifies what the server still counts (CLEAN here); `report` certifies the
/// rows erased as dead row versions PENDING until VACUUM; a bad value is refused.
#[test]
fn dead_row_versions_are_vacuumed_or_reported_on_the_certificate() {
    let env = Env {
        dir: tempfile::tempdir().unwrap(),
    };
    let db = Db::from_template(format!("rcv_dead_{}", std::process::id()));
    let url = url_of(&db.0);
    let config = |cp: &str, st: &str| {
        std::fs::write(
            env.path().join("lethe.toml"),
            format!(
                r#"[control]
journal = "sqlite:journal.db"

[[target]]
name = "checkpoints"
kind = "langgraph-postgres-checkpointer"
class = "primary"
url = "{url}?sslmode=disable"
metadata = {{ tenant = "tenant_id", subject = "user_id" }}
registry = {{ table = "public.thread_registry", tenant = "tenant_id", subject = "user_id", thread = "thread_id" }}
dead_rows = "{cp}"

[[target]]
name = "memories"
kind = "langgraph-postgres-store"
class = "primary"
url = "{url}?sslmode=disable"
namespace = ["{{tenant}}", "{{subject}}"]
dead_rows = "{st}"
"#
            ),
        )
        .unwrap();
    };
    config("vacuum", "sometimes");
    let o = env.run(&["targets"]);
    assert_eq!(o.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&o.stderr).contains("dead_rows must be"));
    config("vacuum", "report");
    let others = db.others();
    let (code, out) = env.json(&[
        "erase",
        "--tenant",
        "acme",
        "--subject",
        "alice",
        "--basis",
        "gdpr-art17",
        "--ticket",
        "T-D",
        "--json",
    ]);
    assert_eq!(code, 0, "{out}");
    let cert = &out["certificate"];
    let cp = &cert["targets"]["checkpoints"];
    assert_eq!(cp["physical"]["status"], "CLEAN", "{cert}");
    assert_eq!(cp["physical"]["residue"], 0);
    let st = &cert["targets"]["memories"];
    assert!(st["count"].as_u64().unwrap() > 0);
    assert_eq!(st["physical"]["status"], "PENDING", "{cert}");
    assert_eq!(st["physical"]["residue"], st["count"]);
    assert!(st["physical"]["remedy"]
        .as_str()
        .unwrap()
        .contains("VACUUM"));
    // The checkpointer's tables were vacuumed; the store's were not asked to be.
    let vacuumed: i64 = db
        .client()
        .query_one(
            "SELECT count(*) FROM pg_stat_user_tables WHERE relname IN \
             ('checkpoints', 'checkpoint_blobs', 'checkpoint_writes') AND vacuum_count > 0",
            &[],
        )
        .unwrap()
        .get(0);
    assert_eq!(vacuumed, 3);
    assert_eq!(db.alices_rows(), 0);
    assert_eq!(db.others(), others, "every other subject's rows kept");
}
