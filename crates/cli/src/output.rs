//! Plain-text tables, JSON printing and the certificate's Markdown form.

use serde_json::Value;

/// `println!` for results on stdout, except that a reader that went away (`lethe jobs --json |
/// head -1`) ends the process quietly, with the shell's status for SIGPIPE (141), instead of a
/// panic and its backtrace.
macro_rules! outln {
    ($($arg:tt)*) => {{
        use std::io::Write as _;
        $crate::output::WROTE.store(true, std::sync::atomic::Ordering::Relaxed);
        if writeln!(std::io::stdout().lock(), $($arg)*).is_err() {
            std::process::exit(141);
        }
    }};
}

/// `print!`, as [`outln!`].
macro_rules! out {
    ($($arg:tt)*) => {{
        use std::io::Write as _;
        $crate::output::WROTE.store(true, std::sync::atomic::Ordering::Relaxed);
        if write!(std::io::stdout().lock(), $($arg)*).is_err() {
            std::process::exit(141);
        }
    }};
}

/// Whether anything was printed on stdout (by [`outln!`] or [`out!`]).
pub static WROTE: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);

/// Whether the command line asked for JSON (`--json` as an argument of its own; a value is
/// always given after its flag, so an identifier spelt `--json` is not taken for it).
pub fn json_asked() -> bool {
    std::env::args_os().skip(1).any(|a| a == "--json")
}

/// With `--json`, an error also goes to stdout as `{"error": {"exit_code", "message"}}`, so a
/// script reading stdout gets JSON whatever happened; not when a result was printed already
/// (stdout holds one JSON document). The message is the one on stderr, which names no
/// identifier.
pub fn json_error(code: i32, message: &str) {
    if json_asked() && !WROTE.load(std::sync::atomic::Ordering::Relaxed) {
        print_json(&serde_json::json!({"error": {"exit_code": code, "message": message}}));
    }
}

/// Prints pretty JSON on stdout.
pub fn print_json(v: &Value) {
    outln!("{}", serde_json::to_string_pretty(v).unwrap_or_default());
}

/// `hmac:0123456789ab…` for tables.
pub fn short_hash(h: &str) -> String {
    match h.get(..17) {
        Some(s) => format!("{s}…"),
        None => h.to_string(),
    }
}

/// A left-aligned text table.
pub struct Table {
    head: Vec<String>,
    rows: Vec<Vec<String>>,
}

impl Table {
    /// A table with these column heads.
    pub fn new(head: &[&str]) -> Self {
        Self {
            head: head.iter().map(|s| s.to_string()).collect(),
            rows: Vec::new(),
        }
    }

    /// Adds a row.
    pub fn row(&mut self, r: Vec<String>) {
        self.rows.push(r);
    }

    /// Prints it on stdout.
    pub fn print(&self) {
        let mut w: Vec<usize> = self.head.iter().map(|h| h.chars().count()).collect();
        for r in &self.rows {
            for (i, c) in r.iter().enumerate() {
                w[i] = w[i].max(c.chars().count());
            }
        }
        let line = |r: &[String]| {
            let cells: Vec<String> = r
                .iter()
                .enumerate()
                .map(|(i, c)| format!("{c:<width$}", width = w[i]))
                .collect();
            outln!("{}", cells.join("  ").trim_end());
        };
        line(&self.head);
        for r in &self.rows {
            line(r);
        }
    }
}

/// Parses `ed25519:<hex>` or `<hex>`.
pub fn parse_public_key(s: &str) -> Result<ed25519_dalek::VerifyingKey, String> {
    let hex = s.strip_prefix("ed25519:").unwrap_or(s);
    let mut b = [0u8; 32];
    hex::decode_to_slice(hex, &mut b)
        .map_err(|_| "--public-key must be ed25519:<64 hex>".to_string())?;
    let key = ed25519_dalek::VerifyingKey::from_bytes(&b)
        .map_err(|_| "--public-key is not a valid Ed25519 key".to_string())?;
    if key.is_weak() {
        return Err(
            "--public-key is a weak (small-order) Ed25519 key, under which a signature proves \
             nothing"
                .to_string(),
        );
    }
    Ok(key)
}

/// A DPO-readable summary of a signed certificate.
pub fn certificate_markdown(c: &Value) -> String {
    let s = |k: &str| c[k].as_str().unwrap_or("-").to_string();
    let mut out = format!(
        "# Erasure certificate {}\n\n| field | value |\n|---|---|\n| scope | {} |\n| scope hash | `{}` |\n| basis | {} |\n| policy version | {} |\n| requested | {} |\n| completed | {} |\n| deadline | {} |\n",
        s("job_id"), s("scope"), s("scope_hash"), s("basis"), s("policy_version"), s("requested_at"), s("completed_at"), s("deadline")
    );
    if let Some(e) = c["subject_epoch"].as_u64() {
        out.push_str(&format!("| subject epoch | {e} |\n"));
    }
    out.push_str(&format!(
        "| backup expiry | {} |\n",
        c["backup_expiry"].as_str().unwrap_or("none registered")
    ));
    if let Some(met) = c["backup_expiry_met"].as_str() {
        out.push_str(&format!(
            "| backups expired | {met}: every backup artifact taken before completion is gone (final certificate) |\n"
        ));
    }
    out.push_str("\n| target | status | count | class | adapter |\n|---|---|---|---|---|\n");
    if let Some(ts) = c["targets"].as_object() {
        for (name, t) in ts {
            let status = t["status"].as_str().unwrap_or("-");
            let mut status = match t["reason"].as_str() {
                Some(r) => format!("{status} ({r})"),
                None => status.to_string(),
            };
            match (t["expires"].as_str(), t["artifacts"].as_u64()) {
                (Some(e), Some(n)) if status == "PENDING_EXPIRY" => status.push_str(&format!(
                    " until {e}: {n} backup artifact(s) taken before completion"
                )),
                (Some(e), Some(_)) => status.push_str(&format!(" (its backups expired by {e})")),
                (Some(e), None) => status.push_str(&format!(" until {e}")),
                _ => {}
            }
            match (
                t["legacy"]["policy"].as_str(),
                t["legacy"]["count"].as_u64(),
            ) {
                (Some("flush"), Some(n)) if n > 0 => status.push_str(&format!(
                    "; {n} entries no index tied to anyone were erased with it (legacy = flush)"
                )),
                (Some("expire"), Some(n)) if n > 0 => status.push_str(&format!(
                    "; {n} entries no index tied to anyone are left to expire (legacy = expire)"
                )),
                _ => {}
            }
            out.push_str(&format!(
                "| {name} | {status} | {} | {} | {} {} |\n",
                t["count"],
                t["class"].as_str().unwrap_or("-"),
                t["adapter"].as_str().unwrap_or("-"),
                t["adapter_version"].as_str().unwrap_or("-")
            ));
        }
    }
    physical_markdown(c, &mut out);
    if let Some(assets) = c["exempt_assets"].as_object().filter(|a| !a.is_empty()) {
        out.push_str(
            "\n## Not covered\n\nThe deployment declared these stores and no target erases them, \
             so this certificate says nothing of what they hold:\n\n| asset | class | reason |\n|---|---|---|\n",
        );
        for (name, a) in assets {
            out.push_str(&format!(
                "| {name} | {} | {} |\n",
                a["class"].as_str().unwrap_or("-"),
                a["reason"].as_str().unwrap_or("-")
            ));
        }
    }
    out.push_str(&format!(
        "\nSigned by `{}`. Verify offline against the deployment's published public key: \
         `lethe certificate verify FILE --public-key KEY` (where the deployment's config and key \
         are, `--public-key` can be left out).\nThis certificate holds no identifier and no memory content.\n",
        s("signed_by")
    ));
    out
}

/// The certificate's `physical` lines, in words: for each target whose own files were read,
/// whether they still held erased data when it was issued, and the store's remedy.
fn physical_markdown(c: &Value, out: &mut String) {
    let Some(ts) = c["targets"].as_object() else {
        return;
    };
    let checked: Vec<_> = ts
        .iter()
        .filter(|(_, t)| t["physical"].is_object())
        .collect();
    if checked.is_empty() {
        return;
    }
    out.push_str(
        "\n## The stores' own files\n\nThe status above is the store's API's (erased and \
         verified through it); these targets' files were also read, read-only, for what was \
         erased:\n\n",
    );
    for (name, t) in checked {
        let p = &t["physical"];
        let at = p["checked_at"].as_str().unwrap_or("-");
        let line = match p["status"].as_str() {
            Some("CLEAN") => {
                format!("- {name}: its files held nothing of the erased data at {at}.\n")
            }
            Some("PENDING") => format!(
                "- {name}: its files still held erased data at {at} ({} found). Remedy: {}. \
                 `lethe verify --physical --job {}` checks again.\n",
                p["residue"],
                p["remedy"].as_str().unwrap_or("-"),
                c["job_id"].as_str().unwrap_or("JOB_ID")
            ),
            _ => format!(
                "- {name}: its files could not be checked at {at}: {}.\n",
                p["reason"].as_str().unwrap_or("-")
            ),
        };
        out.push_str(&line);
    }
}
