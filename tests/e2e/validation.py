"""The validation scenario with the project's own data: snapshots of every subject's rows and
keys, and their comparison after an erasure.

    validation.py redis-seed MANIFEST REDIS_URL       session-cache keys and node-cache entries
    validation.py chroma-seed MANIFEST CHROMA_URL     a Chroma collection of every subject's memories
    validation.py phoenix-seed MANIFEST PHOENIX_URL   Phoenix traces of every subject's runs
    validation.py snapshot MANIFEST PG_URL REDIS_URL OUT [CHROMA_URL [PHOENIX_URL]]  ('' for none)
    validation.py compare MANIFEST BEFORE AFTER TENANT SUBJECT

The database is one `scripts/pg seed-small` wrote through real LangGraph; MANIFEST is its
manifest (subjects, their threads and store prefixes). A snapshot holds, per subject, every row
of LangGraph's checkpoint tables for its threads, its thread_registry rows, its store and
store_vectors rows (namespace labels matched exactly), and its Redis keys with their values
(DUMP) and whether they expire. `compare` exits 1 unless the erased subject has nothing left
and every other subject kept every row and key, byte for byte.
"""

import json
import os
import sys
from typing import TypedDict

import psycopg
import redis

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "..", "clients", "python"))

# Key layout of the session cache: `{tenant}:{subject}:...`. A subject whose identifiers hold
# the separator has no keys: its keys would be another subject's too.
SEP = ":"


def subjects(manifest):
    return json.load(open(manifest))["subjects"]


def cache_prefix(s):
    t, u = s["tenant_id"], s["user_id"]
    if SEP in t or SEP in u:
        return None
    return f"{t}{SEP}{u}{SEP}"


def redis_seed(manifest, url):
    r = redis.Redis.from_url(url)
    r.flushdb()
    for s in subjects(manifest):
        p = cache_prefix(s)
        if p is None:
            continue
        r.set(p + "session:last-prompt", f"prompt of {s['user_id']}")
        r.hset(p + "profile", mapping={"name": s["user_id"], "tier": "gold"})
        r.rpush(p + "history", "q1", "q2", "q3")
        r.set(p + "session:expiring", "soon", ex=3600)


def needle(s):
    """Text only this subject's cache entries hold."""
    return f"<<{s['tenant_id']}/{s['user_id']}>>"


def node_cache_seed(manifest, url):
    """LangGraph's node cache, written by real LangGraph: for every subject, one entry through
    plain ``RedisCache`` (a legacy entry: no index lists it) and one through the package's
    ``IndexedRedisCache`` under the subject's binding (its index set lists it)."""
    from langgraph.cache.redis import RedisCache
    from langgraph.graph import END, START, StateGraph
    from langgraph.types import CachePolicy
    from lethe_gate.cache import IndexedRedisCache, subject

    class State(TypedDict):
        question: str
        answer: str

    def respond(state):
        return {"answer": f"answer to {state['question']}"}

    def graph(cache):
        g = StateGraph(State)
        g.add_node("respond", respond, cache_policy=CachePolicy())
        g.add_edge(START, "respond")
        g.add_edge("respond", END)
        return g.compile(cache=cache)

    r = redis.Redis.from_url(url)
    legacy, indexed = graph(RedisCache(r)), graph(IndexedRedisCache(r))
    for s in subjects(manifest):
        if SEP in s["tenant_id"]:
            continue  # the index layout cannot tell such a tenant apart: the package refuses
        legacy.invoke({"question": f"legacy question of {needle(s)}"})
        with subject(s["tenant_id"], s["user_id"]):
            indexed.invoke({"question": f"indexed question of {needle(s)}"})


def value(r, k):
    """A key's value as text can be searched in: a string's bytes (DUMP may compress them),
    any other type's DUMP."""
    if r.type(k) == b"string":
        return r.get(k) or b""
    return r.dump(k) or b""


CHROMA_COLLECTION = "lethe_validation_memories"


def chroma(url, method, path, body=None):
    """One call of Chroma's REST API v2 (stdlib only: the scenario's venv has no chromadb)."""
    import urllib.request

    req = urllib.request.Request(
        f"{url}/api/v2/tenants/default_tenant/databases/default_database{path}",
        data=None if body is None else json.dumps(body).encode(),
        method=method,
        headers={"content-type": "application/json"},
    )
    with urllib.request.urlopen(req, timeout=30) as r:
        text = r.read()
    return json.loads(text) if text else None


def chroma_collection(url):
    return chroma(url, "POST", "/collections", {"name": CHROMA_COLLECTION, "get_or_create": True})["id"]


def chroma_seed(manifest, url):
    """A Chroma collection of each subject's memories (two documents each, with the subject's
    text and a small vector), tenant and subject in the metadata, as an application that indexes
    its memories for recall keeps them. Dropped and made again first."""
    try:
        chroma(url, "DELETE", f"/collections/{CHROMA_COLLECTION}")
    except Exception:
        pass
    cid = chroma_collection(url)
    ids, docs, metas, vecs = [], [], [], []
    for n, s in enumerate(subjects(manifest)):
        for k in range(2):
            ids.append(f"mem-{n}-{k}")
            docs.append(f"memory {k} of {needle(s)}")
            metas.append({"tenant_id": s["tenant_id"], "user_id": s["user_id"], "k": k})
            vecs.append([float(n), float(k), 1.0])
    chroma(url, "POST", f"/collections/{cid}/add",
           {"ids": ids, "documents": docs, "metadatas": metas, "embeddings": vecs})


def chroma_snapshot(url):
    """Every document of the collection: id -> [document, metadata, embedding]."""
    cid = chroma_collection(url)
    got = chroma(url, "POST", f"/collections/{cid}/get",
                 {"include": ["documents", "metadatas", "embeddings"]})
    return {i: [d, m, e] for i, d, m, e in
            zip(got["ids"], got["documents"], got["metadatas"], got["embeddings"])}


PHOENIX_PROJECT = "lethe-validation-traces"


def phoenix(url, method, path, body=None, headers=None):
    """One call of Phoenix's HTTP API (stdlib only)."""
    import urllib.error
    import urllib.request

    req = urllib.request.Request(f"{url}{path}", data=body, method=method, headers=headers or {})
    try:
        with urllib.request.urlopen(req, timeout=30) as r:
            text = r.read()
    except urllib.error.HTTPError as e:
        if method == "DELETE" and e.code == 404:
            return None
        raise
    return json.loads(text) if text else None


def _pb(n, data):
    """A length-delimited protobuf field (OTLP's wire format, written by hand: no SDK needed)."""
    def varint(v):
        out = b""
        while v >= 0x80:
            out += bytes([(v & 0x7F) | 0x80])
            v >>= 7
        return out + bytes([v])

    return varint(n << 3 | 2) + varint(len(data)) + data


def _attr(key, value):
    return _pb(1, key.encode()) + _pb(2, _pb(1, value.encode()))


def phoenix_seed(manifest, url):
    """Phoenix traces of every subject's agent runs, sent over OTLP as an OpenInference
    instrumentation of LangGraph sends them: two traces per subject, each a root span whose
    `metadata` attribute is the run config's metadata (tenant_id, user_id, thread_id) and whose
    input holds the subject's text, and a child span without metadata. The project is dropped
    and made again first; returns once Phoenix lists every span."""
    import struct
    import time

    phoenix(url, "DELETE", f"/v1/projects/{PHOENIX_PROJECT}")
    spans, n_spans = b"", 0
    for n, s in enumerate(subjects(manifest)):
        for k in range(2):
            trace = bytes.fromhex(f"{n:016x}{k:08x}{0x1e7e:08x}")
            root, child = bytes.fromhex(f"{n:08x}{k:04x}0001"), bytes.fromhex(f"{n:08x}{k:04x}0002")
            meta = json.dumps({"tenant_id": s["tenant_id"], "user_id": s["user_id"], "thread_id": f"t-{n}-{k}"})
            t = 1_700_000_000_000_000_000 + (n * 2 + k) * 1_000_000
            times = b"\x39" + struct.pack("<Q", t) + b"\x41" + struct.pack("<Q", t + 500_000)
            spans += _pb(2, _pb(1, trace) + _pb(2, root) + _pb(5, b"LangGraph") + times
                         + _pb(9, _attr("openinference.span.kind", "CHAIN"))
                         + _pb(9, _attr("input.value", f"run {k} of {needle(s)}"))
                         + _pb(9, _attr("metadata", meta)))
            spans += _pb(2, _pb(1, trace) + _pb(2, child) + _pb(4, root) + _pb(5, b"agent") + times
                         + _pb(9, _attr("openinference.span.kind", "LLM"))
                         + _pb(9, _attr("output.value", f"answer {k} for {needle(s)}")))
            n_spans += 2
    phoenix(url, "POST", "/v1/traces", _pb(1, _pb(2, spans)),
            {"content-type": "application/x-protobuf", "x-project-name": PHOENIX_PROJECT})
    for _ in range(300):
        try:
            if len(phoenix_spans(url)) == n_spans:
                return
        except Exception:
            pass
        time.sleep(0.1)
    raise SystemExit(f"validation: Phoenix did not list the {n_spans} spans sent")


def phoenix_spans(url):
    """Every span of the project, as Phoenix's API returns it: span id -> its JSON."""
    out, cursor = {}, ""
    while True:
        page = phoenix(url, "GET", f"/v1/projects/{PHOENIX_PROJECT}/spans?sort=id&order=asc&limit=1000{cursor}")
        for sp in page["data"]:
            out[sp["context"]["span_id"]] = sp
        if not page.get("next_cursor"):
            return out
        cursor = f"&cursor={page['next_cursor']}"


def in_prefix(prefix, root):
    return prefix == root or prefix.startswith(root + ".")


def snapshot(manifest, pg_url, redis_url, out, chroma_url=None, phoenix_url=None):
    subs = subjects(manifest)
    snap = {}
    docs = chroma_snapshot(chroma_url) if chroma_url else {}
    spans = phoenix_spans(phoenix_url) if phoenix_url else {}
    # A span's owner is its trace's root metadata.
    owner = {}
    for sp in spans.values():
        m = (sp.get("attributes") or {}).get("metadata")
        if isinstance(m, str):
            m = json.loads(m)
        if isinstance(m, dict) and "user_id" in m:
            owner[sp["context"]["trace_id"]] = (m.get("tenant_id"), m.get("user_id"))
    r = redis.Redis.from_url(redis_url)
    all_keys = sorted(k.decode("utf-8", "surrogateescape") for k in r.scan_iter(count=1000))
    with psycopg.connect(pg_url) as c:
        rows = {}
        for table in ("checkpoints", "checkpoint_blobs", "checkpoint_writes"):
            rows[table] = c.execute(
                f"SELECT thread_id, row_to_json(t)::text FROM {table} t ORDER BY 2"
            ).fetchall()
        registry = c.execute(
            "SELECT tenant_id, user_id, row_to_json(t)::text FROM thread_registry t ORDER BY 3"
        ).fetchall()
        store = c.execute("SELECT prefix, row_to_json(t)::text FROM store t ORDER BY 2").fetchall()
        # store_vectors exists where the store was set up with an index (pgvector).
        has_vectors = c.execute("SELECT to_regclass('store_vectors') IS NOT NULL").fetchone()[0]
        vectors = (
            c.execute(
                "SELECT prefix, key, field_name, embedding::text FROM store_vectors "
                "ORDER BY 1, 2, 3"
            ).fetchall()
            if has_vectors
            else []
        )
    for s in subs:
        t, u = s["tenant_id"], s["user_id"]
        threads = {th["thread_id"] for th in s["threads"]}
        root = s["store_prefix"]
        got = {
            table: [row for tid, row in rows[table] if tid in threads] for table in rows
        }
        got["thread_registry"] = [row for rt, ru, row in registry if (rt, ru) == (t, u)]
        got["store"] = [row for p, row in store if in_prefix(p, root)]
        got["store_vectors"] = [list(v) for v in vectors if in_prefix(v[0], root)]
        p = cache_prefix(s)
        keys = [k for k in all_keys if p is not None and k.startswith(p)]
        got["redis"] = [[k, r.dump(k).hex(), r.ttl(k) > 0] for k in keys]
        # The node cache: the subject's index set and the entries it lists, and every key
        # whose value holds the subject's text (legacy entries included).
        idx = f"lethe:lg-cache:{t}:{u}"
        listed = sorted(m.decode() for m in r.smembers(idx)) + ([idx] if r.exists(idx) else [])
        got["node_cache"] = [[k, (r.dump(k) or b"").hex()] for k in listed]
        got["values_with_text"] = [k for k in all_keys if needle(s).encode() in value(r, k)]
        if chroma_url:
            got["chroma"] = sorted(
                [i, d, m, e] for i, (d, m, e) in docs.items()
                if (m.get("tenant_id"), m.get("user_id")) == (t, u)
            )
            got["chroma_text"] = sorted(i for i, (d, _, _) in docs.items() if needle(s) in (d or ""))
        if phoenix_url:
            got["phoenix"] = sorted(
                json.dumps(sp, sort_keys=True) for sp in spans.values()
                if owner.get(sp["context"]["trace_id"]) == (t, u)
            )
            # Any byte of the subject's text anywhere Phoenix's API shows a span.
            got["phoenix_text"] = sorted(
                i for i, sp in spans.items() if needle(s) in json.dumps(sp, ensure_ascii=False)
            )
        snap[f"{t}/{u}"] = got
    json.dump(snap, open(out, "w"), indent=1, sort_keys=True)


def compare(manifest, before_path, after_path, tenant, subject):
    before, after = json.load(open(before_path)), json.load(open(after_path))
    target = f"{tenant}/{subject}"
    problems = []
    for name, rows in after[target].items():
        if rows:
            problems.append(f"{target}: {len(rows)} {name} left")
    erased = sum(len(v) for v in before[target].values())
    if erased == 0:
        problems.append(f"{target} had nothing to erase: the scenario is wrong")
    others = [k for k in before if k != target]
    # Legacy node-cache entries (no index lists them) may be flushed with any erasure, as the
    # target's `legacy = "flush"` says: an other subject's may go, none may appear.
    flushed = 0
    for k in others:
        b, a = set(before[k].pop("values_with_text")), set(after[k].pop("values_with_text"))
        problems += [f"{k}: a value with its text appeared" for _ in a - b]
        flushed += len(b - a)
    changed = [k for k in others if before[k] != after[k]]
    problems += [f"{k}: changed" for k in changed]
    kept = sum(sum(len(v) for v in before[k].values()) for k in others)
    print(
        f"validation: {target}: {erased} rows and keys before, "
        f"{sum(len(v) for v in after[target].values())} after; "
        f"{len(others)} other subjects ({kept} rows and keys), {len(changed)} changed; "
        f"{flushed} legacy node-cache entries of others flushed"
    )
    for p in problems:
        print("  problem:", p)
    return 0 if not problems else 1


def main(argv):
    cmd, args = argv[1], argv[2:]
    if cmd == "redis-seed":
        redis_seed(*args)
        node_cache_seed(*args)
        return 0
    if cmd == "chroma-seed":
        chroma_seed(*args)
        return 0
    if cmd == "phoenix-seed":
        phoenix_seed(*args)
        return 0
    if cmd == "snapshot":
        snapshot(*args)
        return 0
    if cmd == "compare":
        return compare(*args)
    print(__doc__, file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main(sys.argv))
