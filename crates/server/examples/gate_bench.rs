//! The gate's benchmark driver (bench/gate/run.sh calls it; see bench/README.md, "Gate").
//!
//! ```text
//! gate_bench memory JOURNAL_URL SECONDS              take+release on the in-process gate
//!                                                     (lethe-gate: permits in memory), one thread
//! gate_bench inproc JOURNAL_URL SECONDS              take+release on the journal's gate (permits
//!                                                     as rows), one thread, no HTTP
//! gate_bench http ADDR TOKEN CLIENTS SECONDS          take+release over HTTP, CLIENTS threads
//! gate_bench http-swap ADDR TOKEN CLIENTS SECONDS     the same, each take releasing the permit
//!                                                     of the cycle before (one request a cycle)
//! gate_bench floor PG_URL CLIENTS SECONDS [async]     INSERT + UPDATE of one row per cycle:
//!                                                     what PostgreSQL itself costs; with
//!                                                     `async`, the UPDATE commits without
//!                                                     waiting for the WAL flush, on a second
//!                                                     connection (as `lethe serve` ends permits)
//! gate_bench freeze PG_URL N                          fence-close latency, N freezes
//! gate_bench revocation ADDR TOKEN JOURNAL_URL N      revocation push latency: from a freeze's
//!                                                     commit to the event on an open stream
//! ```
//!
//! Prints one JSON object: cycles, seconds, cycles_per_s, p50_us, p99_us, max_us (per cycle).

use std::sync::atomic::{AtomicBool, Ordering::SeqCst};
use std::sync::Arc;
use std::time::{Duration, Instant};

use lethe_core::{Basis, Scope, Subject, Tenant};
use lethe_gate::Sink;
use lethe_journal::jobs::NewJob;
use lethe_journal::Journal;
use serde_json::json;

fn percentile(sorted: &[u64], p: f64) -> u64 {
    if sorted.is_empty() {
        return 0;
    }
    sorted[((sorted.len() - 1) as f64 * p).round() as usize]
}

/// `lat_us` holds nanoseconds; reported in microseconds.
fn report(mode: &str, mut lat_us: Vec<u64>, elapsed: Duration, extra: serde_json::Value) {
    lat_us.sort_unstable();
    let n = lat_us.len();
    let mut out = json!({
        "mode": mode,
        "cycles": n,
        "seconds": elapsed.as_secs_f64(),
        "cycles_per_s": n as f64 / elapsed.as_secs_f64(),
        "p50_us": percentile(&lat_us, 0.50) as f64 / 1000.0,
        "p99_us": percentile(&lat_us, 0.99) as f64 / 1000.0,
        "max_us": lat_us.last().copied().unwrap_or(0) as f64 / 1000.0,
    });
    if let (Some(o), Some(e)) = (out.as_object_mut(), extra.as_object()) {
        o.extend(e.clone());
    }
    println!("{out}");
}

/// Runs `cycle` on `clients` threads for `secs`; returns per-cycle latencies and elapsed time.
fn drive<S: Send + 'static>(
    clients: usize,
    secs: u64,
    setup: impl Fn(usize) -> S + Send + Sync + 'static,
    cycle: impl Fn(&mut S) + Send + Sync + 'static,
) -> (Vec<u64>, Duration) {
    let stop = Arc::new(AtomicBool::new(false));
    let setup = Arc::new(setup);
    let cycle = Arc::new(cycle);
    let barrier = Arc::new(std::sync::Barrier::new(clients + 1));
    let threads: Vec<_> = (0..clients)
        .map(|i| {
            let (stop, setup, cycle, barrier) = (
                Arc::clone(&stop),
                Arc::clone(&setup),
                Arc::clone(&cycle),
                Arc::clone(&barrier),
            );
            std::thread::spawn(move || {
                let mut s = setup(i);
                // Warm-up: connections, prepared statements.
                for _ in 0..50 {
                    cycle(&mut s);
                }
                barrier.wait();
                let mut lat = Vec::with_capacity(1 << 16);
                while !stop.load(SeqCst) {
                    let t = Instant::now();
                    cycle(&mut s);
                    lat.push(t.elapsed().as_nanos() as u64);
                }
                lat
            })
        })
        .collect();
    barrier.wait();
    let t0 = Instant::now();
    while t0.elapsed() < Duration::from_secs(secs) {
        std::thread::park_timeout(Duration::from_millis(50));
    }
    stop.store(true, SeqCst);
    let elapsed = t0.elapsed();
    let mut all = Vec::new();
    for t in threads {
        all.extend(t.join().unwrap());
    }
    (all, elapsed)
}

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let arg = |i: usize| {
        args.get(i)
            .cloned()
            .unwrap_or_else(|| panic!("missing argument {i}; see the doc comment"))
    };
    let now = time::OffsetDateTime::now_utc();
    let tenant = Tenant::new("bench").unwrap();
    match arg(0).as_str() {
        "memory" => {
            let url = arg(1);
            let secs: u64 = arg(2).parse().unwrap();
            let (lat, el) = drive(
                1,
                secs,
                move |_| {
                    let j = Journal::open_url(&url, std::path::Path::new(".")).unwrap();
                    let g = lethe_gate::MemoryGate::load(&j).unwrap();
                    let subject = Subject::new("memory-0").unwrap();
                    let lease = g
                        .take_lease(
                            now,
                            &Tenant::new("bench").unwrap(),
                            &subject,
                            &[],
                            Duration::from_secs(3600),
                        )
                        .unwrap();
                    (g, lease.id)
                },
                move |(g, lease)| {
                    let p = g.take_permit(now, *lease, Sink::State).unwrap();
                    g.release_permit(p.id).unwrap();
                },
            );
            report("memory", lat, el, json!({"clients": 1}));
        }
        "inproc" => {
            let url = arg(1);
            let secs: u64 = arg(2).parse().unwrap();
            let (lat, el) = drive(
                1,
                secs,
                move |_| {
                    let j = Journal::open_url(&url, std::path::Path::new(".")).unwrap();
                    let subject = Subject::new("inproc-0").unwrap();
                    let lease = j
                        .take_lease(
                            now,
                            &Tenant::new("bench").unwrap(),
                            &subject,
                            &[],
                            Duration::from_secs(3600),
                        )
                        .unwrap();
                    (j, lease.id)
                },
                move |(j, lease)| {
                    let p = j.take_permit(now, *lease, Sink::State).unwrap();
                    j.release_permit(p.id).unwrap();
                },
            );
            report("inproc", lat, el, json!({"clients": 1}));
        }
        "http" => {
            let (addr, token) = (arg(1), arg(2));
            let clients: usize = arg(3).parse().unwrap();
            let secs: u64 = arg(4).parse().unwrap();
            let (lat, el) = drive(
                clients,
                secs,
                move |i| {
                    let c = lethe_client::Client::new(addr.clone(), token.clone());
                    let lease = c
                        .take_lease("bench", &format!("http-{i}"), &[], 3_600_000)
                        .unwrap();
                    (c, lease.lease_id)
                },
                |(c, lease)| {
                    let p = c.take_permit(*lease, lethe_client::Sink::State).unwrap();
                    c.release_permit(p).unwrap();
                },
            );
            report("http", lat, el, json!({"clients": clients}));
        }
        "http-swap" => {
            let (addr, token) = (arg(1), arg(2));
            let clients: usize = arg(3).parse().unwrap();
            let secs: u64 = arg(4).parse().unwrap();
            let (lat, el) = drive(
                clients,
                secs,
                move |i| {
                    let c = lethe_client::Client::new(addr.clone(), token.clone());
                    let lease = c
                        .take_lease("bench", &format!("swap-{i}"), &[], 3_600_000)
                        .unwrap();
                    let held = c
                        .take_permit(lease.lease_id, lethe_client::Sink::State)
                        .unwrap();
                    (c, lease.lease_id, held)
                },
                |(c, lease, held)| {
                    let (p, released) = c
                        .take_permit_releasing(*lease, lethe_client::Sink::State, held)
                        .unwrap();
                    assert!(released, "the permit of the cycle before was active");
                    *held = p;
                },
            );
            report("http-swap", lat, el, json!({"clients": clients}));
        }
        "floor" => {
            let url = arg(1);
            let clients: usize = arg(2).parse().unwrap();
            let secs: u64 = arg(3).parse().unwrap();
            let asynchronous = args.get(4).map(String::as_str) == Some("async");
            let mut c = postgres::Client::connect(&url, postgres::NoTls).unwrap();
            c.batch_execute(
                "DROP TABLE IF EXISTS bench_floor; CREATE TABLE bench_floor (id BIGINT GENERATED BY DEFAULT AS IDENTITY PRIMARY KEY, lease BIGINT NOT NULL, state TEXT NOT NULL)",
            )
            .unwrap();
            let (lat, el) = drive(
                clients,
                secs,
                move |i| {
                    let mut c = postgres::Client::connect(&url, postgres::NoTls).unwrap();
                    let mut e = postgres::Client::connect(&url, postgres::NoTls).unwrap();
                    if asynchronous {
                        e.batch_execute("SET synchronous_commit = off").unwrap();
                    }
                    let ins = c.prepare("INSERT INTO bench_floor (lease, state) VALUES ($1, 'active') RETURNING id").unwrap();
                    let upd = e.prepare("UPDATE bench_floor SET state = 'released' WHERE id = $1 AND state = 'active'").unwrap();
                    (c, e, ins, upd, i as i64)
                },
                |(c, e, ins, upd, lease)| {
                    let id: i64 = c.query_one(&*ins, &[lease]).unwrap().get(0);
                    e.execute(&*upd, &[&id]).unwrap();
                },
            );
            report(
                "floor",
                lat,
                el,
                json!({"clients": clients, "async": asynchronous}),
            );
        }
        "freeze" => {
            let url = arg(1);
            let n: usize = arg(2).parse().unwrap();
            let j = Journal::open_url(&url, std::path::Path::new(".")).unwrap();
            let mut lat = Vec::new();
            let t0 = Instant::now();
            let run = std::process::id();
            for i in 0..n {
                // Each freeze has a live lease and an active permit to revoke and record.
                let subject = Subject::new(format!("freeze-{run}-{i}")).unwrap();
                let lease = j
                    .take_lease(now, &tenant, &subject, &[], Duration::from_secs(3600))
                    .unwrap();
                let permit = j.take_permit(now, lease.id, Sink::Tool).unwrap();
                let scope = Scope::Subject {
                    tenant: tenant.clone(),
                    subject,
                };
                let (job, _) = j
                    .create_job(&NewJob {
                        job_id: format!("del-bench-{run}-{i}"),
                        scope_hash: format!("hmac:bench-{run}-{i}"),
                        scope,
                        basis: Basis::GdprArt17,
                        ticket: "BENCH".into(),
                        policy_version: "bench".into(),
                        deadline: now.date(),
                        extension_reason: None,
                        requested_at: "2026-12-02T00:00:00Z".into(),
                        version_at_request: None,
                    })
                    .unwrap();
                let t = Instant::now();
                let f = j.freeze("2026-12-02T00:00:00Z", &job.job_id, None).unwrap();
                lat.push(t.elapsed().as_nanos() as u64);
                assert_eq!((f.revoked_leases, f.permits_to_drain), (1, 1));
                j.release_permit(permit.id).unwrap();
            }
            report("freeze", lat, t0.elapsed(), json!({}));
        }
        "revocation" => {
            let (addr, token, url) = (arg(1), arg(2), arg(3));
            let n: usize = arg(4).parse().unwrap();
            let j = Journal::open_url(&url, std::path::Path::new(".")).unwrap();
            let c = lethe_client::Client::new(addr, token);
            let run = std::process::id();
            let mut lat = Vec::new();
            let t0 = Instant::now();
            for i in 0..n {
                let subject = format!("revoke-{run}-{i}");
                let lease = c.take_lease("bench", &subject, &[], 3_600_000).unwrap();
                let mut stream = c.revocations(&[lease.lease_id]).unwrap();
                let scope = Scope::Subject {
                    tenant: tenant.clone(),
                    subject: Subject::new(subject).unwrap(),
                };
                let (job, _) = j
                    .create_job(&NewJob {
                        job_id: format!("del-rv-{run}-{i}"),
                        scope_hash: format!("hmac:rv-{run}-{i}"),
                        scope,
                        basis: Basis::GdprArt17,
                        ticket: "BENCH".into(),
                        policy_version: "bench".into(),
                        deadline: now.date(),
                        extension_reason: None,
                        requested_at: "2026-12-02T00:00:00Z".into(),
                        version_at_request: None,
                    })
                    .unwrap();
                j.freeze("2026-12-02T00:00:00Z", &job.job_id, None).unwrap();
                let committed = Instant::now();
                assert_eq!(stream.next_revoked().unwrap(), Some(lease.lease_id));
                lat.push(committed.elapsed().as_nanos() as u64);
            }
            report("revocation", lat, t0.elapsed(), json!({}));
        }
        other => panic!("unknown mode {other}; see the doc comment"),
    }
}
