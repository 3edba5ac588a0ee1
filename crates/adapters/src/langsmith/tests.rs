//! The `langsmith` target against its contract double (`double.rs`), never the live
//! service. Every test that erases checks that every run it did not mean to erase kept every
//! field byte for byte, and each documented rule the adapter depends on has a test here that
//! fails when the adapter ignores it.

use std::path::Path;
use std::time::{Duration, Instant};

use lethe_core::{MemoryId, Scope, Subject, Tenant};
use serde_json::{json, Map, Value};

use super::{Config, LangSmith};
use crate::conformance::{self, Case, Row};
use crate::{Adapter, AdapterError, Applicability};
use super::double::{Double, Fault, Run, KEY, PROJECT};

const OWNERS: &[(&str, &str)] = &[
    ("acme", "alice"),
    ("acme", "Alice"),
    ("acme", "alice2"),
    ("acme", "alic"),
    ("other", "alice"),
    ("acme", "{\"$ne\": \"\"}"),
    ("acme", "eq(metadata_value, \"x\")"),
    ("acme", "o'brien \"q\" \\"),
    ("acme", "zoë 名前"),
    ("acme", "bob"),
    ("acme2", "bob"),
];

fn uuid(o: usize, k: usize, j: usize) -> String {
    format!("{o:08x}-{k:04x}-4000-8000-{j:012x}")
}

fn meta(tenant: &str, subject: &str) -> Map<String, Value> {
    serde_json::from_value(json!({ "tenant_id": tenant, "user_id": subject, "thread_id": "t-1", "langgraph_step": 1 })).unwrap()
}

/// One trace: a root run with the run config's metadata, a child run with the same metadata
/// (LangGraph passes it down), and a child run with none (the trace is erased whole).
fn trace(o: usize, k: usize, tenant: &str, subject: &str) -> Vec<Run> {
    let t = uuid(o, k, 0);
    (0..3)
        .map(|j| Run {
            id: uuid(o, k, j),
            trace_id: t.clone(),
            metadata: if j < 2 { meta(tenant, subject) } else { Map::new() },
            inputs: json!({ "messages": [format!("{subject} says secret number {o}{k}{j}")] }),
            outputs: json!({ "answer": format!("noted for {subject}") }),
        })
        .collect()
}

fn seed(traces: usize) -> Vec<Run> {
    let mut out = Vec::new();
    for (o, (t, s)) in OWNERS.iter().enumerate() {
        for k in 0..traces {
            out.extend(trace(o, k, t, s));
        }
    }
    out
}

fn target(url: &str, extra: &str) -> LangSmith {
    use std::os::unix::fs::PermissionsExt;
    let dir = tempfile::tempdir().unwrap();
    let f = dir.path().join("key");
    std::fs::write(&f, format!("{KEY}\n")).unwrap();
    std::fs::set_permissions(&f, std::fs::Permissions::from_mode(0o600)).unwrap();
    let mut text = format!(
        "url = \"{url}\"\nproject_id = \"{PROJECT}\"\napi_key_file = \"{}\"\nmetadata = {{ tenant = \"tenant_id\", subject = \"user_id\" }}\n{extra}\n",
        f.display()
    );
    for (k, v) in [("retries", "2"), ("poll_ms", "10"), ("verify_timeout_ms", "5000")] {
        if !extra.contains(k) {
            text.push_str(&format!("{k} = {v}\n"));
        }
    }
    Config::parse(toml::from_str(&text).unwrap(), Path::new(".")).unwrap().build("traces")
}

struct Proj {
    double: Double,
    adapter: LangSmith,
}

impl Proj {
    fn new(runs: Vec<Run>, extra: &str) -> Self {
        let double = Double::start(runs);
        let adapter = target(&double.url(), extra);
        Proj { double, adapter }
    }
}

impl Case for Proj {
    fn adapter(&self) -> &dyn Adapter {
        &self.adapter
    }

    /// Every run the service keeps (accepted deletes taken as done: whether verify waited for
    /// them is checked apart), every field; its owner is its trace root's metadata.
    fn snapshot(&self) -> Vec<Row> {
        self.double.with(|s| {
            s.kept()
                .map(|r| {
                    let root = s.runs.iter().find(|x| x.id == r.trace_id).unwrap();
                    Row {
                        table: "runs".into(),
                        bytes: serde_json::to_vec(&json!([r.id, r.trace_id, r.metadata, r.inputs, r.outputs])).unwrap(),
                        owner: (
                            root.metadata["tenant_id"].as_str().unwrap().to_string(),
                            root.metadata["user_id"].as_str().unwrap().to_string(),
                        ),
                    }
                })
                .collect()
        })
    }
}

fn subject(t: &str, s: &str) -> Scope {
    Scope::Subject { tenant: Tenant::new(t).unwrap(), subject: Subject::new(s).unwrap() }
}

fn assert_clean(e: &AdapterError) {
    let shown = e.to_string();
    for secret in [KEY, "alice", "secret number", "Too many requests"] {
        assert!(!shown.contains(secret), "{secret} in {shown}");
    }
}

/// The shared suite for every seeded subject, each in a fresh project whose deletes land a few
/// queries after they are accepted: exactly its traces go (every run of them), every other run
/// keeps every field, and verify says zero only once the runs are no longer readable.
#[test]
fn conformance_every_subject_with_neighbours_and_operator_lookalikes() {
    for (t, s) in OWNERS {
        let p = Proj::new(seed(2), "");
        let me = (t.to_string(), s.to_string());
        let out = conformance::run(&p, &subject(t, s), &|o| *o == me, 1);
        assert_eq!((out.inventoried, out.erased, out.erased_again, out.residue), (6, 6, 0, 0), "{t}/{s}");
        p.double.with(|st| {
            assert!(st.settled(), "verify said zero before the delete was carried out");
            assert_eq!(st.bad_auth, 0);
            for q in &st.queries {
                assert_eq!(q["select"], json!(["id", "trace_id", "extra"]), "no inputs or outputs read");
                let f = q.get("filter").map(|f| f.to_string()).unwrap_or_default();
                assert!(!f.contains(s) || s.len() < 3, "no identifier in a filter: {f}");
            }
        });
    }
}

#[test]
fn conformance_tenant_scope() {
    let p = Proj::new(seed(1), "");
    let scope = Scope::Tenant { tenant: Tenant::new("acme").unwrap() };
    let out = conformance::run(&p, &scope, &|o| o.0 == "acme", 3);
    let acme = OWNERS.iter().filter(|(t, _)| *t == "acme").count() as u64;
    assert_eq!((out.erased, out.residue), (3 * acme, 0));
}

/// The delete's 200 is no proof: with a delete that has not landed within the bound, verify
/// reports what is still readable as residue, never zero; once it landed, a rerun of verify
/// (a resume) says zero.
#[test]
fn an_accepted_delete_is_not_proof_until_read_back() {
    let p = Proj::new(seed(1), "");
    p.double.with(|s| s.delay = 1_000_000);
    let scope = subject("acme", "alice");
    let quick = target(&p.double.url(), "verify_timeout_ms = 200");
    let inv = quick.inventory(&scope).unwrap();
    assert_eq!(quick.erase_batch(&scope, &inv.locators).unwrap(), 3);
    assert_eq!(quick.verify(&scope, &inv.locators).unwrap(), 3, "residue at the bound");
    p.double.with(|s| s.delay = 0);
    // A new query lands the pending delete only when it comes; set the pending count by
    // sending the delete again, which lands after the next query.
    assert_eq!(quick.erase_batch(&scope, &inv.locators).unwrap(), 3);
    p.double.with(|s| s.faults.clear());
    let started = Instant::now();
    let long = target(&p.double.url(), "verify_timeout_ms = 5000");
    assert_eq!(long.verify(&scope, &inv.locators).unwrap(), 0);
    assert!(started.elapsed() < Duration::from_secs(5));
}

/// A trace shared by two subjects (a run of Bob's inside Alice's trace) goes whole with
/// Alice's erasure; Bob's own traces stay, byte for byte.
#[test]
fn a_trace_is_erased_whole_even_when_shared() {
    let mut runs = seed(1);
    runs.push(Run {
        id: uuid(0, 0, 9),
        trace_id: uuid(0, 0, 0),
        metadata: meta("acme", "bob"),
        inputs: json!("bob inside alice's trace"),
        outputs: json!(null),
    });
    let p = Proj::new(runs, "");
    let scope = subject("acme", "alice");
    let before = p.snapshot();
    let inv = p.adapter.inventory(&scope).unwrap();
    assert_eq!(inv.locators, vec![(format!("t:{}", uuid(0, 0, 0)), 4)]);
    assert_eq!(p.adapter.erase_batch(&scope, &inv.locators).unwrap(), 4);
    assert_eq!(p.adapter.verify(&scope, &inv.locators).unwrap(), 0);
    let trace0 = uuid(0, 0, 0);
    conformance::assert_only_removed(&before, &p.snapshot(), 4, &|r| {
        serde_json::from_slice::<Value>(&r.bytes).unwrap()[1] == json!(trace0)
    });
}

/// A trace grown since the freeze, or no longer holding a run of the scope, blocks the batch
/// before anything is deleted.
#[test]
fn anomaly_guard_refuses_a_grown_trace_or_one_out_of_scope() {
    let p = Proj::new(seed(1), "");
    let scope = subject("acme", "alice");
    let inv = p.adapter.inventory(&scope).unwrap();
    p.double.with(|s| {
        s.runs.push(Run {
            id: uuid(0, 0, 7),
            trace_id: uuid(0, 0, 0),
            metadata: Map::new(),
            inputs: json!("late"),
            outputs: json!(null),
        })
    });
    let e = p.adapter.erase_batch(&scope, &inv.locators).unwrap_err();
    assert!(matches!(e, AdapterError::AnomalousVolume { expected: 3, found: 4, .. }), "{e}");
    assert_clean(&e);
    // Bob's trace smuggled into Alice's batch.
    let mut bad = inv.locators.clone();
    bad.push((format!("t:{}", uuid(9, 0, 0)), 3));
    p.double.with(|s| s.runs.retain(|r| r.id != uuid(0, 0, 7)));
    let e = p.adapter.erase_batch(&scope, &bad).unwrap_err();
    assert!(matches!(e, AdapterError::AnomalousVolume { .. }), "{e}");
    assert!(p.double.with(|s| s.deletes.is_empty()), "nothing was deleted");
    let e = p.adapter.erase_batch(&scope, &[("t:not-a-uuid".into(), 1)]).unwrap_err();
    assert!(matches!(e, AdapterError::Failed { .. }), "{e}");
}

/// 1,200 traces for one subject: the listing follows the cursor past pages of 100, and the
/// deletes go at most 1,000 trace ids a request.
#[test]
fn deletes_go_a_thousand_traces_a_request() {
    let mut runs = seed(1);
    for k in 0..1_200 {
        let t = uuid(99, k, 0);
        runs.push(Run { id: t.clone(), trace_id: t, metadata: meta("acme", "alice"), inputs: json!(k), outputs: json!(null) });
    }
    let p = Proj::new(runs, "max_in_flight = 8");
    let me = ("acme".to_string(), "alice".to_string());
    let scope = subject("acme", "alice");
    let inv = p.adapter.inventory(&scope).unwrap();
    assert_eq!(inv.locators.len(), 1_201);
    let mut erased = 0;
    for chunk in inv.locators.chunks(1_201) {
        erased += p.adapter.erase_batch(&scope, chunk).unwrap();
    }
    assert_eq!(erased, 1_203);
    assert_eq!(p.double.with(|s| s.deletes.clone()), vec![1_000, 201]);
    assert_eq!(p.adapter.verify(&scope, &inv.locators).unwrap(), 0);
    assert!(p.snapshot().iter().all(|r| r.owner != me));
    assert_eq!(p.snapshot().len(), (OWNERS.len() - 1) * 3);
}

#[test]
fn memory_scope_is_exempt() {
    let p = Proj::new(seed(1), "");
    let scope = Scope::Memory {
        tenant: Tenant::new("acme").unwrap(),
        subject: Subject::new("alice").unwrap(),
        memory: MemoryId::new("m1").unwrap(),
        version: None,
    };
    assert!(matches!(p.adapter.check_scope(&scope).unwrap(), Applicability::Exempt(_)));
    assert_eq!(p.adapter.inventory(&scope).unwrap().count, 0);
}

#[test]
fn rate_limits_are_retried_honouring_retry_after() {
    let p = Proj::new(seed(1), "");
    let scope = subject("acme", "alice");
    let inv = p.adapter.inventory(&scope).unwrap();
    p.double.with(|s| s.faults.extend([Fault::TooMany(1), Fault::Drop]));
    let started = Instant::now();
    assert_eq!(p.adapter.erase_batch(&scope, &inv.locators).unwrap(), 3);
    assert!(started.elapsed() >= Duration::from_secs(1));
    let bob = subject("acme", "bob");
    let inv = p.adapter.inventory(&bob).unwrap();
    let impatient = target(&p.double.url(), "retry_after_max_ms = 100");
    p.double.with(|s| s.faults.push_back(Fault::TooMany(60)));
    let e = impatient.erase_batch(&bob, &inv.locators).unwrap_err();
    assert!(matches!(e, AdapterError::Unavailable { .. }) && e.to_string().contains("Retry-After"), "{e}");
    assert_clean(&e);
    assert!(p.double.with(|s| s.deletes.len()) == 1, "never counted as done: no delete sent");
    p.double.with(|s| s.faults.extend([Fault::Status(503); 3]));
    assert!(matches!(p.adapter.inventory(&bob).unwrap_err(), AdapterError::Unavailable { .. }));
}

#[test]
fn an_unreachable_service_is_unavailable_and_a_rerun_finishes() {
    let a = target("http://127.0.0.1:9", "retries = 0\ntimeout_ms = 2000");
    let scope = subject("acme", "alice");
    for e in [
        a.probe().unwrap_err(),
        a.inventory(&scope).unwrap_err(),
        a.erase_batch(&scope, &[(format!("t:{}", uuid(0, 0, 0)), 3)]).unwrap_err(),
        a.verify(&scope, &[]).unwrap_err(),
    ] {
        assert!(matches!(e, AdapterError::Unavailable { .. }) && e.to_string().contains("target traces"), "{e}");
        assert_clean(&e);
    }
    let p = Proj::new(seed(1), "");
    let inv = p.adapter.inventory(&scope).unwrap();
    p.double.with(|s| s.faults.extend([Fault::Drop; 3]));
    assert!(p.adapter.erase_batch(&scope, &inv.locators).is_err());
    assert_eq!(p.adapter.erase_batch(&scope, &inv.locators).unwrap(), 3);
    assert_eq!(p.adapter.verify(&scope, &inv.locators).unwrap(), 0);
}

/// The read-back of many traces runs in parallel, at most `max_in_flight` requests at once.
#[test]
fn max_in_flight_bounds_concurrent_requests() {
    let p = Proj::new(seed(4), "");
    let peak = |n: usize| {
        let a = target(&p.double.url(), &format!("max_in_flight = {n}"));
        p.double.server.hold(40);
        let inv = a.inventory(&Scope::Tenant { tenant: Tenant::new("acme").unwrap() }).unwrap();
        assert_eq!(inv.count, 3 * 4 * 9);
        let peak = p.double.server.peak();
        p.double.server.hold(0);
        peak
    };
    assert_eq!(peak(3), 3);
    assert_eq!(peak(1), 1);
}

#[test]
fn probe_key_and_registry() {
    let p = Proj::new(seed(1), "");
    p.adapter.probe().unwrap();
    assert_eq!(p.adapter.describe().kind, crate::Kind::Langsmith);
    assert!(p.adapter.place().contains(PROJECT));
    let dir = tempfile::tempdir().unwrap();
    let f = dir.path().join("k");
    {
        use std::os::unix::fs::PermissionsExt;
        std::fs::write(&f, "wrong-S3CRET").unwrap();
        std::fs::set_permissions(&f, std::fs::Permissions::from_mode(0o600)).unwrap();
    }
    let text = format!(
        "url = \"{}\"\nproject_id = \"{PROJECT}\"\napi_key_file = \"{}\"\nmetadata = {{ tenant = \"tenant_id\", subject = \"user_id\" }}\n",
        p.double.url(),
        f.display()
    );
    let wrong = Config::parse(toml::from_str(&text).unwrap(), Path::new(".")).unwrap().build("traces");
    let e = wrong.probe().unwrap_err();
    assert!(matches!(e, AdapterError::Failed { .. }) && e.to_string().contains("api key"), "{e}");
    assert!(!e.to_string().contains("S3CRET"));
    let reg = format!("name = \"ls\"\nkind = \"langsmith\"\nclass = \"trace\"\n{text}");
    assert!(crate::build(1, toml::from_str(&reg).unwrap(), Path::new(".")).is_ok());
    let reg = reg.replace("class = \"trace\"", "class = \"primary\"");
    assert!(crate::build(1, toml::from_str(&reg).unwrap(), Path::new(".")).is_err());
}
