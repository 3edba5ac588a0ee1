//! The `chroma` target on a real Chroma server (`scripts/chroma start`, LETHE_CHROMA_URL; its
//! persist folder LETHE_CHROMA_DATA). Each test writes its own collection, and every test that
//! erases checks that every document it did not mean to erase kept its id, document, metadata
//! and vector byte for byte.

use std::collections::BTreeMap;
use std::path::Path;
use std::sync::atomic::{AtomicUsize, Ordering};

use lethe_core::{MemoryId, Scope, Subject, Tenant};
use serde_json::{json, Value};

use crate::conformance::{self, Case, Row};
use crate::{Adapter, AdapterError, Applicability};

use super::{Chroma, Config};

static N: AtomicUsize = AtomicUsize::new(0);

fn url() -> String {
    std::env::var("LETHE_CHROMA_URL").unwrap_or_else(|_| "http://127.0.0.1:8765".into())
}

fn data_dir() -> String {
    std::env::var("LETHE_CHROMA_DATA").unwrap_or_else(|_| "/var/tmp/lethe-chroma/data".into())
}

const DB: &str = "/api/v2/tenants/default_tenant/databases/default_database";

fn http(method: &str, path: &str, body: Option<Value>) -> Value {
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
        None if method == "DELETE" => agent.delete(&u).call(),
        None => agent.get(&u).call(),
    }
    .expect("Chroma answers (scripts/chroma start; LETHE_CHROMA_URL)");
    let status = r.status().as_u16();
    let bytes = r.body_mut().with_config().limit(1 << 30).read_to_vec().unwrap();
    assert!((200..300).contains(&status), "{method} {path}: {status} {}", String::from_utf8_lossy(&bytes));
    serde_json::from_slice(&bytes).unwrap_or(Value::Null)
}

/// The awkward subjects every test seeds: neighbours of `alice` (another case, a longer id,
/// the same id under another tenant) and identifiers that look like Chroma's operators.
const OWNERS: &[(&str, &str)] = &[
    ("acme", "alice"),
    ("acme", "Alice"),
    ("acme", "alice2"),
    ("acme", "alic"),
    ("other", "alice"),
    ("acme", "$ne"),
    ("acme", "{\"$gt\":\"\"}"),
    ("acme", "$and"),
    ("acme", "zoë d'Arc \"q\" \\ %_*"),
    ("acme", "bob"),
    ("acme2", "bob"),
    ("$eq", "bob"),
];

/// One document's owner and memory id, as the seeder wrote it.
#[derive(Clone)]
struct Doc {
    id: String,
    owner: (String, String),
    memory: String,
}

/// A test's own collection on the real server, seeded with [`OWNERS`]'s documents.
struct Coll {
    name: String,
    cid: String,
    docs: Vec<Doc>,
    adapter: Box<dyn Adapter>,
}

impl Coll {
    fn new(per_owner: usize, extra_target: &str) -> Self {
        let name = format!(
            "lethe-t{}-{}",
            std::process::id(),
            N.fetch_add(1, Ordering::SeqCst)
        );
        let v = http(
            "POST",
            &format!("{DB}/collections"),
            Some(json!({ "name": name, "metadata": { "hnsw:space": "l2" } })),
        );
        let cid = v["id"].as_str().unwrap().to_string();
        let mut docs = Vec::new();
        let (mut ids, mut documents, mut metadatas, mut embeddings) =
            (Vec::new(), Vec::new(), Vec::new(), Vec::new());
        for (o, (t, s)) in OWNERS.iter().enumerate() {
            for k in 0..per_owner {
                // Awkward document ids too: spaces, quotes, non-ASCII, an operator's name.
                let id = match k {
                    0 => format!("{o}:{s}"),
                    1 => format!("$in {o} ü \"{k}\""),
                    _ => format!("doc-{o}-{k}"),
                };
                let memory = format!("m{k}");
                ids.push(id.clone());
                documents.push(format!("{s} of {t} said secret number {o}-{k}"));
                metadatas.push(json!({
                    "tenant_id": t, "user_id": s, "mem_id": memory,
                    "kind": "fact", "n": (o * 100 + k) as i64, "score": 0.5 + k as f64,
                }));
                // Each owner its own cluster of points: its own nearest neighbours.
                let c = o as f64 * 10.0;
                embeddings.push(json!([c, c + k as f64 * 0.01, -c, 1.0 + k as f64 * 0.001]));
                docs.push(Doc {
                    id,
                    owner: (t.to_string(), s.to_string()),
                    memory,
                });
            }
        }
        http(
            "POST",
            &format!("{DB}/collections/{cid}/add"),
            Some(json!({ "ids": ids, "documents": documents, "metadatas": metadatas, "embeddings": embeddings })),
        );
        let adapter = Box::new(target(&name, extra_target));
        Coll {
            name,
            cid,
            docs,
            adapter,
        }
    }

    fn chroma(&self, extra: &str) -> Chroma {
        target(&self.name, extra)
    }

    /// Every document now: id, document, metadata and vector, as Chroma returns them.
    fn all(&self) -> BTreeMap<String, Vec<u8>> {
        let v = http(
            "POST",
            &format!("{DB}/collections/{}/get", self.cid),
            Some(json!({ "include": ["documents", "metadatas", "embeddings"] })),
        );
        let ids = v["ids"].as_array().unwrap();
        let mut out = BTreeMap::new();
        for (i, id) in ids.iter().enumerate() {
            let row = json!([id, v["documents"][i], v["metadatas"][i], v["embeddings"][i]]);
            out.insert(id.as_str().unwrap().to_string(), serde_json::to_vec(&row).unwrap());
        }
        out
    }

    fn ids_of(&self, t: &str, s: &str) -> Vec<String> {
        self.docs
            .iter()
            .filter(|d| d.owner == (t.to_string(), s.to_string()))
            .map(|d| d.id.clone())
            .collect()
    }

    /// The `n` nearest documents to each of `ids`' own vectors.
    fn recall(&self, ids: &[String], n: usize) -> Vec<Value> {
        let got = http(
            "POST",
            &format!("{DB}/collections/{}/get", self.cid),
            Some(json!({ "ids": ids, "include": ["embeddings"] })),
        );
        let v = http(
            "POST",
            &format!("{DB}/collections/{}/query", self.cid),
            Some(json!({ "query_embeddings": got["embeddings"], "n_results": n, "include": ["distances", "documents"] })),
        );
        vec![v["ids"].clone(), v["distances"].clone(), v["documents"].clone()]
    }
}

impl Drop for Coll {
    fn drop(&mut self) {
        let _ = std::panic::catch_unwind(|| {
            http("DELETE", &format!("{DB}/collections/{}", self.name), None)
        });
    }
}

impl Case for Coll {
    fn adapter(&self) -> &dyn Adapter {
        self.adapter.as_ref()
    }

    fn snapshot(&self) -> Vec<Row> {
        let owners: BTreeMap<&str, &(String, String)> =
            self.docs.iter().map(|d| (d.id.as_str(), &d.owner)).collect();
        self.all()
            .into_iter()
            .map(|(id, bytes)| Row {
                table: "collection".into(),
                bytes,
                owner: owners[id.as_str()].clone(),
            })
            .collect()
    }
}

fn target(collection: &str, extra: &str) -> Chroma {
    let text = format!(
        "url = \"{}\"\ncollection = \"{collection}\"\nmetadata = {{ tenant = \"tenant_id\", subject = \"user_id\" }}\n{extra}\n",
        url()
    );
    Config::parse(toml::from_str(&text).unwrap(), Path::new("."))
        .unwrap()
        .build("vectors")
}

fn subject(t: &str, s: &str) -> Scope {
    Scope::Subject {
        tenant: Tenant::new(t).unwrap(),
        subject: Subject::new(s).unwrap(),
    }
}

/// The shared suite for every seeded subject, each in a fresh collection, in batches of 2:
/// exactly its documents go, every other document keeps every byte, verify counts zero, a
/// second erase deletes nothing.
#[test]
fn conformance_every_subject_with_its_neighbours_and_operator_lookalikes() {
    for (t, s) in OWNERS {
        let coll = Coll::new(3, "batch_size = 2");
        let me = (t.to_string(), s.to_string());
        let out = conformance::run(&coll, &subject(t, s), &|o| *o == me, 2);
        assert_eq!((out.inventoried, out.erased, out.erased_again, out.residue), (3, 3, 0, 0), "{t}/{s}");
    }
}

#[test]
fn conformance_tenant_scope() {
    let coll = Coll::new(2, "");
    let scope = Scope::Tenant {
        tenant: Tenant::new("acme").unwrap(),
    };
    let out = conformance::run(&coll, &scope, &|o| o.0 == "acme", 5);
    let acme = OWNERS.iter().filter(|(t, _)| *t == "acme").count() as u64;
    assert_eq!((out.erased, out.residue), (2 * acme, 0));
}

/// Inventory alone, read-only: each subject counts exactly its own documents (never a
/// neighbour's, never through an operator), and Chroma's filter is what the adapter built.
#[test]
fn neighbours_and_operator_lookalikes_never_match() {
    let coll = Coll::new(2, "");
    let before = coll.all();
    for (t, s) in OWNERS {
        let inv = coll.adapter.inventory(&subject(t, s)).unwrap();
        let mut want: Vec<String> = coll.ids_of(t, s);
        want.sort();
        let mut got: Vec<String> = inv
            .locators
            .iter()
            .map(|(l, n)| {
                assert_eq!(*n, 1);
                String::from_utf8(crate::redis::adapter::unhex(&l[2..]).unwrap()).unwrap()
            })
            .collect();
        got.sort();
        assert_eq!(got, want, "{t}/{s}");
    }
    // An identifier that is an operator's name or a filter's text is only ever a string value.
    let f = coll.chroma("").filter(&subject("acme", "{\"$gt\":\"\"}"));
    assert_eq!(
        f,
        json!({"$and": [{"tenant_id": {"$eq": "acme"}}, {"user_id": {"$eq": "{\"$gt\":\"\"}"}}]})
    );
    for who in ["", "ALICE", "alice ", " alice", "alice\u{200b}"] {
        if let Ok(s) = Subject::new(who) {
            assert_eq!(coll.adapter.inventory(&subject("acme", s.as_str())).unwrap().count, 0, "{who:?}");
        }
    }
    assert_eq!(coll.all(), before, "inventory is read-only");
}

/// A memory scope, both ways: by the `memory` metadata key, and by document id. Only that
/// document goes; the same memory id of a neighbour stays.
#[test]
fn memory_scope_by_metadata_key_and_by_document_id() {
    let coll = Coll::new(3, "");
    let memory = |m: &str| Scope::Memory {
        tenant: Tenant::new("acme").unwrap(),
        subject: Subject::new("alice").unwrap(),
        memory: MemoryId::new(m).unwrap(),
        version: None,
    };
    let before = coll.snapshot();
    let by_key = coll.chroma("memory = \"mem_id\"");
    let inv = by_key.inventory(&memory("m1")).unwrap();
    assert_eq!(inv.count, 1);
    assert_eq!(by_key.erase_batch(&memory("m1"), &inv.locators).unwrap(), 1);
    assert_eq!(by_key.verify(&memory("m1"), &inv.locators).unwrap(), 0);
    let gone = coll
        .docs
        .iter()
        .find(|d| d.owner == ("acme".into(), "alice".into()) && d.memory == "m1")
        .unwrap()
        .id
        .clone();
    let after = coll.snapshot();
    conformance::assert_only_removed(&before, &after, 1, &|r| {
        serde_json::from_slice::<Value>(&r.bytes).unwrap()[0] == json!(gone)
    });

    // By document id: Bob's document id under Alice's scope is not Alice's and matches nothing.
    let by_id = coll.chroma("");
    let bobs = coll.ids_of("acme", "bob")[0].clone();
    assert_eq!(by_id.inventory(&memory(&bobs)).unwrap().count, 0);
    let alices = coll.ids_of("acme", "alice")[0].clone();
    let inv = by_id.inventory(&memory(&alices)).unwrap();
    assert_eq!(inv.count, 1);
    assert_eq!(by_id.erase_batch(&memory(&alices), &inv.locators).unwrap(), 1);
    assert_eq!(by_id.erase_batch(&memory(&alices), &inv.locators).unwrap(), 0, "idempotent");
    assert_eq!(by_id.verify(&memory(&alices), &inv.locators).unwrap(), 0);
    conformance::assert_only_removed(&after, &coll.snapshot(), 1, &|r| {
        serde_json::from_slice::<Value>(&r.bytes).unwrap()[0] == json!(alices)
    });
}

/// Another subject's document smuggled into a batch of locators (a tampered journal, or a
/// document whose owner metadata changed since the freeze): the batch is refused before
/// anything is deleted.
#[test]
fn anomaly_guard_refuses_a_batch_that_names_another_owners_document() {
    let coll = Coll::new(3, "");
    let scope = subject("acme", "alice");
    let mut inv = coll.adapter.inventory(&scope).unwrap();
    let bobs = coll.ids_of("acme", "Alice")[0].clone();
    inv.locators
        .push((crate::redis::adapter::hex_locator("d:", bobs.as_bytes()), 1));
    let before = coll.all();
    let e = coll.adapter.erase_batch(&scope, &inv.locators).unwrap_err();
    assert!(
        matches!(e, AdapterError::AnomalousVolume { expected: 3, found: 4, .. }),
        "{e}"
    );
    let shown = e.to_string();
    assert!(!shown.contains("alice") && !shown.contains("Alice"), "{shown}");
    assert_eq!(coll.all(), before, "nothing of the batch was deleted");

    // A locator that is not this kind's is refused too.
    let e = coll
        .adapter
        .erase_batch(&scope, &[("k:00".into(), 1)])
        .unwrap_err();
    assert!(matches!(e, AdapterError::Failed { .. }), "{e}");
    assert_eq!(coll.all(), before);
}

/// Recall after erasure: querying with the erased documents' own vectors finds none of them,
/// and another subject's nearest documents are exactly what they were.
#[test]
fn recall_after_erasure_finds_nothing_of_the_subject_and_the_same_for_others() {
    let coll = Coll::new(4, "");
    let alice = coll.ids_of("acme", "alice");
    let bob = coll.ids_of("acme", "bob");
    let bob_before = coll.recall(&bob, 4);
    let alice_before = coll.recall(&alice, 4);
    let hits = |r: &Value| -> usize {
        r.as_array()
            .unwrap()
            .iter()
            .flat_map(|q| q.as_array().unwrap())
            .filter(|id| alice.contains(&id.as_str().unwrap().to_string()))
            .count()
    };
    assert_eq!(hits(&alice_before[0]), 16, "before: each of alice's vectors finds her documents");
    let before = coll.snapshot();
    let scope = subject("acme", "alice");
    let inv = coll.adapter.inventory(&scope).unwrap();
    assert_eq!(coll.adapter.erase_batch(&scope, &inv.locators).unwrap(), 4);
    let others: Vec<Row> = before.into_iter().filter(|r| r.owner != ("acme".into(), "alice".into())).collect();
    assert_eq!(coll.snapshot(), others);
    // Alice's vectors were read before the erase; query with them again.
    let got = http(
        "POST",
        &format!("{DB}/collections/{}/query", coll.cid),
        Some(json!({ "query_embeddings": alice_vectors(), "n_results": 10, "include": ["documents"] })),
    );
    assert_eq!(hits(&got["ids"]), 0, "none of alice's documents comes back");
    let texts = got["documents"].to_string();
    assert!(!texts.contains("alice of acme"), "no text of hers comes back");
    assert_eq!(coll.recall(&bob, 4), bob_before, "bob's nearest documents are unchanged");
}

/// The vectors [`Coll::new`] gives `acme/alice` (owner 0).
fn alice_vectors() -> Value {
    json!((0..4)
        .map(|k| json!([0.0, k as f64 * 0.01, 0.0, 1.0 + k as f64 * 0.001]))
        .collect::<Vec<_>>())
}

#[test]
fn an_unreachable_server_is_unavailable_and_a_missing_collection_failed() {
    let text = "url = \"http://127.0.0.1:9\"\ncollection = \"c\"\nmetadata = { tenant = \"t\", subject = \"s\" }\ntimeout_ms = 2000";
    let a = Config::parse(toml::from_str(text).unwrap(), Path::new("."))
        .unwrap()
        .build("vectors");
    for e in [
        a.probe().unwrap_err(),
        a.inventory(&subject("acme", "alice")).unwrap_err(),
        a.erase_batch(&subject("acme", "alice"), &[("d:61".into(), 1)]).unwrap_err(),
        a.verify(&subject("acme", "alice"), &[]).unwrap_err(),
    ] {
        assert!(matches!(e, AdapterError::Unavailable { .. }) && e.is_retryable(), "{e}");
        assert!(!e.to_string().contains("alice"), "{e}");
    }
    let missing = target("lethe-no-such-collection", "");
    let e = missing.probe().unwrap_err();
    assert!(matches!(e, AdapterError::Failed { .. }) && !e.is_retryable(), "{e}");
    let e = missing.inventory(&subject("acme", "alice")).unwrap_err();
    assert!(matches!(e, AdapterError::Failed { .. }), "a missing collection is never an empty inventory: {e}");
}

#[test]
fn describe_check_scope_probe_and_registry() {
    let coll = Coll::new(1, "");
    let a = coll.chroma("");
    assert_eq!(a.describe().kind, crate::Kind::Chroma);
    assert_eq!(a.check_scope(&subject("acme", "$ne")).unwrap(), Applicability::Applies);
    a.probe().unwrap();
    assert_eq!(a.batch_size(), Some(1000));
    assert!(a.place().contains(&coll.name) && !a.place().contains("127.0.0.1"));
    // Through the registry, as lethe.toml names it.
    let text = format!(
        "name = \"vectors\"\nkind = \"chroma\"\nclass = \"vector-index\"\nurl = \"{}\"\ncollection = \"{}\"\nmetadata = {{ tenant = \"tenant_id\", subject = \"user_id\" }}\n",
        url(),
        coll.name
    );
    let t = crate::build(1, toml::from_str(&text).unwrap(), Path::new(".")).unwrap();
    assert_eq!(t.adapter.inventory(&subject("acme", "alice")).unwrap().count, 1);
}

/// With `path`, the erased ids are looked for in `chroma.sqlite3`, read-only: the metadata
/// segment has none of them, and Chroma's write log still holds their adds (document text,
/// metadata and vector), which is what the report says.
#[test]
fn physical_residue_reads_the_persist_folder() {
    let dir = data_dir();
    if !Path::new(&dir).join("chroma.sqlite3").exists() {
        panic!("no chroma.sqlite3 in {dir}: set LETHE_CHROMA_DATA to the test server's persist folder");
    }
    let coll = Coll::new(3, "");
    let a = coll.chroma(&format!("path = \"{dir}\""));
    assert_eq!(coll.chroma("").physical_residue(&[]).unwrap(), None, "no path, no check");
    let scope = subject("acme", "alice");
    let inv = a.inventory(&scope).unwrap();
    let before = a.physical_residue(&inv.locators).unwrap().unwrap();
    assert_eq!(before.segment_rows, 3, "before the erase the segment holds them");
    assert_eq!(a.erase_batch(&scope, &inv.locators).unwrap(), 3);
    assert_eq!(a.verify(&scope, &inv.locators).unwrap(), 0, "logically erased");
    let after = a.physical_residue(&inv.locators).unwrap().unwrap();
    assert_eq!(after.segment_rows, 0);
    assert_eq!(after.queue_content_rows, 3, "Chroma's log keeps the adds: {after:?}");
    assert_eq!(after.queue_rows, 6, "and the deletes, which name the ids: {after:?}");
    assert!(!after.is_clean());
    // What the certificate and `verify --physical` get: every row that names an erased id.
    let shown = Adapter::physical(&a, &inv.locators).unwrap().unwrap();
    assert_eq!(shown.residue, after.queue_rows + after.segment_rows);
    assert_eq!(shown.remedy, super::PhysicalResidue::REMEDY);
    assert!(Adapter::physical(&coll.chroma(""), &inv.locators).unwrap().is_none());
    // Another subject's ids: nothing of theirs was erased, so their adds are not residue of
    // this erase; the check looks only for what the frozen locators name.
    let bob = a.inventory(&subject("acme", "bob")).unwrap();
    let b = a.physical_residue(&bob.locators).unwrap().unwrap();
    assert_eq!((b.queue_content_rows, b.segment_rows), (3, 3));
    // A path that is not this server's persist folder is refused, not reported clean.
    let empty = tempfile::tempdir().unwrap();
    let e = coll
        .chroma(&format!("path = \"{}\"", empty.path().display()))
        .physical_residue(&inv.locators)
        .unwrap_err();
    assert!(matches!(e, AdapterError::Failed { .. }), "{e}");
}

/// `max_in_flight` bounds the target's requests at once across threads (several jobs on one
/// collection), here against the shared test server standing in for Chroma: a higher bound lets
/// more through, so the bound is what held them.
#[test]
fn max_in_flight_bounds_concurrent_requests() {
    use crate::doubles::{Response, Server};
    let server = Server::start(|r| {
        Some(Response::json(
            200,
            if r.path.ends_with("/get") {
                json!({ "ids": [], "metadatas": [] })
            } else {
                json!({ "id": "00000000-0000-4000-8000-000000000001", "name": "memories" })
            },
        ))
    });
    let peak = |max: usize| {
        let text = format!(
            "url = \"{}\"\ncollection = \"memories\"\nmetadata = {{ tenant = \"tenant_id\", subject = \"user_id\" }}\nmax_in_flight = {max}\n",
            server.url()
        );
        let a = Config::parse(toml::from_str(&text).unwrap(), Path::new("."))
            .unwrap()
            .build("vectors");
        server.hold(50);
        std::thread::scope(|s| {
            for _ in 0..6 {
                s.spawn(|| {
                    let scope = Scope::Subject {
                        tenant: Tenant::new("acme").unwrap(),
                        subject: Subject::new("alice").unwrap(),
                    };
                    assert_eq!(a.inventory(&scope).unwrap().count, 0);
                });
            }
        });
        let p = server.peak();
        server.hold(0);
        p
    };
    assert_eq!(peak(2), 2);
    assert!(peak(6) > 2);
}
