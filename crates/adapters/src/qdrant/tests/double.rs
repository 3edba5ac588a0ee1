//! A contract double of Qdrant's REST API for one collection, written from Qdrant's API
//! reference (points: scroll, count, retrieve, delete), for what the adapter depends on. Served
//! by [`crate::doubles::Server`].
//!
//! What it reproduces, each rule checked by a test in `tests.rs`:
//! - the `api-key` header on every request (401 without, 403 with a wrong one);
//! - filters: `must` of `{"key", "match": {"value"}}` (exact on a string; any member of a
//!   list) and `has_id`; anything else is a 400 (so an adapter that emits something else fails
//!   its tests); nested keys by `.`;
//! - scroll: ordered by id, `limit` 10 when absent, `next_page_offset` to follow, `with_payload`
//!   as a list of keys, `with_vector`;
//! - count: exact only with `exact: true`; otherwise an estimate that still counts points
//!   deleted since the last optimization;
//! - search by vector (`points/search`, cosine), for the recall test;
//! - delete by filter or ids: with `wait=true` applied before the answer (`completed`), without
//!   it `acknowledged` and applied only after `apply_after` more requests; the answer says
//!   nothing of what was deleted;
//! - faults on demand: 429 with or without `Retry-After`, any status, a dropped connection.

use std::collections::{BTreeMap, VecDeque};
use std::sync::{Arc, Mutex};

use serde_json::{json, Map, Value};

use crate::doubles::{Request, Response, Server};
use crate::qdrant::adapter::PointId;

pub(super) const COLLECTION: &str = "memories";
pub(super) const KEY: &str = "qdrant-S3CRET-key";

#[derive(Debug, Clone, Copy)]
pub(super) enum Fault {
    TooMany(Option<u64>),
    Status(u16),
    Drop,
}

#[derive(Debug, Clone)]
pub(super) struct Point {
    pub(super) payload: Map<String, Value>,
    pub(super) vector: Vec<f64>,
}

#[derive(Default)]
pub(super) struct State {
    pub(super) points: BTreeMap<PointId, Point>,
    /// Points deleted since the last optimization: an estimate still counts them.
    deleted: BTreeMap<PointId, Point>,
    /// Deletes acknowledged (without `wait=true`) and the requests left before each applies.
    pending: Vec<(Vec<PointId>, u32)>,
    /// Requests after which an acknowledged delete is applied.
    pub(super) apply_after: u32,
    pub(super) faults: VecDeque<Fault>,
    /// `path?query` of each request.
    pub(super) seen: Vec<String>,
    pub(super) bad_auth: usize,
}

pub(super) struct Double {
    state: Arc<Mutex<State>>,
    pub(super) server: Server,
}

impl Double {
    pub(super) fn start(points: Vec<(PointId, Point)>) -> Double {
        let state = Arc::new(Mutex::new(State {
            points: points.into_iter().collect(),
            apply_after: 3,
            ..State::default()
        }));
        let s = state.clone();
        let server = Server::start(move |r| handle(&mut s.lock().unwrap(), r));
        Double { state, server }
    }

    pub(super) fn url(&self) -> String {
        self.server.url()
    }

    pub(super) fn with<T>(&self, f: impl FnOnce(&mut State) -> T) -> T {
        f(&mut self.state.lock().unwrap())
    }
}

fn error(status: u16, why: &str) -> Response {
    Response::json(status, json!({ "status": { "error": why }, "time": 0.0 }))
}

fn ok(result: Value) -> Response {
    Response::json(200, json!({ "result": result, "status": "ok", "time": 0.001 }))
}

fn handle(s: &mut State, r: &Request) -> Option<Response> {
    let q: Vec<String> = r.query.iter().map(|(k, v)| format!("{k}={v}")).collect();
    s.seen.push(format!("{}?{}", r.path, q.join("&")));
    match r.headers.get("api-key") {
        None => {
            s.bad_auth += 1;
            return Some(error(401, "Must provide an API key or an Authorization bearer token"));
        }
        Some(k) if k != KEY => {
            s.bad_auth += 1;
            return Some(error(403, "Invalid API key or JWT"));
        }
        _ => {}
    }
    if let Some(f) = s.faults.pop_front() {
        return match f {
            Fault::TooMany(secs) => {
                let resp = error(429, "Too many requests: rate limit exceeded");
                Some(match secs {
                    Some(n) => resp.with("Retry-After", n.to_string()),
                    None => resp,
                })
            }
            Fault::Status(c) => Some(error(c, "Service internal error")),
            Fault::Drop => None,
        };
    }
    // Acknowledged deletes land a few requests later.
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
    for id in landed {
        if let Some(p) = s.points.remove(&id) {
            s.deleted.insert(id, p);
        }
    }
    let prefix = format!("/collections/{COLLECTION}/");
    let Some(op) = r.path.strip_prefix(&prefix) else {
        return Some(error(404, "Not found: Collection doesn't exist!"));
    };
    if r.method != "POST" {
        return Some(error(405, "method not allowed"));
    }
    let body = r.json().and_then(|v| v.as_object().cloned()).unwrap_or_default();
    let filter = match body.get("filter").map(Filter::parse).transpose() {
        Ok(f) => f,
        Err(e) => return Some(error(400, &format!("Format error in JSON body: {e}"))),
    };
    let matches = |id: &PointId, p: &Point| filter.as_ref().is_none_or(|f| f.eval(id, p));
    Some(match op {
        "points/count" => {
            let exact = body.get("exact") == Some(&Value::Bool(true));
            let mut n = s.points.iter().filter(|(id, p)| matches(id, p)).count();
            if !exact {
                n += s.deleted.iter().filter(|(id, p)| matches(id, p)).count();
            }
            ok(json!({ "count": n }))
        }
        "points/scroll" => {
            let limit = body.get("limit").and_then(Value::as_u64).unwrap_or(10) as usize;
            let from = body.get("offset").and_then(pid);
            let mut hits = s
                .points
                .iter()
                .filter(|(id, _)| from.as_ref().is_none_or(|f| *id >= f))
                .filter(|(id, p)| matches(id, p));
            let page: Vec<Value> = hits.by_ref().take(limit).map(|(id, p)| shown(id, p, &body)).collect();
            let next = hits.next().map(|(id, _)| to_json(id)).unwrap_or(Value::Null);
            ok(json!({ "points": page, "next_page_offset": next }))
        }
        "points" => {
            let Some(ids) = body.get("ids").and_then(Value::as_array) else {
                return Some(error(400, "Format error in JSON body: missing field `ids`"));
            };
            let found: Vec<Value> = ids
                .iter()
                .filter_map(pid)
                .filter_map(|id| s.points.get(&id).map(|p| shown(&id, p, &body)))
                .collect();
            ok(json!(found))
        }
        "points/search" => {
            // Nearest points by cosine similarity, as a collection of `Cosine` distance ranks.
            let Some(q) = body.get("vector").and_then(Value::as_array) else {
                return Some(error(400, "Format error in JSON body: missing field `vector`"));
            };
            let q: Vec<f64> = q.iter().filter_map(Value::as_f64).collect();
            let limit = body.get("limit").and_then(Value::as_u64).unwrap_or(10) as usize;
            let cos = |v: &[f64]| {
                let dot: f64 = v.iter().zip(&q).map(|(a, b)| a * b).sum();
                let n = |x: &[f64]| x.iter().map(|a| a * a).sum::<f64>().sqrt();
                dot / (n(v) * n(&q))
            };
            let mut hits: Vec<(f64, &PointId)> = s.points.iter().map(|(id, p)| (cos(&p.vector), id)).collect();
            hits.sort_by(|a, b| b.0.total_cmp(&a.0).then(a.1.cmp(b.1)));
            ok(json!(hits.iter().take(limit).map(|(score, id)| json!({ "id": to_json(id), "version": 3, "score": score })).collect::<Vec<_>>()))
        }
        "points/delete" => {
            let ids: Vec<PointId> = match (&filter, body.get("points").and_then(Value::as_array)) {
                (Some(_), None) => s.points.iter().filter(|(id, p)| matches(id, p)).map(|(id, _)| id.clone()).collect(),
                (None, Some(list)) => list.iter().filter_map(pid).collect(),
                _ => return Some(error(400, "Format error in JSON body: a PointsSelector")),
            };
            if r.query.get("wait").map(String::as_str) == Some("true") {
                for id in ids {
                    if let Some(p) = s.points.remove(&id) {
                        s.deleted.insert(id, p);
                    }
                }
                ok(json!({ "operation_id": 7, "status": "completed" }))
            } else {
                let after = s.apply_after;
                s.pending.push((ids, after));
                ok(json!({ "operation_id": 7, "status": "acknowledged" }))
            }
        }
        _ => error(404, "Not found"),
    })
}

fn pid(v: &Value) -> Option<PointId> {
    match v {
        Value::Number(n) => n.as_u64().map(PointId::Num),
        Value::String(s) => PointId::parse(&s.to_ascii_lowercase()),
        _ => None,
    }
}

fn to_json(id: &PointId) -> Value {
    match id {
        PointId::Num(n) => json!(n),
        PointId::Uuid(u) => json!(u),
    }
}

fn shown(id: &PointId, p: &Point, body: &Map<String, Value>) -> Value {
    let payload = match body.get("with_payload") {
        Some(Value::Bool(true)) | None => Value::Object(p.payload.clone()),
        Some(Value::Array(keys)) => {
            let mut m = Map::new();
            for k in keys.iter().filter_map(Value::as_str) {
                let top = k.split('.').next().unwrap_or(k);
                if let Some(v) = p.payload.get(top) {
                    m.insert(top.into(), v.clone());
                }
            }
            Value::Object(m)
        }
        _ => Value::Null,
    };
    let mut out = json!({ "id": to_json(id), "version": 3, "payload": payload });
    if body.get("with_vector") == Some(&Value::Bool(true)) {
        out["vector"] = json!(p.vector);
    }
    out
}

enum Filter {
    Must(Vec<Filter>),
    Match(String, Value),
    HasId(Vec<PointId>),
}

impl Filter {
    fn parse(v: &Value) -> Result<Filter, String> {
        let o = v.as_object().ok_or("a filter is an object")?;
        if o.keys().any(|k| k != "must") {
            return Err("this double takes `must` only".into());
        }
        let list = o.get("must").and_then(Value::as_array).ok_or("must is a list")?;
        let mut all = Vec::new();
        for c in list {
            let c = c.as_object().ok_or("a condition is an object")?;
            if let Some(ids) = c.get("has_id") {
                if c.len() != 1 {
                    return Err("has_id stands alone".into());
                }
                let ids = ids.as_array().ok_or("has_id is a list")?;
                all.push(Filter::HasId(ids.iter().map(|i| pid(i).ok_or("a point id")).collect::<Result<_, _>>()?));
                continue;
            }
            let key = c.get("key").and_then(Value::as_str).ok_or("a field condition has a key")?;
            let m = c.get("match").and_then(Value::as_object).filter(|m| m.len() == 1).ok_or("this double takes match conditions only")?;
            let value = m.get("value").filter(|v| v.is_string() || v.is_i64()).ok_or("match takes `value` (a keyword or an integer) here")?;
            if c.len() != 2 {
                return Err("unknown members of a field condition".into());
            }
            all.push(Filter::Match(key.to_string(), value.clone()));
        }
        Ok(Filter::Must(all))
    }

    fn eval(&self, id: &PointId, p: &Point) -> bool {
        match self {
            Filter::Must(all) => all.iter().all(|f| f.eval(id, p)),
            Filter::HasId(ids) => ids.contains(id),
            Filter::Match(key, want) => {
                let mut at = Some(Value::Object(p.payload.clone()));
                for part in key.split('.') {
                    at = at.and_then(|x| x.get(part).cloned());
                }
                match at {
                    Some(Value::Array(a)) => a.contains(want),
                    Some(v) => v == *want,
                    None => false,
                }
            }
        }
    }
}
