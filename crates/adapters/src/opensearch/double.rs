//! A contract double of an OpenSearch index's REST API, written from OpenSearch's REST
//! reference (and Elasticsearch's, which it shares: Search with scroll, Count, Refresh, Delete
//! by query, Tasks, Get field mapping), for what the adapter depends on. Served by
//! [`crate::doubles::Server`].
//!
//! What it reproduces, each rule checked by a test in `tests.rs`:
//! - HTTP Basic credentials, checked on every request (401 otherwise);
//! - near-real-time search: a write is invisible to search, count and delete by query until a
//!   refresh (`POST <index>/_refresh`, or `refresh=true` on the delete); so is a delete;
//! - the query DSL subset the adapter emits, and nothing more (else 400 `parsing_exception`):
//!   `bool.filter` of `term` and `ids`; a `term` on a `text` field matches an analysed word
//!   (lower-cased, split on non-alphanumerics), as the real one does;
//! - search `size` and `from + size` at most 10,000 (`max_result_window`, else 400); scroll with
//!   `_scroll_id`, `POST _search/scroll`, `DELETE _search/scroll`; `hits.total` capped at
//!   10,000 (`gte`) unless `track_total_hits`;
//! - `_delete_by_query`: a snapshot of the visible matching documents when it starts, deleted
//!   with internal versioning: a document written since (a "conflict") is not deleted; without
//!   `conflicts=proceed` the task aborts at the first conflict, with `failures`; `max_docs`
//!   bounds what it deletes; `wait_for_completion=false` answers `{"task": "node:n"}` and the
//!   task completes after `task_polls` reads of `GET _tasks/<id>`, applying its deletes then;
//! - a k-NN search (`knn` on `embedding`, `l2`), for the recall test;
//! - field mappings by `GET <index>/_mapping/field/<a>,<b>`;
//! - faults on demand: 429 with or without `Retry-After`, any status, a dropped connection.

use std::collections::{BTreeMap, BTreeSet, VecDeque};
use std::sync::{Arc, Mutex};

use serde_json::{json, Map, Value};

use crate::doubles::{Request, Response, Server};

pub const INDEX: &str = "memories";
/// The HTTP Basic credentials the double accepts.
pub const USER: &str = "lethe";
pub const PASSWORD: &str = "S3CRET-pw";

/// A fault served instead of the next request's answer.
#[derive(Debug, Clone, Copy)]
pub enum Fault {
    /// 429 `es_rejected_execution_exception`, with `Retry-After` in seconds if given.
    TooMany(Option<u64>),
    /// This status, with an error body.
    Status(u16),
    /// Close the connection without an answer, doing nothing.
    Drop,
}

/// One stored document.
#[derive(Debug, Clone)]
pub struct Doc {
    pub source: Map<String, Value>,
    pub version: u64,
}

#[derive(Debug)]
struct Task {
    polls_left: u32,
    /// Ids to delete when the task runs, in order.
    ids: Vec<String>,
    /// Versions seen at the snapshot.
    versions: BTreeMap<String, u64>,
    proceed: bool,
    max_docs: Option<usize>,
    refresh: bool,
    response: Option<Value>,
}

#[derive(Default)]
pub struct State {
    /// The index by id: what a refreshed reader sees is `visible`.
    pub docs: BTreeMap<String, Doc>,
    /// The documents as the last refresh left them visible (id to version).
    visible: BTreeMap<String, Doc>,
    /// Mapping types of the owner fields (`keyword` unless set).
    pub types: BTreeMap<String, String>,
    /// Reads of `GET _tasks/<id>` before a delete task completes.
    pub task_polls: u32,
    tasks: BTreeMap<String, Task>,
    next_task: u64,
    scrolls: BTreeMap<String, (Vec<Value>, usize)>,
    /// Ids whose documents are rewritten (version bumped) just as a delete task runs.
    pub conflicts: BTreeSet<String>,
    pub faults: VecDeque<Fault>,
    /// `METHOD path?query` of each request.
    pub seen: Vec<String>,
    pub bad_auth: usize,
    pub refreshes: usize,
}

impl State {
    /// A write: stored now, visible after the next refresh.
    pub fn put(&mut self, id: &str, source: Map<String, Value>) {
        let version = self.docs.get(id).map_or(1, |d| d.version + 1);
        self.docs.insert(id.to_string(), Doc { source, version });
    }

    fn refresh(&mut self) {
        self.visible = self.docs.clone();
        self.refreshes += 1;
    }
}

pub struct Double {
    state: Arc<Mutex<State>>,
    pub server: Server,
}

impl Double {
    /// A double whose index holds `docs` (by `id`), refreshed.
    pub fn start(docs: Vec<(String, Map<String, Value>)>) -> Double {
        let mut st = State {
            task_polls: 2,
            ..State::default()
        };
        for (id, d) in docs {
            st.put(&id, d);
        }
        st.refresh();
        st.refreshes = 0;
        let state = Arc::new(Mutex::new(st));
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

fn error(status: u16, kind: &str, reason: &str) -> Response {
    Response::json(
        status,
        json!({ "error": { "root_cause": [{ "type": kind, "reason": reason }], "type": kind, "reason": reason }, "status": status }),
    )
}

fn basic_ok(r: &Request) -> bool {
    let want = format!("Basic {}", b64(format!("{USER}:{PASSWORD}").as_bytes()));
    r.headers.get("authorization") == Some(&want)
}

fn b64(bytes: &[u8]) -> String {
    const A: &[u8; 64] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
    let mut out = String::new();
    for c in bytes.chunks(3) {
        let n = (u32::from(c[0]) << 16) | (u32::from(*c.get(1).unwrap_or(&0)) << 8) | u32::from(*c.get(2).unwrap_or(&0));
        for i in 0..4 {
            out.push(if i <= c.len() { A[(n >> (18 - 6 * i) & 63) as usize] as char } else { '=' });
        }
    }
    out
}

fn handle(s: &mut State, r: &Request) -> Option<Response> {
    let q: Vec<String> = r.query.iter().map(|(k, v)| format!("{k}={v}")).collect();
    s.seen.push(format!("{} {}?{}", r.method, r.path, q.join("&")));
    if !basic_ok(r) {
        s.bad_auth += 1;
        return Some(error(401, "security_exception", "missing authentication credentials"));
    }
    if let Some(f) = s.faults.pop_front() {
        return match f {
            Fault::TooMany(secs) => {
                let resp = error(429, "es_rejected_execution_exception", "rejected execution");
                Some(match secs {
                    Some(n) => resp.with("Retry-After", n.to_string()),
                    None => resp,
                })
            }
            Fault::Status(code) => Some(error(code, "fault", "fault")),
            Fault::Drop => None,
        };
    }
    let body = r.json();
    let index_path = |op: &str| format!("/{INDEX}/{op}");
    Some(match (r.method.as_str(), r.path.as_str()) {
        ("POST", p) if p == index_path("_refresh") => {
            s.refresh();
            Response::json(200, json!({ "_shards": { "total": 2, "successful": 2, "failed": 0 } }))
        }
        ("POST", p) if p == index_path("_count") => match query_of(s, body.as_ref()) {
            Ok(f) => {
                let n = s.visible.iter().filter(|(id, d)| f.eval(id, d, &s.types)).count();
                Response::json(200, json!({ "count": n, "_shards": { "total": 1, "successful": 1, "failed": 0 } }))
            }
            Err(e) => e,
        },
        ("POST", p) if p == index_path("_search") => search(s, r, body.as_ref()),
        ("POST", "/_search/scroll") => {
            let id = body.as_ref().and_then(|b| b.get("scroll_id")).and_then(Value::as_str).unwrap_or("");
            match s.scrolls.get_mut(id) {
                Some((hits, at)) => {
                    let page: Vec<Value> = hits[*at..].iter().take(1_000).cloned().collect();
                    *at += page.len();
                    let total = hits.len();
                    Response::json(200, json!({ "_scroll_id": id, "hits": { "total": { "value": total, "relation": "eq" }, "hits": page } }))
                }
                None => error(404, "search_context_missing_exception", "No search context found"),
            }
        }
        ("DELETE", "/_search/scroll") => {
            let ids: Vec<String> = body
                .as_ref()
                .and_then(|b| b.get("scroll_id"))
                .and_then(Value::as_array)
                .map(|a| a.iter().filter_map(|v| v.as_str().map(str::to_string)).collect())
                .unwrap_or_default();
            let freed = ids.iter().filter(|id| s.scrolls.remove(*id).is_some()).count();
            Response::json(200, json!({ "succeeded": true, "num_freed": freed }))
        }
        ("POST", p) if p == index_path("_delete_by_query") => delete_by_query(s, r, body.as_ref()),
        ("GET", p) if p.starts_with("/_tasks/") => get_task(s, &p["/_tasks/".len()..]),
        ("GET", p) if p.starts_with(&index_path("_mapping/field/")) => {
            let names = &p[index_path("_mapping/field/").len()..];
            let mut mappings = Map::new();
            for f in names.split(',') {
                if let Some(t) = field_type(&s.types, f) {
                    let last = f.rsplit('.').next().unwrap_or(f);
                    mappings.insert(f.into(), json!({ "full_name": f, "mapping": { last: { "type": t } } }));
                }
            }
            Response::json(200, json!({ INDEX: { "mappings": mappings } }))
        }
        (_, p) if p.starts_with('/') && !p.starts_with(&format!("/{INDEX}/")) && !p.starts_with("/_") => {
            error(404, "index_not_found_exception", "no such index")
        }
        _ => error(400, "illegal_argument_exception", "unsupported request"),
    })
}

/// The owner fields and `content` exist; anything else is unmapped.
fn field_type(types: &BTreeMap<String, String>, f: &str) -> Option<String> {
    match f {
        "tenant_id" | "user_id" | "meta.user_id" => Some(types.get(f).cloned().unwrap_or_else(|| "keyword".into())),
        "content" => Some("text".into()),
        _ => None,
    }
}

/// A k-NN search (the k-NN plugin's `knn` query, `l2` space): the `k` visible documents nearest
/// to `vector` by their `embedding`, best first; ids and scores only.
fn knn(s: &State, q: &Value) -> Response {
    let Some(v) = q.pointer("/knn/embedding/vector").and_then(Value::as_array) else {
        return error(400, "parsing_exception", "knn takes embedding.vector");
    };
    let v: Vec<f64> = v.iter().filter_map(Value::as_f64).collect();
    let k = q.pointer("/knn/embedding/k").and_then(Value::as_u64).unwrap_or(10) as usize;
    let mut hits: Vec<(f64, &String)> = s
        .visible
        .iter()
        .filter_map(|(id, d)| {
            let e: Vec<f64> = d.source.get("embedding")?.as_array()?.iter().filter_map(Value::as_f64).collect();
            let d2: f64 = e.iter().zip(&v).map(|(a, b)| (a - b) * (a - b)).sum();
            Some((1.0 / (1.0 + d2), id))
        })
        .collect();
    hits.sort_by(|a, b| b.0.total_cmp(&a.0).then(a.1.cmp(b.1)));
    let page: Vec<Value> = hits.iter().take(k).map(|(score, id)| json!({ "_index": INDEX, "_id": id, "_score": score })).collect();
    Response::json(200, json!({ "hits": { "total": { "value": page.len(), "relation": "eq" }, "hits": page } }))
}

fn search(s: &mut State, r: &Request, body: Option<&Value>) -> Response {
    if let Some(q) = body.and_then(|b| b.get("query")).filter(|q| q.get("knn").is_some()) {
        return knn(s, q);
    }
    let f = match query_of(s, body) {
        Ok(f) => f,
        Err(e) => return e,
    };
    let b = body.and_then(Value::as_object).cloned().unwrap_or_default();
    for k in b.keys() {
        if !matches!(k.as_str(), "query" | "size" | "from" | "sort" | "_source" | "version" | "track_total_hits") {
            return error(400, "parsing_exception", "unknown key");
        }
    }
    let size = b.get("size").and_then(Value::as_u64).unwrap_or(10) as usize;
    let from = b.get("from").and_then(Value::as_u64).unwrap_or(0) as usize;
    if from + size > 10_000 {
        return error(400, "illegal_argument_exception", "Result window is too large, from + size must be less than or equal to: [10000]");
    }
    let fields: Vec<String> = b
        .get("_source")
        .and_then(Value::as_array)
        .map(|a| a.iter().filter_map(|v| v.as_str().map(str::to_string)).collect())
        .unwrap_or_default();
    let version = b.get("version") == Some(&Value::Bool(true));
    let hits: Vec<Value> = s
        .visible
        .iter()
        .filter(|(id, d)| f.eval(id, d, &s.types))
        .map(|(id, d)| {
            let mut src = Map::new();
            for k in &fields {
                let top = k.split('.').next().unwrap_or(k);
                if let Some(v) = d.source.get(top) {
                    src.insert(top.to_string(), v.clone());
                }
            }
            let mut h = json!({ "_index": INDEX, "_id": id, "_score": null, "_source": src, "sort": [0] });
            if version {
                h["_version"] = json!(d.version);
            }
            h
        })
        .collect();
    let total = hits.len();
    let tracked = b.get("track_total_hits") == Some(&Value::Bool(true));
    let shown_total = if tracked || total <= 10_000 {
        json!({ "value": total, "relation": "eq" })
    } else {
        json!({ "value": 10_000, "relation": "gte" })
    };
    let page: Vec<Value> = hits.iter().skip(from).take(size).cloned().collect();
    let mut answer = json!({ "took": 1, "timed_out": false, "hits": { "total": shown_total, "hits": page } });
    if r.query.contains_key("scroll") {
        s.next_task += 1;
        let id = format!("scroll{}", s.next_task);
        let taken = page.len();
        s.scrolls.insert(id.clone(), (hits, from + taken));
        answer["_scroll_id"] = json!(id);
    }
    Response::json(200, answer)
}

fn delete_by_query(s: &mut State, r: &Request, body: Option<&Value>) -> Response {
    let f = match query_of(s, body) {
        Ok(f) => f,
        Err(e) => return e,
    };
    let max_docs = body.and_then(|b| b.get("max_docs")).and_then(Value::as_u64).map(|n| n as usize);
    let matched: Vec<String> = s
        .visible
        .iter()
        .filter(|(id, d)| f.eval(id, d, &s.types))
        .map(|(id, _)| id.clone())
        .collect();
    let versions = matched.iter().map(|id| (id.clone(), s.visible[id].version)).collect();
    let mut task = Task {
        polls_left: s.task_polls,
        ids: matched,
        versions,
        proceed: r.query.get("conflicts").map(String::as_str) == Some("proceed"),
        max_docs,
        refresh: r.query.get("refresh").map(String::as_str) == Some("true"),
        response: None,
    };
    if r.query.get("wait_for_completion").map(String::as_str) == Some("false") {
        s.next_task += 1;
        let id = format!("oTUltX4IQMOUUVeiohTt8A:{}", s.next_task);
        s.tasks.insert(id.clone(), task);
        return Response::json(200, json!({ "task": id }));
    }
    let resp = run(s, &mut task);
    let status = if resp["failures"].as_array().is_some_and(|f| !f.is_empty()) { 409 } else { 200 };
    Response::json(status, resp)
}

/// Runs a delete task: deletes its snapshot's documents, in id order, up to `max_docs`; a
/// conflict (a document rewritten since the snapshot) is counted and skipped with
/// `conflicts=proceed`, and aborts the task without.
fn run(s: &mut State, t: &mut Task) -> Value {
    let (mut deleted, mut conflicts, mut failures) = (0u64, 0u64, Vec::new());
    for id in t.ids.clone() {
        if t.max_docs.is_some_and(|m| deleted as usize + conflicts as usize >= m) {
            break;
        }
        if s.conflicts.remove(&id) {
            if let Some(d) = s.docs.get_mut(&id) {
                d.version += 1;
            }
        }
        let now = s.docs.get(&id).map(|d| d.version);
        if now != t.versions.get(&id).copied() {
            conflicts += 1;
            if !t.proceed {
                failures.push(json!({ "index": INDEX, "id": id, "cause": { "type": "version_conflict_engine_exception", "reason": "version conflict" }, "status": 409 }));
                break;
            }
            continue;
        }
        s.docs.remove(&id);
        deleted += 1;
    }
    if t.refresh {
        s.refresh();
    }
    json!({
        "took": 3, "timed_out": false, "total": t.ids.len(), "deleted": deleted, "batches": 1,
        "version_conflicts": conflicts, "noops": 0, "retries": { "bulk": 0, "search": 0 },
        "throttled_millis": 0, "requests_per_second": -1.0, "throttled_until_millis": 0,
        "failures": failures,
    })
}

fn get_task(s: &mut State, id: &str) -> Response {
    let Some(mut t) = s.tasks.remove(id) else {
        return error(404, "resource_not_found_exception", "task not found");
    };
    if t.response.is_none() {
        if t.polls_left > 0 {
            t.polls_left -= 1;
        } else {
            let resp = run(s, &mut t);
            t.response = Some(resp);
        }
    }
    let (node, n) = id.split_once(':').unwrap_or((id, "0"));
    let task = json!({ "node": node, "id": n.parse::<u64>().unwrap_or(0), "type": "transport", "action": "indices:data/write/delete/byquery", "status": { "total": t.ids.len() } });
    let answer = match &t.response {
        Some(r) => json!({ "completed": true, "task": task, "response": r }),
        None => json!({ "completed": false, "task": task }),
    };
    s.tasks.insert(id.to_string(), t);
    Response::json(200, answer)
}

/// The query DSL subset.
enum Query {
    All(Vec<Query>),
    Term(String, String),
    Ids(Vec<String>),
}

impl Query {
    fn eval(&self, id: &str, d: &Doc, types: &BTreeMap<String, String>) -> bool {
        match self {
            Query::All(all) => all.iter().all(|q| q.eval(id, d, types)),
            Query::Ids(ids) => ids.iter().any(|i| i == id),
            Query::Term(f, v) => {
                let mut at = Some(&Value::Object(d.source.clone())).cloned();
                for p in f.split('.') {
                    at = at.and_then(|x| x.get(p).cloned());
                }
                let values: Vec<String> = match at {
                    Some(Value::String(s)) => vec![s],
                    Some(Value::Array(a)) => a.into_iter().filter_map(|v| v.as_str().map(str::to_string)).collect(),
                    _ => vec![],
                };
                if field_type(types, f).as_deref() == Some("text") {
                    // Analysed: lower-cased words.
                    values.iter().any(|s| {
                        s.split(|c: char| !c.is_alphanumeric()).any(|w| w.to_lowercase() == *v)
                    })
                } else {
                    values.iter().any(|s| s == v)
                }
            }
        }
    }
}

fn query_of(_s: &State, body: Option<&Value>) -> Result<Query, Response> {
    let bad = |why: &str| error(400, "parsing_exception", why);
    let Some(q) = body.and_then(|b| b.get("query")) else {
        return Err(bad("no query"));
    };
    parse(q).map_err(|e| bad(&e))
}

fn parse(q: &Value) -> Result<Query, String> {
    let o = q.as_object().filter(|o| o.len() == 1).ok_or("a query is an object of one clause")?;
    let (k, v) = o.iter().next().unwrap();
    match k.as_str() {
        "bool" => {
            let b = v.as_object().ok_or("bool is an object")?;
            if b.keys().any(|k| k != "filter") {
                return Err("this double takes bool.filter only".into());
            }
            let list = b.get("filter").and_then(Value::as_array).ok_or("filter is a list")?;
            Ok(Query::All(list.iter().map(parse).collect::<Result<_, _>>()?))
        }
        "term" => {
            let t = v.as_object().filter(|o| o.len() == 1).ok_or("term names one field")?;
            let (f, val) = t.iter().next().unwrap();
            let val = match val {
                Value::String(s) => s.clone(),
                Value::Object(o) if o.len() == 1 => o.get("value").and_then(Value::as_str).ok_or("term value is a string")?.to_string(),
                _ => return Err("term value is a string".into()),
            };
            Ok(Query::Term(f.clone(), val))
        }
        "ids" => {
            let vals = v.get("values").and_then(Value::as_array).ok_or("ids.values is a list")?;
            Ok(Query::Ids(vals.iter().map(|x| x.as_str().map(str::to_string).ok_or("an id is a string")).collect::<Result<_, _>>()?))
        }
        other => Err(format!("this double does not take [{other}] queries")),
    }
}
