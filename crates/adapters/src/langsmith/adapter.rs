//! The `langsmith` adapter: LangSmith's runs API over the `http` kind's client; runs matched
//! here by their metadata, traces deleted whole by id, and the delete verified by reading back.

use std::collections::{BTreeMap, BTreeSet};
use std::time::{Duration, Instant};

use lethe_core::Scope;
use serde_json::{json, Value};
use ureq::http::Method;

use crate::http::client::{Client, SendError};
use crate::{
    within_inventory, Adapter, AdapterError, Applicability, Description, Inventory, Locator,
};

/// The keys inside a run's `extra.metadata` that hold the Lethe tenant and subject (LangGraph
/// copies the run config's `metadata` there).
#[derive(Debug, Clone)]
pub(crate) struct Keys {
    pub(crate) tenant: String,
    pub(crate) subject: String,
}

/// How verification reads back.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Timing {
    /// Between two read-backs.
    pub(crate) poll: Duration,
    /// How long verification reads back in all before what is still there is residue.
    pub(crate) verify_timeout: Duration,
}

/// The most runs one query page returns.
const PAGE: usize = 100;

/// Whether `s` is a UUID as LangSmith writes them: lower-case hex, hyphenated.
pub(crate) fn is_uuid(s: &str) -> bool {
    let b = s.as_bytes();
    b.len() == 36
        && b.iter().enumerate().all(|(i, c)| match i {
            8 | 13 | 18 | 23 => *c == b'-',
            _ => c.is_ascii_digit() || (b'a'..=b'f').contains(c),
        })
}

/// A `langsmith` target.
pub struct LangSmith {
    name: String,
    client: Client,
    project: String,
    keys: Keys,
    batch: usize,
    in_flight: usize,
    timing: Timing,
}

impl std::fmt::Debug for LangSmith {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LangSmith")
            .field("name", &self.name)
            .field("project", &self.project)
            .finish_non_exhaustive()
    }
}

/// A trace read back: its id, its runs now, and whether one of them carries the scope.
type TraceNow = (String, (u64, bool));

/// One run as this target reads it: its trace and its metadata, nothing else.
struct Run {
    trace: String,
    metadata: serde_json::Map<String, Value>,
}

impl LangSmith {
    pub(crate) fn new(
        name: &str,
        client: Client,
        project: String,
        keys: Keys,
        batch: usize,
        in_flight: usize,
        timing: Timing,
    ) -> Self {
        Self {
            name: name.to_string(),
            client,
            project,
            keys,
            batch,
            in_flight,
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

    /// One POST; the JSON body of a 2xx answer. LangSmith's `detail` may echo the request: only
    /// the status is shown.
    fn post(&self, path: &str, body: &Value, key: &str, what: &str) -> Result<Value, AdapterError> {
        let bytes = serde_json::to_vec(body).expect("a JSON value serializes");
        let reply = self
            .client
            .send(&Method::POST, path, false, Some(&bytes), key, what)
            .map_err(|e| match e {
                SendError::Unavailable(why) | SendError::Busy(why) => self.unavailable(why),
            })?;
        match reply.status {
            200..=299 => Ok(serde_json::from_slice(&reply.body).unwrap_or(Value::Null)),
            s @ (401 | 403) => Err(self.failed(format!(
                "{what}: LangSmith refused the api key (HTTP {s}): api_key_file must hold a key of the workspace that owns project_id (and workspace_id, for an organisation key)"
            ))),
            404 => Err(self.failed(format!("{what}: HTTP 404: no project with project_id"))),
            s @ (409 | 500..=599) => Err(self.unavailable(format!("{what}: HTTP {s}"))),
            s => Err(self.failed(format!("{what}: LangSmith refused the request (HTTP {s})"))),
        }
    }

    /// Every run of the project that the query `extra` narrows to, following the cursor: its
    /// trace id and `extra.metadata`, never its inputs or outputs.
    fn runs(&self, extra: Value, what: &str) -> Result<Vec<Run>, AdapterError> {
        let mut out = Vec::new();
        let mut cursor = Value::Null;
        loop {
            let mut body = json!({
                "session": [self.project],
                "select": ["id", "trace_id", "extra"],
                "limit": PAGE,
            });
            for (k, v) in extra.as_object().into_iter().flatten() {
                body[k] = v.clone();
            }
            if !cursor.is_null() {
                body["cursor"] = cursor.clone();
            }
            let v = self.post("/api/v1/runs/query", &body, "runs-query", what)?;
            let runs = v
                .get("runs")
                .and_then(Value::as_array)
                .ok_or_else(|| self.failed(format!("{what}: the answer has no `runs`")))?;
            for r in runs {
                let trace = r
                    .get("trace_id")
                    .and_then(Value::as_str)
                    .filter(|t| is_uuid(t))
                    .ok_or_else(|| self.failed(format!("{what}: a run has no trace_id")))?;
                let metadata = r
                    .pointer("/extra/metadata")
                    .and_then(Value::as_object)
                    .cloned()
                    .unwrap_or_default();
                out.push(Run {
                    trace: trace.to_string(),
                    metadata,
                });
            }
            cursor = v.pointer("/cursors/next").cloned().unwrap_or(Value::Null);
            if cursor.is_null() || runs.is_empty() {
                return Ok(out);
            }
        }
    }

    /// Whether a run's metadata holds the scope's identifiers as JSON strings, byte for byte.
    fn carries(&self, run: &Run, scope: &Scope) -> bool {
        crate::carries(
            |k| run.metadata.get(k).and_then(Value::as_str),
            &self.keys.tenant,
            &self.keys.subject,
            None,
            scope,
        )
    }

    /// The traces with a run that carries the scope. The only filter sent names the subject's
    /// key (`eq(metadata_key, "K")`): no identifier goes into LangSmith's filter language,
    /// whose quoting is not specified; values are compared here.
    fn traces_in_scope(&self, scope: &Scope) -> Result<BTreeSet<String>, AdapterError> {
        let key = match scope {
            Scope::Tenant { .. } => &self.keys.tenant,
            _ => &self.keys.subject,
        };
        let runs = self.runs(
            json!({ "filter": format!("eq(metadata_key, \"{key}\")") }),
            "Query runs",
        )?;
        Ok(runs
            .iter()
            .filter(|r| self.carries(r, scope))
            .map(|r| r.trace.clone())
            .collect())
    }

    /// For each trace, its runs now and whether one carries the scope; at most `max_in_flight`
    /// traces read at once.
    fn read_traces(&self, traces: &[String], scope: &Scope) -> Result<BTreeMap<String, (u64, bool)>, AdapterError> {
        let mut out = BTreeMap::new();
        for group in traces.chunks(self.in_flight) {
            let results: Vec<Result<TraceNow, AdapterError>> = std::thread::scope(|s| {
                let handles: Vec<_> = group
                    .iter()
                    .map(|t| {
                        s.spawn(move || {
                            let runs = self.runs(json!({ "trace": t }), "Read back a trace")?;
                            if runs.iter().any(|r| r.trace != *t) {
                                return Err(self.failed("Read back a trace: a run of another trace was returned"));
                            }
                            let carried = runs.iter().any(|r| self.carries(r, scope));
                            Ok((t.clone(), (runs.len() as u64, carried)))
                        })
                    })
                    .collect();
                handles.into_iter().map(|h| h.join().expect("a read-back thread panicked")).collect()
            });
            for r in results {
                let (t, v) = r?;
                out.insert(t, v);
            }
        }
        Ok(out)
    }

    fn traces_of(&self, batch: &[Locator]) -> Result<Vec<String>, AdapterError> {
        batch
            .iter()
            .map(|(loc, _)| {
                loc.strip_prefix("t:")
                    .filter(|t| is_uuid(t))
                    .map(str::to_string)
                    .ok_or_else(|| self.failed("a frozen locator is not a trace id of this kind: the journal was edited"))
            })
            .collect()
    }

    /// What is left: the runs of the frozen traces still readable, plus the runs of any other
    /// trace now in scope.
    fn left(&self, scope: &Scope, frozen: &[String]) -> Result<u64, AdapterError> {
        let mut traces: BTreeSet<String> = self.traces_in_scope(scope)?;
        traces.extend(frozen.iter().cloned());
        let traces: Vec<String> = traces.into_iter().collect();
        Ok(self.read_traces(&traces, scope)?.values().map(|(n, _)| n).sum())
    }
}

impl Adapter for LangSmith {
    fn describe(&self) -> Description {
        Description {
            kind: crate::Kind::Langsmith,
            version: "1",
            capabilities: vec![
                "scope:subject",
                "scope:tenant",
                "scope:memory-exempt",
                "match:metadata-exact-here",
                "delete:trace-whole",
                "verify:read-back-bounded",
            ],
        }
    }

    /// Runs name no memory: a memory scope is exempt.
    fn check_scope(&self, scope: &Scope) -> Result<Applicability, AdapterError> {
        Ok(match scope {
            Scope::Memory { .. } => Applicability::Exempt(
                "LangSmith runs carry no memory id; a subject erasure takes the subject's traces whole".into(),
            ),
            _ => Applicability::Applies,
        })
    }

    /// One page of one run of the project: the key is accepted and the project exists.
    fn probe(&self) -> Result<(), AdapterError> {
        let body = json!({ "session": [self.project], "select": ["id"], "limit": 1 });
        self.post("/api/v1/runs/query", &body, "runs-query", "Query runs").map(|_| ())
    }

    fn place(&self) -> String {
        format!(
            "langsmith:{} tenant:{} subject:{}",
            self.project, self.keys.tenant, self.keys.subject
        )
    }

    fn inventory(&self, scope: &Scope) -> Result<Inventory, AdapterError> {
        if matches!(scope, Scope::Memory { .. }) {
            return Ok(Inventory::default());
        }
        let traces: Vec<String> = self.traces_in_scope(scope)?.into_iter().collect();
        let read = self.read_traces(&traces, scope)?;
        Ok(Inventory::from_locators(
            read.into_iter()
                .filter(|(_, (n, _))| *n > 0)
                .map(|(t, (n, _))| (format!("t:{t}"), n))
                .collect(),
        ))
    }

    /// Each frozen trace read back: one grown since the freeze, or no longer holding a run of
    /// the scope, stops the batch before anything is deleted (`anomalous_volume`). Then the
    /// traces still there go by `POST /api/v1/runs/delete` (`session_id`, `trace_ids`, at most
    /// 1,000 a request). LangSmith answers before it deletes (a delete job runs later): the
    /// count is the runs the traces held, and only verification says they are gone.
    fn erase_batch(&self, scope: &Scope, batch: &[Locator]) -> Result<u64, AdapterError> {
        if matches!(scope, Scope::Memory { .. }) {
            return Ok(0);
        }
        let traces = self.traces_of(batch)?;
        let frozen: BTreeMap<&String, u64> = traces.iter().zip(batch.iter().map(|(_, n)| *n)).collect();
        let now = self.read_traces(&traces, scope)?;
        let (mut allowed, mut found) = (0u64, 0u64);
        let mut present = Vec::new();
        for (t, (n, carried)) in &now {
            if *n == 0 {
                continue;
            }
            found += n;
            if *carried {
                allowed += (*n).min(frozen.get(t).copied().unwrap_or(0));
            }
            present.push(t.clone());
        }
        within_inventory(&self.name, allowed, found)?;
        for chunk in present.chunks(self.batch) {
            // The same key on every retry of the same traces (LangSmith may ignore it).
            let key = hex::encode(<sha2::Sha256 as sha2::Digest>::digest(chunk.join(",")));
            self.post(
                "/api/v1/runs/delete",
                &json!({ "session_id": self.project, "trace_ids": chunk }),
                &key,
                "Delete runs",
            )?;
        }
        Ok(found)
    }

    fn batch_size(&self) -> Option<usize> {
        Some(self.batch)
    }

    /// Reads back until nothing of the scope is readable, within `verify_timeout_ms`: a 200
    /// from the delete is not proof, LangSmith deletes later. What is still readable then is
    /// the residue (the job BLOCKED `residue`; a resume reads back again).
    fn verify(&self, scope: &Scope, frozen: &[Locator]) -> Result<u64, AdapterError> {
        if matches!(scope, Scope::Memory { .. }) {
            return Ok(0);
        }
        let frozen = self.traces_of(frozen)?;
        let started = Instant::now();
        loop {
            let left = self.left(scope, &frozen)?;
            if left == 0 || started.elapsed() + self.timing.poll > self.timing.verify_timeout {
                return Ok(left);
            }
            tracing::debug!(target_name = %self.name, left, "LangSmith still returns erased runs; reading back again.");
            // Waiting for the vendor's delete job, not a clock a test controls.
            #[allow(clippy::disallowed_methods)]
            std::thread::sleep(self.timing.poll);
        }
    }
}
