//! Key layouts: templates such as `{tenant}:{subject}:*` turned into exact key prefixes and
//! glob patterns that never widen.
//!
//! A template is literal text with the placeholders `{tenant}`, `{subject}` and `{memory}` (any
//! other brace is literal, so a cluster hash tag is written `{{tenant}}:...`), optionally ending
//! in `*`. The rule that keeps scopes from sharing keys: an identifier must not contain the
//! first character of the literal that follows its placeholder. Under `{tenant}:{subject}:*`,
//! tenant `acme` with subject `eu:bob` and tenant `acme:eu` with subject `bob` would both own
//! `acme:eu:bob:...`, so an identifier with `:` is refused there; under `{{tenant}}:{subject}:*`
//! the tenant is followed by `}`, so `acme:eu` is fine as a tenant. Keys found by `SCAN MATCH`
//! are re-checked against the exact prefix before anything is unlinked.

/// One piece of a template.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Part {
    Lit(String),
    Tenant,
    Subject,
    Memory,
}

/// A parsed template.
#[derive(Debug, Clone)]
pub(crate) struct Template {
    parts: Vec<Part>,
    /// The template as written, for messages.
    text: String,
}

/// The identifiers a scope gives a template.
pub(crate) struct Values<'a> {
    pub(crate) tenant: &'a str,
    pub(crate) subject: Option<&'a str>,
    pub(crate) memory: Option<&'a str>,
}

impl Template {
    /// The template as written.
    pub(crate) fn text(&self) -> &str {
        &self.text
    }

    /// Parses a template; `allowed` lists the placeholders it may hold, `star` whether it must
    /// end in `*` (a pattern) or must not (an exact key).
    pub(crate) fn parse(
        text: &str,
        what: &str,
        star: bool,
        required: &[&str],
    ) -> Result<Self, String> {
        let mut parts = Vec::new();
        let body = if star {
            text.strip_suffix('*')
                .ok_or_else(|| format!("{what} must end in '*'"))?
        } else {
            text
        };
        if body.contains('*') || body.contains('?') || body.contains('[') {
            return Err(format!(
                "{what} may hold no glob character other than a final '*'"
            ));
        }
        let mut rest = body;
        while !rest.is_empty() {
            let (part, len) = if rest.starts_with("{tenant}") {
                (Part::Tenant, 8)
            } else if rest.starts_with("{subject}") {
                (Part::Subject, 9)
            } else if rest.starts_with("{memory}") {
                (Part::Memory, 8)
            } else {
                let c = rest.chars().next().expect("non-empty");
                match parts.last_mut() {
                    Some(Part::Lit(s)) => s.push(c),
                    _ => parts.push(Part::Lit(c.to_string())),
                }
                rest = &rest[c.len_utf8()..];
                continue;
            };
            if parts.contains(&part) {
                return Err(format!("{what} holds a placeholder twice"));
            }
            if matches!(
                parts.last(),
                Some(Part::Tenant | Part::Subject | Part::Memory)
            ) {
                return Err(format!(
                    "{what}: two placeholders must be separated by literal text"
                ));
            }
            parts.push(part);
            rest = &rest[len..];
        }
        for r in required {
            let want = match *r {
                "tenant" => Part::Tenant,
                "subject" => Part::Subject,
                _ => Part::Memory,
            };
            if !parts.contains(&want) {
                return Err(format!("{what} must hold {{{r}}}"));
            }
        }
        let pos = |p: &Part| parts.iter().position(|x| x == p);
        if let (Some(t), Some(s)) = (pos(&Part::Tenant), pos(&Part::Subject)) {
            if t > s {
                return Err(format!("{what}: {{tenant}} must come before {{subject}}"));
            }
        }
        if star
            && matches!(
                parts.last(),
                Some(Part::Tenant | Part::Subject | Part::Memory)
            )
        {
            return Err(format!(
                "{what}: a placeholder directly before '*' would match longer identifiers too (u1* matches u10); put a separator after it"
            ));
        }
        Ok(Template {
            parts,
            text: text.to_string(),
        })
    }

    /// The exact key (no `*`) or key prefix (with `*`) for these identifiers. With `tenant_only`,
    /// the prefix stops after the tenant's placeholder and the literal that follows it.
    /// Errors with what makes the scope inexpressible.
    pub(crate) fn expand(&self, v: &Values<'_>, tenant_only: bool) -> Result<String, String> {
        let mut out = String::new();
        let mut i = 0;
        while i < self.parts.len() {
            let (value, name) = match &self.parts[i] {
                Part::Lit(s) => {
                    out.push_str(s);
                    i += 1;
                    continue;
                }
                Part::Tenant => (Some(v.tenant), "tenant"),
                Part::Subject => (v.subject, "subject"),
                Part::Memory => (v.memory, "memory id"),
            };
            let value =
                value.ok_or_else(|| format!("the key layout {} needs a {name}", self.text))?;
            let next = match self.parts.get(i + 1) {
                Some(Part::Lit(s)) => s.chars().next(),
                _ => None,
            };
            if let Some(sep) = next {
                if value.contains(sep) {
                    return Err(format!(
                        "the {name} contains '{sep}', which the key layout {} puts right after it, so two scopes would share keys",
                        self.text
                    ));
                }
            }
            out.push_str(value);
            if tenant_only && self.parts[i] == Part::Tenant {
                if let Some(Part::Lit(s)) = self.parts.get(i + 1) {
                    out.push_str(s);
                }
                return Ok(out);
            }
            i += 1;
        }
        Ok(out)
    }
}

impl Template {
    /// The subject a key would be for this tenant under this template, read between the
    /// tenant's prefix (as `expand` gives it for the tenant only) and the literal after
    /// `{subject}`; `None` if the key is not so shaped. Not a check: the caller expands the
    /// subject again and compares.
    pub(crate) fn subject_in<'k>(&self, tenant: &str, key: &'k str) -> Option<&'k str> {
        let v = Values {
            tenant,
            subject: None,
            memory: None,
        };
        let prefix = self.expand(&v, true).ok()?;
        let at = self.parts.iter().position(|p| *p == Part::Subject)?;
        let suffix = match self.parts.get(at + 1) {
            Some(Part::Lit(s)) if at + 2 == self.parts.len() => s.as_str(),
            None => "",
            // Anything after the subject but one literal: not a layout this reads.
            _ => return None,
        };
        let subject = key.strip_prefix(&prefix)?.strip_suffix(suffix)?;
        (!subject.is_empty()).then_some(subject)
    }

    /// The literal text before the first placeholder ("idx:" for `idx:{tenant}:{subject}`).
    pub(crate) fn literal_prefix(&self) -> &str {
        match self.parts.first() {
            Some(Part::Lit(s)) => s,
            _ => "",
        }
    }
}

/// Whether some key could start with both prefixes.
pub(crate) fn prefixes_overlap(a: &str, b: &str) -> bool {
    a.starts_with(b) || b.starts_with(a)
}

/// Escapes glob metacharacters so each matches only itself in `SCAN MATCH`.
pub(crate) fn glob_escape(s: &str) -> String {
    let mut out = String::with_capacity(s.len() + 2);
    for c in s.chars() {
        if matches!(c, '*' | '?' | '[' | ']' | '\\' | '^' | '-') {
            out.push('\\');
        }
        out.push(c);
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn v<'a>(t: &'a str, s: Option<&'a str>) -> Values<'a> {
        Values {
            tenant: t,
            subject: s,
            memory: None,
        }
    }

    #[test]
    fn expands_exact_prefixes() {
        let t = Template::parse(
            "{tenant}:{subject}:*",
            "pattern",
            true,
            &["tenant", "subject"],
        )
        .unwrap();
        assert_eq!(
            t.expand(&v("acme", Some("alice")), false).unwrap(),
            "acme:alice:"
        );
        assert_eq!(t.expand(&v("acme", None), true).unwrap(), "acme:");
    }

    #[test]
    fn refuses_identifiers_holding_the_separator_unless_a_hash_tag_encloses_them() {
        let t = Template::parse(
            "{tenant}:{subject}:*",
            "pattern",
            true,
            &["tenant", "subject"],
        )
        .unwrap();
        let e = t.expand(&v("acme", Some("eu:bob")), false).unwrap_err();
        assert!(e.contains("':'") && !e.contains("eu:bob"), "{e}");
        assert!(t.expand(&v("acme:eu", Some("bob")), false).is_err());
        let tagged = Template::parse(
            "{{tenant}}:{subject}:*",
            "pattern",
            true,
            &["tenant", "subject"],
        )
        .unwrap();
        assert_eq!(
            tagged.expand(&v("acme:eu", Some("bob")), false).unwrap(),
            "{acme:eu}:bob:"
        );
        assert!(tagged.expand(&v("ac}me", Some("bob")), false).is_err());
    }

    #[test]
    fn refuses_templates_that_would_widen() {
        assert!(
            Template::parse("{tenant}:{subject}*", "p", true, &[]).is_err(),
            "u1* matches u10"
        );
        assert!(Template::parse("{tenant}{subject}:*", "p", true, &[]).is_err());
        assert!(Template::parse("{tenant}:*:{subject}:*", "p", true, &[]).is_err());
        assert!(Template::parse("{subject}:{tenant}:*", "p", true, &[]).is_err());
        assert!(
            Template::parse("{tenant}:{subject}:", "p", true, &[]).is_err(),
            "a pattern ends in *"
        );
        assert!(Template::parse("x:{subject}:*", "p", true, &["tenant"]).is_err());
    }

    #[test]
    fn reads_the_subject_of_an_index_key() {
        let t = Template::parse("idx:{{tenant}}:{subject}", "index", false, &[]).unwrap();
        assert_eq!(t.subject_in("acme", "idx:{acme}:alice"), Some("alice"));
        assert_eq!(t.subject_in("acme", "idx:{acme}:"), None);
        assert_eq!(t.subject_in("acme", "idx:{acmex}:alice"), None);
        let t = Template::parse("i:{tenant}:{subject}:set", "index", false, &[]).unwrap();
        assert_eq!(t.subject_in("acme", "i:acme:bob:set"), Some("bob"));
        assert_eq!(t.subject_in("acme", "i:acme:bob:sets"), None);
    }

    #[test]
    fn glob_metacharacters_match_only_themselves() {
        assert_eq!(glob_escape("a?i*c[e]\\"), "a\\?i\\*c\\[e\\]\\\\");
    }
}
