//! A contract double of Azure AI Search's data plane, written from Microsoft's REST reference
//! (Search Documents and Index Documents, api-version 2024-07-01), for what the adapter depends
//! on. A small HTTP/1.1 server on 127.0.0.1, one thread, one request per connection.
//!
//! What it reproduces, each rule checked by a test in `tests.rs`:
//! - the `api-key` header, checked on every request (403 otherwise), and the `api-version`;
//! - `POST /indexes/<index>/docs/search` with `search` (`*` only), `filter`, `select`,
//!   `orderby`, `top`, `skip` and `count`; any other member is a 400;
//! - the OData subset the adapter emits, and nothing more (else 400, so an adapter that starts
//!   emitting something else fails its tests): `<field> eq '<literal>'`, `<field> gt
//!   '<literal>'`, `search.in(<field>, '<list>', '<delimiters>')`, `and`, parentheses; string
//!   literals with doubled quotes; only filterable fields;
//! - `orderby` by a sortable field `asc` only; without it, results come in no useful order
//!   (scrambled, as relevance order is for a filter-only query);
//! - `top`: 50 when absent, at most 1,000 a page (with `@search.nextPageParameters` when more
//!   match); `skip` above 100,000 is a 400; `count` gives `@odata.count`; `select` only
//!   retrievable fields;
//! - `POST /indexes/<index>/docs/index` with at most 1,000 actions (1,001 is a 400), here only
//!   `delete` by key; answers 200 when every action succeeded, 207 with each document's
//!   `key`, `status`, `statusCode` and `errorMessage` otherwise; deleting a key that is not
//!   there succeeds (200), as the service does (or 404 on demand);
//! - eventual consistency: a deleted document stays visible to search and count for `lag`
//!   more searches served by the lagging replica; with two replicas, searches go three by three
//!   to one that is current and one that lags, so a zero can come before the last
//!   non-zero;
//! - faults on demand: 429 or 503 with `Retry-After`, any status, a dropped connection.

use std::collections::{BTreeMap, VecDeque};
use std::io::{BufRead, BufReader, Read, Write};
use std::net::{TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};

use serde_json::{json, Map, Value};

pub(super) const KEY: &str = "azure-admin-key-S3CRET-0123456789";
pub(super) const INDEX: &str = "memories";
pub(super) const API_VERSION: &str = "2024-07-01";

/// The index's fields: name, filterable, sortable, retrievable. `id` is the key.
const SCHEMA: &[(&str, bool, bool, bool)] = &[
    ("id", true, true, true),
    ("tenant_id", true, false, true),
    ("user_id", true, false, true),
    ("mem_id", true, false, true),
    ("content", false, false, true),
    ("embedding", false, false, true),
    ("secret_note", true, false, false),
];

fn field(name: &str) -> Option<(bool, bool, bool)> {
    SCHEMA
        .iter()
        .find(|(n, ..)| *n == name)
        .map(|&(_, f, s, r)| (f, s, r))
}

/// A fault served instead of the next request's answer.
#[derive(Debug, Clone, Copy)]
pub(super) enum Fault {
    /// 429 with `Retry-After` in seconds.
    TooMany(u64),
    /// 503 with `Retry-After` in seconds.
    Busy(u64),
    /// This status, with an error body.
    Status(u16),
    /// Close the connection without an answer, doing nothing.
    Drop,
}

/// One request as the double saw it.
#[derive(Debug, Clone)]
pub(super) struct Seen {
    pub(super) op: String,
    pub(super) filter: Option<String>,
    pub(super) skip: Option<u64>,
    pub(super) top: Option<u64>,
    pub(super) count: bool,
    pub(super) actions: usize,
}

#[derive(Default)]
pub(super) struct State {
    /// The index, by key (ordinal order).
    pub(super) docs: BTreeMap<String, Map<String, Value>>,
    /// Deleted documents the lagging replica still shows, with the searches it has left.
    pub(super) ghosts: BTreeMap<String, (Map<String, Value>, u32)>,
    /// Searches a deleted document stays visible for on the lagging replica.
    pub(super) lag: u32,
    /// With two replicas, searches go three by three to one that is current and one that lags.
    pub(super) two_replicas: bool,
    searches: u64,
    pub(super) faults: VecDeque<Fault>,
    /// Per-key statuses for the next delete of that key (a 207's failures).
    pub(super) doc_faults: BTreeMap<String, u16>,
    /// What deleting a missing key answers (the service: 200).
    pub(super) missing_status: Option<u16>,
    pub(super) seen: Vec<Seen>,
    pub(super) bad_auth: usize,
}

impl State {
    /// Whether every replica shows every delete.
    pub(super) fn caught_up(&self) -> bool {
        self.ghosts.is_empty()
    }
}

pub(super) struct Double {
    state: Arc<Mutex<State>>,
    port: u16,
    stop: Arc<AtomicBool>,
}

impl Drop for Double {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::SeqCst);
        let _ = TcpStream::connect(("127.0.0.1", self.port));
    }
}

impl Double {
    pub(super) fn start(docs: Vec<Map<String, Value>>) -> Double {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let port = listener.local_addr().unwrap().port();
        let state = Arc::new(Mutex::new(State {
            docs: docs
                .into_iter()
                .map(|d| (d["id"].as_str().unwrap().to_string(), d))
                .collect(),
            ..State::default()
        }));
        let stop = Arc::new(AtomicBool::new(false));
        let (s, st) = (state.clone(), stop.clone());
        std::thread::spawn(move || {
            for conn in listener.incoming() {
                if st.load(Ordering::SeqCst) {
                    break;
                }
                if let Ok(c) = conn {
                    let _ = serve(c, &s);
                }
            }
        });
        Double { state, port, stop }
    }

    pub(super) fn url(&self) -> String {
        format!("http://127.0.0.1:{}", self.port)
    }

    pub(super) fn with<T>(&self, f: impl FnOnce(&mut State) -> T) -> T {
        f(&mut self.state.lock().unwrap())
    }

    /// A request straight to the double: status and JSON body.
    pub(super) fn post(&self, op: &str, body: &Value) -> (u16, Value) {
        let agent: ureq::Agent = ureq::Agent::config_builder()
            .http_status_as_error(false)
            .build()
            .into();
        let mut r = agent
            .post(format!(
                "{}/indexes/{INDEX}/docs/{op}?api-version={API_VERSION}",
                self.url()
            ))
            .header("api-key", KEY)
            .content_type("application/json")
            .send(serde_json::to_vec(body).unwrap())
            .unwrap();
        let status = r.status().as_u16();
        let v = serde_json::from_slice(&r.body_mut().read_to_vec().unwrap()).unwrap_or(Value::Null);
        (status, v)
    }
}

struct Request {
    method: String,
    path: String,
    query: String,
    api_key: Option<String>,
    body: Vec<u8>,
}

fn read_request(c: &mut TcpStream) -> std::io::Result<Request> {
    let mut r = BufReader::new(c.try_clone()?);
    let mut line = String::new();
    r.read_line(&mut line)?;
    let mut parts = line.split_whitespace();
    let method = parts.next().unwrap_or("").to_string();
    let target = parts.next().unwrap_or("").to_string();
    let (mut len, mut api_key) = (0, None);
    loop {
        let mut h = String::new();
        r.read_line(&mut h)?;
        let h = h.trim_end();
        if h.is_empty() {
            break;
        }
        let (k, v) = h.split_once(':').unwrap_or((h, ""));
        match k.to_ascii_lowercase().as_str() {
            "content-length" => len = v.trim().parse().unwrap_or(0),
            "api-key" => api_key = Some(v.trim().to_string()),
            _ => {}
        }
    }
    let mut body = vec![0; len];
    r.read_exact(&mut body)?;
    let (path, query) = target.split_once('?').unwrap_or((&target, ""));
    Ok(Request {
        method,
        path: path.to_string(),
        query: query.to_string(),
        api_key,
        body,
    })
}

fn respond(c: &mut TcpStream, status: u16, body: &Value, extra: &[(&str, String)]) -> std::io::Result<()> {
    let body = body.to_string();
    let mut head = format!(
        "HTTP/1.1 {status} X\r\nContent-Type: application/json; odata.metadata=none\r\nContent-Length: {}\r\nConnection: close\r\n",
        body.len()
    );
    for (k, v) in extra {
        head.push_str(&format!("{k}: {v}\r\n"));
    }
    c.write_all(format!("{head}\r\n{body}").as_bytes())
}

/// The service's error body. Its message may echo the request (here it does, on purpose: the
/// adapter must never show it).
fn error(message: &str) -> Value {
    json!({ "error": { "code": "", "message": message } })
}

fn serve(mut c: TcpStream, state: &Mutex<State>) -> std::io::Result<()> {
    let req = read_request(&mut c)?;
    let mut s = state.lock().unwrap();
    if req.api_key.as_deref() != Some(KEY) {
        s.bad_auth += 1;
        return respond(&mut c, 403, &error("Invalid api-key"), &[]);
    }
    if let Some(f) = s.faults.pop_front() {
        return match f {
            Fault::TooMany(secs) => respond(&mut c, 429, &error("Too many requests"), &[("Retry-After", secs.to_string())]),
            Fault::Busy(secs) => respond(&mut c, 503, &error("Service busy"), &[("Retry-After", secs.to_string())]),
            Fault::Status(code) => respond(&mut c, code, &error("fault"), &[]),
            Fault::Drop => Ok(()),
        };
    }
    if req.query != format!("api-version={API_VERSION}") {
        return respond(&mut c, 400, &error("Invalid or missing api-version query string parameter"), &[]);
    }
    let op = match req.path.strip_prefix(&format!("/indexes/{INDEX}/docs/")) {
        Some(op @ ("search" | "index")) if req.method == "POST" => op.to_string(),
        _ if req.path.starts_with("/indexes/") => {
            return respond(&mut c, 404, &error("The index was not found"), &[])
        }
        _ => return respond(&mut c, 400, &error("unsupported request"), &[]),
    };
    let Ok(Value::Object(body)) = serde_json::from_slice::<Value>(&req.body) else {
        return respond(&mut c, 400, &error("The request body is not a JSON object"), &[]);
    };
    let (status, answer) = match op.as_str() {
        "search" => search(&mut s, &body),
        _ => index(&mut s, &body),
    };
    respond(&mut c, status, &answer, &[])
}

fn search(s: &mut State, body: &Map<String, Value>) -> (u16, Value) {
    let mut seen = Seen {
        op: "search".into(),
        filter: None,
        skip: None,
        top: None,
        count: false,
        actions: 0,
    };
    for k in body.keys() {
        if !matches!(k.as_str(), "search" | "filter" | "select" | "orderby" | "top" | "skip" | "count") {
            return (400, error(&format!("The parameter '{k}' is not supported here")));
        }
    }
    if body.get("search").is_some_and(|v| v != "*") {
        return (400, error("this double runs filter-only queries (search '*')"));
    }
    let filter = match body.get("filter") {
        None => None,
        Some(Value::String(f)) => match parse(f) {
            Ok(f) => Some(f),
            Err(e) => return (400, error(&format!("Invalid expression: {e}"))),
        },
        Some(_) => return (400, error("filter must be a string")),
    };
    seen.filter = body.get("filter").and_then(Value::as_str).map(str::to_string);
    let uint = |k: &str| match body.get(k) {
        None => Ok(None),
        Some(v) => v.as_u64().map(Some).ok_or(()),
    };
    let (Ok(top), Ok(skip)) = (uint("top"), uint("skip")) else {
        return (400, error("top and skip must be non-negative integers"));
    };
    seen.top = top;
    seen.skip = skip;
    if skip.is_some_and(|n| n > 100_000) {
        s.seen.push(seen);
        return (400, error("Value must be between 0 and 100000. Parameter name: $skip"));
    }
    let count = match body.get("count") {
        None => false,
        Some(Value::Bool(b)) => *b,
        Some(_) => return (400, error("count must be a boolean")),
    };
    seen.count = count;
    let ordered = match body.get("orderby").map(Value::as_str) {
        None => false,
        Some(Some(o)) => {
            let mut w = o.split_whitespace();
            match (w.next(), w.next(), w.next()) {
                (Some(f), None | Some("asc"), None) if field(f).is_some_and(|(_, sortable, _)| sortable) => true,
                _ => return (400, error("orderby: only a sortable field, ascending")),
            }
        }
        Some(None) => return (400, error("orderby must be a string")),
    };
    let select: Vec<String> = match body.get("select").map(Value::as_str) {
        None => SCHEMA.iter().filter(|f| f.3).map(|f| f.0.to_string()).collect(),
        Some(Some(list)) => {
            let names: Vec<String> = list.split(',').map(|n| n.trim().to_string()).collect();
            if names.iter().any(|n| !field(n).is_some_and(|(_, _, r)| r)) {
                return (400, error("select: not a retrievable field of the index"));
            }
            names
        }
        Some(None) => return (400, error("select must be a string")),
    };
    // Which replica serves this search: the lagging one shows documents deleted within `lag`
    // of its searches.
    s.searches += 1;
    // Two replicas take searches three at a time each: whatever a reader's rhythm, two of its
    // searches in a row come from the current one well before the lagging one catches up.
    let lagging = !s.two_replicas || ((s.searches - 1) / 3) % 2 == 1;
    let mut visible: BTreeMap<&String, &Map<String, Value>> = s.docs.iter().collect();
    if lagging {
        for (k, (d, _)) in &s.ghosts {
            visible.insert(k, d);
        }
    }
    let mut hits: Vec<&Map<String, Value>> = visible
        .into_values()
        .filter(|d| filter.as_ref().is_none_or(|f| f.eval(d)))
        .collect();
    if !ordered {
        // No order asked: relevance order, which for a filter-only query is no useful order.
        hits.sort_by_key(|d| scramble(d["id"].as_str().unwrap_or("")));
    }
    let total = hits.len();
    let from = (skip.unwrap_or(0) as usize).min(total);
    let want = top.unwrap_or(50) as usize;
    let page = want.min(1_000);
    let value: Vec<Value> = hits[from..]
        .iter()
        .take(page)
        .map(|d| {
            let mut out = Map::new();
            out.insert("@search.score".into(), json!(1.0));
            for f in &select {
                out.insert(f.clone(), d.get(f).cloned().unwrap_or(Value::Null));
            }
            Value::Object(out)
        })
        .collect();
    let mut answer = Map::new();
    if count {
        answer.insert("@odata.count".into(), json!(total));
    }
    // Without `top`, pages of 50 continue; with it, only what a page of 1,000 cut short.
    let more = from + value.len() < total && (top.is_none() || value.len() < want);
    answer.insert("value".into(), Value::Array(value));
    if more {
        // The rest of what `top` asked for (or of the default page).
        let mut next = body.clone();
        next.insert("skip".into(), json!(from + page));
        answer.insert("@search.nextPageParameters".into(), Value::Object(next));
    }
    if lagging {
        s.ghosts.retain(|_, (_, left)| {
            *left -= 1;
            *left > 0
        });
    }
    s.seen.push(seen);
    (200, Value::Object(answer))
}

/// A fixed order that is not the key's.
fn scramble(key: &str) -> u64 {
    key.bytes()
        .fold(0xcbf29ce484222325u64, |h, b| (h ^ u64::from(b)).wrapping_mul(0x100000001b3))
}

fn index(s: &mut State, body: &Map<String, Value>) -> (u16, Value) {
    let Some(Value::Array(actions)) = body.get("value") else {
        return (400, error("The request has no 'value' array"));
    };
    if body.len() != 1 {
        return (400, error("unexpected members beside 'value'"));
    }
    s.seen.push(Seen {
        op: "index".into(),
        filter: None,
        skip: None,
        top: None,
        count: false,
        actions: actions.len(),
    });
    if actions.len() > 1_000 {
        return (400, error("The request is invalid: a batch may hold at most 1000 documents"));
    }
    let mut keys = Vec::new();
    for a in actions {
        let Some(a) = a.as_object() else {
            return (400, error("an action is not an object"));
        };
        match (a.get("@search.action"), a.get("id").and_then(Value::as_str), a.len()) {
            (Some(Value::String(act)), Some(k), 2) if act == "delete" => keys.push(k.to_string()),
            _ => return (400, error("this double takes only delete actions by key, nothing else")),
        }
    }
    let mut all_ok = true;
    let mut results = Vec::new();
    for k in keys {
        let (ok, code) = if let Some(code) = s.doc_faults.remove(&k) {
            (false, code)
        } else if let Some(d) = s.docs.remove(&k) {
            if s.lag > 0 {
                s.ghosts.insert(k.clone(), (d, s.lag));
            }
            (true, 200)
        } else {
            let code = s.missing_status.unwrap_or(200);
            (code == 200, code)
        };
        all_ok &= ok;
        results.push(json!({
            "key": k,
            "status": ok,
            "errorMessage": if ok { Value::Null } else { json!(format!("document '{k}' failed")) },
            "statusCode": code,
        }));
    }
    (if all_ok { 200 } else { 207 }, json!({ "value": results }))
}

/// The OData subset the adapter emits.
#[derive(Debug)]
enum Filter {
    And(Vec<Filter>),
    Eq(String, String),
    Gt(String, String),
    In(String, Vec<String>),
}

impl Filter {
    fn eval(&self, d: &Map<String, Value>) -> bool {
        let get = |f: &str| d.get(f).and_then(Value::as_str);
        match self {
            Filter::And(all) => all.iter().all(|f| f.eval(d)),
            Filter::Eq(f, v) => get(f) == Some(v.as_str()),
            // Ordinal comparison, as the key's `orderby` sorts.
            Filter::Gt(f, v) => get(f).is_some_and(|x| x > v.as_str()),
            Filter::In(f, vs) => get(f).is_some_and(|x| vs.iter().any(|v| v == x)),
        }
    }
}

#[derive(Debug, PartialEq)]
enum Tok {
    Word(String),
    Str(String),
    Open,
    Close,
    Comma,
}

fn tokens(s: &str) -> Result<Vec<Tok>, String> {
    let mut out = Vec::new();
    let mut it = s.chars().peekable();
    while let Some(&c) = it.peek() {
        match c {
            ' ' => {
                it.next();
            }
            '(' | ')' | ',' => {
                it.next();
                out.push(match c {
                    '(' => Tok::Open,
                    ')' => Tok::Close,
                    _ => Tok::Comma,
                });
            }
            '\'' => {
                it.next();
                let mut v = String::new();
                loop {
                    match it.next() {
                        None => return Err("unterminated string literal".into()),
                        Some('\'') if it.peek() == Some(&'\'') => {
                            it.next();
                            v.push('\'');
                        }
                        Some('\'') => break,
                        Some(ch) => v.push(ch),
                    }
                }
                out.push(Tok::Str(v));
            }
            c if c.is_ascii_alphabetic() || c == '_' => {
                let mut w = String::new();
                while let Some(&ch) = it.peek() {
                    if ch.is_ascii_alphanumeric() || ch == '_' || ch == '.' {
                        w.push(ch);
                        it.next();
                    } else {
                        break;
                    }
                }
                out.push(Tok::Word(w));
            }
            c => return Err(format!("unexpected '{c}'")),
        }
    }
    Ok(out)
}

fn parse(s: &str) -> Result<Filter, String> {
    let toks = tokens(s)?;
    let mut p = Parser { toks, at: 0 };
    let f = p.expr()?;
    if p.at != p.toks.len() {
        return Err("trailing tokens".into());
    }
    Ok(f)
}

struct Parser {
    toks: Vec<Tok>,
    at: usize,
}

impl Parser {
    fn next(&mut self) -> Option<&Tok> {
        self.at += 1;
        self.toks.get(self.at - 1)
    }

    fn expect(&mut self, t: Tok) -> Result<(), String> {
        match self.next() {
            Some(x) if *x == t => Ok(()),
            x => Err(format!("expected {t:?}, found {x:?}")),
        }
    }

    fn string(&mut self) -> Result<String, String> {
        match self.next() {
            Some(Tok::Str(v)) => Ok(v.clone()),
            x => Err(format!("expected a string literal, found {x:?}")),
        }
    }

    fn filterable(name: &str) -> Result<String, String> {
        match field(name) {
            Some((true, _, _)) => Ok(name.to_string()),
            Some(_) => Err(format!("the field '{name}' is not filterable")),
            None => Err(format!("could not find a property named '{name}'")),
        }
    }

    fn expr(&mut self) -> Result<Filter, String> {
        let mut all = vec![self.term()?];
        while self.toks.get(self.at) == Some(&Tok::Word("and".into())) {
            self.at += 1;
            all.push(self.term()?);
        }
        Ok(if all.len() == 1 {
            all.pop().unwrap()
        } else {
            Filter::And(all)
        })
    }

    fn term(&mut self) -> Result<Filter, String> {
        match self.next() {
            Some(Tok::Open) => {
                let f = self.expr()?;
                self.expect(Tok::Close)?;
                Ok(f)
            }
            Some(Tok::Word(w)) if w == "search.in" => {
                self.expect(Tok::Open)?;
                let f = match self.next() {
                    Some(Tok::Word(f)) => f.clone(),
                    x => return Err(format!("expected a field, found {x:?}")),
                };
                let f = Self::filterable(&f)?;
                self.expect(Tok::Comma)?;
                let list = self.string()?;
                self.expect(Tok::Comma)?;
                let delims = self.string()?;
                self.expect(Tok::Close)?;
                if delims.is_empty() {
                    return Err("empty delimiters".into());
                }
                let values = list
                    .split(|c| delims.contains(c))
                    .filter(|v| !v.is_empty())
                    .map(str::to_string)
                    .collect();
                Ok(Filter::In(f, values))
            }
            Some(Tok::Word(w)) if !matches!(w.as_str(), "and" | "or" | "not" | "eq" | "gt") => {
                let f = Self::filterable(&w.clone())?;
                let op = match self.next() {
                    Some(Tok::Word(op)) if op == "eq" || op == "gt" => op.clone(),
                    x => return Err(format!("this double takes eq and gt only, found {x:?}")),
                };
                let v = self.string()?;
                Ok(match op.as_str() {
                    "eq" => Filter::Eq(f, v),
                    _ => Filter::Gt(f, v),
                })
            }
            x => Err(format!("unexpected {x:?}")),
        }
    }
}

#[cfg(test)]
mod own_tests {
    use super::*;

    #[test]
    fn the_filter_subset_parses_doubled_quotes_and_refuses_the_rest() {
        let d: Map<String, Value> = serde_json::from_value(json!({
            "id": "k1", "tenant_id": "acme", "user_id": "x' or true or 'a"
        }))
        .unwrap();
        let f = parse("tenant_id eq 'acme' and user_id eq 'x'' or true or ''a'").unwrap();
        assert!(f.eval(&d));
        let f = parse("(tenant_id eq 'acme') and id gt 'k0'").unwrap();
        assert!(f.eval(&d));
        assert!(parse("search.in(id, 'k0,k1', ',')").unwrap().eval(&d));
        for bad in [
            "user_id eq 'x' or true or 'a'",
            "user_id ne 'x'",
            "not (user_id eq 'x')",
            "user_id eq x",
            "user_id eq 'x",
            "content eq 'x'",
            "nope eq 'x'",
            "user_id eq 'x' and",
            "user_id lt 'x'",
            "tenant_id eq 1",
        ] {
            assert!(parse(bad).is_err(), "{bad}");
        }
    }
}
