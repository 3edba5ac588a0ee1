//! A declared statement: its named parameters rewritten to the engine's placeholders by a small
//! tokenizer, and the form checks that need no database (one statement, a read starts with
//! `SELECT`, `WITH` or `VALUES`, an erase is `DELETE FROM` the declared table).
//!
//! The tokenizer knows only what hides a `:name` or a `;`: string literals (`'...'`, with `''`;
//! PostgreSQL's `E'...'` with backslash escapes and `$tag$...$tag$`), quoted identifiers
//! (`"..."`; SQLite's `` `...` `` and `[...]`), and comments (`--`, `/* */`, nested on
//! PostgreSQL). `::` is a cast, never a parameter. The engine itself decides the rest at probe
//! (see the adapter): this is not an SQL parser.

/// The engine a statement is written for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Engine {
    Sqlite,
    Postgres,
}

/// A named parameter.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub(crate) enum Name {
    Tenant,
    Subject,
    MemoryId,
    Version,
    Locator,
}

impl Name {
    const ALL: [Name; 5] = [
        Name::Tenant,
        Name::Subject,
        Name::MemoryId,
        Name::Version,
        Name::Locator,
    ];

    pub(crate) fn as_str(self) -> &'static str {
        match self {
            Name::Tenant => "tenant",
            Name::Subject => "subject",
            Name::MemoryId => "memory_id",
            Name::Version => "version",
            Name::Locator => "locator",
        }
    }
}

/// A word of the statement outside literals and comments, for the form checks.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Tok {
    /// A bare word (keyword, identifier, number), as written.
    Word(String),
    /// A quoted identifier, unquoted.
    Quoted(String),
    /// One punctuation character.
    Sym(char),
    /// A literal or a parameter.
    Value,
}

/// A statement rewritten for its engine.
#[derive(Debug, Clone)]
pub(crate) struct Parsed {
    /// The text with `?N` (SQLite) or `$N::text` (PostgreSQL) for each named parameter, and a
    /// trailing `;` dropped.
    pub(crate) sql: String,
    /// The parameter bound to placeholder `N` is `params[N - 1]`.
    pub(crate) params: Vec<Name>,
    toks: Vec<Tok>,
}

fn is_word_byte(b: u8) -> bool {
    b.is_ascii_alphanumeric() || b == b'_' || b == b'$' || b >= 0x80
}

/// Rewrites `sql`'s named parameters. Errors say what to fix, in words that quote the
/// configured statement's parameter names only.
pub(crate) fn parse(sql: &str, engine: Engine) -> Result<Parsed, String> {
    let s = sql.as_bytes();
    let mut out = String::with_capacity(sql.len() + 16);
    let mut params: Vec<Name> = Vec::new();
    let mut toks = Vec::new();
    let mut i = 0;
    // Where the text after a `;` starts: only blanks and comments may follow it.
    let mut ended: Option<usize> = None;
    let pg = engine == Engine::Postgres;
    while i < s.len() {
        let b = s[i];
        let start = i;
        let comment = (b == b'-' && s.get(i + 1) == Some(&b'-'))
            || (b == b'/' && s.get(i + 1) == Some(&b'*'));
        if ended.is_some() && !b.is_ascii_whitespace() && !comment {
            return Err(chained());
        }
        match b {
            b'\'' => {
                // E'...' (PostgreSQL): backslash escapes a quote.
                let escapes = pg
                    && matches!(toks.last(), Some(Tok::Word(w)) if w.eq_ignore_ascii_case("e"))
                    && i > 0
                    && is_word_byte(s[i - 1]);
                i = quoted(s, i, b'\'', escapes).ok_or("a string literal is not closed")?;
                if escapes {
                    toks.pop();
                }
                toks.push(Tok::Value);
            }
            b'"' => {
                i = quoted(s, i, b'"', false).ok_or("a quoted identifier is not closed")?;
                toks.push(Tok::Quoted(sql[start + 1..i - 1].replace("\"\"", "\"")));
            }
            b'`' if !pg => {
                i = quoted(s, i, b'`', false).ok_or("a quoted identifier is not closed")?;
                toks.push(Tok::Quoted(sql[start + 1..i - 1].replace("``", "`")));
            }
            b'[' if !pg => {
                let end = sql[i..]
                    .find(']')
                    .ok_or("a quoted identifier is not closed")?;
                i += end + 1;
                toks.push(Tok::Quoted(sql[start + 1..i - 1].to_string()));
            }
            b'-' if s.get(i + 1) == Some(&b'-') => {
                i = sql[i..].find('\n').map_or(s.len(), |n| i + n + 1);
            }
            b'/' if s.get(i + 1) == Some(&b'*') => {
                i = block_comment(s, i, pg).ok_or("a /* comment is not closed")?;
            }
            b'$' if pg && s.get(i + 1).is_some_and(u8::is_ascii_digit) => {
                return Err(positional());
            }
            b'$' if pg => {
                // A dollar-quoted string: `$$` or `$tag$`, up to the same tag.
                let tag_end = s[i + 1..]
                    .iter()
                    .position(|c| !(c.is_ascii_alphanumeric() || *c == b'_' || *c >= 0x80))
                    .map(|n| i + 1 + n);
                match tag_end {
                    Some(e) if s[e] == b'$' => {
                        let tag = &sql[i..=e];
                        let close = sql[e + 1..]
                            .find(tag)
                            .ok_or("a dollar-quoted string is not closed")?;
                        i = e + 1 + close + tag.len();
                        toks.push(Tok::Value);
                    }
                    _ => {
                        i += 1;
                        toks.push(Tok::Sym('$'));
                    }
                }
            }
            b'?' | b'@' | b'$' if !pg => return Err(positional()),
            b':' if s.get(i + 1) == Some(&b':') => {
                i += 2;
                toks.push(Tok::Sym(':'));
            }
            b':' if s
                .get(i + 1)
                .is_some_and(|c| c.is_ascii_alphabetic() || *c == b'_') =>
            {
                let end = s[i + 1..]
                    .iter()
                    .position(|c| !(c.is_ascii_alphanumeric() || *c == b'_'))
                    .map_or(s.len(), |n| i + 1 + n);
                let word = &sql[i + 1..end];
                let name = Name::ALL
                    .into_iter()
                    .find(|n| n.as_str() == word)
                    .ok_or_else(|| {
                        format!(
                            "unknown parameter :{word}; the parameters are :tenant, :subject, \
                             :memory_id, :version and (in erase) :locator"
                        )
                    })?;
                let n = match params.iter().position(|p| *p == name) {
                    Some(p) => p + 1,
                    None => {
                        params.push(name);
                        params.len()
                    }
                };
                out.push_str(&match engine {
                    // Every parameter is text: a column of another type takes a cast
                    // (`:locator::bigint`), never an inferred type the text cannot bind to.
                    Engine::Postgres => format!("${n}::text"),
                    Engine::Sqlite => format!("?{n}"),
                });
                toks.push(Tok::Value);
                i = end;
                continue;
            }
            b';' => {
                ended = Some(out.len());
                i += 1;
                continue;
            }
            b if b.is_ascii_whitespace() => i += 1,
            b if is_word_byte(b) => {
                while i < s.len() && is_word_byte(s[i]) {
                    i += 1;
                }
                toks.push(Tok::Word(sql[start..i].to_string()));
            }
            _ => {
                // One character, whole (it may be more than one byte).
                let c = sql[i..].chars().next().expect("a character");
                i += c.len_utf8();
                toks.push(Tok::Sym(c));
            }
        }
        out.push_str(&sql[start..i]);
    }
    if let Some(at) = ended {
        out.truncate(at);
    }
    if toks.is_empty() {
        return Err("the statement is empty".into());
    }
    Ok(Parsed {
        sql: out,
        params,
        toks,
    })
}

fn chained() -> String {
    "holds more than one statement (a `;` followed by more): give exactly one".into()
}

fn positional() -> String {
    "uses a positional or engine-specific parameter ($1, ?, @x): use the named parameters \
     :tenant, :subject, :memory_id, :version, :locator"
        .into()
}

/// The end (one past the closing quote) of a quoted run starting at `at`; a doubled quote is
/// one quote, and with `escapes` a backslash takes the next byte.
fn quoted(s: &[u8], at: usize, q: u8, escapes: bool) -> Option<usize> {
    let mut i = at + 1;
    while i < s.len() {
        if escapes && s[i] == b'\\' {
            i += 2;
            continue;
        }
        if s[i] == q {
            if s.get(i + 1) == Some(&q) {
                i += 2;
                continue;
            }
            return Some(i + 1);
        }
        i += 1;
    }
    None
}

/// The end of a block comment starting at `at`; PostgreSQL's nest.
fn block_comment(s: &[u8], at: usize, nested: bool) -> Option<usize> {
    let mut depth = 0;
    let mut i = at;
    while i + 1 < s.len() {
        if s[i] == b'/' && s[i + 1] == b'*' && (nested || depth == 0) {
            depth += 1;
            i += 2;
        } else if s[i] == b'*' && s[i + 1] == b'/' {
            depth -= 1;
            i += 2;
            if depth == 0 {
                return Some(i);
            }
        } else {
            i += 1;
        }
    }
    None
}

impl Parsed {
    fn first_word(&self) -> Option<String> {
        match self.toks.first() {
            Some(Tok::Word(w)) => Some(w.to_ascii_uppercase()),
            _ => None,
        }
    }

    /// A read starts with `SELECT`, `WITH` or `VALUES` (the engine checks it writes nothing).
    pub(crate) fn check_read(&self) -> Result<(), String> {
        match self.first_word().as_deref() {
            Some("SELECT" | "WITH" | "VALUES") => Ok(()),
            _ => Err("must be a query (SELECT, WITH ... SELECT or VALUES)".into()),
        }
    }

    /// An erase is `DELETE FROM [ONLY] <table>`, `<table>` the declared one as the engine reads
    /// names (PostgreSQL folds a bare name to lower case; SQLite compares without case; a
    /// PostgreSQL name without its schema is taken as the declared table's and confirmed by the
    /// plan at probe).
    pub(crate) fn check_delete(&self, table: &str, engine: Engine) -> Result<(), String> {
        let refuse = || {
            format!(
                "must be one DELETE FROM the declared table `{table}` (`DELETE FROM {table} \
                 WHERE ... = :locator`)"
            )
        };
        let mut t = self.toks.iter().peekable();
        let is = |tok: Option<&Tok>, w: &str| matches!(tok, Some(Tok::Word(x)) if x.eq_ignore_ascii_case(w));
        if !is(t.next(), "DELETE") || !is(t.next(), "FROM") {
            return Err(refuse());
        }
        if engine == Engine::Postgres && is(t.peek().copied(), "ONLY") {
            t.next();
        }
        // The statement's name, part by part.
        let mut parts = Vec::new();
        loop {
            let part = match t.next() {
                Some(Tok::Word(w)) => match engine {
                    Engine::Postgres => w.to_lowercase(),
                    Engine::Sqlite => w.clone(),
                },
                Some(Tok::Quoted(q)) => q.clone(),
                _ => return Err(refuse()),
            };
            parts.push(part);
            if t.peek() == Some(&&Tok::Sym('.')) {
                t.next();
            } else {
                break;
            }
        }
        let declared: Vec<&str> = match engine {
            Engine::Postgres => table.split('.').collect(),
            Engine::Sqlite => vec![table],
        };
        let same = |a: &str, b: &str| match engine {
            Engine::Postgres => a == b,
            Engine::Sqlite => a.eq_ignore_ascii_case(b),
        };
        let matches = match (parts.as_slice(), declared.as_slice()) {
            ([n], [.., d]) => same(n, d),
            ([s, n], [ds, dn]) => same(s, ds) && same(n, dn),
            ([s, n], [dn]) => engine == Engine::Sqlite && same(s, "main") && same(n, dn),
            _ => false,
        };
        if !matches {
            return Err(refuse());
        }
        if engine == Engine::Sqlite && self.toks.iter().any(|t| is(Some(t), "RETURNING")) {
            return Err("must not have RETURNING".into());
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pg(sql: &str) -> Result<Parsed, String> {
        parse(sql, Engine::Postgres)
    }

    fn lite(sql: &str) -> Result<Parsed, String> {
        parse(sql, Engine::Sqlite)
    }

    #[test]
    fn named_parameters_become_placeholders_reused_by_name() {
        let p = pg("SELECT id FROM t WHERE a = :tenant AND b = :subject OR c = :tenant").unwrap();
        assert_eq!(
            p.sql,
            "SELECT id FROM t WHERE a = $1::text AND b = $2::text OR c = $1::text"
        );
        assert_eq!(p.params, vec![Name::Tenant, Name::Subject]);
        let p = lite("SELECT id FROM t WHERE a = :tenant AND b = :subject;  ").unwrap();
        assert_eq!(p.sql, "SELECT id FROM t WHERE a = ?1 AND b = ?2");
    }

    #[test]
    fn literals_identifiers_comments_and_casts_hide_no_parameter() {
        let p = pg("SELECT ':tenant', \"a:subject\", E'x\\':tenant', $$ :tenant $$, $q$ ; $q$ \
                    -- :tenant ;\n /* :x /* ; */ :y */ x::text FROM t WHERE u = :subject::text")
        .unwrap();
        assert_eq!(p.params, vec![Name::Subject]);
        assert!(p.sql.ends_with("u = $1::text::text"), "{}", p.sql);
        let p = lite("SELECT ':tenant', `:x`, [:y], \"it''s :z\" FROM t WHERE u = :subject").unwrap();
        assert_eq!(p.params, vec![Name::Subject]);
    }

    #[test]
    fn bad_statements_are_refused_with_what_to_fix() {
        let e = pg("SELECT 1 FROM t WHERE a = :tenantx").unwrap_err();
        assert!(e.contains(":tenantx"), "{e}");
        assert!(pg("SELECT 1; DELETE FROM t").unwrap_err().contains("more than one"));
        assert!(pg("SELECT 1 ; -- done\n").is_ok());
        assert!(pg("SELECT $1").unwrap_err().contains("positional"));
        assert!(lite("SELECT ?1").unwrap_err().contains("positional"));
        assert!(lite("SELECT @a").unwrap_err().contains("positional"));
        assert!(pg("SELECT 'x").is_err());
        assert!(pg("SELECT /* x").is_err());
        assert!(pg("  -- nothing\n").is_err());
    }

    #[test]
    fn an_erase_deletes_from_the_declared_table_only() {
        let ok = |sql: &str, table: &str, e: Engine| {
            parse(sql, e).unwrap().check_delete(table, e)
        };
        assert!(ok("DELETE FROM public.summaries WHERE id = :locator", "public.summaries", Engine::Postgres).is_ok());
        assert!(ok("delete from ONLY \"public\".Summaries WHERE id = :locator", "public.summaries", Engine::Postgres).is_ok());
        assert!(ok("DELETE FROM summaries WHERE id = :locator", "public.summaries", Engine::Postgres).is_ok());
        assert!(ok("DELETE FROM \"Summaries\" WHERE id = :locator", "public.summaries", Engine::Postgres).is_err());
        assert!(ok("DELETE FROM other WHERE id = :locator", "public.summaries", Engine::Postgres).is_err());
        assert!(ok("WITH x AS (SELECT 1) DELETE FROM summaries", "summaries", Engine::Postgres).is_err());
        assert!(ok("UPDATE summaries SET a = 1", "summaries", Engine::Postgres).is_err());
        assert!(ok("DELETE FROM [Summaries] WHERE id = :locator", "summaries", Engine::Sqlite).is_ok());
        assert!(ok("DELETE FROM main.summaries WHERE id = :locator", "summaries", Engine::Sqlite).is_ok());
        assert!(ok("DELETE FROM summaries WHERE id = :locator RETURNING id", "summaries", Engine::Sqlite).is_err());
        let read = |sql: &str| lite(sql).unwrap().check_read();
        assert!(read("select 1").is_ok() && read("WITH a AS (SELECT 1) SELECT * FROM a").is_ok());
        assert!(read("DELETE FROM t").is_err() && read("PRAGMA x").is_err());
    }
}
