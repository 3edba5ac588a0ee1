//! AWS Signature Version 4 for S3 requests, header-based (`Authorization`), written here: the
//! three calls this kind makes do not justify an SDK, and a signer is a page of HMACs.
//!
//! The canonical request is the method, the path with each segment URI-encoded once (S3 does
//! not encode twice), the query's parameters encoded and sorted, the signed headers (lowercase,
//! sorted, values trimmed), their names, and the payload's SHA-256. The caller sends exactly
//! the path and query it signed.

use hmac::{Hmac, Mac};
use sha2::{Digest, Sha256};

/// The SHA-256 of an empty payload, in hex: what a `GET` signs.
#[cfg(test)]
const EMPTY_SHA256: &str =
    "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855";

/// An access key: its id and secret, read from files. `Debug` shows neither.
#[derive(Clone)]
pub(crate) struct Credentials {
    pub(crate) access_key_id: String,
    pub(crate) secret_access_key: String,
}

impl std::fmt::Debug for Credentials {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Credentials(from access_key_id_file, secret_access_key_file)")
    }
}

/// One request to sign.
pub(crate) struct Request<'a> {
    pub(crate) method: &'a str,
    /// The path as sent: segments already encoded by [`uri_encode`].
    pub(crate) path: &'a str,
    /// The query as sent: [`canonical_query`]'s output.
    pub(crate) query: &'a str,
    /// Every header to sign, `host`, `x-amz-content-sha256` and `x-amz-date` among them.
    pub(crate) headers: &'a [(&'a str, &'a str)],
    /// The payload's SHA-256 in hex (also the `x-amz-content-sha256` header's value).
    pub(crate) payload_hash: &'a str,
}

/// `Authorization` for `request` at `amz_date` (`YYYYMMDDTHHMMSSZ`) in `region`.
pub(crate) fn authorization(
    creds: &Credentials,
    region: &str,
    amz_date: &str,
    request: &Request<'_>,
) -> String {
    let mut headers: Vec<(String, String)> = request
        .headers
        .iter()
        .map(|(k, v)| (k.to_ascii_lowercase(), v.trim().to_string()))
        .collect();
    headers.sort();
    let signed: Vec<&str> = headers.iter().map(|(k, _)| k.as_str()).collect();
    let signed = signed.join(";");
    let mut canonical = format!(
        "{}\n{}\n{}\n",
        request.method, request.path, request.query
    );
    for (k, v) in &headers {
        canonical.push_str(&format!("{k}:{v}\n"));
    }
    canonical.push_str(&format!("\n{signed}\n{}", request.payload_hash));
    let day = &amz_date[..8];
    let scope = format!("{day}/{region}/s3/aws4_request");
    let to_sign = format!(
        "AWS4-HMAC-SHA256\n{amz_date}\n{scope}\n{}",
        hex::encode(Sha256::digest(canonical.as_bytes()))
    );
    let mut key = hmac(
        format!("AWS4{}", creds.secret_access_key).as_bytes(),
        day.as_bytes(),
    );
    for part in [region, "s3", "aws4_request"] {
        key = hmac(&key, part.as_bytes());
    }
    let signature = hex::encode(hmac(&key, to_sign.as_bytes()));
    format!(
        "AWS4-HMAC-SHA256 Credential={}/{scope},SignedHeaders={signed},Signature={signature}",
        creds.access_key_id
    )
}

fn hmac(key: &[u8], data: &[u8]) -> Vec<u8> {
    let mut m = Hmac::<Sha256>::new_from_slice(key).expect("HMAC takes a key of any length");
    m.update(data);
    m.finalize().into_bytes().to_vec()
}

/// SigV4's URI encoding: every byte but `A-Z a-z 0-9 - . _ ~` as `%XX` (uppercase hex); `/`
/// kept only when `keep_slash` (an object key in a path).
pub(crate) fn uri_encode(s: &str, keep_slash: bool) -> String {
    let mut out = String::with_capacity(s.len());
    for b in s.bytes() {
        if b.is_ascii_alphanumeric() || matches!(b, b'-' | b'.' | b'_' | b'~') || (keep_slash && b == b'/')
        {
            out.push(b as char);
        } else {
            out.push_str(&format!("%{b:02X}"));
        }
    }
    out
}

/// A query string in canonical form: each name and value encoded, sorted by name then value,
/// a parameter without a value as `name=`.
pub(crate) fn canonical_query(params: &[(&str, &str)]) -> String {
    let mut pairs: Vec<(String, String)> = params
        .iter()
        .map(|(k, v)| (uri_encode(k, false), uri_encode(v, false)))
        .collect();
    pairs.sort();
    pairs
        .iter()
        .map(|(k, v)| format!("{k}={v}"))
        .collect::<Vec<_>>()
        .join("&")
}

/// `YYYYMMDDTHHMMSSZ`, the form `x-amz-date` and the credential scope take.
pub(crate) fn amz_date(t: time::OffsetDateTime) -> String {
    let t = t.to_offset(time::UtcOffset::UTC);
    format!(
        "{:04}{:02}{:02}T{:02}{:02}{:02}Z",
        t.year(),
        u8::from(t.month()),
        t.day(),
        t.hour(),
        t.minute(),
        t.second()
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    // The examples of Amazon S3's "Signature Calculations for the Authorization Header"
    // (Signature Version 4), whose signatures are published with them.
    const HOST: &str = "examplebucket.s3.amazonaws.com";
    const DATE: &str = "20130524T000000Z";

    fn creds() -> Credentials {
        Credentials {
            access_key_id: "AKIAIOSFODNN7EXAMPLE".into(),
            secret_access_key: "wJalrXUtnFEMI/K7MDENG/bPxRfiCYEXAMPLEKEY".into(),
        }
    }

    fn signature(query: &str, path: &str, extra: &[(&str, &str)]) -> String {
        let mut headers = vec![
            ("Host", HOST),
            ("x-amz-content-sha256", EMPTY_SHA256),
            ("x-amz-date", DATE),
        ];
        headers.extend_from_slice(extra);
        let auth = authorization(
            &creds(),
            "us-east-1",
            DATE,
            &Request {
                method: "GET",
                path,
                query,
                headers: &headers,
                payload_hash: EMPTY_SHA256,
            },
        );
        assert!(auth.starts_with(
            "AWS4-HMAC-SHA256 Credential=AKIAIOSFODNN7EXAMPLE/20130524/us-east-1/s3/aws4_request,SignedHeaders="
        ));
        auth.rsplit_once("Signature=").unwrap().1.to_string()
    }

    #[test]
    fn the_published_examples_sign_to_their_published_signatures() {
        // GET Bucket (List Objects), its parameters given out of order: the query is sorted.
        let q = canonical_query(&[("prefix", "J"), ("max-keys", "2")]);
        assert_eq!(q, "max-keys=2&prefix=J");
        assert_eq!(
            signature(&q, "/", &[]),
            "34b48302e7b5fa45bde8084f4b7868a86f0a534bc59db6670ed5711ef69dc6f7"
        );
        // GET Bucket lifecycle: a parameter without a value.
        assert_eq!(
            signature(&canonical_query(&[("lifecycle", "")]), "/", &[]),
            "fea454ca298b7da1c68078a5d1bdbfbbe0d65c699e0f91ac7a200a0136783543"
        );
        // GET Object with a Range header: another signed header, sorted among the others.
        assert_eq!(
            signature("", "/test.txt", &[("Range", "bytes=0-9")]),
            "f0e8bdb87c964420e857bd35b5d6ed310bd44f0170aba48dd91039c6036bdb41"
        );
    }

    #[test]
    fn encoding_keeps_only_the_unreserved_characters() {
        assert_eq!(uri_encode("a-b_c.d~e09", false), "a-b_c.d~e09");
        assert_eq!(uri_encode("a b/c+d=é&", false), "a%20b%2Fc%2Bd%3D%C3%A9%26");
        assert_eq!(uri_encode("nightly/a b.dump", true), "nightly/a%20b.dump");
        assert_eq!(
            canonical_query(&[("prefix", "x/y z"), ("list-type", "2"), ("continuation-token", "a=b+c")]),
            "continuation-token=a%3Db%2Bc&list-type=2&prefix=x%2Fy%20z"
        );
        assert_eq!(
            amz_date(time::macros::datetime!(2013-05-24 02:00 +02:00)),
            "20130524T000000Z"
        );
        assert!(!format!("{:?}", creds()).contains("EXAMPLE"));
    }
}
