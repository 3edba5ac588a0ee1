//! `backup-s3`: backup artifacts as objects in an S3 bucket (AWS S3 or an S3-compatible
//! server: MinIO, Garage, Ceph RGW, s3s-fs), under an optional key prefix, each object one
//! artifact.
//!
//! - **What it holds**: copies of the targets named in `covers`, as they stood when each
//!   object was written. An erasure cannot rewrite them: the target erases nothing and its
//!   inventory is empty; at completion the objects written before it make the target
//!   `PENDING_EXPIRY` (see [`crate::backup`]).
//! - **Reading**: `ListObjectsV2` (`GET /<bucket>?list-type=2&prefix=...`, path-style, paged by
//!   `continuation-token`), never an object's content. An artifact is an object whose key,
//!   after the prefix, matches `pattern`; its name is that part of the key, its time the
//!   object's `LastModified`. Keys ending in `/` (a console's folder markers) are not artifacts.
//! - **When an artifact expires**: `retention_days` after it was written, unless the bucket's
//!   lifecycle rules (`GetBucketLifecycleConfiguration`) can keep it longer: then the later
//!   day. Lethe never promises an earlier date than reality. A rule that applies to the key
//!   for sure bounds it (the earliest such rule's `Expiration`, `Days` rounded up to the next
//!   midnight UTC as S3 does, or its `Date`); with none, a rule that may apply (it also filters
//!   by tags or size) can keep it to that rule's day. A server without lifecycle rules (501
//!   `NotImplemented`) or a bucket without any (404 `NoSuchLifecycleConfiguration`): the
//!   retention alone. See [`lifecycle`]. Tested on s3s-fs (501) and, for stored rules, on
//!   moto's S3 server (an emulator of AWS's API; `scripts/s3 moto-start`).
//! - **Not read**: noncurrent versions of a versioned bucket (a deleted object's older
//!   versions stay until `NoncurrentVersionExpiration` removes them): `ListObjectsV2` lists
//!   current versions only, so such a bucket's copies outlive what this target reports.
//! - **Signing**: AWS Signature Version 4 ([`sigv4`]), with the key read from
//!   `access_key_id_file` and `secret_access_key_file` (never from the config itself). The
//!   `Host` header is the endpoint's `host[:port]`; the signature's time is this machine's clock.
//!
//! Errors: no answer (refused, dropped, timed out), 429 and 5xx (`SlowDown`,
//! `ServiceUnavailable`) are `unavailable`, so the job is BLOCKED and a resume tries again;
//! other answers (403 `AccessDenied`, `InvalidAccessKeyId`, `SignatureDoesNotMatch`, 404
//! `NoSuchBucket`) are `failed`. A message names the call, the status and S3's error code,
//! never the answer's message text, a key or the secret. No request is retried here: listing
//! is read-only and resuming the job repeats it.

mod adapter;
mod config;
mod lifecycle;
mod sigv4;
#[cfg(test)]
mod tests;
mod xml;

pub use adapter::BackupS3;
pub use config::Config;
