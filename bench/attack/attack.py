"""The attacks of bench/attack/run.sh against a running `lethe serve`, with a tokened probe.

Traffic goes only to --addr (a loopback address run.sh started); every loop is bounded in
count and time. Standard library only.
"""

import argparse
import json
import os
import socket
import statistics
import threading
import time


def rss_kib(pid):
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    raise RuntimeError("no VmRSS")


def host_port(addr):
    host, port = addr.rsplit(":", 1)
    return host, int(port)


def status_of(addr, request, timeout):
    """Sends one request on a new connection; (status or None, seconds)."""
    started = time.monotonic()
    try:
        with socket.create_connection(host_port(addr), timeout=timeout) as s:
            s.settimeout(max(0.001, timeout - (time.monotonic() - started)))
            s.sendall(request)
            got = b""
            while b"\r\n" not in got:
                chunk = s.recv(4096)
                if not chunk:
                    break
                got += chunk
            line = got.split(b"\r\n", 1)[0].split()
            status = int(line[1]) if len(line) > 1 else None
    except OSError:
        status = None
    return status, time.monotonic() - started


class Probe(threading.Thread):
    """A runtime with a valid token: one gate call on a new connection every `every` seconds."""

    def __init__(self, addr, token, every=0.1, timeout=5.0):
        super().__init__(daemon=True)
        self.addr, self.every, self.timeout = addr, every, timeout
        self.request = (
            f"GET /v1/leases/1 HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {token}\r\n"
            "Connection: close\r\n\r\n"
        ).encode()
        self.samples = []
        self.stop = threading.Event()

    def run(self):
        while not self.stop.is_set():
            status, took = status_of(self.addr, self.request, self.timeout)
            # 404: no such lease, which is the gate's answer; anything else is a failure.
            self.samples.append((status, took))
            self.stop.wait(self.every)

    def summary(self):
        took = sorted(t for _, t in self.samples)
        answered = [t for s, t in self.samples if s == 404]
        if not took:
            return {"requests": 0}
        p99 = took[min(len(took) - 1, int(round(0.99 * (len(took) - 1))))]
        return {
            "requests": len(took),
            "answered": len(answered),
            "failed_or_timed_out": len(took) - len(answered),
            "p50_ms": round(statistics.median(took) * 1000, 2),
            "p99_ms": round(p99 * 1000, 2),
            "max_ms": round(took[-1] * 1000, 2),
        }


def probed(addr, token, seconds, attack=None):
    """Runs the probe for `seconds`, with `attack()` running meanwhile; its summary."""
    probe = Probe(addr, token)
    probe.start()
    extra = attack() if attack else {}
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        time.sleep(0.05)
    probe.stop.set()
    probe.join(10)
    return probe.summary(), extra


def body_attack(addr, pid, n, hold):
    """`n` connections without a token, each declaring a 2 MiB body, sending what the server
    takes of it within 3 s, then stalling for `hold` s. The server's RSS is sampled throughout."""
    length = 2 * 1024 * 1024
    head = (
        "POST /v1/leases HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
        f"Content-Length: {length}\r\n\r\n"
    ).encode()
    base = rss_kib(pid)
    peak = base
    socks, sent = [], []
    for _ in range(n):
        s = socket.create_connection(host_port(addr), timeout=5)
        s.sendall(head)
        s.setblocking(False)
        socks.append(s)
        sent.append(0)
    chunk = b"a" * 65536
    closed = 0
    deadline = time.monotonic() + 3
    while time.monotonic() < deadline:
        progressed = False
        for i, s in enumerate(socks):
            if s is None or sent[i] >= length - 1:
                continue
            try:
                k = s.send(chunk[: min(len(chunk), length - 1 - sent[i])])
                sent[i] += k
                progressed = progressed or k > 0
            except BlockingIOError:
                pass
            except OSError:
                s.close()
                socks[i] = None
                closed += 1
        peak = max(peak, rss_kib(pid))
        if not progressed:
            time.sleep(0.01)
    end = time.monotonic() + hold
    while time.monotonic() < end:
        peak = max(peak, rss_kib(pid))
        time.sleep(0.1)
    for s in socks:
        if s is not None:
            s.close()
    return {
        "connections": n,
        "declared_bytes_each": length,
        "sent_mib_total": round(sum(sent) / 2**20, 1),
        "closed_by_server_while_sending": closed,
        "rss_base_mib": round(base / 1024, 1),
        "rss_peak_mib": round(peak / 1024, 1),
        "rss_growth_mib": round((peak - base) / 1024, 1),
    }


def conn_attack(addr, pid, n, hold):
    """`n` idle connections without a token, opened within about 2 s and held `hold` s."""
    base = rss_kib(pid)
    socks = []
    started = time.monotonic()
    pace = 2.0 / n
    for i in range(n):
        try:
            socks.append(socket.create_connection(host_port(addr), timeout=5))
        except OSError:
            break
        lag = started + (i + 1) * pace - time.monotonic()
        if lag > 0:
            time.sleep(lag)
    opened = time.monotonic() - started
    peak = base
    end = time.monotonic() + hold
    while time.monotonic() < end:
        peak = max(peak, rss_kib(pid))
        time.sleep(0.1)
    # Which of them the server has closed: a read that ends at once.
    closed = 0
    for s in socks:
        s.setblocking(False)
        try:
            if s.recv(1) == b"":
                closed += 1
        except BlockingIOError:
            pass
        except OSError:
            closed += 1
        s.close()
    return {
        "connections": len(socks),
        "opened_in_s": round(opened, 2),
        "closed_by_server": closed,
        "rss_growth_mib": round((peak - base) / 1024, 1),
    }


def machine():
    model = "?"
    with open("/proc/cpuinfo") as f:
        for line in f:
            if line.startswith("model name"):
                model = line.split(":", 1)[1].strip()
                break
    return {"cpu": model, "cores": os.cpu_count(), "load_1_5_15": os.getloadavg()}


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--addr", required=True)
    ap.add_argument("--pid", type=int, required=True)
    ap.add_argument("--token-file", required=True)
    ap.add_argument("--hold", type=float, default=10)
    ap.add_argument("--conns", type=int, default=4100)
    ap.add_argument("--bodies", type=int, default=100)
    ap.add_argument("--commit", default="?")
    ap.add_argument("--out", required=True)
    a = ap.parse_args()
    token = open(a.token_file).read().strip()
    out = {"commit": a.commit, "machine_before": machine()}
    out["rest"], _ = probed(a.addr, token, 5)
    out["body"], out["body_attack"] = probed(
        a.addr, token, a.hold + 3, lambda: body_attack(a.addr, a.pid, a.bodies, a.hold)
    )
    time.sleep(2)
    out["conns"], out["conn_attack"] = probed(
        a.addr, token, a.hold + 2, lambda: conn_attack(a.addr, a.pid, a.conns, a.hold)
    )
    out["machine_after"] = machine()
    rest = out["rest"].get("p99_ms") or float("nan")
    for k in ("body", "conns"):
        out[k]["p99_ratio_to_rest"] = round(out[k].get("p99_ms", float("nan")) / rest, 1)
    with open(a.out, "w") as f:
        json.dump(out, f, indent=1)
    b, c = out["body_attack"], out["conn_attack"]
    print(f"commit {a.commit} on {out['machine_before']['cpu']}, load {out['machine_before']['load_1_5_15']}")
    print(f"rest   : probe p50 {out['rest']['p50_ms']} ms, p99 {out['rest']['p99_ms']} ms")
    print(
        f"body   : {b['connections']} x 2 MiB without a token: RSS {b['rss_base_mib']} -> "
        f"{b['rss_peak_mib']} MiB (+{b['rss_growth_mib']}; target <= 10), "
        f"{b['sent_mib_total']} MiB taken by the server; probe p99 {out['body']['p99_ms']} ms"
    )
    print(
        f"conns  : {c['connections']} idle without a token in {c['opened_in_s']} s, "
        f"{c['closed_by_server']} closed by the server; probe p99 {out['conns']['p99_ms']} ms "
        f"(target <= 1000), {out['conns']['failed_or_timed_out']} of {out['conns']['requests']} "
        f"failed or timed out (5 s)"
    )
    print(f"wrote {a.out}")


if __name__ == "__main__":
    main()
