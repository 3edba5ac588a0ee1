//! The console: server-rendered HTML under `/console` for the DPO and the platform team. No
//! script runs in it; every page is a plain document and every action a form.
//!
//! - **Sign-in** with a bearer token of `[serve]` (not a `runtime` one); the server answers with
//!   a random session id in an `HttpOnly`, `SameSite=Strict` cookie, kept in this process's
//!   memory for [`crate::Dpo::session_ttl`] after its last use. The token never reaches a page.
//! - **CSRF**: every form carries the session's random token, and a post without it (or with
//!   another) is refused, nothing done; the sign-in form carries one bound to a cookie of its
//!   own.
//! - **Pages**: the inbox of requests (approve, reject; deadline, days left, highlighted within
//!   five days), jobs with their states and BLOCKED reasons (resume), a job's timeline from its
//!   journal entries, its certificate with the signature checked against the deployment key,
//!   holds, alerts. Each page needs the role the API would ([`Need`]); identifiers of a subject
//!   appear only on a request's page and the holds page, to the roles the API shows them to.
//!
//! The rules are the API's: the same engine calls, the same names journaled.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Instant;

use axum::extract::rejection::PathRejection;
use axum::extract::{Path, State as AxState};
use axum::http::{HeaderMap, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Redirect, Response};
use axum::routing::{get, post};
use axum::Router;
use lethe_core::{JobState, Subject, Tenant};
use lethe_engine::config::Role;
use lethe_engine::requests::{days_left, DUE_SOON_DAYS};
use lethe_engine::{Engine, EngineError, RunOptions};
use lethe_journal::requests::RequestState;
use maud::{html, Markup, PreEscaped, DOCTYPE};

use crate::api::{Need, State};

/// The session cookie's name.
const SESSION: &str = "lethe_session";
/// The sign-in form's own CSRF cookie.
const SIGNIN: &str = "lethe_signin";

/// A signed-in user.
#[derive(Clone)]
struct Session {
    name: String,
    role: Role,
    csrf: String,
    expires: Instant,
}

/// The sessions of this process (a restart signs everyone out).
pub(crate) struct Sessions {
    ttl: std::time::Duration,
    /// Whether the server speaks TLS: the cookies are then `Secure`.
    secure: bool,
    by_id: Mutex<HashMap<String, Session>>,
}

impl Sessions {
    pub(crate) fn new(ttl: std::time::Duration, secure: bool) -> Self {
        Self {
            ttl,
            secure,
            by_id: Mutex::new(HashMap::new()),
        }
    }
}

pub(crate) fn routes() -> Router<State> {
    Router::new()
        .route("/console", get(|| async { Redirect::to("/console/inbox") }))
        .route("/console/signin", get(signin_page).post(signin))
        .route("/console/signout", post(signout))
        .route("/console/inbox", get(inbox))
        .route("/console/requests/{id}", get(request_page))
        .route("/console/requests/{id}/approve", post(approve))
        .route("/console/requests/{id}/reject", post(reject))
        .route("/console/jobs", get(jobs))
        .route("/console/jobs/{id}", get(job_page))
        .route("/console/jobs/{id}/resume", post(resume))
        .route("/console/jobs/{id}/certificate", get(certificate))
        .route("/console/holds", get(holds).post(add_hold))
        .route("/console/holds/release", post(release_hold))
        .route("/console/alerts", get(alerts))
}

fn random_hex() -> String {
    let mut b = [0u8; 24];
    getrandom::getrandom(&mut b).expect("the system's random source");
    hex::encode(b)
}

fn cookie<'a>(headers: &'a HeaderMap, name: &str) -> Option<&'a str> {
    headers
        .get_all(axum::http::header::COOKIE)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(';'))
        .filter_map(|c| c.trim().split_once('='))
        .find(|(k, _)| *k == name)
        .map(|(_, v)| v)
}

fn set_cookie(secure: bool, name: &str, value: &str, max_age: Option<u64>) -> HeaderValue {
    let age = max_age.map_or(String::new(), |s| format!("; Max-Age={s}"));
    let secure = if secure { "; Secure" } else { "" };
    HeaderValue::from_str(&format!(
        "{name}={value}; Path=/console; HttpOnly; SameSite=Strict{secure}{age}"
    ))
    .expect("hex and ASCII")
}

/// A page's refusal: its status and a sentence, as HTML.
struct Refusal(StatusCode, String);

impl IntoResponse for Refusal {
    fn into_response(self) -> Response {
        let body = page(
            "Refused",
            None,
            html! { p.error #error { (self.1) } p { a href="/console/inbox" { "Back" } } },
        );
        (self.0, body).into_response()
    }
}

fn engine_refusal(e: EngineError) -> Refusal {
    let api = crate::api::engine_error(e);
    Refusal(api.status, api.message)
}

enum Gate {
    /// No session, or an expired one: to the sign-in page (a GET) or refused (a post).
    Out {
        expired: bool,
    },
    In(Session),
}

impl Sessions {
    /// The session a request's cookie names, extended by its use.
    fn find(&self, headers: &HeaderMap) -> Gate {
        let Some(id) = cookie(headers, SESSION) else {
            return Gate::Out { expired: false };
        };
        let mut by_id = self.by_id.lock().unwrap_or_else(|e| e.into_inner());
        let now = Instant::now();
        by_id.retain(|_, s| s.expires > now);
        match by_id.get_mut(id) {
            Some(s) => {
                s.expires = now + self.ttl;
                Gate::In(s.clone())
            }
            None => Gate::Out { expired: true },
        }
    }
}

/// Where a page's visitor goes instead: to the sign-in form, or refused.
enum Away {
    SignIn { expired: bool },
    Forbidden,
}

impl IntoResponse for Away {
    fn into_response(self) -> Response {
        match self {
            Away::SignIn { expired: true } => {
                Redirect::to("/console/signin?expired").into_response()
            }
            Away::SignIn { expired: false } => Redirect::to("/console/signin").into_response(),
            Away::Forbidden => Refusal(
                StatusCode::FORBIDDEN,
                "your token's role may not see this page".into(),
            )
            .into_response(),
        }
    }
}

/// The signed-in user allowed `need`, for a page (GET): else the sign-in page or a refusal.
fn viewer(state: &State, headers: &HeaderMap, need: Need) -> Result<Session, Away> {
    match state.sessions.find(headers) {
        Gate::Out { expired } => Err(Away::SignIn { expired }),
        Gate::In(s) if need.allows(s.role) => Ok(s),
        Gate::In(_) => Err(Away::Forbidden),
    }
}

/// A form post's fields, once its session is valid, allows `need`, and the form carries the
/// session's CSRF token; else refused with nothing done.
fn actor(
    state: &State,
    headers: &HeaderMap,
    body: &[u8],
    need: Need,
) -> Result<(Session, HashMap<String, String>), Refusal> {
    let form: HashMap<String, String> = form_urlencoded::parse(body).into_owned().collect();
    let s = match state.sessions.find(headers) {
        Gate::Out { expired: true } => {
            return Err(Refusal(
                StatusCode::UNAUTHORIZED,
                "your session expired: sign in again; nothing was done".into(),
            ))
        }
        Gate::Out { expired: false } => {
            return Err(Refusal(
                StatusCode::UNAUTHORIZED,
                "sign in first; nothing was done".into(),
            ))
        }
        Gate::In(s) => s,
    };
    let given = form.get("csrf").map(String::as_str).unwrap_or("");
    if !crate::api::constant_time_eq(given.as_bytes(), s.csrf.as_bytes()) {
        return Err(Refusal(
            StatusCode::FORBIDDEN,
            "this form came without its CSRF token (or with another session's): reload the page \
             and try again; nothing was done"
                .into(),
        ));
    }
    if !need.allows(s.role) {
        return Err(Refusal(
            StatusCode::FORBIDDEN,
            "your token's role may not do this; nothing was done".into(),
        ));
    }
    Ok((s, form))
}

/// A page's viewer (signed in, allowed `need`) and what `read` gets from the engine; or the
/// answer instead: the sign-in page, a refusal, or a store that did not answer.
async fn view<T: Send + 'static>(
    state: &State,
    headers: &HeaderMap,
    need: Need,
    read: impl FnOnce(&Engine) -> Result<T, EngineError> + Send + 'static,
) -> Result<(Session, T), Response> {
    let s = viewer(state, headers, need).map_err(IntoResponse::into_response)?;
    let t = blocking(state, read)
        .await
        .map_err(IntoResponse::into_response)?;
    Ok((s, t))
}

async fn blocking<T: Send + 'static>(
    state: &State,
    f: impl FnOnce(&Engine) -> Result<T, EngineError> + Send + 'static,
) -> Result<T, Refusal> {
    let engine = Arc::clone(&state.engine);
    tokio::task::spawn_blocking(move || f(&engine))
        .await
        .map_err(|_| Refusal(StatusCode::SERVICE_UNAVAILABLE, "try again".into()))?
        .map_err(engine_refusal)
}

const STYLE: &str = "
body{font-family:system-ui,sans-serif;margin:0;color:#1b1f24;background:#f6f7f9}
header{background:#1f2a44;color:#fff;padding:.6rem 1rem;display:flex;flex-wrap:wrap;gap:1rem;align-items:center}
header a{color:#fff;text-decoration:none;font-weight:600}
header .who{margin-left:auto;font-size:.9rem}
main{max-width:1200px;margin:0 auto;padding:1rem}
h1{font-size:1.4rem}
.scroll{overflow-x:auto}
table{border-collapse:collapse;width:100%;background:#fff}
th,td{border-bottom:1px solid #dde1e6;padding:.4rem .5rem;text-align:left;font-size:.92rem;vertical-align:top}
th{background:#eef1f5}
tr.due td{background:#fff3cd}
.state{font-weight:700}
.BLOCKED{color:#b42318}.COMPLETE{color:#067647}
.error{color:#b42318;font-weight:600}
.ok{color:#067647;font-weight:700}
form.inline{display:inline-flex;gap:.3rem;flex-wrap:wrap;margin:.1rem 0}
input[type=text],input[type=password]{padding:.3rem;min-width:8rem}
button{padding:.3rem .7rem;cursor:pointer}
code{word-break:break-all}
@media (max-width:700px){main{padding:.5rem}th,td{font-size:.8rem;padding:.3rem}header{gap:.5rem}}
";

fn page(title: &str, who: Option<&Session>, body: Markup) -> axum::response::Html<String> {
    let doc = html! {
        (DOCTYPE)
        html lang="en" {
            head {
                meta charset="utf-8";
                meta name="viewport" content="width=device-width, initial-scale=1";
                title { (title) " · Lethe" }
                style { (PreEscaped(STYLE)) }
            }
            body {
                header {
                    span { "Lethe" }
                    @if let Some(s) = who {
                        @if Need::ReadRequests.allows(s.role) { a href="/console/inbox" { "Inbox" } }
                        @if Need::ReadJobs.allows(s.role) { a href="/console/jobs" { "Jobs" } }
                        @if Need::Decide.allows(s.role) { a href="/console/holds" { "Holds" } }
                        @if Need::ReadJobs.allows(s.role) { a href="/console/alerts" { "Alerts" } }
                        span.who {
                            (s.name) " (" (s.role.as_str()) ") "
                            form.inline method="post" action="/console/signout" {
                                input type="hidden" name="csrf" value=(s.csrf);
                                button #signout type="submit" { "Sign out" }
                            }
                        }
                    }
                }
                main { h1 { (title) } (body) }
            }
        }
    };
    axum::response::Html(doc.into_string())
}

async fn signin_page(
    AxState(state): AxState<State>,
    headers: HeaderMap,
    uri: axum::http::Uri,
) -> Response {
    let csrf = cookie(&headers, SIGNIN)
        .filter(|c| c.len() == 48)
        .map_or_else(random_hex, str::to_string);
    let expired = uri.query().is_some_and(|q| q.contains("expired"));
    let body = page(
        "Sign in",
        None,
        html! {
            @if expired { p.error #error { "Your session expired: sign in again." } }
            form #signin-form method="post" action="/console/signin" {
                input type="hidden" name="csrf" value=(csrf);
                label { "Token " input #token type="password" name="token" autocomplete="off"; }
                " "
                button #signin type="submit" { "Sign in" }
            }
            p { "A bearer token of [serve] (role requester, approver, operator or admin)." }
        },
    );
    let mut res = body.into_response();
    res.headers_mut().append(
        axum::http::header::SET_COOKIE,
        set_cookie(state.sessions.secure, SIGNIN, &csrf, Some(3600)),
    );
    res
}

async fn signin(
    AxState(state): AxState<State>,
    headers: HeaderMap,
    body: axum::body::Bytes,
) -> Response {
    let form: HashMap<String, String> = form_urlencoded::parse(&body).into_owned().collect();
    let bound = cookie(&headers, SIGNIN).unwrap_or("");
    let given = form.get("csrf").map(String::as_str).unwrap_or("");
    if bound.is_empty() || !crate::api::constant_time_eq(given.as_bytes(), bound.as_bytes()) {
        return Refusal(
            StatusCode::FORBIDDEN,
            "the sign-in form came without its CSRF token: open the sign-in page again".into(),
        )
        .into_response();
    }
    let token = form.get("token").map(String::as_str).unwrap_or("");
    let Some(t) = crate::api::token(&state.tokens, token) else {
        return Refusal(
            StatusCode::UNAUTHORIZED,
            "that is not a token of [serve]".into(),
        )
        .into_response();
    };
    if t.role == Role::Runtime {
        return Refusal(
            StatusCode::FORBIDDEN,
            "a runtime token is for agent runtimes, not the console".into(),
        )
        .into_response();
    }
    let id = random_hex();
    let session = Session {
        name: t.name.clone(),
        role: t.role,
        csrf: random_hex(),
        expires: Instant::now() + state.sessions.ttl,
    };
    state
        .sessions
        .by_id
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .insert(id.clone(), session);
    tracing::info!(by = %t.name, "Console sign-in.");
    let mut res = Redirect::to("/console/inbox").into_response();
    res.headers_mut().append(
        axum::http::header::SET_COOKIE,
        set_cookie(state.sessions.secure, SESSION, &id, None),
    );
    res
}

async fn signout(
    AxState(state): AxState<State>,
    headers: HeaderMap,
    body: axum::body::Bytes,
) -> Response {
    if let Err(r) = actor(&state, &headers, &body, Need::Metrics) {
        return r.into_response();
    }
    if let Some(id) = cookie(&headers, SESSION) {
        state
            .sessions
            .by_id
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .remove(id);
    }
    let mut res = Redirect::to("/console/signin").into_response();
    res.headers_mut().append(
        axum::http::header::SET_COOKIE,
        set_cookie(state.sessions.secure, SESSION, "", Some(0)),
    );
    res
}

fn days(deadline: &str, today: time::Date) -> (String, bool) {
    match days_left(deadline, today) {
        Some(d) => (d.to_string(), d <= DUE_SOON_DAYS),
        None => ("-".into(), false),
    }
}

fn csrf_field(s: &Session) -> Markup {
    html! { input type="hidden" name="csrf" value=(s.csrf); }
}

async fn inbox(AxState(state): AxState<State>, headers: HeaderMap) -> Response {
    let (s, all) = match view(&state, &headers, Need::ReadRequests, |e| {
        Ok(e.journal().requests()?)
    })
    .await
    {
        Ok(v) => v,
        Err(r) => return r,
    };
    let today = state.clock.now().date();
    let decide = Need::Decide.allows(s.role);
    page(
        "Inbox",
        Some(&s),
        html! {
            @if all.is_empty() { p #empty { "No requests." } }
            div.scroll { table #inbox {
                thead { tr { th { "Request" } th { "State" } th { "Scope" } th { "Basis" }
                    th { "Ticket" } th { "Received" } th { "Deadline" } th { "Days left" }
                    th { "Asked by" } th { "Decision" } } }
                tbody { @for r in &all {
                    @let (left, soon) = days(&r.deadline, today);
                    @let open = r.state == RequestState::Pending;
                    tr data-request=(r.request_id) class=[(open && soon).then_some("due")] {
                        td { a href={ "/console/requests/" (r.request_id) } { (r.request_id) } }
                        td.state { (format!("{:?}", r.state).to_uppercase()) }
                        td { (r.scope.kind().to_string()) " " code { (short(&r.scope_hash)) } }
                        td { (r.basis.as_str()) }
                        td { (r.ticket) }
                        td { (r.received_at) }
                        td { (r.deadline) }
                        td.days { (left) }
                        td { (r.requested_by) }
                        td {
                            @if open && decide {
                                form.inline.approve method="post" action={ "/console/requests/" (r.request_id) "/approve" } {
                                    (csrf_field(&s)) button type="submit" { "Approve" }
                                }
                                form.inline.reject method="post" action={ "/console/requests/" (r.request_id) "/reject" } {
                                    (csrf_field(&s))
                                    input type="text" name="reason" placeholder="reason" required;
                                    button type="submit" { "Reject" }
                                }
                            } @else if let Some(j) = &r.job_id {
                                (r.decided_by.as_deref().unwrap_or("")) ": "
                                a.job href={ "/console/jobs/" (j) } { (j) }
                            } @else {
                                (r.decided_by.as_deref().unwrap_or("")) " "
                                (r.reject_reason.as_deref().unwrap_or(""))
                            }
                        }
                    }
                } }
            } }
        },
    )
    .into_response()
}

fn short(hash: &str) -> &str {
    hash.get(..17).unwrap_or(hash)
}

async fn request_page(
    AxState(state): AxState<State>,
    headers: HeaderMap,
    id: Result<Path<String>, PathRejection>,
) -> Response {
    let s = match viewer(&state, &headers, Need::ReadRequests) {
        Ok(s) => s,
        Err(r) => return r.into_response(),
    };
    let Ok(Path(id)) = id else {
        return Refusal(StatusCode::BAD_REQUEST, "not a request id".into()).into_response();
    };
    let rec = match blocking(&state, move |e| {
        if !lethe_engine::requests::is_request_id(&id) {
            return Err(EngineError::Input("not a request id".into()));
        }
        e.journal()
            .request(&id)?
            .ok_or_else(|| lethe_engine::requests::RequestError::NoSuchRequest(id).into())
    })
    .await
    {
        Ok(r) => r,
        Err(r) => return r.into_response(),
    };
    // The identifiers, to the roles that make and decide requests (as the API's).
    page(
        &format!("Request {}", rec.request_id),
        Some(&s),
        html! {
            table #request {
                tr { th { "Tenant" } td { (rec.scope.tenant().as_str()) } }
                tr { th { "Subject" } td { (rec.scope.subject().map_or("(the whole tenant)", Subject::as_str)) } }
                tr { th { "Scope hash" } td { code { (rec.scope_hash) } } }
                tr { th { "Basis" } td { (rec.basis.as_str()) } }
                tr { th { "Ticket" } td { (rec.ticket) } }
                tr { th { "Identity verified" } td { (if rec.identity_verified { "yes" } else { "no" }) } }
                tr { th { "Received" } td { (rec.received_at) } }
                tr { th { "Deadline" } td { (rec.deadline) } }
                tr { th { "Asked by" } td { (rec.requested_by) } }
                tr { th { "State" } td.state { (format!("{:?}", rec.state).to_uppercase()) } }
            }
        },
    )
    .into_response()
}

async fn approve(
    AxState(state): AxState<State>,
    headers: HeaderMap,
    id: Result<Path<String>, PathRejection>,
    body: axum::body::Bytes,
) -> Response {
    let (s, _) = match actor(&state, &headers, &body, Need::Decide) {
        Ok(a) => a,
        Err(r) => return r.into_response(),
    };
    let Ok(Path(id)) = id else {
        return Refusal(StatusCode::BAD_REQUEST, "not a request id".into()).into_response();
    };
    let job = match blocking(&state, move |e| {
        let job_id = e.approve_request(&id, &s.name)?;
        e.refuse_if_held(&job_id)?;
        Ok(job_id)
    })
    .await
    {
        Ok(j) => j,
        Err(r) => return r.into_response(),
    };
    if let Err(e) = crate::api::run_in_background(
        Arc::clone(&**state.engine),
        job.clone(),
        RunOptions::default(),
    ) {
        return engine_refusal(e).into_response();
    }
    Redirect::to(&format!("/console/jobs/{job}")).into_response()
}

async fn reject(
    AxState(state): AxState<State>,
    headers: HeaderMap,
    id: Result<Path<String>, PathRejection>,
    body: axum::body::Bytes,
) -> Response {
    let (s, form) = match actor(&state, &headers, &body, Need::Decide) {
        Ok(a) => a,
        Err(r) => return r.into_response(),
    };
    let Ok(Path(id)) = id else {
        return Refusal(StatusCode::BAD_REQUEST, "not a request id".into()).into_response();
    };
    let reason = form.get("reason").cloned().unwrap_or_default();
    match blocking(&state, move |e| e.reject_request(&id, &s.name, &reason)).await {
        Ok(()) => Redirect::to("/console/inbox").into_response(),
        Err(r) => r.into_response(),
    }
}

async fn jobs(AxState(state): AxState<State>, headers: HeaderMap) -> Response {
    let (s, all) = match view(&state, &headers, Need::ReadJobs, |e| {
        Ok(e.journal().jobs()?)
    })
    .await
    {
        Ok(v) => v,
        Err(r) => return r,
    };
    let today = state.clock.now().date();
    let resume = Need::ResumeJobs.allows(s.role);
    page(
        "Jobs",
        Some(&s),
        html! {
            @if all.is_empty() { p #empty { "No jobs." } }
            div.scroll { table #jobs {
                thead { tr { th { "Job" } th { "State" } th { "Blocked by" } th { "Scope" }
                    th { "Requested" } th { "Deadline" } th { "Days left" } th { "" } } }
                tbody { @for j in all.iter().rev() {
                    @let (left, soon) = days(&j.deadline, today);
                    @let open = j.state != JobState::Complete;
                    tr data-job=(j.job_id) class=[(open && soon).then_some("due")] {
                        td { a href={ "/console/jobs/" (j.job_id) } { (j.job_id) } }
                        td { span class={ "state " (j.state.as_str()) } { (j.state.as_str()) } }
                        td { (j.blocked_reason.map_or("", |r| r.as_str())) " " (j.blocked_target.as_deref().unwrap_or("")) }
                        td { (j.scope.kind().to_string()) " " code { (short(&j.scope_hash)) } }
                        td { (j.requested_at) }
                        td { (j.deadline) }
                        td.days { (left) }
                        td {
                            @if j.state == JobState::Blocked && resume {
                                form.inline.resume method="post" action={ "/console/jobs/" (j.job_id) "/resume" } {
                                    (csrf_field(&s)) button type="submit" { "Resume" }
                                }
                            }
                            @if j.state == JobState::Complete {
                                a.certificate href={ "/console/jobs/" (j.job_id) "/certificate" } { "Certificate" }
                            }
                        }
                    }
                } }
            } }
        },
    )
    .into_response()
}

/// A journal entry as the timeline shows it: its fields, without the scope's identifiers.
fn entry_fields(e: &lethe_journal::Entry) -> String {
    let mut v = serde_json::to_value(e).unwrap_or_default();
    if let Some(m) = v.as_object_mut() {
        m.remove("kind");
        m.remove("scope");
    }
    v.as_object()
        .map(|m| {
            m.iter()
                .filter(|(_, v)| !v.is_null())
                .map(|(k, v)| match v.as_str() {
                    Some(s) => format!("{k}: {s}"),
                    None => format!("{k}: {v}"),
                })
                .collect::<Vec<_>>()
                .join("; ")
        })
        .unwrap_or_default()
}

async fn job_page(
    AxState(state): AxState<State>,
    headers: HeaderMap,
    id: Result<Path<String>, PathRejection>,
) -> Response {
    let s = match viewer(&state, &headers, Need::ReadJobs) {
        Ok(s) => s,
        Err(r) => return r.into_response(),
    };
    let Ok(Path(id)) = id else {
        return Refusal(StatusCode::BAD_REQUEST, "not a job id".into()).into_response();
    };
    let (job, timeline) = match blocking(&state, move |e| {
        Ok((e.journal().job(&id)?, e.journal().timeline(&id)?))
    })
    .await
    {
        Ok(x) => x,
        Err(r) => return r.into_response(),
    };
    page(
        &format!("Job {}", job.job_id),
        Some(&s),
        html! {
            p { "State: " span #job-state class={ "state " (job.state.as_str()) } { (job.state.as_str()) }
                @if let Some(r) = job.blocked_reason { " (" span #blocked-reason { (r.as_str()) } " " (job.blocked_target.as_deref().unwrap_or("")) ")" }
                " · deadline " (job.deadline) " · scope " (job.scope.kind().to_string()) " " code { (job.scope_hash) } }
            @if job.state == JobState::Blocked && Need::ResumeJobs.allows(s.role) {
                form.inline.resume method="post" action={ "/console/jobs/" (job.job_id) "/resume" } {
                    (csrf_field(&s)) button type="submit" { "Resume" }
                }
            }
            @if job.state == JobState::Complete {
                p { a #certificate-link href={ "/console/jobs/" (job.job_id) "/certificate" } { "The certificate" } }
            }
            h2 { "Timeline" }
            div.scroll { table #timeline {
                thead { tr { th { "#" } th { "When" } th { "Entry" } th { "Details" } } }
                tbody { @for e in &timeline {
                    tr { td { (e.seq) } td { (e.at) } td.kind { (e.entry.kind()) } td { (entry_fields(&e.entry)) } }
                } }
            } }
        },
    )
    .into_response()
}

async fn resume(
    AxState(state): AxState<State>,
    headers: HeaderMap,
    id: Result<Path<String>, PathRejection>,
    body: axum::body::Bytes,
) -> Response {
    let (s, _) = match actor(&state, &headers, &body, Need::ResumeJobs) {
        Ok(a) => a,
        Err(r) => return r.into_response(),
    };
    let Ok(Path(id)) = id else {
        return Refusal(StatusCode::BAD_REQUEST, "not a job id".into()).into_response();
    };
    let job = id.clone();
    let checked = blocking(&state, move |e| {
        if e.outcome(&id)?.state != JobState::Complete {
            e.journal().check_chain()?;
            e.refuse_if_held(&id)?;
        }
        Ok(())
    })
    .await;
    if let Err(r) = checked {
        return r.into_response();
    }
    tracing::info!(job = %job, by = %s.name, "Job resumed from the console.");
    if let Err(e) = crate::api::run_in_background(
        Arc::clone(&**state.engine),
        job.clone(),
        RunOptions::default(),
    ) {
        return engine_refusal(e).into_response();
    }
    Redirect::to(&format!("/console/jobs/{job}")).into_response()
}

async fn certificate(
    AxState(state): AxState<State>,
    headers: HeaderMap,
    id: Result<Path<String>, PathRejection>,
) -> Response {
    let s = match viewer(&state, &headers, Need::ReadJobs) {
        Ok(s) => s,
        Err(r) => return r.into_response(),
    };
    let Ok(Path(id)) = id else {
        return Refusal(StatusCode::BAD_REQUEST, "not a job id".into()).into_response();
    };
    let (doc, checked) = match blocking(&state, move |e| {
        let doc = e.outcome(&id)?.certificate.ok_or_else(|| {
            EngineError::Input("the job is not COMPLETE: it has no certificate yet".into())
        })?;
        let checked = lethe_core::certificate::Certificate::verify(&doc, &e.key().verifying_key())
            .map(drop)
            .map_err(|e| e.to_string());
        Ok((doc, checked))
    })
    .await
    {
        Ok(x) => x,
        Err(r) => return r.into_response(),
    };
    let text = |k: &str| {
        doc[k]
            .as_str()
            .map(str::to_string)
            .unwrap_or_else(|| doc[k].to_string())
    };
    page(
        &format!("Certificate {}", text("job_id")),
        Some(&s),
        html! {
            @match &checked {
                Ok(()) => p.ok #signature-status { "Signature valid: signed by " code { (text("signed_by")) } ", this deployment's key." },
                Err(e) => p.error #signature-status { "Signature NOT valid: " (e) },
            }
            table #certificate {
                @for k in ["job_id", "scope", "scope_hash", "basis", "policy_version", "requested_at", "completed_at", "deadline", "subject_epoch", "tenant_epoch", "backup_expiry"] {
                    @if !doc[k].is_null() { tr { th { (k) } td { (text(k)) } } }
                }
            }
            h2 { "Targets" }
            div.scroll { table #targets {
                thead { tr { th { "Target" } th { "Status" } th { "Count" } th { "Class" } th { "Adapter" } } }
                tbody { @if let Some(ts) = doc["targets"].as_object() { @for (name, t) in ts {
                    tr { td { (name) } td { (t["status"].as_str().unwrap_or("-")) " " (t["reason"].as_str().unwrap_or("")) }
                        td { (t["count"].to_string()) } td { (t["class"].as_str().unwrap_or("-")) }
                        td { (t["adapter"].as_str().unwrap_or("-")) " " (t["adapter_version"].as_str().unwrap_or("")) } }
                } } }
            } }
            @if let Some(assets) = doc["exempt_assets"].as_object().filter(|a| !a.is_empty()) {
                h2 { "Not covered" }
                ul { @for (name, a) in assets { li { (name) ": " (a["reason"].as_str().unwrap_or("-")) } } }
            }
        },
    )
    .into_response()
}

async fn holds(AxState(state): AxState<State>, headers: HeaderMap) -> Response {
    let (s, all) = match view(&state, &headers, Need::Decide, |e| {
        Ok(e.journal().holds()?)
    })
    .await
    {
        Ok(v) => v,
        Err(r) => return r,
    };
    page(
        "Legal holds",
        Some(&s),
        html! {
            div.scroll { table #holds {
                thead { tr { th { "Hold" } th { "Tenant" } th { "Subject" } th { "Reason" } th { "Since" } th { "" } } }
                tbody { @for h in &all { tr {
                    td { (h.hold_id) } td { (h.tenant) } td { (h.subject.as_deref().unwrap_or("(whole tenant)")) }
                    td { (h.reason.as_deref().unwrap_or("")) } td { (h.created_at) }
                    td { form.inline method="post" action="/console/holds/release" {
                        (csrf_field(&s))
                        input type="hidden" name="tenant" value=(h.tenant);
                        @if let Some(sub) = &h.subject { input type="hidden" name="subject" value=(sub); }
                        button type="submit" { "Release" }
                    } }
                } } }
            } }
            h2 { "Place a hold" }
            form #hold-form method="post" action="/console/holds" {
                (csrf_field(&s))
                input type="text" name="tenant" placeholder="tenant" required;
                " " input type="text" name="subject" placeholder="subject (empty: whole tenant)";
                " " input type="text" name="reason" placeholder="reason (matter number)";
                " " button type="submit" { "Place hold" }
            }
        },
    )
    .into_response()
}

fn hold_scope(form: &HashMap<String, String>) -> Result<(Tenant, Option<Subject>), Refusal> {
    let bad = |e: lethe_core::IdentError| Refusal(StatusCode::BAD_REQUEST, e.to_string());
    let tenant = Tenant::new(form.get("tenant").cloned().unwrap_or_default()).map_err(bad)?;
    let subject = form
        .get("subject")
        .filter(|s| !s.is_empty())
        .cloned()
        .map(Subject::new)
        .transpose()
        .map_err(bad)?;
    Ok((tenant, subject))
}

async fn add_hold(
    AxState(state): AxState<State>,
    headers: HeaderMap,
    body: axum::body::Bytes,
) -> Response {
    let (s, form) = match actor(&state, &headers, &body, Need::Decide) {
        Ok(a) => a,
        Err(r) => return r.into_response(),
    };
    let (tenant, subject) = match hold_scope(&form) {
        Ok(x) => x,
        Err(r) => return r.into_response(),
    };
    let reason = form.get("reason").filter(|r| !r.is_empty()).cloned();
    match blocking(&state, move |e| {
        e.add_hold(&tenant, subject.as_ref(), reason.as_deref())
    })
    .await
    {
        Ok(id) => {
            tracing::info!(hold = %id, by = %s.name, "Hold placed from the console.");
            Redirect::to("/console/holds").into_response()
        }
        Err(r) => r.into_response(),
    }
}

async fn release_hold(
    AxState(state): AxState<State>,
    headers: HeaderMap,
    body: axum::body::Bytes,
) -> Response {
    let (s, form) = match actor(&state, &headers, &body, Need::Decide) {
        Ok(a) => a,
        Err(r) => return r.into_response(),
    };
    let (tenant, subject) = match hold_scope(&form) {
        Ok(x) => x,
        Err(r) => return r.into_response(),
    };
    match blocking(&state, move |e| e.release_holds(&tenant, subject.as_ref())).await {
        Ok(ids) => {
            tracing::info!(holds = %ids.join(","), by = %s.name, "Holds released from the console.");
            Redirect::to("/console/holds").into_response()
        }
        Err(r) => r.into_response(),
    }
}

async fn alerts(AxState(state): AxState<State>, headers: HeaderMap) -> Response {
    let s = match viewer(&state, &headers, Need::ReadJobs) {
        Ok(s) => s,
        Err(r) => return r.into_response(),
    };
    let seen = match blocking(&state, |e| {
        let mut all = Vec::new();
        let mut after = 0;
        loop {
            let page = e
                .journal()
                .entries_after(after, &["alert_raised"], 10_000)?;
            let Some(last) = page.last() else { break };
            after = last.seq;
            all.extend(page);
        }
        Ok(all)
    })
    .await
    {
        Ok(a) => a,
        Err(r) => return r.into_response(),
    };
    page(
        "Alerts",
        Some(&s),
        html! {
            @if seen.is_empty() { p #empty { "No alerts." } }
            div.scroll { table #alerts {
                thead { tr { th { "When" } th { "Alert" } th { "Job" } th { "Condition" } } }
                tbody { @for e in seen.iter().rev() {
                    @if let lethe_journal::Entry::AlertRaised { alert, job_id, condition } = &e.entry {
                        tr { td { (e.at) } td { (alert) } td { a href={ "/console/jobs/" (job_id) } { (job_id) } } td { (condition) } }
                    }
                } }
            } }
        },
    )
    .into_response()
}
