//! Config of a `langgraph-sqlite-store` target.

use std::path::{Path, PathBuf};

use crate::registry::{parse_table, resolve};

use super::adapter::{Label, Store};

#[derive(serde::Deserialize)]
#[serde(deny_unknown_fields)]
struct Raw {
    path: PathBuf,
    namespace: Vec<String>,
}

/// A validated config.
#[derive(Debug, Clone)]
pub struct Config {
    path: PathBuf,
    template: Vec<Label>,
}

impl Config {
    /// Parses and validates the kind-specific keys.
    pub fn parse(table: toml::Table, base: &Path) -> Result<Self, String> {
        let raw: Raw = parse_table(table)?;
        let mut template = Vec::new();
        for l in &raw.namespace {
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
            _ => {
                return Err(
                    "namespace must hold \"{tenant}\" and then \"{subject}\", e.g. [\"{tenant}\", \"{subject}\"]".into(),
                )
            }
        }
        if template
            .iter()
            .filter(|l| !matches!(l, Label::Literal(_)))
            .count()
            != 2
        {
            return Err("namespace must hold \"{tenant}\" and \"{subject}\" once each".into());
        }
        Ok(Self {
            path: resolve(base, &raw.path),
            template,
        })
    }

    /// Builds the adapter. Touches no file.
    pub fn build(self, name: &str) -> Store {
        Store::new(name, self.path, self.template)
    }
}
