//! The `qdrant` adapter: Qdrant's REST API over the `http` kind's client, `must` filters of
//! `match: {value}` built as JSON, deletes by filter with `wait=true`, exact counts.

use std::collections::BTreeMap;

use lethe_core::Scope;
use serde_json::{json, Map, Value};
use ureq::http::Method;

use crate::http::client::{Client, SendError};
use crate::redis::adapter::{hex_locator, unhex};
use crate::{
    within_inventory, Adapter, AdapterError, Applicability, Description, Inventory, Locator,
};

/// The payload keys that hold the Lethe tenant and subject.
#[derive(Debug, Clone)]
pub(crate) struct Keys {
    pub(crate) tenant: String,
    pub(crate) subject: String,
}

/// One scroll page.
const PAGE: usize = 1_000;

/// A point id as Qdrant has them: an unsigned integer or a UUID. Kept in its canonical text
/// (decimal without leading zeros; a UUID lower-case and hyphenated), which is how Qdrant
/// returns it, so that text equality is id equality.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
pub(crate) enum PointId {
    Num(u64),
    Uuid(String),
}

impl PointId {
    /// A point id from its canonical text; `None` for anything else (another case, braces, a
    /// leading zero: Qdrant would read them as the same point as the canonical form, so a
    /// memory id so written could name a point it does not spell).
    pub(crate) fn parse(s: &str) -> Option<Self> {
        if !s.is_empty() && s.len() <= 20 && s.bytes().all(|b| b.is_ascii_digit()) {
            if s.len() > 1 && s.starts_with('0') {
                return None;
            }
            return s.parse().ok().map(PointId::Num);
        }
        let b = s.as_bytes();
        let uuid = b.len() == 36
            && b.iter().enumerate().all(|(i, c)| match i {
                8 | 13 | 18 | 23 => *c == b'-',
                _ => c.is_ascii_digit() || (b'a'..=b'f').contains(c),
            });
        uuid.then(|| PointId::Uuid(s.to_string()))
    }

    fn from_json(v: &Value) -> Option<Self> {
        match v {
            Value::Number(n) => n.as_u64().map(PointId::Num),
            Value::String(s) => Self::parse(s).filter(|p| matches!(p, PointId::Uuid(_))),
            _ => None,
        }
    }

    fn json(&self) -> Value {
        match self {
            PointId::Num(n) => json!(n),
            PointId::Uuid(u) => json!(u),
        }
    }

    fn text(&self) -> String {
        match self {
            PointId::Num(n) => n.to_string(),
            PointId::Uuid(u) => u.clone(),
        }
    }
}

/// A `qdrant` target.
pub struct Qdrant {
    name: String,
    client: Client,
    collection: String,
    keys: Keys,
    batch: usize,
}

impl std::fmt::Debug for Qdrant {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Qdrant")
            .field("name", &self.name)
            .field("collection", &self.collection)
            .finish_non_exhaustive()
    }
}

/// A `FieldCondition` of exact keyword match: the identifier is one JSON string value.
fn equals(key: &str, value: &str) -> Value {
    json!({ "key": key, "match": { "value": value } })
}

/// A payload value under a dotted key (nested objects).
fn get<'a>(payload: &'a Map<String, Value>, key: &str) -> Option<&'a Value> {
    let mut parts = key.split('.');
    let mut v = payload.get(parts.next()?)?;
    for p in parts {
        v = v.as_object()?.get(p)?;
    }
    Some(v)
}

impl Qdrant {
    pub(crate) fn new(
        name: &str,
        client: Client,
        collection: String,
        keys: Keys,
        batch: usize,
    ) -> Self {
        Self {
            name: name.to_string(),
            client,
            collection,
            keys,
            batch,
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

    /// `POST /collections/<collection>/<op>`; the `result` of a 2xx answer. Qdrant's error text
    /// (`status.error`) may quote a filter value: only the status is shown.
    fn post(&self, op: &str, body: &Value, what: &str) -> Result<Value, AdapterError> {
        let path = format!("/collections/{}/{op}", self.collection);
        let bytes = serde_json::to_vec(body).expect("a JSON value serializes");
        let reply = self
            .client
            .send(&Method::POST, &path, false, Some(&bytes), op, what)
            .map_err(|e| match e {
                SendError::Unavailable(why) | SendError::Busy(why) => self.unavailable(why),
            })?;
        let status = reply.status;
        if (200..300).contains(&status) {
            let v: Value = serde_json::from_slice(&reply.body)
                .map_err(|_| self.failed(format!("{what}: the answer is not JSON")))?;
            return v
                .get("result")
                .cloned()
                .ok_or_else(|| self.failed(format!("{what}: the answer has no `result`")));
        }
        Err(match status {
            401 | 403 => self.failed(format!(
                "{what}: Qdrant refused the api key (HTTP {status}): api_key_file must hold a read-write key"
            )),
            404 => self.failed(format!(
                "{what}: HTTP 404: Qdrant has no collection named by `collection`"
            )),
            409 | 500..=599 => self.unavailable(format!("{what}: HTTP {status}")),
            _ => self.failed(format!(
                "{what}: Qdrant refused the request (HTTP {status}): payload.tenant and payload.subject must be keys Qdrant can filter by (with strict mode on, indexed as keyword)"
            )),
        })
    }

    /// The scope's `must` conditions; `ids`, when given, narrows them to those points.
    pub(crate) fn filter(&self, scope: &Scope, ids: Option<&[PointId]>) -> Value {
        let k = &self.keys;
        let mut must = match scope {
            Scope::Tenant { tenant } => vec![equals(&k.tenant, tenant.as_str())],
            Scope::Subject { tenant, subject } | Scope::Memory { tenant, subject, .. } => vec![
                equals(&k.tenant, tenant.as_str()),
                equals(&k.subject, subject.as_str()),
            ],
        };
        if let Scope::Memory { memory, .. } = scope {
            // check_scope refused a memory id that is not a canonical point id.
            if let Some(p) = PointId::parse(memory.as_str()) {
                must.push(json!({ "has_id": [p.json()] }));
            }
        }
        if let Some(ids) = ids {
            must.push(json!({ "has_id": ids.iter().map(PointId::json).collect::<Vec<_>>() }));
        }
        json!({ "must": must })
    }

    fn count(&self, filter: Value) -> Result<u64, AdapterError> {
        let r = self.post(
            "points/count",
            &json!({ "filter": filter, "exact": true }),
            "Count points",
        )?;
        r.get("count")
            .and_then(Value::as_u64)
            .ok_or_else(|| self.failed("Count points: the answer has no count"))
    }

    fn points(&self, list: &Value, what: &str) -> Result<BTreeMap<PointId, Map<String, Value>>, AdapterError> {
        let mut out = BTreeMap::new();
        for p in list.as_array().ok_or_else(|| self.failed(format!("{what}: no list of points")))? {
            let id = p
                .get("id")
                .and_then(PointId::from_json)
                .ok_or_else(|| self.failed(format!("{what}: a point has no id")))?;
            let payload = p.get("payload").and_then(Value::as_object).cloned().unwrap_or_default();
            out.insert(id, payload);
        }
        Ok(out)
    }

    /// Every point the filter matches, with its owner keys (no other payload, no vector),
    /// following `next_page_offset` to the end (a page holds 10 points unless asked for more).
    fn scroll(&self, filter: Value) -> Result<BTreeMap<PointId, Map<String, Value>>, AdapterError> {
        let mut out = BTreeMap::new();
        let mut offset = Value::Null;
        loop {
            let mut body = json!({
                "filter": filter,
                "limit": PAGE,
                "with_payload": [self.keys.tenant, self.keys.subject],
                "with_vector": false,
            });
            if !offset.is_null() {
                body["offset"] = offset.clone();
            }
            let r = self.post("points/scroll", &body, "Scroll points")?;
            out.extend(self.points(r.get("points").unwrap_or(&Value::Null), "Scroll points")?);
            offset = r.get("next_page_offset").cloned().unwrap_or(Value::Null);
            if offset.is_null() {
                return Ok(out);
            }
        }
    }

    /// The points of `ids` that exist now, with their owner keys.
    fn retrieve(&self, ids: &[PointId]) -> Result<BTreeMap<PointId, Map<String, Value>>, AdapterError> {
        let mut out = BTreeMap::new();
        for chunk in ids.chunks(self.batch) {
            let r = self.post(
                "points",
                &json!({
                    "ids": chunk.iter().map(PointId::json).collect::<Vec<_>>(),
                    "with_payload": [self.keys.tenant, self.keys.subject],
                    "with_vector": false,
                }),
                "Retrieve points",
            )?;
            out.extend(self.points(&r, "Retrieve points")?);
        }
        Ok(out)
    }

    /// Whether a point's payload holds the scope's identifiers as single strings, byte for
    /// byte (`match: {value}` also matches one member of a list).
    fn carries(&self, payload: &Map<String, Value>, scope: &Scope) -> bool {
        crate::carries(
            |k| get(payload, k).and_then(Value::as_str),
            &self.keys.tenant,
            &self.keys.subject,
            None,
            scope,
        )
    }

    fn ids_of(&self, batch: &[Locator]) -> Result<Vec<PointId>, AdapterError> {
        batch
            .iter()
            .map(|(loc, _)| {
                loc.strip_prefix("p:")
                    .and_then(unhex)
                    .and_then(|b| String::from_utf8(b).ok())
                    .and_then(|s| PointId::parse(&s))
                    .ok_or_else(|| {
                        self.failed("a frozen locator is not a point id of this kind: the journal was edited")
                    })
            })
            .collect()
    }
}

impl Adapter for Qdrant {
    fn describe(&self) -> Description {
        Description {
            kind: crate::Kind::Qdrant,
            version: "1",
            capabilities: vec![
                "scope:subject",
                "scope:tenant",
                "scope:memory-by-point-id",
                "filter:match-value",
                "delete:filter-wait",
                "verify:exact-count",
            ],
        }
    }

    /// Tenant and subject go in as JSON strings and are always expressible. A memory is a
    /// point id: an unsigned integer or a UUID in canonical form; any other form is refused,
    /// since Qdrant would read `0042` as 42, or an upper-case UUID as the lower-case one.
    fn check_scope(&self, scope: &Scope) -> Result<Applicability, AdapterError> {
        if let Scope::Memory { memory, .. } = scope {
            if PointId::parse(memory.as_str()).is_none() {
                return Err(AdapterError::Inexpressible {
                    target: self.name.clone(),
                    why: "a memory id here is a Qdrant point id: an unsigned integer without leading zeros, or a UUID in lower case with hyphens".into(),
                });
            }
        }
        Ok(Applicability::Applies)
    }

    /// One exact count with both owner keys: the collection exists, the key is accepted, and
    /// Qdrant can filter by the keys.
    fn probe(&self) -> Result<(), AdapterError> {
        self.count(json!({ "must": [equals(&self.keys.tenant, ""), equals(&self.keys.subject, "")] }))
            .map(|_| ())
    }

    fn place(&self) -> String {
        format!(
            "qdrant:{} tenant:{} subject:{}",
            self.collection, self.keys.tenant, self.keys.subject
        )
    }

    fn inventory(&self, scope: &Scope) -> Result<Inventory, AdapterError> {
        self.check_scope(scope)?;
        let filter = self.filter(scope, None);
        let points = self.scroll(filter.clone())?;
        if points.values().any(|p| !self.carries(p, scope)) {
            return Err(self.failed(
                "a point the filter matched does not hold the scope's identifiers as single strings, byte for byte (a list under payload.subject?): whose it is cannot be told",
            ));
        }
        let exact = self.count(filter)?;
        if exact != points.len() as u64 {
            return Err(self.unavailable(format!(
                "the scroll found {} points where the exact count says {exact}: the collection changed while it was read",
                points.len()
            )));
        }
        Ok(Inventory::from_locators(
            points
                .keys()
                .map(|id| (hex_locator("p:", id.text().as_bytes()), 1))
                .collect(),
        ))
    }

    fn erase_batch(&self, scope: &Scope, batch: &[Locator]) -> Result<u64, AdapterError> {
        self.check_scope(scope)?;
        let expected: u64 = batch.iter().map(|(_, n)| n).sum();
        let ids = self.ids_of(batch)?;
        let mut erased = 0;
        for chunk in ids.chunks(self.batch) {
            let present = self.retrieve(chunk)?;
            let scoped: Vec<PointId> = present
                .iter()
                .filter(|(_, p)| self.carries(p, scope))
                .map(|(id, _)| id.clone())
                .collect();
            // A point of the batch that exists without the scope's values is another owner's
            // now: nothing is deleted.
            within_inventory(&self.name, scoped.len() as u64, present.len() as u64)?;
            if scoped.is_empty() {
                continue;
            }
            let filter = self.filter(scope, Some(&scoped));
            let before = self.count(filter.clone())?;
            within_inventory(&self.name, scoped.len() as u64, before)?;
            // wait=true: the answer comes once the delete is applied, so the count after it is
            // the delete's effect; without it Qdrant answers `acknowledged` and applies later.
            let r = self.post(
                "points/delete?wait=true",
                &json!({ "filter": filter }),
                "Delete points",
            )?;
            if r.get("status").and_then(Value::as_str) != Some("completed") {
                return Err(self.unavailable(
                    "Delete points: the operation was not reported completed: a resume deletes what is left",
                ));
            }
            let after = self.count(filter)?;
            if after > 0 {
                return Err(self.unavailable(format!(
                    "Delete points: {after} of the batch's points are still counted after a completed delete: a resume deletes them"
                )));
            }
            erased += before;
        }
        within_inventory(&self.name, expected, erased)?;
        Ok(erased)
    }

    fn batch_size(&self) -> Option<usize> {
        Some(self.batch)
    }

    /// The filter's exact count, or the frozen points still present with the scope's values if
    /// more, plus the frozen points still present that no longer carry the scope.
    fn verify(&self, scope: &Scope, frozen: &[Locator]) -> Result<u64, AdapterError> {
        self.check_scope(scope)?;
        let ids = self.ids_of(frozen)?;
        let count = self.count(self.filter(scope, None))?;
        let present = self.retrieve(&ids)?;
        let scoped = present.values().filter(|p| self.carries(p, scope)).count() as u64;
        Ok(count.max(scoped) + (present.len() as u64 - scoped))
    }
}
