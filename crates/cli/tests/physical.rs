//! `physical` on the certificate and `lethe verify --physical`, end to end on a real Chroma
//! server (`scripts/chroma start`: LETHE_CHROMA_URL, its persist folder LETHE_CHROMA_DATA):
//! Chroma keeps an erased document's add in its write log (`embeddings_queue` in
//! `chroma.sqlite3`), so a target given its `path` is certified `PENDING` with the remedy.

mod common;

use std::path::Path;
use std::process::Output;
use std::sync::atomic::{AtomicUsize, Ordering};

use serde_json::{json, Value};

static N: AtomicUsize = AtomicUsize::new(0);

fn url() -> String {
    std::env::var("LETHE_CHROMA_URL").unwrap_or_else(|_| "http://127.0.0.1:8765".into())
}

fn data_dir() -> String {
    std::env::var("LETHE_CHROMA_DATA").unwrap_or_else(|_| "/var/tmp/lethe-chroma/data".into())
}

const DB: &str = "/api/v2/tenants/default_tenant/databases/default_database";

fn http(path: &str, body: Option<Value>) -> Value {
    let agent: ureq::Agent = ureq::Agent::config_builder()
        .http_status_as_error(false)
        .build()
        .into();
    let u = format!("{}{path}", url());
    let mut r = match body {
        Some(b) => agent
            .post(&u)
            .content_type("application/json")
            .send(serde_json::to_vec(&b).unwrap()),
        None => agent.delete(&u).call(),
    }
    .expect("Chroma answers (scripts/chroma start; LETHE_CHROMA_URL)");
    let status = r.status().as_u16();
    let bytes = r.body_mut().read_to_vec().unwrap();
    assert!(
        (200..300).contains(&status),
        "{path}: {status} {}",
        String::from_utf8_lossy(&bytes)
    );
    serde_json::from_slice(&bytes).unwrap_or(Value::Null)
}

/// A collection of this test's own, with three documents of acme/alice and two of acme/bob;
/// dropped with the test.
struct Coll {
    name: String,
    cid: String,
}

impl Coll {
    fn new() -> Self {
        let name = format!(
            "lethe-phys-{}-{}",
            std::process::id(),
            N.fetch_add(1, Ordering::SeqCst)
        );
        let v = http(
            &format!("{DB}/collections"),
            Some(json!({ "name": name, "metadata": { "hnsw:space": "l2" } })),
        );
        let cid = v["id"].as_str().unwrap().to_string();
        let owners = [("alice", 3), ("bob", 2)];
        let (mut ids, mut docs, mut metas, mut vecs) = (vec![], vec![], vec![], vec![]);
        for (o, (s, n)) in owners.iter().enumerate() {
            for k in 0..*n {
                ids.push(format!("{s}-doc-{k}"));
                docs.push(format!("{s} said secret number {o}-{k}"));
                metas.push(json!({ "tenant_id": "acme", "user_id": s }));
                let c = o as f64 * 10.0;
                vecs.push(json!([c, c + k as f64 * 0.01, -c, 1.0]));
            }
        }
        http(
            &format!("{DB}/collections/{cid}/add"),
            Some(json!({ "ids": ids, "documents": docs, "metadatas": metas, "embeddings": vecs })),
        );
        Coll { name, cid }
    }

    /// Every document of `subject`: ids, text, metadata and vectors, as Chroma returns them.
    fn docs_of(&self, subject: &str) -> Value {
        let mut v = http(
            &format!("{DB}/collections/{}/get", self.cid),
            Some(json!({
                "where": { "user_id": { "$eq": subject } },
                "include": ["documents", "metadatas", "embeddings"]
            })),
        );
        v.as_object_mut().unwrap().remove("include");
        v
    }

    /// The `[[target]]` table for this collection, with `extra` keys.
    fn target(&self, name: &str, extra: &str) -> String {
        format!(
            "[[target]]\nname = \"{name}\"\nkind = \"chroma\"\nclass = \"vector-index\"\nurl = \"{}\"\ncollection = \"{}\"\nmetadata = {{ tenant = \"tenant_id\", subject = \"user_id\" }}\n{extra}\n",
            url(),
            self.name
        )
    }
}

impl Drop for Coll {
    fn drop(&mut self) {
        let _ = std::panic::catch_unwind(|| http(&format!("{DB}/collections/{}", self.name), None));
    }
}

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

    fn run(&self, args: &[&str]) -> Output {
        common::run(self.dir.path(), args)
    }

    fn json(&self, args: &[&str]) -> (i32, Value) {
        common::json(self.dir.path(), args)
    }
}

fn erase(env: &Env, subject: &str) -> (i32, Value) {
    env.json(&[
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

fn text(o: &Output) -> String {
    format!(
        "{}{}",
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr)
    )
}

/// A chroma target given its persist folder gets a `physical` line: `PENDING`, the write log's
/// rows counted, Chroma's remedy; one without `path` gets none. The certificate verifies.
/// `verify --physical` on the COMPLETE job refuses (exit 2) rather than report a false CLEAN:
/// completion dropped the ids it would look for.
#[test]
fn a_chroma_target_with_path_is_certified_physically_pending_and_verify_physical_agrees() {
    let dir = data_dir();
    assert!(
        Path::new(&dir).join("chroma.sqlite3").exists(),
        "no chroma.sqlite3 in {dir}: set LETHE_CHROMA_DATA to the test server's persist folder"
    );
    let (with, without) = (Coll::new(), Coll::new());
    let env = Env::new(&format!(
        "{}{}",
        with.target("vectors", &format!("path = \"{dir}\"")),
        without.target("vectors-nopath", "")
    ));
    let bobs = (with.docs_of("bob"), without.docs_of("bob"));
    assert_eq!(bobs.0["ids"].as_array().unwrap().len(), 2);
    let (c, out) = erase(&env, "alice");
    assert_eq!(c, 0, "{out}");
    assert_eq!(
        out["state"], "COMPLETE",
        "logical COMPLETE does not wait for it"
    );
    assert_eq!(
        (with.docs_of("bob"), without.docs_of("bob")),
        bobs,
        "bob kept every document, byte for byte"
    );
    assert_eq!(
        with.docs_of("alice")["ids"],
        json!([]),
        "alice's documents are gone"
    );
    let job = out["job_id"].as_str().unwrap().to_string();
    let cert = &out["certificate"];
    let t = &cert["targets"]["vectors"];
    assert_eq!(
        (t["status"].as_str(), t["count"].as_u64()),
        (Some("DONE"), Some(3))
    );
    let p = &t["physical"];
    assert_eq!(p["status"], "PENDING", "{t}");
    // Three adds (text, metadata, vector) and three deletes name the erased ids.
    assert_eq!(p["residue"], 6, "{p}");
    assert!(
        p["remedy"].as_str().unwrap().contains("embeddings_queue"),
        "{p}"
    );
    assert!(p["checked_at"].as_str().unwrap().ends_with('Z'), "{p}");
    let mut keys: Vec<_> = p.as_object().unwrap().keys().cloned().collect();
    keys.sort();
    assert_eq!(keys, ["checked_at", "remedy", "residue", "status"]);
    let n = &cert["targets"]["vectors-nopath"];
    assert_eq!(n["status"], "DONE");
    assert!(
        n.get("physical").is_none(),
        "no path, no physical line: {n}"
    );

    // The certificate verifies offline, its file as signed.
    let file = env.dir.path().join(format!("certificates/{job}.json"));
    let o = env.run(&["certificate", "verify", file.to_str().unwrap()]);
    assert_eq!(o.status.code(), Some(0), "{}", text(&o));
    let md = env.run(&["certificate", "show", &job, "--format", "md"]);
    let md = text(&md);
    assert!(
        md.contains("vectors: its files still held erased data")
            && md.contains("Remedy: Chroma keeps"),
        "{md}"
    );
    assert!(!md.contains("vectors-nopath: its files"), "{md}");

    // Re-checked later: completion dropped the erased ids, so the files cannot be looked in
    // again; refused (exit 2), never a false CLEAN, and nothing changed or signed.
    let (c, v) = env.json(&["verify", "--physical", "--job", &job, "--json"]);
    assert_eq!(c, 2, "{v}");
    let why = v["error"]["message"].as_str().unwrap().to_string();
    assert!(
        why.contains("no longer kept") && why.contains("vectors"),
        "{why}"
    );
    let o = env.run(&["verify", "--physical", "--job", &job]);
    assert_eq!(o.status.code(), Some(2), "{}", text(&o));
    assert_eq!(
        serde_json::from_slice::<Value>(&std::fs::read(&file).unwrap()).unwrap(),
        signed(&env, &job)
    );
    assert_eq!(signed(&env, &job), *cert, "the certificate is as signed");

    // No identifier or content anywhere it is shown.
    for shown in [cert.to_string(), why, md, text(&o)] {
        for secret in ["alice", "secret number", "alice-doc"] {
            assert!(!shown.contains(secret), "{secret} in {shown}");
        }
    }
}

/// The certificate the journal holds for a job, as `certificate show` prints it.
fn signed(env: &Env, job: &str) -> Value {
    let o = env.run(&["certificate", "show", job]);
    serde_json::from_slice(&o.stdout).unwrap()
}

/// Without `path` no target has a physical check: the certificate's target lines keep the
/// keys they always had, and `verify --physical` has nothing to look at (exit 0); a job that
/// is not there is refused.
#[test]
fn without_path_the_certificate_keeps_its_shape_and_verify_physical_is_clean() {
    let coll = Coll::new();
    let env = Env::new(&coll.target("vectors", ""));
    let (c, out) = erase(&env, "bob");
    assert_eq!(c, 0, "{out}");
    let t = &out["certificate"]["targets"]["vectors"];
    let mut keys: Vec<_> = t.as_object().unwrap().keys().cloned().collect();
    keys.sort();
    assert_eq!(
        keys,
        [
            "adapter",
            "adapter_version",
            "class",
            "count",
            "error_codes",
            "status"
        ]
    );
    let job = out["job_id"].as_str().unwrap();
    let (c, v) = env.json(&["verify", "--physical", "--job", job, "--json"]);
    assert_eq!((c, &v["clean"]), (0, &Value::Bool(true)), "{v}");
    assert_eq!(v["targets"], json!({}));
    let o = env.run(&["verify", "--physical", "--job", job]);
    assert_eq!(o.status.code(), Some(0), "{}", text(&o));
    assert!(text(&o).contains("No target of job"), "{}", text(&o));
    let o = env.run(&["verify", "--physical", "--job", "del-0000"]);
    assert_ne!(o.status.code(), Some(0), "{}", text(&o));
    // --physical needs --job, and --job takes no scope.
    assert_eq!(env.run(&["verify", "--physical"]).status.code(), Some(2));
    let o = env.run(&["verify", "--job", job, "--physical", "--tenant", "acme"]);
    assert_eq!(o.status.code(), Some(2), "{}", text(&o));
}
