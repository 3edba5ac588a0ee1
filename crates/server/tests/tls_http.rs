//! `lethe serve` over TLS (`[serve] tls`): a client trusting the deployment's CA is answered;
//! one trusting another CA, and a plain-HTTP request to the TLS port, are not. Bad PEM files are
//! refused with a message naming the file. Certificates made by the openssl CLI for the test.

mod common;

use std::path::Path;
use std::process::Command;
use std::sync::Arc;
use std::time::Duration;

use lethe_client::Client;
use lethe_core::clock::SystemClock;
use lethe_engine::config::Role;
use lethe_engine::{Config, Engine};
use lethe_journal::Journal;
use lethe_server::{Dpo, Hooks, Server, Token};

const OPERATOR: &str = "operator-token-for-tests-0001";

fn openssl(dir: &Path, args: &[&str]) {
    let out = Command::new("openssl")
        .current_dir(dir)
        .args(args)
        .output()
        .expect("the openssl CLI (scripts/test's prerequisites)");
    assert!(
        out.status.success(),
        "openssl {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// A CA, another CA, and a server certificate for 127.0.0.1 signed by the first.
fn certificates(dir: &Path) {
    for ca in ["ca", "wrong-ca"] {
        openssl(
            dir,
            &[
                "req",
                "-x509",
                "-newkey",
                "rsa:2048",
                "-nodes",
                "-days",
                "2",
                "-subj",
                &format!("/CN=lethe test {ca}"),
                "-keyout",
                &format!("{ca}.key"),
                "-out",
                &format!("{ca}.crt"),
            ],
        );
    }
    std::fs::write(
        dir.join("server.ext"),
        "subjectAltName=IP:127.0.0.1,DNS:localhost\nbasicConstraints=CA:FALSE\nextendedKeyUsage=serverAuth\n",
    )
    .unwrap();
    openssl(
        dir,
        &[
            "req",
            "-newkey",
            "rsa:2048",
            "-nodes",
            "-subj",
            "/CN=127.0.0.1",
            "-keyout",
            "server.key",
            "-out",
            "server.csr",
        ],
    );
    openssl(
        dir,
        &[
            "x509",
            "-req",
            "-in",
            "server.csr",
            "-CA",
            "ca.crt",
            "-CAkey",
            "ca.key",
            "-CAcreateserial",
            "-days",
            "2",
            "-extfile",
            "server.ext",
            "-out",
            "server.crt",
        ],
    );
}

#[test]
fn serve_speaks_tls_to_clients_that_trust_its_ca_and_nothing_else() {
    let dir = tempfile::tempdir().unwrap();
    certificates(dir.path());
    let p = |f: &str| dir.path().join(f);
    // Bad files: refused, naming the file, quoting nothing of it.
    std::fs::write(p("empty.pem"), "not a certificate\n").unwrap();
    let e = lethe_server::tls_config(&p("empty.pem"), &p("server.key")).unwrap_err();
    assert!(e.contains("cert_file") && e.contains("empty.pem"), "{e}");
    let e = lethe_server::tls_config(&p("server.crt"), &p("empty.pem")).unwrap_err();
    assert!(e.contains("key_file"), "{e}");
    let e = lethe_server::tls_config(&p("server.crt"), &p("ca.key")).unwrap_err();
    assert!(e.contains("do not go together"), "{e}");

    lethe_test_support::copy_memory(dir.path());
    let journal = format!("sqlite:{}", dir.path().join("journal.db").display());
    let config = format!(
        "[control]\njournal = \"{journal}\"\npolicy_version = \"test-1\"\n\n{}",
        lethe_test_support::TARGETS
    );
    let cfg = Config::parse(&config, dir.path(), "test").unwrap();
    let engine = Arc::new(Engine::open(cfg, Arc::new(SystemClock)).unwrap());
    let open = || Journal::open_url(&journal, dir.path()).unwrap();
    let s = common::spawn(Server {
        engine,
        journals: vec![open()],
        watcher_journal: open(),
        tokens: vec![Token::new(OPERATOR, Role::Operator, "platform")],
        dpo: Dpo::default(),
        clock: Arc::new(SystemClock),
        hooks: Hooks::default(),
        sweep_every: Duration::from_secs(3600),
        idle_timeout: lethe_server::IDLE_TIMEOUT,
        tls: Some(lethe_server::tls_config(&p("server.crt"), &p("server.key")).unwrap()),
        postgres: None,
    });
    let url = format!("https://{}", s.addr);
    let trusted = Client::new(&url, OPERATOR)
        .with_ca_file(p("ca.crt"))
        .unwrap();
    assert_eq!(trusted.jobs().unwrap(), serde_json::json!([]));
    // Another CA's client refuses the server; so does one with the system's roots only.
    let other = Client::new(&url, OPERATOR)
        .with_ca_file(p("wrong-ca.crt"))
        .unwrap();
    assert!(other.jobs().is_err());
    assert!(Client::new(&url, OPERATOR).jobs().is_err());
    // Plain HTTP to the TLS port gets no HTTP answer.
    assert!(Client::new(&s.addr, OPERATOR).jobs().is_err());
    // And the server still answers the trusted client afterwards.
    assert_eq!(trusted.jobs().unwrap(), serde_json::json!([]));
    let _ = s.stop.send(());
    s.thread.join().unwrap().unwrap();
}
