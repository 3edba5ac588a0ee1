//! Backup targets end to end: a certificate's `PENDING_EXPIRY` dates are what the artifacts'
//! times and the retention give, `lethe backups check` reports artifacts kept past their
//! retention and the jobs still waiting, and once the artifacts a job waited for are deleted it
//! issues the job's final certificate, which verifies, while the first is kept.

mod common;

use std::path::Path;
use std::process::Output;
use std::time::{Duration, SystemTime};

use serde_json::Value;

const DAY: u64 = 86_400;

struct Env {
    dir: tempfile::TempDir,
}

impl Env {
    /// The demo's targets, plus `backups` (a folder, 35 days' retention, covering the
    /// checkpointer) and `extra` config lines.
    fn new(extra: &str) -> Self {
        let dir = tempfile::tempdir().unwrap();
        lethe_test_support::copy_memory(dir.path());
        std::fs::create_dir(dir.path().join("backups")).unwrap();
        std::fs::write(
            dir.path().join("lethe.toml"),
            format!(
                "[control]\njournal = \"sqlite:lethe-journal.db\"\nkey_file = \"lethe.key\"\n\n{}\n\
                 [[target]]\nname = \"nightly\"\nkind = \"backup-files\"\nclass = \"backup\"\n\
                 path = \"backups\"\npattern = \"*.dump\"\nretention_days = 35\n\
                 covers = [\"checkpoints\"]\n{extra}",
                lethe_test_support::TARGETS
            ),
        )
        .unwrap();
        Self { dir }
    }

    fn path(&self) -> &Path {
        self.dir.path()
    }

    /// A backup artifact taken `days_ago` days ago (its modification time; negative: later
    /// than now).
    fn artifact(&self, name: &str, days_ago: i64) -> SystemTime {
        let p = self.path().join("backups").join(name);
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

    fn run(&self, args: &[&str]) -> Output {
        common::run(self.path(), args)
    }

    fn json(&self, args: &[&str]) -> (i32, Value) {
        common::json(self.path(), args)
    }

    fn erase(&self, subject: &str) -> (i32, Value) {
        self.json(&[
            "erase",
            "--tenant",
            "acme",
            "--subject",
            subject,
            "--basis",
            "gdpr-art17",
            "--ticket",
            "DSR-1",
            "--json",
        ])
    }
}

/// Every row of bob and carol, byte for byte: what every erase here must leave as it was.
fn others(env: &Env) -> Vec<String> {
    lethe_test_support::rows_except(env.path(), &["alice"])
}

/// The day a file's time plus `days` falls on, in UTC, as certificates write dates.
fn day_after(t: SystemTime, days: u64) -> String {
    (time::OffsetDateTime::from(t) + time::Duration::days(days as i64))
        .date()
        .to_string()
}

#[test]
fn pending_expiry_dates_come_from_the_artifacts_and_the_final_certificate_follows_their_deletion() {
    let env = Env::new("");
    let old = env.artifact("2026-old.dump", 40); // past its 35 days
    let recent = env.artifact("2026-recent.dump", 2);
    env.artifact("notes.txt", 1); // not matched by the pattern
    let before = others(&env);
    let (code, out) = env.erase("alice");
    assert_eq!(code, 0, "{out}");
    assert_eq!(others(&env), before, "every other subject kept its rows");
    let job = out["job_id"].as_str().unwrap().to_string();
    let cert = &out["certificate"];
    let line = &cert["targets"]["nightly"];
    assert_eq!(line["status"], "PENDING_EXPIRY", "{cert}");
    assert_eq!(line["artifacts"], 2);
    assert_eq!(line["count"], 0);
    assert_eq!(line["expires"], day_after(recent, 35));
    assert_eq!(cert["backup_expiry"], day_after(recent, 35));
    assert!(cert.get("backup_expiry_met").is_none());
    // The erased stores are DONE as before.
    assert_eq!(cert["targets"]["checkpoints"]["status"], "DONE");

    // A backup taken after completion holds nothing of alice: it does not extend the wait.
    env.artifact("after.dump", -1);

    let (code, r) = env.json(&["backups", "check", "--json"]);
    assert_eq!(code, 1, "an artifact is kept past its retention: {r}");
    let t = &r["targets"][0];
    assert_eq!(
        (t["name"].as_str(), t["artifacts"].as_u64()),
        (Some("nightly"), Some(3))
    );
    assert_eq!(t["overdue"].as_array().unwrap().len(), 1);
    assert_eq!(t["overdue"][0]["name"], "2026-old.dump");
    assert_eq!(t["overdue"][0]["expired_on"], day_after(old, 35));
    assert_eq!(r["waiting"].as_array().unwrap().len(), 1, "{r}");
    assert_eq!(r["waiting"][0]["job_id"], job.as_str());
    assert_eq!(r["waiting"][0]["artifacts"], 2);
    assert_eq!(r["settled"].as_array().unwrap().len(), 0);

    // One of the two deleted: still waiting, on one.
    std::fs::remove_file(env.path().join("backups/2026-old.dump")).unwrap();
    let (code, r) = env.json(&["backups", "check", "--json"]);
    assert_eq!(code, 0, "{r}");
    assert_eq!(r["waiting"][0]["artifacts"], 1);
    assert!(!env
        .path()
        .join(format!("certificates/{job}.final.json"))
        .exists());

    // Both gone (the one taken after completion stays): the final certificate.
    std::fs::remove_file(env.path().join("backups/2026-recent.dump")).unwrap();
    let (code, r) = env.json(&["backups", "check", "--json"]);
    assert_eq!(code, 0, "{r}");
    assert_eq!(r["settled"], serde_json::json!([job]));
    assert_eq!(r["waiting"].as_array().unwrap().len(), 0);
    let final_file = env.path().join(format!("certificates/{job}.final.json"));
    let fin: Value = serde_json::from_str(&std::fs::read_to_string(&final_file).unwrap()).unwrap();
    assert_eq!(fin["job_id"], job.as_str());
    assert_eq!(fin["targets"]["nightly"]["status"], "DONE");
    assert_eq!(fin["backup_expiry"], cert["backup_expiry"]);
    assert!(fin["backup_expiry_met"].is_string(), "{fin}");
    assert_eq!(fin["scope_hash"], cert["scope_hash"]);
    assert_ne!(fin["signature"], cert["signature"]);
    // It verifies, and an edit of it does not.
    let v = env.run(&["certificate", "verify", final_file.to_str().unwrap()]);
    assert_eq!(
        v.status.code(),
        Some(0),
        "{}",
        String::from_utf8_lossy(&v.stderr)
    );
    let mut edited = fin.clone();
    edited["targets"]["nightly"]["artifacts"] = 0.into();
    let edited_file = env.path().join("edited.json");
    std::fs::write(&edited_file, edited.to_string()).unwrap();
    let v = env.run(&["certificate", "verify", edited_file.to_str().unwrap()]);
    assert_eq!(v.status.code(), Some(1));
    // `certificate show` gives the final one; --first the one issued at completion.
    let (_, shown) = env.json(&["certificate", "show", &job]);
    assert_eq!(shown, fin);
    let (_, first) = env.json(&["certificate", "show", &job, "--first"]);
    assert_eq!(&first, cert);
    let first_file: Value = serde_json::from_str(
        &std::fs::read_to_string(env.path().join(format!("certificates/{job}.json"))).unwrap(),
    )
    .unwrap();
    assert_eq!(&first_file, cert, "the first certificate's file is kept");

    // Checking again settles nothing twice, and the journal verifies with the new entry.
    let (code, r) = env.json(&["backups", "check", "--json"]);
    assert_eq!((code, r["settled"].as_array().unwrap().len()), (0, 0));
    let (code, j) = env.json(&["journal", "verify", "--json"]);
    assert_eq!(code, 0, "{j}");
    assert_eq!(j["intact"], true);
}

#[test]
fn a_job_completed_with_no_artifact_taken_before_it_waits_for_nothing() {
    let env = Env::new("");
    let before = others(&env);
    let (code, out) = env.erase("alice");
    assert_eq!(code, 0, "{out}");
    assert_eq!(others(&env), before, "every other subject kept its rows");
    let line = &out["certificate"]["targets"]["nightly"];
    assert_eq!(line["status"], "DONE", "{out}");
    assert_eq!(line["artifacts"], 0);
    assert!(out["certificate"]["backup_expiry"].is_null());
    let (code, r) = env.json(&["backups", "check", "--json"]);
    assert_eq!(code, 0);
    assert_eq!(r["waiting"].as_array().unwrap().len(), 0);
    assert_eq!(r["settled"].as_array().unwrap().len(), 0);
}

#[test]
fn bad_covers_touch_nothing_and_an_unreadable_backup_folder_blocks_the_job_until_it_is_back() {
    let env = Env::new("");
    let cfg = env.path().join("lethe.toml");
    let good = std::fs::read_to_string(&cfg).unwrap();
    std::fs::write(
        &cfg,
        good.replace("covers = [\"checkpoints\"]", "covers = [\"checkpoint\"]"),
    )
    .unwrap();
    let digest = |p: &Path| {
        use std::hash::{Hash, Hasher};
        let mut h = std::collections::hash_map::DefaultHasher::new();
        std::fs::read(p).unwrap().hash(&mut h);
        h.finish()
    };
    let before = digest(&env.path().join("memory/checkpoints.db"));
    let o = env.run(&[
        "erase",
        "--tenant",
        "acme",
        "--subject",
        "alice",
        "--basis",
        "gdpr-art17",
        "--ticket",
        "DSR-1",
    ]);
    assert_eq!(o.status.code(), Some(2));
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(
        err.contains("covers `checkpoint`, which is not a target"),
        "{err}"
    );
    assert_eq!(
        digest(&env.path().join("memory/checkpoints.db")),
        before,
        "nothing touched"
    );
    assert!(
        !env.path().join("lethe-journal.db").exists(),
        "no journal, no job"
    );
    std::fs::write(
        &cfg,
        good.replace("covers = [\"checkpoints\"]", "covers = [\"nightly\"]"),
    )
    .unwrap();
    let o = env.run(&["backups", "check"]);
    assert_eq!(o.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&o.stderr).contains("itself a backup target"));
    // A backup folder that cannot be listed (a mount that is down): the job is BLOCKED naming
    // the target, and once it is back, resuming completes it.
    std::fs::write(&cfg, good).unwrap();
    std::fs::rename(env.path().join("backups"), env.path().join("away")).unwrap();
    let (code, out) = env.erase("alice");
    assert_eq!(code, 3, "{out}");
    assert_eq!(out["state"], "BLOCKED", "{out}");
    assert_eq!(out["blocked_target"], "nightly", "{out}");
    assert_eq!(out["blocked_reason"], "target_unavailable", "{out}");
    std::fs::rename(env.path().join("away"), env.path().join("backups")).unwrap();
    let job = out["job_id"].as_str().unwrap();
    let before = others(&env);
    let (code, out) = env.json(&["resume", job, "--json"]);
    assert_eq!(code, 0, "{out}");
    assert_eq!(others(&env), before, "every other subject kept its rows");
    assert_eq!(out["state"], "COMPLETE");
    assert_eq!(out["certificate"]["targets"]["nightly"]["status"], "DONE");
}

/// Crypto-shredding's rules at the engine: a data key only under a live lease, the erasure
/// destroys it (journaled, counted on the certificate) and makes a backup covering only
/// encrypted targets SHREDDED, and a KEK that is loose or lost is refused.
#[test]
fn a_subject_key_is_given_only_under_a_live_lease_and_its_erasure_shreds_the_backups() {
    let env = Env::new("\n[keys]\nkek_file = \"lethe.kek\"\nencrypted = [\"checkpoints\"]\n");
    env.artifact("2026-12-05.dump", 1);
    let open = || {
        let cfg = lethe_engine::Config::load(&env.path().join("lethe.toml")).unwrap();
        lethe_engine::Engine::open(cfg, std::sync::Arc::new(lethe_core::clock::SystemClock))
            .unwrap()
    };
    let lease = |engine: &lethe_engine::Engine| {
        engine
            .journal()
            .take_lease(
                time::OffsetDateTime::now_utc(),
                &lethe_core::Tenant::new("acme").unwrap(),
                &lethe_core::Subject::new("alice").unwrap(),
                &[],
                Duration::from_secs(60),
            )
            .unwrap()
            .id
    };
    let engine = open();
    let l = lease(&engine);
    let k = engine.data_key(l, None).unwrap();
    assert!(k.key_id.starts_with("dk-"));
    assert_eq!(
        engine.data_key(l, None).unwrap().key,
        k.key,
        "one key a subject"
    );
    assert_eq!(engine.data_key(l, Some(&k.key_id)).unwrap().key, k.key);
    drop(engine);

    let before = others(&env);
    let (code, out) = env.erase("alice");
    assert_eq!(code, 0, "{out}");
    assert_eq!(others(&env), before, "every other subject kept its rows");
    let cert = &out["certificate"];
    assert_eq!(cert["keys_destroyed"], 1, "{cert}");
    assert_eq!(cert["targets"]["nightly"]["status"], "SHREDDED");
    assert!(cert["targets"]["nightly"]["expires"].is_string());

    let engine = open();
    // The lease the freeze revoked gets nothing; a new one cannot have the old key back.
    assert!(matches!(
        engine.data_key(l, Some(&k.key_id)),
        Err(lethe_engine::keys::KeyError::Gate(
            lethe_core::gate::GateError::Revoked
        ))
    ));
    let l2 = lease(&engine);
    assert!(matches!(
        engine.data_key(l2, Some(&k.key_id)),
        Err(lethe_engine::keys::KeyError::Destroyed)
    ));
    let fresh = engine.data_key(l2, None).unwrap();
    assert_ne!(fresh.key_id, k.key_id);
    assert_ne!(fresh.key, k.key);
    let inv = engine.key_inventory().unwrap();
    assert_eq!(inv["key_store"]["keys"], 1);
    drop(engine);

    // A KEK others can read, or one lost while wrapped keys exist, is refused.
    let kek = env.path().join("lethe.kek");
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(&kek, std::fs::Permissions::from_mode(0o644)).unwrap();
    let o = env.run(&["keys", "inventory"]);
    assert_eq!(o.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&o.stderr).contains("readable by other users"));
    std::fs::remove_file(&kek).unwrap();
    let o = env.run(&["keys", "inventory"]);
    assert_eq!(o.status.code(), Some(2));
    assert!(
        String::from_utf8_lossy(&o.stderr).contains("is missing"),
        "{}",
        String::from_utf8_lossy(&o.stderr)
    );
    assert!(!kek.exists(), "no new KEK is made over existing keys");
}

#[test]
fn keys_naming_an_unknown_or_backup_target_is_refused() {
    for (encrypted, says) in [
        ("checkpoint", "not a target"),
        ("nightly", "a backup target"),
    ] {
        let env = Env::new(&format!(
            "\n[keys]\nkek_file = \"lethe.kek\"\nencrypted = [\"{encrypted}\"]\n"
        ));
        let o = env.run(&["keys", "inventory"]);
        assert_eq!(o.status.code(), Some(2));
        assert!(String::from_utf8_lossy(&o.stderr).contains(says));
        assert!(!env.path().join("lethe.kek").exists());
    }
}
