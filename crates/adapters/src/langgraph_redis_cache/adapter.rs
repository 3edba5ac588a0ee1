//! The node cache's adapter: index sets for what lineage ties to a subject, a keyspace scan
//! for what nothing ties to anyone.

use std::collections::BTreeSet;
use std::sync::{Mutex, MutexGuard};

use lethe_core::Scope;

use crate::redis::adapter::{hex_locator, unhex};
use crate::redis::config::Connection;
use crate::redis::layout::{glob_escape, Template, Values};
use crate::redis::resp::{Addr, Nodes, Reply};
use crate::{
    within_inventory, Adapter, AdapterError, Applicability, Description, Inventory, Locator,
    Settlement,
};

/// What to do with entries no index set lists.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Legacy {
    /// Block the job (`legacy_derived`) while any exist.
    Refuse,
    /// Erase them all with the scope.
    Flush,
    /// Leave them to their TTL; the target is `PENDING_EXPIRY` until the last one expires.
    Expire,
}

impl Legacy {
    fn as_str(self) -> &'static str {
        match self {
            Legacy::Refuse => "refuse",
            Legacy::Flush => "flush",
            Legacy::Expire => "expire",
        }
    }
}

/// Passes over a cluster's keyspace before giving up while its slots move.
const PASSES: u32 = 3;

/// A `langgraph-redis-cache` target.
pub struct NodeCache {
    name: String,
    nodes: Mutex<Nodes>,
    prefix: String,
    index: Template,
    legacy: Legacy,
    scan_count: u32,
}

impl std::fmt::Debug for NodeCache {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("NodeCache")
            .field("name", &self.name)
            .field("legacy", &self.legacy)
            .finish_non_exhaustive()
    }
}

/// The keys a scope's inventory is made of.
struct Found {
    /// Index sets of the scope.
    sets: Vec<Vec<u8>>,
    /// Entries they list that exist.
    entries: BTreeSet<Vec<u8>>,
}

impl NodeCache {
    pub(crate) fn new(
        name: &str,
        c: Connection,
        prefix: String,
        index: Template,
        legacy: Legacy,
        scan_count: u32,
    ) -> Self {
        Self {
            name: name.to_string(),
            nodes: Mutex::new(Nodes::new(c.seeds, c.cluster, c.auth, c.timeout)),
            prefix,
            index,
            legacy,
            scan_count,
        }
    }

    fn lock(&self) -> MutexGuard<'_, Nodes> {
        self.nodes.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn unavailable(&self, why: String) -> AdapterError {
        AdapterError::Unavailable {
            target: self.name.clone(),
            why: crate::redis::resp::shown_error(&why),
        }
    }

    fn failed(&self, why: impl Into<String>) -> AdapterError {
        AdapterError::Failed {
            target: self.name.clone(),
            why: why.into(),
        }
    }

    /// The scope's index set (subject, memory) or the prefix of its tenant's sets.
    fn selection(&self, scope: &Scope) -> Result<Result<String, String>, AdapterError> {
        let inexpressible = |why: String| AdapterError::Inexpressible {
            target: self.name.clone(),
            why,
        };
        match scope {
            Scope::Tenant { tenant } => {
                let v = Values {
                    tenant: tenant.as_str(),
                    subject: None,
                    memory: None,
                };
                self.index
                    .expand(&v, true)
                    .map(Err)
                    .map_err(inexpressible)
            }
            Scope::Subject { tenant, subject } | Scope::Memory { tenant, subject, .. } => {
                let v = Values {
                    tenant: tenant.as_str(),
                    subject: Some(subject.as_str()),
                    memory: None,
                };
                self.index.expand(&v, false).map(Ok).map_err(inexpressible)
            }
        }
    }

    /// Runs one command at `key`'s owner; an error reply is an error.
    fn keyed(&self, nodes: &mut Nodes, key: &[u8], args: &[&[u8]]) -> Result<Reply, AdapterError> {
        match nodes.keyed(key, args).map_err(|e| self.unavailable(e))? {
            Reply::Error(e) => Err(self.failed(format!(
                "Redis answered {} with an error: {}",
                String::from_utf8_lossy(args[0]),
                crate::redis::resp::shown_error(&e)
            ))),
            r => Ok(r),
        }
    }

    fn exists(&self, nodes: &mut Nodes, key: &[u8]) -> Result<bool, AdapterError> {
        Ok(self.keyed(nodes, key, &[b"EXISTS", key])?.int() == Some(1))
    }

    /// `SCAN MATCH prefix*` on every primary, each key re-checked against the exact prefix. On
    /// a cluster the pass counts only if no slot moved during it.
    fn scan(&self, nodes: &mut Nodes, prefix: &str) -> Result<BTreeSet<Vec<u8>>, AdapterError> {
        if !nodes.is_cluster() {
            let all = nodes.primaries().map_err(|e| self.unavailable(e))?;
            return self.pass(nodes, &all, prefix);
        }
        for _ in 0..PASSES {
            let before = nodes.topology().map_err(|e| self.unavailable(e))?;
            if before.is_moving() {
                continue;
            }
            let keys = self.pass(nodes, &before.primaries(), prefix)?;
            if nodes.topology().map_err(|e| self.unavailable(e))? == before {
                return Ok(keys);
            }
        }
        Err(self.unavailable(format!(
            "the cluster's slots moved during each of {PASSES} keyspace passes: retry once the resharding has ended"
        )))
    }

    fn pass(
        &self,
        nodes: &mut Nodes,
        primaries: &[Addr],
        prefix: &str,
    ) -> Result<BTreeSet<Vec<u8>>, AdapterError> {
        let pattern = format!("{}*", glob_escape(prefix));
        let count = self.scan_count.to_string();
        let mut out = BTreeSet::new();
        for node in primaries {
            let mut cursor = b"0".to_vec();
            loop {
                let args: [&[u8]; 6] = [
                    b"SCAN",
                    &cursor,
                    b"MATCH",
                    pattern.as_bytes(),
                    b"COUNT",
                    count.as_bytes(),
                ];
                let reply = nodes.conn(node).and_then(|c| c.call(&args)).map_err(|e| {
                    nodes.forget(node);
                    self.unavailable(e)
                })?;
                let Some([c, Reply::Array(Some(keys))]) = reply.array() else {
                    return Err(self.failed("unexpected SCAN reply"));
                };
                out.extend(
                    keys.iter()
                        .filter_map(Reply::bytes)
                        .filter(|k| k.starts_with(prefix.as_bytes()))
                        .map(<[u8]>::to_vec),
                );
                cursor = c.bytes().unwrap_or(b"0").to_vec();
                if cursor == b"0" {
                    break;
                }
            }
        }
        Ok(out)
    }

    /// Every member of one index set (`SSCAN` pages). A member outside the cache's prefix is
    /// not the cache's to erase: the set is refused.
    fn members(&self, nodes: &mut Nodes, set: &[u8]) -> Result<Vec<Vec<u8>>, AdapterError> {
        let mut out = Vec::new();
        let mut cursor = b"0".to_vec();
        let count = self.scan_count.to_string();
        loop {
            let args: [&[u8]; 5] = [b"SSCAN", set, &cursor, b"COUNT", count.as_bytes()];
            let reply = self.keyed(nodes, set, &args)?;
            let Some([c, Reply::Array(Some(page))]) = reply.array() else {
                return Err(self.failed("unexpected SSCAN reply"));
            };
            for m in page.iter().filter_map(Reply::bytes) {
                if !m.starts_with(self.prefix.as_bytes()) {
                    return Err(self.failed(format!(
                        "an index set lists a key outside the cache's prefix {}: it was not written by this cache; nothing is erased",
                        self.prefix
                    )));
                }
                out.push(m.to_vec());
            }
            cursor = c.bytes().unwrap_or(b"0").to_vec();
            if cursor == b"0" {
                return Ok(out);
            }
        }
    }

    /// The scope's index sets and the entries they list that exist.
    fn found(&self, nodes: &mut Nodes, scope: &Scope) -> Result<Found, AdapterError> {
        let sets: Vec<Vec<u8>> = match self.selection(scope)? {
            Ok(set) => vec![set.into_bytes()],
            Err(tenant_prefix) => {
                let Scope::Tenant { tenant } = scope else {
                    unreachable!("only a tenant scope selects by prefix")
                };
                // Each set re-checked against the exact layout: a subject is read out of the
                // key and expanded again.
                self.scan(nodes, &tenant_prefix)?
                    .into_iter()
                    .filter(|k| {
                        let Ok(k) = std::str::from_utf8(k) else {
                            return false;
                        };
                        self.index.subject_in(tenant.as_str(), k).is_some_and(|s| {
                            let v = Values {
                                tenant: tenant.as_str(),
                                subject: Some(s),
                                memory: None,
                            };
                            self.index.expand(&v, false).is_ok_and(|e| e == k)
                        })
                    })
                    .collect()
            }
        };
        let mut entries = BTreeSet::new();
        for set in &sets {
            for m in self.members(nodes, set)? {
                if self.exists(nodes, &m)? {
                    entries.insert(m);
                }
            }
        }
        Ok(Found { sets, entries })
    }

    /// Entries under the prefix that no index set of any tenant lists.
    fn legacy_entries(&self, nodes: &mut Nodes) -> Result<BTreeSet<Vec<u8>>, AdapterError> {
        let mut keys = self.scan(nodes, &self.prefix)?;
        if keys.is_empty() {
            return Ok(keys);
        }
        for set in self.scan(nodes, self.index.literal_prefix())? {
            let kind = self.keyed(nodes, &set, &[b"TYPE", &set])?;
            if !matches!(kind, Reply::Status(ref t) if t == "set") {
                continue;
            }
            for m in self.members(nodes, &set)? {
                keys.remove(&m);
            }
        }
        Ok(keys)
    }

    /// Legacy entries left to their TTL: `x:<last expiry ms>:<entries>`. An entry without a
    /// TTL would never go: refused.
    fn expiry_locator(
        &self,
        nodes: &mut Nodes,
        legacy: &BTreeSet<Vec<u8>>,
    ) -> Result<Option<String>, AdapterError> {
        let (mut last, mut forever) = (0_i64, 0_u64);
        for k in legacy {
            // Redis's own clock (PEXPIRETIME, absolute ms): no local clock is read.
            match self.keyed(nodes, k, &[b"PEXPIRETIME", k])?.int() {
                Some(-1) => forever += 1,
                Some(at) if at > 0 => last = last.max(at),
                _ => {} // gone meanwhile
            }
        }
        if forever > 0 {
            return Err(AdapterError::LegacyDerived {
                target: self.name.clone(),
                count: legacy.len() as u64,
                why: format!("is `expire`, but {forever} of them have no TTL and never expire"),
            });
        }
        Ok((last > 0).then(|| format!("x:{last}:{}", legacy.len())))
    }
}

impl Adapter for NodeCache {
    fn describe(&self) -> Description {
        Description {
            kind: crate::Kind::LanggraphRedisCache,
            version: "1",
            capabilities: vec![
                "scope:subject",
                "scope:tenant",
                "scope:memory-as-subject",
                "lineage:index-set",
                match self.legacy {
                    Legacy::Refuse => "legacy:refuse",
                    Legacy::Flush => "legacy:flush",
                    Legacy::Expire => "legacy:expire",
                },
                "cluster:every-primary",
            ],
        }
    }

    fn check_scope(&self, scope: &Scope) -> Result<Applicability, AdapterError> {
        self.selection(scope).map(|_| Applicability::Applies)
    }

    fn takes_lineage(&self) -> bool {
        true
    }

    /// A recorded artifact is a cache key under the prefix (`langgraph:cache:<ns>:<hash>`):
    /// frozen as an indexed entry (`k:`), one row, while it exists. A key outside the prefix
    /// is not this cache's, and is refused rather than erased.
    fn artifact(&self, _scope: &Scope, locator: &str) -> Result<Option<Locator>, AdapterError> {
        if !locator.starts_with(&self.prefix) || locator.len() == self.prefix.len() {
            return Err(self.failed(format!(
                "a lineage edge names a key outside the cache's prefix {}: nothing is erased",
                self.prefix
            )));
        }
        let mut nodes = self.lock();
        Ok(self
            .exists(&mut nodes, locator.as_bytes())?
            .then(|| (hex_locator("k:", locator.as_bytes()), 1)))
    }

    /// The database, the prefix and the index layout; not `legacy`, which an operator changes
    /// to resume a job blocked on `legacy_derived`.
    fn place(&self) -> String {
        let nodes = self.lock();
        let db = match nodes.is_cluster() {
            true => "cluster".to_string(),
            false => nodes.db().to_string(),
        };
        format!("langgraph-redis-cache:{db}:{} index:{}", self.prefix, self.index.text())
    }

    fn probe(&self) -> Result<(), AdapterError> {
        let mut nodes = self.lock();
        for node in nodes.primaries().map_err(|e| self.unavailable(e))? {
            let r = nodes
                .conn(&node)
                .and_then(|c| c.call(&[b"PING"]))
                .map_err(|e| {
                    nodes.forget(&node);
                    self.unavailable(e)
                })?;
            if let Reply::Error(e) = r {
                return Err(self.failed(format!("PING: {}", crate::redis::resp::shown_error(&e))));
            }
        }
        Ok(())
    }

    fn inventory(&self, scope: &Scope) -> Result<Inventory, AdapterError> {
        self.inventory_owned(scope, &[])
    }

    /// Keys recorded by lineage (`recorded`, every subject's) have an owner: they are not
    /// legacy, and the engine adds the scope's own among them to the inventory.
    fn inventory_owned(&self, scope: &Scope, recorded: &[String]) -> Result<Inventory, AdapterError> {
        let mut nodes = self.lock();
        let found = self.found(&mut nodes, scope)?;
        let mut locators: Vec<Locator> = found
            .entries
            .iter()
            .map(|k| (hex_locator("k:", k), 1))
            .collect();
        for set in &found.sets {
            if self.exists(&mut nodes, set)? {
                locators.push((hex_locator("z:", set), 1));
            }
        }
        let mut legacy = self.legacy_entries(&mut nodes)?;
        for r in recorded {
            legacy.remove(r.as_bytes());
        }
        if !legacy.is_empty() {
            match self.legacy {
                Legacy::Refuse => {
                    return Err(AdapterError::LegacyDerived {
                        target: self.name.clone(),
                        count: legacy.len() as u64,
                        why: "is `refuse` (the default)".into(),
                    })
                }
                Legacy::Flush => locators.extend(legacy.iter().map(|k| (hex_locator("l:", k), 1))),
                Legacy::Expire => locators.extend(
                    self.expiry_locator(&mut nodes, &legacy)?
                        .map(|x| (x, 0)),
                ),
            }
        }
        Ok(Inventory::from_locators(locators))
    }

    fn erase_batch(&self, _scope: &Scope, batch: &[Locator]) -> Result<u64, AdapterError> {
        let mut nodes = self.lock();
        let mut erased = 0;
        for (loc, _) in batch {
            let (kind, rest) = loc.split_at(loc.len().min(2));
            let key = match kind {
                "k:" | "l:" | "z:" => unhex(rest)
                    .ok_or_else(|| self.failed("a frozen locator is not hex: the journal was edited"))?,
                "x:" => continue,
                _ => return Err(self.failed("a frozen locator of an unknown kind: the journal was edited")),
            };
            // Only keys of this cache and of its index layout are ever unlinked.
            let ours = match kind {
                "z:" => key.starts_with(self.index.literal_prefix().as_bytes()),
                _ => key.starts_with(self.prefix.as_bytes()),
            };
            if !ours {
                return Err(self.failed("a frozen locator names a key outside this cache: the journal was edited"));
            }
            if kind == "z:" {
                erased += self.finish_set(&mut nodes, &key)?;
            } else {
                erased += self.keyed(&mut nodes, &key, &[b"UNLINK", &key])?.int().unwrap_or(0) as u64;
            }
        }
        within_inventory(&self.name, batch.iter().map(|(_, n)| n).sum(), erased)?;
        Ok(erased)
    }

    fn verify(&self, scope: &Scope, frozen: &[Locator]) -> Result<u64, AdapterError> {
        let mut nodes = self.lock();
        let mut left = BTreeSet::new();
        for (loc, _) in frozen {
            if let Some(k) = loc
                .strip_prefix("k:")
                .or_else(|| loc.strip_prefix("l:"))
                .or_else(|| loc.strip_prefix("z:"))
                .and_then(unhex)
            {
                if self.exists(&mut nodes, &k)? {
                    left.insert(k);
                }
            }
        }
        // What the scope's sets list now: an entry indexed after the inventory counts too.
        let found = self.found(&mut nodes, scope)?;
        left.extend(found.entries);
        for set in found.sets {
            if self.exists(&mut nodes, &set)? {
                left.insert(set);
            }
        }
        Ok(left.len() as u64)
    }

    fn settlement(&self, frozen: &[Locator]) -> Settlement {
        let flushed = frozen.iter().filter(|(l, _)| l.starts_with("l:")).count() as u64;
        let expiring = frozen.iter().find_map(|(l, _)| {
            let (at, n) = l.strip_prefix("x:")?.split_once(':')?;
            Some((at.parse::<i64>().ok()?, n.parse::<u64>().ok()?))
        });
        match expiring {
            Some((at_ms, n)) => Settlement {
                expires: time::OffsetDateTime::from_unix_timestamp(at_ms.div_euclid(1000))
                    .ok()
                    .map(|t| t.date()),
                legacy: Some((Legacy::Expire.as_str(), n)),
            },
            None => Settlement {
                expires: None,
                legacy: Some((self.legacy.as_str(), flushed)),
            },
        }
    }
}

impl NodeCache {
    /// An index set's erase: members already gone are removed from it, and the set is unlinked
    /// once it lists nothing. A member written after the inventory keeps it (verify counts
    /// both). 1 if the set went.
    fn finish_set(&self, nodes: &mut Nodes, set: &[u8]) -> Result<u64, AdapterError> {
        if !self.exists(nodes, set)? {
            return Ok(0);
        }
        for m in self.members(nodes, set)? {
            if !self.exists(nodes, &m)? {
                // Removing the last member removes the set: Redis keeps no empty set.
                self.keyed(nodes, set, &[b"SREM", set, &m])?;
            }
        }
        if self.keyed(nodes, set, &[b"SCARD", set])?.int() == Some(0) {
            self.keyed(nodes, set, &[b"UNLINK", set])?;
        }
        Ok(u64::from(!self.exists(nodes, set)?))
    }
}
