//! The node cache target on real Redis: the standalone server (LETHE_REDIS_URL, db 9) and the
//! three-primary cluster (LETHE_REDIS_CLUSTER_NODES). Each test writes under its own prefix,
//! and every test checks that every key it did not mean to erase kept its value byte for byte.

use std::collections::BTreeMap;
use std::path::Path;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use lethe_core::{MemoryId, Scope, Subject, Tenant};

use crate::redis::resp::{Addr, Auth, Nodes, Reply};
use crate::{Adapter, AdapterError, Applicability};

use super::Config;

static N: AtomicUsize = AtomicUsize::new(0);

fn addr(url: &str) -> Addr {
    let hp = url.trim_start_matches("redis://").split('/').next().unwrap();
    let (h, p) = hp.rsplit_once(':').unwrap_or((hp, "6379"));
    (h.to_string(), p.parse().unwrap())
}

fn standalone_url() -> String {
    std::env::var("LETHE_REDIS_URL").unwrap_or_else(|_| "redis://127.0.0.1:6379".into())
}

fn cluster_urls() -> Vec<String> {
    std::env::var("LETHE_REDIS_CLUSTER_NODES")
        .unwrap_or_else(|_| {
            "redis://127.0.0.1:7101 redis://127.0.0.1:7102 redis://127.0.0.1:7103".into()
        })
        .split_whitespace()
        .map(str::to_string)
        .collect()
}

/// A test's own cache prefix and index layout, as LangGraph's `RedisCache(prefix=...)` and the
/// Python package's `Gate.cache(..., index=...)` would write them.
struct Cache {
    root: String,
    cluster: bool,
    nodes: std::cell::RefCell<Nodes>,
}

impl Cache {
    fn new(cluster: bool) -> Self {
        let root = format!(
            "lgc{}x{}",
            std::process::id(),
            N.fetch_add(1, Ordering::SeqCst)
        );
        let seeds = match cluster {
            true => cluster_urls().iter().map(|u| addr(u)).collect(),
            false => vec![addr(&standalone_url())],
        };
        let auth = Auth {
            username: None,
            password: None,
            db: if cluster { 0 } else { 9 },
            tls: None,
        };
        Cache {
            root,
            cluster,
            nodes: std::cell::RefCell::new(Nodes::new(
                seeds,
                cluster,
                auth,
                Duration::from_secs(5),
            )),
        }
    }

    fn prefix(&self) -> String {
        format!("{}:langgraph:cache:", self.root)
    }

    fn index(&self, t: &str, s: &str) -> String {
        format!("{}:idx:{t}:{s}", self.root)
    }

    fn target(&self, legacy: &str) -> Box<dyn Adapter> {
        let conn = match self.cluster {
            true => format!(
                "nodes = [{}]",
                cluster_urls()
                    .iter()
                    .map(|u| format!("\"{u}\""))
                    .collect::<Vec<_>>()
                    .join(", ")
            ),
            false => format!("url = \"{}/9\"", standalone_url().trim_end_matches('/')),
        };
        let text = format!(
            "{conn}\nprefix = \"{}\"\nindex = \"{}:idx:{{tenant}}:{{subject}}\"\nlegacy = \"{legacy}\"\n",
            self.prefix(),
            self.root
        );
        Box::new(
            Config::parse(toml::from_str(&text).unwrap(), Path::new("."))
                .unwrap()
                .build("node-cache"),
        )
    }

    fn cmd(&self, args: &[&[u8]]) -> Reply {
        let r = self.nodes.borrow_mut().keyed(args[1], args).expect("redis reachable");
        assert!(!matches!(r, Reply::Error(_)), "{r:?}");
        r
    }

    /// One cache entry as `RedisCache.set` writes it (`<encoding>:<bytes>`), for the node
    /// `respond` and an input hash; indexed for (t, s) when given, as `Gate.cache` does.
    fn entry(&self, n: usize, text: &str, owner: Option<(&str, &str)>, ttl: Option<u32>) -> String {
        let key = format!(
            "{}__pregel_ns_writes:common._respond:respond:{n:032x}",
            self.prefix()
        );
        let value = format!("json:{{\"output\": \"{text}\"}}");
        match ttl {
            Some(s) => self.cmd(&[b"SET", key.as_bytes(), value.as_bytes(), b"EX", s.to_string().as_bytes()]),
            None => self.cmd(&[b"SET", key.as_bytes(), value.as_bytes()]),
        };
        if let Some((t, s)) = owner {
            self.cmd(&[b"SADD", self.index(t, s).as_bytes(), key.as_bytes()]);
        }
        key
    }

    /// Every key under the test's root and its value (`DUMP`), on every primary.
    fn snapshot(&self) -> BTreeMap<Vec<u8>, Vec<u8>> {
        let mut nodes = self.nodes.borrow_mut();
        let pattern = format!("{}:*", self.root);
        let mut keys = Vec::new();
        for node in nodes.primaries().unwrap() {
            let mut cursor = b"0".to_vec();
            loop {
                let r = nodes
                    .conn(&node)
                    .unwrap()
                    .call(&[b"SCAN", &cursor, b"MATCH", pattern.as_bytes(), b"COUNT", b"1000"])
                    .unwrap();
                let a = r.array().unwrap();
                cursor = a[0].bytes().unwrap().to_vec();
                keys.extend(a[1].array().unwrap().iter().map(|k| k.bytes().unwrap().to_vec()));
                if cursor == b"0" {
                    break;
                }
            }
        }
        keys.into_iter()
            .map(|k| {
                let v = nodes.keyed(&k, &[b"DUMP", &k]).unwrap();
                let v = v.bytes().unwrap_or_default().to_vec();
                (k, v)
            })
            .collect()
    }
}

fn subject(t: &str, s: &str) -> Scope {
    Scope::Subject {
        tenant: Tenant::new(t).unwrap(),
        subject: Subject::new(s).unwrap(),
    }
}

/// Inventory, erase in batches of two, verify: what a job does. Returns the inventory.
fn erase(target: &dyn Adapter, scope: &Scope) -> crate::Inventory {
    let inv = target.inventory(scope).unwrap();
    let mut erased = 0;
    for batch in inv.locators.chunks(2) {
        erased += target.erase_batch(scope, batch).unwrap();
    }
    assert_eq!(erased, inv.count, "erased exactly the inventory");
    assert_eq!(target.verify(scope, &inv.locators).unwrap(), 0, "no residue");
    // Idempotent: a second pass over the same locators erases nothing more.
    let again: u64 = inv
        .locators
        .chunks(2)
        .map(|b| target.erase_batch(scope, b).unwrap())
        .sum();
    assert_eq!(again, 0);
    inv
}

/// Removes `gone` from a snapshot: what must be left, byte for byte.
fn without(mut snap: BTreeMap<Vec<u8>, Vec<u8>>, gone: &[&str]) -> BTreeMap<Vec<u8>, Vec<u8>> {
    for k in gone {
        assert!(snap.remove(k.as_bytes()).is_some(), "{k} was in the snapshot");
    }
    snap
}

fn indexed_entries_of_one_subject_go_and_every_other_key_stays(cluster: bool) {
    let c = Cache::new(cluster);
    let a1 = c.entry(1, "alice likes tea", Some(("acme", "alice")), None);
    let a2 = c.entry(2, "alice lives in Lyon", Some(("acme", "alice")), Some(3600));
    c.entry(3, "bob likes coffee", Some(("acme", "bob")), None);
    c.entry(4, "alice of globex", Some(("globex", "alice")), None);
    // A prefix neighbour: subject "alice2" shares alice's index set's first bytes.
    c.entry(5, "alice2's entry", Some(("acme", "alice2")), None);
    // Listed in alice's set but already expired or evicted: nothing to erase, nothing counted.
    c.cmd(&[b"SADD", c.index("acme", "alice").as_bytes(), format!("{}gone", c.prefix()).as_bytes()]);
    let before = c.snapshot();
    let target = c.target("refuse");
    assert_eq!(target.check_scope(&subject("acme", "alice")).unwrap(), Applicability::Applies);
    let inv = erase(target.as_ref(), &subject("acme", "alice"));
    assert_eq!(inv.count, 3, "two entries and the index set");
    let index = c.index("acme", "alice");
    assert_eq!(c.snapshot(), without(before, &[&a1, &a2, &index]));
    let s = target.settlement(&inv.locators);
    assert_eq!((s.expires, s.legacy), (None, Some(("refuse", 0))));
}

#[test]
fn indexed_entries_of_one_subject_go_and_every_other_key_stays_standalone() {
    indexed_entries_of_one_subject_go_and_every_other_key_stays(false);
}

#[test]
fn indexed_entries_of_one_subject_go_and_every_other_key_stays_cluster() {
    indexed_entries_of_one_subject_go_and_every_other_key_stays(true);
}

#[test]
fn legacy_entries_block_under_refuse_and_nothing_is_touched() {
    let c = Cache::new(false);
    c.entry(1, "alice likes tea", Some(("acme", "alice")), None);
    c.entry(2, "someone's text, no index", None, None);
    c.entry(3, "more legacy", None, Some(60));
    let before = c.snapshot();
    let target = c.target("refuse");
    match target.inventory(&subject("acme", "alice")) {
        Err(AdapterError::LegacyDerived { count, ref why, .. }) => {
            assert_eq!(count, 2);
            assert!(why.contains("refuse"), "{why}");
        }
        other => panic!("expected legacy_derived, got {other:?}"),
    }
    let e = target.inventory(&subject("acme", "alice")).unwrap_err();
    assert_eq!(e.code(), "legacy_derived");
    assert!(!e.to_string().contains("alice"), "no identifier in: {e}");
    assert_eq!(c.snapshot(), before, "nothing touched");
}

#[test]
fn flush_erases_every_legacy_entry_and_keeps_other_subjects_indexed_entries() {
    let c = Cache::new(false);
    let a1 = c.entry(1, "alice likes tea", Some(("acme", "alice")), None);
    c.entry(2, "bob likes coffee", Some(("acme", "bob")), None);
    let l1 = c.entry(3, "alice, written before the package", None, None);
    let l2 = c.entry(4, "carol, written before the package", None, Some(600));
    let before = c.snapshot();
    let target = c.target("flush");
    let inv = erase(target.as_ref(), &subject("acme", "alice"));
    assert_eq!(inv.count, 4, "one indexed entry, its set, two legacy entries");
    let index = c.index("acme", "alice");
    assert_eq!(c.snapshot(), without(before, &[&a1, &index, &l1, &l2]));
    let s = target.settlement(&inv.locators);
    assert_eq!((s.expires, s.legacy), (None, Some(("flush", 2))));
}

#[test]
fn expire_leaves_legacy_entries_to_their_ttl_and_dates_the_last_one() {
    let c = Cache::new(false);
    let a1 = c.entry(1, "alice likes tea", Some(("acme", "alice")), None);
    c.entry(2, "legacy, one hour", None, Some(3600));
    c.entry(3, "legacy, two days", None, Some(2 * 86_400));
    let before = c.snapshot();
    let target = c.target("expire");
    let inv = erase(target.as_ref(), &subject("acme", "alice"));
    assert_eq!(inv.count, 2, "legacy entries are not erased, only dated");
    let index = c.index("acme", "alice");
    assert_eq!(c.snapshot(), without(before, &[&a1, &index]));
    let s = target.settlement(&inv.locators);
    assert_eq!(s.legacy, Some(("expire", 2)));
    let today = time::OffsetDateTime::now_utc().date();
    let expires = s.expires.expect("a date");
    assert!(expires >= today.next_day().unwrap() && expires <= today + time::Duration::days(3), "{expires}");

    // An entry that never expires cannot be waited for.
    c.entry(4, "legacy, no ttl", None, None);
    let before = c.snapshot();
    let e = target.inventory(&subject("acme", "alice")).unwrap_err();
    assert_eq!(e.code(), "legacy_derived");
    assert!(e.to_string().contains("1 of them have no TTL"), "{e}");
    assert_eq!(c.snapshot(), before, "nothing touched");
}

#[test]
fn a_tenant_scope_takes_every_subject_of_the_tenant_and_no_other_tenant() {
    let c = Cache::new(false);
    let a = c.entry(1, "alice", Some(("acme", "alice")), None);
    let b = c.entry(2, "bob", Some(("acme", "bob")), None);
    c.entry(3, "globex alice", Some(("globex", "alice")), None);
    // A tenant whose name starts with the other's: `acme` must not take `acmeco`.
    c.entry(4, "acmeco dave", Some(("acmeco", "dave")), None);
    let before = c.snapshot();
    let target = c.target("refuse");
    let scope = Scope::Tenant {
        tenant: Tenant::new("acme").unwrap(),
    };
    let inv = erase(target.as_ref(), &scope);
    assert_eq!(inv.count, 4);
    let (ia, ib) = (c.index("acme", "alice"), c.index("acme", "bob"));
    assert_eq!(c.snapshot(), without(before, &[&a, &b, &ia, &ib]));
}

#[test]
fn a_memory_scope_takes_the_subjects_whole_index() {
    let c = Cache::new(false);
    let a1 = c.entry(1, "alice 1", Some(("acme", "alice")), None);
    let a2 = c.entry(2, "alice 2", Some(("acme", "alice")), None);
    c.entry(3, "bob", Some(("acme", "bob")), None);
    let before = c.snapshot();
    let scope = Scope::Memory {
        tenant: Tenant::new("acme").unwrap(),
        subject: Subject::new("alice").unwrap(),
        memory: MemoryId::new("memories/k1").unwrap(),
        version: None,
    };
    let inv = erase(c.target("refuse").as_ref(), &scope);
    assert_eq!(inv.count, 3);
    let ia = c.index("acme", "alice");
    assert_eq!(c.snapshot(), without(before, &[&a1, &a2, &ia]));
}

#[test]
fn identifiers_the_index_layout_cannot_tell_apart_are_refused_and_globs_match_themselves() {
    let c = Cache::new(false);
    c.entry(1, "alice", Some(("acme", "alice")), None);
    let before = c.snapshot();
    let target = c.target("refuse");
    // `acme:eu` + `bob` and `acme` + `eu:bob` would share a set under `{tenant}:{subject}`:
    // a tenant holding the separator is refused (a subject may, as nothing follows it).
    for scope in [subject("acme:eu", "bob")] {
        match target.check_scope(&scope) {
            Err(AdapterError::Inexpressible { why, .. }) => {
                assert!(why.contains("':'"), "{why}");
                assert!(!why.contains("bob"), "no identifier in: {why}");
            }
            other => panic!("expected inexpressible, got {other:?}"),
        }
    }
    // A glob in a tenant matches only itself: `a*` owns nothing here.
    let scope = Scope::Tenant {
        tenant: Tenant::new("a*").unwrap(),
    };
    assert_eq!(target.inventory(&scope).unwrap().count, 0);
    assert_eq!(c.snapshot(), before);
}

#[test]
fn an_index_set_that_lists_a_foreign_key_is_refused() {
    let c = Cache::new(false);
    c.entry(1, "alice", Some(("acme", "alice")), None);
    let foreign = format!("{}:sessions:alice", c.root);
    c.cmd(&[b"SET", foreign.as_bytes(), b"not a cache entry"]);
    c.cmd(&[b"SADD", c.index("acme", "alice").as_bytes(), foreign.as_bytes()]);
    let before = c.snapshot();
    let e = c.target("refuse").inventory(&subject("acme", "alice")).unwrap_err();
    assert_eq!(e.code(), "failed");
    assert!(e.to_string().contains("outside the cache's prefix"), "{e}");
    assert_eq!(c.snapshot(), before);
}

#[test]
fn a_locator_outside_the_cache_is_never_unlinked() {
    let c = Cache::new(false);
    let other = format!("{}:sessions:bob", c.root);
    c.cmd(&[b"SET", other.as_bytes(), b"bob's session"]);
    let before = c.snapshot();
    let hex: String = other.bytes().map(|b| format!("{b:02x}")).collect();
    let e = c
        .target("flush")
        .erase_batch(&subject("acme", "alice"), &[(format!("l:{hex}"), 1)])
        .unwrap_err();
    assert!(e.to_string().contains("outside this cache"), "{e}");
    assert_eq!(c.snapshot(), before);
}

/// The conformance suite over indexed entries: three tenants' subjects, awkward identifiers
/// included, every key owned by the subject the seeder wrote it for.
struct Seeded {
    cache: Cache,
    owners: BTreeMap<Vec<u8>, (String, String)>,
    target: Box<dyn Adapter>,
}

impl Seeded {
    fn new(cluster: bool) -> Self {
        let cache = Cache::new(cluster);
        let mut owners = BTreeMap::new();
        let mut n = 0;
        for (t, s) in [
            ("acme", "alice"),
            ("acme", "alice2"),
            ("acme", "bob"),
            ("acme", "ali*"),
            ("acme", "eu:bob"),
            ("acmeco", "alice"),
            ("globex", "alice"),
        ] {
            for _ in 0..3 {
                n += 1;
                let key = cache.entry(n, &format!("{s} text {n}"), Some((t, s)), None);
                owners.insert(key.into_bytes(), (t.to_string(), s.to_string()));
            }
            owners.insert(cache.index(t, s).into_bytes(), (t.to_string(), s.to_string()));
        }
        let target = cache.target("refuse");
        Seeded {
            cache,
            owners,
            target,
        }
    }
}

impl crate::conformance::Case for Seeded {
    fn adapter(&self) -> &dyn Adapter {
        self.target.as_ref()
    }

    fn snapshot(&self) -> Vec<crate::conformance::Row> {
        self.cache
            .snapshot()
            .into_iter()
            .map(|(k, v)| {
                let owner = self.owners.get(&k).cloned().unwrap_or_default();
                let mut bytes = k;
                bytes.push(0);
                bytes.extend(v);
                crate::conformance::Row {
                    table: "keys".into(),
                    bytes,
                    owner,
                }
            })
            .collect()
    }
}

#[test]
fn conformance_subject_and_tenant_scopes_standalone_and_cluster() {
    for cluster in [false, true] {
        for batch in [1, 3, 1000] {
            let case = Seeded::new(cluster);
            let out = crate::conformance::run(&case, &subject("acme", "alice"), &|o| o == &("acme".to_string(), "alice".to_string()), batch);
            assert_eq!(out.inventoried, 4, "three entries and the set");
            let out = crate::conformance::run(&case, &subject("acme", "ali*"), &|o| o == &("acme".to_string(), "ali*".to_string()), batch);
            assert_eq!(out.inventoried, 4);
            let tenant = Scope::Tenant {
                tenant: Tenant::new("acme").unwrap(),
            };
            let out = crate::conformance::run(&case, &tenant, &|o| o.0 == "acme", batch);
            assert_eq!(out.inventoried, 12, "alice2, bob, eu:bob: three entries and a set each");
        }
    }
}
