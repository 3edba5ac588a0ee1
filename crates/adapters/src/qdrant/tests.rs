//! The `qdrant` target against its contract double (`tests/double.rs`), never a live server
//! (Qdrant ships no binary any registry reachable here serves). Every test that erases checks
//! that every point it did not mean to erase kept its payload and vector byte for byte, and each
//! documented rule the adapter depends on has a test here that fails when the adapter ignores
//! it.

mod double;

use std::path::Path;
use std::time::{Duration, Instant};

use lethe_core::{MemoryId, Scope, Subject, Tenant};
use serde_json::{json, Map, Value};

use super::adapter::PointId;
use super::{Config, Qdrant};
use crate::conformance::{self, Case, Row};
use crate::redis::adapter::hex_locator;
use crate::{Adapter, AdapterError};
use double::{Double, Fault, Point, COLLECTION, KEY};

const OWNERS: &[(&str, &str)] = &[
    ("acme", "alice"),
    ("acme", "Alice"),
    ("acme", "alice2"),
    ("acme", "alic"),
    ("other", "alice"),
    ("acme", "{\"$ne\": \"\"}"),
    ("acme", "{\"match\": {\"any\": [\"bob\"]}}"),
    ("acme", "o'brien \"q\" \\ *"),
    ("acme", "zoë 名前"),
    ("acme", "bob"),
    ("acme2", "bob"),
];

/// Even points have integer ids, odd ones UUIDs.
fn pid(o: usize, k: usize) -> PointId {
    if k.is_multiple_of(2) {
        PointId::Num((o * 1_000 + k) as u64)
    } else {
        PointId::Uuid(format!("{o:08x}-0000-4000-8000-{k:012x}"))
    }
}

fn point(tenant: &str, subject: &str, n: usize) -> Point {
    let payload: Map<String, Value> = serde_json::from_value(json!({
        "tenant_id": tenant,
        "user_id": subject,
        "text": format!("{subject} of {tenant} said secret number {n}"),
    }))
    .unwrap();
    // Each owner's points lie around its own direction, so a subject's nearest neighbours are
    // its own points first.
    let (o, k) = ((n / 1_000) as f64, (n % 1_000) as f64);
    Point { payload, vector: vec![o.cos(), o.sin(), 0.05 * k] }
}

fn seed(per_owner: usize) -> Vec<(PointId, Point)> {
    let mut out = Vec::new();
    for (o, (t, s)) in OWNERS.iter().enumerate() {
        for k in 0..per_owner {
            out.push((pid(o, k), point(t, s, o * 1_000 + k)));
        }
    }
    out
}

fn target(url: &str, extra: &str) -> Qdrant {
    use std::os::unix::fs::PermissionsExt;
    let dir = tempfile::tempdir().unwrap();
    let f = dir.path().join("key");
    std::fs::write(&f, format!("{KEY}\n")).unwrap();
    std::fs::set_permissions(&f, std::fs::Permissions::from_mode(0o600)).unwrap();
    let mut text = format!(
        "url = \"{url}\"\ncollection = \"{COLLECTION}\"\napi_key_file = \"{}\"\npayload = {{ tenant = \"tenant_id\", subject = \"user_id\" }}\n{extra}\n",
        f.display()
    );
    if !extra.contains("retries") {
        text.push_str("retries = 2\n");
    }
    Config::parse(toml::from_str(&text).unwrap(), Path::new(".")).unwrap().build("vectors")
}

struct Coll {
    double: Double,
    adapter: Qdrant,
}

impl Coll {
    fn new(points: Vec<(PointId, Point)>, extra: &str) -> Self {
        let double = Double::start(points);
        let adapter = target(&double.url(), extra);
        Coll { double, adapter }
    }
}

impl Case for Coll {
    fn adapter(&self) -> &dyn Adapter {
        &self.adapter
    }

    fn snapshot(&self) -> Vec<Row> {
        self.double.with(|s| {
            s.points
                .iter()
                .map(|(id, p)| Row {
                    table: COLLECTION.into(),
                    bytes: serde_json::to_vec(&json!({ "id": format!("{id:?}"), "payload": p.payload, "vector": p.vector })).unwrap(),
                    owner: (
                        p.payload["tenant_id"].as_str().unwrap_or("").to_string(),
                        p.payload["user_id"].as_str().unwrap_or("").to_string(),
                    ),
                })
                .collect()
        })
    }
}

fn subject(t: &str, s: &str) -> Scope {
    Scope::Subject { tenant: Tenant::new(t).unwrap(), subject: Subject::new(s).unwrap() }
}

fn memory(t: &str, s: &str, m: &str) -> Scope {
    Scope::Memory {
        tenant: Tenant::new(t).unwrap(),
        subject: Subject::new(s).unwrap(),
        memory: MemoryId::new(m).unwrap(),
        version: None,
    }
}

fn assert_clean(e: &AdapterError) {
    let shown = e.to_string();
    for secret in [KEY, "alice", "secret number", "rate limit exceeded"] {
        assert!(!shown.contains(secret), "{secret} in {shown}");
    }
}

/// The shared suite for every seeded subject: exactly its points go (integer and UUID ids),
/// every other point keeps payload and vector byte for byte.
#[test]
fn conformance_every_subject_with_neighbours_and_operator_lookalikes() {
    for (t, s) in OWNERS {
        let c = Coll::new(seed(5), "batch_size = 2");
        let me = (t.to_string(), s.to_string());
        let out = conformance::run(&c, &subject(t, s), &|o| *o == me, 2);
        assert_eq!((out.inventoried, out.erased, out.erased_again, out.residue), (5, 5, 0, 0), "{t}/{s}");
        c.double.with(|st| {
            assert_eq!(st.bad_auth, 0);
            let deletes: Vec<&String> = st.seen.iter().filter(|r| r.contains("points/delete")).collect();
            assert!(!deletes.is_empty() && deletes.iter().all(|r| r.contains("wait=true")), "{deletes:?}");
        });
    }
}

#[test]
fn conformance_tenant_scope() {
    let c = Coll::new(seed(3), "");
    let scope = Scope::Tenant { tenant: Tenant::new("acme").unwrap() };
    let out = conformance::run(&c, &scope, &|o| o.0 == "acme", 4);
    let acme = OWNERS.iter().filter(|(t, _)| *t == "acme").count() as u64;
    assert_eq!((out.erased, out.residue), (3 * acme, 0));
}

/// The filter is `match: {value}` of JSON strings; an identifier shaped like a Qdrant condition
/// or a Mongo operator is one value.
#[test]
fn the_filter_is_built_from_json_strings() {
    let c = Coll::new(seed(1), "");
    let f = c.adapter.filter(&subject("acme", "{\"$ne\": \"\"}"), None);
    assert_eq!(f, json!({ "must": [
        { "key": "tenant_id", "match": { "value": "acme" } },
        { "key": "user_id", "match": { "value": "{\"$ne\": \"\"}" } },
    ] }));
    for who in ["ALICE", "alice ", "ali"] {
        assert_eq!(c.adapter.inventory(&subject("acme", who)).unwrap().count, 0, "{who:?}");
    }
}

/// A memory is a point id under the subject's payload. Non-canonical ids are refused (Qdrant
/// would read the upper-case UUID as the lower-case point, and `0042` as 42), another subject's
/// point under Alice's scope is not hers.
#[test]
fn memory_scope_by_point_id() {
    let c = Coll::new(seed(4), "");
    let a = &c.adapter;
    let before = c.snapshot();
    let PointId::Uuid(u) = pid(0, 1) else { unreachable!() };
    let scope = memory("acme", "alice", &u);
    let inv = a.inventory(&scope).unwrap();
    assert_eq!(inv.count, 1);
    assert_eq!(a.erase_batch(&scope, &inv.locators).unwrap(), 1);
    assert_eq!(a.verify(&scope, &inv.locators).unwrap(), 0);
    assert_eq!(a.erase_batch(&scope, &inv.locators).unwrap(), 0);
    assert_eq!(c.snapshot().len(), before.len() - 1);
    let n = memory("acme", "alice", "2");
    assert_eq!(a.inventory(&n).unwrap().count, 1);
    for bad in ["0000000A-0000-4000-8000-00000000000B".to_string(), format!("{{{u}}}"), "02".into(), "m-1".into(), "-1".into()] {
        let e = a.check_scope(&memory("acme", "alice", &bad)).unwrap_err();
        assert!(matches!(e, AdapterError::Inexpressible { .. }), "{bad}: {e}");
        assert!(a.inventory(&memory("acme", "alice", &bad)).is_err());
    }
    // Bob's point id under Alice's scope.
    assert_eq!(a.inventory(&memory("acme", "alice", "9000")).unwrap().count, 0);
}

/// A scroll page holds 10 points unless asked for more: the inventory follows
/// `next_page_offset` to the end (2,500 points for one subject, pages of 1,000).
#[test]
fn the_scroll_is_followed_to_the_end() {
    let mut points = seed(1);
    for k in 0..2_500 {
        points.push((PointId::Num(1_000_000 + k), point("acme", "alice", k as usize)));
    }
    let c = Coll::new(points, "");
    let me = ("acme".to_string(), "alice".to_string());
    let out = conformance::run(&c, &subject("acme", "alice"), &|o| *o == me, 1_000);
    assert_eq!((out.inventoried, out.erased, out.residue), (2_501, 2_501, 0));
    assert!(c.double.with(|s| s.seen.iter().filter(|r| r.contains("points/scroll")).count()) >= 3);
}

/// Without `wait=true`, Qdrant answers `acknowledged` and applies the delete later; without
/// `exact: true`, a count is an estimate that still counts deleted points. The double does
/// both, and the adapter's counts are right only because it asks for both.
#[test]
fn deletes_wait_and_counts_are_exact() {
    let c = Coll::new(seed(3), "");
    let scope = subject("acme", "alice");
    let inv = c.adapter.inventory(&scope).unwrap();
    assert_eq!(c.adapter.erase_batch(&scope, &inv.locators).unwrap(), 3);
    assert_eq!(c.adapter.verify(&scope, &inv.locators).unwrap(), 0);
    // The double's estimate is not the count: it still counts the deleted points.
    let url = format!("{}/collections/{COLLECTION}/points/count", c.double.url());
    let agent: ureq::Agent = ureq::Agent::config_builder().http_status_as_error(false).build().into();
    let est: Value = agent
        .post(&url)
        .header("api-key", KEY)
        .content_type("application/json")
        .send(json!({ "filter": c.adapter.filter(&scope, None) }).to_string())
        .unwrap()
        .body_mut()
        .read_to_string()
        .map(|b| serde_json::from_str(&b).unwrap())
        .unwrap();
    assert_eq!(est["result"]["count"], json!(3), "an estimate counts deleted points");
    // An acknowledged delete is not applied yet when its answer comes.
    let (status, _) = c.double.with(|s| (s.apply_after, ()));
    assert_eq!(status, 3);
    let bob = subject("acme", "bob");
    let v: Value = agent
        .post(format!("{}/collections/{COLLECTION}/points/delete", c.double.url()))
        .header("api-key", KEY)
        .content_type("application/json")
        .send(json!({ "filter": c.adapter.filter(&bob, None) }).to_string())
        .unwrap()
        .body_mut()
        .read_to_string()
        .map(|b| serde_json::from_str(&b).unwrap())
        .unwrap();
    assert_eq!(v["result"]["status"], json!("acknowledged"));
    assert_eq!(c.adapter.inventory(&bob).unwrap().count, 3, "not applied yet");
}

/// A point holding a list under the subject key matches `match: {value}` for each member: whose
/// it is cannot be told, so the inventory fails rather than erase a shared point or skip it.
#[test]
fn a_point_holding_a_list_of_subjects_is_not_guessed() {
    let mut points = seed(1);
    let mut shared = point("acme", "alice", 1);
    shared.payload.insert("user_id".into(), json!(["alice", "bob"]));
    points.push((PointId::Num(777_777), shared));
    let c = Coll::new(points, "");
    let e = c.adapter.inventory(&subject("acme", "bob")).unwrap_err();
    assert!(matches!(e, AdapterError::Failed { .. }) && e.to_string().contains("list"), "{e}");
    assert_clean(&e);
}

#[test]
fn anomaly_guard_refuses_a_batch_that_names_another_owners_point() {
    let c = Coll::new(seed(3), "");
    let scope = subject("acme", "alice");
    let mut inv = c.adapter.inventory(&scope).unwrap();
    inv.locators.push((hex_locator("p:", b"9000"), 1));
    let before = c.snapshot();
    let e = c.adapter.erase_batch(&scope, &inv.locators).unwrap_err();
    assert!(matches!(e, AdapterError::AnomalousVolume { expected: 3, found: 4, .. }), "{e}");
    assert_eq!(c.snapshot(), before);
    assert!(c.double.with(|s| s.seen.iter().all(|r| !r.contains("points/delete"))));
    for bad in ["d:00", "p:zz", &hex_locator("p:", b"0042")] {
        let e = c.adapter.erase_batch(&scope, &[(bad.to_string(), 1)]).unwrap_err();
        assert!(matches!(e, AdapterError::Failed { .. }), "{bad}: {e}");
    }
    // A frozen point re-tagged to someone else since the freeze is residue.
    c.double.with(|s| {
        s.points.get_mut(&pid(0, 0)).unwrap().payload.insert("user_id".into(), json!("mallory"));
    });
    assert_eq!(c.adapter.verify(&scope, &inv.locators[..3]).unwrap(), 3);
}

#[test]
fn rate_limits_are_retried_honouring_retry_after() {
    let c = Coll::new(seed(2), "");
    let scope = subject("acme", "alice");
    let inv = c.adapter.inventory(&scope).unwrap();
    c.double.with(|s| s.faults.extend([Fault::TooMany(Some(1)), Fault::TooMany(None)]));
    let started = Instant::now();
    assert_eq!(c.adapter.erase_batch(&scope, &inv.locators).unwrap(), 2);
    assert!(started.elapsed() >= Duration::from_secs(1));
    let bob = subject("acme", "bob");
    let inv = c.adapter.inventory(&bob).unwrap();
    let before = c.snapshot();
    let impatient = target(&c.double.url(), "retry_after_max_ms = 100");
    c.double.with(|s| s.faults.push_back(Fault::TooMany(Some(60))));
    let e = impatient.erase_batch(&bob, &inv.locators).unwrap_err();
    assert!(matches!(e, AdapterError::Unavailable { .. }) && e.to_string().contains("Retry-After"), "{e}");
    assert_clean(&e);
    assert_eq!(c.snapshot(), before, "never counted as done: nothing deleted");
    c.double.with(|s| s.faults.extend([Fault::Status(502); 3]));
    assert!(matches!(c.adapter.inventory(&bob).unwrap_err(), AdapterError::Unavailable { .. }));
    assert_eq!(c.adapter.erase_batch(&bob, &inv.locators).unwrap(), 2);
}

#[test]
fn an_unreachable_server_is_unavailable_and_a_rerun_finishes() {
    let a = target("http://127.0.0.1:9", "retries = 0\ntimeout_ms = 2000");
    let scope = subject("acme", "alice");
    for e in [
        a.probe().unwrap_err(),
        a.inventory(&scope).unwrap_err(),
        a.erase_batch(&scope, &[(hex_locator("p:", b"1"), 1)]).unwrap_err(),
        a.verify(&scope, &[]).unwrap_err(),
    ] {
        assert!(matches!(e, AdapterError::Unavailable { .. }) && e.to_string().contains("target vectors"), "{e}");
        assert_clean(&e);
    }
    let c = Coll::new(seed(2), "");
    let inv = c.adapter.inventory(&scope).unwrap();
    c.double.with(|s| s.faults.extend([Fault::Drop; 3]));
    assert!(c.adapter.erase_batch(&scope, &inv.locators).is_err());
    assert_eq!(c.adapter.erase_batch(&scope, &inv.locators).unwrap(), 2);
    assert_eq!(c.adapter.verify(&scope, &inv.locators).unwrap(), 0);
}

#[test]
fn max_in_flight_bounds_concurrent_requests() {
    let c = Coll::new(seed(2), "");
    let peak = |extra: &str| {
        let a = target(&c.double.url(), extra);
        c.double.server.hold(60);
        std::thread::scope(|s| {
            for _ in 0..6 {
                s.spawn(|| a.inventory(&subject("acme", "bob")).unwrap());
            }
        });
        let p = c.double.server.peak();
        c.double.server.hold(0);
        p
    };
    assert_eq!(peak("max_in_flight = 1"), 1);
    assert!(peak("max_in_flight = 6") > 1);
}

#[test]
fn probe_key_and_registry() {
    let c = Coll::new(seed(1), "");
    c.adapter.probe().unwrap();
    assert_eq!(c.adapter.describe().kind, crate::Kind::Qdrant);
    let wrong = {
        let dir = tempfile::tempdir().unwrap();
        let f = dir.path().join("k");
        use std::os::unix::fs::PermissionsExt;
        std::fs::write(&f, "wrong-S3CRET").unwrap();
        std::fs::set_permissions(&f, std::fs::Permissions::from_mode(0o600)).unwrap();
        let text = format!(
            "url = \"{}\"\ncollection = \"{COLLECTION}\"\napi_key_file = \"{}\"\npayload = {{ tenant = \"tenant_id\", subject = \"user_id\" }}\n",
            c.double.url(),
            f.display()
        );
        Config::parse(toml::from_str(&text).unwrap(), Path::new(".")).unwrap().build("vectors")
    };
    let e = wrong.probe().unwrap_err();
    assert!(matches!(e, AdapterError::Failed { .. }) && e.to_string().contains("api key"), "{e}");
    assert!(!e.to_string().contains("S3CRET"));
    let other = {
        let text = format!(
            "url = \"{}\"\ncollection = \"nope\"\npayload = {{ tenant = \"tenant_id\", subject = \"user_id\" }}\n",
            c.double.url()
        );
        Config::parse(toml::from_str(&text).unwrap(), Path::new(".")).unwrap().build("vectors")
    };
    assert!(other.probe().is_err());
    let text = format!(
        "name = \"v\"\nkind = \"qdrant\"\nclass = \"vector-index\"\nurl = \"{}\"\ncollection = \"{COLLECTION}\"\npayload = {{ tenant = \"tenant_id\", subject = \"user_id\" }}\n",
        c.double.url()
    );
    assert!(crate::build(1, toml::from_str(&text).unwrap(), Path::new(".")).is_ok());
    let text = text.replace("vector-index", "trace");
    assert!(crate::build(1, toml::from_str(&text).unwrap(), Path::new(".")).is_err());
}

/// Recall after erasure: the erased subject's own vectors, queried after the erase, bring back
/// none of its points; another subject's nearest neighbours (the ones that were not the erased
/// subject's) are unchanged, in order.
#[test]
fn recall_after_erasure_finds_none_of_the_subjects_points() {
    let c = Coll::new(seed(4), "");
    let search = |v: &[f64]| -> Vec<String> {
        let agent: ureq::Agent = ureq::Agent::config_builder().http_status_as_error(false).build().into();
        let body: Value = agent
            .post(format!("{}/collections/{COLLECTION}/points/search", c.double.url()))
            .header("api-key", KEY)
            .content_type("application/json")
            .send(json!({ "vector": v, "limit": 6 }).to_string())
            .unwrap()
            .body_mut()
            .read_to_string()
            .map(|b| serde_json::from_str(&b).unwrap())
            .unwrap();
        body["result"].as_array().unwrap().iter().map(|h| h["id"].to_string()).collect()
    };
    let id_text = |p: &PointId| match p {
        PointId::Num(n) => n.to_string(),
        PointId::Uuid(u) => format!("\"{u}\""),
    };
    let alice: Vec<String> = (0..4).map(|k| id_text(&pid(0, k))).collect();
    let alice_vectors: Vec<Vec<f64>> = c.double.with(|s| (0..4).map(|k| s.points[&pid(0, k)].vector.clone()).collect());
    let bob_vectors: Vec<Vec<f64>> = c.double.with(|s| (0..4).map(|k| s.points[&pid(9, k)].vector.clone()).collect());
    for v in &alice_vectors {
        assert!(alice.contains(&search(v)[0]), "before: a subject's vector finds its own point first");
    }
    let bob_before: Vec<Vec<String>> = bob_vectors
        .iter()
        .map(|v| search(v).into_iter().filter(|id| !alice.contains(id)).take(3).collect())
        .collect();
    let scope = subject("acme", "alice");
    let inv = c.adapter.inventory(&scope).unwrap();
    assert_eq!(c.adapter.erase_batch(&scope, &inv.locators).unwrap(), 4);
    for v in &alice_vectors {
        let got = search(v);
        assert!(got.iter().all(|id| !alice.contains(id)), "an erased point came back: {got:?}");
    }
    let bob_after: Vec<Vec<String>> = bob_vectors.iter().map(|v| search(v).into_iter().take(3).collect()).collect();
    assert_eq!(bob_after, bob_before, "another subject's nearest neighbours are unchanged");
}
