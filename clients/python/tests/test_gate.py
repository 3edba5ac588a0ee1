"""The client against a real `lethe serve` (started per test class; see server.py)."""

from __future__ import annotations

import secrets
import statistics
import threading
import time
import unittest
from pathlib import Path

import lethe_gate
from lethe_gate import Fenced, Forbidden, NoSuchPermit, Refused, Revoked, Unauthorized

from .server import Server

PUSH_BOUND_S = 2.0  # generous: the gate's target is 100 ms; the measured figure is printed


def subject() -> str:
    return "s-" + secrets.token_hex(6)


class GateTest(unittest.TestCase):
    @classmethod
    def setUpClass(cls) -> None:
        cls.server = Server()
        cls.op = cls.server.client(operator=True, watch=False)

    @classmethod
    def tearDownClass(cls) -> None:
        cls.op.close()
        cls.server.stop()

    def setUp(self) -> None:
        self.rt = self.server.client()
        self.addCleanup(self.rt.close)

    def erase(self, tenant: str, subj: str | None, **kw) -> str:
        return self.op.start_job(tenant, subj, ticket="T-" + secrets.token_hex(3), **kw)["job_id"]

    def test_lease_permit_release_round_trip(self):
        s = subject()
        lease = self.rt.take_lease("acme", s, [("memories/k1", "v1")], ttl_ms=60_000)
        self.assertGreater(lease.lease_id, 0)
        self.assertNotIn(s, repr(lease))
        for sink in lethe_gate.SINKS:
            with lease.permit(sink) as p:
                self.assertIsNotNone(p.permit_id)
            self.assertEqual(p.outcome, "released")
        with self.assertRaises(NoSuchPermit):
            self.rt.release_permit(p.permit_id)  # released already: no longer active
        self.assertFalse(lease.refresh())
        self.assertFalse(lease.revoked.is_set())

    def test_only_the_holder_ends_its_permit(self):
        """Another client (another run, a stale id) naming the permit gets NoSuchPermit: a
        keyed permit ends only with the key its take carried, which only its holder knows."""
        s = subject()
        lease = self.rt.take_lease("acme", s, ttl_ms=60_000)
        pid = self.rt.take_permit(lease.lease_id, "tool")
        other = self.server.client(watch=False)
        self.addCleanup(other.close)
        with self.assertRaises(NoSuchPermit):
            other.release_permit(pid)
        with self.assertRaises(NoSuchPermit):
            other.confirm_cancelled(pid)
        self.rt.release_permit(pid)
        with self.assertRaises(NoSuchPermit):
            self.rt.release_permit(pid)

    def test_errors_are_typed_and_hold_no_identifier(self):
        s = subject()
        with lethe_gate.GateClient(self.server.url, "not-a-token", watch=False) as bad:
            with self.assertRaises(Unauthorized) as e:
                bad.take_lease("acme", s)
        self.assertEqual(e.exception.code, "unauthorized")
        self.assertNotIn(s, str(e.exception))
        with self.assertRaises(Forbidden):
            self.rt.start_job("acme", s, ticket="T-1")  # a runtime token runs no job
        with self.assertRaises(lethe_gate.BadRequest):
            self.rt.take_lease("acme", "")
        with self.assertRaises(lethe_gate.NoSuchLease):
            self.rt.take_permit(987_654_321, "tool")
        # The server's 503 (its control store did not answer) is Unavailable, as a transport
        # error is; a legal hold on a job is Held.
        from lethe_gate.errors import error_for

        self.assertIsInstance(error_for(503, "unavailable", "store"), lethe_gate.Unavailable)
        self.assertIsInstance(error_for(504, None, None), lethe_gate.Unavailable)
        self.assertIsInstance(error_for(409, "held", "hold"), lethe_gate.Held)

    def test_permit_refused_after_the_erasure_closes_the_fence(self):
        s = subject()
        lease = self.rt.take_lease("acme", s, ttl_ms=60_000)
        held = lease.permit("state").__enter__()  # taken before the freeze: must drain
        job = self.erase("acme", s)
        self.assertTrue(lease.revoked.wait(PUSH_BOUND_S), "no revocation pushed")
        with self.assertRaises(Refused) as e:
            with lease.permit("output"):
                self.fail("a permit was issued after the fence closed")
        self.assertIsInstance(e.exception, Revoked)
        # The undrained permit keeps the fence closed: new leases are refused.
        with self.assertRaises(Fenced):
            self.rt.take_lease("acme", s)
        self.assertNotEqual(self.op.job(job)["state"], "COMPLETE")
        held.__exit__(Revoked, Revoked(), None)  # the holder aborted: cancellation confirmed
        self.assertEqual(held.outcome, "cancelled")
        self.server.wait_job(self.op, job)
        # After COMPLETE the subject takes leases again, at the next epoch; the old one stays dead.
        fresh = self.rt.take_lease("acme", s)
        self.assertGreater(fresh.epoch, lease.epoch)
        with fresh.permit("tool"):
            pass
        with self.assertRaises(Refused):
            self.rt.take_permit(lease.lease_id, "tool")

    def test_a_take_releasing_the_previous_permit_releases_it_even_when_refused(self):
        s = subject()
        lease = self.rt.take_lease("acme", s, ttl_ms=60_000)
        first = self.rt.take_permit(lease.lease_id, "tool")
        second, released = self.rt.take_permit_releasing(lease.lease_id, "state", first)
        self.assertTrue(released)
        with self.assertRaises(NoSuchPermit):
            self.rt.release_permit(first)  # ended by the take
        third, released = self.rt.take_permit_releasing(lease.lease_id, "tool", first)
        self.assertFalse(released)  # not active any more: reported, not an error
        self.rt.release_permit(second)
        job = self.erase("acme", s)
        self.assertTrue(lease.revoked.wait(PUSH_BOUND_S), "no revocation pushed")
        with self.assertRaises(Revoked):
            self.rt.take_permit_releasing(lease.lease_id, "state", third)
        with self.assertRaises(NoSuchPermit):
            self.rt.release_permit(third)  # released by the refused request
        self.server.wait_job(self.op, job)  # nothing left to drain
        self.assertEqual(self.op.job(job)["state"], "COMPLETE")

    def test_revocation_is_pushed_fast(self):
        latencies = []
        for _ in range(20):
            s = subject()
            lease = self.rt.take_lease("acme", s)
            self.assertTrue(self.rt.stream_connected.wait(5), "the revocation stream did not open")
            t0 = time.monotonic()
            self.erase("acme", s)
            self.assertTrue(lease.revoked.wait(PUSH_BOUND_S), f"no push within {PUSH_BOUND_S} s")
            latencies.append(lease.revoked_at - t0)
        print(
            f"\nrevocation push, from POST /v1/jobs to the event at the client (upper bound on"
            f" freeze-to-push): p50 {statistics.median(latencies) * 1000:.1f} ms,"
            f" p90 {statistics.quantiles(latencies, n=10)[-1] * 1000:.1f} ms,"
            f" max {max(latencies) * 1000:.1f} ms over {len(latencies)} erasures"
        )
        self.assertLess(max(latencies), PUSH_BOUND_S)

    def test_one_stream_pushes_only_the_revoked_lease(self):
        s1, s2, s3 = subject(), subject(), subject()
        leases = [self.rt.take_lease("acme", s) for s in (s1, s2, s3)]
        self.assertTrue(self.rt.stream_connected.wait(5))
        self.erase("acme", s2)
        self.assertTrue(leases[1].revoked.wait(PUSH_BOUND_S))
        # A push for the others would have come on the same stream, in order, before now.
        time.sleep(0.2)
        self.assertFalse(leases[0].revoked.is_set())
        self.assertFalse(leases[2].revoked.is_set())
        for lease in (leases[0], leases[2]):
            with lease.permit("output"):
                pass

    def test_leases_past_one_streams_limit_are_watched_on_more_streams(self):
        # The gate refuses a stream of more than 10,000 leases; the client splits at its limit
        # (lowered here to 2, so five leases need three streams).
        self.rt._watcher.per_stream = 2
        subjects = [subject() for _ in range(5)]
        leases = [self.rt.take_lease("acme", s) for s in subjects]
        self.assertEqual([w.size() for w in self.rt._watcher.shards()], [2, 2, 1])
        self.assertTrue(self.rt.stream_connected.wait(5), "every stream opened")
        for i in (4, 1):  # the last stream's only lease, then one of the first stream's
            self.erase("acme", subjects[i])
            self.assertTrue(leases[i].revoked.wait(PUSH_BOUND_S), f"lease {i} got its push")
        time.sleep(0.2)
        self.assertEqual([x.revoked.is_set() for x in leases], [False, True, False, False, True])
        # A lease closed frees its place: the next one joins the stream with room.
        leases[2].close()
        extra = self.rt.take_lease("acme", subject())
        self.assertEqual(len(self.rt._watcher.shards()), 3)
        self.assertIn(extra.lease_id, self.rt._watcher.shards()[1]._leases)

    def test_more_leases_than_the_gate_lets_one_stream_list_still_get_their_push(self):
        # The server's own limits: 10,000 leases a stream, and a request line of 64 KiB, which
        # 10,000 ids of seven digits (a gate that has handed out a million leases) would pass.
        import sqlite3

        with sqlite3.connect(Path(self.server.dir.name) / "journal.db", timeout=10) as db:
            if db.execute("UPDATE sqlite_sequence SET seq = 1000000 WHERE name = 'leases'").rowcount == 0:
                db.execute("INSERT INTO sqlite_sequence (name, seq) VALUES ('leases', 1000000)")
        s = subject()
        leases = [self.rt.take_lease("acme", s) for _ in range(10_000)]
        self.assertGreater(leases[0].lease_id, 1_000_000)
        last_s = subject()
        last = self.rt.take_lease("acme", last_s)
        self.assertGreaterEqual(len(self.rt._watcher.shards()), 2)
        self.assertTrue(self.rt.stream_connected.wait(10), "every stream opened")
        self.erase("acme", last_s)
        self.assertTrue(last.revoked.wait(PUSH_BOUND_S), "the lease past the first stream got its push")
        self.assertFalse(leases[0].revoked.is_set())
        self.erase("acme", s)
        self.assertTrue(leases[0].revoked.wait(PUSH_BOUND_S), "the first stream's leases got theirs")
        for x in leases:
            x.close()

    def test_a_renewed_lease_outlives_its_first_ttl_until_an_erasure(self):
        s = subject()
        lease = self.rt.take_lease("acme", s, ttl_ms=1_000)
        first = lease.expires_ms
        lease.renew(60_000)
        self.assertGreaterEqual(lease.expires_ms, first + 58_000)
        time.sleep(1.2)  # the first TTL passes on the server's clock
        with lease.permit("tool"):
            pass
        self.server.wait_job(self.op, self.erase("acme", s))
        with self.assertRaises(Revoked):
            lease.renew()
        self.assertTrue(lease.revoked.is_set())
        short = self.rt.take_lease("acme", subject(), ttl_ms=100)
        time.sleep(0.3)
        with self.assertRaises(lethe_gate.Expired):
            short.renew()

    def test_threads_share_one_client_and_the_fence_stops_them_all(self):
        s = subject()
        lease = self.rt.take_lease("acme", s)
        granted, refused, errors = [], [], []
        freeze = threading.Barrier(9)  # 8 workers + the test, after 20 permits each

        def work() -> None:
            try:
                for i in range(40):
                    if i == 20:
                        freeze.wait(10)  # the erasure starts here
                        self.assertTrue(lease.revoked.wait(PUSH_BOUND_S))
                    try:
                        with lease.permit("tool") as p:
                            granted.append((i, p.permit_id))
                    except Refused:
                        refused.append(i)
            except Exception as e:  # noqa: BLE001 - reported below
                errors.append(e)

        workers = [threading.Thread(target=work) for _ in range(8)]
        for w in workers:
            w.start()
        freeze.wait(10)
        job = self.erase("acme", s)
        for w in workers:
            w.join(30)
        self.assertEqual(errors, [])
        self.assertEqual(len(granted), 8 * 20, "every permit before the freeze was granted")
        self.assertTrue(all(i < 20 for i, _ in granted), "a permit was granted after the freeze")
        self.assertEqual(len(refused), 8 * 20)
        self.assertEqual(len({p for _, p in granted}), len(granted))
        self.server.wait_job(self.op, job)  # all released: the job drains and completes

    def test_connections_of_ended_threads_are_closed(self):
        # LangGraph runs nodes on short-lived executor threads; each thread's kept-alive
        # connection must not outlive it (one socket leaked per thread ran out of descriptors).
        import os

        def open_fds() -> int:
            return len(os.listdir("/proc/self/fd"))

        lease = self.rt.take_lease("acme", subject(), ttl_ms=60_000)

        def once() -> None:
            self.assertFalse(self.rt.is_revoked(lease.lease_id))

        def burst(n: int) -> None:
            for _ in range(n):
                t = threading.Thread(target=once)
                t.start()
                t.join()

        burst(5)
        base = open_fds()
        burst(100)
        self.assertLess(open_fds() - base, 10, "a connection per ended thread stays open")
        with self.rt._conns_lock:
            self.assertLessEqual(len(self.rt._conns), 2)

    def test_callback_runs_once_on_revocation(self):
        s = subject()
        lease = self.rt.take_lease("acme", s)
        calls = []
        done = threading.Event()
        lease.on_revoked(lambda l: (calls.append(l.lease_id), done.set()))
        self.erase("acme", s)
        self.assertTrue(done.wait(PUSH_BOUND_S))
        lease.on_revoked(lambda l: calls.append(-l.lease_id))  # already revoked: runs at once
        self.assertEqual(calls, [lease.lease_id, -lease.lease_id])

    def test_memory_scope_erase_of_another_memory_leaves_the_lease_working(self):
        s = subject()
        v1, v7 = "2026-12-01T10:00:00.000001Z", "2026-12-01T10:00:00.000007Z"
        keep = self.rt.take_lease("acme", s, [("memories/k1", v1)])
        gone = self.rt.take_lease("acme", s, [("memories/k2", v7)])
        self.assertTrue(self.rt.stream_connected.wait(5))
        job = self.erase("acme", s, memory="memories/k2", version=v7)
        self.assertTrue(gone.revoked.wait(PUSH_BOUND_S), "the lease that read the erased version was not revoked")
        with self.assertRaises(Refused):
            with gone.permit("tool"):
                pass
        # Throughout the job and after it, the other lease takes permits.
        with keep.permit("tool"):
            pass
        self.server.wait_job(self.op, job)
        with keep.permit("state"):
            pass
        self.assertFalse(keep.refresh())


class RestartTest(unittest.TestCase):
    def test_stream_reopens_after_the_gate_restarts_and_still_pushes(self):
        server = Server()
        self.addCleanup(server.stop)
        rt = server.client(reconnect_max_s=0.5)
        self.addCleanup(rt.close)
        op = server.client(operator=True, watch=False)
        self.addCleanup(op.close)
        s = subject()
        lease = rt.take_lease("acme", s)
        self.assertTrue(rt.stream_connected.wait(5))
        opened = rt._watcher.reconnects
        server.restart()  # same address, same journal: the lease survives
        deadline = time.monotonic() + 10
        while rt._watcher.reconnects == opened or not rt.stream_connected.is_set():
            self.assertLess(time.monotonic(), deadline, "the stream was not reopened")
            time.sleep(0.01)
        op.start_job("acme", s, ticket="T-RESTART")
        self.assertTrue(lease.revoked.wait(PUSH_BOUND_S), "no push after the restart")
        with self.assertRaises(Revoked):
            with lease.permit("tool"):
                pass


if __name__ == "__main__":
    unittest.main()
