//! The `backup-s3` target end to end, on a real S3-compatible server (s3s-fs, `scripts/s3
//! start`: LETHE_S3_URL, the test key's files LETHE_S3_ACCESS_KEY_FILE and
//! LETHE_S3_SECRET_KEY_FILE, its root folder LETHE_S3_DATA). A certificate's `PENDING_EXPIRY`
//! dates are what the objects' `LastModified` times and the retention give, `lethe backups
//! check` issues the final certificate once the objects are deleted, an endpoint that does not
//! answer blocks the job until it does, and a bad target table is refused with nothing touched.
//!
//! s3s-fs keeps bucket `b`'s object `k` as the file `<root>/b/k`: each test makes its own bucket
//! as a folder there, writes its objects as files and dates them by their modification time,
//! which s3s-fs answers as `LastModified` (signed uploads are tested in the adapter's tests).

mod common;

use std::path::{Path, PathBuf};
use std::process::Output;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, SystemTime};

use serde_json::Value;

const DAY: u64 = 86_400;

static N: AtomicUsize = AtomicUsize::new(0);

fn var(name: &str, default: &str) -> String {
    std::env::var(name).unwrap_or_else(|_| default.into())
}

struct Env {
    dir: tempfile::TempDir,
    /// The bucket's folder in s3s-fs's root.
    bucket_dir: PathBuf,
    bucket: String,
}

impl Drop for Env {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.bucket_dir);
    }
}

impl Env {
    /// The demo's targets, plus `nightly` (bucket objects under `nightly/` matching `*.dump`,
    /// 35 days' retention, covering the checkpointer) with `extra` lines in its table.
    fn new(extra: &str) -> Self {
        let dir = tempfile::tempdir().unwrap();
        lethe_test_support::copy_memory(dir.path());
        let bucket = format!(
            "lethe-cli{}-{}",
            std::process::id(),
            N.fetch_add(1, Ordering::Relaxed)
        );
        let bucket_dir = Path::new(&var("LETHE_S3_DATA", "/var/tmp/lethe-s3/data")).join(&bucket);
        std::fs::create_dir_all(bucket_dir.join("nightly"))
            .expect("s3s-fs's root folder (scripts/s3 start; LETHE_S3_DATA)");
        let env = Self {
            dir,
            bucket_dir,
            bucket,
        };
        env.configure(&var("LETHE_S3_URL", "http://127.0.0.1:8014"), extra);
        env
    }

    /// Writes lethe.toml with `endpoint` and `extra` lines in the S3 target's table.
    fn configure(&self, endpoint: &str, extra: &str) {
        std::fs::write(
            self.path().join("lethe.toml"),
            format!(
                "[control]\njournal = \"sqlite:lethe-journal.db\"\nkey_file = \"lethe.key\"\n\n{}\n\
                 [[target]]\nname = \"nightly\"\nkind = \"backup-s3\"\nclass = \"backup\"\n\
                 endpoint = {endpoint:?}\nbucket = {:?}\nprefix = \"nightly/\"\npattern = \"*.dump\"\n\
                 retention_days = 35\naccess_key_id_file = {:?}\nsecret_access_key_file = {:?}\n\
                 timeout_ms = 5000\n{extra}",
                lethe_test_support::TARGETS,
                self.bucket,
                var("LETHE_S3_ACCESS_KEY_FILE", "/var/tmp/lethe-s3/access-key-id"),
                var("LETHE_S3_SECRET_KEY_FILE", "/var/tmp/lethe-s3/secret-access-key"),
            ),
        )
        .unwrap();
    }

    fn path(&self) -> &Path {
        self.dir.path()
    }

    /// An object `key` written `days_ago` days ago (negative: later than now).
    fn object(&self, key: &str, days_ago: i64) -> SystemTime {
        let p = self.bucket_dir.join(key);
        std::fs::create_dir_all(p.parent().unwrap()).unwrap();
        std::fs::write(&p, b"a dump's bytes").unwrap();
        // A file's time is the system's: what the CLI under test compares it with.
        #[allow(clippy::disallowed_methods)]
        let now = SystemTime::now();
        let t = match days_ago {
            d if d >= 0 => now - Duration::from_secs(d as u64 * DAY),
            d => now + Duration::from_secs(d.unsigned_abs() * DAY),
        };
        std::fs::File::options()
            .write(true)
            .open(&p)
            .unwrap()
            .set_modified(t)
            .unwrap();
        t
    }

    fn remove(&self, key: &str) {
        std::fs::remove_file(self.bucket_dir.join(key)).unwrap();
    }

    fn run(&self, args: &[&str]) -> Output {
        common::run(self.path(), args)
    }

    fn json(&self, args: &[&str]) -> (i32, Value) {
        common::json(self.path(), args)
    }

    const ERASE: [&'static str; 10] = [
        "erase",
        "--tenant",
        "acme",
        "--subject",
        "alice",
        "--basis",
        "gdpr-art17",
        "--ticket",
        "DSR-1",
        "--json",
    ];

    fn erase(&self) -> (i32, Value) {
        self.json(&Self::ERASE)
    }

    /// The checkpointer's file, byte for byte: to show nothing touched it.
    fn checkpoints(&self) -> Vec<u8> {
        std::fs::read(self.path().join("memory/checkpoints.db")).unwrap()
    }
}

/// The day a file's time plus `days` falls on, in UTC, as certificates write dates.
fn day_after(t: SystemTime, days: u64) -> String {
    (time::OffsetDateTime::from(t) + time::Duration::days(days as i64))
        .date()
        .to_string()
}

#[test]
fn pending_expiry_dates_come_from_the_objects_and_the_final_certificate_follows_their_deletion() {
    let env = Env::new("covers = [\"checkpoints\"]\n");
    let old = env.object("nightly/2026-old.dump", 40); // past its 35 days
    let recent = env.object("nightly/2026-recent.dump", 2);
    env.object("nightly/notes.txt", 1); // not matched by the pattern
    env.object("weekly/2026-weekly.dump", 1); // not under the prefix
    let others = || lethe_test_support::rows_except(env.path(), &["alice"]);
    let before = others();
    let (code, out) = env.erase();
    assert_eq!(code, 0, "{out}");
    assert_eq!(others(), before, "every other subject kept its rows");
    let job = out["job_id"].as_str().unwrap().to_string();
    let cert = &out["certificate"];
    let line = &cert["targets"]["nightly"];
    assert_eq!(line["status"], "PENDING_EXPIRY", "{cert}");
    assert_eq!(line["class"], "backup", "{cert}");
    assert_eq!(line["artifacts"], 2);
    assert_eq!(line["count"], 0);
    assert_eq!(line["expires"], day_after(recent, 35));
    assert_eq!(cert["backup_expiry"], day_after(recent, 35));
    assert_eq!(cert["targets"]["checkpoints"]["status"], "DONE");

    // An object written after completion holds nothing of alice.
    env.object("nightly/after.dump", -1);

    let (code, r) = env.json(&["backups", "check", "--json"]);
    assert_eq!(code, 1, "an object is kept past its retention: {r}");
    let t = &r["targets"][0];
    assert_eq!(
        (t["name"].as_str(), t["artifacts"].as_u64()),
        (Some("nightly"), Some(3))
    );
    assert_eq!(t["overdue"].as_array().unwrap().len(), 1, "{r}");
    assert_eq!(t["overdue"][0]["name"], "2026-old.dump");
    assert_eq!(t["overdue"][0]["expired_on"], day_after(old, 35));
    assert_eq!(r["waiting"][0]["job_id"], job.as_str());
    assert_eq!(r["waiting"][0]["artifacts"], 2);
    assert_eq!(r["settled"].as_array().unwrap().len(), 0);

    // One deleted: still waiting, on one.
    env.remove("nightly/2026-old.dump");
    let (code, r) = env.json(&["backups", "check", "--json"]);
    assert_eq!(code, 0, "{r}");
    assert_eq!(r["waiting"][0]["artifacts"], 1);
    let final_file = env.path().join(format!("certificates/{job}.final.json"));
    assert!(!final_file.exists());

    // Both gone (the later one stays): the final certificate, which verifies.
    env.remove("nightly/2026-recent.dump");
    let (code, r) = env.json(&["backups", "check", "--json"]);
    assert_eq!(code, 0, "{r}");
    assert_eq!(r["settled"], serde_json::json!([job]));
    assert_eq!(r["waiting"].as_array().unwrap().len(), 0);
    let fin: Value = serde_json::from_str(&std::fs::read_to_string(&final_file).unwrap()).unwrap();
    assert_eq!(fin["targets"]["nightly"]["status"], "DONE");
    assert_eq!(fin["backup_expiry"], cert["backup_expiry"]);
    assert!(fin["backup_expiry_met"].is_string(), "{fin}");
    assert_ne!(fin["signature"], cert["signature"]);
    let v = env.run(&["certificate", "verify", final_file.to_str().unwrap()]);
    assert_eq!(
        v.status.code(),
        Some(0),
        "{}",
        String::from_utf8_lossy(&v.stderr)
    );
    let (code, j) = env.json(&["journal", "verify", "--json"]);
    assert_eq!((code, &j["intact"]), (0, &Value::Bool(true)), "{j}");
}

#[test]
fn an_endpoint_that_does_not_answer_blocks_the_job_until_it_does() {
    let env = Env::new("covers = [\"checkpoints\"]\n");
    let recent = env.object("nightly/2026-recent.dump", 1);
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    env.configure(
        &format!("http://127.0.0.1:{port}"),
        "covers = [\"checkpoints\"]\n",
    );
    let (code, out) = env.erase();
    assert_eq!(code, 3, "{out}");
    assert_eq!(out["state"], "BLOCKED", "{out}");
    assert_eq!(out["blocked_target"], "nightly", "{out}");
    assert_eq!(out["blocked_reason"], "target_unavailable", "{out}");
    // The endpoint back (the server moved to its address): resuming completes the job.
    env.configure(
        &var("LETHE_S3_URL", "http://127.0.0.1:8014"),
        "covers = [\"checkpoints\"]\n",
    );
    let job = out["job_id"].as_str().unwrap();
    let before = lethe_test_support::rows_except(env.path(), &["alice"]);
    let (code, out) = env.json(&["resume", job, "--json"]);
    assert_eq!(code, 0, "{out}");
    assert_eq!(out["state"], "COMPLETE");
    assert_eq!(
        lethe_test_support::rows_except(env.path(), &["alice"]),
        before,
        "every other subject kept its rows"
    );
    let line = &out["certificate"]["targets"]["nightly"];
    assert_eq!(line["status"], "PENDING_EXPIRY", "{out}");
    assert_eq!(line["expires"], day_after(recent, 35));
}

#[test]
fn wrong_keys_are_refused_before_a_job_starts_with_the_s3_error_code() {
    let env = Env::new("covers = [\"checkpoints\"]\n");
    env.object("nightly/2026-recent.dump", 1);
    let before = env.checkpoints();
    let wrong = env.path().join("wrong-secret");
    std::fs::write(&wrong, "not-the-secret-at-all\n").unwrap();
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(&wrong, std::fs::Permissions::from_mode(0o600)).unwrap();
    let cfg = env.path().join("lethe.toml");
    let text = std::fs::read_to_string(&cfg).unwrap();
    let key_file = var(
        "LETHE_S3_SECRET_KEY_FILE",
        "/var/tmp/lethe-s3/secret-access-key",
    );
    std::fs::write(
        &cfg,
        text.replace(
            &format!("{key_file:?}"),
            &format!("{:?}", wrong.display().to_string()),
        ),
    )
    .unwrap();
    // The probe before the job is refused: a key S3 rejects will not start working by itself.
    let (code, v) = env.erase();
    assert_eq!(code, 2, "{v}");
    let m = v["error"]["message"].as_str().unwrap();
    assert!(
        m.contains("target nightly")
            && m.contains("HTTP 403 (SignatureDoesNotMatch)")
            && m.contains("secret_access_key_file"),
        "{m}"
    );
    assert!(!m.contains("not-the-secret") && !m.contains("alice"), "{m}");
    assert_eq!(env.checkpoints(), before, "nothing touched");
    let (_, jobs) = env.json(&["jobs", "--json"]);
    assert_eq!(jobs.as_array().map(Vec::len), Some(0), "no job: {jobs}");
}

#[test]
fn a_bad_target_table_is_refused_with_nothing_touched() {
    let env = Env::new("covers = [\"checkpoints\"]\n");
    env.object("nightly/2026-recent.dump", 1);
    let before = env.checkpoints();
    for (extra, says) in [
        ("", "covers"),
        ("covers = []\n", "covers must name at least one target"),
        ("covers = [\"checkpoints\"]\nstorage_class = \"GLACIER\"\n", "unknown field"),
        (
            "covers = [\"checkpoints\"]\nsecret_access_key = \"lethe-test-secret-key-for-s3s-fs\"\n",
            "secret_access_key_file",
        ),
        ("covers = [\"checkpoint\"]\n", "covers `checkpoint`, which is not a target"),
    ] {
        env.configure(&var("LETHE_S3_URL", "http://127.0.0.1:8014"), extra);
        let o = env.run(&Env::ERASE);
        let err = String::from_utf8_lossy(&o.stderr);
        assert_eq!(o.status.code(), Some(2), "{extra}: {err}");
        assert!(err.contains("nightly") && err.contains(says), "{extra}: {err}");
        assert!(!err.contains("lethe-test-secret"), "{err}");
        assert_eq!(env.checkpoints(), before, "{extra}: nothing touched");
        assert!(
            !env.path().join("lethe-journal.db").exists(),
            "{extra}: no journal, no job"
        );
    }
}
