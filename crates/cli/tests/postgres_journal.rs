//! The journal and gate on PostgreSQL, shared by several `lethe` processes (LETHE_PG15_URL,
//! default postgres://postgres@127.0.0.1:5432/postgres; each test in its own database). The
//! targets are copies of the SQLite fixtures: what is under test is the shared control plane.

use std::path::Path;
use std::process::{Command, Output, Stdio};

use serde_json::Value;

struct Env {
    dir: tempfile::TempDir,
    db: String,
}

impl Env {
    fn new(batch: usize) -> Self {
        let (db, url) = lethe_test_support::new_database("lethe_cj");
        let dir = tempfile::tempdir().unwrap();
        lethe_test_support::copy_memory(dir.path());
        std::fs::write(
            dir.path().join("lethe.toml"),
            format!(
                r#"
[control]
journal = "{url}"
batch_size = {batch}

{targets}"#,
                targets = lethe_test_support::TARGETS
            ),
        )
        .unwrap();
        Env { dir, db }
    }

    fn cmd(&self, args: &[&str]) -> Command {
        let mut c = Command::new(env!("CARGO_BIN_EXE_lethe"));
        c.arg("--config")
            .arg(self.dir.path().join("lethe.toml"))
            .args(args)
            .env_remove("LETHE_LOG");
        c
    }

    /// Starts `erase` of acme/alice paused at `point` (marker `paused`), once it is there.
    fn paused_erase(&self, point: &str, stderr: Stdio) -> std::process::Child {
        let marker = self.dir.path().join("paused");
        let mut child = self
            .cmd(&ERASE)
            .env("LETHE_TEST_PAUSE_AT", point)
            .env("LETHE_TEST_PAUSE_FILE", &marker)
            .stdout(Stdio::null())
            .stderr(stderr)
            .spawn()
            .unwrap();
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(60);
        while !marker.exists() {
            assert!(child.try_wait().unwrap().is_none(), "process 1 ended early");
            assert!(
                std::time::Instant::now() < deadline,
                "never reached {point}"
            );
            std::thread::yield_now();
        }
        child
    }

    fn json(&self, args: &[&str]) -> (i32, Value, String) {
        let out: Output = self.cmd(args).output().unwrap();
        let v = serde_json::from_slice(&out.stdout).unwrap_or(Value::Null);
        (
            out.status.code().unwrap_or(-1),
            v,
            String::from_utf8_lossy(&out.stderr).into_owned(),
        )
    }
}

impl Drop for Env {
    fn drop(&mut self) {
        lethe_test_support::drop_database(&self.db);
    }
}

const ERASE: [&str; 12] = [
    "erase",
    "--tenant",
    "acme",
    "--subject",
    "alice",
    "--basis",
    "gdpr-art17",
    "--ticket",
    "DSR-1",
    "--drain-timeout",
    "0",
    "--json",
];

#[test]
fn a_job_completes_with_the_journal_on_postgres() {
    let env = Env::new(500);
    let (c, out, err) = env.json(&ERASE);
    assert_eq!(c, 0, "{out} {err}");
    assert_eq!(out["state"], "COMPLETE");
    assert_eq!(out["certificate"]["targets"]["checkpoints"]["count"], 53);
    let (c, _, _) = env.json(&["journal", "verify", "--json"]);
    assert_eq!(c, 0);
}

/// A journal database that does not exist, or a role the server does not know, is a
/// configuration error (exit 2, with what to do), not an outage (exit 1); nothing is touched.
#[test]
fn a_missing_journal_database_or_role_is_a_config_error() {
    let env = Env::new(500);
    let config = env.dir.path().join("lethe.toml");
    let text = std::fs::read_to_string(&config).unwrap();
    let before = std::fs::read(env.dir.path().join("memory/store.db")).unwrap();
    let missing = text.replace(&env.db, &format!("{}_missing", env.db));
    std::fs::write(&config, &missing).unwrap();
    let (c, _, err) = env.json(&ERASE);
    assert_eq!(c, 2, "{err}");
    assert!(
        err.contains("does not exist") && err.contains("create it first"),
        "{err}"
    );
    let role = text.replace("postgres://postgres@", "postgres://lethe_no_such_role@");
    assert_ne!(role, text, "the test's URL names the postgres role");
    std::fs::write(&config, &role).unwrap();
    let (c, _, err) = env.json(&["jobs", "--json"]);
    assert_eq!(c, 2, "{err}");
    // An unreachable server is not the configuration's fault: exit 1 (retry later).
    let down = text.replace("127.0.0.1:5432", "127.0.0.1:1");
    assert_ne!(down, text);
    std::fs::write(&config, &down).unwrap();
    let (c, _, err) = env.json(&["jobs", "--json"]);
    assert_eq!(c, 1, "{err}");
    assert_eq!(
        std::fs::read(env.dir.path().join("memory/store.db")).unwrap(),
        before
    );
}

#[test]
fn a_second_process_cannot_run_a_claimed_job_and_picks_it_up_when_its_runner_dies() {
    let env = Env::new(1);
    // Process 1 runs the erase and stops, holding its claim, mid-way through the deletes.
    let mut first = env.paused_erase("after-batch-journal:checkpoints:2", Stdio::null());
    // A second operator asks for the same scope: the same job, and it is being run.
    let (c, _, err) = env.json(&ERASE);
    assert_eq!(c, 3, "{err}");
    assert!(err.contains("being run by another Lethe process"), "{err}");
    let (_, jobs, _) = env.json(&["jobs", "--json"]);
    assert_eq!(jobs.as_array().unwrap().len(), 1, "one job, not two");
    let job = jobs[0]["job_id"].as_str().unwrap().to_string();
    let (c, none, _) = env.json(&["work", "--json"]);
    assert_eq!(
        (c, none.as_array().map(Vec::len)),
        (0, Some(0)),
        "nothing abandoned while process 1 lives"
    );
    // Process 1 dies. Its claim dies with its connection; another process finishes the job.
    first.kill().unwrap();
    first.wait().unwrap();
    let (c, done, err) = env.json(&["work", "--json"]);
    assert_eq!(c, 0, "{done} {err}");
    assert_eq!(done[0]["job_id"], job.as_str());
    assert_eq!(done[0]["state"], "COMPLETE");
    assert_eq!(
        done[0]["certificate"]["targets"]["checkpoints"]["count"], 53,
        "counts = the frozen inventory"
    );
    let (c, _, _) = env.json(&["journal", "verify", "--json"]);
    assert_eq!(c, 0);
}

/// A runner whose claim was lost mid-erase (its claim's connection ended, as a firewall's idle
/// timeout ends it) and that another process finished the job after, erases nothing more when
/// it goes on: before its next batch it finds its claim gone and stops. Found by review: it
/// kept erasing its frozen locators, and deleted rows the application had written since the
/// other process completed the job.
#[test]
fn a_runner_that_lost_its_claim_erases_nothing_more() {
    let env = Env::new(1);
    let counts = |tenant: &str, subject: &str| {
        let (_, inv, _) = env.json(&[
            "inventory",
            "--tenant",
            tenant,
            "--subject",
            subject,
            "--json",
        ]);
        inv["targets"].to_string()
    };
    let others = [counts("acme", "bob"), counts("globex", "carol")];
    let marker = env.dir.path().join("paused");
    let first = env.paused_erase("after-batch-journal:checkpoints:1", Stdio::piped());
    // The claim is a connection of the job's database idle in a transaction (so is the one
    // opened ahead for a next claim).
    let url = format!(
        "{}/{}",
        lethe_test_support::pg_admin().rsplit_once('/').unwrap().0,
        env.db
    );
    let mut pg = postgres::Client::connect(&url, postgres::NoTls).unwrap();
    let ended: i64 = pg
        .query_one(
            "SELECT count(*) FROM (SELECT pg_terminate_backend(pid) FROM pg_stat_activity \
             WHERE datname = current_database() AND state = 'idle in transaction') k",
            &[],
        )
        .unwrap()
        .get(0);
    assert!(ended >= 1, "process 1's claim");
    // Another process takes the job over and completes it.
    let (c, done, err) = env.json(&["work", "--json"]);
    assert_eq!(c, 0, "{done} {err}");
    assert_eq!(done[0]["state"], "COMPLETE", "{done}");
    // The application writes the person's threads again (here: the fixture's rows put back).
    let memory = env.dir.path().join("memory");
    let fx = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../../tests/fixtures/langgraph-sqlite/checkpoints.db");
    let db = rusqlite::Connection::open(memory.join("checkpoints.db")).unwrap();
    db.execute("ATTACH DATABASE ?1 AS fx", [fx.to_str().unwrap()])
        .unwrap();
    let back = db
        .execute(
            "INSERT OR IGNORE INTO main.checkpoints SELECT * FROM fx.checkpoints",
            [],
        )
        .unwrap();
    assert!(back > 0);
    let rows = || -> i64 {
        db.query_row("SELECT count(*) FROM main.checkpoints", [], |r| r.get(0))
            .unwrap()
    };
    let before = rows();
    // Process 1 goes on: it must stop, not erase.
    std::fs::remove_file(&marker).unwrap();
    let out = first.wait_with_output().unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(
        rows(),
        before,
        "process 1 erased after losing its claim: {err}"
    );
    assert_eq!(out.status.code(), Some(1), "{err}");
    assert!(err.contains("lost its claim"), "{err}");
    let (c, _, _) = env.json(&["journal", "verify", "--json"]);
    assert_eq!(c, 0);
    assert_eq!(
        [counts("acme", "bob"), counts("globex", "carol")],
        others,
        "the other subjects kept their rows"
    );
}

/// A batch with the journal on PostgreSQL: its jobs' claims are taken together on one
/// connection, skipping a job another live process runs (alice, paused mid-erase: that entry
/// says so, exit 3 the worst), and the others (bob, carol) complete, their shared erase
/// journaled in grouped commits; alice's runner then finishes, and the journal verifies. Then
/// a batch of bob and carol alone: alice, the fixture's one other subject, keeps every row.
#[test]
fn a_batch_claims_its_jobs_together_and_skips_one_another_process_runs() {
    let env = Env::new(1);
    let mut first = env.paused_erase("after-batch-journal:checkpoints:2", Stdio::null());
    let file = env.dir.path().join("batch.jsonl");
    std::fs::write(
        &file,
        "{\"tenant\": \"acme\", \"subject\": \"alice\"}\n\
         {\"tenant\": \"acme\", \"subject\": \"bob\"}\n\
         {\"tenant\": \"globex\", \"subject\": \"carol\"}\n",
    )
    .unwrap();
    let (c, out, err) = env.json(&[
        "erase",
        "--batch",
        file.to_str().unwrap(),
        "--basis",
        "gdpr-art17",
        "--ticket",
        "DSR-B",
        "--drain-timeout",
        "0",
        "--json",
    ]);
    assert_eq!(c, 3, "{out} {err}");
    let v = out.as_array().unwrap();
    assert!(
        v[0]["error"]
            .as_str()
            .is_some_and(|e| e.contains("being run by another Lethe process")),
        "{out}"
    );
    for j in &v[1..] {
        assert_eq!(j["state"], "COMPLETE", "{j}");
        assert!(j["certificate"]["targets"]["checkpoints"]["count"].as_u64() > Some(0));
    }
    std::fs::remove_file(env.dir.path().join("paused")).unwrap();
    assert_eq!(first.wait().unwrap().code(), Some(0));
    let (_, jobs, _) = env.json(&["jobs", "--json"]);
    assert!(
        jobs.as_array()
            .unwrap()
            .iter()
            .all(|j| j["state"] == "COMPLETE"),
        "{jobs}"
    );
    let (c, _, _) = env.json(&["journal", "verify", "--json"]);
    assert_eq!(c, 0);
    // With batches that fit a transaction, the transactional targets erase the jobs together,
    // their entries committed per step for all of them: the same certificates, a chain that
    // verifies.
    let env = Env::new(500);
    let kept = lethe_test_support::rows_except(env.dir.path(), &["bob", "carol"]);
    let bob_carol = env.dir.path().join("batch.jsonl");
    std::fs::write(
        &bob_carol,
        "{\"tenant\": \"acme\", \"subject\": \"bob\"}\n\
         {\"tenant\": \"globex\", \"subject\": \"carol\"}\n",
    )
    .unwrap();
    let (c, out, err) = env.json(&[
        "erase",
        "--batch",
        bob_carol.to_str().unwrap(),
        "--basis",
        "gdpr-art17",
        "--ticket",
        "DSR-B2",
        "--json",
    ]);
    assert_eq!(c, 0, "{out} {err}");
    for (j, was) in out.as_array().unwrap().iter().zip(&v[1..]) {
        assert_eq!(j["state"], "COMPLETE", "{j}");
        assert_eq!(
            j["certificate"]["targets"], was["certificate"]["targets"],
            "the same counts as each job erased alone"
        );
    }
    assert_eq!(
        lethe_test_support::rows_except(env.dir.path(), &["bob", "carol"]),
        kept,
        "alice and every other subject kept every row"
    );
    let (c, _, _) = env.json(&["journal", "verify", "--json"]);
    assert_eq!(c, 0);
}
