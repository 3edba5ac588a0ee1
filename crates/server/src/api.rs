//! The routes. Each gate handler authorizes, parses, then calls the gate: one control-store
//! transaction on a blocking thread ([`lethe_gate::JournalGate`]), or on PostgreSQL, for
//! leases, permits and releases, the asynchronous path ([`lethe_gate::pg`]). Nothing here
//! holds gate state or SQL.

use std::sync::Arc;
use std::time::Duration;

use axum::extract::rejection::PathRejection;
use axum::extract::{Path, RawQuery, State as AxState};
use axum::http::{HeaderMap, StatusCode};
use axum::response::sse::{Event, KeepAlive, Sse};
use axum::response::IntoResponse;
use axum::routing::{delete, get, post};
use axum::{Json, Router};
use futures_util::Stream;
use lethe_core::clock::Clock;
use lethe_core::{Basis, JobState, MemoryId, Scope, Subject, Tenant, Version};
use lethe_engine::config::Role;
use lethe_engine::{Engine, EngineError, Request, RunOptions};
use lethe_gate::{GateError, JournalGate, Sink};
use serde::Deserialize;
use serde_json::{json, Value};
use tokio::sync::watch;

use crate::error::ApiError;
use crate::pool::Pool;
use crate::revocations::Watchers;

#[derive(Clone)]
pub(crate) struct State {
    /// The engine's journal may hold a blocking PostgreSQL client, whose drop runs a runtime
    /// of its own and so panics on a runtime thread; whichever holder (a connection's router,
    /// the server) lets the last reference go, the engine is dropped off the runtime's threads.
    pub(crate) engine: Arc<crate::pool::DropOffRuntime<Arc<Engine>>>,
    pub(crate) pool: Arc<Pool>,
    pub(crate) tokens: Arc<Vec<crate::Token>>,
    pub(crate) clock: Arc<dyn Clock>,
    pub(crate) hooks: crate::Hooks,
    pub(crate) pg: Option<Arc<lethe_gate::pg::PgGate>>,
    pub(crate) watchers: Arc<Watchers>,
    pub(crate) stop: watch::Receiver<bool>,
    /// Set while the server's hold on the gate authority is lost
    /// (`Journal::gate_authority_lost`): no lease, permit or renewal is granted meanwhile.
    pub(crate) authority_lost: Arc<std::sync::atomic::AtomicBool>,
    /// `[serve] require_approval`: `POST /v1/jobs` refused, every job from a request.
    pub(crate) require_approval: bool,
    /// What `GET /metrics` reports.
    pub(crate) metrics: Arc<crate::metrics::Metrics>,
    /// The console's signed-in sessions.
    pub(crate) sessions: Arc<crate::console::Sessions>,
}

/// Refuses a grant (503, retryable) while the server's hold on the gate authority is lost: an
/// in-process gate may have taken it, and would never see what this server grants.
fn granting(state: &State) -> Result<(), ApiError> {
    if state
        .authority_lost
        .load(std::sync::atomic::Ordering::SeqCst)
    {
        return Err(ApiError::new(
            StatusCode::SERVICE_UNAVAILABLE,
            "unavailable",
            "the server's hold on the gate authority is lost; retry (the server log has the cause)",
        ));
    }
    Ok(())
}

pub(crate) fn router(state: State) -> Router {
    Router::new()
        .route("/healthz", get(|| async { "ok" }))
        .route(
            "/v1/openapi.json",
            get(|| async { ([("content-type", "application/json")], crate::OPENAPI) }),
        )
        .route("/v1/leases", post(take_lease))
        .route("/v1/leases/{lease_id}", get(lease_status))
        .route("/v1/leases/{lease_id}/renew", post(renew_lease))
        .route("/v1/permits", post(take_permit))
        .route("/v1/permits/{permit_id}", delete(release_permit))
        .route("/v1/permits/{permit_id}/cancelled", post(confirm_cancelled))
        .route("/v1/revocations", get(revocations))
        .route("/v1/lineage", post(record_lineage))
        .route("/v1/keys", post(data_key))
        .route("/v1/jobs", post(create_job).get(list_jobs))
        .route("/v1/jobs/batch", post(create_jobs))
        .route("/v1/jobs/{job_id}", get(job))
        .route("/v1/jobs/{job_id}/resume", post(resume_job))
        .merge(crate::requests::routes())
        .merge(crate::console::routes())
        .route("/metrics", get(crate::metrics::scrape))
        .fallback(|| async {
            ApiError::new(
                StatusCode::NOT_FOUND,
                "not_found",
                "no such route; GET /v1/openapi.json lists them",
            )
        })
        .method_not_allowed_fallback(|| async {
            ApiError::new(
                StatusCode::METHOD_NOT_ALLOWED,
                "method_not_allowed",
                "this route does not take that method; GET /v1/openapi.json lists them",
            )
        })
        .layer(axum::middleware::from_fn_with_state(
            state.clone(),
            crate::metrics::count_refusals,
        ))
        .layer(axum::middleware::from_fn_with_state(state.clone(), admit))
        .with_state(state)
}

/// The most a request body may carry.
pub(crate) const MAX_BODY: u64 = 2 * 1024 * 1024;

/// Runs before any route reads a byte of a body: a request to a route that needs a token
/// must carry a valid one (of either role; the route checks which), and declare no body over
/// [`MAX_BODY`]. A caller without a token costs the server its headers, nothing more.
async fn admit(
    AxState(state): AxState<State>,
    req: axum::extract::Request,
    next: axum::middleware::Next,
) -> axum::response::Response {
    // The console signs its users in with a form and a session cookie, checked by its pages.
    let path = req.uri().path();
    let open = matches!(path, "/healthz" | "/v1/openapi.json")
        || path == "/console"
        || path.starts_with("/console/");
    if !open {
        if let Err(e) = bearer(&state.tokens, req.headers()) {
            return e.into_response();
        }
        let declared = req
            .headers()
            .get(axum::http::header::CONTENT_LENGTH)
            .and_then(|v| v.to_str().ok())
            .and_then(|v| v.parse::<u64>().ok());
        if declared.is_some_and(|n| n > MAX_BODY) {
            return too_large().into_response();
        }
    }
    next.run(req).await
}

fn too_large() -> ApiError {
    ApiError::new(
        StatusCode::PAYLOAD_TOO_LARGE,
        "too_large",
        "the body is over the 2 MiB a request may carry",
    )
}

/// The token a request carries, if it carries a valid one.
pub(crate) fn bearer(
    tokens: &[crate::Token],
    headers: &HeaderMap,
) -> Result<crate::Token, ApiError> {
    let given = headers
        .get("authorization")
        .and_then(|v| v.to_str().ok())
        // The scheme's name is case-insensitive (RFC 9110 section 11.1).
        .and_then(|v| {
            v.get(..7)
                .filter(|p| p.eq_ignore_ascii_case("bearer "))
                .map(|_| &v[7..])
        })
        .unwrap_or("");
    token(tokens, given).ok_or_else(|| {
        ApiError::new(
            StatusCode::UNAUTHORIZED,
            "unauthorized",
            "a bearer token from [serve] is required",
        )
    })
}

/// The token whose secret is `given`, compared in full against every token, so timing says
/// nothing about how much matched.
pub(crate) fn token(tokens: &[crate::Token], given: &str) -> Option<crate::Token> {
    tokens.iter().fold(None, |found, t| {
        if constant_time_eq(t.secret.as_bytes(), given.as_bytes()) {
            Some(t.clone())
        } else {
            found
        }
    })
}

/// What a route needs a token to be allowed.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Need {
    /// Leases, permits, revocations, lineage: `runtime`, `operator`.
    Gate,
    /// `POST /v1/jobs`: `operator`.
    RunJobs,
    /// Reading jobs: `operator`, `requester`, `approver`.
    ReadJobs,
    /// Resuming a job: `operator`, `approver`.
    ResumeJobs,
    /// Making a request: `requester`.
    Request,
    /// Reading requests: `requester`, `approver`.
    ReadRequests,
    /// Approving, rejecting; legal holds: `approver`.
    Decide,
    /// The intake switch: `admin` only.
    Intake,
    /// `GET /metrics`: any token.
    Metrics,
}

impl Need {
    /// Whether `role` may. `admin` may everything.
    pub(crate) fn allows(self, role: Role) -> bool {
        use Role::*;
        role == Admin
            || match self {
                Need::Gate => matches!(role, Runtime | Operator),
                Need::RunJobs => role == Operator,
                Need::ReadJobs => matches!(role, Operator | Requester | Approver),
                Need::ResumeJobs => matches!(role, Operator | Approver),
                Need::Request => role == Requester,
                Need::ReadRequests => matches!(role, Requester | Approver),
                Need::Decide => role == Approver,
                Need::Intake => false,
                Need::Metrics => true,
            }
    }

    fn roles(self) -> String {
        let mut names: Vec<&str> = Role::ALL
            .into_iter()
            .filter(|r| *r != Role::Admin && self.allows(*r))
            .map(Role::as_str)
            .collect();
        names.push("admin");
        names.join(" or ")
    }
}

/// Checks the bearer token allows `need`; returns the token.
pub(crate) fn authorize(
    state: &State,
    headers: &HeaderMap,
    need: Need,
) -> Result<crate::Token, ApiError> {
    let token = bearer(&state.tokens, headers)?;
    if !need.allows(token.role) {
        return Err(ApiError::new(
            StatusCode::FORBIDDEN,
            "forbidden",
            format!("this needs a token of role {}", need.roles()),
        ));
    }
    Ok(token)
}

pub(crate) fn constant_time_eq(a: &[u8], b: &[u8]) -> bool {
    if a.len() != b.len() || a.is_empty() {
        return false;
    }
    a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
}

pub(crate) fn path<T>(p: Result<Path<T>, PathRejection>) -> Result<T, ApiError> {
    p.map(|Path(t)| t).map_err(|_| {
        ApiError::bad_request("the id in the path is not valid (a number; a job id for jobs)")
    })
}

pub(crate) fn body<T>(b: Result<Object<T>, ApiError>) -> Result<T, ApiError> {
    b.map(|Object(t)| t)
}

/// A request body that is one JSON object. As axum's `Json` (a JSON content type), but every
/// refusal has the API's shape, with any quoted value redacted, and an array is refused: serde
/// reads a struct from an array of its fields in order, which no client means.
pub(crate) struct Object<T>(T);

impl<S: Send + Sync, T: serde::de::DeserializeOwned> axum::extract::FromRequest<S> for Object<T> {
    type Rejection = ApiError;

    async fn from_request(req: axum::extract::Request, state: &S) -> Result<Self, ApiError> {
        let json = req
            .headers()
            .get(axum::http::header::CONTENT_TYPE)
            .and_then(|v| v.to_str().ok())
            .and_then(|v| v.split(';').next())
            .map(|v| v.trim().to_ascii_lowercase())
            .is_some_and(|v| v == "application/json" || v.ends_with("+json"));
        if !json {
            return Err(ApiError::bad_request(
                "the body must be JSON, sent with Content-Type: application/json",
            ));
        }
        let bytes = axum::body::Bytes::from_request(req, state)
            .await
            .map_err(|e| match e.status() {
                StatusCode::PAYLOAD_TOO_LARGE => too_large(),
                _ => ApiError::bad_request("the body could not be read"),
            })?;
        parse_object(&bytes).map(Object)
    }
}

/// One JSON object, into `T`: never an array (`lethe_core::Object`), at the top or in a field.
pub(crate) fn parse_object<T: serde::de::DeserializeOwned>(bytes: &[u8]) -> Result<T, ApiError> {
    if bytes.iter().find(|b| !b.is_ascii_whitespace()) != Some(&b'{') {
        return Err(ApiError::bad_request("the body must be a JSON object"));
    }
    // The message names the field at fault (`tenant: invalid type ...`) and the position, but
    // never a key the caller made up, in the path or in the reason: it may be built from an
    // identifier (axum's own message began `zz-secret: unknown field ...`).
    let de = &mut serde_json::Deserializer::from_slice(bytes);
    let t =
        serde_path_to_error::deserialize::<_, lethe_core::Object<T>>(&mut *de).map_err(|e| {
            let (path, reason) = lethe_core::redact::fault(e.path(), &e.inner().to_string());
            ApiError::bad_request(if path.is_empty() {
                format!("the body does not fit the request: {reason}")
            } else {
                format!("the body does not fit the request: {path}: {reason}")
            })
        })?;
    de.end()
        .map_err(|_| ApiError::bad_request("the body has more after its JSON object"))?;
    Ok(t.into_inner())
}

/// A query string into `T`, with [`parse_object`]'s rule for messages: the parameter at fault
/// is named only when it is one of the API's (`leases`), never one the caller made up (a query
/// `?Alice-Smith=x` is built from an identifier), and no value is quoted.
fn parse_query<T: serde::de::DeserializeOwned>(query: Option<&str>) -> Result<T, ApiError> {
    let de =
        serde_urlencoded::Deserializer::new(form_urlencoded::parse(query.unwrap_or("").as_bytes()));
    serde_path_to_error::deserialize(de).map_err(|e| {
        let (path, reason) = lethe_core::redact::fault(e.path(), &e.inner().to_string());
        ApiError::bad_request(if path.is_empty() {
            format!("the query string does not fit the request: {reason}")
        } else {
            format!("the query string does not fit the request: {path}: {reason}")
        })
    })
}

/// Runs a gate call on a pooled connection, off the async threads.
async fn gate<T: Send + 'static>(
    state: &State,
    f: impl FnOnce(JournalGate<'_>) -> Result<T, lethe_journal::JournalError> + Send + 'static,
) -> Result<T, ApiError> {
    let pool = Arc::clone(&state.pool);
    tokio::task::spawn_blocking(move || pool.with(|j| f(JournalGate::new(j))))
        .await
        .map_err(|_| ApiError::unavailable())?
        .map_err(ApiError::from)
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct ReadJson {
    memory_id: String,
    version: String,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct LeaseJson {
    tenant: String,
    subject: String,
    #[serde(default)]
    reads: Vec<lethe_core::Object<ReadJson>>,
    ttl_ms: Option<u64>,
}

/// The longest lease: a TTL only reclaims ownership, so a long one costs nothing but memory.
const MAX_TTL_MS: u64 = 24 * 3600 * 1000;

async fn take_lease(
    AxState(state): AxState<State>,
    headers: HeaderMap,
    b: Result<Object<LeaseJson>, ApiError>,
) -> Result<impl IntoResponse, ApiError> {
    authorize(&state, &headers, Need::Gate)?;
    granting(&state)?;
    let b = body(b)?;
    let bad = |e: lethe_core::IdentError| ApiError::bad_request(e.to_string());
    let tenant = Tenant::new(b.tenant).map_err(bad)?;
    let subject = Subject::new(b.subject).map_err(bad)?;
    let reads = b
        .reads
        .into_iter()
        .map(|lethe_core::Object(r)| {
            Ok((
                MemoryId::new(r.memory_id).map_err(bad)?,
                Version::new(r.version).map_err(bad)?,
            ))
        })
        .collect::<Result<Vec<_>, ApiError>>()?;
    let ttl = b.ttl_ms.unwrap_or(60_000);
    if ttl == 0 || ttl > MAX_TTL_MS {
        return Err(ApiError::bad_request(
            "ttl_ms must be between 1 and 86400000",
        ));
    }
    let now = state.clock.now();
    let expires_ms = (now.unix_timestamp_nanos() / 1_000_000) as i64 + ttl as i64;
    let owner = (tenant.clone(), subject.clone());
    let lease = match &state.pg {
        Some(pg) => pg.take_lease(&tenant, &subject, &reads, expires_ms).await?,
        None => {
            gate(&state, move |j| {
                j.take_lease(now, &tenant, &subject, &reads, Duration::from_millis(ttl))
            })
            .await?
        }
    };
    // The fencing token the database guard checks: only a holder of the deployment key makes
    // one, so a writer that never took a lease cannot (docs/gate.md, "Fencing tokens").
    let token = state.engine.key().guard_key().token(
        lease.id,
        lease.epoch,
        lease.tenant_epoch,
        owner.0.as_str(),
        owner.1.as_str(),
    );
    Ok((
        StatusCode::CREATED,
        Json(
            json!({"lease_id": lease.id, "epoch": lease.epoch, "tenant_epoch": lease.tenant_epoch, "token": token, "expires_ms": expires_ms}),
        ),
    ))
}

async fn lease_status(
    AxState(state): AxState<State>,
    headers: HeaderMap,
    lease_id: Result<Path<i64>, PathRejection>,
) -> Result<impl IntoResponse, ApiError> {
    authorize(&state, &headers, Need::Gate)?;
    let lease_id = path(lease_id)?;
    let revoked = gate(&state, move |j| j.is_revoked(lease_id)).await?;
    Ok(Json(json!({"lease_id": lease_id, "revoked": revoked})))
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RenewJson {
    ttl_ms: Option<u64>,
}

/// A long run keeps its lease: the expiry moves to at least now + `ttl_ms`. Refused (409) for a
/// lease revoked or already expired: read the memory again and take a new lease.
async fn renew_lease(
    AxState(state): AxState<State>,
    headers: HeaderMap,
    lease_id: Result<Path<i64>, PathRejection>,
    b: Result<Object<RenewJson>, ApiError>,
) -> Result<impl IntoResponse, ApiError> {
    authorize(&state, &headers, Need::Gate)?;
    granting(&state)?;
    let lease_id = path(lease_id)?;
    let ttl = body(b)?.ttl_ms.unwrap_or(60_000);
    if ttl == 0 || ttl > MAX_TTL_MS {
        return Err(ApiError::bad_request(
            "ttl_ms must be between 1 and 86400000",
        ));
    }
    let now = state.clock.now();
    let expires_ms = gate(&state, move |j| {
        j.renew_lease(now, lease_id, Duration::from_millis(ttl))
    })
    .await?;
    Ok(Json(
        json!({"lease_id": lease_id, "expires_ms": expires_ms}),
    ))
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct PermitJson {
    lease_id: i64,
    sink: String,
    /// A permit whose boundary ended, released by the same request (one round trip a cycle).
    release: Option<i64>,
    /// The client's name for this take, unique within the lease: sent again after a lost
    /// answer, it returns the permit the first sending registered (`Journal::take_permit_keyed`).
    /// The permit then ends only with this key.
    key: Option<String>,
    /// The key `release`'s own take carried.
    release_key: Option<String>,
}

/// `?key=`: the key a permit's take carried, which ending it must show.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct KeyQuery {
    key: Option<String>,
}

/// Checks a permit key's form (`key`, `release_key`, `?key=`).
fn check_key(key: Option<&str>, field: &str) -> Result<(), ApiError> {
    let ok = key.is_none_or(|k| {
        !k.is_empty()
            && k.len() <= MAX_KEY_LEN
            && k.bytes()
                .all(|c| c.is_ascii_alphanumeric() || matches!(c, b'-' | b'_' | b'.'))
    });
    if ok {
        Ok(())
    } else {
        Err(ApiError::bad_request(format!(
            "{field} must be 1 to 80 characters of A-Z, a-z, 0-9, '-', '_' and '.'"
        )))
    }
}

/// A key the gate names for a take that carried none: 128 random bits, in hex.
fn gate_key() -> Result<String, ApiError> {
    let mut b = [0u8; 16];
    getrandom::getrandom(&mut b).map_err(|_| ApiError::unavailable())?;
    Ok(b.iter().map(|x| format!("{x:02x}")).collect())
}

/// The longest permit key: room for a UUID or 32 random bytes in hex, with a prefix.
const MAX_KEY_LEN: usize = 80;

async fn take_permit(
    AxState(state): AxState<State>,
    headers: HeaderMap,
    b: Result<Object<PermitJson>, ApiError>,
) -> Result<impl IntoResponse, ApiError> {
    authorize(&state, &headers, Need::Gate)?;
    granting(&state)?;
    let b = body(b)?;
    let sink = match b.sink.as_str() {
        "output" => Sink::Output,
        "tool" => Sink::Tool,
        "state" => Sink::State,
        _ => return Err(ApiError::bad_request("sink must be output, tool or state")),
    };
    if b.release.is_some_and(|p| p < 1) {
        return Err(ApiError::bad_request("release must be a permit id"));
    }
    check_key(b.key.as_deref(), "key")?;
    check_key(b.release_key.as_deref(), "release_key")?;
    // Every permit has a key, which ending it must show: a take without one gets one from the
    // gate, so another run naming the permit's (sequential) id cannot end it, and with it end a
    // drain early.
    let key = match b.key {
        Some(k) => k,
        None => gate_key()?,
    };
    let clock = Arc::clone(&state.clock);
    let hook = state.hooks.before_permit.clone();
    let (permit, released) = match &state.pg {
        Some(pg) => {
            if let Some(h) = hook {
                tokio::task::spawn_blocking(move || h())
                    .await
                    .map_err(|_| ApiError::unavailable())?;
            }
            let now = clock.now();
            pg.take_permit(
                (now.unix_timestamp_nanos() / 1_000_000) as i64,
                b.lease_id,
                sink,
                b.release.map(|p| (p, b.release_key)),
                Some(key.clone()),
            )
            .await?
        }
        None => {
            let key = key.clone();
            gate(&state, move |j| {
                // The release first and whatever the take's answer: its boundary has ended.
                let released = match b
                    .release
                    .map(|p| j.release_permit_keyed(p, b.release_key.as_deref()))
                {
                    None => None,
                    Some(Ok(())) => Some(true),
                    Some(Err(lethe_journal::JournalError::Gate(GateError::NoSuchPermit))) => {
                        Some(false)
                    }
                    Some(Err(e)) => return Err(e),
                };
                if let Some(h) = hook {
                    h();
                }
                let permit = j.take_permit_keyed(clock.now(), b.lease_id, sink, Some(&key))?;
                Ok((permit, released))
            })
            .await?
        }
    };
    let mut answer = json!({"permit_id": permit.id, "key": key});
    if let Some(released) = released {
        answer["released"] = json!(released);
    }
    Ok((StatusCode::CREATED, Json(answer)))
}

/// How a permit ends: the boundary finished, or its work was aborted after a revocation.
#[derive(Clone, Copy)]
enum End {
    Released,
    Cancelled,
}

async fn end_permit(
    state: &State,
    headers: &HeaderMap,
    permit_id: Result<Path<i64>, PathRejection>,
    query: Option<String>,
    end: End,
) -> Result<StatusCode, ApiError> {
    authorize(state, headers, Need::Gate)?;
    let permit_id = path(permit_id)?;
    let KeyQuery { key } = parse_query(query.as_deref())?;
    check_key(key.as_deref(), "key")?;
    // Every permit the server grants has a key, so an end without one matches none of them,
    // and a permit taken in-process without one is no HTTP caller's to end: no such permit
    // (the clients' answer to a second sending of an end, whose key they have let go).
    if key.is_none() {
        return Err(ApiError::new(
            StatusCode::NOT_FOUND,
            "no_such_permit",
            "no active permit has this id and key: a permit ends only with the key its take's \
             answer carried (?key=)",
        ));
    }
    match (&state.pg, end) {
        (Some(pg), End::Released) => pg.release_permit(permit_id, key).await?,
        (Some(pg), End::Cancelled) => pg.confirm_cancelled(permit_id, key).await?,
        (None, End::Released) => {
            gate(state, move |j| {
                j.release_permit_keyed(permit_id, key.as_deref())
            })
            .await?
        }
        (None, End::Cancelled) => {
            gate(state, move |j| {
                j.confirm_cancelled_keyed(permit_id, key.as_deref())
            })
            .await?
        }
    }
    Ok(StatusCode::NO_CONTENT)
}

async fn release_permit(
    AxState(state): AxState<State>,
    headers: HeaderMap,
    permit_id: Result<Path<i64>, PathRejection>,
    RawQuery(query): RawQuery,
) -> Result<StatusCode, ApiError> {
    end_permit(&state, &headers, permit_id, query, End::Released).await
}

async fn confirm_cancelled(
    AxState(state): AxState<State>,
    headers: HeaderMap,
    permit_id: Result<Path<i64>, PathRejection>,
    RawQuery(query): RawQuery,
) -> Result<StatusCode, ApiError> {
    end_permit(&state, &headers, permit_id, query, End::Cancelled).await
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RevocationsQuery {
    leases: String,
}

/// At most this many leases per stream (one runtime's runs; several streams are fine).
const MAX_STREAM_LEASES: usize = 10_000;

async fn revocations(
    AxState(state): AxState<State>,
    headers: HeaderMap,
    RawQuery(query): RawQuery,
) -> Result<Sse<impl Stream<Item = Result<Event, std::convert::Infallible>>>, ApiError> {
    authorize(&state, &headers, Need::Gate)?;
    let q: RevocationsQuery = parse_query(query.as_deref())?;
    let mut leases = q
        .leases
        .split(',')
        .map(|s| s.trim().parse::<i64>())
        .collect::<Result<Vec<_>, _>>()
        .map_err(|_| ApiError::bad_request("leases must be comma-separated lease ids"))?;
    leases.sort_unstable();
    leases.dedup();
    if leases.is_empty() || leases.len() > MAX_STREAM_LEASES {
        return Err(ApiError::bad_request(
            "leases must list between 1 and 10000 lease ids",
        ));
    }
    // Registered before the first poll, so a lease revoked already is reported at once.
    let rx = state.watchers.watch(&leases).ok_or_else(|| {
        ApiError::new(
            StatusCode::SERVICE_UNAVAILABLE,
            "watch_limit",
            format!(
                "this server already watches its most leases ({}) for open revocation streams; \
                 retry later, spread the runtimes over several servers, or poll \
                 GET /v1/leases/{{lease_id}}",
                crate::revocations::MAX_WATCHED_LEASES
            ),
        )
    })?;
    let stream = futures_util::stream::unfold(
        (rx, state.stop.clone(), leases.len()),
        |(mut rx, mut stop, left)| async move {
            if left == 0 || *stop.borrow() {
                return None;
            }
            tokio::select! {
                id = rx.recv() => {
                    let id = id?;
                    let ev = Event::default().event("revoked").data(json!({"lease_id": id}).to_string());
                    Some((Ok(ev), (rx, stop, left - 1)))
                }
                _ = stop.changed() => None,
            }
        },
    );
    Ok(Sse::new(stream).keep_alive(
        KeepAlive::new()
            .interval(Duration::from_secs(15))
            .text("keepalive"),
    ))
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct SourceJson {
    memory_id: String,
    version: Option<String>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct LineageJson {
    tenant: String,
    subject: String,
    target: String,
    locator: String,
    #[serde(default)]
    from: Vec<lethe_core::Object<SourceJson>>,
    #[serde(default)]
    from_artifacts: Vec<lethe_core::Object<ArtifactJson>>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct ArtifactJson {
    target: String,
    locator: String,
}

/// At most this many memories an artifact is recorded as derived from, in one edge.
const MAX_SOURCES: usize = 10_000;

/// Records a lineage edge (`Engine::record_lineage`): 204, or 400 for a target not configured
/// or whose kind takes no lineage and a malformed identifier or locator, 409 `fenced` while an
/// erasure of the subject or tenant has its fence closed. Nothing stored when refused.
async fn record_lineage(
    AxState(state): AxState<State>,
    headers: HeaderMap,
    b: Result<Object<LineageJson>, ApiError>,
) -> Result<StatusCode, ApiError> {
    authorize(&state, &headers, Need::Gate)?;
    let b = body(b)?;
    let bad = |e: lethe_core::IdentError| ApiError::bad_request(e.to_string());
    let tenant = Tenant::new(b.tenant).map_err(bad)?;
    let subject = Subject::new(b.subject).map_err(bad)?;
    if b.from.len() > MAX_SOURCES {
        return Err(ApiError::bad_request(
            "from may list at most 10000 memories",
        ));
    }
    let from = b
        .from
        .into_iter()
        .map(|lethe_core::Object(r)| {
            Ok((
                MemoryId::new(r.memory_id).map_err(bad)?,
                r.version.map(Version::new).transpose().map_err(bad)?,
            ))
        })
        .collect::<Result<Vec<_>, ApiError>>()?;
    let artifacts: Vec<(String, String)> = b
        .from_artifacts
        .into_iter()
        .map(|lethe_core::Object(a)| (a.target, a.locator))
        .collect();
    let engine = Arc::clone(&state.engine);
    tokio::task::spawn_blocking(move || {
        engine.record_lineage_from(&tenant, &subject, &b.target, &b.locator, &from, &artifacts)
    })
    .await
    .map_err(|_| ApiError::unavailable())?
    .map_err(engine_error)?;
    Ok(StatusCode::NO_CONTENT)
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct KeyJson {
    lease_id: i64,
    key_id: Option<String>,
}

/// Crypto-shredding: the data key of the lease's subject (`key_id`: that one, to decrypt; none:
/// the current one, made if the subject has none, to encrypt). Refused as the gate refuses the
/// lease's permits (409: revoked, expired, stale epoch, fenced; 404 no such lease); 410
/// `key_destroyed` for a key an erasure destroyed; 404 `keys_off` without `[keys]`. A runtime
/// keeps the key no longer than `expires_ms`, the lease's expiry.
async fn data_key(
    AxState(state): AxState<State>,
    headers: HeaderMap,
    b: Result<Object<KeyJson>, ApiError>,
) -> Result<impl IntoResponse, ApiError> {
    authorize(&state, &headers, Need::Gate)?;
    let b = body(b)?;
    if b.key_id.as_deref().is_some_and(|k| {
        !(k.len() == 27 && k.starts_with("dk-") && k[3..].bytes().all(|c| c.is_ascii_hexdigit()))
    }) {
        return Err(ApiError::bad_request(
            "key_id must be a data key's id as ciphertexts name it: dk- and 24 hex digits",
        ));
    }
    let engine = Arc::clone(&state.engine);
    let got = tokio::task::spawn_blocking(move || engine.data_key(b.lease_id, b.key_id.as_deref()))
        .await
        .map_err(|_| ApiError::unavailable())?;
    use lethe_engine::keys::KeyError;
    match got {
        Ok(k) => Ok(Json(json!({
            "key_id": k.key_id,
            "key": k.key_hex(),
            "expires_ms": k.expires_ms,
        }))),
        Err(KeyError::Off) => Err(ApiError::new(
            StatusCode::NOT_FOUND,
            "keys_off",
            KeyError::Off.to_string(),
        )),
        Err(KeyError::Destroyed) => Err(ApiError::new(
            StatusCode::GONE,
            "key_destroyed",
            KeyError::Destroyed.to_string(),
        )),
        Err(KeyError::Gate(g)) => Err(ApiError::from(g)),
        Err(KeyError::Engine(e)) => Err(engine_error(e)),
    }
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct JobJson {
    tenant: String,
    subject: Option<String>,
    memory: Option<String>,
    version: Option<String>,
    basis: String,
    ticket: String,
    deadline: Option<String>,
    extension_reason: Option<String>,
    drain_timeout_s: Option<u64>,
}

fn scope_of(b: &JobJson) -> Result<Scope, ApiError> {
    Scope::from_parts(
        &b.tenant,
        b.subject.as_deref(),
        b.memory.as_deref(),
        b.version.as_deref(),
    )
    .map_err(|e| ApiError::bad_request(e.to_string()))
}

pub(crate) fn engine_error(e: EngineError) -> ApiError {
    match e {
        // The engine names a request's fields as the API does (`ticket`): no rewording.
        EngineError::Input(m) => ApiError::bad_request(m),
        EngineError::Held { .. } => ApiError::new(StatusCode::CONFLICT, "held", e.to_string()),
        EngineError::Claimed(_) => ApiError::new(StatusCode::CONFLICT, "claimed", e.to_string()),
        EngineError::Journal(j) => j.into(),
        EngineError::Request(r) => crate::requests::refusal(r),
        e => {
            tracing::error!(error = %e, "Job request failed.");
            ApiError::unavailable()
        }
    }
}

async fn create_job(
    AxState(state): AxState<State>,
    headers: HeaderMap,
    b: Result<Object<JobJson>, ApiError>,
) -> Result<impl IntoResponse, ApiError> {
    authorize(&state, &headers, Need::RunJobs)?;
    if state.require_approval {
        return Err(ApiError::new(
            StatusCode::FORBIDDEN,
            "approval_required",
            "[serve] require_approval is on: every job comes from a request \
             (POST /v1/requests) that another token approves (POST /v1/requests/{id}/approve)",
        ));
    }
    let b = body(b)?;
    let scope = scope_of(&b)?;
    let basis: Basis = b.basis.parse().map_err(ApiError::bad_request)?;
    let deadline = b
        .deadline
        .as_deref()
        .map(|d| {
            time::Date::parse(
                d,
                &time::macros::format_description!("[year]-[month]-[day]"),
            )
        })
        .transpose()
        .map_err(|_| ApiError::bad_request("deadline must be YYYY-MM-DD"))?;
    let req = Request {
        scope,
        basis,
        ticket: b.ticket,
        deadline,
        extension_reason: b.extension_reason,
    };
    let opts = RunOptions {
        drain_timeout: drain_timeout(b.drain_timeout_s)?,
        ..RunOptions::default()
    };
    let engine = Arc::clone(&state.engine);
    let (job_id, created, state_now) = tokio::task::spawn_blocking(move || {
        // The run's claim connection opens while the request is made.
        engine.journal().prepare_claim();
        let (job_id, created) = engine.request(req)?;
        // A legal hold answers 409 `held` now, as the CLI exits 4, not from the job's thread.
        engine.refuse_if_held(&job_id)?;
        let state_now = engine.outcome(&job_id)?.state;
        run_requested_in_background(Arc::clone(&**engine), job_id.clone(), opts)?;
        Ok::<_, EngineError>((job_id, created, state_now))
    })
    .await
    .map_err(|_| ApiError::unavailable())?
    .map_err(engine_error)?;
    Ok((
        StatusCode::ACCEPTED,
        Json(json!({"job_id": job_id, "state": state_now, "continued": !created})),
    ))
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct BatchJson {
    jobs: Vec<lethe_core::Object<JobJson>>,
    drain_timeout_s: Option<u64>,
}

/// The most jobs one batch request creates.
const MAX_BATCH_JOBS: usize = 10_000;

/// A backlog at once (`lethe erase --batch` over HTTP): every entry is checked first (a bad
/// one answers 400 naming its index, and no job is created); then each scope becomes its own
/// job, as `POST /v1/jobs` makes it, and one thread runs them one after another. 202 with one
/// `{index, job_id, state, continued, held}` per entry; a held job stays REQUESTED, not run.
async fn create_jobs(
    AxState(state): AxState<State>,
    headers: HeaderMap,
    b: Result<Object<BatchJson>, ApiError>,
) -> Result<impl IntoResponse, ApiError> {
    authorize(&state, &headers, Need::RunJobs)?;
    if state.require_approval {
        return Err(ApiError::new(
            StatusCode::FORBIDDEN,
            "approval_required",
            "[serve] require_approval is on: every job comes from a request \
             (POST /v1/requests) that another token approves (POST /v1/requests/{id}/approve)",
        ));
    }
    let b = body(b)?;
    if b.jobs.is_empty() || b.jobs.len() > MAX_BATCH_JOBS {
        return Err(ApiError::bad_request(format!(
            "jobs must list 1 to {MAX_BATCH_JOBS} scopes"
        )));
    }
    let opts = RunOptions {
        drain_timeout: drain_timeout(b.drain_timeout_s)?,
        ..RunOptions::default()
    };
    let mut reqs = Vec::with_capacity(b.jobs.len());
    let mut seen = std::collections::HashSet::new();
    for (i, lethe_core::Object(j)) in b.jobs.into_iter().enumerate() {
        let at = |e: ApiError| ApiError::bad_request(format!("jobs[{i}]: {}", e.message));
        let scope = scope_of(&j).map_err(at)?;
        let basis: Basis = j
            .basis
            .parse()
            .map_err(|e: String| ApiError::bad_request(format!("jobs[{i}]: {e}")))?;
        if j.deadline.is_some() || j.extension_reason.is_some() || j.drain_timeout_s.is_some() {
            return Err(ApiError::bad_request(format!(
                "jobs[{i}]: a batch takes each basis's own deadline and the batch's \
                 drain_timeout_s: leave deadline, extension_reason and drain_timeout_s out"
            )));
        }
        if j.ticket.trim().is_empty()
            || j.ticket.len() > 256
            || j.ticket.chars().any(char::is_control)
        {
            return Err(ApiError::bad_request(format!(
                "jobs[{i}]: `ticket` must be a non-empty reference of at most 256 bytes without \
                 control characters"
            )));
        }
        // The same scope twice would be one job certified twice.
        if !seen.insert(scope.hash(&state.engine.key().scope_key()).to_string()) {
            return Err(ApiError::bad_request(format!(
                "jobs[{i}]: the same scope as an earlier entry"
            )));
        }
        reqs.push(Request {
            scope,
            basis,
            ticket: j.ticket,
            deadline: None,
            extension_reason: None,
        });
    }
    let engine = Arc::clone(&state.engine);
    let out = tokio::task::spawn_blocking(move || {
        // Every request is checked before any job exists.
        for r in &reqs {
            engine.check_scope(&r.scope)?;
        }
        let mut out = Vec::with_capacity(reqs.len());
        let mut run = Vec::new();
        for (i, req) in reqs.into_iter().enumerate() {
            let (job_id, created) = engine.request(req)?;
            let held = matches!(
                engine.refuse_if_held(&job_id),
                Err(EngineError::Held { .. })
            );
            let state_now = engine.outcome(&job_id)?.state;
            if !held {
                run.push(job_id.clone());
            }
            out.push(json!({"index": i, "job_id": job_id, "state": state_now,
                            "continued": !created, "held": held}));
        }
        let engine = Arc::clone(&**engine);
        std::thread::Builder::new()
            .name("lethe-batch".into())
            .spawn(move || {
                match engine.run_batch(run.clone(), &opts, &mut |_| {}) {
                    Ok(outs) => {
                        for (job_id, o) in run.iter().zip(outs) {
                            match o {
                                Ok(o) => tracing::info!(job = %job_id, state = %o.state, "Job run ended."),
                                Err(e) => tracing::warn!(job = %job_id, error = %e, "Job run stopped."),
                            }
                        }
                    }
                    Err(e) => tracing::warn!(jobs = run.len(), error = %e, "Batch not run."),
                }
                RUNS_ENDED.notify_waiters();
            })
            .map_err(EngineError::Io)?;
        Ok::<_, EngineError>(out)
    })
    .await
    .map_err(|_| ApiError::unavailable())?
    .map_err(engine_error)?;
    Ok((StatusCode::ACCEPTED, Json(json!({ "jobs": out }))))
}

/// Runs a job on its own thread; its progress is in the journal (GET /v1/jobs/{id}).
pub(crate) fn run_in_background(
    engine: Arc<Engine>,
    job_id: String,
    opts: RunOptions,
) -> Result<(), EngineError> {
    spawn_run(job_id, move |id| engine.resume(id, &opts, &mut |_| {}))
}

/// [`run_in_background`] for a job this request has just made, its targets probed by it: the
/// run does not probe them again (`resume` does), and its claim's connection opened while the
/// request was made (`prepare_claim`).
fn run_requested_in_background(
    engine: Arc<Engine>,
    job_id: String,
    opts: RunOptions,
) -> Result<(), EngineError> {
    spawn_run(job_id, move |id| engine.run(id, &opts, &mut |_| {}))
}

fn spawn_run(
    job_id: String,
    run: impl FnOnce(&str) -> Result<lethe_engine::Outcome, EngineError> + Send + 'static,
) -> Result<(), EngineError> {
    std::thread::Builder::new()
        .name("lethe-job".into())
        .spawn(move || {
            match run(&job_id) {
                Ok(o) => tracing::info!(job = %job_id, state = %o.state, "Job run ended."),
                Err(e) => tracing::warn!(job = %job_id, error = %e, "Job run stopped."),
            }
            RUNS_ENDED.notify_waiters();
        })
        .map(drop)
        .map_err(EngineError::Io)
}

/// Woken whenever a job run of this server ends: `GET /v1/jobs/{id}?wait_ms=` waits on it
/// (and re-reads the journal every `WAIT_POLL` besides, for a job another process runs).
static RUNS_ENDED: tokio::sync::Notify = tokio::sync::Notify::const_new();

/// How often a waiting `GET /v1/jobs/{id}` reads the journal without being woken.
const WAIT_POLL: Duration = Duration::from_millis(100);

/// The longest `wait_ms` a `GET /v1/jobs/{id}` takes.
const MAX_WAIT_MS: u64 = 30_000;

pub(crate) fn drain_timeout(secs: Option<u64>) -> Result<Duration, ApiError> {
    let secs = secs.unwrap_or(30);
    if secs > 86_400 {
        return Err(ApiError::bad_request(
            "drain_timeout_s must be at most 86400",
        ));
    }
    Ok(Duration::from_secs(secs))
}

async fn list_jobs(
    AxState(state): AxState<State>,
    headers: HeaderMap,
) -> Result<Json<Value>, ApiError> {
    authorize(&state, &headers, Need::ReadJobs)?;
    let engine = Arc::clone(&state.engine);
    let jobs = tokio::task::spawn_blocking(move || engine.journal().jobs())
        .await
        .map_err(|_| ApiError::unavailable())??;
    // As `lethe jobs --json`: hashes and states, never the scope's identifiers.
    Ok(Json(json!(jobs
        .iter()
        .map(lethe_journal::jobs::JobRecord::summary)
        .collect::<Vec<_>>())))
}

#[derive(Deserialize, Default)]
#[serde(deny_unknown_fields)]
struct ResumeJson {
    drain_timeout_s: Option<u64>,
    reinventory: Option<bool>,
}

async fn resume_job(
    AxState(state): AxState<State>,
    headers: HeaderMap,
    job_id: Result<Path<String>, PathRejection>,
    b: Result<axum::body::Bytes, axum::extract::rejection::BytesRejection>,
) -> Result<impl IntoResponse, ApiError> {
    authorize(&state, &headers, Need::ResumeJobs)?;
    let job_id = path(job_id)?;
    // The body is optional: parsed here, so its errors have the API's shape and redaction.
    let b = b.map_err(|e| match e.status() {
        StatusCode::PAYLOAD_TOO_LARGE => too_large(),
        _ => ApiError::bad_request("the body could not be read"),
    })?;
    let b: ResumeJson = if b.iter().all(u8::is_ascii_whitespace) {
        ResumeJson::default()
    } else {
        parse_object(&b)?
    };
    let opts = RunOptions {
        drain_timeout: drain_timeout(b.drain_timeout_s)?,
        reinventory: b.reinventory.unwrap_or(false),
        ..RunOptions::default()
    };
    let engine = Arc::clone(&state.engine);
    let state_now = tokio::task::spawn_blocking(move || {
        let state_now = engine.outcome(&job_id)?.state;
        if state_now != JobState::Complete {
            // Refused now, as a new job is: the run in the background would stop at once.
            engine.journal().check_chain()?;
            engine.refuse_if_held(&job_id)?;
        }
        run_in_background(Arc::clone(&**engine), job_id, opts)?;
        Ok::<_, EngineError>(state_now)
    })
    .await
    .map_err(|_| ApiError::unavailable())?
    .map_err(engine_error)?;
    Ok((StatusCode::ACCEPTED, Json(json!({"state": state_now}))))
}

/// `GET /v1/jobs/{id}`'s query: `wait_ms`, how long to wait for the job to end (COMPLETE or
/// BLOCKED) before answering where it stands.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct JobWait {
    wait_ms: Option<u64>,
}

async fn job(
    AxState(state): AxState<State>,
    headers: HeaderMap,
    job_id: Result<Path<String>, PathRejection>,
    RawQuery(query): RawQuery,
) -> Result<Json<Value>, ApiError> {
    authorize(&state, &headers, Need::ReadJobs)?;
    let job_id = path(job_id)?;
    let wait = match query.as_deref() {
        None | Some("") => 0,
        q => parse_query::<JobWait>(q)?.wait_ms.unwrap_or(0),
    };
    if wait > MAX_WAIT_MS {
        return Err(ApiError::bad_request(format!(
            "wait_ms must be at most {MAX_WAIT_MS}"
        )));
    }
    let until = tokio::time::Instant::now() + Duration::from_millis(wait);
    let out = loop {
        // Registered before the read, so a run that ends after it still wakes this wait.
        let ended = RUNS_ENDED.notified();
        tokio::pin!(ended);
        ended.as_mut().enable();
        let engine = Arc::clone(&state.engine);
        let id = job_id.clone();
        let out = tokio::task::spawn_blocking(move || engine.outcome(&id))
            .await
            .map_err(|_| ApiError::unavailable())?
            .map_err(engine_error)?;
        let now = tokio::time::Instant::now();
        if matches!(out.state, JobState::Complete | JobState::Blocked) || now >= until {
            break out;
        }
        let _ = tokio::time::timeout((until - now).min(WAIT_POLL), ended).await;
    };
    // As `erase --json`, less `continued` (a request's answer, not the job's): the certificate
    // itself, not where this server's process wrote its file.
    Ok(Json(json!({
        "job_id": out.job_id,
        "state": out.state,
        "blocked_reason": out.blocked_reason,
        "blocked_target": out.blocked_target,
        "certificate": out.certificate,
    })))
}
