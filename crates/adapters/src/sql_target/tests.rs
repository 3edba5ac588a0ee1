//! The `sql` target on a real SQLite file and a real PostgreSQL 15 (LETHE_PG15_URL, a database
//! of each test's own): the conformance suite over awkward identifiers, memory and tenant
//! scopes, statements refused before anything is touched, and the anomaly guard.

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicUsize, Ordering};

use lethe_core::{MemoryId, Scope, Subject, Tenant, Version};

use crate::conformance::{self, Case, Row};
use crate::{Adapter, AdapterError, Applicability};

use super::{Config, SqlTarget};

static N: AtomicUsize = AtomicUsize::new(0);

/// Subjects whose ids a string-built statement would get wrong: quotes, LIKE metacharacters,
/// unicode, a parameter's spelling, and an id that another prefixes.
const SUBJECTS: [&str; 6] = [
    "alice",
    "alice2",
    "o'brien \"q\"; --",
    "50%_off",
    "zoë 日本",
    ":tenant",
];

const TABLES: &str = "
CREATE TABLE summaries (id INTEGER PRIMARY KEY, tenant_id TEXT NOT NULL, user_id TEXT NOT NULL,
                        memory_id TEXT, version TEXT, body TEXT NOT NULL);
CREATE TABLE notes (id INTEGER PRIMARY KEY, tenant_id TEXT NOT NULL, user_id TEXT NOT NULL,
                    body TEXT NOT NULL);";

enum Db {
    Sqlite(tempfile::TempDir),
    Postgres { name: String, url: String },
}

/// A seeded database: `summaries` (the target's table) and `notes` (another table).
struct Fix {
    db: Db,
    postgres: bool,
}

fn pg_admin() -> String {
    std::env::var("LETHE_PG15_URL")
        .unwrap_or_else(|_| "postgres://postgres@127.0.0.1:5432/postgres".into())
}

impl Fix {
    fn new(postgres: bool) -> Self {
        let db = if postgres {
            let name = format!(
                "lethe_sqlgen_{}_{}",
                std::process::id(),
                N.fetch_add(1, Ordering::SeqCst)
            );
            let admin = pg_admin();
            postgres::Client::connect(&admin, postgres::NoTls)
                .expect("PostgreSQL 15 reachable (. /work/services.env)")
                .batch_execute(&format!("CREATE DATABASE {name}"))
                .unwrap();
            let url = format!("{}/{name}", admin.rsplit_once('/').unwrap().0);
            Db::Postgres { name, url }
        } else {
            let dir = tempfile::tempdir().unwrap();
            rusqlite::Connection::open(dir.path().join("app.db")).unwrap();
            Db::Sqlite(dir)
        };
        let fix = Fix { db, postgres };
        fix.exec(TABLES);
        let mut id = 0;
        for tenant in ["acme", "globex"] {
            for subject in SUBJECTS {
                for (memory, version) in [("m1", "v1"), ("m1", "v2"), ("m2", "v1")] {
                    id += 1;
                    fix.insert(
                        "summaries",
                        &[
                            &id.to_string(),
                            tenant,
                            subject,
                            memory,
                            version,
                            &format!("summary {id} of {subject}"),
                        ],
                    );
                }
                id += 1;
                fix.insert(
                    "notes",
                    &[&id.to_string(), tenant, subject, &format!("note of {subject}")],
                );
            }
        }
        fix
    }

    fn path(&self) -> PathBuf {
        match &self.db {
            Db::Sqlite(dir) => dir.path().join("app.db"),
            Db::Postgres { .. } => unreachable!(),
        }
    }

    fn sqlite(&self) -> rusqlite::Connection {
        rusqlite::Connection::open(self.path()).unwrap()
    }

    fn pg(&self) -> postgres::Client {
        match &self.db {
            Db::Postgres { url, .. } => postgres::Client::connect(url, postgres::NoTls).unwrap(),
            Db::Sqlite(_) => unreachable!(),
        }
    }

    fn exec(&self, sql: &str) {
        if self.postgres {
            self.pg().batch_execute(sql).unwrap();
        } else {
            self.sqlite().execute_batch(sql).unwrap();
        }
    }

    fn insert(&self, table: &str, values: &[&str]) {
        if self.postgres {
            let marks: Vec<String> = (1..=values.len())
                .map(|i| format!("${i}{}", if i == 1 { "::text::integer" } else { "" }))
                .collect();
            let params: Vec<&(dyn postgres::types::ToSql + Sync)> = values
                .iter()
                .map(|v| v as &(dyn postgres::types::ToSql + Sync))
                .collect();
            self.pg()
                .execute(
                    &format!("INSERT INTO {table} VALUES ({})", marks.join(", ")),
                    &params,
                )
                .unwrap();
        } else {
            let marks = vec!["?"; values.len()].join(", ");
            self.sqlite()
                .execute(
                    &format!("INSERT INTO {table} VALUES ({marks})"),
                    rusqlite::params_from_iter(values),
                )
                .unwrap();
        }
    }

    /// Every row of both tables as text, with its owner.
    fn rows(&self) -> Vec<Row> {
        let q = |t: &str| {
            format!(
                "SELECT CAST(id AS TEXT) || '|' || {} , tenant_id, user_id FROM {t} ORDER BY id",
                if t == "summaries" {
                    "tenant_id || '|' || user_id || '|' || memory_id || '|' || version || '|' || body"
                } else {
                    "tenant_id || '|' || user_id || '|' || body"
                }
            )
        };
        let mut out = Vec::new();
        for table in ["summaries", "notes"] {
            let rows: Vec<(String, String, String)> = if self.postgres {
                self.pg()
                    .query(&q(table), &[])
                    .unwrap()
                    .iter()
                    .map(|r| (r.get(0), r.get(1), r.get(2)))
                    .collect()
            } else {
                let c = self.sqlite();
                let mut s = c.prepare(&q(table)).unwrap();
                let rows = s
                    .query_map([], |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?)))
                    .unwrap()
                    .map(Result::unwrap)
                    .collect();
                rows
            };
            out.extend(rows.into_iter().map(|(bytes, t, s)| Row {
                table: table.into(),
                bytes: bytes.into_bytes(),
                owner: (t, s),
            }));
        }
        out
    }

    fn table(&self) -> &'static str {
        if self.postgres {
            "public.summaries"
        } else {
            "summaries"
        }
    }

    /// The target's TOML: where the table is, then `statements`.
    fn toml(&self, statements: &str) -> toml::Table {
        let place = match &self.db {
            Db::Sqlite(_) => format!("path = {:?}", self.path().display().to_string()),
            Db::Postgres { url, .. } => format!("url = {url:?}"),
        };
        toml::from_str(&format!("{place}\ntable = {:?}\n{statements}", self.table())).unwrap()
    }

    /// The statements of the docs' example, `t` the table.
    fn statements(&self, memory: bool, tenant: bool) -> String {
        let t = self.table();
        let id = if self.postgres { ":locator::integer" } else { ":locator" };
        let mut s = format!(
            "locate = \"SELECT id, 1 FROM {t} WHERE tenant_id = :tenant AND user_id = :subject\"\n\
             erase = \"DELETE FROM {t} WHERE id = {id}\"\n\
             verify = \"SELECT count(*) FROM {t} WHERE tenant_id = :tenant AND user_id = :subject\"\n"
        );
        if memory {
            s += &format!(
                "locate_memory = \"SELECT id, 1 FROM {t} WHERE tenant_id = :tenant AND user_id = :subject AND memory_id = :memory_id AND version = :version\"\n\
                 verify_memory = \"SELECT count(*) FROM {t} WHERE tenant_id = :tenant AND user_id = :subject AND memory_id = :memory_id AND version = :version\"\n"
            );
        }
        if tenant {
            s += &format!(
                "locate_tenant = \"SELECT id, 1 FROM {t} WHERE tenant_id = :tenant\"\n\
                 verify_tenant = \"SELECT count(*) FROM {t} WHERE tenant_id = :tenant\"\n"
            );
        }
        s
    }

    fn target(&self, statements: &str) -> Result<SqlTarget, String> {
        Ok(Config::parse(self.toml(statements), Path::new("."))?.build("sums"))
    }
}

impl Drop for Fix {
    fn drop(&mut self) {
        if let Db::Postgres { name, .. } = &self.db {
            if let Ok(mut c) = postgres::Client::connect(&pg_admin(), postgres::NoTls) {
                let _ = c.batch_execute(&format!("DROP DATABASE IF EXISTS {name} WITH (FORCE)"));
            }
        }
    }
}

struct C<'a> {
    fix: &'a Fix,
    adapter: SqlTarget,
}

impl Case for C<'_> {
    fn adapter(&self) -> &dyn Adapter {
        &self.adapter
    }

    /// `summaries` only: `notes` is checked apart (no erase of this target may touch it).
    fn snapshot(&self) -> Vec<Row> {
        self.fix
            .rows()
            .into_iter()
            .filter(|r| r.table == "summaries")
            .collect()
    }
}

fn subject(t: &str, s: &str) -> Scope {
    Scope::Subject {
        tenant: Tenant::new(t).unwrap(),
        subject: Subject::new(s).unwrap(),
    }
}

fn memory(t: &str, s: &str, m: &str, v: Option<&str>) -> Scope {
    Scope::Memory {
        tenant: Tenant::new(t).unwrap(),
        subject: Subject::new(s).unwrap(),
        memory: MemoryId::new(m).unwrap(),
        version: v.map(|v| Version::new(v).unwrap()),
    }
}

fn notes(fix: &Fix) -> Vec<Row> {
    fix.rows()
        .into_iter()
        .filter(|r| r.table == "notes")
        .collect()
}

fn conformance_on(postgres: bool) {
    let fix = Fix::new(postgres);
    let notes_before = notes(&fix);
    let case = C {
        fix: &fix,
        adapter: fix.target(&fix.statements(true, true)).unwrap(),
    };
    case.adapter.probe().expect("probe");
    for s in SUBJECTS {
        let scope = subject("acme", s);
        let me = ("acme".to_string(), s.to_string());
        let out = conformance::run(&case, &scope, &|o| *o == me, 2);
        assert_eq!(out.inventoried, 3, "{s:?}: three summaries each");
    }
    // Every acme subject erased; every globex row kept byte for byte, and no note touched.
    assert_eq!(case.snapshot().len(), 3 * SUBJECTS.len());
    assert!(case.snapshot().iter().all(|r| r.owner.0 == "globex"));
    assert_eq!(notes(&fix), notes_before);
}

#[test]
fn conformance_on_sqlite() {
    conformance_on(false);
}

#[test]
fn conformance_on_postgres() {
    conformance_on(true);
}

fn memory_and_tenant_scopes_on(postgres: bool) {
    let fix = Fix::new(postgres);
    let a = fix.target(&fix.statements(true, true)).unwrap();
    let before = fix.rows();
    // One memory at one version: one row, not m1 at v2, not m2, not the other tenant's.
    let scope = memory("acme", "alice", "m1", Some("v1"));
    assert_eq!(a.check_scope(&scope).unwrap(), Applicability::Applies);
    let inv = a.inventory(&scope).unwrap();
    assert_eq!(inv.count, 1);
    assert_eq!(a.erase_batch(&scope, &inv.locators).unwrap(), 1);
    assert_eq!(a.verify(&scope, &inv.locators).unwrap(), 0);
    assert_eq!(a.erase_batch(&scope, &inv.locators).unwrap(), 0, "idempotent");
    let after = fix.rows();
    conformance::assert_only_removed(&before, &after, 1, &|r| {
        String::from_utf8_lossy(&r.bytes).contains("|acme|alice|m1|v1|")
    });
    // Without a version, a statement that uses :version cannot run.
    let e = a
        .inventory(&memory("acme", "alice", "m1", None))
        .unwrap_err();
    assert!(matches!(e, AdapterError::Inexpressible { .. }), "{e}");
    // A tenant scope: every acme summary, no globex row, no note.
    let case = C {
        fix: &fix,
        adapter: a,
    };
    let out = conformance::run(&case, &Scope::Tenant { tenant: Tenant::new("acme").unwrap() }, &|o| o.0 == "acme", 4);
    assert_eq!(out.inventoried, 3 * SUBJECTS.len() as u64 - 1);
    assert_eq!(
        fix.rows().iter().filter(|r| r.table == "notes").count(),
        2 * SUBJECTS.len()
    );

    // Without memory statements a memory scope is exempt, with the reason; without tenant
    // statements a tenant scope is refused.
    let b = fix.target(&fix.statements(false, false)).unwrap();
    match b.check_scope(&memory("globex", "alice", "m1", Some("v1"))).unwrap() {
        Applicability::Exempt(why) => assert!(why.contains("locate_memory"), "{why}"),
        other => panic!("{other:?}"),
    }
    let e = b
        .check_scope(&Scope::Tenant {
            tenant: Tenant::new("globex").unwrap(),
        })
        .unwrap_err();
    assert!(matches!(e, AdapterError::Inexpressible { .. }) && e.to_string().contains("sums"), "{e}");
}

#[test]
fn memory_and_tenant_scopes_on_sqlite() {
    memory_and_tenant_scopes_on(false);
}

#[test]
fn memory_and_tenant_scopes_on_postgres() {
    memory_and_tenant_scopes_on(true);
}

/// A config refused at load: the message names the target and what to fix, never an
/// identifier.
fn refused_at_load(fix: &Fix, statements: &str, says: &str) {
    let mut table = fix.toml(statements);
    table.insert("name".into(), "sums".into());
    table.insert("kind".into(), "sql".into());
    table.insert("class".into(), "summary".into());
    let e = crate::registry::build(1, table, Path::new("."))
        .err()
        .unwrap_or_else(|| panic!("accepted: {statements}"))
        .to_string();
    assert!(e.contains("target sums") && e.contains(says), "{e}");
}

/// A target that loads and is refused at probe, and by every operation after: nothing touched.
fn refused_at_probe(fix: &Fix, statements: &str, says: &str) {
    let before = fix.rows();
    let a = fix.target(statements).unwrap_or_else(|e| panic!("{e}: {statements}"));
    let e = a.probe().expect_err(statements);
    let shown = e.to_string();
    assert!(
        matches!(e, AdapterError::Failed { .. }) && shown.contains("target sums") && shown.contains(says),
        "{shown}"
    );
    for s in SUBJECTS.iter().filter(|s| **s != ":tenant") {
        assert!(!shown.contains(s), "{shown}");
    }
    let scope = subject("acme", "alice");
    assert!(a.inventory(&scope).is_err());
    assert!(a.erase_batch(&scope, &[("1".into(), 1)]).is_err());
    assert!(a.verify(&scope, &[]).is_err());
    assert_eq!(fix.rows(), before, "nothing touched");
}

fn bad_statements_on(postgres: bool) {
    let fix = Fix::new(postgres);
    let t = fix.table();
    let good = fix.statements(false, false);
    let with = |key: &str, sql: &str| {
        let mut out: Vec<String> = good
            .lines()
            .filter(|l| !l.starts_with(&format!("{key} =")))
            .map(str::to_string)
            .collect();
        out.push(format!("{key} = {sql:?}"));
        out.join("\n")
    };
    let who = "tenant_id = :tenant AND user_id = :subject";
    // Refused at load, by form.
    refused_at_load(&fix, &with("locate", &format!("DELETE FROM {t} WHERE {who} RETURNING id, 1")), "must be a query");
    refused_at_load(&fix, &with("locate", &format!("UPDATE {t} SET body = '' WHERE {who}")), "must be a query");
    refused_at_load(&fix, &with("erase", "DELETE FROM notes WHERE id = :locator"), "DELETE FROM the declared table");
    refused_at_load(&fix, &with("verify", &format!("SELECT count(*) FROM {t} WHERE {who}; DELETE FROM {t}")), "more than one statement");
    refused_at_load(&fix, &with("verify", &format!("SELECT count(*) FROM {t} WHERE {who} AND body = :body")), "unknown parameter :body");
    refused_at_load(&fix, &with("locate", &format!("SELECT id, 1 FROM {t} WHERE tenant_id = :tenant")), "does not use :subject");
    refused_at_load(&fix, &with("locate", &format!("SELECT id, 1 FROM {t} WHERE {who} AND memory_id = :memory_id")), "does not give");
    refused_at_load(&fix, &with("erase", &format!("DELETE FROM {t} WHERE user_id = :subject")), "does not use :locator");
    // A `:tenant` inside a literal is no parameter: this locate uses only :subject.
    refused_at_load(&fix, &with("locate", &format!("SELECT id, 1 FROM {t} WHERE tenant_id = ':tenant' AND user_id = :subject")), "does not use :tenant");

    // Refused at probe, by the engine.
    if postgres {
        refused_at_probe(&fix, &with("locate", &format!("WITH d AS (DELETE FROM notes RETURNING id, tenant_id, user_id) SELECT id, 1 FROM d WHERE {who} IS NOT NULL")), "not read-only");
        refused_at_probe(&fix, &with("locate", &format!("SELECT id, 1 FROM {t} WHERE {who} FOR UPDATE")), "not read-only");
        // A bare name the statement resolves elsewhere than the declared table.
        fix.exec("CREATE SCHEMA app; CREATE TABLE app.summaries (LIKE public.summaries)");
        let mut other = fix.toml(&good.replace("DELETE FROM public.summaries", "DELETE FROM summaries"));
        other.insert("table".into(), "app.summaries".into());
        let before = fix.rows();
        let a = Config::parse(other, Path::new(".")).unwrap().build("sums");
        let e = a.probe().unwrap_err().to_string();
        assert!(e.contains("must delete from `app.summaries` only"), "{e}");
        assert_eq!(fix.rows(), before);
    } else {
        // SQLite's CTEs cannot write: the statement does not parse.
        refused_at_probe(&fix, &with("locate", &format!("WITH d AS (DELETE FROM notes RETURNING id, tenant_id, user_id) SELECT id, 1 FROM d WHERE {who} IS NOT NULL")), "`locate`");
        refused_at_probe(&fix, &with("locate", &format!("SELECT id FROM {t} WHERE {who}")), "returns 1 columns");
    }
    refused_at_probe(&fix, &with("verify", &format!("SELECT count(*), 1 FROM {t} WHERE {who}")), "must return 1");
    refused_at_probe(&fix, &with("locate", &format!("SELECT id, 1 FROM {t} WHERE {who} AND nosuchcolumn = 1")), "`locate`");
    // A trigger that deletes elsewhere when a summary goes.
    let trigger = if postgres {
        "CREATE FUNCTION gone() RETURNS trigger LANGUAGE plpgsql AS $$ BEGIN DELETE FROM notes; RETURN OLD; END $$;
         CREATE TRIGGER gone BEFORE DELETE ON summaries FOR EACH ROW EXECUTE FUNCTION gone();"
    } else {
        "CREATE TRIGGER gone AFTER DELETE ON summaries BEGIN DELETE FROM notes; END;"
    };
    fix.exec(trigger);
    refused_at_probe(&fix, &good, "trigger gone");
    fix.exec(if postgres {
        "DROP TRIGGER gone ON summaries"
    } else {
        "DROP TRIGGER gone"
    });

    // `:tenant` in a literal is text, and the statement works: a body that spells it is kept.
    let a = fix
        .target(&with("verify", &format!("SELECT count(*) FROM {t} WHERE {who} AND body <> ':tenant'")))
        .unwrap();
    a.probe().unwrap();
    assert_eq!(a.verify(&subject("acme", ":tenant"), &[]).unwrap(), 3);
}

#[test]
fn bad_statements_on_sqlite() {
    bad_statements_on(false);
}

#[test]
fn bad_statements_on_postgres() {
    bad_statements_on(true);
}

fn anomaly_guard_on(postgres: bool) {
    let fix = Fix::new(postgres);
    let t = fix.table();
    let id = if postgres { ":locator::integer" } else { ":locator" };
    // Each locator accounts for one row, but the erase deletes every row of its user.
    let wide = fix.statements(false, false).replace(
        &format!("DELETE FROM {t} WHERE id = {id}"),
        &format!("DELETE FROM {t} WHERE user_id = (SELECT user_id FROM {t} WHERE id = {id})"),
    );
    let a = fix.target(&wide).unwrap();
    a.probe().unwrap();
    let scope = subject("acme", "alice");
    let inv = a.inventory(&scope).unwrap();
    assert_eq!(inv.count, 3);
    let before = fix.rows();
    let e = a.erase_batch(&scope, &inv.locators[..1]).unwrap_err();
    assert!(matches!(e, AdapterError::AnomalousVolume { expected: 1, .. }), "{e}");
    assert_eq!(fix.rows(), before, "the batch rolled back");
    // And the honest statement erases exactly the batch.
    let a = fix.target(&fix.statements(false, false)).unwrap();
    assert_eq!(a.erase_batch(&scope, &inv.locators[..1]).unwrap(), 1);
    // A row written after the inventory is residue: verify counts it.
    let rest = &inv.locators[1..];
    assert_eq!(a.erase_batch(&scope, rest).unwrap(), 2);
    fix.insert("summaries", &["999", "acme", "alice", "m9", "v1", "late"]);
    assert_eq!(a.verify(&scope, &inv.locators).unwrap(), 1);
}

#[test]
fn anomaly_guard_on_sqlite() {
    anomaly_guard_on(false);
}

#[test]
fn anomaly_guard_on_postgres() {
    anomaly_guard_on(true);
}
