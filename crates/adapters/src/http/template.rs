//! Request templates: a method, a path, query values and a JSON body, where identifiers go
//! only whole and encoded. Checked when the config is parsed; rendered per request.
//!
//! A placeholder (`{tenant}`, `{subject}`, `{memory_id}`, `{version}`, `{locator}`) is accepted
//! in exactly three places:
//! - a whole path segment (`/v1/users/{subject}/notes`), percent-encoded: every byte but
//!   `A-Z a-z 0-9 - . _ ~` (so `/`, `?`, `#`, `%` are encoded), and a value `.` or `..`, or an
//!   empty one, is refused: it would name another path;
//! - a whole query value (`query = { user = "{subject}" }`), encoded the same way;
//! - a whole JSON string value in the body (`body = { user = "{subject}" }`), written by
//!   `serde_json`.
//!
//! Anything else that holds a brace (a placeholder inside a segment, `user-{subject}`, a raw
//! form such as `{+subject}`, a placeholder in a key or in `base_url`) is refused at parse,
//! naming the key, never the value.

use std::collections::{BTreeMap, BTreeSet};

use percent_encoding::{utf8_percent_encode, AsciiSet, NON_ALPHANUMERIC};

/// What a placeholder's value is encoded with in a path segment or a query: everything but
/// RFC 3986's unreserved characters.
const ENCODED: &AsciiSet = &NON_ALPHANUMERIC
    .remove(b'-')
    .remove(b'.')
    .remove(b'_')
    .remove(b'~');

/// A placeholder.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub(crate) enum Var {
    Tenant,
    Subject,
    MemoryId,
    Version,
    Locator,
}

impl Var {
    pub(crate) const ALL: [Var; 5] = [
        Var::Tenant,
        Var::Subject,
        Var::MemoryId,
        Var::Version,
        Var::Locator,
    ];

    fn parse(name: &str) -> Option<Var> {
        Var::ALL.into_iter().find(|v| v.name() == name)
    }

    pub(crate) fn name(self) -> &'static str {
        match self {
            Var::Tenant => "tenant",
            Var::Subject => "subject",
            Var::MemoryId => "memory_id",
            Var::Version => "version",
            Var::Locator => "locator",
        }
    }
}

/// The values placeholders take for one request; `None` where the scope names none.
#[derive(Default, Clone, Copy)]
pub(crate) struct Values<'a> {
    pub(crate) tenant: Option<&'a str>,
    pub(crate) subject: Option<&'a str>,
    pub(crate) memory_id: Option<&'a str>,
    pub(crate) version: Option<&'a str>,
    pub(crate) locator: Option<&'a str>,
}

impl<'a> Values<'a> {
    fn get(&self, v: Var) -> Option<&'a str> {
        match v {
            Var::Tenant => self.tenant,
            Var::Subject => self.subject,
            Var::MemoryId => self.memory_id,
            Var::Version => self.version,
            Var::Locator => self.locator,
        }
    }
}

/// Why a template does not render for these values. Names the placeholder, never its value.
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum RenderError {
    /// The scope names no value for it (a tenant scope and `{subject}`).
    Missing(Var),
    /// The value cannot be a path segment: `.`, `..` or empty.
    NotASegment(Var),
}

impl std::fmt::Display for RenderError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            RenderError::Missing(v) => write!(f, "the scope gives no value for {{{}}}", v.name()),
            RenderError::NotASegment(v) => write!(
                f,
                "{{{}}} is `.`, `..` or empty, which a URL path would read as another path, not as a name",
                v.name()
            ),
        }
    }
}

#[derive(Debug, Clone)]
enum Part {
    Literal(String),
    Var(Var),
}

/// A JSON body template.
#[derive(Debug, Clone)]
enum Json {
    Value(serde_json::Value),
    Var(Var),
    Array(Vec<Json>),
    Object(Vec<(String, Json)>),
}

/// A parsed request template.
#[derive(Debug, Clone)]
pub(crate) struct Template {
    pub(crate) method: ureq::http::Method,
    segments: Vec<Part>,
    trailing_slash: bool,
    query: Vec<(String, Part)>,
    body: Option<Json>,
}

/// A rendered request: what goes on the wire after `base_url`.
#[derive(Debug, Clone)]
pub(crate) struct Rendered {
    pub(crate) method: ureq::http::Method,
    /// The path and query, encoded, starting with `/`.
    pub(crate) target: String,
    pub(crate) body: Option<Vec<u8>>,
}

/// A string's placeholder: `Ok(Some(var))` if it is exactly `{name}`, `Ok(None)` if it holds
/// no brace, `Err` otherwise.
fn placeholder(s: &str, key: &str, whole: &str) -> Result<Option<Var>, String> {
    if !s.contains(['{', '}']) {
        return Ok(None);
    }
    let names = Var::ALL
        .iter()
        .map(|v| format!("{{{}}}", v.name()))
        .collect::<Vec<_>>()
        .join(", ");
    if let Some(name) = s.strip_prefix('{').and_then(|r| r.strip_suffix('}')) {
        if let Some(v) = Var::parse(name) {
            return Ok(Some(v));
        }
        if name.chars().all(|c| c.is_ascii_lowercase() || c == '_') {
            return Err(format!(
                "`{key}`: unknown placeholder; the placeholders are {names}"
            ));
        }
    }
    Err(format!(
        "`{key}`: a placeholder must be {whole}, one of {names}, encoded by Lethe: not part \
         of a longer value, not a raw or reserved form, and no other brace"
    ))
}

impl Template {
    /// Parses a template. `key` names it in messages (`erase`); `allowed` are the placeholders
    /// it may use, `required` those it must.
    pub(crate) fn parse(
        key: &str,
        method: &str,
        path: &str,
        query: Option<BTreeMap<String, String>>,
        body: Option<toml::Value>,
        allowed: &[Var],
        required: &[Var],
    ) -> Result<Self, String> {
        let method = match method {
            "GET" | "POST" | "PUT" | "PATCH" | "DELETE" => {
                ureq::http::Method::from_bytes(method.as_bytes()).map_err(|e| e.to_string())?
            }
            _ => {
                return Err(format!(
                    "`{key}.method` must be GET, POST, PUT, PATCH or DELETE (in capitals)"
                ))
            }
        };
        let Some(rest) = path.strip_prefix('/') else {
            return Err(format!("`{key}.path` must start with `/`"));
        };
        if path.contains(['?', '#']) {
            return Err(format!(
                "`{key}.path` holds `?` or `#`: put query values in `{key}.query`, where they are encoded"
            ));
        }
        let mut segments = Vec::new();
        let mut trailing_slash = false;
        if !rest.is_empty() {
            let parts: Vec<&str> = rest.split('/').collect();
            for (i, seg) in parts.iter().enumerate() {
                if seg.is_empty() {
                    if i + 1 == parts.len() {
                        trailing_slash = true;
                        continue;
                    }
                    return Err(format!("`{key}.path` has an empty segment (`//`)"));
                }
                match placeholder(seg, &format!("{key}.path"), "a whole path segment (as in /v1/notes/{locator})")? {
                    Some(v) => segments.push(Part::Var(v)),
                    None => {
                        if *seg == "." || *seg == ".." {
                            return Err(format!("`{key}.path` has a `.` or `..` segment"));
                        }
                        if !literal_segment(seg) {
                            return Err(format!(
                                "`{key}.path` has a character a URL path cannot hold as written: \
                                 letters, digits and -._~!$&'()*+,;=:@ only, or %XX"
                            ));
                        }
                        segments.push(Part::Literal(seg.to_string()));
                    }
                }
            }
        }
        let mut q = Vec::new();
        for (name, value) in query.unwrap_or_default() {
            let at = format!("{key}.query");
            if name.contains(['{', '}']) {
                return Err(format!(
                    "`{at}`: a key holds a brace: placeholders go only in values"
                ));
            }
            let part = match placeholder(&value, &format!("{at}.{name}"), "a whole query value")? {
                Some(v) => Part::Var(v),
                None => Part::Literal(value),
            };
            q.push((name, part));
        }
        let body = match body {
            None => None,
            Some(v @ (toml::Value::Table(_) | toml::Value::Array(_))) => {
                Some(json(v, &format!("{key}.body"))?)
            }
            Some(_) => {
                return Err(format!(
                    "`{key}.body` must be a table (a JSON object) or an array"
                ))
            }
        };
        if body.is_some() && method == ureq::http::Method::GET {
            return Err(format!("`{key}.body`: a GET request carries no body"));
        }
        let t = Template {
            method,
            segments,
            trailing_slash,
            query: q,
            body,
        };
        let used = t.vars();
        if let Some(v) = used.iter().find(|v| !allowed.contains(v)) {
            return Err(format!(
                "`{key}` uses {{{}}}, which it cannot have; it may use {}",
                v.name(),
                allowed
                    .iter()
                    .map(|v| format!("{{{}}}", v.name()))
                    .collect::<Vec<_>>()
                    .join(", ")
            ));
        }
        if let Some(v) = required.iter().find(|v| !used.contains(v)) {
            return Err(format!(
                "`{key}` must use {{{}}} (in its path, query or body), or it would reach beyond the scope",
                v.name()
            ));
        }
        Ok(t)
    }

    /// The placeholders it uses.
    pub(crate) fn vars(&self) -> BTreeSet<Var> {
        let mut out = BTreeSet::new();
        for p in self.segments.iter().chain(self.query.iter().map(|(_, p)| p)) {
            if let Part::Var(v) = p {
                out.insert(*v);
            }
        }
        fn walk(j: &Json, out: &mut BTreeSet<Var>) {
            match j {
                Json::Value(_) => {}
                Json::Var(v) => {
                    out.insert(*v);
                }
                Json::Array(a) => a.iter().for_each(|j| walk(j, out)),
                Json::Object(o) => o.iter().for_each(|(_, j)| walk(j, out)),
            }
        }
        if let Some(b) = &self.body {
            walk(b, &mut out);
        }
        out
    }

    /// The request for these values.
    pub(crate) fn render(&self, values: &Values<'_>) -> Result<Rendered, RenderError> {
        let get = |v: Var| values.get(v).ok_or(RenderError::Missing(v));
        let mut target = String::new();
        for p in &self.segments {
            target.push('/');
            match p {
                Part::Literal(s) => target.push_str(s),
                Part::Var(v) => {
                    let value = get(*v)?;
                    if value.is_empty() || value == "." || value == ".." {
                        return Err(RenderError::NotASegment(*v));
                    }
                    target.extend(utf8_percent_encode(value, ENCODED));
                }
            }
        }
        if self.trailing_slash || self.segments.is_empty() {
            target.push('/');
        }
        for (i, (name, p)) in self.query.iter().enumerate() {
            target.push(if i == 0 { '?' } else { '&' });
            target.extend(utf8_percent_encode(name, ENCODED));
            target.push('=');
            let value = match p {
                Part::Literal(s) => s.as_str(),
                Part::Var(v) => get(*v)?,
            };
            target.extend(utf8_percent_encode(value, ENCODED));
        }
        let body = match &self.body {
            None => None,
            Some(b) => Some(serde_json::to_vec(&fill(b, values)?).expect("JSON values serialize")),
        };
        Ok(Rendered {
            method: self.method.clone(),
            target,
            body,
        })
    }
}

fn fill(j: &Json, values: &Values<'_>) -> Result<serde_json::Value, RenderError> {
    Ok(match j {
        Json::Value(v) => v.clone(),
        Json::Var(v) => serde_json::Value::String(
            values.get(*v).ok_or(RenderError::Missing(*v))?.to_string(),
        ),
        Json::Array(a) => serde_json::Value::Array(
            a.iter()
                .map(|j| fill(j, values))
                .collect::<Result<_, _>>()?,
        ),
        Json::Object(o) => serde_json::Value::Object(
            o.iter()
                .map(|(k, j)| Ok((k.clone(), fill(j, values)?)))
                .collect::<Result<_, _>>()?,
        ),
    })
}

/// A TOML body as a JSON template: a string is a literal or one whole placeholder.
fn json(v: toml::Value, at: &str) -> Result<Json, String> {
    Ok(match v {
        toml::Value::String(s) => match placeholder(&s, at, "a whole JSON string value")? {
            Some(var) => Json::Var(var),
            None => Json::Value(serde_json::Value::String(s)),
        },
        toml::Value::Integer(i) => Json::Value(i.into()),
        toml::Value::Float(f) => Json::Value(
            serde_json::Number::from_f64(f)
                .map(serde_json::Value::Number)
                .ok_or_else(|| format!("`{at}`: a number JSON cannot hold"))?,
        ),
        toml::Value::Boolean(b) => Json::Value(b.into()),
        toml::Value::Datetime(_) => {
            return Err(format!(
                "`{at}`: a TOML date has no JSON form; write it as a string"
            ))
        }
        toml::Value::Array(a) => Json::Array(
            a.into_iter()
                .enumerate()
                .map(|(i, v)| json(v, &format!("{at}[{i}]")))
                .collect::<Result<_, _>>()?,
        ),
        toml::Value::Table(t) => Json::Object(
            t.into_iter()
                .map(|(k, v)| {
                    if k.contains(['{', '}']) {
                        return Err(format!(
                            "`{at}`: a key holds a brace: placeholders go only in string values"
                        ));
                    }
                    let inner = json(v, &format!("{at}.{k}"))?;
                    Ok((k, inner))
                })
                .collect::<Result<_, _>>()?,
        ),
    })
}

/// A literal path segment: RFC 3986 `pchar`s, with `%` only as `%XX`.
fn literal_segment(s: &str) -> bool {
    let b = s.as_bytes();
    let mut i = 0;
    while i < b.len() {
        let c = b[i];
        if c == b'%' {
            if !(b.get(i + 1).is_some_and(u8::is_ascii_hexdigit)
                && b.get(i + 2).is_some_and(u8::is_ascii_hexdigit))
            {
                return false;
            }
            i += 3;
            continue;
        }
        if !(c.is_ascii_alphanumeric() || b"-._~!$&'()*+,;=:@".contains(&c)) {
            return false;
        }
        i += 1;
    }
    true
}

/// A JSON pointer from config: empty (the whole document) or starting with `/`.
pub(crate) fn pointer(key: &str, p: &str) -> Result<String, String> {
    if p.is_empty() || p.starts_with('/') {
        Ok(p.to_string())
    } else {
        Err(format!(
            "`{key}` must be a JSON pointer: empty (the whole document) or starting with `/`, as in \"/results\""
        ))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const ALL: &[Var] = &Var::ALL;

    fn t(path: &str, query: &[(&str, &str)], body: Option<&str>) -> Result<Template, String> {
        let body = body.map(|b| toml::from_str::<toml::Table>(&format!("b = {b}")).unwrap()["b"].clone());
        let query = (!query.is_empty()).then(|| {
            query
                .iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect()
        });
        Template::parse("erase", "POST", path, query, body, ALL, &[])
    }

    fn values<'a>(s: &'a str) -> Values<'a> {
        Values {
            tenant: Some("acme"),
            subject: Some(s),
            locator: Some(s),
            ..Values::default()
        }
    }

    #[test]
    fn identifiers_go_whole_and_encoded() {
        let tpl = t(
            "/v1/users/{subject}/notes",
            &[("tenant", "{tenant}"), ("kind", "a b")],
            Some("{ user = \"{subject}\", n = 1, tags = [\"x\", \"{tenant}\"] }"),
        )
        .unwrap();
        for (s, path) in [
            ("a/b", "/v1/users/a%2Fb/notes"),
            ("%2F", "/v1/users/%252F/notes"),
            ("?x=1", "/v1/users/%3Fx%3D1/notes"),
            ("#f", "/v1/users/%23f/notes"),
            ("zoë", "/v1/users/zo%C3%AB/notes"),
            ("...", "/v1/users/.../notes"),
        ] {
            let r = tpl.render(&values(s)).unwrap();
            assert_eq!(r.target, format!("{path}?kind=a%20b&tenant=acme"), "{s}");
            let body: serde_json::Value = serde_json::from_slice(&r.body.unwrap()).unwrap();
            assert_eq!(body["user"], s);
            assert_eq!(body["tags"][1], "acme");
            assert_eq!(body["n"], 1);
        }
        for s in [".", ".."] {
            assert_eq!(
                tpl.render(&values(s)).unwrap_err(),
                RenderError::NotASegment(Var::Subject)
            );
        }
        // In a query or a body a dot is only a value.
        let q = t("/v1/search", &[("u", "{subject}")], Some("{ u = \"{subject}\" }")).unwrap();
        assert_eq!(q.render(&values("..")).unwrap().target, "/v1/search?u=..");
        let tenant_only = Values {
            tenant: Some("acme"),
            ..Values::default()
        };
        assert_eq!(
            tpl.render(&tenant_only).unwrap_err(),
            RenderError::Missing(Var::Subject)
        );
    }

    #[test]
    fn a_placeholder_anywhere_but_whole_is_refused_naming_the_key() {
        for (path, query, body, says) in [
            ("/v1/notes/n-{locator}", vec![], None, "erase.path"),
            ("/v1/notes/{locator}.json", vec![], None, "erase.path"),
            ("/v1/{+subject}", vec![], None, "raw or reserved"),
            ("/v1/{subject:raw}", vec![], None, "erase.path"),
            ("/v1/{user}", vec![], None, "unknown placeholder"),
            ("/v1/notes?id={locator}", vec![], None, "erase.query"),
            ("/v1/../admin", vec![], None, "`.` or `..`"),
            ("/v1//x", vec![], None, "empty segment"),
            ("v1/x", vec![], None, "start with"),
            ("/v1/a b", vec![], None, "cannot hold"),
            ("/v1/x", vec![("id", "n-{locator}")], None, "erase.query.id"),
            ("/v1/x", vec![("{subject}", "1")], None, "key holds a brace"),
            ("/v1/x", vec![], Some("{ user = \"u:{subject}\" }"), "erase.body.user"),
            ("/v1/x", vec![], Some("{ \"{subject}\" = 1 }"), "key holds a brace"),
            ("/v1/x", vec![], Some("\"{subject}\""), "table"),
        ] {
            let e = t(path, &query, body).err().unwrap_or_else(|| panic!("{path} accepted"));
            assert!(e.contains(says), "{path}: {e}");
        }
        let e = Template::parse("locate", "GET", "/v1/{locator}", None, None, &[Var::Tenant, Var::Subject], &[])
            .unwrap_err();
        assert!(e.contains("{locator}") && e.contains("cannot have"), "{e}");
        let e = Template::parse("locate", "GET", "/v1/{tenant}", None, None, ALL, &[Var::Subject])
            .unwrap_err();
        assert!(e.contains("must use {subject}"), "{e}");
        let e = Template::parse("x", "get", "/", None, None, ALL, &[]).unwrap_err();
        assert!(e.contains("method"), "{e}");
    }
}
