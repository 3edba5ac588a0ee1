//! Messages from parsers, without the values they quote.

/// A parser's message without the values it quotes: serde quotes the offending value
/// (`` invalid type: integer `987654321` ``, `invalid type: string "mk-…"`), and a caller that
/// puts a numeric user id, a memory id or a URL with its password in the wrong place would
/// find it in its own error logs (`lethe serve`'s JSON bodies, the config file). What is left
/// names the field and what was expected. Field names (`` missing field `tenant` ``, `` unknown field `colour`, expected one of … ``)
/// and the expected content type stay: they are the API's words, and what a caller needs to fix
/// the request or the file.
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
        let Some(end) = after.find(q) else {
            out.push(q);
            out.push('…');
            return out;
        };
        let quoted = &after[..end];
        let is_value = q == '"' || VALUE.iter().any(|w| out.ends_with(w));
        out.push(q);
        out.push_str(if is_value { "…" } else { quoted });
        out.push(q);
        rest = &after[end + 1..];
    }
    out.push_str(rest);
    out
}
