//! The `opensearch` target against its contract double (`double.rs`), never a live
//! cluster (none can be installed here). Every test that erases checks that every document it
//! did not mean to erase kept every field byte for byte, and each documented rule the adapter
//! depends on has a test here that fails when the adapter ignores it.

use std::path::Path;
use std::time::{Duration, Instant};

use lethe_core::{MemoryId, Scope, Subject, Tenant, Version};
use serde_json::{json, Map, Value};

use crate::conformance::{self, Case, Row};
use crate::redis::adapter::{hex_locator, unhex};
use crate::{Adapter, AdapterError};

use super::{Config, OpenSearch};
use super::double::{Double, Fault, INDEX, PASSWORD, USER};

/// Neighbours of `alice` (another case, a longer and a shorter id, the same id under another
/// tenant), identifiers that look like query syntax or JSON operators, and unicode.
const OWNERS: &[(&str, &str)] = &[
    ("acme", "alice"),
    ("acme", "Alice"),
    ("acme", "alice2"),
    ("acme", "alic"),
    ("other", "alice"),
    ("acme", "{\"$ne\": \"\"}"),
    ("acme", "*"),
    ("acme", "alice OR bob"),
    ("acme", "o'brien \"q\" \\"),
    ("acme", "zoë 名前"),
    ("acme", "bob"),
    ("acme2", "bob"),
];

fn doc(tenant: &str, subject: &str, n: usize) -> Map<String, Value> {
    serde_json::from_value(json!({
        "tenant_id": tenant,
        "user_id": subject,
        "content": format!("{subject} of {tenant} said secret number {n}"),
        // Each owner's documents lie near its own point, so a subject's nearest neighbours are
        // its own documents first.
        "embedding": [(n / 1_000) as f64 * 10.0, (n % 1_000) as f64 * 0.1],
    }))
    .unwrap()
}

fn id(o: usize, k: usize) -> String {
    format!("doc-{o:02}-{k:05}")
}

fn seed(per_owner: usize) -> Vec<(String, Map<String, Value>)> {
    let mut docs = Vec::new();
    for (o, (t, s)) in OWNERS.iter().enumerate() {
        for k in 0..per_owner {
            docs.push((id(o, k), doc(t, s, o * 1_000 + k)));
        }
    }
    docs
}

fn secret(dir: &Path) -> std::path::PathBuf {
    use std::os::unix::fs::PermissionsExt;
    let f = dir.join("pw");
    std::fs::write(&f, format!("{PASSWORD}\n")).unwrap();
    std::fs::set_permissions(&f, std::fs::Permissions::from_mode(0o600)).unwrap();
    f
}

fn target(url: &str, extra: &str) -> OpenSearch {
    let dir = tempfile::tempdir().unwrap();
    let mut text = format!(
        "url = \"{url}\"\nindex = \"{INDEX}\"\nusername = \"{USER}\"\npassword_file = \"{}\"\nfields = {{ tenant = \"tenant_id\", subject = \"user_id\" }}\n{extra}\n",
        secret(dir.path()).display()
    );
    if !extra.contains("retries") {
        text.push_str("retries = 2\n");
    }
    Config::parse(toml::from_str(&text).unwrap(), Path::new("."))
        .unwrap()
        .build("search")
}

struct Idx {
    double: Double,
    adapter: OpenSearch,
}

impl Idx {
    fn new(docs: Vec<(String, Map<String, Value>)>, extra: &str) -> Self {
        let double = Double::start(docs);
        let adapter = target(&double.url(), extra);
        Idx { double, adapter }
    }
}

impl Case for Idx {
    fn adapter(&self) -> &dyn Adapter {
        &self.adapter
    }

    /// Every stored document (refreshed or not), every field.
    fn snapshot(&self) -> Vec<Row> {
        self.double.with(|s| {
            s.docs
                .iter()
                .map(|(id, d)| Row {
                    table: INDEX.into(),
                    bytes: serde_json::to_vec(&json!({ "id": id, "source": d.source, "v": d.version })).unwrap(),
                    owner: (
                        d.source["tenant_id"].as_str().unwrap().to_string(),
                        d.source["user_id"].as_str().unwrap().to_string(),
                    ),
                })
                .collect()
        })
    }
}

fn subject(t: &str, s: &str) -> Scope {
    Scope::Subject {
        tenant: Tenant::new(t).unwrap(),
        subject: Subject::new(s).unwrap(),
    }
}

fn memory(t: &str, s: &str, m: &str, v: Option<&str>) -> Scope {
    Scope::Memory {
        tenant: Tenant::new(t).unwrap(),
        subject: Subject::new(s).unwrap(),
        memory: MemoryId::new(m).unwrap(),
        version: v.map(|v| Version::new(v).unwrap()),
    }
}

fn ids(inv: &[(String, u64)]) -> Vec<String> {
    inv.iter()
        .map(|(l, _)| String::from_utf8(unhex(l.strip_prefix("d:").unwrap()).unwrap()).unwrap())
        .collect()
}

fn assert_clean(e: &AdapterError) {
    let shown = e.to_string();
    for secret in [PASSWORD, "alice", "doc-", "secret number", "rejected execution"] {
        assert!(!shown.contains(secret), "{secret} in {shown}");
    }
}

/// The shared suite for every seeded subject, each in a fresh index whose delete tasks take a
/// few polls: exactly its documents go, every other document keeps every byte.
#[test]
fn conformance_every_subject_with_neighbours_and_operator_lookalikes() {
    for (t, s) in OWNERS {
        let idx = Idx::new(seed(4), "batch_size = 3");
        let me = (t.to_string(), s.to_string());
        let out = conformance::run(&idx, &subject(t, s), &|o| *o == me, 3);
        assert_eq!((out.inventoried, out.erased, out.erased_again, out.residue), (4, 4, 0, 0), "{t}/{s}");
        idx.double.with(|st| assert_eq!(st.bad_auth, 0));
    }
}

#[test]
fn conformance_tenant_scope() {
    let idx = Idx::new(seed(3), "");
    let scope = Scope::Tenant { tenant: Tenant::new("acme").unwrap() };
    let out = conformance::run(&idx, &scope, &|o| o.0 == "acme", 5);
    let acme = OWNERS.iter().filter(|(t, _)| *t == "acme").count() as u64;
    assert_eq!((out.erased, out.residue), (3 * acme, 0));
}

/// The filter is `term` clauses of JSON strings: an identifier that looks like an operator or
/// a query string is one value, and a neighbour never matches.
#[test]
fn neighbours_and_operator_lookalikes_never_match() {
    let idx = Idx::new(seed(2), "");
    for (o, (t, s)) in OWNERS.iter().enumerate() {
        let inv = idx.adapter.inventory(&subject(t, s)).unwrap();
        assert_eq!(ids(&inv.locators), vec![id(o, 0), id(o, 1)], "{t}/{s}");
    }
    for who in ["ALICE", "alice ", "ali", "", "OR"] {
        if who.is_empty() {
            continue;
        }
        assert_eq!(idx.adapter.inventory(&subject("acme", who)).unwrap().count, 0, "{who:?}");
    }
    let q = idx.adapter.query(&subject("acme", "{\"$ne\": \"\"}"), None);
    assert_eq!(q["bool"]["filter"][1], json!({ "term": { "user_id": { "value": "{\"$ne\": \"\"}" } } }));
    assert!(!q.to_string().contains("match"));
}

/// A memory is a document id under the subject's fields: the same id under another subject is
/// not erased. The index's `_version` is not the memory's version: any version is accepted and
/// not checked (a LangGraph store's `updated_at` names the memory's).
#[test]
fn memory_scope_by_document_id() {
    let idx = Idx::new(seed(3), "");
    let a = &idx.adapter;
    let before = idx.snapshot();
    // Bob's document id under Alice's scope is not hers.
    assert_eq!(a.inventory(&memory("acme", "alice", &id(10, 1), None)).unwrap().count, 0);
    let v = Version::new("2026-12-04T09:30:00.123456Z").unwrap();
    assert!(a.check_version(&v).is_ok());
    assert_eq!(a.current_version(&memory("acme", "alice", &id(0, 1), None)).unwrap(), None);
    let scope = memory("acme", "alice", &id(0, 1), Some(v.as_str()));
    let inv = a.inventory(&scope).unwrap();
    assert_eq!(ids(&inv.locators), vec![id(0, 1)]);
    assert_eq!(a.erase_batch(&scope, &inv.locators).unwrap(), 1);
    assert_eq!(a.verify(&scope, &inv.locators).unwrap(), 0);
    assert_eq!(a.erase_batch(&scope, &inv.locators).unwrap(), 0);
    let gone = id(0, 1);
    conformance::assert_only_removed(&before, &idx.snapshot(), 1, &|r| {
        serde_json::from_slice::<Value>(&r.bytes).unwrap()["id"] == json!(gone)
    });
}

/// Search is near real time: a write acknowledged since the last refresh is invisible until one.
/// The inventory refreshes first, so it counts the write; verify refreshes too, so a write after
/// the erase is residue.
#[test]
fn writes_not_yet_refreshed_are_found() {
    let idx = Idx::new(seed(2), "");
    idx.double.with(|s| s.put("late-1", doc("acme", "alice", 9)));
    let scope = subject("acme", "alice");
    let inv = idx.adapter.inventory(&scope).unwrap();
    assert_eq!(inv.count, 3, "the unrefreshed write is counted");
    assert_eq!(idx.adapter.erase_batch(&scope, &inv.locators).unwrap(), 3);
    idx.double.with(|s| s.put("late-2", doc("acme", "alice", 10)));
    assert_eq!(idx.adapter.verify(&scope, &inv.locators).unwrap(), 1, "a write after the erase is residue");
    assert!(idx.double.with(|s| s.refreshes) >= 3);
}

/// 12,000 documents for one subject: a page by `from` stops at 10,000 (`max_result_window`);
/// the scroll finds them all, and the erase deletes them in batches.
#[test]
fn more_than_the_result_window_is_scrolled() {
    let mut docs = seed(1);
    for k in 0..12_000 {
        docs.push((format!("bulk-{k:06}"), doc("acme", "alice", k)));
    }
    let idx = Idx::new(docs, "batch_size = 5000");
    let me = ("acme".to_string(), "alice".to_string());
    let out = conformance::run(&idx, &subject("acme", "alice"), &|o| *o == me, 5_000);
    assert_eq!((out.inventoried, out.erased, out.residue), (12_001, 12_001, 0));
    let bad = Config::parse(
        toml::from_str(&format!("url = \"{}\"\nindex = \"{INDEX}\"\nfields = {{ tenant = \"t\", subject = \"s\" }}\nbatch_size = 10001\n", idx.double.url())).unwrap(),
        Path::new("."),
    );
    assert!(bad.is_err());
}

/// The delete runs as a task (`wait_for_completion=false`): the erase polls `GET _tasks/<id>`
/// until it completed and counts its `deleted`; the documents are gone when it returns. The
/// request carries `conflicts=proceed` and `refresh=true`.
#[test]
fn the_delete_task_is_polled_until_it_completes() {
    let idx = Idx::new(seed(3), "");
    idx.double.with(|s| s.task_polls = 6);
    let scope = subject("acme", "alice");
    let inv = idx.adapter.inventory(&scope).unwrap();
    assert_eq!(idx.adapter.erase_batch(&scope, &inv.locators).unwrap(), 3);
    idx.double.with(|s| {
        assert!(s.docs.keys().all(|k| !k.starts_with("doc-00-")), "gone when the erase returned");
        let polls = s.seen.iter().filter(|r| r.starts_with("GET /_tasks/")).count();
        assert_eq!(polls, 7, "polled until completed");
        let del: Vec<&String> = s.seen.iter().filter(|r| r.contains("_delete_by_query")).collect();
        assert_eq!(del.len(), 1);
        for p in ["conflicts=proceed", "refresh=true", "wait_for_completion=false"] {
            assert!(del[0].contains(p), "{p}: {}", del[0]);
        }
    });
    // A task that does not complete within task_timeout_ms: unavailable, resumable.
    let idx = Idx::new(seed(2), "");
    idx.double.with(|s| s.task_polls = 1_000_000);
    let slow = target(&idx.double.url(), "task_timeout_ms = 200");
    let inv = slow.inventory(&scope).unwrap();
    let e = slow.erase_batch(&scope, &inv.locators).unwrap_err();
    assert!(matches!(e, AdapterError::Unavailable { .. }) && e.to_string().contains("task_timeout_ms"), "{e}");
    idx.double.with(|s| s.task_polls = 0);
    assert_eq!(slow.erase_batch(&scope, &inv.locators).unwrap(), 2, "a resume finishes");
}

/// A document rewritten while the task runs is a version conflict. With `conflicts=proceed` the
/// task deletes the others and counts the conflict; the batch is unavailable (never counted as
/// done), and the resume deletes the rewritten document.
#[test]
fn a_version_conflict_is_not_counted_as_done_and_a_resume_finishes() {
    let idx = Idx::new(seed(4), "");
    let scope = subject("acme", "alice");
    let inv = idx.adapter.inventory(&scope).unwrap();
    idx.double.with(|s| {
        s.conflicts.insert(id(0, 0));
    });
    let e = idx.adapter.erase_batch(&scope, &inv.locators).unwrap_err();
    assert!(matches!(e, AdapterError::Unavailable { .. }) && e.to_string().contains("version conflicts"), "{e}");
    assert_clean(&e);
    assert_eq!(
        idx.double.with(|s| s.docs.keys().filter(|k| k.starts_with("doc-00-")).count()),
        1,
        "conflicts=proceed: the other three went"
    );
    assert_eq!(idx.adapter.erase_batch(&scope, &inv.locators).unwrap(), 1);
    assert_eq!(idx.adapter.verify(&scope, &inv.locators).unwrap(), 0);
}

/// A batch naming another owner's document (a tampered journal, or a document re-tagged since
/// the freeze) deletes nothing; `max_docs` bounds the task to the batch in any case.
#[test]
fn anomaly_guard_refuses_a_batch_that_names_another_owners_document() {
    let idx = Idx::new(seed(3), "");
    let scope = subject("acme", "alice");
    let mut inv = idx.adapter.inventory(&scope).unwrap();
    inv.locators.push((hex_locator("d:", id(1, 0).as_bytes()), 1));
    let before = idx.snapshot();
    let e = idx.adapter.erase_batch(&scope, &inv.locators).unwrap_err();
    assert!(matches!(e, AdapterError::AnomalousVolume { expected: 3, found: 4, .. }), "{e}");
    assert_clean(&e);
    assert_eq!(idx.snapshot(), before);
    assert!(idx.double.with(|s| s.seen.iter().all(|r| !r.contains("_delete_by_query"))));
    for bad in ["k:00", "d:zz", "d:"] {
        let e = idx.adapter.erase_batch(&scope, &[(bad.to_string(), 1)]).unwrap_err();
        assert!(matches!(e, AdapterError::Failed { .. }), "{bad}: {e}");
    }
    // A frozen id re-tagged to someone else is residue for verify, not a zero.
    let k = id(0, 0);
    idx.double.with(|s| {
        let mut d = s.docs[&k].source.clone();
        d.insert("user_id".into(), json!("mallory"));
        s.put(&k, d);
    });
    assert_eq!(idx.adapter.verify(&scope, &inv.locators[..3]).unwrap(), 3);
}

/// A `term` on a `text` field matches an analysed word, so `alice` would match `Alice Smith`:
/// the probe refuses such a mapping, and an inventory that meets such a hit fails instead of
/// counting a neighbour's document.
#[test]
fn an_owner_field_that_is_not_a_keyword_is_refused() {
    let mut docs = seed(1);
    docs.push(("smith".into(), doc("acme", "Alice Smith", 1)));
    let idx = Idx::new(docs, "");
    idx.adapter.probe().unwrap();
    idx.double.with(|s| {
        s.types.insert("user_id".into(), "text".into());
    });
    let e = idx.adapter.probe().unwrap_err();
    assert!(matches!(e, AdapterError::Failed { .. }) && e.to_string().contains("keyword"), "{e}");
    let e = idx.adapter.inventory(&subject("acme", "alice")).unwrap_err();
    assert!(matches!(e, AdapterError::Failed { .. }), "{e}");
    idx.double.with(|s| {
        s.types.insert("user_id".into(), "keyword".into());
    });
    let a = &idx.adapter;
    let before = idx.snapshot();
    let scope = subject("acme", "alice");
    let inv = a.inventory(&scope).unwrap();
    assert_eq!(inv.count, 1, "as a keyword, the neighbour is not matched");
    assert_eq!(a.erase_batch(&scope, &inv.locators).unwrap(), 1);
    assert_eq!(idx.snapshot().len(), before.len() - 1);
}

/// 429 is retried after its `Retry-After` (and with backoff without one), never counted as
/// done; one longer than `retry_after_max_ms` leaves the call unavailable with nothing deleted.
#[test]
fn rate_limits_are_retried_honouring_retry_after() {
    let idx = Idx::new(seed(2), "");
    let scope = subject("acme", "alice");
    let inv = idx.adapter.inventory(&scope).unwrap();
    idx.double.with(|s| s.faults.extend([Fault::TooMany(Some(1)), Fault::TooMany(None)]));
    let started = Instant::now();
    assert_eq!(idx.adapter.erase_batch(&scope, &inv.locators).unwrap(), 2);
    assert!(started.elapsed() >= Duration::from_secs(1), "waited out Retry-After");

    let bob = subject("acme", "bob");
    let inv = idx.adapter.inventory(&bob).unwrap();
    let impatient = target(&idx.double.url(), "retry_after_max_ms = 500");
    let before = idx.snapshot();
    idx.double.with(|s| s.faults.push_back(Fault::TooMany(Some(120))));
    let e = impatient.erase_batch(&bob, &inv.locators).unwrap_err();
    assert!(matches!(e, AdapterError::Unavailable { .. }) && e.to_string().contains("Retry-After"), "{e}");
    assert_clean(&e);
    assert_eq!(idx.snapshot(), before, "nothing counted, nothing deleted");
    idx.double.with(|s| s.faults.extend([Fault::Status(503); 3]));
    assert!(matches!(idx.adapter.inventory(&bob).unwrap_err(), AdapterError::Unavailable { .. }));
    assert_eq!(idx.adapter.inventory(&bob).unwrap().count, 2, "the next call goes through");
}

/// An unreachable cluster is unavailable (the job BLOCKED naming the target); once it is back,
/// the same calls finish.
#[test]
fn an_unreachable_cluster_is_unavailable_and_a_rerun_finishes() {
    let a = target("http://127.0.0.1:9", "retries = 0\ntimeout_ms = 2000");
    let scope = subject("acme", "alice");
    for e in [
        a.probe().unwrap_err(),
        a.inventory(&scope).unwrap_err(),
        a.erase_batch(&scope, &[(hex_locator("d:", b"doc-1"), 1)]).unwrap_err(),
        a.verify(&scope, &[]).unwrap_err(),
    ] {
        assert!(matches!(e, AdapterError::Unavailable { .. }) && e.is_retryable(), "{e}");
        assert!(e.to_string().contains("target search"), "{e}");
        assert_clean(&e);
    }
    let idx = Idx::new(seed(1), "");
    let inv = idx.adapter.inventory(&scope).unwrap();
    idx.double.with(|s| s.faults.extend([Fault::Drop; 3]));
    assert!(matches!(idx.adapter.erase_batch(&scope, &inv.locators).unwrap_err(), AdapterError::Unavailable { .. }));
    assert_eq!(idx.adapter.erase_batch(&scope, &inv.locators).unwrap(), 1);
    assert_eq!(idx.adapter.verify(&scope, &inv.locators).unwrap(), 0);
}

/// Wrong credentials: failed, not retried, never shown.
#[test]
fn credentials_are_checked_and_never_shown() {
    let idx = Idx::new(seed(1), "");
    let dir = tempfile::tempdir().unwrap();
    let f = dir.path().join("pw");
    {
        use std::os::unix::fs::PermissionsExt;
        std::fs::write(&f, "wrong-S3CRET").unwrap();
        std::fs::set_permissions(&f, std::fs::Permissions::from_mode(0o600)).unwrap();
    }
    let text = format!(
        "url = \"{}\"\nindex = \"{INDEX}\"\nusername = \"{USER}\"\npassword_file = \"{}\"\nfields = {{ tenant = \"tenant_id\", subject = \"user_id\" }}\n",
        idx.double.url(),
        f.display()
    );
    let wrong = Config::parse(toml::from_str(&text).unwrap(), Path::new(".")).unwrap().build("search");
    let e = wrong.probe().unwrap_err();
    assert!(matches!(e, AdapterError::Failed { .. }) && e.to_string().contains("credentials"), "{e}");
    assert!(!e.to_string().contains("S3CRET") && !format!("{wrong:?}").contains("S3CRET"));
    assert_eq!(idx.double.with(|s| s.bad_auth), 1);
}

/// `max_in_flight` bounds the target's requests at once, across threads (several jobs on one
/// target); a higher bound lets more through, so the bound is what held them.
#[test]
fn max_in_flight_bounds_concurrent_requests() {
    let idx = Idx::new(seed(2), "");
    let peak = |extra: &str| {
        let a = target(&idx.double.url(), extra);
        idx.double.server.hold(60);
        std::thread::scope(|s| {
            for _ in 0..6 {
                s.spawn(|| a.inventory(&subject("acme", "bob")).unwrap());
            }
        });
        let peak = idx.double.server.peak();
        idx.double.server.hold(0);
        peak
    };
    assert_eq!(peak("max_in_flight = 2"), 2);
    assert!(peak("max_in_flight = 6") > 2);
}

#[test]
fn describe_place_and_registry() {
    let idx = Idx::new(seed(1), "");
    assert_eq!(idx.adapter.describe().kind, crate::Kind::Opensearch);
    assert!(idx.adapter.place().contains(INDEX) && !idx.adapter.place().contains("127.0.0.1"));
    let dir = tempfile::tempdir().unwrap();
    let pw = secret(dir.path());
    for (class, ok) in [("keyword-index", true), ("vector-index", true), ("trace", false)] {
        let text = format!(
            "name = \"kb\"\nkind = \"opensearch\"\nclass = \"{class}\"\nurl = \"{}\"\nindex = \"{INDEX}\"\nusername = \"{USER}\"\npassword_file = \"{}\"\nfields = {{ tenant = \"tenant_id\", subject = \"user_id\" }}\n",
            idx.double.url(),
            pw.display()
        );
        let t = crate::build(1, toml::from_str(&text).unwrap(), Path::new("."));
        assert_eq!(t.is_ok(), ok, "{class}");
        if let Ok(t) = t {
            assert_eq!(t.adapter.inventory(&subject("acme", "alice")).unwrap().count, 1);
        }
    }
}

/// Recall after erasure: a k-NN search with the erased subject's own embeddings brings back none
/// of its documents; another subject's nearest neighbours (those that were not the erased
/// subject's) are unchanged, in order.
#[test]
fn recall_after_erasure_finds_none_of_the_subjects_documents() {
    let idx = Idx::new(seed(4), "");
    let knn = |v: &Value| -> Vec<String> {
        let agent: ureq::Agent = ureq::Agent::config_builder().http_status_as_error(false).build().into();
        let body: Value = agent
            .post(format!("{}/{INDEX}/_search", idx.double.url()))
            .header("authorization", format!("Basic {}", super::config::tests_base64(&format!("{USER}:{PASSWORD}"))))
            .content_type("application/json")
            .send(json!({ "query": { "knn": { "embedding": { "vector": v, "k": 6 } } } }).to_string())
            .unwrap()
            .body_mut()
            .read_to_string()
            .map(|b| serde_json::from_str(&b).unwrap())
            .unwrap();
        body["hits"]["hits"].as_array().unwrap().iter().map(|h| h["_id"].as_str().unwrap().to_string()).collect()
    };
    let emb = |i: &str| idx.double.with(|s| s.docs[i].source["embedding"].clone());
    let alice: Vec<String> = (0..4).map(|k| id(0, k)).collect();
    let bob: Vec<String> = (0..4).map(|k| id(10, k)).collect();
    for a in &alice {
        assert_eq!(&knn(&emb(a))[0], a, "before: a document's embedding finds it first");
    }
    let (alice_vecs, bob_vecs): (Vec<Value>, Vec<Value>) = (alice.iter().map(|i| emb(i)).collect(), bob.iter().map(|i| emb(i)).collect());
    let bob_before: Vec<Vec<String>> = bob_vecs
        .iter()
        .map(|v| knn(v).into_iter().filter(|i| !alice.contains(i)).take(3).collect())
        .collect();
    let scope = subject("acme", "alice");
    let inv = idx.adapter.inventory(&scope).unwrap();
    assert_eq!(idx.adapter.erase_batch(&scope, &inv.locators).unwrap(), 4);
    for v in &alice_vecs {
        let got = knn(v);
        assert!(got.iter().all(|i| !alice.contains(i)), "an erased document came back: {got:?}");
    }
    let bob_after: Vec<Vec<String>> = bob_vecs.iter().map(|v| knn(v).into_iter().take(3).collect()).collect();
    assert_eq!(bob_after, bob_before, "another subject's nearest neighbours are unchanged");
}
