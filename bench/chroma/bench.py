"""bench/chroma: seed two identical collections on a Chroma server, then erase one subject from
each: from the first through Lethe's `chroma` adapter (the chroma_bench example: inventory,
erase by ids and filter in batches, verify), from the second with Chroma's own
`collection.delete(where=...)` followed by a `get(where=...)` that checks nothing is left (the
floor). Both must leave every other document; prints a Markdown table and writes JSON.

Usage: bench.py --url URL --bench-bin PATH [--docs 200000] [--subject-docs 2000] [--out FILE]
"""
import argparse, json, os, random, resource, subprocess, sys, time, urllib.parse

import chromadb

p = argparse.ArgumentParser()
p.add_argument("--url", required=True)
p.add_argument("--bench-bin", required=True)
p.add_argument("--docs", type=int, default=200_000)
p.add_argument("--subject-docs", type=int, default=2_000)
p.add_argument("--subjects", type=int, default=100)
p.add_argument("--dim", type=int, default=16)
p.add_argument("--out")
a = p.parse_args()

u = urllib.parse.urlparse(a.url)
client = chromadb.HttpClient(host=u.hostname, port=u.port)
TENANT, SUBJECT = "acme", "alice"
run = f"bench-{os.getpid()}"


def log(*m):
    print(*m, file=sys.stderr, flush=True)


def seed(name):
    """The same documents each time: the subject's spread evenly through the collection."""
    rng = random.Random(7)
    c = client.create_collection(name, metadata={"hnsw:space": "l2"})
    step = a.docs // a.subject_docs
    batch = 5_000
    t0 = time.time()
    for start in range(0, a.docs, batch):
        ids, docs, metas, embs = [], [], [], []
        for i in range(start, min(start + batch, a.docs)):
            if i % step == 0 and i // step < a.subject_docs:
                t, s = TENANT, SUBJECT
            else:
                t, s = TENANT, f"user{i % (a.subjects - 1)}"
            ids.append(f"doc-{i:07d}")
            docs.append(f"memory {i} of {s}: a sentence or two the agent kept about them")
            metas.append({"tenant_id": t, "user_id": s, "n": i})
            embs.append([rng.random() for _ in range(a.dim)])
        c.add(ids=ids, documents=docs, metadatas=metas, embeddings=embs)
    log(f"seeded {name}: {c.count()} documents in {time.time() - t0:.0f} s")
    return c


def where():
    return {"$and": [{"tenant_id": {"$eq": TENANT}}, {"user_id": {"$eq": SUBJECT}}]}


lethe_coll, floor_coll = seed(f"{run}-lethe"), seed(f"{run}-floor")
try:
    out = subprocess.run([a.bench_bin, a.url, lethe_coll.name, TENANT, SUBJECT],
                         check=True, capture_output=True, text=True).stdout
    lethe = json.loads(out.strip().splitlines()[-1])
    assert lethe["erased"] == a.subject_docs and lethe["residue"] == 0, lethe
    assert lethe_coll.count() == a.docs - a.subject_docs

    t0 = time.perf_counter()
    floor_coll.delete(where=where())
    t1 = time.perf_counter()
    left = len(floor_coll.get(where=where(), include=[])["ids"])
    t2 = time.perf_counter()
    assert left == 0 and floor_coll.count() == a.docs - a.subject_docs
    floor = {"delete_ms": (t1 - t0) * 1e3, "verify_ms": (t2 - t1) * 1e3, "total_ms": (t2 - t0) * 1e3,
             # The Python process as a whole (chromadb's client imports numpy and more).
             "peak_rss_kib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss}
finally:
    for c in (lethe_coll, floor_coll):
        client.delete_collection(c.name)

result = {"docs": a.docs, "subject_docs": a.subject_docs, "lethe": lethe, "floor": floor,
          "ratio": lethe["total_ms"] / floor["total_ms"]}
if a.out:
    with open(a.out, "w") as f:
        json.dump(result, f, indent=2)
print(f"| | time (ms) | peak RSS of the client (MiB) |\n|---|---|---|")
print(f"| Lethe `chroma` adapter: inventory {lethe['inventory_ms']:.0f} + erase {lethe['erase_ms']:.0f} + verify {lethe['verify_ms']:.0f} | {lethe['total_ms']:.0f} | {lethe['peak_rss_kib'] / 1024:.1f} |")
print(f"| Chroma `delete(where=...)` {floor['delete_ms']:.0f} + `get(where=...)` check {floor['verify_ms']:.0f} | {floor['total_ms']:.0f} | {floor['peak_rss_kib'] / 1024:.1f} |")
print(f"\nratio (Lethe / floor, verification included): {result['ratio']:.2f}x")
