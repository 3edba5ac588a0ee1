//! The `opensearch` adapter: the REST API over the `http` kind's client, `term` filters built
//! as JSON, `_delete_by_query` of the frozen ids run as a task and polled.

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use lethe_core::Scope;
use serde_json::{json, Map, Value};
use ureq::http::Method;

use crate::http::client::{Client, SendError};
use crate::redis::adapter::{hex_locator, unhex};
use crate::{
    within_inventory, Adapter, AdapterError, Applicability, Description, Inventory, Locator,
};

/// The keyword fields that hold the Lethe tenant and subject.
#[derive(Debug, Clone)]
pub(crate) struct Fields {
    pub(crate) tenant: String,
    pub(crate) subject: String,
}

/// How long a delete task may run before the erase step is left unavailable (a resume sends
/// the delete again: it names the same ids, so it deletes what the first left).
#[derive(Debug, Clone, Copy)]
pub(crate) struct Timing {
    pub(crate) task_timeout: Duration,
}

/// One page of search results: a scroll's.
const PAGE: usize = 1_000;
/// Mapping types a `term` query matches exactly, byte for byte.
const EXACT_TYPES: &[&str] = &["keyword", "constant_keyword"];

/// One document as a read-back sees it: its owner fields.
#[derive(Debug)]
struct Hit {
    source: Map<String, Value>,
}

/// An `opensearch` target.
pub struct OpenSearch {
    name: String,
    client: Client,
    index: String,
    fields: Fields,
    batch: usize,
    timing: Timing,
}

impl std::fmt::Debug for OpenSearch {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("OpenSearch")
            .field("name", &self.name)
            .field("index", &self.index)
            .finish_non_exhaustive()
    }
}

/// A `term` clause: the identifier is a JSON string value, never part of a query string, so no
/// character of it is an operator.
fn term(field: &str, value: &str) -> Value {
    let mut m = Map::new();
    m.insert(field.to_string(), json!({ "value": value }));
    json!({ "term": m })
}

/// A dotted field's value in a `_source` (nested objects, or a flat dotted key).
fn get<'a>(source: &'a Map<String, Value>, field: &str) -> Option<&'a Value> {
    if let Some(v) = source.get(field) {
        return Some(v);
    }
    let mut parts = field.split('.');
    let mut v = source.get(parts.next()?)?;
    for p in parts {
        v = v.as_object()?.get(p)?;
    }
    Some(v)
}

impl OpenSearch {
    pub(crate) fn new(
        name: &str,
        client: Client,
        index: String,
        fields: Fields,
        batch: usize,
        timing: Timing,
    ) -> Self {
        Self {
            name: name.to_string(),
            client,
            index,
            fields,
            batch,
            timing,
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

    /// One request, retried by the client; the status and the JSON body of any answer the
    /// client did not retry away. `op` names it in messages.
    fn call(
        &self,
        method: Method,
        path: &str,
        body: Option<&Value>,
        op: &str,
    ) -> Result<(u16, Value), AdapterError> {
        let bytes = body.map(|b| serde_json::to_vec(b).expect("a JSON value serializes"));
        let reply = self
            .client
            .send(&method, path, false, bytes.as_deref(), op, op)
            .map_err(|e| match e {
                SendError::Unavailable(why) | SendError::Busy(why) => self.unavailable(why),
            })?;
        let v = serde_json::from_slice(&reply.body).unwrap_or(Value::Null);
        Ok((reply.status, v))
    }

    /// [`Self::call`], with every status but 2xx turned into an error. The server's `reason`
    /// may echo a query (an identifier): only its `error.type` is shown.
    fn ok(
        &self,
        method: Method,
        path: &str,
        body: Option<&Value>,
        op: &str,
    ) -> Result<Value, AdapterError> {
        let (status, v) = self.call(method, path, body, op)?;
        if (200..300).contains(&status) {
            return Ok(v);
        }
        let kind = v
            .pointer("/error/type")
            .and_then(Value::as_str)
            .filter(|t| t.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'_'))
            .unwrap_or("no error type");
        Err(match status {
            401 | 403 => self.failed(format!(
                "{op}: the cluster refused the credentials (HTTP {status}, {kind}): api_key_file, or username and password_file, must name a user allowed to read and delete in the index"
            )),
            404 => self.failed(format!(
                "{op}: HTTP 404 ({kind}): the cluster has no index named by `index`"
            )),
            409 | 429 | 500..=599 => self.unavailable(format!("{op}: HTTP {status} ({kind})")),
            _ => self.failed(format!("{op}: the cluster refused the request (HTTP {status}, {kind})")),
        })
    }

    /// The filter that names the scope: a `term` per identifier on its keyword field; a memory
    /// scope adds its document id. `ids`, when given, narrows it to those documents.
    pub(crate) fn query(&self, scope: &Scope, ids: Option<&[String]>) -> Value {
        let f = &self.fields;
        let mut filter = match scope {
            Scope::Tenant { tenant } => vec![term(&f.tenant, tenant.as_str())],
            Scope::Subject { tenant, subject } | Scope::Memory { tenant, subject, .. } => vec![
                term(&f.tenant, tenant.as_str()),
                term(&f.subject, subject.as_str()),
            ],
        };
        if let Scope::Memory { memory, .. } = scope {
            filter.push(json!({ "ids": { "values": [memory.as_str()] } }));
        }
        if let Some(ids) = ids {
            filter.push(json!({ "ids": { "values": ids } }));
        }
        json!({ "bool": { "filter": filter } })
    }

    /// Only `ids`: whoever their documents belong to now.
    fn by_ids(ids: &[String]) -> Value {
        json!({ "bool": { "filter": [{ "ids": { "values": ids } }] } })
    }

    /// Makes every write acknowledged so far visible to search, count and delete by query
    /// (which see only refreshed segments). Changes no document.
    fn refresh(&self) -> Result<(), AdapterError> {
        self.ok(Method::POST, &format!("/{}/_refresh", self.index), None, "Refresh")?;
        Ok(())
    }

    fn count(&self, query: Value) -> Result<u64, AdapterError> {
        let v = self.ok(
            Method::POST,
            &format!("/{}/_count", self.index),
            Some(&json!({ "query": query })),
            "Count",
        )?;
        v.get("count")
            .and_then(Value::as_u64)
            .ok_or_else(|| self.failed("Count: the answer has no `count`"))
    }

    /// Every document the query matches, by id, with its owner fields (no other
    /// field is read): a scroll, in pages of 1,000 in index order, since a page by `from`
    /// stops at the index's `max_result_window` (10,000 by default). The total the first page
    /// reports must be what the pages hold.
    fn scan(&self, query: Value) -> Result<BTreeMap<String, Hit>, AdapterError> {
        let f = &self.fields;
        let first = self.ok(
            Method::POST,
            &format!("/{}/_search?scroll=1m", self.index),
            Some(&json!({
                "query": query,
                "size": PAGE,
                "sort": ["_doc"],
                "_source": [f.tenant, f.subject],
                "track_total_hits": true,
            })),
            "Search",
        )?;
        let total = first
            .pointer("/hits/total/value")
            .and_then(Value::as_u64)
            .ok_or_else(|| self.failed("Search: the answer has no hits.total.value"))?;
        let mut out = BTreeMap::new();
        let mut page = first;
        let mut scroll_id = None;
        let result = loop {
            if let Some(id) = page.get("_scroll_id").and_then(Value::as_str) {
                scroll_id = Some(id.to_string());
            }
            let hits = match page.pointer("/hits/hits").and_then(Value::as_array) {
                Some(h) => h,
                None => break Err(self.failed("Search: the answer has no hits.hits")),
            };
            if hits.is_empty() {
                break Ok(());
            }
            for h in hits {
                let Some(id) = h.get("_id").and_then(Value::as_str) else {
                    return Err(self.failed("Search: a hit has no _id"));
                };
                let source = h.get("_source").and_then(Value::as_object).cloned().unwrap_or_default();
                out.insert(id.to_string(), Hit { source });
            }
            let Some(id) = &scroll_id else {
                break Err(self.failed("Search: the answer has no _scroll_id"));
            };
            page = match self.ok(
                Method::POST,
                "/_search/scroll",
                Some(&json!({ "scroll": "1m", "scroll_id": id })),
                "Scroll",
            ) {
                Ok(p) => p,
                Err(e) => break Err(e),
            };
        };
        if let Some(id) = scroll_id {
            // Frees the search context now rather than at its keep-alive; a failure here
            // costs the cluster a minute of memory, not a wrong count.
            let _ = self.call(
                Method::DELETE,
                "/_search/scroll",
                Some(&json!({ "scroll_id": [id] })),
                "Clear scroll",
            );
        }
        result?;
        if out.len() as u64 != total {
            return Err(self.unavailable(format!(
                "a scroll found {} documents where the search counted {total}: the index changed while it was read",
                out.len()
            )));
        }
        Ok(out)
    }

    /// Whether a document's owner fields carry the scope: each a string equal, byte for byte,
    /// to the scope's identifier (a `term` on a field that is not a keyword would match a word
    /// of it; a list would match any of its members).
    fn carries(&self, hit: &Hit, scope: &Scope) -> bool {
        let f = &self.fields;
        crate::carries(
            |field| get(&hit.source, field).and_then(Value::as_str),
            &f.tenant,
            &f.subject,
            None,
            scope,
        )
    }

    /// The scope's documents now: the filter's hits, each checked to carry the scope exactly.
    fn matching(&self, scope: &Scope) -> Result<BTreeMap<String, Hit>, AdapterError> {
        let hits = self.scan(self.query(scope, None))?;
        let mut out = BTreeMap::new();
        for (id, hit) in hits {
            if !self.carries(&hit, scope) {
                return Err(self.failed(
                    "a document the term filter matched does not hold the scope's identifiers as single strings, byte for byte: fields.tenant and fields.subject must be keyword fields holding one value each",
                ));
            }
            out.insert(id, hit);
        }
        Ok(out)
    }

    fn ids_of(&self, batch: &[Locator]) -> Result<Vec<String>, AdapterError> {
        batch
            .iter()
            .map(|(loc, _)| {
                loc.strip_prefix("d:")
                    .and_then(unhex)
                    .and_then(|b| String::from_utf8(b).ok())
                    .filter(|id| !id.is_empty() && id.len() <= 512)
                    .ok_or_else(|| {
                        self.failed("a frozen locator is not a document id of this kind: the journal was edited")
                    })
            })
            .collect()
    }

    /// Deletes `ids` (already checked to carry the scope) by `_delete_by_query` of the scope's
    /// filter narrowed to them, at most `ids.len()` documents (`max_docs`), run as a task and
    /// polled until it completes. Returns what the task deleted.
    fn delete(&self, scope: &Scope, ids: &[String]) -> Result<u64, AdapterError> {
        let path = format!(
            "/{}/_delete_by_query?conflicts=proceed&refresh=true&wait_for_completion=false",
            self.index
        );
        let body = json!({ "query": self.query(scope, Some(ids)), "max_docs": ids.len() });
        let v = self.ok(Method::POST, &path, Some(&body), "Delete by query")?;
        let task = v
            .get("task")
            .and_then(Value::as_str)
            .filter(|t| {
                t.split_once(':').is_some_and(|(node, n)| {
                    !node.is_empty()
                        && node.bytes().all(|b| b.is_ascii_alphanumeric() || matches!(b, b'_' | b'-'))
                        && !n.is_empty()
                        && n.bytes().all(|b| b.is_ascii_digit())
                })
            })
            .ok_or_else(|| self.failed("Delete by query: the answer names no task (node:number)"))?
            .to_string();
        let response = self.await_task(&task)?;
        let n = |k: &str| response.get(k).and_then(Value::as_u64).unwrap_or(0);
        let deleted = n("deleted");
        let failures = response.get("failures").and_then(Value::as_array).map_or(0, Vec::len);
        if failures > 0 || response.get("timed_out") == Some(&Value::Bool(true)) {
            return Err(self.unavailable(format!(
                "Delete by query: the task deleted {deleted} and reported {failures} failures (or timed out): a resume deletes the rest"
            )));
        }
        if n("version_conflicts") > 0 {
            return Err(self.unavailable(format!(
                "Delete by query: {} documents were written while the task ran (version conflicts) and were not deleted: a resume deletes them",
                n("version_conflicts")
            )));
        }
        Ok(deleted)
    }

    /// Polls `GET _tasks/<task>` until the task completed, within `task_timeout_ms`; its
    /// `response`.
    fn await_task(&self, task: &str) -> Result<Value, AdapterError> {
        let started = Instant::now();
        let mut pause = Duration::from_millis(20);
        loop {
            let v = self.ok(Method::GET, &format!("/_tasks/{task}"), None, "Get task")?;
            if v.get("completed") == Some(&Value::Bool(true)) {
                if let Some(kind) = v.pointer("/error/type") {
                    let kind = kind.as_str().unwrap_or("an error").to_string();
                    return Err(self.unavailable(format!("Delete by query: the task failed ({kind})")));
                }
                return v
                    .get("response")
                    .cloned()
                    .ok_or_else(|| self.failed("Get task: a completed task has no `response`"));
            }
            if started.elapsed() + pause > self.timing.task_timeout {
                return Err(self.unavailable(
                    "Delete by query: the task had not completed within task_timeout_ms; a resume sends the delete again",
                ));
            }
            // Waiting for the cluster's task, not a clock a test controls.
            #[allow(clippy::disallowed_methods)]
            std::thread::sleep(pause);
            pause = (pause * 2).min(Duration::from_secs(1));
        }
    }
}

impl Adapter for OpenSearch {
    fn describe(&self) -> Description {
        Description {
            kind: crate::Kind::Opensearch,
            version: "1",
            capabilities: vec![
                "scope:subject",
                "scope:tenant",
                "scope:memory-by-document-id",
                "filter:term-keyword",
                "delete:by-query-of-frozen-ids",
                "verify:count-after-refresh",
            ],
        }
    }

    /// Every identifier is expressible: it only goes in as a JSON string of a `term` or `ids`
    /// clause. A memory is a document id (`_id`). The index's `_version` counts writes to a
    /// document and is not the memory's version (a LangGraph store's `updated_at`): a version
    /// given is not checked here.
    fn check_scope(&self, _scope: &Scope) -> Result<Applicability, AdapterError> {
        Ok(Applicability::Applies)
    }

    /// The index exists, the credentials may read it, and both owner fields are mapped as
    /// keyword (a `term` on a text field matches any analysed word of it: `Alice Smith` for
    /// `alice`).
    fn probe(&self) -> Result<(), AdapterError> {
        let f = &self.fields;
        let v = self.ok(
            Method::GET,
            &format!("/{}/_mapping/field/{},{}", self.index, f.tenant, f.subject),
            None,
            "Get field mapping",
        )?;
        let indices = v
            .as_object()
            .filter(|m| !m.is_empty())
            .ok_or_else(|| self.failed("Get field mapping: the answer names no index"))?;
        for (_, m) in indices {
            for (key, field) in [("fields.tenant", &f.tenant), ("fields.subject", &f.subject)] {
                let last = field.rsplit('.').next().unwrap_or(field);
                let ty = m
                    .pointer(&format!("/mappings/{field}/mapping/{last}/type"))
                    .and_then(Value::as_str);
                match ty {
                    Some(t) if EXACT_TYPES.contains(&t) => {}
                    Some(t) => {
                        return Err(self.failed(format!(
                            "{key} is mapped as `{t}`, not `keyword`: a term query on it matches analysed words, so a neighbour could match; map it (or a sub-field such as {field}.keyword) as keyword and name that"
                        )))
                    }
                    None => {
                        return Err(self.failed(format!("{key} is not a field of the index")))
                    }
                }
            }
        }
        Ok(())
    }

    fn place(&self) -> String {
        format!(
            "opensearch:{} tenant:{} subject:{}",
            self.index, self.fields.tenant, self.fields.subject
        )
    }

    fn inventory(&self, scope: &Scope) -> Result<Inventory, AdapterError> {
        self.refresh()?;
        let hits = self.matching(scope)?;
        Ok(Inventory::from_locators(
            hits.keys().map(|id| (hex_locator("d:", id.as_bytes()), 1)).collect(),
        ))
    }

    fn erase_batch(&self, scope: &Scope, batch: &[Locator]) -> Result<u64, AdapterError> {
        let expected: u64 = batch.iter().map(|(_, n)| n).sum();
        let ids = self.ids_of(batch)?;
        if ids.is_empty() {
            return Ok(0);
        }
        self.refresh()?;
        let mut erased = 0;
        for chunk in ids.chunks(self.batch) {
            let present = self.scan(Self::by_ids(chunk))?;
            let scoped: Vec<String> = present
                .iter()
                .filter(|(_, h)| self.carries(h, scope))
                .map(|(id, _)| id.clone())
                .collect();
            // An id of the batch that exists without the scope's values is another owner's
            // document now: nothing is deleted.
            within_inventory(&self.name, scoped.len() as u64, present.len() as u64)?;
            if scoped.is_empty() {
                continue;
            }
            let deleted = self.delete(scope, &scoped)?;
            within_inventory(&self.name, scoped.len() as u64, deleted)?;
            erased += deleted;
        }
        within_inventory(&self.name, expected, erased)?;
        Ok(erased)
    }

    fn batch_size(&self) -> Option<usize> {
        Some(self.batch)
    }

    /// After a refresh (which changes no document): the filter's `_count`, or the frozen ids
    /// still present with the scope's values if more, plus the frozen ids still present that no
    /// longer carry the scope.
    fn verify(&self, scope: &Scope, frozen: &[Locator]) -> Result<u64, AdapterError> {
        let ids = self.ids_of(frozen)?;
        self.refresh()?;
        let count = self.count(self.query(scope, None))?;
        let (mut scoped, mut other) = (0u64, 0u64);
        for chunk in ids.chunks(self.batch) {
            for h in self.scan(Self::by_ids(chunk))?.values() {
                if self.carries(h, scope) {
                    scoped += 1;
                } else {
                    other += 1;
                }
            }
        }
        Ok(count.max(scoped) + other)
    }
}
