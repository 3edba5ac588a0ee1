//! The DPO's routes: erasure requests and their approval (`/v1/requests`), legal holds
//! (`/v1/holds`) and the intake switch (`/v1/intake`). The rules are the engine's
//! (`lethe_engine::requests`), shared with the CLI; here a token's role is checked and its
//! name passed as who asks or decides.
//!
//! A request's identifiers are answered only by `GET /v1/requests/{id}`, to the roles that
//! make and decide requests; listings carry the scope's kind and keyed hash.

use std::sync::Arc;

use axum::extract::rejection::PathRejection;
use axum::extract::{Path, State as AxState};
use axum::http::{HeaderMap, StatusCode};
use axum::response::IntoResponse;
use axum::routing::{get, post};
use axum::{Json, Router};
use lethe_core::{Basis, Scope, Subject, Tenant};
use lethe_engine::requests::{days_left, RequestError, RequestInput};
use lethe_engine::{EngineError, RunOptions};
use lethe_journal::requests::RequestRecord;
use serde::Deserialize;
use serde_json::{json, Value};

use crate::api::{authorize, body, engine_error, path, Need, Object, State};
use crate::error::ApiError;

pub(crate) fn routes() -> Router<State> {
    Router::new()
        .route("/v1/requests", post(create).get(list))
        .route("/v1/requests/{request_id}", get(one))
        .route("/v1/requests/{request_id}/approve", post(approve))
        .route("/v1/requests/{request_id}/reject", post(reject))
        .route("/v1/holds", post(add_hold).get(holds))
        .route("/v1/holds/release", post(release_holds))
        .route("/v1/intake", get(intake))
        .route("/v1/intake/pause", post(pause))
        .route("/v1/intake/resume", post(resume))
}

/// A request's refusal: its status and stable code, here only.
pub(crate) fn refusal(e: RequestError) -> ApiError {
    let (status, code) = match e {
        RequestError::SamePerson(_) => (StatusCode::FORBIDDEN, "same_person"),
        RequestError::NoSuchRequest(_) => (StatusCode::NOT_FOUND, "no_such_request"),
        RequestError::Decided { .. } => (StatusCode::CONFLICT, "decided"),
        RequestError::Unverified(_) => (StatusCode::CONFLICT, "identity_unverified"),
        RequestError::IntakePaused => (StatusCode::SERVICE_UNAVAILABLE, "intake_paused"),
    };
    ApiError::new(status, code, e.to_string())
}

/// Runs engine work off the async threads.
async fn blocking<T: Send + 'static>(
    state: &State,
    f: impl FnOnce(&lethe_engine::Engine) -> Result<T, EngineError> + Send + 'static,
) -> Result<T, ApiError> {
    let engine = Arc::clone(&state.engine);
    tokio::task::spawn_blocking(move || f(&engine))
        .await
        .map_err(|_| ApiError::unavailable())?
        .map_err(engine_error)
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RequestJson {
    tenant: String,
    subject: Option<String>,
    memory: Option<String>,
    version: Option<String>,
    basis: String,
    ticket: String,
    received_at: String,
    identity_verified: bool,
    deadline: Option<String>,
    extension_reason: Option<String>,
}

fn date(d: &str, field: &str) -> Result<time::Date, ApiError> {
    time::Date::parse(
        d,
        &time::macros::format_description!("[year]-[month]-[day]"),
    )
    .map_err(|_| ApiError::bad_request(format!("{field} must be YYYY-MM-DD")))
}

async fn create(
    AxState(state): AxState<State>,
    headers: HeaderMap,
    b: Result<Object<RequestJson>, ApiError>,
) -> Result<impl IntoResponse, ApiError> {
    let token = authorize(&state, &headers, Need::Request)?;
    let b = body(b)?;
    let scope = Scope::from_parts(
        &b.tenant,
        b.subject.as_deref(),
        b.memory.as_deref(),
        b.version.as_deref(),
    )
    .map_err(|e| ApiError::bad_request(e.to_string()))?;
    let basis: Basis = b.basis.parse().map_err(ApiError::bad_request)?;
    let received_at = lethe_engine::requests::parse_received(&b.received_at).ok_or_else(|| {
        ApiError::bad_request(
            "received_at must be an RFC 3339 time with its offset (2026-12-01T09:30:00Z) or a \
             day (2026-12-01)",
        )
    })?;
    let deadline = b
        .deadline
        .as_deref()
        .map(|d| date(d, "deadline"))
        .transpose()?;
    let input = RequestInput {
        scope,
        basis,
        ticket: b.ticket,
        received_at,
        deadline,
        extension_reason: b.extension_reason,
        identity_verified: b.identity_verified,
    };
    let rec = blocking(&state, move |e| e.submit_request(input, &token.name)).await?;
    Ok((
        StatusCode::CREATED,
        Json(json!({
            "request_id": rec.request_id,
            "deadline": rec.deadline,
            "state": rec.state,
        })),
    ))
}

/// What a listing shows of a request: no identifier.
pub(crate) fn summary(r: &RequestRecord, today: time::Date) -> Value {
    json!({
        "request_id": r.request_id,
        "state": r.state,
        "scope": r.scope.kind(),
        "scope_hash": r.scope_hash,
        "basis": r.basis,
        "ticket": r.ticket,
        "received_at": r.received_at,
        "deadline": r.deadline,
        "days_left": days_left(&r.deadline, today),
        "extension_reason": r.extension_reason,
        "identity_verified": r.identity_verified,
        "requested_by": r.requested_by,
        "decided_by": r.decided_by,
        "decided_at": r.decided_at,
        "reject_reason": r.reject_reason,
        "job_id": r.job_id,
    })
}

async fn list(AxState(state): AxState<State>, headers: HeaderMap) -> Result<Json<Value>, ApiError> {
    authorize(&state, &headers, Need::ReadRequests)?;
    let today = state.clock.now().date();
    let all = blocking(&state, |e| Ok(e.journal().requests()?)).await?;
    Ok(Json(json!(all
        .iter()
        .map(|r| summary(r, today))
        .collect::<Vec<_>>())))
}

async fn one(
    AxState(state): AxState<State>,
    headers: HeaderMap,
    id: Result<Path<String>, PathRejection>,
) -> Result<Json<Value>, ApiError> {
    authorize(&state, &headers, Need::ReadRequests)?;
    let id = path(id)?;
    let today = state.clock.now().date();
    let rec = blocking(&state, move |e| {
        if !lethe_engine::requests::is_request_id(&id) {
            return Err(EngineError::Input(
                "a request id is `req-` and 12 hex digits".into(),
            ));
        }
        e.journal()
            .request(&id)?
            .ok_or_else(|| RequestError::NoSuchRequest(id).into())
    })
    .await?;
    let mut v = summary(&rec, today);
    // The identifiers, to the roles that make and decide requests: an approver checks what
    // they approve.
    v["tenant"] = json!(rec.scope.tenant().as_str());
    v["subject"] = json!(rec.scope.subject().map(Subject::as_str));
    if let Scope::Memory {
        memory, version, ..
    } = &rec.scope
    {
        v["memory"] = json!(memory.as_str());
        v["version"] = json!(version.as_ref().map(|v| v.as_str()));
    }
    Ok(Json(v))
}

#[derive(Deserialize, Default)]
#[serde(deny_unknown_fields)]
struct ApproveJson {
    drain_timeout_s: Option<u64>,
}

/// A body that may be absent: empty is `T::default()`.
fn optional<T: serde::de::DeserializeOwned + Default>(
    b: Result<axum::body::Bytes, axum::extract::rejection::BytesRejection>,
) -> Result<T, ApiError> {
    let b = b.map_err(|_| ApiError::bad_request("the body could not be read"))?;
    if b.iter().all(u8::is_ascii_whitespace) {
        Ok(T::default())
    } else {
        crate::api::parse_object(&b)
    }
}

async fn approve(
    AxState(state): AxState<State>,
    headers: HeaderMap,
    id: Result<Path<String>, PathRejection>,
    b: Result<axum::body::Bytes, axum::extract::rejection::BytesRejection>,
) -> Result<impl IntoResponse, ApiError> {
    let token = authorize(&state, &headers, Need::Decide)?;
    let id = path(id)?;
    let b: ApproveJson = optional(b)?;
    let opts = RunOptions {
        drain_timeout: crate::api::drain_timeout(b.drain_timeout_s)?,
        ..RunOptions::default()
    };
    let request_id = id.clone();
    let (job_id, job_state) = blocking(&state, move |e| {
        let job_id = e.approve_request(&id, &token.name)?;
        // Approved and journaled; a legal hold keeps the job REQUESTED (409 `held`), as
        // `POST /v1/jobs` answers.
        e.refuse_if_held(&job_id)?;
        let job_state = e.outcome(&job_id)?.state;
        Ok((job_id, job_state))
    })
    .await?;
    crate::api::run_in_background(Arc::clone(&**state.engine), job_id.clone(), opts)
        .map_err(engine_error)?;
    Ok((
        StatusCode::ACCEPTED,
        Json(json!({"request_id": request_id, "job_id": job_id, "state": job_state})),
    ))
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RejectJson {
    reason: String,
}

async fn reject(
    AxState(state): AxState<State>,
    headers: HeaderMap,
    id: Result<Path<String>, PathRejection>,
    b: Result<Object<RejectJson>, ApiError>,
) -> Result<Json<Value>, ApiError> {
    let token = authorize(&state, &headers, Need::Decide)?;
    let id = path(id)?;
    let b = body(b).map_err(|e| {
        if e.code == "bad_request" {
            ApiError::bad_request(format!(
                "{}; a rejection needs {{\"reason\": \"...\"}}",
                e.message
            ))
        } else {
            e
        }
    })?;
    let request_id = id.clone();
    blocking(&state, move |e| {
        e.reject_request(&id, &token.name, &b.reason)
    })
    .await?;
    Ok(Json(json!({"request_id": request_id, "state": "REJECTED"})))
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct HoldJson {
    tenant: String,
    subject: Option<String>,
    reason: Option<String>,
}

fn hold_scope(
    tenant: String,
    subject: Option<String>,
) -> Result<(Tenant, Option<Subject>), ApiError> {
    let bad = |e: lethe_core::IdentError| ApiError::bad_request(e.to_string());
    Ok((
        Tenant::new(tenant).map_err(bad)?,
        subject.map(Subject::new).transpose().map_err(bad)?,
    ))
}

async fn add_hold(
    AxState(state): AxState<State>,
    headers: HeaderMap,
    b: Result<Object<HoldJson>, ApiError>,
) -> Result<impl IntoResponse, ApiError> {
    let token = authorize(&state, &headers, Need::Decide)?;
    let b = body(b)?;
    let (tenant, subject) = hold_scope(b.tenant, b.subject)?;
    let hold_id = blocking(&state, move |e| {
        e.add_hold(&tenant, subject.as_ref(), b.reason.as_deref())
    })
    .await?;
    tracing::info!(hold = %hold_id, by = %token.name, "Hold placed over HTTP.");
    Ok((StatusCode::CREATED, Json(json!({"hold_id": hold_id}))))
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct ReleaseJson {
    tenant: String,
    subject: Option<String>,
}

async fn release_holds(
    AxState(state): AxState<State>,
    headers: HeaderMap,
    b: Result<Object<ReleaseJson>, ApiError>,
) -> Result<Json<Value>, ApiError> {
    let token = authorize(&state, &headers, Need::Decide)?;
    let b = body(b)?;
    let (tenant, subject) = hold_scope(b.tenant, b.subject)?;
    let ids = blocking(&state, move |e| e.release_holds(&tenant, subject.as_ref())).await?;
    if ids.is_empty() {
        return Err(ApiError::new(
            StatusCode::NOT_FOUND,
            "no_such_hold",
            "no active hold on exactly that tenant (and subject); GET /v1/holds lists them",
        ));
    }
    tracing::info!(holds = %ids.join(","), by = %token.name, "Holds released over HTTP.");
    Ok(Json(json!({"released": ids})))
}

async fn holds(
    AxState(state): AxState<State>,
    headers: HeaderMap,
) -> Result<Json<Value>, ApiError> {
    authorize(&state, &headers, Need::Decide)?;
    let holds = blocking(&state, |e| Ok(e.journal().holds()?)).await?;
    Ok(Json(json!(holds)))
}

async fn intake(
    AxState(state): AxState<State>,
    headers: HeaderMap,
) -> Result<Json<Value>, ApiError> {
    authorize(&state, &headers, Need::ReadRequests)?;
    let paused = blocking(&state, |e| Ok(e.journal().is_intake_paused()?)).await?;
    Ok(Json(json!({"paused": paused})))
}

async fn switch(state: State, headers: HeaderMap, paused: bool) -> Result<Json<Value>, ApiError> {
    let token = authorize(&state, &headers, Need::Intake)?;
    let changed = blocking(&state, move |e| e.set_intake_paused(paused, &token.name)).await?;
    Ok(Json(json!({"paused": paused, "changed": changed})))
}

async fn pause(
    AxState(state): AxState<State>,
    headers: HeaderMap,
) -> Result<Json<Value>, ApiError> {
    switch(state, headers, true).await
}

async fn resume(
    AxState(state): AxState<State>,
    headers: HeaderMap,
) -> Result<Json<Value>, ApiError> {
    switch(state, headers, false).await
}
