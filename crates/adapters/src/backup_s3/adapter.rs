//! The `backup-s3` adapter: signed `ListObjectsV2` and `GetBucketLifecycleConfiguration`
//! calls over `ureq`; erases nothing.

use std::time::Duration;

use lethe_core::Scope;
use sha2::{Digest, Sha256};
use time::OffsetDateTime;

use crate::backup::{glob, Artifact, Retention};
use crate::{Adapter, AdapterError, Applicability, Description, Inventory, Kind};

use super::lifecycle::Rules;
use super::sigv4::{self, Credentials};
use super::xml;

/// The most bytes one answer may have (a page of 1,000 keys is a few hundred KiB).
const MAX_BODY: u64 = 32 << 20;

/// A bucket and prefix of backup artifacts.
pub struct BackupS3 {
    name: String,
    /// `http://host[:port]` or `https://...`.
    origin: String,
    /// `host[:port]`: the `Host` header, signed.
    authority: String,
    region: String,
    bucket: String,
    prefix: String,
    pattern: String,
    retention: Retention,
    credentials: Credentials,
    agent: ureq::Agent,
    /// Keys per listing page (`max-keys`); `None`: the server's default (1,000 on S3). Tests
    /// set it to make a listing span pages.
    pub(super) page: Option<u32>,
}

impl std::fmt::Debug for BackupS3 {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("BackupS3")
            .field("name", &self.name)
            .field("bucket", &self.bucket)
            .finish_non_exhaustive()
    }
}

/// An answer: its status and body.
pub(super) struct Answer {
    pub(super) status: u16,
    pub(super) body: Vec<u8>,
}

impl BackupS3 {
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn new(
        name: &str,
        scheme: &str,
        authority: String,
        region: String,
        bucket: String,
        prefix: String,
        pattern: String,
        retention: Retention,
        credentials: Credentials,
        timeout: Duration,
    ) -> Self {
        // As http::client builds its agent: no redirects (a redirect would carry the signed
        // request elsewhere), no proxy from the environment, statuses as answers. That client
        // itself does not fit: its headers are fixed per client, a signature is per request.
        let agent: ureq::Agent = ureq::Agent::config_builder()
            .max_redirects(0)
            .max_redirects_will_error(false)
            .proxy(None)
            .http_status_as_error(false)
            .timeout_global(Some(timeout))
            .user_agent(concat!("lethe/", env!("CARGO_PKG_VERSION")))
            .build()
            .into();
        Self {
            name: name.to_string(),
            origin: format!("{scheme}://{authority}"),
            authority,
            region,
            bucket,
            prefix,
            pattern,
            retention,
            credentials,
            agent,
            page: None,
        }
    }

    fn failed(&self, why: impl Into<String>) -> AdapterError {
        AdapterError::Failed {
            target: self.name.clone(),
            why: why.into(),
        }
    }

    /// The bucket's path (`/<bucket>`), and an object's (`/<bucket>/<key>`).
    pub(super) fn path(&self, key: Option<&str>) -> String {
        match key {
            None => format!("/{}", sigv4::uri_encode(&self.bucket, false)),
            Some(k) => format!(
                "/{}/{}",
                sigv4::uri_encode(&self.bucket, false),
                sigv4::uri_encode(k, true)
            ),
        }
    }

    /// One signed request. No answer (refused, dropped, timed out) is `unavailable`; any
    /// answer is returned as it is. `op` names it in messages, never the URL (it holds keys).
    pub(super) fn send(
        &self,
        op: &str,
        method: &str,
        path: &str,
        query: &str,
        body: &[u8],
    ) -> Result<Answer, AdapterError> {
        let payload_hash = hex::encode(Sha256::digest(body));
        // The signature's time must be the wall clock the server compares it with (S3 allows
        // 15 minutes of skew), not a clock a test controls; nothing is decided by it.
        #[allow(clippy::disallowed_methods)]
        let now = OffsetDateTime::from(std::time::SystemTime::now());
        let amz_date = sigv4::amz_date(now);
        let headers = [
            ("host", self.authority.as_str()),
            ("x-amz-content-sha256", payload_hash.as_str()),
            ("x-amz-date", amz_date.as_str()),
        ];
        let auth = sigv4::authorization(
            &self.credentials,
            &self.region,
            &amz_date,
            &sigv4::Request {
                method,
                path,
                query,
                headers: &headers,
                payload_hash: &payload_hash,
            },
        );
        let uri = match query {
            "" => format!("{}{path}", self.origin),
            q => format!("{}{path}?{q}", self.origin),
        };
        let mut b = ureq::http::Request::builder().method(method).uri(uri);
        for (k, v) in headers {
            b = b.header(k, v);
        }
        let request = b
            .header("authorization", auth)
            .body(body.to_vec())
            .map_err(|_| self.failed(format!("{op}: the request could not be built")))?;
        let unavailable = |why: String| AdapterError::Unavailable {
            target: self.name.clone(),
            why: format!("{op}: {why}"),
        };
        let mut response = self.agent.run(request).map_err(|e| unavailable(shown(&e)))?;
        let status = response.status().as_u16();
        let body = response
            .body_mut()
            .with_config()
            .limit(MAX_BODY)
            .read_to_vec()
            .map_err(|e| unavailable(format!("reading the answer: {}", shown(&e))))?;
        Ok(Answer { status, body })
    }

    /// An answer that is not a success, as an error: 429 and 5xx (`SlowDown`, `InternalError`,
    /// `ServiceUnavailable`) are `unavailable`; others `failed`. Only the status and S3's
    /// error code are shown, never the message (it may quote a key).
    pub(super) fn refused(&self, op: &str, a: &Answer) -> AdapterError {
        let code = error_code(&a.body);
        let why = format!(
            "{op} answered HTTP {} ({})",
            a.status,
            code.as_deref().unwrap_or("no S3 error code")
        );
        if a.status == 429 || (500..=599).contains(&a.status) {
            return AdapterError::Unavailable {
                target: self.name.clone(),
                why: format!("{why}: the server is busy or down; resume the job later"),
            };
        }
        let hint = match code.as_deref() {
            // NotSignedUp: s3s's answer to a key id it does not know (AWS: InvalidAccessKeyId).
            Some(
                "AccessDenied" | "InvalidAccessKeyId" | "SignatureDoesNotMatch" | "NotSignedUp",
            ) => {
                ": check access_key_id_file and secret_access_key_file, and that the key may \
                 list the bucket (s3:ListBucket) and read its lifecycle (s3:GetLifecycleConfiguration)"
            }
            Some("NoSuchBucket") => ": no bucket of that name at this endpoint (check bucket and endpoint)",
            Some("AuthorizationHeaderMalformed" | "PermanentRedirect" | "IllegalLocationConstraintException") => {
                ": check region (the bucket's own region)"
            }
            Some("RequestTimeTooSkewed") => {
                ": this machine's clock and the server's differ by more than 15 minutes"
            }
            _ => "",
        };
        self.failed(format!("{why}{hint}"))
    }

    /// The bucket's expiration rules: none where it has none (404
    /// `NoSuchLifecycleConfiguration`) or the server does not implement them (501).
    fn lifecycle(&self) -> Result<Rules, AdapterError> {
        const OP: &str = "GetBucketLifecycleConfiguration";
        let a = self.send(OP, "GET", &self.path(None), "lifecycle=", b"")?;
        match (a.status, error_code(&a.body).as_deref()) {
            (200, _) => {}
            (404, Some("NoSuchLifecycleConfiguration")) | (501, _) => return Ok(Rules::default()),
            _ => return Err(self.refused(OP, &a)),
        }
        xml::parse(&a.body)
            .and_then(|root| Rules::parse(&root))
            .map_err(|e| self.failed(format!("{OP}'s answer cannot be read: {e}")))
    }

    /// One page of `ListObjectsV2` from `token`: its objects' keys and times, and the next
    /// page's token.
    #[allow(clippy::type_complexity)]
    fn page(
        &self,
        token: Option<&str>,
        max_keys: Option<u32>,
    ) -> Result<(Vec<(String, OffsetDateTime)>, Option<String>), AdapterError> {
        const OP: &str = "ListObjectsV2";
        let max = max_keys.map(|m| m.to_string());
        let mut params = vec![("list-type", "2")];
        if !self.prefix.is_empty() {
            params.push(("prefix", self.prefix.as_str()));
        }
        if let Some(t) = token {
            params.push(("continuation-token", t));
        }
        if let Some(m) = &max {
            params.push(("max-keys", m));
        }
        let a = self.send(OP, "GET", &self.path(None), &sigv4::canonical_query(&params), b"")?;
        if a.status != 200 {
            return Err(self.refused(OP, &a));
        }
        let bad = |why: &str| self.failed(format!("{OP}'s answer cannot be read: {why}"));
        let root = xml::parse(&a.body).map_err(|e| bad(&e))?;
        if root.name != "ListBucketResult" {
            return Err(bad("it is not a ListBucketResult"));
        }
        let mut objects = Vec::new();
        for c in root.all("Contents") {
            let key = c.text_of("Key").ok_or_else(|| bad("an object without a Key"))?;
            let when = c
                .text_of("LastModified")
                .and_then(|t| {
                    OffsetDateTime::parse(t.trim(), &time::format_description::well_known::Rfc3339)
                        .ok()
                })
                .ok_or_else(|| bad("an object without a LastModified time"))?;
            objects.push((key.to_string(), when));
        }
        let next = match root.text_of("IsTruncated").map(str::trim) {
            Some("true") => Some(
                root.text_of("NextContinuationToken")
                    .filter(|t| !t.is_empty() && Some(*t) != token)
                    .ok_or_else(|| bad("a truncated page without a new NextContinuationToken"))?
                    .to_string(),
            ),
            _ => None,
        };
        Ok((objects, next))
    }

    /// The artifacts under the prefix that match the pattern, sorted by name, each expiring
    /// at the later of its retention and the bucket's rules.
    fn list(&self) -> Result<Vec<Artifact>, AdapterError> {
        let mut objects = Vec::new();
        let mut token: Option<String> = None;
        loop {
            let (page, next) = self.page(token.as_deref(), self.page)?;
            objects.extend(page);
            match next {
                Some(t) => token = Some(t),
                None => break,
            }
        }
        let rules = self.lifecycle()?;
        let mut out = Vec::new();
        for (key, taken) in objects {
            let Some(name) = key.strip_prefix(&self.prefix) else {
                return Err(self.failed("ListObjectsV2 answered a key outside the prefix asked for"));
            };
            // A key ending in '/' is a console's folder marker, not a backup.
            if name.is_empty() || name.ends_with('/') || !glob(&self.pattern, name) {
                continue;
            }
            let mut a = Artifact::new(name.to_string(), taken, self.retention.days);
            if let Some(day) = rules.expires(&key, taken) {
                a.expires = a.expires.max(day);
            }
            out.push(a);
        }
        out.sort_by(|a, b| a.name.cmp(&b.name));
        Ok(out)
    }
}

/// S3's error code from an `<Error>` document: letters and digits only (never the message).
pub(super) fn error_code(body: &[u8]) -> Option<String> {
    let root = xml::parse(body).ok()?;
    if root.name != "Error" {
        return None;
    }
    let code = root.text_of("Code")?.trim();
    (!code.is_empty() && code.len() <= 64 && code.bytes().all(|b| b.is_ascii_alphanumeric()))
        .then(|| code.to_string())
}

/// A transport error in words, without the URL `ureq` may quote.
fn shown(e: &ureq::Error) -> String {
    match e {
        ureq::Error::Io(io) => format!("connection error: {io}"),
        ureq::Error::Timeout(t) => format!("timed out ({t:?}); see timeout_ms"),
        ureq::Error::HostNotFound => "host not found".into(),
        ureq::Error::ConnectionFailed => "connection failed".into(),
        ureq::Error::Tls(why) => format!("TLS: {why}"),
        ureq::Error::Protocol(_) => "the answer is not valid HTTP/1.1".into(),
        ureq::Error::BodyExceedsLimit(_) => {
            format!("the answer is larger than {} MiB", MAX_BODY >> 20)
        }
        _ => "transport error".into(),
    }
}

impl Adapter for BackupS3 {
    fn describe(&self) -> Description {
        Description {
            kind: Kind::BackupS3,
            version: "1",
            capabilities: vec!["tenant", "subject", "memory", "backup"],
        }
    }

    /// Every scope: a backup of a covered target holds whatever that target held.
    fn check_scope(&self, _scope: &Scope) -> Result<Applicability, AdapterError> {
        Ok(Applicability::Applies)
    }

    /// One page of one key and the lifecycle rules: the endpoint answers, the key is valid,
    /// the bucket exists, and the key may list it and read its rules. A job that would block
    /// at its completion on any of these is refused before it starts.
    fn probe(&self) -> Result<(), AdapterError> {
        self.page(None, Some(1))?;
        self.lifecycle().map(|_| ())
    }

    fn place(&self) -> String {
        format!("s3://{}/{}{}", self.bucket, self.prefix, self.pattern)
    }

    /// Nothing to erase: an erasure cannot rewrite a backup.
    fn inventory(&self, _scope: &Scope) -> Result<Inventory, AdapterError> {
        Ok(Inventory::default())
    }

    fn erase_batch(&self, _scope: &Scope, _batch: &[(String, u64)]) -> Result<u64, AdapterError> {
        Ok(0)
    }

    fn verify(&self, _scope: &Scope, _frozen: &[(String, u64)]) -> Result<u64, AdapterError> {
        Ok(0)
    }

    fn backups(&self) -> Result<Option<Vec<Artifact>>, AdapterError> {
        self.list().map(Some)
    }

    fn covers(&self) -> &[String] {
        &self.retention.covers
    }
}
