//! Messages from parsers, without the values they quote.

/// A parser's message without the values it quotes: serde quotes the offending value
/// (`` invalid type: integer `987654321` ``, `invalid type: string "mk-…"`), and a caller that
/// puts a numeric user id, a memory id or a URL with its password in the wrong place would
/// find it in its own error logs (`lethe serve`'s JSON bodies, the config file). What is left
/// names the field and what was expected. The API's own words stay: its field names
/// (`` missing field `tenant` ``, `` expected one of `tenant`, `subject` ``) and the expected
/// content type, which is what a caller needs to fix the request or the file. A key the caller
/// made up is never named, however field-like (`` unknown field `…`, expected one of … ``): a
/// body `{"alice": 1}` or a query `?Alice-Smith=x` is built from an identifier. One rule for
/// the CLI, the config and the server.
pub fn redact_quoted(message: &str) -> String {
    // The words serde puts before a value it quotes.
    const VALUE: [&str; 9] = [
        "integer ",
        "floating point ",
        "boolean ",
        "char ",
        "string ",
        "variant ",
        "value ",
        "sequence ",
        "map ",
    ];
    let mut out = String::with_capacity(message.len());
    let mut rest = message;
    while let Some(i) = rest.find(['`', '"']) {
        let q = rest[i..].chars().next().expect("found");
        out.push_str(&rest[..i]);
        let after = &rest[i + 1..];
        // serde writes a string value with its escapes (`"ab\"cd"`): the value ends at the
        // first quote that no backslash escapes (review: the rest of such a value was shown).
        let mut escaped = false;
        let close = after.char_indices().find(|&(_, c)| {
            if escaped {
                escaped = false;
                return false;
            }
            if c == '\\' && q == '"' {
                escaped = true;
                return false;
            }
            c == q
        });
        let Some(end) = close.map(|(j, _)| j) else {
            out.push(q);
            out.push('…');
            return out;
        };
        let quoted = &after[..end];
        // A key the caller made up is a value too: it may be built from an identifier (serde's
        // unknown field, TOML's duplicate or dotted key).
        let is_value = q == '"'
            || VALUE.iter().any(|w| out.ends_with(w))
            || ["unknown field ", "duplicate key ", "dotted key "]
                .iter()
                .any(|w| out.ends_with(w));
        out.push(q);
        out.push_str(if is_value { "…" } else { quoted });
        out.push(q);
        rest = &after[end + 1..];
    }
    out.push_str(rest);
    out
}

/// Where a deserializer failed, and why, for a message: the path to the fault (`reads[0]`,
/// `registry.table`; empty at the top) without the last key when that key is the fault (an
/// unknown field: a key the caller or the file made up may be built from an identifier), and
/// the reason with its quoted values redacted ([`redact_quoted`]).
pub fn fault(path: &serde_path_to_error::Path, reason: &str) -> (String, String) {
    use serde_path_to_error::Segment;
    let mut segments: Vec<String> = path
        .iter()
        .map(|s| match s {
            Segment::Seq { index } => format!("[{index}]"),
            Segment::Map { key } => key.clone(),
            Segment::Enum { variant } => variant.clone(),
            Segment::Unknown => "?".into(),
        })
        .collect();
    if reason.starts_with("unknown field") {
        segments.pop();
    }
    let path = segments.iter().fold(String::new(), |p, s| {
        if p.is_empty() || s.starts_with('[') {
            p + s
        } else {
            p + "." + s
        }
    });
    (path, redact_quoted(reason))
}

#[cfg(test)]
mod tests {
    use super::redact_quoted;

    #[test]
    fn a_value_with_an_escaped_quote_is_hidden_whole() {
        let m = r#"reads: invalid type: string "zz-secret\"-after-quote", expected a sequence at line 1"#;
        let r = redact_quoted(m);
        assert!(
            !r.contains("zz-secret") && !r.contains("after-quote"),
            "{r}"
        );
        assert!(r.ends_with(", expected a sequence at line 1"), "{r}");
        let m = r#"invalid type: string "a\\", expected u32"#;
        assert_eq!(
            redact_quoted(m),
            r#"invalid type: string "…", expected u32"#
        );
    }

    #[test]
    fn an_unknown_field_is_hidden_and_the_api_words_kept() {
        let r =
            redact_quoted("unknown field `zz-secret-field`, expected one of `tenant`, `subject`");
        assert_eq!(r, "unknown field `…`, expected one of `tenant`, `subject`");
        assert_eq!(
            redact_quoted("duplicate key `alice` in table `target`"),
            "duplicate key `…` in table `target`"
        );
        // However field-like: `alice` is a name.
        assert_eq!(
            redact_quoted("unknown field `alice`, expected `tenant`"),
            "unknown field `…`, expected `tenant`"
        );
        assert_eq!(
            redact_quoted("missing field `tenant`"),
            "missing field `tenant`"
        );
        assert_eq!(
            redact_quoted("invalid type: integer `987654321`, expected a string"),
            "invalid type: integer `…`, expected a string"
        );
    }
}
