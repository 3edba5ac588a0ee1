//! The `azure-ai-search` adapter: Search Documents and Index Documents over the `http` kind's
//! client, OData filters from doubled-quote literals, deletes by key.

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use lethe_core::Scope;
use serde_json::{json, Map, Value};
use ureq::http::Method;

use crate::http::client::{Client, SendError};
use crate::redis::adapter::{hex_locator, unhex};
use crate::{within_inventory, Adapter, AdapterError, Applicability, Description, Inventory, Locator};

/// The most actions one Index Documents request may carry, and the most documents one Search
/// Documents page returns.
pub(crate) const MAX_ACTIONS: usize = 1_000;

/// One search result: the selected fields by name.
type Doc = Map<String, Value>;

/// The index's fields this target reads and filters by.
#[derive(Debug, Clone)]
pub(crate) struct Fields {
    pub(crate) key: String,
    pub(crate) tenant: String,
    pub(crate) subject: String,
    pub(crate) memory: Option<String>,
}

/// How long a zero must hold before verify believes it, and how long verify waits in all.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Settle {
    pub(crate) settle: Duration,
    pub(crate) timeout: Duration,
}

/// An `azure-ai-search` target.
pub struct AzureAiSearch {
    name: String,
    client: Client,
    index: String,
    api_version: String,
    fields: Fields,
    batch: usize,
    settle: Settle,
}

impl std::fmt::Debug for AzureAiSearch {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("AzureAiSearch")
            .field("name", &self.name)
            .field("index", &self.index)
            .finish_non_exhaustive()
    }
}

/// An OData string literal: the value between single quotes, each of its quotes doubled. The
/// only way a value enters a filter.
pub(crate) fn literal(value: &str) -> String {
    format!("'{}'", value.replace('\'', "''"))
}

/// Whether `key` is a document key as the service allows them (letters, digits, `_`, `-`,
/// `=`): nothing a `search.in` list with `,` between keys could split or join.
fn is_key(key: &str) -> bool {
    !key.is_empty()
        && key.len() <= 1024
        && key
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'_' | b'-' | b'='))
}

impl AzureAiSearch {
    pub(crate) fn new(
        name: &str,
        client: Client,
        index: String,
        api_version: String,
        fields: Fields,
        batch: usize,
        settle: Settle,
    ) -> Self {
        Self {
            name: name.to_string(),
            client,
            index,
            api_version,
            fields,
            batch,
            settle,
        }
    }

    fn failed(&self, why: impl Into<String>) -> AdapterError {
        AdapterError::Failed {
            target: self.name.clone(),
            why: why.into(),
        }
    }

    fn unavailable(&self, why: impl Into<String>) -> AdapterError {
        AdapterError::Unavailable {
            target: self.name.clone(),
            why: why.into(),
        }
    }

    /// One POST to `/indexes/<index>/docs/<op>`, retried by the client. 2xx: its status and
    /// JSON body. Only the status is ever shown, never the service's message.
    fn post(&self, op: &str, body: &Value) -> Result<(u16, Value), AdapterError> {
        let target = format!(
            "/indexes/{}/docs/{op}?api-version={}",
            self.index, self.api_version
        );
        let bytes = serde_json::to_vec(body).expect("a JSON value serializes");
        // The client sends an Idempotency-Key (the service ignores it): the operation's name.
        let reply = self
            .client
            .send(&Method::POST, &target, false, Some(&bytes), op, op)
            .map_err(|e| match e {
                SendError::Unavailable(why) | SendError::Busy(why) => self.unavailable(why),
            })?;
        let status = reply.status;
        let what = match op {
            "search" => "Search Documents",
            _ => "Index Documents",
        };
        match status {
            200..=299 => serde_json::from_slice(&reply.body)
                .map(|v| (status, v))
                .map_err(|_| self.failed(format!("{what}: the answer is not JSON"))),
            401 | 403 => Err(self.failed(format!(
                "{what}: the service refused the api key (HTTP {status}): api_key_file must hold an admin key of this service"
            ))),
            404 => Err(self.failed(format!(
                "{what}: HTTP 404: the service has no index named by `index`"
            ))),
            400 => Err(self.failed(format!(
                "{what}: the service refused the request (HTTP 400): key_field, fields.tenant, fields.subject and memory must be fields of the index, filterable and retrievable, and key_field sortable"
            ))),
            408 | 409 | 429 | 500.. => Err(self.unavailable(format!("{what} answered HTTP {status}"))),
            _ => Err(self.failed(format!("{what} answered HTTP {status}"))),
        }
    }

    /// Search Documents: the documents of `value`, each an object.
    fn search(&self, body: Value) -> Result<(Vec<Doc>, Option<u64>), AdapterError> {
        let (_, mut v) = self.post("search", &body)?;
        let count = v.get("@odata.count").and_then(Value::as_u64);
        let docs = match v.get_mut("value").map(Value::take) {
            Some(Value::Array(docs)) => docs
                .into_iter()
                .map(|d| match d {
                    Value::Object(m) => Ok(m),
                    _ => Err(self.failed("Search Documents: a result is not an object")),
                })
                .collect::<Result<Vec<_>, _>>()?,
            _ => return Err(self.failed("Search Documents: the answer has no `value` list")),
        };
        Ok((docs, count))
    }

    /// The scope's OData filter. `None`: a memory scope on a target without `memory`.
    pub(crate) fn filter(&self, scope: &Scope) -> Option<String> {
        let f = &self.fields;
        let eq = |field: &str, value: &str| format!("{field} eq {}", literal(value));
        Some(match scope {
            Scope::Tenant { tenant } => eq(&f.tenant, tenant.as_str()),
            Scope::Subject { tenant, subject } => format!(
                "{} and {}",
                eq(&f.tenant, tenant.as_str()),
                eq(&f.subject, subject.as_str())
            ),
            Scope::Memory {
                tenant,
                subject,
                memory,
                ..
            } => format!(
                "{} and {} and {}",
                eq(&f.tenant, tenant.as_str()),
                eq(&f.subject, subject.as_str()),
                eq(f.memory.as_deref()?, memory.as_str())
            ),
        })
    }

    fn filter_of(&self, scope: &Scope) -> Result<String, AdapterError> {
        self.filter(scope).ok_or_else(|| AdapterError::Inexpressible {
            target: self.name.clone(),
            why: "a memory scope needs `memory`, the field that holds a memory id".into(),
        })
    }

    /// The `select` list of a read-back: the key and the fields that say whose a document is.
    fn owner_fields(&self) -> String {
        let f = &self.fields;
        let mut s = format!("{},{},{}", f.key, f.tenant, f.subject);
        if let Some(m) = &f.memory {
            s.push(',');
            s.push_str(m);
        }
        s
    }

    fn key_of(&self, doc: &Doc) -> Result<String, AdapterError> {
        match doc.get(&self.fields.key).and_then(Value::as_str) {
            Some(k) if is_key(k) => Ok(k.to_string()),
            Some(_) => Err(self.failed(
                "a document key holds characters the service does not allow in keys (letters, digits, '_', '-', '='): key_field is not the index's key",
            )),
            None => Err(self.failed("a result has no string in key_field: key_field is not the index's key")),
        }
    }

    /// Whether a document's fields carry the scope: each a string equal, byte for byte, to the
    /// scope's identifier.
    fn carries(&self, doc: &Doc, scope: &Scope) -> bool {
        let f = &self.fields;
        // A memory scope reaches here only with a `memory` field (`check_scope` exempts it
        // otherwise).
        crate::carries(
            |field| doc.get(field).and_then(Value::as_str),
            &f.tenant,
            &f.subject,
            f.memory.as_deref(),
            scope,
        )
    }

    /// Every key the filter matches now, paged by the key (never by `skip`).
    fn matching(&self, filter: &str) -> Result<Vec<String>, AdapterError> {
        let k = &self.fields.key;
        let mut keys: Vec<String> = Vec::new();
        let mut seen = std::collections::BTreeSet::new();
        let mut total = None;
        loop {
            let page_filter = match keys.last() {
                None => filter.to_string(),
                Some(last) => format!("({filter}) and {k} gt {}", literal(last)),
            };
            let first = keys.is_empty();
            let (docs, count) = self.search(json!({
                "search": "*",
                "filter": page_filter,
                "select": k,
                "orderby": format!("{k} asc"),
                "top": MAX_ACTIONS,
                "count": first,
            }))?;
            if first {
                total = Some(count.ok_or_else(|| {
                    self.failed("Search Documents: the answer has no @odata.count although count was asked for")
                })?);
            }
            let n = docs.len();
            for d in &docs {
                let key = self.key_of(d)?;
                if !seen.insert(key.clone()) {
                    return Err(self.unavailable(
                        "paging by key returned a key twice: the index's key order is not the one `gt` compares by, or the index changed while it was read",
                    ));
                }
                keys.push(key);
            }
            if n < MAX_ACTIONS {
                break;
            }
        }
        let total = total.unwrap_or(0);
        if (keys.len() as u64) < total {
            return Err(self.unavailable(format!(
                "paging by key found {} documents where the count says {total}: the index changed while it was read, or its key order is not the one `gt` compares by",
                keys.len()
            )));
        }
        Ok(keys)
    }

    /// Of `keys`, the documents that exist now, each with its key and owner fields; by
    /// `search.in` on the key, at most 1,000 keys a request. Reads no content.
    fn lookup(&self, keys: &[String]) -> Result<BTreeMap<String, Doc>, AdapterError> {
        let mut out = BTreeMap::new();
        for chunk in keys.chunks(MAX_ACTIONS) {
            let (docs, _) = self.search(json!({
                "search": "*",
                "filter": format!("search.in({}, {}, ',')", self.fields.key, literal(&chunk.join(","))),
                "select": self.owner_fields(),
                "top": chunk.len(),
            }))?;
            for d in docs {
                let key = self.key_of(&d)?;
                if !chunk.contains(&key) {
                    return Err(self.failed("a lookup by key returned a key it was not asked for"));
                }
                out.insert(key, d);
            }
        }
        Ok(out)
    }

    fn keys_of(&self, batch: &[Locator]) -> Result<Vec<String>, AdapterError> {
        batch
            .iter()
            .map(|(loc, _)| {
                loc.strip_prefix("k:")
                    .and_then(unhex)
                    .and_then(|b| String::from_utf8(b).ok())
                    .filter(|k| is_key(k))
                    .ok_or_else(|| {
                        self.failed("a frozen locator is not a document key of this kind: the journal was edited")
                    })
            })
            .collect()
    }

    /// What is left now: the filter's count, or the frozen keys still present with the scope's
    /// values if more (two searches may be served by replicas that have not caught up alike),
    /// plus the frozen keys still present that the filter no longer matches (their owner fields
    /// changed since the freeze).
    fn left(&self, filter: &str, frozen: &[String], scope: &Scope) -> Result<u64, AdapterError> {
        let (_, count) = self.search(json!({
            "search": "*",
            "filter": filter,
            "select": self.fields.key,
            "top": 0,
            "count": true,
        }))?;
        let count = count.ok_or_else(|| {
            self.failed("Search Documents: the answer has no @odata.count although count was asked for")
        })?;
        let present = self.lookup(frozen)?;
        let scoped = present.values().filter(|d| self.carries(d, scope)).count() as u64;
        Ok(count.max(scoped) + (present.len() as u64 - scoped))
    }

    /// Index Documents with one delete action per key: how many the service deleted (200),
    /// found already gone (404), or failed, by status.
    fn delete(&self, keys: &[String]) -> Result<u64, AdapterError> {
        let k = &self.fields.key;
        let actions: Vec<Value> = keys
            .iter()
            .map(|key| {
                let mut m = Map::new();
                m.insert("@search.action".into(), json!("delete"));
                m.insert(k.clone(), json!(key));
                Value::Object(m)
            })
            .collect();
        let (_, v) = self.post("index", &json!({ "value": actions }))?;
        let results = v
            .get("value")
            .and_then(Value::as_array)
            .ok_or_else(|| self.failed("Index Documents: the answer has no `value` list"))?;
        let mut answered = std::collections::BTreeSet::new();
        let (mut deleted, mut failures) = (0u64, BTreeMap::<u64, usize>::new());
        for r in results {
            let key = r.get("key").and_then(Value::as_str).unwrap_or("");
            if !keys.iter().any(|k| k == key) || !answered.insert(key.to_string()) {
                return Err(self.failed(
                    "Index Documents: a result names a key that was not sent, or one twice",
                ));
            }
            let code = r.get("statusCode").and_then(Value::as_u64).unwrap_or(0);
            let ok = r.get("status").and_then(Value::as_bool).unwrap_or(false);
            match code {
                200 | 201 if ok => deleted += 1,
                // Already gone: nothing of it to delete.
                404 => {}
                c => *failures.entry(c).or_default() += 1,
            }
        }
        if answered.len() != keys.len() {
            *failures.entry(0).or_default() += keys.len() - answered.len();
        }
        if failures.is_empty() {
            return Ok(deleted);
        }
        let shown: Vec<String> = failures
            .iter()
            .map(|(c, n)| match c {
                0 => format!("{n} without a result"),
                c => format!("{n} with status {c}"),
            })
            .collect();
        let why = format!(
            "Index Documents: {} of {} deletes did not succeed ({}); {deleted} did",
            failures.values().sum::<usize>(),
            keys.len(),
            shown.join(", ")
        );
        // 409 (a concurrent write), 422 (the index is busy), 429 and 503 pass; a 400 does not.
        if failures
            .keys()
            .all(|c| matches!(c, 0 | 409 | 422 | 429 | 500..=599))
        {
            Err(self.unavailable(why))
        } else {
            Err(self.failed(why))
        }
    }

    /// Sleeps between two polls of verify.
    fn pause(&self) {
        let poll = (self.settle.settle / 4).clamp(Duration::from_millis(10), Duration::from_secs(1));
        // Waiting for a remote index to catch up, not a clock a test controls: no result
        // depends on how long the wait lasted, only that the zero held across it.
        #[allow(clippy::disallowed_methods)]
        std::thread::sleep(poll);
    }
}

impl Adapter for AzureAiSearch {
    fn describe(&self) -> Description {
        Description {
            kind: crate::Kind::AzureAiSearch,
            version: "1",
            capabilities: vec![
                "scope:subject",
                "scope:tenant",
                match self.fields.memory {
                    Some(_) => "scope:memory-by-field",
                    None => "scope:memory-exempt",
                },
                "filter:odata-eq-literal",
                "inventory:page-by-key",
                "delete:by-key",
                "verify:count-settled",
            ],
        }
    }

    /// Every identifier is expressible (it only ever goes in as an OData literal); a memory
    /// scope is exempt without `memory`.
    fn check_scope(&self, scope: &Scope) -> Result<Applicability, AdapterError> {
        Ok(match self.filter(scope) {
            Some(_) => Applicability::Applies,
            None => Applicability::Exempt(
                "the index's documents carry no memory id (no `memory` field configured), so a memory scope names none of them".into(),
            ),
        })
    }

    /// One Search Documents request that names every configured field: the index exists, the
    /// key is accepted, and the fields are filterable, sortable (the key) and retrievable.
    fn probe(&self) -> Result<(), AdapterError> {
        let f = &self.fields;
        let mut filter = format!("{} eq '' and {} eq ''", f.tenant, f.subject);
        if let Some(m) = &f.memory {
            filter.push_str(&format!(" and {m} eq ''"));
        }
        let (_, count) = self.search(json!({
            "search": "*",
            "filter": filter,
            "select": self.owner_fields(),
            "orderby": format!("{} asc", f.key),
            "top": 0,
            "count": true,
        }))?;
        count
            .map(|_| ())
            .ok_or_else(|| self.failed("Search Documents: the answer has no @odata.count although count was asked for"))
    }

    /// The index and its fields; not the service's host.
    fn place(&self) -> String {
        let f = &self.fields;
        format!(
            "azure-ai-search:{} key:{} tenant:{} subject:{} memory:{}",
            self.index,
            f.key,
            f.tenant,
            f.subject,
            f.memory.as_deref().unwrap_or("(none)")
        )
    }

    fn inventory(&self, scope: &Scope) -> Result<Inventory, AdapterError> {
        let filter = self.filter_of(scope)?;
        let keys = self.matching(&filter)?;
        Ok(Inventory::from_locators(
            keys.iter()
                .map(|k| (hex_locator("k:", k.as_bytes()), 1))
                .collect(),
        ))
    }

    fn erase_batch(&self, scope: &Scope, batch: &[Locator]) -> Result<u64, AdapterError> {
        self.filter_of(scope)?;
        let expected: u64 = batch.iter().map(|(_, n)| n).sum();
        let keys = self.keys_of(batch)?;
        if keys.is_empty() {
            return Ok(0);
        }
        let present = self.lookup(&keys)?;
        let scoped: Vec<String> = present
            .iter()
            .filter(|(_, d)| self.carries(d, scope))
            .map(|(k, _)| k.clone())
            .collect();
        // A key of the batch that exists without the scope's values is another owner's
        // document: deleting the batch's keys would reach it. Nothing is deleted.
        within_inventory(&self.name, scoped.len() as u64, present.len() as u64)?;
        let mut erased = 0u64;
        for chunk in scoped.chunks(self.batch) {
            erased += self.delete(chunk)?;
        }
        within_inventory(&self.name, expected, erased)?;
        Ok(erased)
    }

    fn batch_size(&self) -> Option<usize> {
        Some(self.batch)
    }

    fn verify(&self, scope: &Scope, frozen: &[Locator]) -> Result<u64, AdapterError> {
        let filter = self.filter_of(scope)?;
        let keys = self.keys_of(frozen)?;
        let started = Instant::now();
        let mut zero_since: Option<Instant> = None;
        let (mut zeros, mut seen) = (0u32, 0u64);
        loop {
            let left = self.left(&filter, &keys, scope)?;
            if left == 0 {
                let since = *zero_since.get_or_insert_with(Instant::now);
                zeros += 1;
                if zeros >= 2 && since.elapsed() >= self.settle.settle {
                    return Ok(0);
                }
            } else {
                (zero_since, zeros, seen) = (None, 0, left);
            }
            if started.elapsed() >= self.settle.timeout {
                // Never a zero that did not hold: what was last seen is the residue.
                // (A zero seen only once, or not for settle_ms, is not believed: at least 1.)
                let left = if left == 0 { seen.max(1) } else { left };
                tracing::debug!(target_name = %self.name, left, "The index had not caught up within verify_timeout_ms.");
                return Ok(left);
            }
            self.pause();
        }
    }
}
