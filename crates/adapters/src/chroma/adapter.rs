//! The `chroma` adapter: REST API v2 calls over `ureq`, filters as JSON objects, deletes by
//! ids and filter together.

use std::collections::BTreeSet;
use std::path::PathBuf;
use std::time::Duration;

use lethe_core::Scope;
use serde_json::{json, Map, Value};

use crate::redis::adapter::{hex_locator, unhex};
use crate::{
    within_inventory, Adapter, AdapterError, Applicability, Description, Inventory, Locator,
    Physical,
};

/// The metadata keys that hold the Lethe tenant, subject and (optionally) memory id.
#[derive(Debug, Clone)]
pub(crate) struct Keys {
    pub(crate) tenant: String,
    pub(crate) subject: String,
    pub(crate) memory: Option<String>,
}

/// The most bytes one answer may have (a page of ids; tests read documents and vectors).
const MAX_BODY: u64 = 512 << 20;

/// A `chroma` target.
pub struct Chroma {
    name: String,
    /// `<url>/api/v2`.
    api: String,
    /// `<api>/tenants/<tenant>/databases/<database>`.
    db: String,
    tenant: String,
    database: String,
    collection: String,
    keys: Keys,
    token: Option<String>,
    path: Option<PathBuf>,
    batch: usize,
    agent: ureq::Agent,
    /// The target's requests at once (`max_in_flight`).
    in_flight: crate::http::client::InFlight,
}

impl std::fmt::Debug for Chroma {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Chroma")
            .field("name", &self.name)
            .field("collection", &self.collection)
            .finish_non_exhaustive()
    }
}

/// What `chroma.sqlite3` still holds of erased documents, by their ids. Counts only.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct PhysicalResidue {
    /// Rows of `embeddings_queue` (Chroma's write log) that name an erased id.
    pub queue_rows: u64,
    /// Of those, rows that still carry the document's content: an add, update or upsert, with
    /// its document text, metadata and vector (a delete's row carries the id only).
    pub queue_content_rows: u64,
    /// Rows of the collection's metadata segment (`embeddings`) for an erased id: present only
    /// when the logical erase has not reached the segment.
    pub segment_rows: u64,
}

impl PhysicalResidue {
    /// Whether nothing of the erased documents is left in the file.
    pub fn is_clean(&self) -> bool {
        *self == Self::default()
    }

    /// What the store itself offers against what is left, in words.
    pub const REMEDY: &'static str = "Chroma keeps each write in embeddings_queue (the document \
        text, metadata and vector of an add) after the delete, until every segment of the \
        collection has persisted past it and the log is purged (automatically_purge); \
        `chroma vacuum` does not remove rows that are not yet purgeable";
}

/// Ids a filter's page asks for: ids only, about 40 bytes each in the answer. The unit tests
/// page by 3, so their few documents take several pages.
const ID_PAGE: usize = if cfg!(test) { 3 } else { 10_000 };

impl Chroma {
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn new(
        name: &str,
        url: &str,
        tenant: String,
        database: String,
        collection: String,
        keys: Keys,
        token: Option<String>,
        path: Option<PathBuf>,
        batch: usize,
        timeout: Duration,
    ) -> Self {
        let agent: ureq::Agent = ureq::Agent::config_builder()
            .timeout_global(Some(timeout))
            .http_status_as_error(false)
            .max_redirects(0)
            .build()
            .into();
        let api = format!("{url}/api/v2");
        Self {
            name: name.to_string(),
            db: format!("{api}/tenants/{tenant}/databases/{database}"),
            api,
            tenant,
            database,
            collection,
            keys,
            token,
            path,
            batch,
            agent,
            in_flight: crate::http::client::InFlight::new(usize::MAX),
        }
    }

    /// Bounds the target's requests at once to `max` (`max_in_flight`), across threads.
    pub(crate) fn with_max_in_flight(mut self, max: usize) -> Self {
        self.in_flight = crate::http::client::InFlight::new(max);
        self
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

    /// One request. 2xx: its JSON body; 429 and 5xx: unavailable; other 4xx: failed. Only the
    /// status and Chroma's error type are ever shown, never its message, which may echo a value.
    fn call(&self, what: &str, url: &str, body: Option<&Value>) -> Result<Value, AdapterError> {
        let _slot = self.in_flight.take();
        let sent = match body {
            Some(b) => {
                let mut r = self.agent.post(url).content_type("application/json");
                if let Some(t) = &self.token {
                    r = r.header("x-chroma-token", t);
                }
                r.send(serde_json::to_vec(b).expect("a JSON value serializes"))
            }
            None => {
                let mut r = self.agent.get(url);
                if let Some(t) = &self.token {
                    r = r.header("x-chroma-token", t);
                }
                r.call()
            }
        };
        let mut resp = sent.map_err(|e| self.unavailable(format!("{what}: {}", shown(&e))))?;
        let status = resp.status().as_u16();
        let bytes = resp
            .body_mut()
            .with_config()
            .limit(MAX_BODY)
            .read_to_vec()
            .map_err(|e| self.unavailable(format!("{what}: reading the answer: {}", shown(&e))))?;
        let value: Option<Value> = serde_json::from_slice(&bytes).ok();
        if (200..300).contains(&status) {
            return value.ok_or_else(|| self.failed(format!("{what}: Chroma's answer is not JSON")));
        }
        let kind = value
            .as_ref()
            .and_then(|v| v.get("error"))
            .and_then(Value::as_str)
            .filter(|k| k.len() <= 64 && k.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'_'))
            .unwrap_or("no error type");
        let why = format!("{what}: Chroma answered HTTP {status} ({kind})");
        if status == 429 || status >= 500 {
            Err(self.unavailable(why))
        } else {
            Err(self.failed(why))
        }
    }

    /// The collection's id, looked up by name each time (a collection dropped and made again
    /// under the same name is followed; a missing one is an error, never an empty inventory).
    fn collection_id(&self) -> Result<String, AdapterError> {
        let url = format!("{}/collections/{}", self.db, self.collection);
        let v = match self.call("looking up the collection", &url, None) {
            Err(AdapterError::Failed { why, .. }) if why.contains("HTTP 404") => {
                return Err(self.failed(format!(
                    "no collection named by `collection` in tenant `{}`, database `{}` (or no such tenant or database)",
                    self.tenant, self.database
                )))
            }
            r => r?,
        };
        let id = v.get("id").and_then(Value::as_str).unwrap_or("");
        if id.is_empty() || !id.bytes().all(|b| b.is_ascii_hexdigit() || b == b'-') {
            return Err(self.failed("the collection's id in Chroma's answer is not a UUID"));
        }
        Ok(id.to_string())
    }

    fn eq(key: &str, value: &str) -> Value {
        let mut m = Map::new();
        // The identifier only ever as a JSON string under `$eq`: never a key, never an operator.
        m.insert(key.to_string(), json!({ "$eq": value }));
        Value::Object(m)
    }

    /// The scope's `where` filter, a JSON object.
    pub(crate) fn filter(&self, scope: &Scope) -> Value {
        let k = &self.keys;
        match scope {
            Scope::Tenant { tenant } => Self::eq(&k.tenant, tenant.as_str()),
            Scope::Subject { tenant, subject } => json!({ "$and": [
                Self::eq(&k.tenant, tenant.as_str()),
                Self::eq(&k.subject, subject.as_str()),
            ]}),
            Scope::Memory {
                tenant,
                subject,
                memory,
                ..
            } => {
                let mut all = vec![
                    Self::eq(&k.tenant, tenant.as_str()),
                    Self::eq(&k.subject, subject.as_str()),
                ];
                if let Some(mk) = &k.memory {
                    all.push(Self::eq(mk, memory.as_str()));
                }
                json!({ "$and": all })
            }
        }
    }

    /// A memory scope without a `memory` key: the memory id is the document id.
    fn scope_ids(&self, scope: &Scope) -> Option<Vec<String>> {
        match scope {
            Scope::Memory { memory, .. } if self.keys.memory.is_none() => {
                Some(vec![memory.as_str().to_string()])
            }
            _ => None,
        }
    }

    /// `get` with `include: []`: the ids only.
    fn get_ids(&self, cid: &str, mut body: Value) -> Result<Vec<String>, AdapterError> {
        body["include"] = json!([]);
        Ok(self.get(cid, &body)?.into_iter().map(|(id, _)| id).collect())
    }

    /// `get`: each id with its metadata when `include` asks for it (`Null` otherwise).
    fn get(&self, cid: &str, body: &Value) -> Result<Vec<(String, Value)>, AdapterError> {
        let url = format!("{}/collections/{cid}/get", self.db);
        let mut v = self.call("get", &url, Some(body))?;
        let ids = v
            .get("ids")
            .and_then(Value::as_array)
            .ok_or_else(|| self.failed("get: Chroma's answer has no ids"))?;
        let ids = ids
            .iter()
            .map(|i| i.as_str().map(str::to_string))
            .collect::<Option<Vec<_>>>()
            .ok_or_else(|| self.failed("get: an id in Chroma's answer is not a string"))?;
        let metas = match v.get_mut("metadatas").map(Value::take) {
            Some(Value::Array(m)) if m.len() == ids.len() => m,
            _ => vec![Value::Null; ids.len()],
        };
        Ok(ids.into_iter().zip(metas).collect())
    }

    /// Whether a document's metadata carries the scope: each key's value a string equal, byte
    /// for byte, to the scope's identifier.
    fn carries(&self, meta: &Value, scope: &Scope) -> bool {
        let k = &self.keys;
        crate::carries(
            |f| meta.get(f).and_then(Value::as_str),
            &k.tenant,
            &k.subject,
            k.memory.as_deref(),
            scope,
        )
    }

    /// Of `ids`, those that exist, and of those the ones whose metadata carries `scope`; by
    /// batches of `get` by ids (Chroma's `get` by ids and `where` together is slow: it
    /// evaluates the filter per id). Reads the ids' metadata, never their documents or vectors.
    fn existing(
        &self,
        cid: &str,
        ids: &[String],
        scope: Option<&Scope>,
    ) -> Result<(BTreeSet<String>, BTreeSet<String>), AdapterError> {
        let (mut present, mut scoped) = (BTreeSet::new(), BTreeSet::new());
        for chunk in ids.chunks(self.batch) {
            let include = if scope.is_some() { json!(["metadatas"]) } else { json!([]) };
            for (id, meta) in self.get(cid, &json!({ "ids": chunk, "include": include }))? {
                if scope.is_some_and(|s| self.carries(&meta, s)) {
                    scoped.insert(id.clone());
                }
                present.insert(id);
            }
        }
        Ok((present, scoped))
    }

    /// Every id the scope's filter matches now, paged by `limit`/`offset` in pages of
    /// [`ID_PAGE`] ids (no text, metadata or vector is read): Chroma evaluates the filter again
    /// for each page, over the whole collection, so a subject's ids come in one call where they
    /// can (measured in bench/README.md, "Chroma").
    fn matching(&self, cid: &str, scope: &Scope) -> Result<BTreeSet<String>, AdapterError> {
        let filter = self.filter(scope);
        if let Some(ids) = self.scope_ids(scope) {
            return Ok(self.existing(cid, &ids, Some(scope))?.1);
        }
        let mut out = BTreeSet::new();
        let mut offset = 0usize;
        loop {
            let page = self.get_ids(
                cid,
                json!({ "where": filter, "limit": ID_PAGE, "offset": offset }),
            )?;
            let n = page.len();
            out.extend(page);
            if n < ID_PAGE {
                return Ok(out);
            }
            offset += n;
        }
    }

    fn ids_of(&self, batch: &[Locator]) -> Result<Vec<String>, AdapterError> {
        batch
            .iter()
            .map(|(loc, _)| {
                loc.strip_prefix("d:")
                    .and_then(unhex)
                    .and_then(|b| String::from_utf8(b).ok())
                    .ok_or_else(|| {
                        self.failed("a frozen locator is not a document id of this kind: the journal was edited")
                    })
            })
            .collect()
    }

    /// Looks in the persist folder's `chroma.sqlite3`, read-only, for the documents the frozen
    /// locators name: `None` when the target has no `path`. Reads the file only, never the
    /// server.
    pub fn physical_residue(
        &self,
        frozen: &[Locator],
    ) -> Result<Option<PhysicalResidue>, AdapterError> {
        let Some(dir) = &self.path else {
            return Ok(None);
        };
        let ids: BTreeSet<String> = self.ids_of(frozen)?.into_iter().collect();
        let file = dir.join("chroma.sqlite3");
        let sql_err = |e: rusqlite::Error| self.failed(format!("reading chroma.sqlite3 under `path`: {e}"));
        let conn = rusqlite::Connection::open_with_flags(
            &file,
            rusqlite::OpenFlags::SQLITE_OPEN_READ_ONLY | rusqlite::OpenFlags::SQLITE_OPEN_NO_MUTEX,
        )
        .map_err(sql_err)?;
        conn.busy_timeout(Duration::from_secs(5)).map_err(sql_err)?;
        let cid: Option<String> = conn
            .query_row(
                "SELECT c.id FROM collections c JOIN databases d ON c.database_id = d.id \
                 WHERE d.tenant_id = ?1 AND d.name = ?2 AND c.name = ?3",
                (&self.tenant, &self.database, &self.collection),
                |r| r.get(0),
            )
            .map(Some)
            .or_else(|e| match e {
                rusqlite::Error::QueryReturnedNoRows => Ok(None),
                e => Err(e),
            })
            .map_err(sql_err)?;
        let Some(cid) = cid else {
            return Err(self.failed(
                "chroma.sqlite3 under `path` has no such collection: `path` is not this server's persist folder",
            ));
        };
        let mut found = PhysicalResidue::default();
        // One pass over the collection's log: its topic ends with the collection's id.
        let mut q = conn
            .prepare("SELECT id, operation FROM embeddings_queue WHERE topic LIKE '%/' || ?1")
            .map_err(sql_err)?;
        let mut rows = q.query([&cid]).map_err(sql_err)?;
        while let Some(r) = rows.next().map_err(sql_err)? {
            let id: String = r.get(0).map_err(sql_err)?;
            if ids.contains(&id) {
                found.queue_rows += 1;
                // 3: a delete, which carries the id and nothing else.
                if r.get::<_, i64>(1).map_err(sql_err)? != 3 {
                    found.queue_content_rows += 1;
                }
            }
        }
        let mut q = conn
            .prepare(
                "SELECT e.embedding_id FROM embeddings e JOIN segments s ON e.segment_id = s.id \
                 WHERE s.collection = ?1",
            )
            .map_err(sql_err)?;
        let mut rows = q.query([&cid]).map_err(sql_err)?;
        while let Some(r) = rows.next().map_err(sql_err)? {
            if ids.contains(&r.get::<_, String>(0).map_err(sql_err)?) {
                found.segment_rows += 1;
            }
        }
        Ok(Some(found))
    }
}

/// A transport error, as shown: its kind and the OS's words, never a request's content.
fn shown(e: &ureq::Error) -> String {
    match e {
        ureq::Error::Timeout(_) => "timed out".into(),
        ureq::Error::Io(io) => format!("I/O error: {}", io.kind()),
        ureq::Error::ConnectionFailed => "connection failed".into(),
        ureq::Error::HostNotFound => "host not found".into(),
        e => e.to_string(),
    }
}

impl Adapter for Chroma {
    fn describe(&self) -> Description {
        let mut capabilities = vec![
            "scope:subject",
            "scope:tenant",
            match self.keys.memory {
                Some(_) => "scope:memory-by-metadata",
                None => "scope:memory-as-document-id",
            },
            "filter:json-eq",
            "delete:ids-and-filter",
        ];
        if self.path.is_some() {
            capabilities.push("physical:sqlite-read-only");
        }
        Description {
            kind: crate::Kind::Chroma,
            version: "1",
            capabilities,
        }
    }

    /// Every identifier is expressible: it only ever goes in as a JSON string.
    fn check_scope(&self, _scope: &Scope) -> Result<Applicability, AdapterError> {
        Ok(Applicability::Applies)
    }

    fn probe(&self) -> Result<(), AdapterError> {
        self.call("heartbeat", &format!("{}/heartbeat", self.api), None)?;
        self.collection_id().map(|_| ())
    }

    /// The tenant, database, collection and metadata keys; not the host.
    fn place(&self) -> String {
        format!(
            "chroma:{}/{}/{} tenant:{} subject:{} memory:{}",
            self.tenant,
            self.database,
            self.collection,
            self.keys.tenant,
            self.keys.subject,
            self.keys.memory.as_deref().unwrap_or("(document id)")
        )
    }

    fn files(&self) -> Vec<PathBuf> {
        Vec::new()
    }

    /// [`Chroma::physical_residue`]: every row of `chroma.sqlite3` that names an erased id (the
    /// write log's adds, with their text, metadata and vector, and its deletes, which carry the
    /// id), and any the metadata segment still has.
    fn physical(&self, frozen: &[Locator]) -> Result<Option<Physical>, AdapterError> {
        Ok(Chroma::physical_residue(self, frozen)?.map(|r| Physical {
            residue: r.queue_rows + r.segment_rows,
            remedy: PhysicalResidue::REMEDY,
        }))
    }

    fn inventory(&self, scope: &Scope) -> Result<Inventory, AdapterError> {
        let cid = self.collection_id()?;
        let ids = self.matching(&cid, scope)?;
        Ok(Inventory::from_locators(
            ids.iter().map(|id| (hex_locator("d:", id.as_bytes()), 1)).collect(),
        ))
    }

    fn erase_batch(&self, scope: &Scope, batch: &[Locator]) -> Result<u64, AdapterError> {
        let expected: u64 = batch.iter().map(|(_, n)| n).sum();
        let ids = self.ids_of(batch)?;
        if ids.is_empty() {
            return Ok(0);
        }
        let cid = self.collection_id()?;
        let (present, scoped) = self.existing(&cid, &ids, Some(scope))?;
        // An id of the batch that exists without the scope's metadata is another owner's
        // document: deleting the batch's ids would reach it. Nothing is deleted.
        within_inventory(&self.name, scoped.len() as u64, present.len() as u64)?;
        if scoped.is_empty() {
            return Ok(0);
        }
        let scoped: Vec<String> = scoped.into_iter().collect();
        let mut erased = 0u64;
        for chunk in scoped.chunks(self.batch) {
            let url = format!("{}/collections/{cid}/delete", self.db);
            // By the ids alone, each just read back with the scope's metadata: never by a
            // filter, so the delete cannot reach beyond the frozen inventory.
            let v = self.call("delete", &url, Some(&json!({ "ids": chunk })))?;
            erased += match v.get("deleted").and_then(Value::as_u64) {
                Some(n) => n,
                // An older server that does not say: what went, by reading the ids back.
                None => (chunk.len() - self.existing(&cid, chunk, None)?.0.len()) as u64,
            };
        }
        within_inventory(&self.name, expected, erased)?;
        Ok(erased)
    }

    fn batch_size(&self) -> Option<usize> {
        Some(self.batch)
    }

    fn verify(&self, scope: &Scope, frozen: &[Locator]) -> Result<u64, AdapterError> {
        let cid = self.collection_id()?;
        let mut left = self.matching(&cid, scope)?;
        let ids = self.ids_of(frozen)?;
        left.extend(self.existing(&cid, &ids, None)?.0);
        Ok(left.len() as u64)
    }
}
