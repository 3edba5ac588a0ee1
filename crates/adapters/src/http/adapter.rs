//! The `http` adapter: locate, erase one item at a time by its locator, poll what the vendor
//! accepted, and read back.

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use lethe_core::Scope;
use sha2::{Digest, Sha256};
use ureq::http::Method;

use super::client::{Client, Reply, SendError};
use super::template::{RenderError, Rendered, Template, Values};
use crate::{within_inventory, Adapter, AdapterError, Applicability, Description, Inventory, Kind};

/// A locate request and where its answer holds the items.
#[derive(Debug)]
pub(crate) struct Locate {
    pub(crate) template: Template,
    pub(crate) items: String,
    pub(crate) id: String,
    pub(crate) count: Option<String>,
    pub(crate) empty_on_404: bool,
}

/// The erase request.
#[derive(Debug)]
pub(crate) struct Erase {
    pub(crate) template: Template,
    pub(crate) deleted: Option<String>,
}

/// How a 202's completion is polled.
#[derive(Debug)]
pub(crate) struct Status {
    pub(crate) url: Option<String>,
    pub(crate) done: String,
    pub(crate) done_value: String,
    pub(crate) failed_value: Option<String>,
    pub(crate) deleted: Option<String>,
    pub(crate) poll: Duration,
    pub(crate) timeout: Duration,
}

/// An `http` target.
#[derive(Debug)]
pub struct Http {
    pub(crate) name: String,
    pub(crate) client: Client,
    pub(crate) place: String,
    pub(crate) locate: Locate,
    pub(crate) locate_tenant: Option<Locate>,
    pub(crate) locate_memory: Option<Locate>,
    pub(crate) erase: Erase,
    pub(crate) get: Option<Template>,
    pub(crate) status: Option<Status>,
    pub(crate) batch_size: usize,
}

/// The `Idempotency-Key` of one request: the same for every attempt, every run and every job
/// that sends it (a SHA-256 of the target, the operation and what it names), so a vendor that
/// keeps keys recognises a retry after a lost answer.
pub(crate) fn idempotency_key(target: &str, op: &str, what: &str) -> String {
    let mut h = Sha256::new();
    for part in ["lethe-http-1", target, op, what] {
        h.update((part.len() as u64).to_be_bytes());
        h.update(part.as_bytes());
    }
    hex::encode(h.finalize())
}

/// A JSON value as text to compare: a string as itself, a number or a boolean as JSON writes it.
fn text(v: &serde_json::Value) -> Option<String> {
    match v {
        serde_json::Value::String(s) => Some(s.clone()),
        serde_json::Value::Number(n) => Some(n.to_string()),
        serde_json::Value::Bool(b) => Some(b.to_string()),
        _ => None,
    }
}

impl Http {
    fn failed(&self, why: impl Into<String>) -> AdapterError {
        AdapterError::Failed {
            target: self.name.clone(),
            why: why.into(),
        }
    }

    fn inexpressible(&self, why: impl Into<String>) -> AdapterError {
        AdapterError::Inexpressible {
            target: self.name.clone(),
            why: why.into(),
        }
    }

    fn sent(&self, e: SendError) -> AdapterError {
        match e {
            SendError::Unavailable(why) | SendError::Busy(why) => AdapterError::Unavailable {
                target: self.name.clone(),
                why,
            },
        }
    }

    fn render(&self, t: &Template, v: &Values<'_>, key: &str) -> Result<Rendered, AdapterError> {
        t.render(v).map_err(|e| match e {
            RenderError::Missing(_) => {
                self.inexpressible(format!("`{key}` needs a value this scope does not give: {e}"))
            }
            RenderError::NotASegment(_) => self.inexpressible(format!("`{key}`: {e}")),
        })
    }

    fn json(&self, body: &[u8], op: &str) -> Result<serde_json::Value, AdapterError> {
        serde_json::from_slice(body)
            .map_err(|_| self.failed(format!("the {op} answer is not JSON")))
    }

    /// The locate request for a scope and the values it fills; `Ok(None)`: a memory scope and
    /// no `locate_memory` (the target holds no memory by id).
    fn selection<'s>(
        &self,
        scope: &'s Scope,
    ) -> Result<Option<(&Locate, &'static str, Values<'s>)>, AdapterError> {
        Ok(match scope {
            Scope::Tenant { tenant } => {
                let l = self.locate_tenant.as_ref().ok_or_else(|| {
                    self.inexpressible(
                        "it has no `locate_tenant` request, so a tenant's items cannot be listed: \
                         add one, or erase the tenant's subjects one by one",
                    )
                })?;
                Some((
                    l,
                    "locate_tenant",
                    Values {
                        tenant: Some(tenant.as_str()),
                        ..Values::default()
                    },
                ))
            }
            Scope::Subject { tenant, subject } => Some((
                &self.locate,
                "locate",
                Values {
                    tenant: Some(tenant.as_str()),
                    subject: Some(subject.as_str()),
                    ..Values::default()
                },
            )),
            Scope::Memory {
                tenant,
                subject,
                memory,
                version,
            } => self.locate_memory.as_ref().map(|l| {
                (
                    l,
                    "locate_memory",
                    Values {
                        tenant: Some(tenant.as_str()),
                        subject: Some(subject.as_str()),
                        memory_id: Some(memory.as_str()),
                        version: version.as_ref().map(|v| v.as_str()),
                        locator: None,
                    },
                )
            }),
        })
    }

    /// The items the vendor lists for the scope now: locator → rows.
    fn found(&self, scope: &Scope) -> Result<BTreeMap<String, u64>, AdapterError> {
        let Some((l, key, values)) = self.selection(scope)? else {
            return Ok(BTreeMap::new());
        };
        let r = self.render(&l.template, &values, key)?;
        let idem = idempotency_key(
            &self.name,
            key,
            &format!(
                "{} {} {}",
                r.method,
                r.target,
                String::from_utf8_lossy(r.body.as_deref().unwrap_or_default())
            ),
        );
        let reply = self
            .client
            .send(&r.method, &r.target, false, r.body.as_deref(), &idem, key)
            .map_err(|e| self.sent(e))?;
        match reply.status {
            200 | 203 => {}
            404 if l.empty_on_404 => return Ok(BTreeMap::new()),
            s => return Err(self.status_error(key, s)),
        }
        let doc = self.json(&reply.body, key)?;
        let items = doc
            .pointer(&l.items)
            .and_then(|v| v.as_array())
            .ok_or_else(|| self.failed(format!("the {key} answer has no array at `{key}.items`")))?;
        let mut out = BTreeMap::new();
        for item in items {
            let id = item
                .pointer(&l.id)
                .and_then(|v| match v {
                    serde_json::Value::String(s) if !s.is_empty() => Some(s.clone()),
                    serde_json::Value::Number(n) => Some(n.to_string()),
                    _ => None,
                })
                .ok_or_else(|| {
                    self.failed(format!(
                        "an item of the {key} answer has no non-empty string or number at `{key}.id`"
                    ))
                })?;
            let rows = match &l.count {
                None => 1,
                Some(p) => item.pointer(p).and_then(|v| v.as_u64()).ok_or_else(|| {
                    self.failed(format!(
                        "an item of the {key} answer has no count at `{key}.count`"
                    ))
                })?,
            };
            match out.insert(id, rows) {
                Some(before) if before != rows => {
                    return Err(self.failed(format!(
                        "the {key} answer lists one id twice with different counts"
                    )))
                }
                _ => {}
            }
        }
        Ok(out)
    }

    fn status_error(&self, op: &str, status: u16) -> AdapterError {
        match status {
            401 | 403 => self.failed(format!(
                "{op} answered HTTP {status}: the vendor refused the token (check `token_file`)"
            )),
            300..=399 => self.failed(format!(
                "{op} answered HTTP {status}: redirects are not followed (point `base_url` or the path at the final address)"
            )),
            _ => self.failed(format!("{op} answered HTTP {status}")),
        }
    }

    /// The values for a request about one locator of the scope.
    fn with_locator<'s>(scope: &'s Scope, locator: &'s str) -> Values<'s> {
        let mut v = Values {
            tenant: Some(scope.tenant().as_str()),
            locator: Some(locator),
            ..Values::default()
        };
        match scope {
            Scope::Tenant { .. } => {}
            Scope::Subject { subject, .. } => v.subject = Some(subject.as_str()),
            Scope::Memory {
                subject,
                memory,
                version,
                ..
            } => {
                v.subject = Some(subject.as_str());
                v.memory_id = Some(memory.as_str());
                v.version = version.as_ref().map(|v| v.as_str());
            }
        }
        v
    }

    /// Erases one item the vendor listed in this call; the rows it confirms erased.
    fn erase_one(&self, scope: &Scope, locator: &str, rows: u64) -> Result<u64, AdapterError> {
        let r = self.render(
            &self.erase.template,
            &Self::with_locator(scope, locator),
            "erase",
        )?;
        let idem = idempotency_key(&self.name, "erase", locator);
        let reply = self
            .client
            .send(&r.method, &r.target, false, r.body.as_deref(), &idem, "erase")
            .map_err(|e| self.sent(e))?;
        match reply.status {
            202 => {
                let done = self.poll(&reply, locator)?;
                let deleted = self.status.as_ref().and_then(|s| s.deleted.as_ref());
                self.count(&done, deleted, rows, "status")
            }
            200..=299 => {
                if self.erase.deleted.is_none() {
                    return Ok(rows);
                }
                let doc = self.json(&reply.body, "erase")?;
                self.count(&doc, self.erase.deleted.as_ref(), rows, "erase")
            }
            // Gone. Listed by this call's locate, so an attempt of ours whose answer was lost
            // erased it: it counts once, here (a vendor that replays the key's answer says 2xx
            // instead). Gone without such an attempt: someone else erased it, it counts zero.
            404 | 410 if reply.ambiguous => Ok(rows),
            404 | 410 => Ok(0),
            s => Err(self.status_error("erase", s)),
        }
    }

    /// Rows an answer says were erased: at `pointer` if set, else the locator's rows.
    fn count(
        &self,
        doc: &serde_json::Value,
        pointer: Option<&String>,
        rows: u64,
        op: &str,
    ) -> Result<u64, AdapterError> {
        match pointer {
            None => Ok(rows),
            Some(p) => doc.pointer(p).and_then(|v| v.as_u64()).ok_or_else(|| {
                self.failed(format!("the {op} answer has no count at `{op}.deleted`"))
            }),
        }
    }

    /// Polls a 202's status URL until done, within `status.poll_timeout_ms`.
    fn poll(&self, accepted: &Reply, locator: &str) -> Result<serde_json::Value, AdapterError> {
        let Some(s) = &self.status else {
            return Err(self.failed(
                "erase answered 202 (accepted, not yet done) and the target has no `status` table to poll its completion",
            ));
        };
        let url = match &s.url {
            Some(p) => self
                .json(&accepted.body, "erase")?
                .pointer(p)
                .and_then(|v| v.as_str())
                .map(str::to_string),
            None => accepted.location.clone(),
        }
        .ok_or_else(|| {
            self.failed(match &s.url {
                Some(_) => "erase answered 202 with no status URL at `status.url`",
                None => "erase answered 202 with no Location header (set `status.url` if the body holds the status URL)",
            })
        })?;
        let target = self.client.same_origin(&url).ok_or_else(|| {
            self.failed("the vendor's status URL is on another origin than base_url: Lethe sends its token to base_url only")
        })?;
        let idem = idempotency_key(&self.name, "status", locator);
        let deadline = Instant::now() + s.timeout;
        loop {
            let reply = self
                .client
                .send(&Method::GET, &target, true, None, &idem, "status")
                .map_err(|e| self.sent(e))?;
            if !(200..=299).contains(&reply.status) {
                return Err(self.status_error("status", reply.status));
            }
            let doc = self.json(&reply.body, "status")?;
            let state = doc.pointer(&s.done).and_then(text);
            if state.as_deref() == Some(s.done_value.as_str()) {
                return Ok(doc);
            }
            if state.is_some() && state == s.failed_value {
                return Err(self.failed("the vendor reports the erase failed (`status.failed_value`)"));
            }
            if Instant::now() + s.poll > deadline {
                return Err(AdapterError::Unavailable {
                    target: self.name.clone(),
                    why: "the vendor accepted an erase and has not completed it within status.poll_timeout_ms; resume the job: the same idempotency key is sent again".into(),
                });
            }
            // Pacing a real vendor's asynchronous work, not a clock a test controls.
            #[allow(clippy::disallowed_methods)]
            std::thread::sleep(s.poll);
        }
    }

    /// Whether `get` finds the item: `Ok(true)` 2xx, `Ok(false)` 404 or 410.
    fn still_there(&self, get: &Template, scope: &Scope, locator: &str) -> Result<bool, AdapterError> {
        let r = self.render(get, &Self::with_locator(scope, locator), "get")?;
        let idem = idempotency_key(&self.name, "get", locator);
        let reply = self
            .client
            .send(&r.method, &r.target, false, None, &idem, "get")
            .map_err(|e| self.sent(e))?;
        match reply.status {
            200..=299 => Ok(true),
            404 | 410 => Ok(false),
            s => Err(self.status_error("get", s)),
        }
    }
}

impl Adapter for Http {
    fn describe(&self) -> Description {
        let mut capabilities = vec!["scope:subject"];
        if self.locate_tenant.is_some() {
            capabilities.push("scope:tenant");
        }
        capabilities.push(if self.locate_memory.is_some() {
            "scope:memory"
        } else {
            "scope:memory-unconfigured"
        });
        capabilities.push("idempotency-key");
        if self.status.is_some() {
            capabilities.push("async:202-poll");
        }
        capabilities.push(if self.get.is_some() {
            "verify:locate+get"
        } else {
            "verify:locate"
        });
        Description {
            kind: Kind::Http,
            version: "1",
            capabilities,
        }
    }

    fn check_scope(&self, scope: &Scope) -> Result<Applicability, AdapterError> {
        let Some((l, key, values)) = self.selection(scope)? else {
            return Ok(Applicability::Exempt(
                "the target declares no `locate_memory` request: it lists no memory by id".into(),
            ));
        };
        self.render(&l.template, &values, key)?;
        // Every request about one of its items must render too, for any locator.
        let any = Self::with_locator(scope, "x");
        self.render(&self.erase.template, &any, "erase")?;
        if let Some(g) = &self.get {
            self.render(g, &any, "get")?;
        }
        Ok(Applicability::Applies)
    }

    /// A request to `base_url` without the token: any HTTP answer says the vendor is reachable.
    fn probe(&self) -> Result<(), AdapterError> {
        self.client
            .send(&Method::GET, "/", false, None, &idempotency_key(&self.name, "probe", ""), "probe")
            .map(|_| ())
            .or_else(|e| match e {
                // Busy (429, 5xx after retries) is still reachable; no connection is not.
                SendError::Busy(_) => Ok(()),
                e => Err(self.sent(e)),
            })
    }

    fn place(&self) -> String {
        self.place.clone()
    }

    fn inventory(&self, scope: &Scope) -> Result<Inventory, AdapterError> {
        let found = self.found(scope)?;
        // Every locator must be a path segment if the erase or get path takes it whole.
        for id in found.keys() {
            let v = Self::with_locator(scope, id);
            for (t, key) in [(Some(&self.erase.template), "erase"), (self.get.as_ref(), "get")] {
                if let Some(Err(RenderError::NotASegment(_))) = t.map(|t| t.render(&v)) {
                    return Err(self.inexpressible(format!(
                        "the vendor listed an item whose id is `.`, `..` or empty, which `{key}.path` cannot name"
                    )));
                }
            }
        }
        Ok(Inventory::from_locators(found.into_iter().collect()))
    }

    /// One request per locator. A locator this call's locate no longer lists is gone and counts
    /// zero without a request (a vendor that replays an idempotency key's answer would
    /// otherwise say "erased" twice). An HTTP erase has no transaction to roll back: the guard
    /// stops at the first answer that takes the batch over its frozen rows.
    fn erase_batch(&self, scope: &Scope, batch: &[(String, u64)]) -> Result<u64, AdapterError> {
        if batch.is_empty() {
            return Ok(0);
        }
        let present = self.found(scope)?;
        let mut expected = 0;
        let mut erased = 0;
        for (locator, rows) in batch {
            expected += rows;
            if !present.contains_key(locator) {
                continue;
            }
            erased += self.erase_one(scope, locator, *rows)?;
            within_inventory(&self.name, expected, erased)?;
        }
        let total = batch.iter().map(|(_, n)| n).sum();
        within_inventory(&self.name, total, erased)?;
        tracing::debug!(target_name = %self.name, locators = batch.len(), erased, "Vendor batch erased.");
        Ok(erased)
    }

    fn batch_size(&self) -> Option<usize> {
        Some(self.batch_size)
    }

    fn verify(&self, scope: &Scope, frozen: &[(String, u64)]) -> Result<u64, AdapterError> {
        let present = self.found(scope)?;
        let mut left: u64 = present.values().sum();
        if let Some(get) = &self.get {
            for (locator, rows) in frozen {
                if !present.contains_key(locator) && self.still_there(get, scope, locator)? {
                    left += rows;
                }
            }
        }
        Ok(left)
    }
}
