//! The `backup-s3` target on a real S3-compatible server: s3s-fs (`scripts/s3 start`,
//! LETHE_S3_URL; the test key's files LETHE_S3_ACCESS_KEY_FILE and LETHE_S3_SECRET_KEY_FILE;
//! its root folder LETHE_S3_DATA, where a bucket is a folder and an object a file). Each test
//! makes its own bucket and uploads its objects by signed `PUT`s; an object's age is its file's
//! modification time, which s3s-fs answers as `LastModified`.

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, SystemTime};

use time::OffsetDateTime;

use crate::{Adapter, AdapterError};

use super::adapter::Answer;
use super::{BackupS3, Config};

static N: AtomicUsize = AtomicUsize::new(0);

const DAY: u64 = 86_400;

fn env(name: &str, default: &str) -> String {
    std::env::var(name).unwrap_or_else(|_| default.into())
}

fn url() -> String {
    env("LETHE_S3_URL", "http://127.0.0.1:8014")
}

fn data() -> PathBuf {
    env("LETHE_S3_DATA", "/var/tmp/lethe-s3/data").into()
}

fn key_files() -> (String, String) {
    (
        env("LETHE_S3_ACCESS_KEY_FILE", "/var/tmp/lethe-s3/access-key-id"),
        env("LETHE_S3_SECRET_KEY_FILE", "/var/tmp/lethe-s3/secret-access-key"),
    )
}

/// A target on `bucket` with `lines` over the defaults (prefix `nightly/`, 35 days).
fn target(bucket: &str, lines: &str) -> BackupS3 {
    target_at(&url(), bucket, lines)
}

/// The same on the server at `endpoint`.
fn target_at(endpoint: &str, bucket: &str, lines: &str) -> BackupS3 {
    let (ak, sk) = key_files();
    let mut t: toml::Table = toml::from_str(&format!(
        "endpoint = {endpoint:?}\nbucket = {bucket:?}\nprefix = \"nightly/\"\nretention_days = 35\n\
         covers = [\"checkpoints\"]\naccess_key_id_file = {ak:?}\nsecret_access_key_file = {sk:?}\n\
         timeout_ms = 5000\n"
    ))
    .unwrap();
    t.extend(toml::from_str::<toml::Table>(lines).unwrap());
    Config::parse(t, Path::new("."))
        .unwrap_or_else(|e| panic!("{e} (scripts/s3 start; LETHE_S3_*)"))
        .build("nightly")
}

/// A bucket of this test's own, made by a signed `PUT /<bucket>`; its folder is removed when
/// the test ends.
struct Bucket(String);

impl std::ops::Deref for Bucket {
    type Target = str;
    fn deref(&self) -> &str {
        &self.0
    }
}

impl Drop for Bucket {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(data().join(&self.0));
    }
}

fn bucket() -> Bucket {
    let b = format!(
        "lethe-t{}-{}",
        std::process::id(),
        N.fetch_add(1, Ordering::Relaxed)
    );
    let t = target(&b, "");
    let a = t
        .send("CreateBucket", "PUT", &t.path(None), "", b"")
        .expect("s3s-fs answers (scripts/s3 start; LETHE_S3_URL)");
    assert_eq!(a.status, 200, "{}", String::from_utf8_lossy(&a.body));
    Bucket(b)
}

/// Uploads `key` by a signed `PUT` and dates it `days_ago` days back (its file's time).
fn put(t: &BackupS3, bucket: &str, key: &str, days_ago: u64) -> OffsetDateTime {
    let a = t
        .send("PutObject", "PUT", &t.path(Some(key)), "", b"a dump's bytes")
        .unwrap();
    assert_eq!(a.status, 200, "{key}: {}", String::from_utf8_lossy(&a.body));
    // A file's time is the system's: what the server reads back as LastModified.
    #[allow(clippy::disallowed_methods)]
    let when = SystemTime::now() - Duration::from_secs(days_ago * DAY);
    std::fs::File::options()
        .write(true)
        .open(data().join(bucket).join(key))
        .unwrap()
        .set_modified(when)
        .unwrap();
    OffsetDateTime::from(when)
}

fn delete(t: &BackupS3, key: &str) {
    let a = t
        .send("DeleteObject", "DELETE", &t.path(Some(key)), "", b"")
        .unwrap();
    assert_eq!(a.status, 204, "{}", String::from_utf8_lossy(&a.body));
}

#[test]
fn a_listing_spans_pages_and_keeps_to_the_prefix_and_pattern() {
    let b = bucket();
    let mut t = target(&b, "pattern = \"*.dump\"");
    let mut want = Vec::new();
    for i in 1..=7 {
        let name = format!("2026-12-0{i}.dump");
        let taken = put(&t, &b, &format!("nightly/{name}"), 10 - i);
        want.push((name, taken));
    }
    // Characters the signature and the XML must carry exactly: a space, '&', '+', '<', 'é'.
    let odd = "a b&c+<é>.dump".to_string();
    let taken = put(&t, &b, &format!("nightly/{odd}"), 1);
    want.push((odd, taken));
    // Not artifacts: another pattern, a key beside the prefix, another prefix.
    put(&t, &b, "nightly/notes.txt", 1);
    put(&t, &b, "nightlyX.dump", 1);
    put(&t, &b, "weekly/2026-12-01.dump", 1);

    // Two keys a page: five pages, each after the last one's token.
    t.page = Some(2);
    let got = t.backups().unwrap().unwrap();
    let names: Vec<&str> = got.iter().map(|a| a.name.as_str()).collect();
    let wanted: Vec<&str> = want.iter().map(|(n, _)| n.as_str()).collect();
    assert_eq!(names, wanted);
    for (a, (_, taken)) in got.iter().zip(&want) {
        // LastModified carries milliseconds at most.
        assert_eq!(a.taken_at.unix_timestamp(), taken.unix_timestamp(), "{}", a.name);
        assert_eq!(a.expires, (*taken + time::Duration::days(35)).date(), "{}", a.name);
    }
    // One page of everything gives the same.
    t.page = None;
    assert_eq!(t.backups().unwrap().unwrap(), got);
    // Without a pattern the notes are an artifact too; another prefix lists its own keys.
    let all = target(&b, "").backups().unwrap().unwrap();
    assert_eq!(all.len(), 9);
    let weekly = target(&b, "prefix = \"weekly/\"").backups().unwrap().unwrap();
    assert_eq!(weekly.len(), 1);
    assert_eq!(weekly[0].name, "2026-12-01.dump");
    // No prefix: the whole bucket, names the whole keys.
    let whole = target(&b, "prefix = \"\"\npattern = \"*.dump\"").backups().unwrap().unwrap();
    assert_eq!(whole.len(), 10);
    assert!(whole.iter().any(|a| a.name == "nightlyX.dump"));
    assert!(whole.iter().any(|a| a.name == "weekly/2026-12-01.dump"));
    assert_eq!(t.covers(), ["checkpoints".to_string()]);

    // Deleted objects are gone from the next listing.
    delete(&t, "nightly/2026-12-01.dump");
    delete(&t, &format!("nightly/{}", want[7].0));
    let left = t.backups().unwrap().unwrap();
    assert_eq!(left.len(), 6);
    assert!(left.iter().all(|a| a.name != "2026-12-01.dump"));
}

#[test]
fn a_server_without_lifecycle_rules_leaves_the_retention_alone() {
    let b = bucket();
    let t = target(&b, "");
    // s3s-fs does not implement GetBucketLifecycleConfiguration: 501 NotImplemented.
    let a = t
        .send("GetBucketLifecycleConfiguration", "GET", &t.path(None), "lifecycle=", b"")
        .unwrap();
    assert_eq!(a.status, 501, "{}", String::from_utf8_lossy(&a.body));
    assert_eq!(super::adapter::error_code(&a.body).as_deref(), Some("NotImplemented"));
    let taken = put(&t, &b, "nightly/a.dump", 3);
    let got = t.backups().unwrap().unwrap();
    assert_eq!(got.len(), 1);
    assert_eq!(got[0].expires, (taken + time::Duration::days(35)).date());
    t.probe().unwrap();
}

/// The rules a test's bucket gets: its artifacts' prefix kept 90 days (and a disabled rule
/// that would expire them in one), another prefix 10 days.
const RULES: &str = r#"<LifecycleConfiguration xmlns="http://s3.amazonaws.com/doc/2006-03-01/">
  <Rule><ID>nightly</ID><Filter><Prefix>nightly/</Prefix></Filter><Status>Enabled</Status>
    <Expiration><Days>90</Days></Expiration></Rule>
  <Rule><ID>off</ID><Filter><Prefix>nightly/</Prefix></Filter><Status>Disabled</Status>
    <Expiration><Days>1</Days></Expiration></Rule>
  <Rule><ID>weekly</ID><Filter><Prefix>weekly/</Prefix></Filter><Status>Enabled</Status>
    <Expiration><Days>10</Days></Expiration></Rule>
</LifecycleConfiguration>"#;

/// s3s-fs keeps no lifecycle rules: these tests run on moto's S3 server (`scripts/s3
/// moto-start`, LETHE_S3_MOTO_URL), an emulator of AWS's API that stores them and answers
/// `GetBucketLifecycleConfiguration` as AWS documents it.
#[test]
fn the_bucket_s_lifecycle_rule_extends_an_artifact_s_expiry_only_when_later() {
    let moto = env("LETHE_S3_MOTO_URL", "http://127.0.0.1:8015");
    let b = format!(
        "lethe-lc{}-{}",
        std::process::id(),
        N.fetch_add(1, Ordering::Relaxed)
    );
    let t = target_at(&moto, &b, "");
    let ok = |a: Answer, what: &str| {
        assert_eq!(a.status, 200, "{what}: {}", String::from_utf8_lossy(&a.body));
    };
    ok(
        t.send("CreateBucket", "PUT", &t.path(None), "", b"")
            .expect("moto answers (scripts/s3 moto-start; LETHE_S3_MOTO_URL)"),
        "CreateBucket",
    );
    ok(
        t.send("PutObject", "PUT", &t.path(Some("nightly/a.dump")), "", b"x")
            .unwrap(),
        "PutObject",
    );
    // No rules yet: 404 NoSuchLifecycleConfiguration, and the retention alone.
    let a = t
        .send("GetBucketLifecycleConfiguration", "GET", &t.path(None), "lifecycle=", b"")
        .unwrap();
    assert_eq!(a.status, 404);
    assert_eq!(
        super::adapter::error_code(&a.body).as_deref(),
        Some("NoSuchLifecycleConfiguration")
    );
    let got = t.backups().unwrap().unwrap();
    assert_eq!(got.len(), 1);
    let taken = got[0].taken_at;
    assert_eq!(got[0].expires, (taken + time::Duration::days(35)).date());

    ok(
        t.send(
            "PutBucketLifecycleConfiguration",
            "PUT",
            &t.path(None),
            "lifecycle=",
            RULES.as_bytes(),
        )
        .unwrap(),
        "PutBucketLifecycleConfiguration",
    );
    // 90 days, rounded up to the next midnight UTC: later than 35 days, so it stands.
    let got = t.backups().unwrap().unwrap();
    let at = taken + time::Duration::days(90);
    let rule_day = match at.time() == time::Time::MIDNIGHT {
        true => at.date(),
        false => at.date().next_day().unwrap(),
    };
    assert_eq!(got[0].expires, rule_day);
    // A retention longer than the rule keeps its own, later, day.
    let long = target_at(&moto, &b, "retention_days = 120");
    assert_eq!(
        long.backups().unwrap().unwrap()[0].expires,
        (taken + time::Duration::days(120)).date()
    );
    // Under a prefix whose rule is shorter than the retention: the retention.
    ok(
        t.send("PutObject", "PUT", &t.path(Some("weekly/b.dump")), "", b"x")
            .unwrap(),
        "PutObject",
    );
    let weekly = target_at(&moto, &b, "prefix = \"weekly/\"");
    let w = &weekly.backups().unwrap().unwrap()[0];
    assert_eq!(w.expires, (w.taken_at + time::Duration::days(35)).date());
}

#[test]
fn wrong_keys_and_a_missing_bucket_fail_with_the_s3_error_code() {
    let b = bucket();
    let dir = tempfile::tempdir().unwrap();
    let wrong = dir.path().join("wrong-secret");
    std::fs::write(&wrong, "not-the-secret-at-all\n").unwrap();
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(&wrong, std::fs::Permissions::from_mode(0o600)).unwrap();
    let t = target(
        &b,
        &format!("secret_access_key_file = {:?}", wrong.display().to_string()),
    );
    for e in [t.probe().unwrap_err(), t.backups().unwrap_err()] {
        assert_eq!(e.code(), "failed", "{e}");
        assert!(!e.is_retryable());
        let m = e.to_string();
        assert!(
            m.contains("target nightly") && m.contains("HTTP 403 (SignatureDoesNotMatch)"),
            "{m}"
        );
        assert!(m.contains("secret_access_key_file"), "{m}");
        assert!(!m.contains("not-the-secret") && !m.contains(&*b), "{m}");
    }
    let wrong_id = dir.path().join("wrong-id");
    std::fs::write(&wrong_id, "nobody-s-key\n").unwrap();
    std::fs::set_permissions(&wrong_id, std::fs::Permissions::from_mode(0o600)).unwrap();
    let t = target(
        &b,
        &format!("access_key_id_file = {:?}", wrong_id.display().to_string()),
    );
    let e = t.probe().unwrap_err();
    assert_eq!(e.code(), "failed", "{e}");
    assert!(e.to_string().contains("HTTP 403 (NotSignedUp)"), "{e}");
    assert!(e.to_string().contains("access_key_id_file"), "{e}");

    let t = target("lethe-no-such-bucket", "");
    let e = t.backups().unwrap_err();
    assert_eq!(e.code(), "failed", "{e}");
    assert!(e.to_string().contains("HTTP 404 (NoSuchBucket)"), "{e}");
}

#[test]
fn an_endpoint_that_does_not_answer_is_unavailable() {
    // A port nothing listens on: bound, then closed.
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let t = target(
        "lethe-any",
        &format!("endpoint = \"http://127.0.0.1:{port}\""),
    );
    for e in [t.probe().unwrap_err(), t.backups().unwrap_err()] {
        assert!(e.is_retryable(), "{e}");
        assert!(matches!(e, AdapterError::Unavailable { .. }), "{e}");
        assert!(e.to_string().contains("target nightly is unavailable"), "{e}");
        assert!(!e.to_string().contains("127.0.0.1"), "no URL in messages: {e}");
    }
}

#[test]
fn busy_answers_are_unavailable_and_refusals_failed_without_their_message() {
    let t = target("lethe-any", "");
    let answer = |status, code: &str| Answer {
        status,
        body: format!(
            "<?xml version=\"1.0\"?><Error><Code>{code}</Code><Message>key nightly/alice.dump &amp; more</Message></Error>"
        )
        .into_bytes(),
    };
    for (status, code) in [(503, "SlowDown"), (500, "InternalError"), (429, "TooManyRequests")] {
        let e = t.refused("ListObjectsV2", &answer(status, code));
        assert!(e.is_retryable(), "{e}");
        assert!(e.to_string().contains(&format!("HTTP {status} ({code})")), "{e}");
        assert!(!e.to_string().contains("alice"), "{e}");
    }
    for (status, code, says) in [
        (403, "AccessDenied", "access_key_id_file"),
        (404, "NoSuchBucket", "bucket"),
        (400, "AuthorizationHeaderMalformed", "region"),
        (403, "RequestTimeTooSkewed", "clock"),
    ] {
        let e = t.refused("ListObjectsV2", &answer(status, code));
        assert_eq!(e.code(), "failed", "{e}");
        let m = e.to_string();
        assert!(m.contains(&format!("HTTP {status} ({code})")) && m.contains(says), "{m}");
        assert!(!m.contains("alice"), "{m}");
    }
    // A code that is not a plain word is not shown either.
    let e = t.refused("ListObjectsV2", &answer(403, "x y<alice>"));
    assert!(e.to_string().contains("no S3 error code") && !e.to_string().contains("alice"));
    let e = t.refused("ListObjectsV2", &Answer { status: 502, body: b"<html>bad gateway</html>".to_vec() });
    assert!(e.is_retryable(), "{e}");
}
