//! The `chroma` adapter's side of bench/chroma (run.sh calls it): erases one subject of a
//! seeded collection through the adapter as the engine drives it (inventory, erase in the
//! target's batches, verify) and prints one JSON line of timings, counts and peak memory.
//!
//! Usage: chroma_bench URL COLLECTION TENANT SUBJECT

use std::time::Instant;

use lethe_core::{Scope, Subject, Tenant};

fn peak_rss_kib() -> u64 {
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| {
            s.lines()
                .find(|l| l.starts_with("VmHWM:"))
                .and_then(|l| l.split_whitespace().nth(1)?.parse().ok())
        })
        .unwrap_or(0)
}

fn main() {
    let args: Vec<String> = std::env::args().collect();
    let [_, url, collection, tenant, subject] = &args[..] else {
        eprintln!("usage: chroma_bench URL COLLECTION TENANT SUBJECT");
        std::process::exit(2);
    };
    let text = format!(
        "name = \"vectors\"\nkind = \"chroma\"\nclass = \"vector-index\"\nurl = \"{url}\"\ncollection = \"{collection}\"\nmetadata = {{ tenant = \"tenant_id\", subject = \"user_id\" }}\n"
    );
    let target =
        lethe_adapters::build(1, toml::from_str(&text).unwrap(), std::path::Path::new("."))
            .unwrap_or_else(|e| panic!("{e}"));
    let a = target.adapter;
    let scope = Scope::Subject {
        tenant: Tenant::new(tenant.as_str()).unwrap(),
        subject: Subject::new(subject.as_str()).unwrap(),
    };
    let t0 = Instant::now();
    a.probe().unwrap();
    let inv = a.inventory(&scope).unwrap();
    let t1 = Instant::now();
    let mut erased = 0;
    for chunk in inv.locators.chunks(a.batch_size().unwrap_or(1000)) {
        erased += a.erase_batch(&scope, chunk).unwrap();
    }
    let t2 = Instant::now();
    let residue = a.verify(&scope, &inv.locators).unwrap();
    let t3 = Instant::now();
    let ms = |a: Instant, b: Instant| (b - a).as_secs_f64() * 1e3;
    println!(
        "{{\"inventoried\": {}, \"erased\": {erased}, \"residue\": {residue}, \"inventory_ms\": {:.1}, \"erase_ms\": {:.1}, \"verify_ms\": {:.1}, \"total_ms\": {:.1}, \"peak_rss_kib\": {}}}",
        inv.count,
        ms(t0, t1),
        ms(t1, t2),
        ms(t2, t3),
        ms(t0, t3),
        peak_rss_kib()
    );
}
