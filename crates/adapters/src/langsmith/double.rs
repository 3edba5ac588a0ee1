//! A contract double of LangSmith's runs API for one tracing project, written from LangSmith's
//! API reference and its data-purging guide, for what the adapter depends on. Served by
//! [`crate::doubles::Server`].
//!
//! What it reproduces, each rule checked by a test in `tests.rs`:
//! - the `x-api-key` header on every request (401 otherwise);
//! - `POST /api/v1/runs/query` with `session`, `filter`, `trace`, `select`, `limit` (at most
//!   100, else 422) and `cursor`; `cursors.next` while more runs match; without `select`, whole
//!   runs (inputs and outputs included); the one filter form the adapter sends,
//!   `eq(metadata_key, "K")`, and no other (400);
//! - `POST /api/v1/runs/delete` with `session_id` and at most 1,000 `trace_ids` (else 422),
//!   answered 200 `{}` at once and carried out later: the runs stay readable for `delay` more
//!   queries (the guide: deletes are not instant, there is no confirmation, query again);
//! - faults on demand: 429 with `Retry-After`, any status, a dropped connection.

use std::collections::VecDeque;
use std::sync::{Arc, Mutex};

use serde_json::{json, Map, Value};

use crate::doubles::{Request, Response, Server};

pub const PROJECT: &str = "018e4c7e-a9fb-7ef0-a5b6-6ea3a82e9327";
pub const KEY: &str = "lsv2_pt_S3CRET_0123";

#[derive(Debug, Clone, Copy)]
pub enum Fault {
    TooMany(u64),
    Status(u16),
    Drop,
}

/// One run, as LangSmith stores it.
#[derive(Debug, Clone)]
pub struct Run {
    pub id: String,
    pub trace_id: String,
    pub metadata: Map<String, Value>,
    pub inputs: Value,
    pub outputs: Value,
}

#[derive(Default)]
pub struct State {
    pub runs: Vec<Run>,
    /// Accepted deletes: trace ids, and the queries left before they are carried out.
    pending: Vec<(Vec<String>, u32)>,
    /// Queries an accepted delete waits before it is carried out.
    pub delay: u32,
    pub faults: VecDeque<Fault>,
    /// The body of each query.
    pub queries: Vec<Value>,
    /// The number of trace ids of each delete request.
    pub deletes: Vec<usize>,
    pub bad_auth: usize,
}

impl State {
    /// The runs the service keeps: those no accepted delete names (which queries still return
    /// until the delete is carried out).
    pub fn kept(&self) -> impl Iterator<Item = &Run> {
        self.runs
            .iter()
            .filter(|r| !self.pending.iter().any(|(ids, _)| ids.contains(&r.trace_id)))
    }

    /// Carries out every accepted delete at the next query (LangSmith's delete job has run).
    pub fn carry_out(&mut self) {
        for (_, left) in &mut self.pending {
            *left = 0;
        }
    }

    /// Whether every accepted delete was carried out.
    pub fn settled(&self) -> bool {
        self.pending.is_empty()
    }
}

pub struct Double {
    state: Arc<Mutex<State>>,
    pub server: Server,
}

impl Double {
    pub fn start(runs: Vec<Run>) -> Double {
        let state = Arc::new(Mutex::new(State {
            runs,
            delay: 2,
            ..State::default()
        }));
        let s = state.clone();
        let server = Server::start(move |r| handle(&mut s.lock().unwrap(), r));
        Double { state, server }
    }

    pub fn url(&self) -> String {
        self.server.url()
    }

    pub fn with<T>(&self, f: impl FnOnce(&mut State) -> T) -> T {
        f(&mut self.state.lock().unwrap())
    }
}

fn error(status: u16, detail: &str) -> Response {
    Response::json(status, json!({ "detail": detail }))
}

fn handle(s: &mut State, r: &Request) -> Option<Response> {
    if r.headers.get("x-api-key").map(String::as_str) != Some(KEY) {
        s.bad_auth += 1;
        return Some(error(401, "Invalid token"));
    }
    if let Some(f) = s.faults.pop_front() {
        return match f {
            Fault::TooMany(secs) => Some(error(429, "Too many requests").with("Retry-After", secs.to_string())),
            Fault::Status(c) => Some(error(c, "Internal server error")),
            Fault::Drop => None,
        };
    }
    let body = r.json().and_then(|v| v.as_object().cloned()).unwrap_or_default();
    Some(match (r.method.as_str(), r.path.as_str()) {
        ("POST", "/api/v1/runs/query") => query(s, &body),
        ("POST", "/api/v1/runs/delete") => {
            if body.get("session_id").and_then(Value::as_str) != Some(PROJECT) {
                return Some(error(404, "Session not found"));
            }
            let Some(ids) = body.get("trace_ids").and_then(Value::as_array) else {
                return Some(error(422, "trace_ids: field required"));
            };
            s.deletes.push(ids.len());
            if ids.len() > 1_000 {
                return Some(error(422, "trace_ids: at most 1000 items"));
            }
            let ids: Vec<String> = ids.iter().filter_map(|v| v.as_str().map(str::to_string)).collect();
            let delay = s.delay;
            s.pending.push((ids, delay));
            Response::json(200, json!({}))
        }
        _ => error(404, "Not Found"),
    })
}

fn query(s: &mut State, body: &Map<String, Value>) -> Response {
    s.queries.push(Value::Object(body.clone()));
    // Accepted deletes are carried out a few queries later.
    let mut landed = Vec::new();
    s.pending.retain_mut(|(ids, left)| {
        if *left == 0 {
            landed.append(ids);
            false
        } else {
            *left -= 1;
            true
        }
    });
    s.runs.retain(|r| !landed.contains(&r.trace_id));
    for k in body.keys() {
        if !matches!(k.as_str(), "session" | "filter" | "trace" | "select" | "limit" | "cursor") {
            return error(422, "unknown field");
        }
    }
    if body.get("session") != Some(&json!([PROJECT])) {
        return error(404, "Session not found");
    }
    let limit = body.get("limit").and_then(Value::as_u64).unwrap_or(100) as usize;
    if limit == 0 || limit > 100 {
        return error(422, "limit: ensure this value is less than or equal to 100");
    }
    let key = match body.get("filter").map(Value::as_str) {
        None => None,
        Some(Some(f)) => match f.strip_prefix("eq(metadata_key, \"").and_then(|x| x.strip_suffix("\")")) {
            Some(k) if !k.contains('"') => Some(k.to_string()),
            _ => return error(400, "this double takes eq(metadata_key, \"K\") only"),
        },
        Some(None) => return error(422, "filter is a string"),
    };
    let trace = body.get("trace").and_then(Value::as_str);
    let from = body
        .get("cursor")
        .and_then(Value::as_str)
        .and_then(|c| c.strip_prefix("o:"))
        .and_then(|n| n.parse::<usize>().ok())
        .unwrap_or(0);
    let select: Option<Vec<String>> = body
        .get("select")
        .and_then(Value::as_array)
        .map(|a| a.iter().filter_map(|v| v.as_str().map(str::to_string)).collect());
    let hits: Vec<&Run> = s
        .runs
        .iter()
        .filter(|r| key.as_ref().is_none_or(|k| r.metadata.contains_key(k)))
        .filter(|r| trace.is_none_or(|t| r.trace_id == t))
        .collect();
    let page: Vec<Value> = hits
        .iter()
        .skip(from)
        .take(limit)
        .map(|r| {
            let full = json!({
                "id": r.id, "trace_id": r.trace_id, "session_id": PROJECT, "name": "agent",
                "run_type": "chain", "inputs": r.inputs, "outputs": r.outputs,
                "extra": { "metadata": r.metadata, "runtime": { "sdk": "langsmith-py" } },
            });
            match &select {
                None => full,
                Some(fields) => {
                    let mut m = Map::new();
                    for f in fields {
                        if let Some(v) = full.get(f) {
                            m.insert(f.clone(), v.clone());
                        }
                    }
                    Value::Object(m)
                }
            }
        })
        .collect();
    let next = if from + page.len() < hits.len() { json!(format!("o:{}", from + page.len())) } else { Value::Null };
    Response::json(200, json!({ "runs": page, "cursors": { "next": next, "prev": null } }))
}
