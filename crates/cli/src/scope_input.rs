//! A scope's identifiers as the user gives them: from the flags or from `--scope-file` (one
//! JSON object, never an array), checked, and warned about when one may print like another.

use std::path::Path;

use lethe_core::Scope;

use crate::args::ScopeArgs;
use crate::exit::{bad, Exit};

/// Whether an identifier may print like another one: spaces at an end, a format character
/// (zero-width, bidirectional mark), or a combining accent (a decomposed letter).
pub(crate) fn looks_like_another(id: &str) -> bool {
    id.trim() != id
        || id
            .chars()
            .any(|c| lethe_core::ident::is_invisible(c) || matches!(c, '\u{0300}'..='\u{036F}'))
}

/// An identifier quoted, with every character that would not print as itself (an invisible
/// one, a combining accent, a control character) as `\u{...}`: Rust's `{:?}` leaves some
/// invisible ones as they are (U+3164, U+2800; review).
pub(crate) fn escaped(id: &str) -> String {
    let mut out = String::from('"');
    for c in id.chars() {
        if c == '"' || c == '\\' {
            out.push('\\');
            out.push(c);
        } else if c.is_control()
            || lethe_core::ident::is_invisible(c)
            || matches!(c, '\u{0300}'..='\u{036F}')
        {
            out.push_str(&format!("\\u{{{:x}}}", c as u32));
        } else {
            out.push(c);
        }
    }
    out.push('"');
    out
}

/// Warns (stderr) when an identifier of the scope may print like another one: a scope matches
/// its identifiers exactly, so such a one usually finds nobody, and an erasure of it is
/// certified with zero counts (newcomer review: `--subject 'bo\u{200b}b'` was certified so).
pub(crate) fn warn_if_lookalike(s: &ScopeIds, what: &str) {
    for (field, id) in [
        ("tenant", Some(s.tenant.as_str())),
        ("subject", s.subject.as_deref()),
        ("memory", s.memory.as_deref()),
    ] {
        if id.is_some_and(looks_like_another) {
            eprintln!(
                "warning: {} has spaces at an end, an invisible character or a combining \
                 accent: {what} that exact identifier, not one that prints alike",
                s.origin.name(field)
            );
        }
    }
}

/// Where a scope's identifiers came from, to name them in messages as the user wrote them.
#[derive(Clone, Copy, Default, PartialEq, Eq)]
pub(crate) enum Origin {
    /// `--tenant`, `--subject`, ...
    #[default]
    Flags,
    /// The keys of `--scope-file`'s object.
    File,
}

impl Origin {
    /// How a field of the scope is named: `--subject`, or `the --scope-file's "subject"`.
    fn name(self, field: &str) -> String {
        match self {
            Origin::Flags => format!("--{field}"),
            Origin::File => format!("the --scope-file's \"{field}\""),
        }
    }
}

/// A scope's identifiers as given, from the flags or from `--scope-file`.
#[derive(serde::Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct ScopeIds {
    pub(crate) tenant: String,
    pub(crate) subject: Option<String>,
    pub(crate) memory: Option<String>,
    pub(crate) version: Option<String>,
    #[serde(skip)]
    pub(crate) origin: Origin,
}

/// The largest `--scope-file` read: four identifiers of at most a few KiB each.
const MAX_SCOPE_FILE: u64 = 64 * 1024;

/// The scope's identifiers: the flags' or `--scope-file`'s (whose errors quote nothing of it).
pub(crate) fn scope_ids(s: &ScopeArgs) -> Result<ScopeIds, Exit> {
    match &s.scope_file {
        Some(file) => read_scope_file(file),
        None => Ok(ScopeIds {
            tenant: s.tenant.clone().unwrap_or_default(),
            subject: s.subject.clone(),
            memory: s.memory.clone(),
            version: s.version.clone(),
            origin: Origin::Flags,
        }),
    }
}

/// A hold's tenant and subject: the flags' or `--scope-file`'s, which may not name a memory.
pub(crate) fn hold_ids(
    tenant: Option<String>,
    subject: Option<String>,
    file: Option<&Path>,
) -> Result<ScopeIds, Exit> {
    let Some(file) = file else {
        return Ok(ScopeIds {
            tenant: tenant.unwrap_or_default(),
            subject,
            memory: None,
            version: None,
            origin: Origin::Flags,
        });
    };
    let ids = read_scope_file(file)?;
    if ids.memory.is_some() || ids.version.is_some() {
        return Err(bad(
            "a hold covers a tenant or a subject: its --scope-file names no memory or version",
        ));
    }
    Ok(ids)
}

/// Reads a `--scope-file` (`-`: standard input); its errors quote nothing of it.
pub(crate) fn read_scope_file(file: &Path) -> Result<ScopeIds, Exit> {
    use std::io::Read;
    let shown = if file.as_os_str() == "-" {
        "standard input".to_string()
    } else {
        file.display().to_string()
    };
    let mut bytes = Vec::new();
    let read = if file.as_os_str() == "-" {
        std::io::stdin()
            .lock()
            .take(MAX_SCOPE_FILE + 1)
            .read_to_end(&mut bytes)
    } else {
        std::fs::File::open(file).and_then(|f| f.take(MAX_SCOPE_FILE + 1).read_to_end(&mut bytes))
    };
    read.map_err(|e| bad(format!("cannot read the --scope-file ({shown}): {e}")))?;
    if bytes.len() as u64 > MAX_SCOPE_FILE {
        return Err(bad(format!(
            "the --scope-file ({shown}) is over {} KiB; it holds one scope",
            MAX_SCOPE_FILE / 1024
        )));
    }
    // One JSON object, never an array: serde reads a struct from an array of its fields in
    // order, and `["acme","bob",null,null]` from another tool's export would name a person by
    // position (lethe_core::Object). A key the file made up is never named: it may be an
    // identifier.
    let mut ids: ScopeIds = serde_json::from_slice::<lethe_core::Object<ScopeIds>>(&bytes)
        .map(lethe_core::Object::into_inner)
        .map_err(|e| {
            bad(format!(
                "the --scope-file ({shown}) is not a scope: {}; write one JSON object, as \
                 {{\"tenant\": \"acme\", \"subject\": \"u-42\"}} (with \"memory\" and \
                 \"version\" for one memory)",
                lethe_core::redact_quoted(&e.to_string())
            ))
        })?;
    ids.origin = Origin::File;
    Ok(ids)
}

/// The scope `inventory`, `erase` and `verify` act on, from the flags or `--scope-file`, with
/// a warning for an identifier that prints like another (`what`: what the command does).
pub(crate) fn checked_scope(args: &ScopeArgs, what: &str) -> Result<Scope, Exit> {
    let ids = scope_ids(args)?;
    let scope = parse_scope(&ids)?;
    warn_if_lookalike(&ids, what);
    Ok(scope)
}

pub(crate) fn parse_scope(s: &ScopeIds) -> Result<Scope, Exit> {
    Scope::from_parts(
        &s.tenant,
        s.subject.as_deref(),
        s.memory.as_deref(),
        s.version.as_deref(),
    )
    .map_err(|e| {
        bad(match s.origin {
            Origin::Flags => format!("--{e}"),
            Origin::File => format!("the --scope-file's {e}"),
        })
    })
}

/// The longest line of a `--batch` file: one scope, as a `--scope-file` holds.
const MAX_BATCH_LINE: usize = MAX_SCOPE_FILE as usize;

/// Reads a `--batch` file (`-`: standard input): one scope a line, as `--scope-file` reads one
/// (blank lines skipped). Every line is parsed and checked before the caller touches anything;
/// a line that is not a scope, or a scope given twice, refuses the whole batch, naming the line
/// by its number, never its content. Returns each scope with its line number.
pub(crate) fn read_batch(file: &Path) -> Result<Vec<(usize, Scope)>, Exit> {
    use std::io::BufRead;
    let shown = if file.as_os_str() == "-" {
        "standard input".to_string()
    } else {
        file.display().to_string()
    };
    let reader: Box<dyn BufRead> = if file.as_os_str() == "-" {
        Box::new(std::io::stdin().lock())
    } else {
        Box::new(std::io::BufReader::new(std::fs::File::open(file).map_err(
            |e| bad(format!("cannot read the --batch file ({shown}): {e}")),
        )?))
    };
    let mut out = Vec::new();
    let mut seen = std::collections::HashMap::new();
    for (i, line) in reader.split(b'\n').enumerate() {
        let n = i + 1;
        let line = line.map_err(|e| bad(format!("cannot read the --batch file ({shown}): {e}")))?;
        if line.len() > MAX_BATCH_LINE {
            return Err(bad(format!(
                "line {n} of the --batch file ({shown}) is over {} KiB; a line holds one scope",
                MAX_BATCH_LINE / 1024
            )));
        }
        if line.iter().all(u8::is_ascii_whitespace) {
            continue;
        }
        let mut ids: ScopeIds = serde_json::from_slice::<lethe_core::Object<ScopeIds>>(&line)
            .map(lethe_core::Object::into_inner)
            .map_err(|e| {
                bad(format!(
                    "line {n} of the --batch file ({shown}) is not a scope: {}; write one JSON \
                     object a line, as {{\"tenant\": \"acme\", \"subject\": \"u-42\"}} (with \
                     \"memory\" and \"version\" for one memory); nothing was touched",
                    lethe_core::redact_quoted(&e.to_string())
                ))
            })?;
        ids.origin = Origin::File;
        let scope = parse_scope(&ids).map_err(|Exit(code, e)| {
            Exit(
                code,
                anyhow::anyhow!(
                    "line {n} of the --batch file ({shown}): {}; nothing was touched",
                    e.to_string().replace("the --scope-file's ", "its ")
                ),
            )
        })?;
        // The scope's canonical JSON as the key: held here only, never shown.
        let key = serde_json::to_string(&scope).unwrap_or_default();
        if let Some(first) = seen.insert(key, n) {
            return Err(bad(format!(
                "lines {first} and {n} of the --batch file ({shown}) are the same scope; give \
                 each once (nothing was touched)"
            )));
        }
        warn_if_lookalike(&ids, "the erasure covers");
        out.push((n, scope));
    }
    if out.is_empty() {
        return Err(bad(format!(
            "the --batch file ({shown}) holds no scope: write one JSON object a line"
        )));
    }
    Ok(out)
}
