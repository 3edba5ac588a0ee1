//! The Redis adapter itself.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::sync::{Mutex, MutexGuard};
use std::time::Duration;

use lethe_core::Scope;

use super::layout::{glob_escape, prefixes_overlap, Template, Values};
use super::resp::{
    is_transient, shown_error, slot, Addr, Auth, Nodes, Redirect, Reply, BAD_AUTH, BAD_DB,
    NOT_A_CLUSTER,
};
use crate::{Adapter, AdapterError, Applicability, Description, Inventory, Locator};

/// How a subject's keys are found.
#[derive(Debug)]
pub(crate) enum Mode {
    /// `SCAN MATCH` on every primary.
    Scan,
    /// A per-subject set lists the keys.
    Index(Template),
}

/// What scan mode's `verify` checks after the erase.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Verify {
    /// A second full `SCAN MATCH` on every primary, plus the frozen keys: finds keys written
    /// for the subject after the inventory by a writer that bypasses the gate. The default.
    Scan,
    /// Only the frozen keys (pipelined `EXISTS` per node): one keyspace pass per job instead of
    /// two. A key written after the inventory is found only by a standalone `lethe verify`
    /// (no frozen keys: it scans) or by `--audit`.
    Frozen,
}

/// How scan mode paces itself, so that other clients of the same Redis keep their latency.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Pacing {
    /// `COUNT` of each `SCAN` call: how long one call holds Redis's single thread.
    pub(crate) scan_count: u32,
    /// A pause after each `SCAN` page, leaving Redis to other clients.
    pub(crate) scan_pause: Duration,
    /// At most this many `UNLINK`/`EXISTS` commands in one pipeline.
    pub(crate) pipeline: usize,
}

/// A `redis` target.
pub struct Redis {
    name: String,
    nodes: Mutex<Nodes>,
    pattern: Template,
    mode: Mode,
    memory: Option<Template>,
    verify: Verify,
    pacing: Pacing,
    /// Locators per `erase_batch` call, each batch journaled after it (config `batch_size`).
    batch_size: usize,
    /// How long an erase waits for replicas to acknowledge it (`WAIT`): half the connection's
    /// read timeout, so the answer comes before the read gives up.
    wait: Duration,
}

impl std::fmt::Debug for Redis {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Redis")
            .field("name", &self.name)
            .field("mode", &self.mode)
            .finish()
    }
}

const KEY: &str = "k:";
/// `COUNT` of each `SSCAN` of an index set.
const INDEX_PAGE: u32 = 1000;
const INDEX: &str = "z:";
/// Keyspace passes on a cluster before a topology that keeps moving makes the target
/// unavailable, and the wait after the first (twice as long after the second, ...).
const PASSES: u32 = 6;
const RESHARD_WAIT: Duration = Duration::from_millis(250);

/// What a scope names in this layout.
enum Selection {
    /// Keys starting with this exact prefix (found by scan, or listed in `index`).
    Prefix {
        prefix: String,
        index: Option<String>,
        /// A tenant scope in index mode: its subjects' index sets are keys starting with this
        /// prefix (`idx:acme:` for `idx:{tenant}:{subject}`), each re-checked against the
        /// exact layout (`Redis::is_index_set`). `None` where the pattern's prefix holds them.
        index_sets: Option<String>,
    },
    /// One key.
    Key { key: String, index: Option<String> },
}

impl Redis {
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn new(
        name: &str,
        seeds: Vec<Addr>,
        cluster: bool,
        auth: Auth,
        timeout: Duration,
        pattern: Template,
        mode: Mode,
        memory: Option<Template>,
        verify: Verify,
        pacing: Pacing,
        batch_size: usize,
    ) -> Self {
        Self {
            name: name.to_string(),
            nodes: Mutex::new(Nodes::new(seeds, cluster, auth, timeout)),
            pattern,
            mode,
            memory,
            verify,
            pacing,
            batch_size,
            wait: (timeout / 2).max(Duration::from_millis(1)),
        }
    }

    fn lock(&self) -> MutexGuard<'_, Nodes> {
        self.nodes.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// A driver error: unreachable nodes and broken connections are worth retrying.
    fn unavailable(&self, why: String) -> AdapterError {
        // The errors of the configuration that retrying cannot mend: a cluster's seed without
        // cluster support, a `db` the server does not have, a wrong password (newcomer review:
        // `db = 99` and WRONGPASS were reported unavailable, and a job would have blocked with
        // the subject fenced).
        if why == NOT_A_CLUSTER || why.starts_with(BAD_DB) || why.starts_with(BAD_AUTH) {
            return self.failed(why);
        }
        AdapterError::Unavailable {
            target: self.name.clone(),
            why,
        }
    }

    fn failed(&self, why: impl Into<String>) -> AdapterError {
        AdapterError::Failed {
            target: self.name.clone(),
            why: why.into(),
        }
    }

    /// A server's error reply to `what`: retryable when the server says it will answer later
    /// (a cluster down or resharding, a server loading), a failure otherwise.
    fn answered(&self, what: &str, e: &str) -> AdapterError {
        let why = format!("{what} answered: {}", shown_error(e));
        // A replica (or `replica-read-only`) refuses writes with READONLY.
        if e.starts_with("READONLY") {
            return AdapterError::ReadOnly {
                target: self.name.clone(),
                why,
            };
        }
        if is_transient(e) {
            self.unavailable(why)
        } else {
            self.failed(why)
        }
    }

    fn selection(&self, scope: &Scope) -> Result<Selection, AdapterError> {
        let inexpressible = |why: String| AdapterError::Inexpressible {
            target: self.name.clone(),
            why,
        };
        let subject = scope.subject().map(|s| s.as_str());
        let v = Values {
            tenant: scope.tenant().as_str(),
            subject,
            memory: None,
        };
        let index = match (&self.mode, subject) {
            (Mode::Index(t), Some(_)) => Some(t.expand(&v, false).map_err(inexpressible)?),
            _ => None,
        };
        // Index sets are keys too. If this scope's pattern can reach another scope's index set
        // (`erase --tenant idx` under `{tenant}:{subject}:*` with index `idx:{tenant}:{subject}`
        // matches `idx:acme:alice`), a key there could be data or an index: refuse the scope.
        if let Mode::Index(t) = &self.mode {
            let reach = self
                .pattern
                .expand(&v, subject.is_none())
                .map_err(inexpressible)?;
            let overlaps = if t.literal_prefix().is_empty() {
                // Index sets start with a tenant: this scope's keys reach the sets of a tenant
                // whose id begins them (under `mem:{tenant}:{subject}:*` with index
                // `{tenant}:idx:{subject}`, tenant `idx`'s `mem:idx:` reaches tenant `mem`'s
                // `mem:idx:alice`). A tenant's id holds no separator, so it is one of this
                // prefix's own prefixes; its sets are its own only for a tenant scope.
                let tenant = scope.tenant().as_str();
                reach
                    .char_indices()
                    .map(|(i, _)| i)
                    .skip(1)
                    .chain([reach.len()])
                    .any(|i| {
                        let other = &reach[..i];
                        let own = other == tenant && subject.is_none();
                        let sets = Values {
                            tenant: other,
                            subject: None,
                            memory: None,
                        };
                        !own && lethe_core::Tenant::new(other).is_ok()
                            && t.expand(&sets, true)
                                .is_ok_and(|o| prefixes_overlap(&reach, &o))
                    })
            } else {
                prefixes_overlap(&reach, t.literal_prefix())
            };
            if overlaps {
                return Err(inexpressible(
                    "this scope's keys and other scopes' index sets share a prefix under the \
                     configured pattern and index, so a key could be either: give the index a \
                     prefix the pattern cannot produce"
                        .into(),
                ));
            }
        }
        Ok(match scope {
            Scope::Subject { .. } => Selection::Prefix {
                prefix: self.pattern.expand(&v, false).map_err(inexpressible)?,
                index,
                index_sets: None,
            },
            Scope::Tenant { .. } => {
                let prefix = self.pattern.expand(&v, true).map_err(inexpressible)?;
                let index_sets = match &self.mode {
                    Mode::Index(t) => Some(t.expand(&v, true).map_err(inexpressible)?)
                        .filter(|sets| !sets.starts_with(&prefix)),
                    Mode::Scan => None,
                };
                Selection::Prefix {
                    prefix,
                    index: None,
                    index_sets,
                }
            }
            Scope::Memory { memory, .. } => {
                let t = self.memory.as_ref().ok_or_else(|| {
                    inexpressible("no `memory` key template is configured".into())
                })?;
                // The subject's own layout must be expressible too: it is what the key is
                // re-checked against.
                let prefix = self.pattern.expand(&v, false).map_err(inexpressible)?;
                let key = t
                    .expand(
                        &Values {
                            memory: Some(memory.as_str()),
                            ..v
                        },
                        false,
                    )
                    .map_err(inexpressible)?;
                if !key.starts_with(&prefix) {
                    return Err(inexpressible(
                        "the memory key template does not lie inside the subject's pattern".into(),
                    ));
                }
                Selection::Key { key, index }
            }
        })
    }

    /// One keyspace pass serving every scope of a batch that a pass selects (a prefix without
    /// an index: scan mode's subjects and tenants): `Some(Ok(keys))` with, per scope, its keys
    /// or `None` for a scope the pass does not serve (a memory's one key, an index, an
    /// inexpressible scope). `None` when fewer than two scopes would share the pass.
    #[allow(clippy::type_complexity)]
    fn shared_pass(
        &self,
        scopes: &[Scope],
    ) -> Option<Result<Vec<Option<BTreeSet<Vec<u8>>>>, AdapterError>> {
        let served: Vec<Option<String>> = scopes
            .iter()
            .map(|s| match self.selection(s) {
                Ok(Selection::Prefix {
                    prefix,
                    index: None,
                    index_sets: None,
                }) => Some(prefix),
                _ => None,
            })
            .collect();
        let prefixes: Vec<String> = served.iter().flatten().cloned().collect();
        if prefixes.len() < 2 {
            return None;
        }
        let mut nodes = self.lock();
        Some(self.scan_many(&mut nodes, &prefixes).map(|found| {
            let mut found = found.into_iter();
            served
                .iter()
                .map(|p| p.as_ref().and_then(|_| found.next()))
                .collect()
        }))
    }

    /// Whether `key` is exactly the index set of one of `tenant`'s subjects: it reads as the
    /// index layout for a subject that the pattern and the index can both express, and that
    /// subject's set is this very key.
    fn is_index_set(&self, tenant: &str, key: &[u8]) -> bool {
        let (Mode::Index(t), Ok(key)) = (&self.mode, std::str::from_utf8(key)) else {
            return false;
        };
        let Some(subject) = t.subject_in(tenant, key) else {
            return false;
        };
        let v = Values {
            tenant,
            subject: Some(subject),
            memory: None,
        };
        lethe_core::Subject::new(subject).is_ok()
            && self.pattern.expand(&v, false).is_ok()
            && t.expand(&v, false).is_ok_and(|k| k == key)
    }

    /// `SCAN MATCH prefix*` on every primary; keys re-checked against the exact prefix.
    fn scan(&self, nodes: &mut Nodes, prefix: &str) -> Result<BTreeSet<Vec<u8>>, AdapterError> {
        self.scan_with(nodes, prefix, BTreeSet::new, |out, k| {
            out.insert(k.to_vec());
            true
        })
    }

    /// One keyspace pass for many prefixes (a batch's scopes): `SCAN MATCH` their longest
    /// common prefix, each key handed to every scope whose exact prefix it starts with. The
    /// keys of scope `i` in `out[i]`. Prefixes may nest (a tenant's and one of its subjects'):
    /// a key is then each one's, as two passes would have found it.
    fn scan_many(
        &self,
        nodes: &mut Nodes,
        prefixes: &[String],
    ) -> Result<Vec<BTreeSet<Vec<u8>>>, AdapterError> {
        let mut by_prefix: HashMap<&[u8], Vec<usize>> = HashMap::new();
        for (i, p) in prefixes.iter().enumerate() {
            by_prefix.entry(p.as_bytes()).or_default().push(i);
        }
        let mut lens: Vec<usize> = by_prefix.keys().map(|p| p.len()).collect();
        lens.sort_unstable();
        lens.dedup();
        let common = common_prefix(prefixes);
        self.scan_with(
            nodes,
            common,
            || vec![BTreeSet::new(); prefixes.len()],
            |out, k| {
                let mut wanted = false;
                for &n in lens.iter().take_while(|&&n| n <= k.len()) {
                    if let Some(scopes) = by_prefix.get(&k[..n]) {
                        for &i in scopes {
                            out[i].insert(k.to_vec());
                        }
                        wanted = true;
                    }
                }
                wanted
            },
        )
    }

    /// A keyspace pass under `prefix`: `add` is given each key that starts with it, into a
    /// result `fresh` makes, and says whether it wanted the key (only a wanted key is checked
    /// against the cluster's slots).
    ///
    /// On a cluster, a key whose slot moves during the pass, from a node not yet scanned to one
    /// already scanned, is seen on neither: the pass counts only if the topology (every
    /// primary's slots, migrating and importing ones included) was the same before and after
    /// it, with no slot moving. Otherwise it passes again (into a fresh result), a few times,
    /// and then the target is unavailable (retryable) until the resharding ends.
    fn scan_with<S>(
        &self,
        nodes: &mut Nodes,
        prefix: &str,
        fresh: impl Fn() -> S,
        mut add: impl FnMut(&mut S, &[u8]) -> bool,
    ) -> Result<S, AdapterError> {
        if !nodes.is_cluster() {
            let all = nodes.primaries().map_err(|e| self.unavailable(e))?;
            let mut out = fresh();
            self.pass(nodes, &all, prefix, &mut |k| add(&mut out, k))?;
            return Ok(out);
        }
        for attempt in 1..=PASSES {
            let before = nodes.topology().map_err(|e| self.unavailable(e))?;
            if !before.is_moving() {
                let mut out = fresh();
                self.pass(nodes, &before.primaries(), prefix, &mut |k| add(&mut out, k))?;
                if nodes.topology().map_err(|e| self.unavailable(e))? == before {
                    return Ok(out);
                }
            }
            if attempt < PASSES {
                // Waiting for a real cluster's resharding, not a clock a test controls.
                #[allow(clippy::disallowed_methods)]
                std::thread::sleep(RESHARD_WAIT * attempt);
            }
        }
        Err(self.unavailable(format!(
            "the cluster's slots moved during each of {PASSES} keyspace passes, or a slot is \
             migrating: retry once the resharding has ended"
        )))
    }

    /// One `SCAN MATCH prefix*` over each of `primaries`, each key that starts with `prefix`
    /// given to `add`.
    fn pass(
        &self,
        nodes: &mut Nodes,
        primaries: &[Addr],
        prefix: &str,
        add: &mut dyn FnMut(&[u8]) -> bool,
    ) -> Result<(), AdapterError> {
        let pattern = format!("{}*", glob_escape(prefix));
        let count = self.pacing.scan_count.to_string();
        for node in primaries {
            let mut cursor = b"0".to_vec();
            loop {
                let reply = nodes
                    .conn(node)
                    .and_then(|c| {
                        c.call(&[
                            b"SCAN",
                            &cursor,
                            b"MATCH",
                            pattern.as_bytes(),
                            b"COUNT",
                            count.as_bytes(),
                        ])
                    })
                    .map_err(|e| {
                        nodes.forget(node);
                        self.unavailable(e)
                    })?;
                // Taken apart, not copied: a page of a million-key pass is thousands of keys.
                let (next, keys) = match reply {
                    Reply::Array(Some(mut page)) if page.len() == 2 => {
                        match (page.pop(), page.pop()) {
                            (Some(Reply::Array(Some(keys))), Some(c)) => {
                                (c.bytes().unwrap_or(b"0").to_vec(), keys)
                            }
                            _ => return Err(self.failed("unexpected SCAN reply shape")),
                        }
                    }
                    Reply::Error(e) => return Err(self.answered("SCAN", &e)),
                    _ => return Err(self.failed("unexpected SCAN reply shape")),
                };
                // The exact re-check: a glob can only over-match if escaping failed; this makes
                // sure nothing outside the prefix is ever unlinked.
                for k in keys
                    .iter()
                    .filter_map(|k| k.bytes())
                    .filter(|k| k.starts_with(prefix.as_bytes()))
                {
                    // A key on a node that does not serve its slot (a migration abandoned
                    // after its keys moved) cannot be reached by any keyed command: its UNLINK
                    // and EXISTS go to the slot's owner. Counted, it was certified gone by a
                    // frozen verify, and came back when the slot later moved there.
                    // The pass runs only while no slot is migrating, so this is no race.
                    if add(k) && nodes.is_cluster() {
                        let slot = super::resp::slot(k);
                        let owner = nodes.owner(slot).map_err(|e| self.unavailable(e))?;
                        if owner != *node {
                            let (host, port) = node;
                            return Err(self.unavailable(format!(
                                "node {host}:{port} holds a key of the scope in slot {slot}, which it \
                                 does not serve (a slot migration left it there): no command \
                                 can reach it. Run `redis-cli --cluster fix`, then resume"
                            )));
                        }
                    }
                }
                cursor = next;
                if cursor == b"0" {
                    break;
                }
                if !self.pacing.scan_pause.is_zero() {
                    // Pacing a real server, not a clock a test controls: the pause only gives
                    // Redis to other clients, and no result depends on how long it lasted.
                    #[allow(clippy::disallowed_methods)]
                    std::thread::sleep(self.pacing.scan_pause);
                }
            }
        }
        Ok(())
    }

    /// The members of an index set, in pages; each must lie inside the subject's prefix.
    fn index_members(
        &self,
        nodes: &mut Nodes,
        index: &str,
        prefix: &str,
    ) -> Result<BTreeSet<Vec<u8>>, AdapterError> {
        let mut out = BTreeSet::new();
        // A set's members are cheap to list (no keyspace walk, no MATCH): pages of 1,000 hold
        // Redis about as long as a SCAN COUNT 100, with ten times fewer round trips.
        let count = INDEX_PAGE.to_string();
        let mut cursor = b"0".to_vec();
        loop {
            let reply = nodes
                .keyed(
                    index.as_bytes(),
                    &[
                        b"SSCAN",
                        index.as_bytes(),
                        &cursor,
                        b"COUNT",
                        count.as_bytes(),
                    ],
                )
                .map_err(|e| self.unavailable(e))?;
            let (next, members) = match (&reply, reply.array()) {
                (_, Some([c, Reply::Array(Some(m))])) => {
                    (c.bytes().unwrap_or(b"0").to_vec(), m.clone())
                }
                (Reply::Error(e), _) if is_transient(e) => return Err(self.answered("SSCAN", e)),
                (Reply::Error(_), _) => {
                    return Err(self.failed("the index set answered an error: is it a set?"))
                }
                _ => return Err(self.failed("unexpected SSCAN reply shape")),
            };
            for m in members.iter().filter_map(|m| m.bytes()) {
                if !m.starts_with(prefix.as_bytes()) {
                    return Err(self.failed("the index set lists a key outside the subject's key layout; refusing to erase it"));
                }
                out.insert(m.to_vec());
            }
            cursor = next;
            if cursor == b"0" {
                break;
            }
        }
        Ok(out)
    }

    /// Removes `keys` from the index set, at most `pipeline` members an `SREM`.
    fn srem(&self, nodes: &mut Nodes, index: &str, keys: &[Vec<u8>]) -> Result<(), AdapterError> {
        for chunk in keys.chunks(self.pacing.pipeline) {
            let mut cmd: Vec<&[u8]> = vec![b"SREM", index.as_bytes()];
            cmd.extend(chunk.iter().map(Vec::as_slice));
            let r = nodes
                .keyed(index.as_bytes(), &cmd)
                .map_err(|e| self.unavailable(e))?;
            if let Reply::Error(e) = &r {
                return Err(self.answered("SREM", e));
            }
        }
        Ok(())
    }

    /// The index set, once the inventoried keys it lists are erased. It is removed only if
    /// every key it still lists is gone (erased, expired, or unlinked by the application
    /// without an `SREM`), and only if it still lists exactly those: checked and removed in
    /// one script on the set's node. A set that lists a key that exists (one written and
    /// listed after the inventory) stays, listing only such keys, and verify counts it and them
    /// as residue. Returns 1 if this call removed the set.
    ///
    /// A writer that lists a key before writing it, between the existence check and the
    /// script, leaves that key unlisted: `lethe verify --audit` scans for such keys.
    fn finish_index(
        &self,
        nodes: &mut Nodes,
        index: &str,
        prefix: &str,
    ) -> Result<u64, AdapterError> {
        // On one server, one script reads the set and asks for each key it lists, and removes
        // the set only if none exists: the check and the removal with nothing in between, in
        // one round trip (the general path below is three reads and a script over 5,000
        // arguments for a 5,000-key subject, bench/README.md). A set longer than a script
        // should block the server for, or one that lists a key that exists, takes the general
        // path. A cluster script may not touch keys of other slots, so clusters take it too.
        const UNLINK_IF_ALL_GONE: &[u8] =
            b"if redis.call('SCARD', KEYS[1]) > 10000 then return -1 end \
            local m = redis.call('SMEMBERS', KEYS[1]) \
            for i = 1, #m do \
              if redis.call('EXISTS', m[i]) == 1 then return -1 end \
            end \
            return redis.call('UNLINK', KEYS[1])";
        if !nodes.is_cluster() {
            let cmd: [&[u8]; 4] = [b"EVAL", UNLINK_IF_ALL_GONE, b"1", index.as_bytes()];
            match nodes
                .keyed(index.as_bytes(), &cmd)
                .map_err(|e| self.unavailable(e))?
            {
                Reply::Int(n) if n >= 0 => return Ok(u64::from(n == 1)),
                Reply::Int(_) => {}
                Reply::Error(e) => return Err(self.answered("EVAL", &e)),
                _ => {
                    return Err(
                        self.failed("the index script answered something other than a count")
                    )
                }
            }
        }
        const UNLINK_IF_EXACTLY: &[u8] =
            b"if redis.call('SCARD', KEYS[1]) ~= #ARGV then return 0 end \
            for i = 1, #ARGV do \
              if redis.call('SISMEMBER', KEYS[1], ARGV[i]) == 0 then return 0 end \
            end \
            return redis.call('UNLINK', KEYS[1])";
        // Redis has no empty sets: no members, no set (a batch sent again).
        let left: Vec<Vec<u8>> = self
            .index_members(nodes, index, prefix)?
            .into_iter()
            .collect();
        if left.is_empty() {
            return Ok(0);
        }
        let live: BTreeSet<Vec<u8>> = self.existing(nodes, left.clone())?.into_iter().collect();
        if !live.is_empty() {
            let dead: Vec<Vec<u8>> = left.into_iter().filter(|k| !live.contains(k)).collect();
            self.srem(nodes, index, &dead)?;
            return Ok(0);
        }
        let mut cmd: Vec<&[u8]> = vec![b"EVAL", UNLINK_IF_EXACTLY, b"1", index.as_bytes()];
        cmd.extend(left.iter().map(Vec::as_slice));
        match nodes
            .keyed(index.as_bytes(), &cmd)
            .map_err(|e| self.unavailable(e))?
        {
            Reply::Int(n) => Ok(u64::from(n == 1)),
            Reply::Error(e) => Err(self.answered("EVAL", &e)),
            _ => Err(self.failed("the index script answered something other than a count")),
        }
    }

    /// Runs one single-key command per key, pipelined per owner node in slot order. A reply
    /// that redirects is retried alone, following MOVED and ASK.
    fn per_key(
        &self,
        nodes: &mut Nodes,
        cmd: &[u8],
        keys: &[Vec<u8>],
    ) -> Result<Vec<Reply>, AdapterError> {
        let mut by_node: BTreeMap<Addr, Vec<(u16, usize)>> = BTreeMap::new();
        for (i, k) in keys.iter().enumerate() {
            let s = slot(k);
            by_node
                .entry(nodes.owner(s).map_err(|e| self.unavailable(e))?)
                .or_default()
                .push((s, i));
        }
        let mut out = vec![Reply::Int(0); keys.len()];
        for (node, mut items) in by_node {
            items.sort();
            // Bounded pipelines: Redis answers each one before it reads the next, so other
            // clients get a turn between them.
            for items in items.chunks(self.pacing.pipeline) {
                let cmds: Vec<Vec<&[u8]>> = items
                    .iter()
                    .map(|(_, i)| vec![cmd, keys[*i].as_slice()])
                    .collect();
                let replies = nodes
                    .conn(&node)
                    .and_then(|c| c.pipeline(&cmds))
                    .map_err(|e| {
                        nodes.forget(&node);
                        self.unavailable(e)
                    })?;
                for ((_, i), r) in items.iter().zip(replies) {
                    let r = match &r {
                        Reply::Error(e) if super::resp::redirect(e).is_some() => {
                            if let Some(Redirect::Moved(s, a)) = super::resp::redirect(e) {
                                nodes.set_owner(s, a);
                            }
                            nodes
                                .keyed(&keys[*i], &[cmd, keys[*i].as_slice()])
                                .map_err(|e| self.unavailable(e))?
                        }
                        _ => r,
                    };
                    // Also after a redirect: an error is never taken for "no such key".
                    if let Reply::Error(e) = &r {
                        return Err(self.answered(&String::from_utf8_lossy(cmd), e));
                    }
                    out[*i] = r;
                }
            }
        }
        Ok(out)
    }

    /// Waits until every replica of each of `primaries` has acknowledged this connection's
    /// writes (`WAIT`), for at most `self.wait`; fewer is unavailable.
    fn wait_replicas(
        &self,
        nodes: &mut Nodes,
        primaries: &BTreeSet<Addr>,
    ) -> Result<(), AdapterError> {
        let ms = self.wait.as_millis().to_string();
        for node in primaries {
            let want = nodes.replica_count(node).map_err(|e| self.unavailable(e))?;
            if want == 0 {
                continue;
            }
            let reply = nodes
                .conn(node)
                .and_then(|c| c.call(&[b"WAIT", want.to_string().as_bytes(), ms.as_bytes()]))
                .map_err(|e| {
                    nodes.forget(node);
                    self.unavailable(e)
                })?;
            let acked = match reply {
                Reply::Int(n) => n.max(0) as usize,
                Reply::Error(e) => return Err(self.answered("WAIT", &e)),
                _ => return Err(self.failed("WAIT answered something other than a count")),
            };
            if acked < want {
                let (host, port) = node;
                return Err(self.unavailable(format!(
                    "{acked} of the {want} replicas of {host}:{port} acknowledged the erase \
                     within {ms} ms: one that missed it could be promoted and serve the keys \
                     again. Resume once replication is healthy"
                )));
            }
        }
        Ok(())
    }

    /// On a standalone server: `cmd` (`EXISTS` or `UNLINK`) over many keys at once, at most
    /// `pipeline` keys a command and one command a round trip, so Redis does the same work per
    /// round trip as with `pipeline` one-key commands, without parsing and answering each.
    /// Returns the sum of the integer replies: keys that exist, or keys unlinked. `None` on a
    /// cluster, where the keys of one command must share a slot (`per_key` is used there).
    fn count_many(
        &self,
        nodes: &mut Nodes,
        cmd: &[u8],
        keys: &[Vec<u8>],
    ) -> Result<Option<u64>, AdapterError> {
        if nodes.is_cluster() {
            return Ok(None);
        }
        let node = nodes.owner(0).map_err(|e| self.unavailable(e))?;
        let mut n = 0u64;
        for chunk in keys.chunks(self.pacing.pipeline) {
            let mut c: Vec<&[u8]> = Vec::with_capacity(chunk.len() + 1);
            c.push(cmd);
            c.extend(chunk.iter().map(Vec::as_slice));
            let reply = nodes
                .conn(&node)
                .and_then(|conn| conn.pipeline(&[c]))
                .map_err(|e| {
                    nodes.forget(&node);
                    self.unavailable(e)
                })?;
            match reply.first() {
                Some(Reply::Int(k)) if *k >= 0 => n += *k as u64,
                Some(Reply::Error(e)) => {
                    return Err(self.answered(&String::from_utf8_lossy(cmd), e))
                }
                _ => {
                    return Err(self.failed(format!(
                        "{} answered something other than a count",
                        String::from_utf8_lossy(cmd)
                    )))
                }
            }
        }
        Ok(Some(n))
    }

    fn existing(
        &self,
        nodes: &mut Nodes,
        keys: Vec<Vec<u8>>,
    ) -> Result<Vec<Vec<u8>>, AdapterError> {
        // A standalone server counts them all at once: EXISTS counts every key it is given that
        // exists, so a count equal to the number of keys means every one exists, and 0 means
        // none does (the common cases: an inventory, a clean verification). Otherwise, and on
        // a cluster, one EXISTS a key says which.
        if keys.len() > 1 {
            match self.count_many(nodes, b"EXISTS", &keys)? {
                Some(n) if n == keys.len() as u64 => return Ok(keys),
                Some(0) => return Ok(Vec::new()),
                _ => {}
            }
        }
        let replies = self.per_key(nodes, b"EXISTS", &keys)?;
        Ok(keys
            .into_iter()
            .zip(replies)
            .filter(|(_, r)| r.int() == Some(1))
            .map(|(k, _)| k)
            .collect())
    }

    /// Keys of the scope that exist now, and the index sets among them: a subject's own set,
    /// or a tenant's subjects' sets.
    fn keys(
        &self,
        nodes: &mut Nodes,
        scope: &Scope,
        sel: &Selection,
    ) -> Result<(Vec<Vec<u8>>, Vec<String>), AdapterError> {
        match sel {
            Selection::Prefix {
                prefix,
                index: None,
                index_sets,
            } => {
                let keys = self.scan(nodes, prefix)?.into_iter().collect();
                let sets = match index_sets {
                    Some(p) => self.index_sets(nodes, scope, p)?,
                    None => Vec::new(),
                };
                Ok((keys, sets))
            }
            Selection::Prefix {
                prefix,
                index: Some(index),
                ..
            } => {
                let members = self
                    .index_members(nodes, index, prefix)?
                    .into_iter()
                    .collect();
                let set = self.existing(nodes, vec![index.as_bytes().to_vec()])?;
                Ok((
                    self.existing(nodes, members)?,
                    (!set.is_empty())
                        .then(|| index.clone())
                        .into_iter()
                        .collect(),
                ))
            }
            Selection::Key { key, .. } => Ok((
                self.existing(nodes, vec![key.as_bytes().to_vec()])?,
                Vec::new(),
            )),
        }
    }

    /// A tenant's subjects' index sets: a scan of the index layout's tenant prefix, each key
    /// re-checked against the exact layout.
    fn index_sets(
        &self,
        nodes: &mut Nodes,
        scope: &Scope,
        prefix: &str,
    ) -> Result<Vec<String>, AdapterError> {
        let tenant = scope.tenant().as_str();
        Ok(self
            .scan(nodes, prefix)?
            .into_iter()
            .filter(|k| self.is_index_set(tenant, k))
            .filter_map(|k| String::from_utf8(k).ok())
            .collect())
    }
}

/// `kind` then the key in lowercase hex: a locator that holds any bytes.
/// The longest prefix every one of `prefixes` starts with, cut at a character boundary.
fn common_prefix(prefixes: &[String]) -> &str {
    let Some(first) = prefixes.first() else {
        return "";
    };
    let mut end = first.len();
    for p in &prefixes[1..] {
        end = first
            .char_indices()
            .zip(p.chars())
            .take_while(|((_, a), b)| a == b)
            .last()
            .map_or(0, |((i, a), _)| i + a.len_utf8())
            .min(end);
    }
    &first[..end]
}

pub(crate) fn hex_locator(kind: &str, key: &[u8]) -> String {
    const HEX: &[u8; 16] = b"0123456789abcdef";
    let mut s = String::with_capacity(kind.len() + key.len() * 2);
    s.push_str(kind);
    for &b in key {
        s.push(HEX[usize::from(b >> 4)] as char);
        s.push(HEX[usize::from(b & 15)] as char);
    }
    s
}

/// The bytes of [`hex_locator`]'s hex; `None` if it is not hex.
pub(crate) fn unhex(s: &str) -> Option<Vec<u8>> {
    (0..s.len())
        .step_by(2)
        .map(|i| s.get(i..i + 2).and_then(|h| u8::from_str_radix(h, 16).ok()))
        .collect()
}

impl Adapter for Redis {
    fn describe(&self) -> Description {
        Description {
            kind: crate::Kind::Redis,
            // The certificate carries the version, not the capabilities: a job that verified
            // only its frozen keys says so there.
            version: if matches!(self.mode, Mode::Scan) && self.verify == Verify::Frozen {
                "1+verify-frozen"
            } else {
                "1"
            },
            capabilities: vec![
                "scope:subject",
                "scope:tenant",
                if self.memory.is_some() {
                    "scope:memory"
                } else {
                    "scope:memory-unconfigured"
                },
                if matches!(self.mode, Mode::Index(_)) {
                    "mode:index"
                } else {
                    "mode:scan"
                },
                match (&self.mode, self.verify) {
                    (Mode::Scan, Verify::Scan) => "verify:keyspace-scan",
                    (Mode::Scan, Verify::Frozen) => "verify:frozen-keys",
                    (Mode::Index(_), _) => "verify:index",
                },
                "cluster:every-primary",
            ],
        }
    }

    fn check_scope(&self, scope: &Scope) -> Result<Applicability, AdapterError> {
        if matches!(scope, Scope::Memory { .. }) && self.memory.is_none() {
            return Ok(Applicability::Exempt(
                "memory scope: no `memory` key template is configured".into(),
            ));
        }
        self.selection(scope).map(|_| Applicability::Applies)
    }

    fn place(&self) -> String {
        let nodes = self.lock();
        let mut place = match nodes.is_cluster() {
            true => format!("redis:cluster:{}", self.pattern.text()),
            false => format!("redis:{}:{}", nodes.db(), self.pattern.text()),
        };
        // Index sets are inventoried too: their layout is part of the place.
        if let Mode::Index(t) = &self.mode {
            place.push_str(&format!(" index:{}", t.text()));
        }
        place
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
                return Err(self.answered("PING", &e));
            }
        }
        if !nodes.is_cluster() {
            // A `url` at one node of a cluster would erase only the keys of that node's slots
            // and certify the rest away: refused (exit 2) before anything is read or erased.
            let node = nodes.owner(0).map_err(|e| self.unavailable(e))?;
            let mut ask = |cmd: &[&[u8]]| {
                nodes.conn(&node).and_then(|c| c.call(cmd)).map_err(|e| {
                    nodes.forget(&node);
                    self.unavailable(e)
                })
            };
            // `INFO` says; where an ACL denies it (`-@dangerous` does), `CLUSTER INFO` does: a
            // state on a cluster node, an error naming the disabled support elsewhere. A server
            // that answers neither cannot be told apart from a cluster node, and is refused.
            let cluster =
                match ask(&[b"INFO", b"cluster"])? {
                    Reply::Error(e) if is_transient(&e) => return Err(self.answered("INFO", &e)),
                    Reply::Error(_) => match ask(&[b"CLUSTER", b"INFO"])? {
                        Reply::Error(e) if e.contains("cluster support disabled") => false,
                        Reply::Error(e) if is_transient(&e) => {
                            return Err(self.answered("CLUSTER INFO", &e))
                        }
                        Reply::Error(_) => return Err(self.failed(
                            "cannot tell whether this server is a cluster node (it refuses both \
                             INFO and CLUSTER INFO): allow one of them to Lethe's user",
                        )),
                        _ => true,
                    },
                    info => info
                        .bytes()
                        .is_some_and(|t| String::from_utf8_lossy(t).contains("cluster_enabled:1")),
                };
            if cluster {
                return Err(self.failed(
                    "this server is a cluster node: list the cluster's nodes with \
                     `nodes = [...]` instead of `url`",
                ));
            }
        }
        if matches!(self.mode, Mode::Index(_)) {
            // Index mode removes a subject's set with a script, once its keys are gone: a user
            // without scripting would fail there, after the keys, every time. Asked up front.
            let node = nodes.owner(0).map_err(|e| self.unavailable(e))?;
            let r = nodes
                .conn(&node)
                .and_then(|c| c.call(&[b"EVAL", b"return 1", b"0"]))
                .map_err(|e| {
                    nodes.forget(&node);
                    self.unavailable(e)
                })?;
            match r {
                Reply::Error(e) if is_transient(&e) => return Err(self.answered("EVAL", &e)),
                Reply::Error(_) => {
                    return Err(self.failed(
                        "index mode needs EVAL (a script removes a subject's index set once its \
                         keys are gone): allow @scripting, or EVAL, to Lethe's user",
                    ))
                }
                _ => {}
            }
        }
        Ok(())
    }

    fn inventory(&self, scope: &Scope) -> Result<Inventory, AdapterError> {
        let sel = self.selection(scope)?;
        let mut nodes = self.lock();
        let (keys, sets) = self.keys(&mut nodes, scope, &sel)?;
        let mut locators: Vec<Locator> = keys.iter().map(|k| (hex_locator(KEY, k), 1)).collect();
        locators.extend(sets.iter().map(|i| (hex_locator(INDEX, i.as_bytes()), 1)));
        Ok(Inventory::from_locators(locators))
    }

    fn inventory_many(&self, scopes: &[Scope]) -> Vec<Result<Inventory, AdapterError>> {
        let keys = match self.shared_pass(scopes) {
            Some(Ok(keys)) => keys,
            // Not one pass's to serve, or the pass failed: each scope alone (an unavailable
            // store then fails each as it would have).
            _ => return scopes.iter().map(|s| self.inventory(s)).collect(),
        };
        keys.into_iter()
            .zip(scopes)
            .map(|(keys, scope)| match keys {
                Some(keys) => Ok(Inventory::from_locators(
                    keys.iter().map(|k| (hex_locator(KEY, k), 1)).collect(),
                )),
                None => self.inventory(scope),
            })
            .collect()
    }

    fn verify_many(&self, work: &[(Scope, Vec<Locator>)]) -> Vec<Result<u64, AdapterError>> {
        let alone = |(s, f): &(Scope, Vec<Locator>)| self.verify(s, f);
        // Those whose own verify passes over the keyspace: all in scan mode's default, and in
        // `verify = "frozen"` those without frozen keys.
        let passing: Vec<usize> = (0..work.len())
            .filter(|&i| self.verify == Verify::Scan || work[i].1.is_empty())
            .collect();
        let scopes: Vec<Scope> = passing.iter().map(|&i| work[i].0.clone()).collect();
        let mut found: Vec<Option<BTreeSet<Vec<u8>>>> = vec![None; work.len()];
        match self.shared_pass(&scopes) {
            Some(Ok(keys)) => {
                for (i, keys) in passing.into_iter().zip(keys) {
                    found[i] = keys;
                }
            }
            _ => return work.iter().map(alone).collect(),
        }
        let served: Vec<Option<Result<u64, AdapterError>>> = {
            let mut nodes = self.lock();
            found
                .into_iter()
                .zip(work)
                .map(|(keys, w)| {
                    let keys = keys?;
                    // As `verify`: what the pass found, and any frozen key that exists now
                    // but the pass did not see (written again while it ran).
                    let unseen: Vec<Vec<u8>> = w
                        .1
                        .iter()
                        .filter_map(|(l, _)| l.strip_prefix(KEY).and_then(unhex))
                        .filter(|k| !keys.contains(k))
                        .collect();
                    Some(
                        self.existing(&mut nodes, unseen)
                            .map(|e| (keys.len() + e.len()) as u64),
                    )
                })
                .collect()
        };
        // The others alone, once the connections are free again.
        served
            .into_iter()
            .zip(work)
            .map(|(r, w)| r.unwrap_or_else(|| alone(w)))
            .collect()
    }

    fn erase_batch(&self, scope: &Scope, batch: &[Locator]) -> Result<u64, AdapterError> {
        let sel = self.selection(scope)?;
        let (prefix, index) = match &sel {
            Selection::Prefix { prefix, index, .. } => (prefix.clone(), index.clone()),
            Selection::Key { key, index } => (key.clone(), index.clone()),
        };
        let mut keys = Vec::new();
        let mut sets = Vec::new();
        // A tenant scope's subjects' index sets, each re-checked against the exact layout.
        let mut tenant_sets = Vec::new();
        let tenant_scope = matches!(
            sel,
            Selection::Prefix {
                index_sets: Some(_),
                ..
            }
        );
        for (loc, _) in batch {
            let (kind, hex) = loc.split_at(2.min(loc.len()));
            let key = unhex(hex)
                .ok_or_else(|| self.failed("unreadable locator in the frozen inventory"))?;
            match kind {
                // Belt and braces: never unlink a key outside the scope's exact prefix.
                KEY if key.starts_with(prefix.as_bytes()) => keys.push(key),
                INDEX if index.as_deref().map(str::as_bytes) == Some(key.as_slice()) => {
                    sets.push(key)
                }
                INDEX if tenant_scope && self.is_index_set(scope.tenant().as_str(), &key) => {
                    tenant_sets.push(key)
                }
                _ => return Err(self.failed("a frozen locator lies outside the scope")),
            }
        }
        let mut nodes = self.lock();
        // UNLINK: the value is reclaimed in the background, so a large value never blocks.
        let mut n: u64 = match self.count_many(&mut nodes, b"UNLINK", &keys)? {
            Some(n) => n,
            None => self
                .per_key(&mut nodes, b"UNLINK", &keys)?
                .iter()
                .filter_map(Reply::int)
                .sum::<i64>() as u64,
        };
        match (&sel, &index) {
            // Tidy the index: it must not keep listing an erased memory's key (not a row).
            (Selection::Key { .. }, Some(index)) => self.srem(&mut nodes, index, &keys)?,
            // The index set last, after the keys it lists.
            (Selection::Prefix { .. }, Some(index)) if !sets.is_empty() => {
                n += self.finish_index(&mut nodes, index, &prefix)?
            }
            _ => {}
        }
        // A tenant's erase takes every key of the tenant, and its verify scans again, so the
        // sets go whole (after the keys they list).
        n += self
            .per_key(&mut nodes, b"UNLINK", &tenant_sets)?
            .iter()
            .filter_map(Reply::int)
            .sum::<i64>() as u64;
        let expected: u64 = batch.iter().map(|(_, r)| r).sum();
        // UNLINK names frozen keys only, so more is a bug (it cannot be rolled back); refused all
        // the same, so the job blocks.
        crate::within_inventory(&self.name, expected, n)?;
        // Every replica of each primary written to acknowledges the UNLINKs, or the step is
        // unavailable (BLOCKED, resumed later): a replica that missed them could be promoted
        // and serve the keys again after the certificate.
        // Also when this call unlinked nothing: a resumed step waits for what an earlier one
        // wrote on the same connection.
        let mut touched = BTreeSet::new();
        for k in keys.iter().chain(&sets).chain(&tenant_sets) {
            touched.insert(nodes.owner(slot(k)).map_err(|e| self.unavailable(e))?);
        }
        if let Some(i) = &index {
            touched.insert(
                nodes
                    .owner(slot(i.as_bytes()))
                    .map_err(|e| self.unavailable(e))?,
            );
        }
        self.wait_replicas(&mut nodes, &touched)?;
        Ok(n)
    }

    fn audit(&self, scope: &Scope) -> Result<Option<u64>, AdapterError> {
        // Scan mode's default verify is already the keyspace scan.
        if matches!(self.mode, Mode::Scan) && self.verify == Verify::Scan {
            return Ok(None);
        }
        let (prefix, index, index_sets) = match self.selection(scope)? {
            Selection::Prefix {
                prefix,
                index,
                index_sets,
            } => (prefix, index, index_sets),
            // One key: a scan of it as a prefix would also count `...:mem:10` for `...:mem:1`.
            Selection::Key { key, .. } => {
                let mut nodes = self.lock();
                let n = self.existing(&mut nodes, vec![key.into_bytes()])?.len();
                return Ok(Some(n as u64));
            }
        };
        let mut nodes = self.lock();
        // The keyspace scan, as scan mode's default verify runs it; plus the index set itself,
        // or a tenant's subjects' index sets.
        let keys = self.scan(&mut nodes, &prefix)?;
        let index = match index {
            Some(i) => self.existing(&mut nodes, vec![i.into_bytes()])?.len() as u64,
            None => 0,
        };
        let sets = match index_sets {
            Some(p) => self.index_sets(&mut nodes, scope, &p)?.len() as u64,
            None => 0,
        };
        Ok(Some(keys.len() as u64 + index + sets))
    }

    fn batch_size(&self) -> Option<usize> {
        Some(self.batch_size)
    }

    fn verify(&self, scope: &Scope, frozen: &[Locator]) -> Result<u64, AdapterError> {
        let sel = self.selection(scope)?;
        let mut nodes = self.lock();
        let frozen_keys: Vec<Vec<u8>> = frozen
            .iter()
            .filter_map(|(l, _)| l.strip_prefix(KEY).and_then(unhex))
            .collect();
        let (mut keys, sets) = match (&self.mode, self.verify, &sel) {
            // One keyspace pass per job: only the frozen keys are looked up. A memory scope is
            // one key, looked up either way; a standalone `lethe verify` (no frozen keys) still
            // scans, since it has nothing else to check.
            (Mode::Scan, Verify::Frozen, Selection::Prefix { .. }) if !frozen.is_empty() => {
                (Vec::new(), Vec::new())
            }
            _ => self.keys(&mut nodes, scope, &sel)?,
        };
        keys.extend(self.existing(&mut nodes, frozen_keys)?);
        keys.sort();
        keys.dedup();
        Ok((keys.len() + sets.len()) as u64)
    }
}
