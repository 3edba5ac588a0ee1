//! The conformance suite on real Redis: the standalone server on 127.0.0.1:6379 and the
//! three-primary cluster `scripts/redis cluster-start` runs (LETHE_REDIS_URL,
//! LETHE_REDIS_CLUSTER_NODES). Every test writes under its own key prefix.

use std::collections::HashMap;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use lethe_core::{MemoryId, Scope, Subject, Tenant};

use super::resp::{Addr, Auth, Nodes, Reply};
use crate::conformance::{self, Case, Row};
use crate::{Adapter, AdapterError, Applicability};

static N: AtomicUsize = AtomicUsize::new(0);

fn standalone() -> (String, Addr) {
    let url = std::env::var("LETHE_REDIS_URL").unwrap_or_else(|_| "redis://127.0.0.1:6379".into());
    let hp = url
        .trim_start_matches("redis://")
        .split('/')
        .next()
        .unwrap()
        .to_string();
    let (h, p) = hp.rsplit_once(':').unwrap();
    (url.clone(), (h.to_string(), p.parse().unwrap()))
}

fn cluster_nodes() -> Vec<String> {
    std::env::var("LETHE_REDIS_CLUSTER_NODES")
        .unwrap_or_else(|_| {
            "redis://127.0.0.1:7101 redis://127.0.0.1:7102 redis://127.0.0.1:7103".into()
        })
        .split_whitespace()
        .map(str::to_string)
        .collect()
}

fn addr(url: &str) -> Addr {
    let (h, p) = url.trim_start_matches("redis://").rsplit_once(':').unwrap();
    (h.to_string(), p.parse().unwrap())
}

/// The TLS-only server `scripts/redis tls-start` runs, and its folder (`ca.crt`, `wrong-ca.crt`).
fn tls_server() -> (String, Addr, std::path::PathBuf) {
    let url =
        std::env::var("LETHE_REDIS_TLS_URL").unwrap_or_else(|_| "rediss://127.0.0.1:7110".into());
    let dir =
        std::env::var("LETHE_REDIS_TLS_DIR").unwrap_or_else(|_| "/var/tmp/lethe-redis-tls".into());
    let (h, p) = url
        .trim_start_matches("rediss://")
        .rsplit_once(':')
        .unwrap();
    let a = (h.to_string(), p.trim_end_matches('/').parse().unwrap());
    (url, a, dir.into())
}

/// A test's own key prefix, on the standalone server (db 9), the cluster, or the TLS server.
struct Space {
    prefix: String,
    cluster: bool,
    /// On the TLS server (`tls_server`), trusting its CA.
    tls: bool,
    nodes: std::cell::RefCell<Nodes>,
    owners: HashMap<Vec<u8>, (String, String)>,
    /// A private cluster's seed URLs (`Private`), instead of the shared cluster's.
    urls: Option<Vec<String>>,
}

impl Space {
    fn new(cluster: bool) -> Self {
        Self::make(cluster, false)
    }

    fn tls() -> Self {
        Self::make(false, true)
    }

    /// On a private cluster (`Private`).
    fn private(c: &Private) -> Self {
        let mut space = Self::make(true, false);
        let seeds = c.urls().iter().map(|u| addr(u)).collect();
        let auth = Auth {
            username: None,
            password: None,
            db: 0,
            tls: None,
        };
        space.nodes =
            std::cell::RefCell::new(Nodes::new(seeds, true, auth, Duration::from_secs(5)));
        space.urls = Some(c.urls());
        space
    }

    fn make(cluster: bool, tls: bool) -> Self {
        let prefix = format!(
            "lt{}x{}",
            std::process::id(),
            N.fetch_add(1, Ordering::SeqCst)
        );
        let auth = Auth {
            username: None,
            password: None,
            db: if cluster { 0 } else { 9 },
            tls: tls.then(|| {
                let mut b =
                    openssl::ssl::SslConnector::builder(openssl::ssl::SslMethod::tls_client())
                        .unwrap();
                b.set_ca_file(tls_server().2.join("ca.crt")).unwrap();
                b.build()
            }),
        };
        let seeds = if tls {
            vec![tls_server().1]
        } else if cluster {
            cluster_nodes().iter().map(|u| addr(u)).collect()
        } else {
            vec![standalone().1]
        };
        let nodes = Nodes::new(seeds, cluster, auth, Duration::from_secs(5));
        Space {
            prefix,
            cluster,
            tls,
            nodes: std::cell::RefCell::new(nodes),
            owners: HashMap::new(),
            urls: None,
        }
    }

    fn cmd(&self, args: &[&[u8]]) -> Reply {
        let r = self
            .nodes
            .borrow_mut()
            .keyed(args[1], args)
            .expect("redis reachable (scripts/test starts the cluster and the TLS server)");
        assert!(!matches!(r, Reply::Error(_)), "{r:?}");
        r
    }

    /// Keys of every type for a subject, one with a TTL, and its index set.
    fn seed(&mut self, t: &str, s: &str) {
        let p = format!("{}:{t}:{s}:", self.prefix);
        let k = |x: &str| format!("{p}{x}");
        self.cmd(&[
            b"SET",
            k("str").as_bytes(),
            format!("{s} said hello").as_bytes(),
        ]);
        self.cmd(&[
            b"HSET",
            k("hash").as_bytes(),
            b"user",
            s.as_bytes(),
            b"n",
            b"1",
        ]);
        self.cmd(&[b"RPUSH", k("list").as_bytes(), b"a", s.as_bytes()]);
        self.cmd(&[b"SADD", k("set").as_bytes(), b"x", s.as_bytes()]);
        self.cmd(&[b"ZADD", k("zset").as_bytes(), b"1", s.as_bytes()]);
        self.cmd(&[b"XADD", k("stream").as_bytes(), b"*", b"user", s.as_bytes()]);
        self.cmd(&[b"SET", k("ttl").as_bytes(), b"short-lived", b"EX", b"3600"]);
        let keys: Vec<String> = ["str", "hash", "list", "set", "zset", "stream", "ttl"]
            .iter()
            .map(|x| k(x))
            .collect();
        let index = self.index_key(t, s);
        let mut sadd: Vec<&[u8]> = vec![b"SADD", index.as_bytes()];
        sadd.extend(keys.iter().map(|k| k.as_bytes()));
        self.cmd(&sadd);
        for key in keys.iter().chain(std::iter::once(&index)) {
            self.owners
                .insert(key.as_bytes().to_vec(), (t.to_string(), s.to_string()));
        }
    }

    /// Every key under the test's prefix, on every primary. A set: during a slot migration a
    /// key can show up in two nodes' SCANs.
    fn keys(&self) -> std::collections::BTreeSet<Vec<u8>> {
        let mut nodes = self.nodes.borrow_mut();
        let pattern = format!("{}:*", self.prefix);
        let mut keys = std::collections::BTreeSet::new();
        for node in nodes.primaries().unwrap() {
            let mut cursor = b"0".to_vec();
            loop {
                let r = nodes
                    .conn(&node)
                    .unwrap()
                    .call(&[
                        b"SCAN",
                        &cursor,
                        b"MATCH",
                        pattern.as_bytes(),
                        b"COUNT",
                        b"1000",
                    ])
                    .unwrap();
                let a = r.array().unwrap();
                cursor = a[0].bytes().unwrap().to_vec();
                keys.extend(
                    a[1].array()
                        .unwrap()
                        .iter()
                        .map(|k| k.bytes().unwrap().to_vec()),
                );
                if cursor == b"0" {
                    break;
                }
            }
        }
        keys
    }

    fn index_key(&self, t: &str, s: &str) -> String {
        format!("{}:idx:{{{t}}}:{s}", self.prefix)
    }

    fn target(&self, mode: &str) -> crate::Target {
        self.target_with(mode, "")
    }

    /// A target with extra config lines.
    fn target_with(&self, mode: &str, extra: &str) -> crate::Target {
        let conn = if self.tls {
            let (url, _, dir) = tls_server();
            format!(
                "url = \"{url}\"\ndb = 9\ntls_ca_file = \"{}\"",
                dir.join("ca.crt").display()
            )
        } else if self.cluster {
            format!(
                "nodes = [{}]",
                self.urls
                    .clone()
                    .unwrap_or_else(cluster_nodes)
                    .iter()
                    .map(|n| format!("\"{n}\""))
                    .collect::<Vec<_>>()
                    .join(", ")
            )
        } else {
            format!("url = \"{}\"\ndb = 9", standalone().0)
        };
        let mode = match mode {
            "index" => format!(
                "mode = \"index\"\nindex = \"{}:idx:{{{{tenant}}}}:{{subject}}\"",
                self.prefix
            ),
            _ => "mode = \"scan\"\nscan_count = 7".to_string(),
        };
        let text = format!(
            "name = \"cache\"\nkind = \"redis\"\nclass = \"cache\"\n{conn}\npattern = \"{p}:{{tenant}}:{{subject}}:*\"\nmemory = \"{p}:{{tenant}}:{{subject}}:{{memory}}\"\n{mode}\n{extra}\n",
            p = self.prefix
        );
        crate::build(1, toml::from_str(&text).unwrap(), std::path::Path::new(".")).unwrap()
    }
}

struct RedisCase<'a> {
    space: &'a Space,
    adapter: crate::Target,
    /// Scan mode does not own the index sets: they are outside the pattern.
    with_index: bool,
}

impl Case for RedisCase<'_> {
    fn adapter(&self) -> &dyn Adapter {
        self.adapter.adapter.as_ref()
    }
    fn snapshot(&self) -> Vec<Row> {
        let keys = self.space.keys();
        let mut nodes = self.space.nodes.borrow_mut();
        let mut rows = Vec::new();
        for k in keys {
            // Through `keyed`, which follows MOVED and ASK.
            let Some(dump) = nodes
                .keyed(&k, &[b"DUMP", &k])
                .unwrap()
                .bytes()
                .map(<[u8]>::to_vec)
            else {
                continue;
            };
            let ttl = nodes.keyed(&k, &[b"PTTL", &k]).unwrap().int().unwrap() > 0;
            let is_index = k.starts_with(format!("{}:idx:", self.space.prefix).as_bytes());
            let owner = match self.space.owners.get(&k) {
                Some(o) if self.with_index || !is_index => o.clone(),
                _ => (String::new(), String::new()),
            };
            let mut bytes = k.clone();
            bytes.extend(dump);
            bytes.push(ttl as u8);
            rows.push(Row {
                table: "redis".into(),
                bytes,
                owner,
            });
        }
        rows.sort();
        rows
    }
}

fn subject(t: &str, s: &str) -> Scope {
    Scope::Subject {
        tenant: Tenant::new(t).unwrap(),
        subject: Subject::new(s).unwrap(),
    }
}

const SUBJECTS: [(&str, &str); 9] = [
    ("acme", "alice"),
    ("acme", "a?ice"),
    ("acme", "a*"),
    ("acme", "[a]lice"),
    ("acme", "al\\ice"),
    ("acme", "u1"),
    ("acme", "u10"),
    ("acmex", "alice"),
    ("acme", "zoë 用户"),
];

fn each_subject_erased_exactly(cluster: bool, mode: &str) {
    for (t, s) in SUBJECTS {
        let mut space = Space::new(cluster);
        for (t2, s2) in SUBJECTS {
            space.seed(t2, s2);
        }
        let me = (t.to_string(), s.to_string());
        let case = RedisCase {
            space: &space,
            adapter: space.target(mode),
            with_index: mode == "index",
        };
        let out = conformance::run(&case, &subject(t, s), &|o| *o == me, 3);
        let expected = if mode == "index" { 8 } else { 7 };
        assert_eq!(
            out.inventoried,
            expected,
            "every key type, the TTL key{}",
            if mode == "index" {
                " and the index set"
            } else {
                ""
            }
        );
        cleanup(&space);
    }
}

fn cleanup(space: &Space) {
    let keys = space.keys();
    let mut nodes = space.nodes.borrow_mut();
    for k in keys {
        nodes.keyed(&k, &[b"UNLINK", &k]).unwrap();
    }
}

#[test]
fn standalone_scan_mode_erases_exactly_with_glob_identifiers() {
    each_subject_erased_exactly(false, "scan");
}

#[test]
fn standalone_index_mode_erases_exactly() {
    each_subject_erased_exactly(false, "index");
}

#[test]
fn cluster_scan_mode_erases_exactly_on_every_primary() {
    each_subject_erased_exactly(true, "scan");
}

#[test]
fn cluster_index_mode_erases_exactly() {
    each_subject_erased_exactly(true, "index");
}

#[test]
fn index_and_scan_modes_find_the_same_keys() {
    for cluster in [false, true] {
        let mut space = Space::new(cluster);
        for (t, s) in SUBJECTS {
            space.seed(t, s);
        }
        let scope = subject("acme", "alice");
        let scan = space.target("scan").adapter.inventory(&scope).unwrap();
        let index = space.target("index").adapter.inventory(&scope).unwrap();
        let keys = |i: &crate::Inventory| {
            i.locators
                .iter()
                .filter(|(l, _)| l.starts_with("k:"))
                .cloned()
                .collect::<Vec<_>>()
        };
        assert_eq!(keys(&scan), keys(&index));
        assert_eq!(keys(&scan).len(), 7);
        cleanup(&space);
    }
}

#[test]
fn tenant_scope_spares_the_prefix_neighbour_tenant() {
    let mut space = Space::new(true);
    for (t, s) in SUBJECTS {
        space.seed(t, s);
    }
    let case = RedisCase {
        space: &space,
        adapter: space.target("scan"),
        with_index: false,
    };
    let out = conformance::run(
        &case,
        &Scope::Tenant {
            tenant: Tenant::new("acme").unwrap(),
        },
        &|o| o.0 == "acme",
        10,
    );
    assert_eq!(out.inventoried, 7 * 8);
    cleanup(&space);
}

#[test]
fn identifiers_holding_the_separator_are_refused_touching_nothing() {
    let space = Space::new(false);
    let t = space.target("scan");
    for scope in [subject("acme", "eu:bob"), subject("acme:eu", "bob")] {
        match t.adapter.check_scope(&scope) {
            Err(AdapterError::Inexpressible { why, .. }) => {
                assert!(why.contains("':'") && !why.contains("bob"), "{why}")
            }
            other => panic!("expected Inexpressible, got {other:?}"),
        }
    }
    // The hash-tagged index layout lets a tenant hold ':' there, but the pattern still refuses it.
    assert!(space
        .target("index")
        .adapter
        .check_scope(&subject("acme:eu", "bob"))
        .is_err());
}

#[test]
fn memory_scope_unlinks_one_key_and_tidies_the_index() {
    let mut space = Space::new(true);
    space.seed("acme", "alice");
    space.seed("acme", "bob");
    let scope = Scope::Memory {
        tenant: Tenant::new("acme").unwrap(),
        subject: Subject::new("alice").unwrap(),
        memory: MemoryId::new("hash").unwrap(),
        version: None,
    };
    let t = space.target("index");
    assert_eq!(
        t.adapter.check_scope(&scope).unwrap(),
        Applicability::Applies
    );
    let inv = t.adapter.inventory(&scope).unwrap();
    assert_eq!(inv.count, 1);
    let case = RedisCase {
        space: &space,
        adapter: space.target("index"),
        with_index: true,
    };
    let before = case.snapshot();
    assert_eq!(t.adapter.erase_batch(&scope, &inv.locators).unwrap(), 1);
    // Only the memory's key went; the index set changed (the key left it), everything else,
    // bob's keys included, is byte-identical.
    let key = format!("{}:acme:alice:hash", space.prefix);
    let index = space.index_key("acme", "alice");
    let strip = |rows: Vec<Row>| -> Vec<Row> {
        rows.into_iter()
            .filter(|r| !r.bytes.starts_with(index.as_bytes()))
            .collect()
    };
    conformance::assert_only_removed(&strip(before), &strip(case.snapshot()), 1, &|r| {
        r.bytes.starts_with(key.as_bytes())
    });
    assert_eq!(t.adapter.verify(&scope, &inv.locators).unwrap(), 0);
    let left = t.adapter.inventory(&subject("acme", "alice")).unwrap();
    assert_eq!(
        left.count,
        6 + 1,
        "the other six keys and the index set stay"
    );
    let members = space
        .cmd(&[b"SCARD", space.index_key("acme", "alice").as_bytes()])
        .int()
        .unwrap();
    assert_eq!(members, 6, "the index no longer lists the erased key");
    cleanup(&space);
}

#[test]
fn a_node_that_does_not_answer_is_retryable() {
    let t = crate::build(
        1,
        toml::from_str("name = \"c\"\nkind = \"redis\"\nclass = \"cache\"\nurl = \"redis://127.0.0.1:1\"\npattern = \"{tenant}:{subject}:*\"\ntimeout_ms = 500\n").unwrap(),
        std::path::Path::new("."),
    )
    .unwrap();
    match t.adapter.inventory(&subject("acme", "alice")) {
        Err(e @ AdapterError::Unavailable { .. }) => assert!(e.is_retryable()),
        other => panic!("expected Unavailable, got {other:?}"),
    }
}

fn scripts_redis(args: &[&str]) -> String {
    let script = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../scripts/redis");
    let out = std::process::Command::new(script)
        .args(args)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "scripts/redis {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout).unwrap()
}

#[test]
fn cluster_erase_follows_ask_redirects_while_its_slot_migrates() {
    // A hash-tagged layout puts every key of tenant `mig` in one slot. After the inventory,
    // part of that slot moves to another primary and the slot is left migrating: the source
    // answers -ASK for the moved keys, and the erase must follow it to the importing node.
    let mut space = Space::new(true);
    let layout = |p: &str| format!("{p}:{{{{tenant}}}}:{{subject}}:*");
    let text = format!(
        "name = \"cache\"\nkind = \"redis\"\nclass = \"cache\"\nnodes = [{}]\npattern = \"{}\"\nscan_count = 5\n",
        cluster_nodes().iter().map(|n| format!("\"{n}\"")).collect::<Vec<_>>().join(", "),
        layout(&space.prefix)
    );
    let target =
        crate::build(1, toml::from_str(&text).unwrap(), std::path::Path::new(".")).unwrap();
    for s in ["alice", "bob"] {
        for i in 0..20 {
            let key = format!("{}:{{mig}}:{s}:k{i}", space.prefix);
            space.cmd(&[b"SET", key.as_bytes(), s.as_bytes()]);
            space
                .owners
                .insert(key.into_bytes(), ("mig".into(), s.into()));
        }
    }
    let sample = format!("{}:{{mig}}:alice:k0", space.prefix);
    let slot = scripts_redis(&["keyslot", &sample]).trim().to_string();
    let from: u16 = scripts_redis(&["slot-owner", "--slot", &slot])
        .trim()
        .parse()
        .unwrap();
    let to = cluster_nodes()
        .iter()
        .map(|u| addr(u).1)
        .find(|p| *p != from)
        .unwrap();
    let scope = subject("mig", "alice");
    let case = RedisCase {
        space: &space,
        adapter: target,
        with_index: false,
    };
    let before = case.snapshot();
    let inv = case.adapter.adapter.inventory(&scope).unwrap();
    assert_eq!(inv.count, 20);
    // 30 of the slot's 40 keys move: whatever order they leave in, at least 10 are alice's.
    let line = scripts_redis(&["migrate-slot", &slot, &to.to_string(), "--partial", "30"]);
    assert!(line.contains("state=migrating"), "{line}");
    // The precondition, asked of the source node itself (no redirects followed): some of
    // alice's keys now answer -ASK there.
    let asks = {
        let mut nodes = space.nodes.borrow_mut();
        let source = ("127.0.0.1".to_string(), from);
        (0..20)
            .filter(|i| {
                let key = format!("{}:{{mig}}:alice:k{i}", space.prefix);
                matches!(nodes.conn(&source).unwrap().call(&[b"EXISTS", key.as_bytes()]).unwrap(), Reply::Error(e) if e.starts_with("ASK"))
            })
            .count()
    };
    assert!(
        asks >= 10,
        "only {asks} of alice's keys moved: the test would not exercise ASK"
    );
    let mut erased = 0;
    for batch in inv.locators.chunks(4) {
        erased += case.adapter.adapter.erase_batch(&scope, batch).unwrap();
    }
    assert_eq!(erased, 20, "every key unlinked, on whichever node held it");
    scripts_redis(&["migrate-slot", &slot, &to.to_string(), "--finish"]);
    assert_eq!(
        case.adapter.adapter.verify(&scope, &inv.locators).unwrap(),
        0
    );
    let kept: Vec<Row> = before
        .into_iter()
        .filter(|r| r.owner.1 != "alice")
        .collect();
    assert_eq!(
        case.snapshot(),
        kept,
        "bob's keys are byte-identical, wherever the slot went"
    );
    cleanup(&space);
}

#[test]
fn index_mode_audit_finds_keys_the_index_never_listed() {
    let mut space = Space::new(false);
    space.seed("acme", "alice");
    let scope = subject("acme", "alice");
    let t = space.target("index");
    let inv = t.adapter.inventory(&scope).unwrap();
    t.adapter.erase_batch(&scope, &inv.locators).unwrap();
    assert_eq!(t.adapter.verify(&scope, &inv.locators).unwrap(), 0);
    assert_eq!(t.adapter.audit(&scope).unwrap(), Some(0));
    // A key written without being added to the index: verify cannot see it, the audit does.
    let stray = format!("{}:acme:alice:stray", space.prefix);
    space.cmd(&[b"SET", stray.as_bytes(), b"x"]);
    assert_eq!(t.adapter.verify(&scope, &inv.locators).unwrap(), 0);
    assert_eq!(t.adapter.audit(&scope).unwrap(), Some(1));
    assert_eq!(
        space.target("scan").adapter.audit(&scope).unwrap(),
        None,
        "scan mode's verify is the scan"
    );
    cleanup(&space);
}

/// The index lists keys that are gone (expired, or unlinked by the application without an
/// `SREM`): only the keys that exist are inventoried and erased, and verification agrees. With
/// `pipeline = 2` a standalone server's many-key `EXISTS` and `UNLINK` go in several commands,
/// and the inventory's partial count falls back to one `EXISTS` a key. Both layouts.
#[test]
fn index_members_that_are_gone_are_not_counted() {
    for cluster in [false, true] {
        let mut space = Space::new(cluster);
        space.seed("acme", "alice");
        space.seed("acme", "bob");
        let index = space.index_key("acme", "alice");
        for g in ["gone1", "gone2"] {
            let key = format!("{}:acme:alice:{g}", space.prefix);
            space.cmd(&[b"SADD", index.as_bytes(), key.as_bytes()]);
        }
        let scope = subject("acme", "alice");
        let case = RedisCase {
            space: &space,
            adapter: space.target_with("index", "pipeline = 2"),
            with_index: true,
        };
        let others = || case.others("acme", "alice");
        let before = others();
        let a = case.adapter();
        let inv = a.inventory(&scope).unwrap();
        assert_eq!(
            inv.count, 8,
            "cluster {cluster}: 7 keys and the index set, not the 2 gone members"
        );
        assert_eq!(a.erase_batch(&scope, &inv.locators).unwrap(), 8);
        assert_eq!(a.verify(&scope, &inv.locators).unwrap(), 0);
        assert_eq!(
            others(),
            before,
            "cluster {cluster}: every other key kept, byte for byte"
        );
        assert_eq!(a.inventory(&subject("acme", "bob")).unwrap().count, 8);
        cleanup(&space);
    }
}

/// A writer that bypasses the gate adds a key for the subject after the inventory. The default
/// verify (`verify = "scan"`) scans the keyspace again and counts it; `verify = "frozen"` looks
/// only at the frozen keys, misses it, and leaves it to `lethe verify --audit`.
#[test]
fn a_key_written_after_the_inventory_is_caught_by_the_default_verify_and_by_the_audit() {
    for cluster in [false, true] {
        let mut space = Space::new(cluster);
        space.seed("acme", "alice");
        space.seed("acme", "bob");
        let scope = subject("acme", "alice");
        let default = space.target("scan");
        let frozen = space.target_with("scan", "verify = \"frozen\"");
        // The certificate shows which verification ran (its adapter_version).
        assert_eq!(default.adapter.describe().version, "1");
        assert_eq!(frozen.adapter.describe().version, "1+verify-frozen");
        let inv = default.adapter.inventory(&scope).unwrap();
        assert_eq!(inv.count, 7);
        let late = format!("{}:acme:alice:late", space.prefix);
        space.cmd(&[b"SET", late.as_bytes(), b"written after the freeze"]);
        assert_eq!(
            default.adapter.erase_batch(&scope, &inv.locators).unwrap(),
            7
        );
        assert_eq!(
            default.adapter.verify(&scope, &inv.locators).unwrap(),
            1,
            "the default verify scans and finds the late key"
        );
        assert_eq!(
            default.adapter.audit(&scope).unwrap(),
            None,
            "the default verify is the scan"
        );
        assert_eq!(
            frozen.adapter.verify(&scope, &inv.locators).unwrap(),
            0,
            "verify = \"frozen\" checks the frozen keys only"
        );
        assert_eq!(
            frozen.adapter.audit(&scope).unwrap(),
            Some(1),
            "the audit scans and finds it"
        );
        // A frozen key written again is residue in both.
        let str_key = format!("{}:acme:alice:str", space.prefix);
        space.cmd(&[b"SET", str_key.as_bytes(), b"again"]);
        assert_eq!(frozen.adapter.verify(&scope, &inv.locators).unwrap(), 1);
        assert_eq!(default.adapter.verify(&scope, &inv.locators).unwrap(), 2);
        // With no frozen keys (a standalone `lethe verify`), verify = "frozen" scans too.
        assert_eq!(frozen.adapter.verify(&scope, &[]).unwrap(), 2);
        space.cmd(&[b"UNLINK", late.as_bytes()]);
        space.cmd(&[b"UNLINK", str_key.as_bytes()]);
        assert_eq!(frozen.adapter.verify(&scope, &inv.locators).unwrap(), 0);
        cleanup(&space);
    }
}

#[test]
fn pacing_options_erase_exactly_in_small_pipelines() {
    let mut space = Space::new(false);
    for (t, s) in SUBJECTS {
        space.seed(t, s);
    }
    let case = RedisCase {
        space: &space,
        adapter: space.target_with(
            "scan",
            "scan_pause_ms = 1\npipeline = 2\nverify = \"frozen\"",
        ),
        with_index: false,
    };
    let me = ("acme".to_string(), "a*".to_string());
    let out = conformance::run(&case, &subject("acme", "a*"), &|o| *o == me, 3);
    assert_eq!(out.inventoried, 7);
    cleanup(&space);
}

/// `rediss://`: the conformance suite over TLS, the server's certificate checked against the
/// CA of `tls_ca_file` (scripts/redis tls-start makes a throwaway one).
#[test]
fn tls_scan_and_index_modes_erase_exactly() {
    for mode in ["scan", "index"] {
        let mut space = Space::tls();
        for (t, s) in SUBJECTS {
            space.seed(t, s);
        }
        let case = RedisCase {
            space: &space,
            adapter: space.target(mode),
            with_index: mode == "index",
        };
        let me = ("acme".to_string(), "a?ice".to_string());
        let out = conformance::run(&case, &subject("acme", "a?ice"), &|o| *o == me, 3);
        assert_eq!(out.inventoried, if mode == "index" { 8 } else { 7 });
        cleanup(&space);
    }
}

/// A server whose certificate the configured CA did not sign is refused: the error says so,
/// nothing is read or erased, and nothing falls back to plain TCP. The same without
/// `tls_ca_file` (the system's CAs do not know the throwaway CA), and a plain `redis://` URL
/// against the TLS port gets no answer it could take for Redis's.
#[test]
fn tls_with_the_wrong_ca_is_refused_touching_nothing() {
    let mut space = Space::tls();
    space.seed("acme", "alice");
    let before = space.keys();
    assert_eq!(before.len(), 8);
    let (url, (host, port), dir) = tls_server();
    let scope = subject("acme", "alice");
    let wrong = format!("tls_ca_file = \"{}\"", dir.join("wrong-ca.crt").display());
    for (u, extra) in [
        (url.clone(), wrong.as_str()),
        (url.clone(), ""),
        (format!("redis://{host}:{port}"), ""),
    ] {
        let text = format!(
            "name = \"cache\"\nkind = \"redis\"\nclass = \"cache\"\nurl = \"{u}\"\ndb = 9\ntimeout_ms = 2000\npattern = \"{p}:{{tenant}}:{{subject}}:*\"\n{extra}\n",
            p = space.prefix
        );
        let t = crate::build(1, toml::from_str(&text).unwrap(), std::path::Path::new(".")).unwrap();
        let e = t.adapter.probe().expect_err("refused");
        let msg = e.to_string();
        if u.starts_with("rediss://") {
            assert!(msg.contains("certificate verify failed"), "{msg}");
        }
        assert!(t.adapter.inventory(&scope).is_err(), "{u} {extra}");
        let key = format!("{}:acme:alice:str", space.prefix);
        let real: String = key.bytes().map(|b| format!("{b:02x}")).collect();
        assert!(t
            .adapter
            .erase_batch(&scope, &[(format!("k:{real}"), 1)])
            .is_err());
        assert!(t.adapter.verify(&scope, &[]).is_err());
    }
    assert_eq!(space.keys(), before, "nothing was touched");
    cleanup(&space);
}

/// A read polls the socket for a while before it sleeps (`POLL_BEFORE_SLEEP`). A reply slower
/// than that (a Lua loop of tens of milliseconds) is still read whole, by the blocking read
/// that follows the poll, and the connection stays usable for the next command: plain and TLS.
#[test]
fn a_reply_slower_than_the_read_poll_is_read_whole() {
    for space in [Space::new(false), Space::tls()] {
        let slow: &[u8] = b"local n = 0 for i = 1, 5000000 do n = n + 1 end return n";
        let start = std::time::Instant::now();
        let r = space.cmd(&[b"EVAL", slow, b"0"]);
        let took = start.elapsed();
        assert!(
            took > Duration::from_millis(2),
            "the reply took {took:?}: too fast to outlast the poll, so this test proves nothing"
        );
        assert_eq!(r.int(), Some(5_000_000));
        for _ in 0..3 {
            let r = space.cmd(&[b"ECHO", b"after the slow reply"]);
            assert_eq!(r.bytes(), Some(&b"after the slow reply"[..]));
        }
        cleanup(&space);
    }
}

/// Index sets are keys: a scope whose pattern could reach another scope's index set is refused
/// (nothing touched), under the README's layout (`idx:{tenant}:{subject}`) and under one whose
/// index starts with the tenant (`{tenant}:idx:{subject}`, where a tenant scope reaches only
/// its own index sets).
#[test]
fn a_scope_that_could_reach_other_scopes_index_sets_is_refused() {
    let build_with = |pattern: &str, index: &str| {
        crate::build(
            1,
            toml::from_str(&format!(
                "name = \"c\"\nkind = \"redis\"\nclass = \"cache\"\nurl = \"redis://127.0.0.1:1\"\n\
                 pattern = \"{pattern}\"\nmode = \"index\"\nindex = \"{index}\"\n"
            ))
            .unwrap(),
            std::path::Path::new("."),
        )
        .unwrap()
    };
    let build = |index: &str| build_with("{tenant}:{subject}:*", index);
    let tenant = |t: &str| Scope::Tenant {
        tenant: Tenant::new(t).unwrap(),
    };
    let refused = |r: Result<Applicability, AdapterError>| matches!(r, Err(AdapterError::Inexpressible { ref why, .. }) if why.contains("index sets"));
    let t = build("idx:{tenant}:{subject}");
    assert!(refused(t.adapter.check_scope(&tenant("idx"))));
    assert!(refused(t.adapter.check_scope(&subject("idx", "acme"))));
    for ok in [
        tenant("acme"),
        tenant("id"),
        tenant("idxx"),
        subject("acme", "idx"),
    ] {
        assert!(
            matches!(t.adapter.check_scope(&ok), Ok(Applicability::Applies)),
            "{ok:?}"
        );
    }
    let t = build("{tenant}:idx:{subject}");
    assert!(refused(t.adapter.check_scope(&subject("acme", "idx"))));
    for ok in [
        tenant("acme"),
        subject("acme", "alice"),
        subject("acme", "id"),
    ] {
        assert!(
            matches!(t.adapter.check_scope(&ok), Ok(Applicability::Applies)),
            "{ok:?}"
        );
    }
    // A pattern with a literal prefix: tenant `idx`'s keys (`mem:idx:...`) reach tenant
    // `mem`'s index sets (`mem:idx:alice`), so the scope is refused, not erased across tenants.
    let t = build_with("mem:{tenant}:{subject}:*", "{tenant}:idx:{subject}");
    assert!(refused(t.adapter.check_scope(&tenant("idx"))));
    assert!(refused(t.adapter.check_scope(&subject("idx", "bob"))));
    for ok in [tenant("mem"), subject("mem", "alice"), tenant("acme")] {
        assert!(
            matches!(t.adapter.check_scope(&ok), Ok(Applicability::Applies)),
            "{ok:?}"
        );
    }
}

/// A server error that quotes a command's arguments (Redis quotes an unknown command's first
/// arguments, here a key naming a person) is shown without them, from the real server's reply.
#[test]
fn a_server_error_quoting_a_key_is_shown_without_it() {
    let (_, a) = standalone();
    let auth = Auth {
        username: None,
        password: None,
        db: 9,
        tls: None,
    };
    let mut c = super::resp::Conn::open(&a, &auth, Duration::from_secs(5)).unwrap();
    let Reply::Error(e) = c.call(&[b"LETHEUNKNOWN", b"acme:ROWZQX:mem:1"]).unwrap() else {
        panic!("an unknown command is an error reply");
    };
    assert!(e.contains("ROWZQX"), "the reply quotes the key: {e}");
    let shown = super::resp::shown_error(&e);
    assert!(!shown.contains("ROWZQX"), "{shown}");
    assert!(shown.starts_with("ERR unknown command"), "{shown}");
    assert_eq!(
        super::resp::shown_error("CROSSSLOT Keys in request don't hash to the same slot"),
        "CROSSSLOT Keys in request don't hash to the same slot"
    );
    // Redis 6.2 and KeyDB quote with backticks (their documented reply, not a live server).
    let shown = super::resp::shown_error(
        "ERR unknown command `LETHEUNKNOWN`, with args beginning with: `acme:ROWZQX:mem:1`, ",
    );
    assert_eq!(shown, "ERR unknown command (quoted arguments not shown)");
    let shown = super::resp::shown_error("ERR no such key:\"acme:ROWZQX\"");
    assert_eq!(shown, "ERR no such key (quoted arguments not shown)");
}

/// Throwaway cluster nodes for states the shared cluster must not be put in (a slot with no
/// owner, a primary without slots, a reshard in the middle of a pass): `redis-server`
/// processes on ports 7230-7239, each test its own ports, in a temporary folder; killed and
/// removed on drop.
struct Private {
    ports: Vec<u16>,
    children: Vec<std::process::Child>,
    dir: std::path::PathBuf,
}

impl Private {
    /// One cluster-enabled node per port, joined; `slots[i]` is the slot range node `i` serves
    /// (`None`: a primary without slots). Returns once every node sees every node and all 16384
    /// slots served.
    fn start(ports: &[u16], slots: &[Option<(u16, u16)>]) -> Self {
        let dir =
            std::env::temp_dir().join(format!("lethe-redis-{}-{}", std::process::id(), ports[0]));
        let _ = std::fs::remove_dir_all(&dir);
        let mut me = Private {
            ports: ports.to_vec(),
            children: Vec::new(),
            dir: dir.clone(),
        };
        for p in ports {
            assert!(
                std::net::TcpStream::connect(("127.0.0.1", *p)).is_err(),
                "port {p} is taken: these tests need 7230-7239 free"
            );
            let d = dir.join(p.to_string());
            std::fs::create_dir_all(&d).unwrap();
            let child = std::process::Command::new("redis-server")
                .args(["--port", &p.to_string(), "--bind", "127.0.0.1"])
                .args([
                    "--cluster-enabled",
                    "yes",
                    "--cluster-config-file",
                    "nodes.conf",
                ])
                .args([
                    "--cluster-node-timeout",
                    "5000",
                    "--save",
                    "",
                    "--appendonly",
                    "no",
                ])
                .args(["--cluster-allow-replica-migration", "no"])
                .arg("--dir")
                .arg(&d)
                .stdout(std::process::Stdio::null())
                .stderr(std::process::Stdio::null())
                .spawn()
                .expect("redis-server on PATH");
            me.children.push(child);
        }
        me.wait("every node answers", |m| {
            m.ports.iter().all(|p| m.try_call(*p, &[b"PING"]).is_some())
        });
        for (p, range) in ports.iter().zip(slots) {
            if let Some((lo, hi)) = range {
                me.call(
                    *p,
                    &[
                        b"CLUSTER",
                        b"ADDSLOTSRANGE",
                        lo.to_string().as_bytes(),
                        hi.to_string().as_bytes(),
                    ],
                );
            }
        }
        for p in &ports[1..] {
            me.call(
                *p,
                &[
                    b"CLUSTER",
                    b"MEET",
                    b"127.0.0.1",
                    ports[0].to_string().as_bytes(),
                ],
            );
        }
        let known = format!("cluster_known_nodes:{}", ports.len());
        me.wait("the cluster is formed", |m| {
            m.ports.iter().all(|p| {
                let info = m.info(*p, b"CLUSTER", b"INFO");
                info.contains("cluster_state:ok")
                    && info.contains(&known)
                    && info.contains("cluster_slots_ok:16384")
            })
        });
        me
    }

    /// Polls a condition on the real servers, for at most 30 s.
    fn wait(&self, what: &str, ok: impl Fn(&Self) -> bool) {
        let start = std::time::Instant::now();
        while !ok(self) {
            assert!(
                start.elapsed() < Duration::from_secs(30),
                "{what}: timed out"
            );
            // Waiting for real servers (a gossip round), not a clock a test could control.
            #[allow(clippy::disallowed_methods)]
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    fn try_call(&self, port: u16, args: &[&[u8]]) -> Option<Reply> {
        let auth = Auth {
            username: None,
            password: None,
            db: 0,
            tls: None,
        };
        let mut c =
            super::resp::Conn::open(&("127.0.0.1".into(), port), &auth, Duration::from_secs(5))
                .ok()?;
        c.call(args).ok()
    }

    /// One command to one node, no redirect followed; an error reply fails the test.
    fn call(&self, port: u16, args: &[&[u8]]) -> Reply {
        let r = self.try_call(port, args).expect("the private node answers");
        assert!(!matches!(r, Reply::Error(_)), "{r:?}");
        r
    }

    fn info(&self, port: u16, a: &[u8], b: &[u8]) -> String {
        match self.try_call(port, &[a, b]) {
            Some(Reply::Bulk(Some(t))) => String::from_utf8_lossy(&t).into_owned(),
            _ => String::new(),
        }
    }

    fn urls(&self) -> Vec<String> {
        self.ports
            .iter()
            .map(|p| format!("redis://127.0.0.1:{p}"))
            .collect()
    }
}

impl Drop for Private {
    fn drop(&mut self) {
        for c in &mut self.children {
            let _ = c.kill();
            let _ = c.wait();
        }
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// Error replies that say "later" (`CLUSTERDOWN` here, from a cluster with a slot nobody
/// serves; likewise `TRYAGAIN`, `LOADING`, `MASTERDOWN`) block the job as unavailable, to be
/// retried, instead of failing it; once the slot is served again the erase finishes, every
/// other key kept byte for byte.
#[test]
fn a_cluster_that_is_down_is_unavailable_not_failed() {
    let cluster = Private::start(&[7230], &[Some((0, 16383))]);
    let mut space = Space::private(&cluster);
    space.seed("acme", "alice");
    space.seed("acme", "bob");
    let case = RedisCase {
        space: &space,
        adapter: space.target_with("scan", "verify = \"frozen\""),
        with_index: false,
    };
    let others = || case.others("acme", "alice");
    let before = others();
    let scope = subject("acme", "alice");
    let a = case.adapter();
    let inv = a.inventory(&scope).unwrap();
    assert_eq!(inv.count, 7);
    // One of alice's keys' slot loses its owner: the cluster answers CLUSTERDOWN.
    let key = format!("{}:acme:alice:str", space.prefix);
    let slot = super::resp::slot(key.as_bytes()).to_string();
    cluster.call(7230, &[b"CLUSTER", b"DELSLOTS", slot.as_bytes()]);
    for r in [
        a.erase_batch(&scope, &inv.locators).map(|_| ()),
        a.verify(&scope, &inv.locators).map(|_| ()),
    ] {
        match r {
            Err(e @ AdapterError::Unavailable { .. }) => {
                assert!(e.is_retryable());
                let msg = e.to_string();
                assert!(
                    msg.contains("CLUSTERDOWN") && !msg.contains("alice"),
                    "{msg}"
                );
            }
            other => panic!("expected Unavailable, got {other:?}"),
        }
    }
    cluster.call(7230, &[b"CLUSTER", b"ADDSLOTS", slot.as_bytes()]);
    cluster.wait("the slot is served again", |c| {
        c.info(7230, b"CLUSTER", b"INFO")
            .contains("cluster_state:ok")
    });
    assert_eq!(
        a.erase_batch(&scope, &inv.locators).unwrap(),
        7,
        "a cluster that is down refuses every command: nothing went before"
    );
    assert_eq!(a.verify(&scope, &inv.locators).unwrap(), 0);
    assert_eq!(others(), before, "every other key kept, byte for byte");
}

/// Index mode: a writer around the gate writes a key for alice and lists it in her index after
/// the inventory. The erase takes only the inventoried keys out of the set, so the set stays,
/// listing the late key, and verify counts both as residue (the job blocks, and a rerun's
/// inventory erases them); where it unlinked the whole set, verify saw nothing and certified.
/// Both layouts, in batches of 3; every other key kept byte for byte.
#[test]
fn a_key_listed_in_the_index_after_the_inventory_is_residue() {
    for cluster in [false, true] {
        let mut space = Space::new(cluster);
        space.seed("acme", "alice");
        space.seed("acme", "bob");
        let late = format!("{}:acme:alice:late", space.prefix);
        let alice = ("acme".to_string(), "alice".to_string());
        space
            .owners
            .insert(late.clone().into_bytes(), alice.clone());
        let case = RedisCase {
            space: &space,
            adapter: space.target("index"),
            with_index: true,
        };
        let others = || case.others("acme", "alice");
        let before = others();
        let scope = subject("acme", "alice");
        let a = case.adapter();
        let inv = a.inventory(&scope).unwrap();
        assert_eq!(inv.count, 8);
        let index = space.index_key("acme", "alice");
        space.cmd(&[b"SET", late.as_bytes(), b"written after the freeze"]);
        space.cmd(&[b"SADD", index.as_bytes(), late.as_bytes()]);
        let erased: u64 = inv
            .locators
            .chunks(3)
            .map(|b| a.erase_batch(&scope, b).unwrap())
            .sum();
        assert_eq!(erased, 7, "cluster {cluster}: the keys; the set stays");
        assert_eq!(
            a.verify(&scope, &inv.locators).unwrap(),
            2,
            "cluster {cluster}: the late key and the set that lists it"
        );
        let members = space.cmd(&[b"SMEMBERS", index.as_bytes()]);
        assert_eq!(
            members.array().unwrap().to_vec(),
            vec![Reply::Bulk(Some(late.clone().into_bytes()))]
        );
        assert_eq!(others(), before, "cluster {cluster}: others kept");
        // The rerun's inventory: the late key and the set, then nothing.
        let again = a.inventory(&scope).unwrap();
        assert_eq!(again.count, 2);
        assert_eq!(a.erase_batch(&scope, &again.locators).unwrap(), 2);
        assert_eq!(a.verify(&scope, &again.locators).unwrap(), 0);
        assert_eq!(others(), before, "cluster {cluster}: others kept");
        cleanup(&space);
    }
}

/// Index mode, tenant scope: the tenant's keys are scanned, and so are its subjects' index sets
/// (`idx:{acme}:*` here), each re-checked against the exact layout, so they are inventoried,
/// erased and verified too, where they were left behind under a certificate. A key under the
/// index prefix that no expressible subject owns (`idx:{acme}:eu:bob`: the pattern refuses
/// `eu:bob`) and the neighbour tenant's sets stay, byte for byte. Both layouts.
#[test]
fn index_mode_tenant_scope_erases_the_tenants_index_sets() {
    for cluster in [false, true] {
        let mut space = Space::new(cluster);
        for (t, s) in SUBJECTS {
            space.seed(t, s);
        }
        let decoy = space.index_key("acme", "eu:bob");
        space.cmd(&[b"SADD", decoy.as_bytes(), b"x"]);
        let case = RedisCase {
            space: &space,
            adapter: space.target("index"),
            with_index: true,
        };
        let tenant = Scope::Tenant {
            tenant: Tenant::new("acme").unwrap(),
        };
        let out = conformance::run(&case, &tenant, &|o| o.0 == "acme", 5);
        assert_eq!(out.inventoried, 8 * 8, "cluster {cluster}: keys and sets");
        assert_eq!(case.adapter().audit(&tenant).unwrap(), Some(0));
        assert_eq!(space.cmd(&[b"EXISTS", decoy.as_bytes()]).int(), Some(1));
        cleanup(&space);
    }
}

/// A primary that serves no slot can still hold keys: here one of alice's keys was migrated to
/// it and the migration then abandoned (`SETSLOT STABLE`), on a private cluster of two
/// primaries. Every primary `CLUSTER NODES` lists is scanned, so the pass finds the key, where
/// one that saw only slot owners certified it away. No command can reach it (the cluster
/// routes its slot elsewhere), so the target is unavailable, naming the node and the slot,
/// before anything is unlinked: counted, its UNLINK and a frozen verify went to the slot's
/// owner, and the key was certified gone, then readable again once the slot moved there.
/// Once the cluster is fixed (here the slot goes to the node holding the
/// key), the erase takes all 7 and verify finds none. Every other key kept byte for byte.
#[test]
fn a_primary_without_slots_is_scanned_too() {
    let cluster = Private::start(&[7231, 7232], &[Some((0, 16383)), None]);
    let mut space = Space::private(&cluster);
    space.seed("acme", "alice");
    space.seed("acme", "bob");
    let case = RedisCase {
        space: &space,
        adapter: space.target("scan"),
        with_index: false,
    };
    let others = || case.others("acme", "alice");
    let before = others();
    let key = format!("{}:acme:alice:str", space.prefix);
    let slot = super::resp::slot(key.as_bytes()).to_string();
    let id = |p: u16| {
        cluster
            .call(p, &[b"CLUSTER", b"MYID"])
            .bytes()
            .unwrap()
            .to_vec()
    };
    let (from, to) = (id(7231), id(7232));
    cluster.call(
        7232,
        &[b"CLUSTER", b"SETSLOT", slot.as_bytes(), b"IMPORTING", &from],
    );
    cluster.call(
        7231,
        &[b"CLUSTER", b"SETSLOT", slot.as_bytes(), b"MIGRATING", &to],
    );
    cluster.call(
        7231,
        &[
            b"MIGRATE",
            b"127.0.0.1",
            b"7232",
            b"",
            b"0",
            b"5000",
            b"KEYS",
            key.as_bytes(),
        ],
    );
    for p in [7231, 7232] {
        cluster.call(p, &[b"CLUSTER", b"SETSLOT", slot.as_bytes(), b"STABLE"]);
    }
    assert_eq!(
        cluster.call(7232, &[b"DBSIZE"]).int(),
        Some(1),
        "the key sits on the primary without slots"
    );
    let scope = subject("acme", "alice");
    let a = case.adapter();
    let e = a.inventory(&scope).unwrap_err();
    let m = e.to_string();
    assert!(e.is_retryable(), "{m}");
    assert!(
        m.contains("127.0.0.1:7232") && m.contains(&format!("slot {slot}")) && !m.contains(&key),
        "{m}"
    );
    let frozen = space.target_with("scan", "verify = \"frozen\"");
    assert!(
        frozen.adapter.inventory(&scope).is_err(),
        "whatever the verify"
    );
    assert_eq!(others(), before, "nothing touched");
    // One fix `redis-cli --cluster fix` may make: the slot goes to the node holding its key
    // (no other key of the fixture is in it).
    for p in [7231, 7232] {
        cluster.call(p, &[b"CLUSTER", b"SETSLOT", slot.as_bytes(), b"NODE", &to]);
    }
    let inv = a.inventory(&scope).unwrap();
    assert_eq!(inv.count, 7);
    assert_eq!(a.erase_batch(&scope, &inv.locators).unwrap(), 7);
    assert_eq!(a.verify(&scope, &inv.locators).unwrap(), 0);
    assert_eq!(cluster.call(7232, &[b"DBSIZE"]).int(), Some(0));
    assert_eq!(others(), before, "every other key kept, byte for byte");
}

/// A slot moves during the inventory's keyspace pass, from the last primary (not yet scanned)
/// to the first (already scanned), on a private three-primary cluster: alice's key in it was
/// on neither node when each was scanned. The pass reads the topology before and after and
/// passes again, so the inventory counts the key, and `verify = "frozen"` (which looks only at
/// the frozen keys) has it to check; where one pass was taken as complete, the key stayed
/// under a certificate. While a slot is left migrating, a pass cannot be complete: after a few
/// tries the target is unavailable (retryable). Every other key kept byte for byte.
#[test]
fn a_slot_moved_during_the_pass_makes_it_pass_again() {
    let ports = [7233, 7234, 7235];
    let cluster = Private::start(
        &ports,
        &[Some((0, 5460)), Some((5461, 10922)), Some((10923, 16383))],
    );
    let mut space = Space::private(&cluster);
    let mut alice = Vec::new();
    for i in 0..20 {
        let key = format!("{}:acme:alice:k{i}", space.prefix);
        space.cmd(&[b"SET", key.as_bytes(), b"alice's"]);
        space
            .owners
            .insert(key.clone().into_bytes(), ("acme".into(), "alice".into()));
        alice.push(key);
    }
    // Filler keys of another subject make each node's pass last about a second.
    let mut pipe: Vec<Vec<u8>> = Vec::new();
    for i in 0..1500 {
        let key = format!("{}:acme:bob:f{i}", space.prefix);
        space
            .owners
            .insert(key.clone().into_bytes(), ("acme".into(), "bob".into()));
        pipe.push(key.into_bytes());
    }
    for k in &pipe {
        space.cmd(&[b"SET", k, b"bob's"]);
    }
    let key = alice
        .iter()
        .find(|k| super::resp::slot(k.as_bytes()) > 10922)
        .expect("one of alice's keys on the last primary")
        .clone();
    let slot = super::resp::slot(key.as_bytes()).to_string();
    let case = RedisCase {
        space: &space,
        adapter: space.target_with("scan", "verify = \"frozen\"\nscan_pause_ms = 10"),
        with_index: false,
    };
    let others = || case.others("acme", "alice");
    let before = others();
    for p in [7234, 7235] {
        cluster.call(p, &[b"CONFIG", b"RESETSTAT"]);
    }
    let scope = subject("acme", "alice");
    let inv = std::thread::scope(|s| {
        let mover = s.spawn(|| {
            // Once the pass is on the middle node, the first is done and the last is not.
            cluster.wait("the pass reaches the middle node", |c| {
                c.info(7234, b"INFO", b"commandstats")
                    .contains("cmdstat_scan:")
            });
            let id = |p: u16| {
                cluster
                    .call(p, &[b"CLUSTER", b"MYID"])
                    .bytes()
                    .unwrap()
                    .to_vec()
            };
            let (to, from) = (id(7233), id(7235));
            let s = slot.as_bytes();
            cluster.call(7233, &[b"CLUSTER", b"SETSLOT", s, b"IMPORTING", &from]);
            cluster.call(7235, &[b"CLUSTER", b"SETSLOT", s, b"MIGRATING", &to]);
            let keys = cluster.call(7235, &[b"CLUSTER", b"GETKEYSINSLOT", s, b"1000"]);
            let keys: Vec<Vec<u8>> = keys
                .array()
                .unwrap()
                .iter()
                .map(|k| k.bytes().unwrap().to_vec())
                .collect();
            let mut migrate: Vec<&[u8]> = vec![
                b"MIGRATE",
                b"127.0.0.1",
                b"7233",
                b"",
                b"0",
                b"5000",
                b"KEYS",
            ];
            migrate.extend(keys.iter().map(Vec::as_slice));
            cluster.call(7235, &migrate);
            for p in [7233, 7235, 7234] {
                cluster.call(p, &[b"CLUSTER", b"SETSLOT", s, b"NODE", &to]);
            }
            assert_eq!(
                cluster
                    .call(7235, &[b"INFO", b"commandstats"])
                    .bytes()
                    .map(|t| String::from_utf8_lossy(t).contains("cmdstat_scan:")),
                Some(false),
                "the slot left the last node before the pass reached it"
            );
        });
        let inv = case.adapter().inventory(&scope);
        mover.join().unwrap();
        inv
    })
    .unwrap();
    assert_eq!(inv.count, 20, "the key whose slot moved is counted");
    let a = case.adapter();
    assert_eq!(a.erase_batch(&scope, &inv.locators).unwrap(), 20);
    assert_eq!(a.verify(&scope, &inv.locators).unwrap(), 0);
    assert_eq!(
        cluster.call(7233, &[b"EXISTS", key.as_bytes()]).int(),
        Some(0)
    );
    assert_eq!(others(), before, "every other key kept, byte for byte");
    // A slot left migrating: no pass can be complete, so the target is unavailable.
    let id = |p: u16| {
        cluster
            .call(p, &[b"CLUSTER", b"MYID"])
            .bytes()
            .unwrap()
            .to_vec()
    };
    let s = b"100";
    cluster.call(7234, &[b"CLUSTER", b"SETSLOT", s, b"IMPORTING", &id(7233)]);
    match a.inventory(&scope) {
        Err(e @ AdapterError::Unavailable { .. }) => {
            assert!(e.to_string().contains("migrating"), "{e}")
        }
        other => panic!("expected Unavailable, got {other:?}"),
    }
    cluster.call(7234, &[b"CLUSTER", b"SETSLOT", s, b"STABLE"]);
    assert_eq!(a.inventory(&scope).unwrap().count, 0);
}

/// An erase waits until every replica of each primary it wrote to has acknowledged it
/// (`WAIT`): a replica that missed the UNLINKs could be promoted after COMPLETE and serve the
/// keys again (7 of 20 keys came back after a failover, shown live). On a
/// private cluster of one primary and its replica: with the replica answering, the erase
/// completes; with it stopped, the step is unavailable (retryable); once it runs again, the same
/// step completes (the connection's UNLINKs are acknowledged) and the replica holds none of the
/// keys. Every other key kept byte for byte.
#[test]
fn an_erase_waits_for_every_replica_and_is_unavailable_while_one_lags() {
    let cluster = Private::start(&[7236, 7237], &[Some((0, 16383)), None]);
    let primary_id = cluster
        .call(7236, &[b"CLUSTER", b"MYID"])
        .bytes()
        .unwrap()
        .to_vec();
    cluster.call(7237, &[b"CLUSTER", b"REPLICATE", &primary_id]);
    let deadline = std::time::Instant::now() + Duration::from_secs(30);
    while !cluster
        .info(7236, b"INFO", b"replication")
        .contains("state=online")
    {
        assert!(
            std::time::Instant::now() < deadline,
            "the replica never came online"
        );
        std::thread::yield_now();
    }
    let mut space = Space::private(&cluster);
    space.seed("acme", "alice");
    space.seed("acme", "bob");
    space.seed("acme", "carol");
    let case = RedisCase {
        space: &space,
        adapter: space.target("scan"),
        with_index: false,
    };
    let a = case.adapter();
    let carol_before = case.others("acme", "alice");
    // The replica answers: the erase completes.
    let alice = subject("acme", "alice");
    let inv = a.inventory(&alice).unwrap();
    assert_eq!(a.erase_batch(&alice, &inv.locators).unwrap(), inv.count);
    assert_eq!(a.verify(&alice, &inv.locators).unwrap(), 0);
    // The replica stops answering: the step is unavailable, not done.
    let replica = cluster.children[1].id().to_string();
    let signal = |s: &str| {
        assert!(std::process::Command::new("kill")
            .args([s, &replica])
            .status()
            .unwrap()
            .success())
    };
    let bob = subject("acme", "bob");
    let inv = a.inventory(&bob).unwrap();
    assert!(inv.count > 0);
    signal("-STOP");
    let e = a.erase_batch(&bob, &inv.locators).unwrap_err();
    signal("-CONT");
    let m = e.to_string();
    assert!(e.is_retryable(), "{m}");
    assert!(m.contains("0 of the 1 replicas"), "{m}");
    // It runs again: the same step completes, and the replica holds none of bob's keys.
    assert_eq!(a.erase_batch(&bob, &inv.locators).unwrap(), 0);
    assert_eq!(a.verify(&bob, &inv.locators).unwrap(), 0);
    let on_replica = cluster.call(7237, &[b"DBSIZE"]).int().unwrap();
    let on_primary = cluster.call(7236, &[b"DBSIZE"]).int().unwrap();
    assert_eq!(
        on_replica, on_primary,
        "the replica caught up with the erase"
    );
    // Every key that is not alice's or bob's, byte for byte (bob's were erased since).
    let not_bob = |rows: Vec<crate::conformance::Row>| -> Vec<crate::conformance::Row> {
        rows.into_iter().filter(|r| r.owner.1 != "bob").collect()
    };
    assert!(
        not_bob(case.others("acme", "alice")) == not_bob(carol_before),
        "every other key kept, byte for byte"
    );
}

/// A batch's inventory and verification in one keyspace pass give, scope by scope, what each
/// scope's own would: with glob and prefix-neighbour identifiers, a tenant scope nesting a
/// subject of the batch, a memory scope (one key, looked up alone), on the standalone server
/// and the cluster, in both modes. After the erase of some, a key written again is residue
/// of its scope only; every other subject's keys are untouched (a fresh snapshot).
#[test]
fn a_batch_reads_each_scope_as_its_own_inventory_and_verify_would() {
    for cluster in [false, true] {
        for mode in ["scan", "index"] {
            let mut space = Space::new(cluster);
            for (t, s) in SUBJECTS {
                space.seed(t, s);
            }
            let target = space.target(mode);
            let a = target.adapter.as_ref();
            let mut scopes: Vec<Scope> = SUBJECTS
                .iter()
                .step_by(2)
                .map(|(t, s)| subject(t, s))
                .collect();
            scopes.push(Scope::Memory {
                tenant: Tenant::new("acme").unwrap(),
                subject: Subject::new("u1").unwrap(),
                memory: MemoryId::new("str").unwrap(),
                version: None,
            });
            if mode == "scan" {
                // A tenant scope, nesting the batch's acmex/alice.
                scopes.push(Scope::Tenant {
                    tenant: Tenant::new("acmex").unwrap(),
                });
            }
            let alone: Vec<_> = scopes.iter().map(|s| a.inventory(s).unwrap()).collect();
            let many: Vec<_> = a
                .inventory_many(&scopes)
                .into_iter()
                .map(Result::unwrap)
                .collect();
            assert_eq!(many, alone, "{mode}, cluster {cluster}");
            assert!(many.iter().all(|i| i.count > 0), "every scope found its keys");
            // Erase the subjects (not the memory or the tenant scope), then verify all.
            let before: Vec<Row> = {
                let case = RedisCase {
                    space: &space,
                    adapter: space.target(mode),
                    with_index: mode == "index",
                };
                case.snapshot()
            };
            let erased: Vec<usize> = (0..scopes.len())
                .filter(|&i| matches!(scopes[i], Scope::Subject { .. }))
                .collect();
            for &i in &erased {
                a.erase_batch(&scopes[i], &many[i].locators).unwrap();
            }
            // One key of the first erased subject written again.
            let (t, s) = SUBJECTS[0];
            let again = format!("{}:{t}:{s}:str", space.prefix);
            space.cmd(&[b"SET", again.as_bytes(), b"again"]);
            let work: Vec<(Scope, Vec<crate::Locator>)> = scopes
                .iter()
                .cloned()
                .zip(many.iter().map(|i| i.locators.clone()))
                .collect();
            let alone: Vec<u64> = work.iter().map(|(s, f)| a.verify(s, f).unwrap()).collect();
            let many_v: Vec<u64> = a
                .verify_many(&work)
                .into_iter()
                .map(Result::unwrap)
                .collect();
            assert_eq!(many_v, alone, "{mode}, cluster {cluster}");
            assert_eq!(many_v[0], 1, "the key written again is residue of its scope");
            for &i in &erased[1..] {
                assert_eq!(many_v[i], 0, "{:?}", scopes[i].kind());
            }
            // Nobody else lost a key: every row not of an erased subject is as it was.
            let erased_owners: Vec<(String, String)> = erased
                .iter()
                .map(|&i| {
                    let s = &scopes[i];
                    (s.tenant().as_str().to_string(), s.subject().unwrap().as_str().to_string())
                })
                .collect();
            let case = RedisCase {
                space: &space,
                adapter: space.target(mode),
                with_index: mode == "index",
            };
            let keep = |rows: Vec<Row>| -> Vec<Row> {
                rows.into_iter()
                    .filter(|r| !erased_owners.contains(&r.owner))
                    .filter(|r| !r.bytes.starts_with(again.as_bytes()))
                    .collect()
            };
            assert_eq!(keep(case.snapshot()), keep(before), "{mode}, cluster {cluster}");
            cleanup(&space);
        }
    }
}
