//! LangGraph store namespaces, shared by the SQLite and PostgreSQL store adapters.
//!
//! LangGraph joins a namespace's labels with `.` into `store.prefix`. A target's template
//! (`["{tenant}", "{subject}"]`) says which labels name a scope. Matching is label-exact: the
//! prefix equals the scope's namespace, or starts with it followed by `.`. An identifier holding
//! `.` cannot be one label, so such a scope is refused before anything is touched.

use lethe_core::Scope;

use crate::{AdapterError, Locator};

/// One label of a namespace template.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Label {
    Tenant,
    Subject,
    Literal(String),
}

/// Parses a template: `{tenant}` then `{subject}`, once each, with literal labels around them.
pub(crate) fn parse_template(raw: &[String]) -> Result<Vec<Label>, String> {
    let mut template = Vec::new();
    for l in raw {
        template.push(match l.as_str() {
            "{tenant}" => Label::Tenant,
            "{subject}" => Label::Subject,
            lit if lit.is_empty() || lit.contains(['{', '}', '.']) => {
                return Err(format!(
                    "namespace label '{lit}' must be \"{{tenant}}\", \"{{subject}}\" or a literal without '{{', '}}' or '.'"
                ))
            }
            lit => Label::Literal(lit.to_string()),
        });
    }
    let pos = |want: &Label| template.iter().position(|l| l == want);
    match (pos(&Label::Tenant), pos(&Label::Subject)) {
        (Some(t), Some(s)) if t < s => {}
        _ => return Err("namespace must hold \"{tenant}\" and then \"{subject}\", e.g. [\"{tenant}\", \"{subject}\"]".into()),
    }
    if template
        .iter()
        .filter(|l| !matches!(l, Label::Literal(_)))
        .count()
        != 2
    {
        return Err("namespace must hold \"{tenant}\" and \"{subject}\" once each".into());
    }
    Ok(template)
}

/// The rows a scope names.
pub(crate) enum Selection {
    /// Every item whose prefix is `ns` or starts with `ns.`.
    Namespace { ns: String },
    /// One item, at one version (`None`: whatever version is current).
    Item {
        ns: String,
        key: String,
        version: Option<String>,
    },
}

impl Selection {
    /// Whether an item lies inside the selection (a check independent of any SQL).
    pub(crate) fn contains(&self, prefix: &str, key: &str) -> bool {
        match self {
            Selection::Namespace { ns } => {
                prefix == ns
                    || (prefix.starts_with(ns.as_str())
                        && prefix.as_bytes().get(ns.len()) == Some(&b'.'))
            }
            Selection::Item { ns, key: k, .. } => prefix == ns && key == k,
        }
    }

    /// The version a memory scope is frozen at.
    pub(crate) fn version(&self) -> Option<&str> {
        match self {
            Selection::Item { version, .. } => version.as_deref(),
            Selection::Namespace { .. } => None,
        }
    }
}

fn label(target: &str, id: &str, what: &str) -> Result<String, AdapterError> {
    if id.contains('.') {
        return Err(AdapterError::Inexpressible {
            target: target.to_string(),
            why: format!("the {what} contains '.', which LangGraph uses to join namespace labels, so it cannot be one label"),
        });
    }
    Ok(id.to_string())
}

/// The selection a scope makes under a template. A memory id is `label/.../key`.
pub(crate) fn selection(
    target: &str,
    template: &[Label],
    scope: &Scope,
) -> Result<Selection, AdapterError> {
    let (tenant, subject) = (scope.tenant().as_str(), scope.subject().map(|s| s.as_str()));
    let mut labels = Vec::new();
    for l in template {
        match l {
            Label::Tenant => labels.push(label(target, tenant, "tenant")?),
            Label::Subject => match subject {
                Some(s) => labels.push(label(target, s, "subject")?),
                // A tenant scope is the template up to the subject's label.
                None => break,
            },
            Label::Literal(s) => labels.push(s.clone()),
        }
    }
    let mut ns = labels.join(".");
    Ok(match scope {
        Scope::Memory {
            memory, version, ..
        } => {
            let mut parts: Vec<&str> = memory.as_str().split('/').collect();
            let key = parts.pop().unwrap_or_default().to_string();
            if key.is_empty() || parts.iter().any(|p| p.is_empty()) {
                return Err(AdapterError::Inexpressible {
                    target: target.to_string(),
                    why: "the memory id must be `label/.../key` with no empty part".into(),
                });
            }
            for p in parts {
                ns.push('.');
                ns.push_str(&label(target, p, "memory id's namespace label")?);
            }
            Selection::Item {
                ns,
                key,
                version: version.as_ref().map(|v| v.as_str().to_string()),
            }
        }
        _ => Selection::Namespace { ns },
    })
}

/// For a memory scope, the other items its id could name: `a/b/c` is read as labels `a`, `b`
/// and key `c`, but a key may itself hold `/` (key `b/c` under label `a`, or key `a/b/c`). A
/// store that holds one of these cannot tell which one the id means: its adapter refuses the
/// scope (exit 2) rather than erase one and certify the other gone.
pub(crate) fn other_readings(
    target: &str,
    template: &[Label],
    scope: &Scope,
) -> Result<Vec<(String, String)>, AdapterError> {
    let Scope::Memory { memory, .. } = scope else {
        return Ok(Vec::new());
    };
    let Selection::Namespace { ns: base } = selection(
        target,
        template,
        &Scope::Subject {
            tenant: scope.tenant().clone(),
            subject: scope
                .subject()
                .cloned()
                .expect("a memory scope names its subject"),
        },
    )?
    else {
        return Ok(Vec::new());
    };
    let parts: Vec<&str> = memory.as_str().split('/').collect();
    // Labels taken: 0 ..= n-2; n-1 labels (the last part as key) is the reading used.
    Ok((0..parts.len().saturating_sub(1))
        .filter(|&i| parts[..i].iter().all(|p| !p.is_empty() && !p.contains('.')))
        .map(|i| {
            let ns = std::iter::once(base.as_str())
                .chain(parts[..i].iter().copied())
                .collect::<Vec<_>>()
                .join(".");
            (ns, parts[i..].join("/"))
        })
        .collect())
}

/// The error for a memory id that names more than one item.
pub(crate) fn ambiguous(target: &str) -> AdapterError {
    AdapterError::Inexpressible {
        target: target.to_string(),
        why: "the memory id names more than one item (a key holds `/`): this layout cannot \
              tell them apart, so nothing is erased; erase the subject instead"
            .into(),
    }
}

/// An item's locator: the JSON array `[prefix, key]`.
pub(crate) fn locator(prefix: &str, key: &str) -> String {
    serde_json::to_string(&[prefix, key]).expect("strings serialize")
}

/// Reads a locator back.
pub(crate) fn parse_locator(target: &str, loc: &str) -> Result<(String, String), AdapterError> {
    serde_json::from_str(loc).map_err(|_| AdapterError::Failed {
        target: target.to_string(),
        why: "unreadable locator in the frozen inventory".into(),
    })
}

/// The frozen locators an erase may touch, each checked to lie inside the selection.
pub(crate) fn checked_items(
    target: &str,
    sel: &Selection,
    batch: &[Locator],
) -> Result<Vec<(String, String)>, AdapterError> {
    batch
        .iter()
        .map(|(loc, _)| {
            let (p, k) = parse_locator(target, loc)?;
            if !sel.contains(&p, &k) {
                return Err(AdapterError::Failed {
                    target: target.to_string(),
                    why: "a frozen locator lies outside the scope".into(),
                });
            }
            Ok((p, k))
        })
        .collect()
}
