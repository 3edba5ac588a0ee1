//! The `azure-ai-search` target against its contract double (`tests/double.rs`), never a live
//! service. Every test that erases checks that every document it did not mean to erase kept
//! every field byte for byte, and each documented rule the adapter depends on has a test here
//! that fails when the adapter ignores it.

mod double;

use std::path::Path;
use std::time::Duration;

use lethe_core::{MemoryId, Scope, Subject, Tenant};
use serde_json::{json, Map, Value};

use crate::conformance::{self, Case, Row};
use crate::redis::adapter::{hex_locator, unhex};
use crate::{Adapter, AdapterError, Applicability};

use super::{AzureAiSearch, Config};
use double::{Double, Fault, API_VERSION, INDEX, KEY};

/// Neighbours of `alice` (another case, a longer and a shorter id, the same id under another
/// tenant) and identifiers that look like OData or break a naive literal.
const OWNERS: &[(&str, &str)] = &[
    ("acme", "alice"),
    ("acme", "Alice"),
    ("acme", "alice2"),
    ("acme", "alic"),
    ("other", "alice"),
    ("acme", "o'brien"),
    ("acme", "x' or true or 'a"),
    ("acme", "a' and user_id eq 'bob"),
    ("acme", "''"),
    ("acme", "'"),
    ("acme", "search.in(id, 'a', ',')"),
    ("acme", "zoë d'Arc \"q\" \\ %_* 名前"),
    ("acme", "bob"),
    ("acme2", "bob"),
    ("o'acme", "bob"),
];

/// A document key as the service allows them: letters, digits, `_`, `-`, `=`; upper and lower
/// case mixed, so that only `orderby` puts them in the key's order.
fn key(o: usize, k: usize) -> String {
    match k % 4 {
        0 => format!("Doc-{o:03}-{k:05}"),
        1 => format!("doc_{o:03}_{k:05}="),
        2 => format!("{k:05}-{o:03}"),
        _ => format!("Z{o}x{k}=="),
    }
}

/// One seeded document: every field an index of memories has, content and a vector included.
fn doc(id: &str, tenant: &str, subject: &str, memory: &str, n: usize) -> Map<String, Value> {
    serde_json::from_value(json!({
        "id": id,
        "tenant_id": tenant,
        "user_id": subject,
        "mem_id": memory,
        "content": format!("{subject} of {tenant} said secret number {n}"),
        "embedding": [n as f64 * 0.5, -1.25, 3.0],
        "secret_note": format!("note {n}"),
    }))
    .unwrap()
}

fn seed(per_owner: usize) -> Vec<Map<String, Value>> {
    let mut docs = Vec::new();
    for (o, (t, s)) in OWNERS.iter().enumerate() {
        for k in 0..per_owner {
            docs.push(doc(&key(o, k), t, s, &format!("m{k}"), o * 100_000 + k));
        }
    }
    docs
}

fn key_file() -> (tempfile::TempDir, std::path::PathBuf) {
    use std::os::unix::fs::PermissionsExt;
    let dir = tempfile::tempdir().unwrap();
    let f = dir.path().join("api-key");
    std::fs::write(&f, format!("{KEY}\n")).unwrap();
    std::fs::set_permissions(&f, std::fs::Permissions::from_mode(0o600)).unwrap();
    (dir, f)
}

/// A target on `url`, with the test's short consistency bounds unless `extra` sets them.
fn target(url: &str, extra: &str) -> AzureAiSearch {
    let (_dir, key) = key_file();
    let mut text = format!(
        "endpoint = \"{url}\"\nindex = \"{INDEX}\"\napi_key_file = \"{}\"\nfields = {{ tenant = \"tenant_id\", subject = \"user_id\" }}\n{extra}\n",
        key.display()
    );
    for (k, v) in [("settle_ms", "30"), ("verify_timeout_ms", "5000"), ("retries", "2")] {
        if !extra.contains(k) {
            text.push_str(&format!("{k} = {v}\n"));
        }
    }
    Config::parse(toml::from_str(&text).unwrap(), Path::new("."))
        .unwrap()
        .build("search")
}

/// A seeded double and a target on it.
struct Idx {
    double: Double,
    adapter: AzureAiSearch,
}

impl Idx {
    fn new(docs: Vec<Map<String, Value>>, extra: &str) -> Self {
        let double = Double::start(docs);
        let adapter = target(&double.url(), extra);
        Idx { double, adapter }
    }

    fn target(&self, extra: &str) -> AzureAiSearch {
        target(&self.double.url(), extra)
    }

    /// Every document of the index (what the service holds, not what a lagging replica shows),
    /// every field.
    fn all(&self) -> Vec<(String, Vec<u8>)> {
        self.double.with(|s| {
            s.docs
                .iter()
                .map(|(k, d)| (k.clone(), serde_json::to_vec(d).unwrap()))
                .collect()
        })
    }
}

impl Case for Idx {
    fn adapter(&self) -> &dyn Adapter {
        &self.adapter
    }

    fn snapshot(&self) -> Vec<Row> {
        self.double.with(|s| {
            s.docs
                .values()
                .map(|d| Row {
                    table: INDEX.into(),
                    bytes: serde_json::to_vec(d).unwrap(),
                    owner: (
                        d["tenant_id"].as_str().unwrap().to_string(),
                        d["user_id"].as_str().unwrap().to_string(),
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

fn memory(t: &str, s: &str, m: &str) -> Scope {
    Scope::Memory {
        tenant: Tenant::new(t).unwrap(),
        subject: Subject::new(s).unwrap(),
        memory: MemoryId::new(m).unwrap(),
        version: None,
    }
}

fn keys(inv: &[(String, u64)]) -> Vec<String> {
    inv.iter()
        .map(|(l, n)| {
            assert_eq!(*n, 1);
            String::from_utf8(unhex(l.strip_prefix("k:").unwrap()).unwrap()).unwrap()
        })
        .collect()
}

/// No message names the api key, an identifier of the seeded subjects or a key.
fn assert_clean(e: &AdapterError) {
    let shown = e.to_string();
    for secret in [KEY, "alice", "brien", "Doc-", "doc_", "secret number"] {
        assert!(!shown.contains(secret), "{secret} in {shown}");
    }
}

/// The shared suite for every seeded subject, each in a fresh index whose deletes stay visible
/// for a few searches: exactly its documents go, every other document keeps every byte, verify
/// counts zero only once the index caught up, a second erase deletes nothing.
#[test]
fn conformance_every_subject_with_neighbours_and_odata_lookalikes() {
    for (t, s) in OWNERS {
        let idx = Idx::new(seed(5), "batch_size = 2");
        idx.double.with(|s| s.lag = 3);
        let me = (t.to_string(), s.to_string());
        let out = conformance::run(&idx, &subject(t, s), &|o| *o == me, 2);
        assert_eq!((out.inventoried, out.erased, out.erased_again, out.residue), (5, 5, 0, 0), "{t}/{s}");
        idx.double.with(|st| {
            assert!(st.caught_up(), "verify said zero before the index caught up");
            assert_eq!(st.bad_auth, 0, "every request carried the api key");
            assert!(st.seen.iter().all(|r| r.skip.is_none()), "never $skip");
        });
    }
}

#[test]
fn conformance_tenant_scope() {
    let idx = Idx::new(seed(3), "");
    idx.double.with(|s| s.lag = 2);
    let scope = Scope::Tenant {
        tenant: Tenant::new("acme").unwrap(),
    };
    let out = conformance::run(&idx, &scope, &|o| o.0 == "acme", 7);
    let acme = OWNERS.iter().filter(|(t, _)| *t == "acme").count() as u64;
    assert_eq!((out.erased, out.residue), (3 * acme, 0));
}

/// Inventory alone, read-only: each subject counts exactly its own documents, and the filter is
/// the doubled-quote literal form, never the identifier's text spliced in.
#[test]
fn neighbours_and_odata_lookalikes_never_match() {
    let idx = Idx::new(seed(3), "");
    let before = idx.all();
    for (o, (t, s)) in OWNERS.iter().enumerate() {
        let inv = idx.adapter.inventory(&subject(t, s)).unwrap();
        let mut got = keys(&inv.locators);
        got.sort();
        let mut want: Vec<String> = (0..3).map(|k| key(o, k)).collect();
        want.sort();
        assert_eq!(got, want, "{t}/{s}");
    }
    assert_eq!(
        idx.adapter.filter(&subject("acme", "x' or true or 'a")).unwrap(),
        "tenant_id eq 'acme' and user_id eq 'x'' or true or ''a'"
    );
    assert_eq!(
        idx.adapter.filter(&subject("o'acme", "o'brien")).unwrap(),
        "tenant_id eq 'o''acme' and user_id eq 'o''brien'"
    );
    for who in ["ALICE", "alice ", " alice", "x", "x' or true or 'a'", "a"] {
        assert_eq!(idx.adapter.inventory(&subject("acme", who)).unwrap().count, 0, "{who:?}");
    }
    assert_eq!(idx.adapter.inventory(&subject("ACME", "alice")).unwrap().count, 0);
    assert_eq!(idx.all(), before, "inventory is read-only");
}

/// A memory scope: by the `memory` field, only that document goes (the same memory id of a
/// neighbour stays); without `memory`, the target is exempt with a reason and refuses to run it.
#[test]
fn memory_scope_by_field_and_exempt_without() {
    let idx = Idx::new(seed(3), "");
    let by_field = idx.target("memory = \"mem_id\"");
    let scope = memory("acme", "alice", "m1");
    assert_eq!(by_field.check_scope(&scope).unwrap(), Applicability::Applies);
    let before = idx.snapshot();
    let inv = by_field.inventory(&scope).unwrap();
    assert_eq!(keys(&inv.locators), vec![key(0, 1)]);
    assert_eq!(by_field.erase_batch(&scope, &inv.locators).unwrap(), 1);
    assert_eq!(by_field.verify(&scope, &inv.locators).unwrap(), 0);
    assert_eq!(by_field.erase_batch(&scope, &inv.locators).unwrap(), 0, "idempotent");
    let gone = key(0, 1);
    conformance::assert_only_removed(&before, &idx.snapshot(), 1, &|r| {
        serde_json::from_slice::<Value>(&r.bytes).unwrap()["id"] == json!(gone)
    });
    // Another subject's memory id under Alice's scope is not hers.
    assert_eq!(by_field.inventory(&memory("acme", "alice", "m9")).unwrap().count, 0);

    match idx.adapter.check_scope(&scope).unwrap() {
        Applicability::Exempt(why) => assert!(why.contains("memory"), "{why}"),
        a => panic!("{a:?}"),
    }
    let e = idx.adapter.inventory(&scope).unwrap_err();
    assert!(matches!(e, AdapterError::Inexpressible { .. }), "{e}");
}

/// 2,500 documents for one subject: inventory pages of at most 1,000 by the key (`orderby` and
/// `gt`, never `skip`, and never trusting the default page of 50), erase in Index Documents
/// requests of at most 1,000 actions, every other subject's documents untouched.
#[test]
fn more_than_a_thousand_documents_page_by_key_and_delete_in_batches_of_a_thousand() {
    let mut docs = seed(2);
    for k in 0..2_500 {
        docs.push(doc(&key(0, 100 + k), "acme", "alice", "m", k));
    }
    let idx = Idx::new(docs, "");
    idx.double.with(|s| s.lag = 2);
    let me = ("acme".to_string(), "alice".to_string());
    let out = conformance::run(&idx, &subject("acme", "alice"), &|o| *o == me, 2_502);
    assert_eq!((out.inventoried, out.erased, out.residue), (2_502, 2_502, 0));
    idx.double.with(|s| {
        let index: Vec<usize> = s.seen.iter().filter(|r| r.op == "index").map(|r| r.actions).collect();
        assert_eq!(index, vec![1_000, 1_000, 502], "deletes in batches of at most 1,000");
        let pages: Vec<&double::Seen> = s
            .seen
            .iter()
            .filter(|r| r.filter.as_deref().is_some_and(|f| f.contains(" gt ")))
            .collect();
        assert!(pages.len() >= 2, "later pages filter by the key: {}", pages.len());
        assert!(s.seen.iter().all(|r| r.skip.is_none() && r.top.is_none_or(|t| t <= 1_000)));
    });
}

/// The service refuses `skip` above 100,000: an inventory of 100,100 documents for one subject
/// pages by the key and finds them all.
#[test]
fn skip_stops_at_100000_and_paging_by_key_does_not() {
    let idx = Idx::new(Vec::new(), "");
    let (status, _) = idx.double.post("search", &json!({ "skip": 100_001, "top": 10 }));
    assert_eq!(status, 400, "the double enforces the $skip limit");
    let (status, _) = idx.double.post("search", &json!({ "skip": 100_000, "top": 10 }));
    assert_eq!(status, 200);
    let docs: Vec<Map<String, Value>> = (0..100_100)
        .map(|k| doc(&format!("k{k:07}"), "acme", "alice", "m", k))
        .collect();
    let idx = Idx::new(docs, "");
    let inv = idx.adapter.inventory(&subject("acme", "alice")).unwrap();
    assert_eq!(inv.count, 100_100);
    idx.double.with(|s| {
        assert_eq!(s.seen.len(), 101);
        assert!(s.seen.iter().all(|r| r.skip.is_none()));
    });
}

/// What the double answers to an adapter that would ignore a rule: 1,001 actions are refused;
/// without `top` a page holds 50; without `orderby` the order is not the key's; a filter outside
/// the emitted subset is refused.
#[test]
fn the_double_enforces_the_documented_limits() {
    let idx = Idx::new(seed(80), "");
    let actions: Vec<Value> = (0..1_001)
        .map(|k| json!({ "@search.action": "delete", "id": format!("none{k}") }))
        .collect();
    assert_eq!(idx.double.post("index", &json!({ "value": actions })).0, 400);
    let (status, v) = idx.double.post("search", &json!({ "filter": "tenant_id eq 'acme'", "select": "id" }));
    assert_eq!(status, 200);
    assert_eq!(v["value"].as_array().unwrap().len(), 50, "the default page");
    assert!(v.get("@search.nextPageParameters").is_some());
    let ids: Vec<String> = v["value"].as_array().unwrap().iter().map(|d| d["id"].as_str().unwrap().to_string()).collect();
    let mut sorted = ids.clone();
    sorted.sort();
    assert_ne!(ids, sorted, "no orderby, no key order");
    for bad in [
        json!({ "filter": "user_id eq 'x' or true" }),
        json!({ "filter": "content eq 'x'" }),
        json!({ "orderby": "user_id asc" }),
        json!({ "orderby": "id desc" }),
        json!({ "select": "secret_note" }),
        json!({ "search": "alice" }),
        json!({ "queryType": "full" }),
    ] {
        assert_eq!(idx.double.post("search", &bad).0, 400, "{bad}");
    }
}

/// Eventual consistency with one lagging replica: the deletes stay visible for a number of
/// searches; verify polls until the count reaches zero. With a bound too short for the index to
/// catch up, verify reports what is left as residue, never zero.
#[test]
fn verify_polls_until_the_index_caught_up_and_reports_residue_at_the_bound() {
    let idx = Idx::new(seed(3), "");
    idx.double.with(|s| s.lag = 12);
    let scope = subject("acme", "alice");
    let inv = idx.adapter.inventory(&scope).unwrap();
    assert_eq!(idx.adapter.erase_batch(&scope, &inv.locators).unwrap(), 3);
    assert_eq!(idx.adapter.verify(&scope, &inv.locators).unwrap(), 0);
    assert!(idx.double.with(|s| s.caught_up()));

    let idx = Idx::new(seed(3), "");
    idx.double.with(|s| s.lag = 1_000_000);
    let slow = idx.target("settle_ms = 20\nverify_timeout_ms = 300");
    let inv = slow.inventory(&scope).unwrap();
    assert_eq!(slow.erase_batch(&scope, &inv.locators).unwrap(), 3);
    assert_eq!(slow.verify(&scope, &inv.locators).unwrap(), 3, "still visible at the bound: residue");
}

/// Two replicas, one current and one lagging, answering in turn (three searches each): right after the delete the
/// first count is zero while the other replica still shows the documents. Verify does not
/// believe that first zero: it returns zero only once every replica caught up.
#[test]
fn verify_never_declares_clean_on_the_first_zero_after_a_delete() {
    let idx = Idx::new(seed(3), "");
    idx.double.with(|s| {
        s.lag = 6;
        s.two_replicas = true;
    });
    let scope = subject("acme", "alice");
    let inv = idx.adapter.inventory(&scope).unwrap();
    assert_eq!(idx.adapter.erase_batch(&scope, &inv.locators).unwrap(), 3);
    // The trap itself: a single count now says zero (the current replica)...
    let filter = json!({ "filter": "tenant_id eq 'acme' and user_id eq 'alice'", "count": true, "top": 0 });
    let seen: Vec<u64> = (0..4)
        .map(|_| idx.double.post("search", &filter).1["@odata.count"].as_u64().unwrap())
        .collect();
    assert!(seen.contains(&0) && seen.contains(&3), "one replica is behind: {seen:?}");
    assert!(!idx.double.with(|s| s.caught_up()));
    // ...and verify waits until it holds.
    assert_eq!(idx.adapter.verify(&scope, &inv.locators).unwrap(), 0);
    assert!(idx.double.with(|s| s.caught_up()), "verify said zero while a replica still showed the documents");
}

/// A 207: each document's own status. A busy document (503) leaves the batch unavailable (the
/// others are deleted, and a resume finishes it, counting what it deletes then); a 400 is
/// failed; a key already gone (404) counts zero.
#[test]
fn a_207_is_read_per_document() {
    let idx = Idx::new(seed(4), "");
    let scope = subject("acme", "alice");
    let inv = idx.adapter.inventory(&scope).unwrap();
    let ks = keys(&inv.locators);
    idx.double.with(|s| {
        s.doc_faults.insert(ks[1].clone(), 503);
    });
    let e = idx.adapter.erase_batch(&scope, &inv.locators).unwrap_err();
    assert!(matches!(e, AdapterError::Unavailable { .. }) && e.to_string().contains("status 503"), "{e}");
    assert_clean(&e);
    assert_eq!(idx.double.with(|s| s.docs.keys().filter(|k| ks.contains(k)).count()), 1);
    assert_eq!(idx.adapter.erase_batch(&scope, &inv.locators).unwrap(), 1, "the resume deletes the rest");
    assert_eq!(idx.adapter.verify(&scope, &inv.locators).unwrap(), 0);

    let bob = subject("acme", "bob");
    let inv = idx.adapter.inventory(&bob).unwrap();
    let ks = keys(&inv.locators);
    idx.double.with(|s| {
        s.doc_faults.insert(ks[0].clone(), 400);
    });
    let e = idx.adapter.erase_batch(&bob, &inv.locators).unwrap_err();
    assert!(matches!(e, AdapterError::Failed { .. }) && !e.is_retryable(), "{e}");
    assert_clean(&e);

    // A key that goes between the read-back and the delete: the service says 404, counted 0.
    let other = subject("other", "alice");
    let inv = idx.adapter.inventory(&other).unwrap();
    let ks = keys(&inv.locators);
    idx.double.with(|s| {
        s.missing_status = Some(404);
        s.doc_faults.insert(ks[0].clone(), 404);
    });
    assert_eq!(idx.adapter.erase_batch(&other, &inv.locators).unwrap(), 3);
}

/// 429 and 503 are retried after their Retry-After, never counted as done; one longer than
/// `retry_after_max_ms` is unavailable; 5xx and dropped connections are retried with backoff a
/// few times, then unavailable.
#[test]
fn rate_limits_and_failures_are_retried_honouring_retry_after() {
    let idx = Idx::new(seed(2), "");
    let scope = subject("acme", "alice");
    idx.double.with(|s| s.faults.extend([Fault::TooMany(1), Fault::Drop]));
    let inv = idx.adapter.inventory(&scope).unwrap();
    assert_eq!(inv.count, 2);
    idx.double.with(|s| {
        s.faults.push_back(Fault::Busy(1));
        s.seen.clear();
    });
    let started = std::time::Instant::now();
    assert_eq!(idx.adapter.erase_batch(&scope, &inv.locators).unwrap(), 2);
    assert!(started.elapsed() >= Duration::from_secs(1), "waited out Retry-After");

    // A Retry-After beyond the bound: unavailable, nothing counted, nothing deleted.
    let bob = subject("acme", "bob");
    let inv = idx.adapter.inventory(&bob).unwrap();
    let impatient = idx.target("retry_after_max_ms = 500");
    let before = idx.all();
    idx.double.with(|s| s.faults.push_back(Fault::TooMany(120)));
    let e = impatient.erase_batch(&bob, &inv.locators).unwrap_err();
    assert!(matches!(e, AdapterError::Unavailable { .. }) && e.to_string().contains("Retry-After"), "{e}");
    assert_clean(&e);
    assert_eq!(idx.all(), before);

    // 500 on every attempt (retries = 2: three attempts), then unavailable.
    idx.double.with(|s| s.faults.extend([Fault::Status(500); 3]));
    let e = idx.adapter.inventory(&bob).unwrap_err();
    assert!(matches!(e, AdapterError::Unavailable { .. }) && e.to_string().contains("500"), "{e}");
    assert!(idx.double.with(|s| s.faults.is_empty()));
    assert_eq!(idx.adapter.inventory(&bob).unwrap().count, 2, "the next call goes through");
}

#[test]
fn an_unreachable_endpoint_is_unavailable() {
    let a = target("http://127.0.0.1:9", "retries = 0\ntimeout_ms = 2000");
    let scope = subject("acme", "alice");
    for e in [
        a.probe().unwrap_err(),
        a.inventory(&scope).unwrap_err(),
        a.erase_batch(&scope, &[(hex_locator("k:", b"Doc-1"), 1)]).unwrap_err(),
        a.verify(&scope, &[]).unwrap_err(),
    ] {
        assert!(matches!(e, AdapterError::Unavailable { .. }) && e.is_retryable(), "{e}");
        assert_clean(&e);
    }
}

/// A wrong api key is refused by the service (403): failed, not retried, the key never shown;
/// the right one is sent on every request, in the `api-key` header only.
#[test]
fn the_api_key_is_checked_and_never_shown() {
    let idx = Idx::new(seed(1), "");
    let wrong = {
        use std::os::unix::fs::PermissionsExt;
        let dir = tempfile::tempdir().unwrap();
        let f = dir.path().join("k");
        std::fs::write(&f, "wrong-key-S3CRET").unwrap();
        std::fs::set_permissions(&f, std::fs::Permissions::from_mode(0o600)).unwrap();
        let text = format!(
            "endpoint = \"{}\"\nindex = \"{INDEX}\"\napi_key_file = \"{}\"\nfields = {{ tenant = \"tenant_id\", subject = \"user_id\" }}\n",
            idx.double.url(),
            f.display()
        );
        Config::parse(toml::from_str(&text).unwrap(), Path::new(".")).unwrap().build("search")
    };
    let e = wrong.probe().unwrap_err();
    assert!(matches!(e, AdapterError::Failed { .. }) && e.to_string().contains("api key"), "{e}");
    assert!(!e.to_string().contains("S3CRET"), "{e}");
    assert!(!format!("{wrong:?}").contains("S3CRET"));
    assert_eq!(idx.double.with(|s| s.bad_auth), 1);
    idx.adapter.probe().unwrap();
    assert_eq!(idx.double.with(|s| s.bad_auth), 1);
}

/// Another subject's document smuggled into a batch (a tampered journal, or a document whose
/// owner fields changed since the freeze): refused before anything is deleted. A locator that
/// is not this kind's is refused too.
#[test]
fn anomaly_guard_refuses_a_batch_that_names_another_owners_document() {
    let idx = Idx::new(seed(3), "");
    let scope = subject("acme", "alice");
    let mut inv = idx.adapter.inventory(&scope).unwrap();
    inv.locators.push((hex_locator("k:", key(1, 0).as_bytes()), 1));
    let before = idx.all();
    let e = idx.adapter.erase_batch(&scope, &inv.locators).unwrap_err();
    assert!(matches!(e, AdapterError::AnomalousVolume { expected: 3, found: 4, .. }), "{e}");
    assert_clean(&e);
    assert_eq!(idx.all(), before, "nothing of the batch was deleted");
    assert_eq!(idx.double.with(|s| s.seen.iter().filter(|r| r.op == "index").count()), 0);
    for bad in ["d:00", "k:zz", &hex_locator("k:", b"a,b"), &hex_locator("k:", b"a'b")] {
        let e = idx.adapter.erase_batch(&scope, &[(bad.to_string(), 1)]).unwrap_err();
        assert!(matches!(e, AdapterError::Failed { .. }), "{bad}: {e}");
    }
    // A frozen key re-tagged to someone else since the freeze is residue for verify.
    let k = keys(&inv.locators)[0].clone();
    idx.double.with(|s| {
        s.docs.get_mut(&k).unwrap().insert("user_id".into(), json!("mallory"));
    });
    let inv = idx.adapter.inventory(&scope).unwrap();
    let mut frozen = inv.locators.clone();
    frozen.push((hex_locator("k:", k.as_bytes()), 1));
    assert_eq!(idx.adapter.erase_batch(&scope, &inv.locators).unwrap(), 2);
    let quick = idx.target("settle_ms = 10\nverify_timeout_ms = 300");
    assert_eq!(quick.verify(&scope, &frozen).unwrap(), 1);
}

#[test]
fn describe_probe_place_and_registry() {
    let idx = Idx::new(seed(1), "");
    let a = &idx.adapter;
    assert_eq!(a.describe().kind, crate::Kind::AzureAiSearch);
    assert_eq!(a.check_scope(&subject("acme", "x' or true or 'a")).unwrap(), Applicability::Applies);
    a.probe().unwrap();
    assert_eq!(a.batch_size(), Some(1000));
    assert!(a.place().contains(INDEX) && !a.place().contains("127.0.0.1"));
    // A field the index does not have, or one it cannot filter by: the probe says so.
    for extra in ["key_field = \"nope\"", "memory = \"content\""] {
        let e = idx.target(extra).probe().unwrap_err();
        assert!(matches!(e, AdapterError::Failed { .. }) && e.to_string().contains("HTTP 400"), "{extra}: {e}");
        assert!(!e.to_string().contains("could not find"), "the service's message is never shown: {e}");
    }
    let e = idx.target("api_version = \"2023-11-01\"").probe().unwrap_err();
    assert!(matches!(e, AdapterError::Failed { .. }), "{e}");
    assert_eq!(API_VERSION, super::config::DEFAULT_API_VERSION);
    // Through the registry, as lethe.toml names it.
    let (_d, key) = key_file();
    for (class, ok) in [("keyword-index", true), ("vector-index", true), ("cache", false)] {
        let text = format!(
            "name = \"episodes\"\nkind = \"azure-ai-search\"\nclass = \"{class}\"\nendpoint = \"{}\"\nindex = \"{INDEX}\"\napi_key_file = \"{}\"\nfields = {{ tenant = \"tenant_id\", subject = \"user_id\" }}\n",
            idx.double.url(),
            key.display()
        );
        let t = crate::build(1, toml::from_str(&text).unwrap(), Path::new("."));
        assert_eq!(t.is_ok(), ok, "{class}");
        if let Ok(t) = t {
            assert_eq!(t.adapter.inventory(&subject("acme", "alice")).unwrap().count, 1);
        }
    }
}
