//! The `phoenix` adapter: Phoenix's REST API `/v1` over `ureq`; spans listed and matched here,
//! traces deleted by id.

use std::collections::{BTreeMap, BTreeSet};
use std::path::PathBuf;
use std::time::{Duration, Instant};

use lethe_core::Scope;
use percent_encoding::{utf8_percent_encode, NON_ALPHANUMERIC};
use serde_json::Value;

use crate::redis::adapter::{hex_locator, unhex};
use crate::{
    within_inventory, Adapter, AdapterError, Applicability, Description, Inventory, Locator,
    Physical,
};

/// The keys inside a span's `metadata` attribute that hold the Lethe tenant and subject.
#[derive(Debug, Clone)]
pub(crate) struct Keys {
    pub(crate) tenant: String,
    pub(crate) subject: String,
}

/// The most bytes one answer may have (a page of spans, with their attributes).
const MAX_BODY: u64 = 512 << 20;
/// The most attempts of one request that Phoenix answers 429 or 503.
const ATTEMPTS: u32 = 5;
/// How long verification waits between two read-backs.
const VERIFY_PAUSE: Duration = Duration::from_millis(200);

/// A `phoenix` target.
pub struct Phoenix {
    name: String,
    /// `<url>/v1`.
    api: String,
    project: String,
    keys: Keys,
    token: Option<String>,
    path: Option<PathBuf>,
    batch: usize,
    timeout: Duration,
    verify_timeout: Duration,
    agent: ureq::Agent,
    /// The target's requests at once (`max_in_flight`), and a `Retry-After` holding them all.
    in_flight: crate::http::client::InFlight,
}

impl std::fmt::Debug for Phoenix {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Phoenix")
            .field("name", &self.name)
            .field("project", &self.project)
            .finish_non_exhaustive()
    }
}

/// What Phoenix's SQLite files still hold of erased traces, by their ids' bytes. Counts only.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct PhysicalResidue {
    /// Erased trace ids whose bytes are still in `phoenix.db` (freed pages keep them until
    /// reused or `VACUUM`).
    pub db_traces: u64,
    /// Occurrences of those bytes in `phoenix.db`.
    pub db_hits: u64,
    /// Erased trace ids whose bytes are still in `phoenix.db-wal` (page images written before
    /// and by the delete, until a checkpoint).
    pub wal_traces: u64,
    /// Occurrences of those bytes in `phoenix.db-wal`.
    pub wal_hits: u64,
}

impl PhysicalResidue {
    /// Whether no erased trace id is left in either file.
    pub fn is_clean(&self) -> bool {
        self.db_hits == 0 && self.wal_hits == 0
    }

    /// What the store itself offers against what is left, in words.
    pub const REMEDY: &'static str = "Phoenix runs SQLite in WAL mode without secure_delete: \
        the -wal keeps the page images of deleted spans (their attributes, input and output \
        text) until a checkpoint (PRAGMA wal_checkpoint(TRUNCATE)); the checkpoint moves them \
        into phoenix.db's freed space, which keeps the bytes (and later writes to those pages \
        copy them into the -wal again) until the file is rewritten by VACUUM";
}

/// A span as listed: its trace and whether its metadata carries the scope.
struct Seen {
    trace: String,
    carries: bool,
}

/// What a listing found per trace: its spans, and whether any of them carries the scope.
type Traces = BTreeMap<String, (u64, bool)>;

fn enc(s: &str) -> String {
    utf8_percent_encode(s, NON_ALPHANUMERIC).to_string()
}

impl Phoenix {
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn new(
        name: &str,
        url: &str,
        project: String,
        keys: Keys,
        token: Option<String>,
        path: Option<PathBuf>,
        batch: usize,
        timeout: Duration,
        verify_timeout: Duration,
    ) -> Self {
        let agent: ureq::Agent = ureq::Agent::config_builder()
            .http_status_as_error(false)
            .max_redirects(0)
            .proxy(None)
            .timeout_global(Some(timeout))
            .build()
            .into();
        Self {
            name: name.to_string(),
            api: format!("{url}/v1"),
            project,
            keys,
            token,
            path,
            batch,
            timeout,
            verify_timeout,
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

    /// One request, `GET` or `DELETE`: its status and body. 429 and 503 are retried after
    /// their `Retry-After` (or a short backoff) while the wait fits in `timeout_ms`; a
    /// connection failure, a timeout and any other 5xx are `unavailable`. Only the operation
    /// and the status are ever shown: never the URL (it holds identifiers) or Phoenix's words.
    fn send(&self, what: &str, delete: bool, url: &str) -> Result<(u16, Vec<u8>), AdapterError> {
        let started = Instant::now();
        let mut attempt = 0u32;
        loop {
            attempt += 1;
            let slot = self.in_flight.take();
            let sent = if delete {
                let mut r = self.agent.delete(url);
                if let Some(t) = &self.token {
                    r = r.header("authorization", format!("Bearer {t}"));
                }
                r.call()
            } else {
                let mut r = self.agent.get(url).header("accept", "application/json");
                if let Some(t) = &self.token {
                    r = r.header("authorization", format!("Bearer {t}"));
                }
                r.call()
            };
            let mut resp = sent.map_err(|e| self.unavailable(format!("{what}: {}", shown(&e))))?;
            let status = resp.status().as_u16();
            let header = |n: &str| {
                resp.headers()
                    .get(n)
                    .and_then(|v| v.to_str().ok())
                    .map(str::to_string)
            };
            let wait = header("retry-after").and_then(|v| {
                crate::http::client::retry_after(&v, header("date").as_deref())
            });
            let bytes = resp
                .body_mut()
                .with_config()
                .limit(MAX_BODY)
                .read_to_vec()
                .map_err(|e| self.unavailable(format!("{what}: reading the answer: {}", shown(&e))))?;
            drop(slot);
            if !matches!(status, 429 | 503) {
                if status >= 500 {
                    return Err(self.unavailable(format!("{what}: Phoenix answered HTTP {status}")));
                }
                return Ok((status, bytes));
            }
            if let Some(w) = wait {
                // Phoenix asked the target, not this request, to wait.
                self.in_flight.hold_until(Instant::now() + w);
            }
            let wait = wait.unwrap_or(Duration::from_millis(250 << (attempt - 1).min(6)));
            if attempt >= ATTEMPTS || started.elapsed() + wait > self.timeout {
                return Err(self.unavailable(format!(
                    "{what}: Phoenix answered HTTP {status} {attempt} times (Retry-After {} s; timeout_ms reached or attempts spent)",
                    wait.as_secs()
                )));
            }
            tracing::debug!(what, attempt, wait_ms = wait.as_millis() as u64, "Phoenix is busy; retrying.");
            // Pacing a real server by its Retry-After, not a clock a test controls.
            #[allow(clippy::disallowed_methods)]
            std::thread::sleep(wait);
        }
    }

    /// A `GET` whose answer must be 2xx JSON. A 404 is the project's: it does not exist.
    fn get_json(&self, what: &str, url: &str) -> Result<Value, AdapterError> {
        let (status, bytes) = self.send(what, false, url)?;
        match status {
            200..=299 => serde_json::from_slice(&bytes)
                .map_err(|_| self.failed(format!("{what}: Phoenix's answer is not JSON"))),
            401 | 403 => Err(self.failed(format!(
                "{what}: Phoenix answered HTTP {status}: check api_key_file"
            ))),
            404 => Err(self.failed(format!(
                "{what}: Phoenix answered HTTP 404: no project named by `project` (a missing project is never an empty inventory)"
            ))),
            _ => Err(self.failed(format!("{what}: Phoenix answered HTTP {status}"))),
        }
    }

    /// The value of `key` in a span's metadata, as Phoenix lists it: flattened
    /// (`metadata.<key>`, when Phoenix parsed the attribute's JSON at ingestion) or the
    /// attribute's JSON string itself (spans created through the REST API keep it a string).
    /// Only a JSON string counts: a number or an object never equals an identifier.
    fn meta<'a>(attrs: &'a Value, parsed: &'a Option<Value>, key: &str) -> Option<&'a str> {
        attrs
            .get(format!("metadata.{key}"))
            .and_then(Value::as_str)
            .or_else(|| parsed.as_ref()?.get(key)?.as_str())
    }

    /// Whether a span's attributes carry the scope: each key's value a JSON string equal, byte
    /// for byte, to the scope's identifier.
    fn carries(&self, attrs: &Value, scope: &Scope) -> bool {
        let parsed: Option<Value> = attrs
            .get("metadata")
            .and_then(Value::as_str)
            .and_then(|s| serde_json::from_str::<Value>(s).ok())
            .filter(Value::is_object);
        // Spans name no memory: a memory scope is exempt before this is asked.
        crate::carries(
            |k| Self::meta(attrs, &parsed, k),
            &self.keys.tenant,
            &self.keys.subject,
            None,
            scope,
        )
    }

    /// Every span of the project (or of `traces` only), in insertion order, paged by Phoenix's
    /// cursor; each span's trace and whether it carries `scope`.
    fn list(&self, scope: &Scope, traces: Option<&[String]>) -> Result<Vec<Seen>, AdapterError> {
        let mut base = format!(
            "{}/projects/{}/spans?sort=id&order=asc&limit={}",
            self.api,
            enc(&self.project),
            self.batch
        );
        for t in traces.unwrap_or(&[]) {
            base.push_str("&trace_id=");
            base.push_str(&enc(t));
        }
        let mut out = Vec::new();
        let mut cursor: Option<String> = None;
        loop {
            let url = match &cursor {
                Some(c) => format!("{base}&cursor={}", enc(c)),
                None => base.clone(),
            };
            let mut v = self.get_json("listing spans", &url)?;
            let Some(Value::Array(data)) = v.get_mut("data").map(Value::take) else {
                return Err(self.failed("listing spans: Phoenix's answer has no data"));
            };
            for span in &data {
                let trace = span
                    .pointer("/context/trace_id")
                    .and_then(Value::as_str)
                    .filter(|t| !t.is_empty())
                    .ok_or_else(|| self.failed("listing spans: a span in Phoenix's answer has no trace id"))?;
                let attrs = span.get("attributes").unwrap_or(&Value::Null);
                out.push(Seen {
                    trace: trace.to_string(),
                    carries: self.carries(attrs, scope),
                });
            }
            match v.get("next_cursor").and_then(Value::as_str) {
                Some(c) if !data.is_empty() => cursor = Some(c.to_string()),
                _ => return Ok(out),
            }
        }
    }

    /// Spans per trace, and whether any span of the trace carries the scope.
    fn traces(&self, scope: &Scope, only: Option<&[String]>) -> Result<Traces, AdapterError> {
        let mut out = Traces::new();
        for s in self.list(scope, only)? {
            let e = out.entry(s.trace).or_insert((0, false));
            e.0 += 1;
            e.1 |= s.carries;
        }
        Ok(out)
    }

    fn ids_of(&self, batch: &[Locator]) -> Result<Vec<String>, AdapterError> {
        batch
            .iter()
            .map(|(loc, _)| {
                loc.strip_prefix("t:")
                    .and_then(unhex)
                    .and_then(|b| String::from_utf8(b).ok())
                    .filter(|t| !t.is_empty())
                    .ok_or_else(|| {
                        self.failed("a frozen locator is not a trace id of this kind: the journal was edited")
                    })
            })
            .collect()
    }

    /// What is left: spans of every trace that carries the scope now, and of every frozen
    /// trace still in the project. One read of the project.
    fn left(&self, scope: &Scope, frozen: &BTreeSet<String>) -> Result<u64, AdapterError> {
        Ok(self
            .traces(scope, None)?
            .iter()
            .filter(|(t, (_, carries))| *carries || frozen.contains(*t))
            .map(|(_, (n, _))| n)
            .sum())
    }

    /// Looks in the working folder's `phoenix.db` and `phoenix.db-wal`, read-only and as bytes,
    /// for the trace ids the frozen locators name: `None` when the target has no `path`. Reads
    /// the files only, never the server; a missing `-wal` (checkpointed and removed) is clean.
    pub fn physical_residue(&self, frozen: &[Locator]) -> Result<Option<PhysicalResidue>, AdapterError> {
        let Some(dir) = &self.path else {
            return Ok(None);
        };
        let ids: BTreeSet<Vec<u8>> = self
            .ids_of(frozen)?
            .into_iter()
            .map(String::into_bytes)
            .collect();
        let db = dir.join("phoenix.db");
        if !db.is_file() {
            return Err(self.failed(
                "no phoenix.db under `path`: `path` is not this server's working folder (PHOENIX_WORKING_DIR)",
            ));
        }
        let mut found = PhysicalResidue::default();
        (found.db_traces, found.db_hits) = self.scan_file(&db, &ids)?;
        let wal = dir.join("phoenix.db-wal");
        if wal.is_file() {
            (found.wal_traces, found.wal_hits) = self.scan_file(&wal, &ids)?;
        }
        Ok(Some(found))
    }

    /// The distinct `ids` found in a file's bytes, and how many times in all. Reads it in
    /// chunks that overlap by the longest id, so an id across two chunks is found once.
    fn scan_file(&self, file: &std::path::Path, ids: &BTreeSet<Vec<u8>>) -> Result<(u64, u64), AdapterError> {
        use std::io::Read;
        let err = |e: std::io::Error| {
            self.failed(format!("reading the files under `path`: {}", e.kind()))
        };
        let Some(longest) = ids.iter().map(Vec::len).max() else {
            return Ok((0, 0));
        };
        let mut by_len: BTreeMap<usize, std::collections::HashSet<&[u8]>> = BTreeMap::new();
        for id in ids {
            by_len.entry(id.len()).or_default().insert(id.as_slice());
        }
        let mut f = std::fs::File::open(file).map_err(err)?;
        let (mut seen, mut hits) = (BTreeSet::new(), 0u64);
        let mut buf: Vec<u8> = Vec::new();
        let mut chunk = vec![0u8; 8 << 20];
        loop {
            let n = f.read(&mut chunk).map_err(err)?;
            let eof = n == 0;
            buf.extend_from_slice(&chunk[..n]);
            // Every start that has its longest id's bytes in `buf` (or all, at the end).
            let starts = if eof { buf.len() } else { buf.len().saturating_sub(longest - 1) };
            for i in 0..starts {
                for (len, set) in &by_len {
                    if let Some(w) = buf.get(i..i + len) {
                        if set.contains(w) {
                            hits += 1;
                            seen.insert(w.to_vec());
                        }
                    }
                }
            }
            if eof {
                return Ok((seen.len() as u64, hits));
            }
            buf.drain(..starts);
        }
    }
}

/// A transport error, as shown: its kind and the OS's words, never a request's content.
fn shown(e: &ureq::Error) -> String {
    match e {
        ureq::Error::Timeout(_) => "timed out".into(),
        ureq::Error::Io(io) => format!("I/O error: {}", io.kind()),
        ureq::Error::ConnectionFailed => "connection failed".into(),
        ureq::Error::HostNotFound => "host not found".into(),
        ureq::Error::BodyExceedsLimit(_) => format!("the answer is larger than {} MiB", MAX_BODY >> 20),
        _ => "transport error".into(),
    }
}

impl Adapter for Phoenix {
    fn describe(&self) -> Description {
        let mut capabilities = vec![
            "scope:subject",
            "scope:tenant",
            "match:metadata-json-string-eq",
            "erase:whole-trace",
            "delete:trace-id",
            "verify:read-back-polled",
        ];
        if self.path.is_some() {
            capabilities.push("physical:sqlite-bytes-read-only");
        }
        Description {
            kind: crate::Kind::Phoenix,
            version: "1",
            capabilities,
        }
    }

    /// Every identifier is expressible (it is only compared, never sent); a memory scope is
    /// exempt: a trace holds no memory id.
    fn check_scope(&self, scope: &Scope) -> Result<Applicability, AdapterError> {
        Ok(match scope {
            Scope::Memory { .. } => Applicability::Exempt(
                "a Phoenix trace holds no memory id: a memory's traces are erased with its subject".into(),
            ),
            _ => Applicability::Applies,
        })
    }

    fn probe(&self) -> Result<(), AdapterError> {
        let url = format!(
            "{}/projects/{}/spans?limit=1",
            self.api,
            enc(&self.project)
        );
        self.get_json("probing the project", &url).map(|_| ())
    }

    /// The project and metadata keys; not the host.
    fn place(&self) -> String {
        format!(
            "phoenix:{} tenant:{} subject:{}",
            self.project, self.keys.tenant, self.keys.subject
        )
    }

    fn inventory(&self, scope: &Scope) -> Result<Inventory, AdapterError> {
        if matches!(scope, Scope::Memory { .. }) {
            return Ok(Inventory::default());
        }
        Ok(Inventory::from_locators(
            self.traces(scope, None)?
                .into_iter()
                .filter(|(_, (_, carries))| *carries)
                .map(|(t, (n, _))| (hex_locator("t:", t.as_bytes()), n))
                .collect(),
        ))
    }

    fn erase_batch(&self, scope: &Scope, batch: &[Locator]) -> Result<u64, AdapterError> {
        let expected: u64 = batch.iter().map(|(_, n)| n).sum();
        let ids = self.ids_of(batch)?;
        if ids.is_empty() {
            return Ok(0);
        }
        // Each trace read back first, in this project: nothing is deleted unless every trace
        // of the batch still carries the scope and holds no more spans than frozen.
        let mut now = Traces::new();
        for chunk in ids.chunks(50) {
            now.extend(self.traces(scope, Some(chunk))?);
        }
        for ((_, frozen), id) in batch.iter().zip(&ids) {
            if let Some((n, carries)) = now.get(id) {
                let allowed = if *carries { *frozen } else { 0 };
                within_inventory(&self.name, allowed, *n)?;
            }
        }
        let mut erased = 0u64;
        for id in &ids {
            // A trace not in this project now is never deleted (it is gone, or moved).
            let Some((n, _)) = now.get(id) else { continue };
            let url = format!("{}/traces/{}", self.api, enc(id));
            let (status, _) = self.send("deleting a trace", true, &url)?;
            match status {
                200..=299 => erased += n,
                // Gone since the read-back: another run erased it.
                404 => {}
                401 | 403 => {
                    return Err(self.failed(format!(
                        "deleting a trace: Phoenix answered HTTP {status}: check api_key_file (a key that may delete)"
                    )))
                }
                _ => return Err(self.failed(format!("deleting a trace: Phoenix answered HTTP {status}"))),
            }
            within_inventory(&self.name, expected, erased)?;
        }
        Ok(erased)
    }

    fn batch_size(&self) -> Option<usize> {
        Some(self.batch)
    }

    /// [`Phoenix::physical_residue`]: every occurrence of an erased trace id's bytes in
    /// `phoenix.db` and `phoenix.db-wal`.
    fn physical(&self, frozen: &[Locator]) -> Result<Option<Physical>, AdapterError> {
        Ok(Phoenix::physical_residue(self, frozen)?.map(|r| Physical {
            residue: r.db_hits + r.wal_hits,
            remedy: PhysicalResidue::REMEDY,
        }))
    }

    /// Read back until nothing is left, for at most `verify_timeout_ms`: a 204 is not proof.
    fn verify(&self, scope: &Scope, frozen: &[Locator]) -> Result<u64, AdapterError> {
        if matches!(scope, Scope::Memory { .. }) {
            return Ok(0);
        }
        let frozen: BTreeSet<String> = self.ids_of(frozen)?.into_iter().collect();
        let started = Instant::now();
        loop {
            let left = self.left(scope, &frozen)?;
            if left == 0 || started.elapsed() + VERIFY_PAUSE > self.verify_timeout {
                return Ok(left);
            }
            tracing::debug!(target = %self.name, left, "Phoenix still lists erased spans; reading again.");
            // Polling a real server until its reads show the delete, not a clock a test controls.
            #[allow(clippy::disallowed_methods)]
            std::thread::sleep(VERIFY_PAUSE);
        }
    }
}
