//! Whole jobs (`lethe erase`, `lethe resume`) against the contract doubles of services that
//! cannot run here (`lethe-adapters`' feature `test-doubles`): a store that cannot finish leaves
//! the job BLOCKED naming the target, with every other subject's data kept byte for byte, and a
//! rerun once the store has caught up completes it.

mod common;

use std::path::Path;

use lethe_adapters::langsmith::double as ls;
use lethe_adapters::opensearch::double as os;
use serde_json::{json, Map, Value};

struct Env {
    dir: tempfile::TempDir,
}

impl Env {
    fn new(targets: &str) -> Self {
        let dir = tempfile::tempdir().unwrap();
        let config = format!(
            "[control]\njournal = \"sqlite:lethe-journal.db\"\nkey_file = \"lethe.key\"\npolicy_version = \"test-1\"\ncertificates = \"certificates\"\n\n{targets}"
        );
        std::fs::write(dir.path().join("lethe.toml"), config).unwrap();
        Self { dir }
    }

    /// A secret file (mode 600) in the config's folder.
    fn secret(&self, name: &str, text: &str) -> String {
        use std::os::unix::fs::PermissionsExt;
        let f = self.dir.path().join(name);
        std::fs::write(&f, format!("{text}\n")).unwrap();
        std::fs::set_permissions(&f, std::fs::Permissions::from_mode(0o600)).unwrap();
        f.display().to_string()
    }

    fn json(&self, args: &[&str]) -> (i32, Value) {
        common::json(self.dir.path(), args)
    }

    fn append(&self, text: &str) {
        let p = self.dir.path().join("lethe.toml");
        let mut s = std::fs::read_to_string(&p).unwrap();
        s.push_str(text);
        std::fs::write(p, s).unwrap();
    }

    fn path(&self) -> &Path {
        self.dir.path()
    }
}

const ERASE_ALICE: [&str; 10] = [
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

fn source(subject: &str, n: usize) -> Map<String, Value> {
    serde_json::from_value(json!({
        "tenant_id": "acme", "user_id": subject, "content": format!("{subject} said secret number {n}"),
    }))
    .unwrap()
}

/// OpenSearch: the delete task does not complete within `task_timeout_ms`, so the erase step is
/// unavailable and the job BLOCKED `target_unavailable` naming the target, nothing of Bob's
/// touched. Once the cluster runs its tasks again, `resume` completes the job and certifies
/// Alice's three documents; Bob's two are byte for byte what they were.
#[test]
fn an_opensearch_task_that_does_not_finish_blocks_the_job_and_a_resume_completes_it() {
    let mut docs = Vec::new();
    for k in 0..3 {
        docs.push((format!("alice-{k}"), source("alice", k)));
    }
    for k in 0..2 {
        docs.push((format!("bob-{k}"), source("bob", k)));
    }
    let d = os::Double::start(docs);
    d.with(|s| s.task_polls = 1_000_000);
    let env = Env::new("");
    let pw = env.secret("os-password", os::PASSWORD);
    env.append(&format!(
        "[[target]]\nname = \"kb\"\nkind = \"opensearch\"\nclass = \"keyword-index\"\nurl = \"{}\"\nindex = \"{}\"\nusername = \"{}\"\npassword_file = \"{pw}\"\nfields = {{ tenant = \"tenant_id\", subject = \"user_id\" }}\nretries = 0\ntask_timeout_ms = 300\n",
        d.url(),
        os::INDEX,
        os::USER
    ));
    let bob = |d: &os::Double| {
        d.with(|s| {
            s.docs
                .iter()
                .filter(|(id, _)| id.starts_with("bob"))
                .map(|(id, doc)| (id.clone(), serde_json::to_string(&doc.source).unwrap()))
                .collect::<Vec<_>>()
        })
    };
    let bob_before = bob(&d);
    let (c, out) = env.json(&ERASE_ALICE);
    assert_eq!(c, 3, "{out}");
    assert_eq!(out["state"], "BLOCKED");
    assert_eq!(out["blocked_reason"], "target_unavailable");
    assert_eq!(out["blocked_target"], "kb", "the block names the target");
    assert_eq!(bob(&d), bob_before);
    let job = out["job_id"].as_str().unwrap().to_string();

    d.with(|s| s.task_polls = 0);
    let (c, out) = env.json(&["resume", &job, "--json"]);
    assert_eq!(c, 0, "{out}");
    assert_eq!(out["state"], "COMPLETE");
    assert_eq!(out["certificate"]["targets"]["kb"]["count"], 3);
    assert!(d.with(|s| s.docs.keys().all(|k| !k.starts_with("alice"))));
    assert_eq!(bob(&d), bob_before, "Bob's documents kept byte for byte");
    assert!(env.path().join("certificates").exists());
}

fn runs(subject: &str, o: usize) -> Vec<ls::Run> {
    (0..2)
        .map(|k| {
            let trace = format!("{o:08x}-{k:04x}-4000-8000-000000000000");
            ls::Run {
                id: trace.clone(),
                trace_id: trace,
                metadata: serde_json::from_value(
                    json!({ "tenant_id": "acme", "user_id": subject }),
                )
                .unwrap(),
                inputs: json!(format!("{subject} says secret number {k}")),
                outputs: json!(null),
            }
        })
        .collect()
}

/// LangSmith accepts a delete and carries it out later: the job's verification reads back
/// within its bound, still finds Alice's runs, and the job is BLOCKED `residue` naming the target
/// (never COMPLETE on the delete's 200). Once LangSmith has carried the delete out, `resume`
/// reads back again and completes; Bob's runs are kept byte for byte.
#[test]
fn a_langsmith_delete_not_yet_carried_out_blocks_on_residue_and_a_resume_completes() {
    let mut all = runs("alice", 0);
    all.extend(runs("bob", 1));
    let d = ls::Double::start(all);
    d.with(|s| s.delay = 1_000_000);
    let env = Env::new("");
    let key = env.secret("ls-key", ls::KEY);
    env.append(&format!(
        "[[target]]\nname = \"traces\"\nkind = \"langsmith\"\nclass = \"trace\"\nurl = \"{}\"\nproject_id = \"{}\"\napi_key_file = \"{key}\"\nmetadata = {{ tenant = \"tenant_id\", subject = \"user_id\" }}\npoll_ms = 20\nverify_timeout_ms = 300\n",
        d.url(),
        ls::PROJECT
    ));
    let bob = |d: &ls::Double| {
        d.with(|s| {
            s.runs
                .iter()
                .filter(|r| r.metadata["user_id"] == "bob")
                .map(|r| format!("{} {} {} {}", r.id, r.trace_id, r.inputs, r.outputs))
                .collect::<Vec<_>>()
        })
    };
    let bob_before = bob(&d);
    let (c, out) = env.json(&ERASE_ALICE);
    assert_ne!(c, 0, "{out}");
    assert_eq!(out["state"], "BLOCKED");
    assert_eq!(out["blocked_reason"], "residue");
    assert_eq!(
        out["blocked_target"], "traces",
        "the block names the target"
    );
    let job = out["job_id"].as_str().unwrap().to_string();

    d.with(|s| s.carry_out());
    let (c, out) = env.json(&["resume", &job, "--json"]);
    assert_eq!(c, 0, "{out}");
    assert_eq!(out["state"], "COMPLETE");
    assert_eq!(out["certificate"]["targets"]["traces"]["count"], 2);
    assert!(d.with(|s| s.runs.iter().all(|r| r.metadata["user_id"] != "alice")));
    assert_eq!(bob(&d), bob_before, "Bob's runs kept byte for byte");
}
