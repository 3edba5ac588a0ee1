"""The gate client: leases, permits, and the revocation stream.

- :class:`GateClient` talks to ``lethe serve`` over HTTP/1.1 with keep-alive, one connection per
  calling thread, and watches revocations on one server-sent-events stream for all its leases
  (a background thread that reconnects with backoff).
- :class:`Lease` is what a run takes when it reads memory. ``lease.revoked`` is a
  ``threading.Event`` set when the gate pushes the revocation.
- :class:`Permit` is a context manager around one acceptance point (a model-output stream, a
  tool call, a state write): it takes the permit on entry and, on exit, releases it, or confirms
  the cancellation when the block was aborted because of a revocation.

The gate's check is authoritative and atomic; the push only makes the abort fast. A push that
is late or lost never admits anything: the next permit is refused by the gate itself.
"""

from __future__ import annotations

import http.client
import json
import logging
import secrets
import select
import socket
import ssl
import threading
import time
import urllib.parse
from collections.abc import Callable, Iterable
from typing import Any

from .errors import (
    GateError,
    NoSuchLease,
    NoSuchPermit,
    Refused,
    Revoked,
    StaleEpoch,
    Tombstoned,
    Unavailable,
    error_for,
)
from .sse import SseParser

log = logging.getLogger("lethe_gate")

SINKS = ("output", "tool", "state")
"""The acceptance points a permit can be taken for."""

# A kept-alive connection idle longer than this is replaced rather than reused, so a request is
# rarely sent into a connection the server is closing. (One the server has closed is found
# before a request is sent; a request whose answer is lost goes again only if that is safe; see
# GateClient._call.)
_IDLE_S = 20.0


class GateClient:
    """A client of one ``lethe serve``. Thread-safe; share one per process.

    ``base_url`` is ``http://host:port`` or ``https://host:port`` (``lethe serve`` with
    ``[serve] tls``, or a TLS proxy): the server's certificate is always verified, against the
    system's roots, or against ``ca_file`` alone (a PEM file of the deployment's own CA).
    ``token`` is a bearer token from the server's config: role ``runtime`` for the gate,
    ``operator`` to also start jobs.
    ``watch=False`` opens no revocation stream: leases then learn of revocations only from
    refused permits and :meth:`Lease.refresh`.
    """

    def __init__(
        self,
        base_url: str,
        token: str,
        *,
        timeout: float = 10.0,
        watch: bool = True,
        reconnect_max_s: float = 5.0,
        stream_idle_s: float = 45.0,
        ca_file: str | None = None,
    ) -> None:
        u = urllib.parse.urlsplit(base_url)
        if u.scheme not in ("http", "https") or not u.hostname:
            raise ValueError("base_url must be http://host:port or https://host:port")
        self._https = u.scheme == "https"
        # Verifies the certificate and the host name; with ca_file, that CA only.
        self._tls = ssl.create_default_context(cafile=ca_file) if self._https else None
        self._host = u.hostname
        self._port = u.port or (443 if self._https else 80)
        self._prefix = u.path.rstrip("/")
        self._token = token
        self._timeout = timeout
        self._local = threading.local()
        self._conns_lock = threading.Lock()
        # The key each permit's take carried, which ending it shows: a keyed permit is ended
        # only by its holder (another run naming its id gets NoSuchPermit). Kept until it ends.
        self._permit_keys: dict[int, str] = {}
        self._keys_lock = threading.Lock()
        # Every open connection and the thread it belongs to: a thread that ended cannot close
        # its own, so each new connection first closes those of ended threads (LangGraph runs
        # nodes on short-lived executor threads: about six a run).
        self._conns: dict[http.client.HTTPConnection, threading.Thread] = {}
        self._closed = False
        self._watcher = (
            _Watchers(self, reconnect_max_s=reconnect_max_s, idle_s=stream_idle_s) if watch else None
        )

    # ------------------------------------------------------------------ gate
    def take_lease(
        self,
        tenant: str,
        subject: str,
        reads: Iterable[tuple[str, str]] = (),
        ttl_ms: int = 60_000,
    ) -> Lease:
        """Takes a lease for a run that read ``reads``, each ``(memory_id, version)``.

        Raises :class:`~lethe_gate.Fenced` while an erasure of the subject or tenant runs.
        """
        body = {
            "tenant": tenant,
            "subject": subject,
            "reads": [{"memory_id": m, "version": v} for m, v in reads],
            "ttl_ms": int(ttl_ms),
        }
        r = self._call("POST", "/v1/leases", body, expect=(200, 201))
        lease = Lease(
            self,
            lease_id=int(r["lease_id"]),
            epoch=int(r["epoch"]),
            tenant_epoch=int(r.get("tenant_epoch", 0)),
            expires_ms=int(r.get("expires_ms", 0)),
            tenant=tenant,
            subject=subject,
            token=str(r.get("token", "")),
        )
        if self._watcher is not None:
            self._watcher.add(lease)
        return lease

    def renew_lease(self, lease_id: int, ttl_ms: int = 60_000) -> int:
        """Moves a lease's expiry to at least now + ``ttl_ms`` (prefer :meth:`Lease.renew`).
        Returns the new expiry, milliseconds since 1970-01-01 UTC. Raises
        :class:`~lethe_gate.Revoked` or :class:`~lethe_gate.Expired` for a lease that cannot be
        renewed: read the memory again and take a new lease."""
        # Sent again after a lost answer: a renewal only ever moves the expiry later.
        r = self._call(
            "POST", f"/v1/leases/{int(lease_id)}/renew", {"ttl_ms": int(ttl_ms)}, expect=(200,), resend=True
        )
        return int(r["expires_ms"])

    def take_permit(self, lease_id: int, sink: str) -> int:
        """Takes a permit (prefer :meth:`Lease.permit`). Returns its id."""
        if sink not in SINKS:
            raise ValueError(f"sink must be one of {', '.join(SINKS)}")
        # A key of its own: if the answer is lost, the take goes once more with it and gets the
        # permit the first sending registered, which can then be released.
        key = secrets.token_hex(16)
        body = {"lease_id": lease_id, "sink": sink, "key": key}
        r = self._call("POST", "/v1/permits", body, expect=(200, 201), resend=True)
        permit_id = int(r["permit_id"])
        with self._keys_lock:
            self._permit_keys[permit_id] = key
        return permit_id

    def take_permit_releasing(self, lease_id: int, sink: str, previous: int) -> tuple[int, bool]:
        """Takes a permit and releases ``previous``, whose boundary ended, in one round trip.

        For a run going straight from one acceptance point to the next (a tool's result written
        to state). ``previous`` is released whatever the take's answer: after a return, a
        :class:`Refused` or :class:`NoSuchLease` it is no longer active; :class:`BadRequest`,
        :class:`Unauthorized` and :class:`Forbidden` change nothing; after :class:`Unavailable`,
        release it again (:class:`NoSuchPermit` then means it was). Returns the new permit's id
        and whether this request ended ``previous`` (``False``: it was not active any more).
        """
        if sink not in SINKS:
            raise ValueError(f"sink must be one of {', '.join(SINKS)}")
        previous = int(previous)
        key = secrets.token_hex(16)
        body: dict[str, Any] = {"lease_id": lease_id, "sink": sink, "release": previous, "key": key}
        with self._keys_lock:
            release_key = self._permit_keys.get(previous)
        if release_key is not None:
            body["release_key"] = release_key
        try:
            r = self._call("POST", "/v1/permits", body, expect=(200, 201), resend=True)
        except (Refused, NoSuchLease):
            self._forget(previous)  # released whatever the take's answer
            raise
        self._forget(previous)
        permit_id = int(r["permit_id"])
        with self._keys_lock:
            self._permit_keys[permit_id] = key
        return permit_id, bool(r["released"])

    def release_permit(self, permit_id: int) -> None:
        """The boundary ended normally."""
        self._end(int(permit_id), "")

    def confirm_cancelled(self, permit_id: int) -> None:
        """The holder aborted the work the permit covered. Counts as drained."""
        self._end(int(permit_id), "/cancelled")

    def _end(self, permit_id: int, suffix: str) -> None:
        with self._keys_lock:
            key = self._permit_keys.get(permit_id)
        query = "" if key is None else "?" + urllib.parse.urlencode({"key": key})
        try:
            # A keyed end goes once more after a lost answer or a 503 (its key names this take's
            # permit and nothing else); no_such_permit to that second sending means the first
            # ended it. An unkeyed one goes once: a second sending could not tell them apart.
            self._call("POST" if suffix else "DELETE", f"/v1/permits/{permit_id}{suffix}{query}", expect=(200, 204),
                       resend=key is not None, ended_on_resend=key is not None)
        except NoSuchPermit:
            self._forget(permit_id)
            raise
        self._forget(permit_id)

    def _forget(self, permit_id: int) -> None:
        with self._keys_lock:
            self._permit_keys.pop(permit_id, None)

    def is_revoked(self, lease_id: int) -> bool:
        """Asks the gate whether a lease was revoked (one request; the stream is the fast path)."""
        return bool(self._call("GET", f"/v1/leases/{int(lease_id)}")["revoked"])

    def record_lineage(
        self,
        tenant: str,
        subject: str,
        target: str,
        locator: str,
        *,
        from_memories: Iterable[tuple[str, str | None]] = (),
        from_artifacts: Iterable[tuple[str, str]] = (),
    ) -> None:
        """Records that the artifact ``locator`` in the configured target ``target`` (a summary
        row, a cache entry; never its content) was derived from the subject's memories
        ``from_memories`` (``(memory_id, version or None)``) and from other artifacts
        ``from_artifacts`` (``(target, locator)``: a summary of a summary). Neither given: from
        the subject's memory as a whole. An erasure of any of them then reaches the artifact,
        transitively. Idempotent, so it may be sent again. Refused ``Fenced`` while an erasure
        of the subject or tenant is running: do not write the artifact then."""
        body = {
            "tenant": tenant,
            "subject": subject,
            "target": target,
            "locator": locator,
            "from": [{"memory_id": m, "version": v} for m, v in from_memories],
            "from_artifacts": [{"target": t, "locator": l} for t, l in from_artifacts],
        }
        self._call("POST", "/v1/lineage", body, expect=(204,), resend=True)

    def data_key(self, lease_id: int, key_id: str | None = None) -> tuple[str, bytes, int]:
        """The data key of the lease's subject (crypto-shredding): ``key_id`` names one to
        decrypt with; without it, the subject's current key (made if it has none) to encrypt
        with. Returns ``(key_id, key, expires_ms)``: keep the key no longer than
        ``expires_ms``, the lease's expiry. Refused as the lease's permits are (``Refused``);
        :class:`KeyDestroyed` for a key an erasure destroyed."""
        body: dict[str, Any] = {"lease_id": int(lease_id)}
        if key_id is not None:
            body["key_id"] = key_id
        r = self._call("POST", "/v1/keys", body)
        return r["key_id"], bytes.fromhex(r["key"]), int(r["expires_ms"])

    # ------------------------------------------------------------------ jobs (operator)
    def start_job(
        self,
        tenant: str,
        subject: str | None,
        *,
        memory: str | None = None,
        basis: str = "gdpr-art17",
        ticket: str,
        **extra: Any,
    ) -> dict[str, Any]:
        """Starts an erasure job in the background (operator token). Returns the 202 body."""
        body = {"tenant": tenant, "subject": subject, "memory": memory, "basis": basis, "ticket": ticket}
        body.update(extra)
        return self._call("POST", "/v1/jobs", body, expect=(200, 202))

    def job(self, job_id: str) -> dict[str, Any]:
        """A job's outcome, as ``lethe job show --json`` prints it (operator token)."""
        return self._call("GET", "/v1/jobs/" + urllib.parse.quote(job_id, safe=""))

    # ------------------------------------------------------------------ lifecycle
    def close(self) -> None:
        """Stops the revocation stream and closes every connection."""
        self._closed = True
        if self._watcher is not None:
            self._watcher.stop()
        with self._conns_lock:
            conns, self._conns = self._conns, {}
        for c in conns:
            c.close()

    def __enter__(self) -> GateClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    @property
    def stream_connected(self) -> _AllConnected:
        """Set while the revocation streams are open with every watched lease listed (one
        stream per 10,000 leases). ``wait(timeout)`` and ``is_set()``, as a
        :class:`threading.Event`."""
        if self._watcher is None:
            raise RuntimeError("this client was made with watch=False")
        return self._watcher.connected

    # ------------------------------------------------------------------ HTTP
    def _new_conn(self, timeout: float) -> http.client.HTTPConnection:
        if self._tls is not None:
            return http.client.HTTPSConnection(self._host, self._port, timeout=timeout, context=self._tls)
        return http.client.HTTPConnection(self._host, self._port, timeout=timeout)

    def _headers(self, accept: str = "application/json") -> dict[str, str]:
        return {"Authorization": f"Bearer {self._token}", "Accept": accept}

    def _conn(self) -> tuple[http.client.HTTPConnection, bool]:
        """This thread's kept-alive connection, and whether it was used before."""
        c = getattr(self._local, "conn", None)
        if c is not None and (time.monotonic() - self._local.used > _IDLE_S or _closed_by_peer(c)):
            # Found before the request is sent, never after: a request that may have been acted
            # on (a permit registered, a release) is never sent twice.
            self._drop()
            c = None
        if c is None:
            c = self._new_conn(self._timeout)
            self._local.conn = c
            with self._conns_lock:
                ended = [k for k, t in self._conns.items() if not t.is_alive()]
                for k in ended:
                    del self._conns[k]
                self._conns[c] = threading.current_thread()
            for k in ended:
                k.close()
            return c, False
        return c, True

    def _drop(self) -> None:
        c = getattr(self._local, "conn", None)
        if c is not None:
            self._local.conn = None
            with self._conns_lock:
                self._conns.pop(c, None)
            c.close()

    def _call(
        self,
        method: str,
        path: str,
        body: Any = None,
        expect: tuple[int, ...] = (200,),
        resend: bool | None = None,
        ended_on_resend: bool = False,
    ) -> Any:
        """One request. ``resend``: it may go once more after a lost answer (a read, a keyed
        permit take or end, a renewal: a second sending changes nothing the first did not); by
        default only a GET may. ``ended_on_resend``: a ``no_such_permit`` answer to the second
        sending means the first one ended the permit, and is success."""
        if resend is None:
            resend = method == "GET"
        if self._closed:
            raise Unavailable("the client is closed")
        data = None if body is None else json.dumps(body).encode()
        headers = self._headers()
        if data is not None:
            headers["Content-Type"] = "application/json"
        for attempt in (1, 2):
            conn, _ = self._conn()
            try:
                conn.request(method, self._prefix + path, body=data, headers=headers)
                resp = conn.getresponse()
                raw = resp.read()
            except (http.client.RemoteDisconnected, ConnectionResetError, BrokenPipeError) as e:
                # The answer was lost (the server closed the connection just as the request
                # left, a proxy cut it): only a request that may go again does, once. Anything
                # else may have been acted on, so the caller sees Unavailable.
                self._drop()
                if attempt == 1 and resend:
                    continue
                raise Unavailable(f"the gate closed the connection ({type(e).__name__})") from e
            except (OSError, http.client.HTTPException) as e:
                # A timeout or an answer cut short: sent again only if that is safe, as above.
                self._drop()
                if attempt == 1 and resend:
                    continue
                raise Unavailable(f"cannot reach the gate ({type(e).__name__})") from e
            self._local.used = time.monotonic()
            if resp.will_close:
                self._drop()
            # 503: the control store did not answer, maybe after the commit (a keyed take's
            # permit may be registered): sent again, once, if that is safe.
            if resp.status == 503 and attempt == 1 and resend:
                continue
            break
        if resp.status in expect:
            if not raw:
                return None
            try:
                return json.loads(raw)
            except ValueError as e:
                raise Unavailable(f"the gate answered HTTP {resp.status} with a body that is not JSON") from e
        code = message = None
        try:
            err = json.loads(raw) if raw else {}
            if isinstance(err, dict):
                code, message = err.get("error"), err.get("message")
        except ValueError:
            pass
        if ended_on_resend and attempt == 2 and resp.status == 404 and code == "no_such_permit":
            return None
        raise error_for(resp.status, code, message)


def _closed_by_peer(conn: http.client.HTTPConnection) -> bool:
    """Whether the server has closed a kept-alive connection (or sent bytes nobody asked for):
    a look at the socket without waiting."""
    sock = conn.sock
    if sock is None:
        return True
    try:
        if hasattr(select, "poll"):  # no limit on descriptor numbers, unlike select()
            p = select.poll()
            p.register(sock, select.POLLIN)
            return bool(p.poll(0))
        readable, _, _ = select.select([sock], [], [], 0)
        return bool(readable)
    except (OSError, ValueError):
        return True


class Lease:
    """A lease on a subject's memory, bound to the epochs current when it was taken.

    ``revoked`` is set when the gate pushes its revocation (or a permit is refused because of
    it); ``revoked_at`` is then the ``time.monotonic()`` of that moment. The tenant and subject
    are kept for the run's metadata but never shown in ``repr``. ``token`` is the gate's fencing
    token (a MAC over the lease, its epochs and its owner): what Lethe's database guard checks,
    carried as ``lethe_token`` beside ``lethe_epoch`` (:meth:`fencing`).
    """

    def __init__(
        self,
        client: GateClient,
        *,
        lease_id: int,
        epoch: int,
        tenant_epoch: int,
        expires_ms: int,
        tenant: str,
        subject: str,
        token: str = "",
    ) -> None:
        self.client = client
        self.lease_id = lease_id
        self.token = token
        self.epoch = epoch
        self.tenant_epoch = tenant_epoch
        self.expires_ms = expires_ms
        self.tenant = tenant
        self.subject = subject
        self.revoked = threading.Event()
        self.revoked_at: float | None = None
        self._lock = threading.Lock()
        self._callbacks: list[Callable[[Lease], None]] = []
        self._active = 0  # permits held now; an expired lease is watched until they end

    def __repr__(self) -> str:
        state = "revoked" if self.revoked.is_set() else "live"
        return f"<Lease {self.lease_id} epoch={self.epoch} {state}>"

    def fencing(self) -> dict[str, Any]:
        """The keys a run copies into what it writes, for Lethe's database guard:
        ``lethe_epoch``, ``lethe_tenant_epoch`` and ``lethe_token`` (the run config's metadata,
        which LangGraph copies into each checkpoint, and each store item's value)."""
        return {"lethe_epoch": self.epoch, "lethe_tenant_epoch": self.tenant_epoch, "lethe_token": self.token}

    def renew(self, ttl_ms: int = 60_000) -> None:
        """Keeps a long run's lease: its expiry moves to at least now + ``ttl_ms``. Call it
        well before ``expires_ms`` (say at half the TTL). A revoked lease is marked and raises
        :class:`~lethe_gate.Revoked`; an expired one raises :class:`~lethe_gate.Expired`."""
        try:
            self.expires_ms = self.client.renew_lease(self.lease_id, ttl_ms)
        except Revoked:
            self._mark_revoked()
            raise

    def permit(self, sink: str) -> Permit:
        """A context manager holding a permit for ``sink`` (``output``, ``tool`` or ``state``)."""
        return Permit(self, sink)

    def on_revoked(self, callback: Callable[[Lease], None]) -> None:
        """Calls ``callback(lease)`` once when the lease is revoked (at once if it already is).

        Callbacks run on the stream's thread: keep them short (set a flag, cancel a task).
        """
        with self._lock:
            if not self.revoked.is_set():
                self._callbacks.append(callback)
                return
        _run_callback(callback, self)

    def check(self) -> None:
        """Raises :class:`~lethe_gate.Revoked` if the revocation was pushed. Cheap: call it
        between tokens, before each tool call."""
        if self.revoked.is_set():
            raise Revoked("the lease was revoked by an erasure; abort the work")

    def refresh(self) -> bool:
        """Asks the gate whether the lease is revoked (and marks it if so)."""
        if self.client.is_revoked(self.lease_id):
            self._mark_revoked()
        return self.revoked.is_set()

    def close(self) -> None:
        """Stops watching this lease. Its permits must already have ended."""
        w = self.client._watcher
        if w is not None:
            w.remove(self)

    def __enter__(self) -> Lease:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _mark_revoked(self) -> None:
        with self._lock:
            if self.revoked.is_set():
                return
            self.revoked_at = time.monotonic()
            self.revoked.set()
            callbacks, self._callbacks = self._callbacks, []
        for cb in callbacks:
            _run_callback(cb, self)

    def _is_prunable(self) -> bool:
        """Expired, holding no permit: nothing left to abort."""
        return self._active == 0 and 0 < self.expires_ms < time.time() * 1000


def _run_callback(cb: Callable[[Lease], None], lease: Lease) -> None:
    try:
        cb(lease)
    except Exception:  # a caller's bug must not kill the stream thread
        log.exception("A revocation callback raised; the lease stays revoked.")


class Permit:
    """One permit, held for the duration of a ``with`` block.

    On exit the permit is released, unless the block is being abandoned because of the
    revocation (it raised a :class:`~lethe_gate.Refused`, or raised anything while the lease is
    revoked, or called :meth:`abort`): then the cancellation is confirmed, which tells the gate
    the work was aborted (stream cut, buffered tokens dropped, tools not dispatched).
    ``outcome`` is then ``"released"`` or ``"cancelled"``.
    """

    def __init__(self, lease: Lease, sink: str) -> None:
        self.lease = lease
        self.sink = sink
        self.permit_id: int | None = None
        self.outcome: str | None = None
        self._abort = False

    def __repr__(self) -> str:
        return f"<Permit {self.permit_id} {self.sink} lease={self.lease.lease_id}>"

    def __enter__(self) -> Permit:
        lease = self.lease
        try:
            self.permit_id = lease.client.take_permit(lease.lease_id, self.sink)
        except (Revoked, StaleEpoch, Tombstoned):
            lease._mark_revoked()  # the lease will never take a permit again
            raise
        with lease._lock:
            lease._active += 1
        return self

    def check(self) -> None:
        """Raises :class:`~lethe_gate.Revoked` if the lease was revoked meanwhile."""
        self.lease.check()

    @property
    def revoked(self) -> bool:
        return self.lease.revoked.is_set()

    def abort(self) -> None:
        """Marks the work as aborted: the exit confirms the cancellation instead of releasing."""
        self._abort = True

    def __exit__(self, et: type[BaseException] | None, ev: BaseException | None, tb: object) -> bool:
        if self.permit_id is None:
            return False
        cancel = self._abort or (
            ev is not None and (isinstance(ev, Refused) or self.lease.revoked.is_set())
        )
        client = self.lease.client
        try:
            if cancel:
                client.confirm_cancelled(self.permit_id)
                self.outcome = "cancelled"
            else:
                client.release_permit(self.permit_id)
                self.outcome = "released"
        except GateError as e:
            if ev is None:
                raise
            # Never mask the block's own exception; say what else went wrong.
            ev.add_note(f"lethe_gate: ending the permit failed too: {e}")
        finally:
            with self.lease._lock:
                self.lease._active -= 1
        return False


MAX_STREAM_LEASES = 10_000
"""The most leases the gate lets one revocation stream list (`GET /v1/revocations`)."""

MAX_STREAM_IDS_LEN = 60_000
"""The most characters of lease ids (with their commas) one stream's URL lists: the server
refuses a request line past 64 KiB, which 10,000 ids of six digits or more would pass."""


class _AllConnected:
    """Set while every stream of a client is open (reads like a :class:`threading.Event`)."""

    def __init__(self, watchers: _Watchers) -> None:
        self._watchers = watchers

    def _watching(self) -> list[_Watcher]:
        return [w for w in self._watchers.shards() if w.size()]

    def is_set(self) -> bool:
        active = self._watching()
        return bool(active) and all(w.connected.is_set() for w in active)

    def wait(self, timeout: float | None = None) -> bool:
        deadline = None if timeout is None else time.monotonic() + timeout
        for w in self._watching():
            left = None if deadline is None else max(0.0, deadline - time.monotonic())
            if not w.connected.wait(left):
                return False
        return self.is_set()


class _Watchers:
    """A client's revocation streams: a lease joins the first stream listing fewer than
    ``per_stream`` leases, or a new one, since the gate refuses a stream of more."""

    def __init__(self, client: GateClient, *, reconnect_max_s: float, idle_s: float) -> None:
        self._new = lambda: _Watcher(client, reconnect_max_s=reconnect_max_s, idle_s=idle_s)
        self._lock = threading.Lock()
        self._shards: list[_Watcher] = []
        self.per_stream = MAX_STREAM_LEASES
        self.ids_len = MAX_STREAM_IDS_LEN
        self.connected = _AllConnected(self)

    def shards(self) -> list[_Watcher]:
        with self._lock:
            return list(self._shards)

    @property
    def reconnects(self) -> int:
        """Streams opened, over every shard (for tests and metrics)."""
        return sum(w.reconnects for w in self.shards())

    def add(self, lease: Lease) -> None:
        with self._lock:
            need = len(str(lease.lease_id)) + 1
            shard = next(
                (w for w in self._shards if w.size() < self.per_stream and w.ids_len() + need <= self.ids_len),
                None,
            )
            if shard is None:
                shard = self._new()
                self._shards.append(shard)
            shard.add(lease)

    def remove(self, lease: Lease) -> None:
        for w in self.shards():
            w.remove(lease)

    def stop(self) -> None:
        for w in self.shards():
            w.stop()


class _Watcher:
    """One SSE stream for up to ``MAX_STREAM_LEASES`` leases of a client; reopened with the new list when a lease is
    added (a lease revoked meanwhile is pushed at once when the stream opens), with backoff
    after errors, and after ``idle_s`` without a byte (the gate sends a keepalive every 15 s)."""

    def __init__(self, client: GateClient, *, reconnect_max_s: float, idle_s: float) -> None:
        self.client = client
        self.reconnect_max_s = reconnect_max_s
        self.idle_s = idle_s
        self.connected = threading.Event()
        self._leases: dict[int, Lease] = {}
        self._ids_len = 0  # len(",".join(ids)) + 1, kept as leases come and go
        self._cond = threading.Condition()
        self._stop = threading.Event()
        self._dirty = False
        self._conn: http.client.HTTPConnection | None = None
        self._thread: threading.Thread | None = None
        self.reconnects = 0  # streams opened, for tests and metrics
        self._backoff = 0.05

    def add(self, lease: Lease) -> None:
        with self._cond:
            if lease.lease_id not in self._leases:
                self._ids_len += len(str(lease.lease_id)) + 1
            self._leases[lease.lease_id] = lease
            self._kick_locked()
            if self._thread is None:
                self._thread = threading.Thread(target=self._run, name="lethe-gate-revocations", daemon=True)
                self._thread.start()

    def size(self) -> int:
        with self._cond:
            return len(self._leases)

    def ids_len(self) -> int:
        """Characters the stream's URL spends on its lease ids, commas included."""
        with self._cond:
            return self._ids_len

    def remove(self, lease: Lease) -> None:
        # The stream keeps listing it until the next reopen; its events are then ignored.
        with self._cond:
            self._forget_locked(lease.lease_id)

    def _forget_locked(self, lease_id: int) -> None:
        if self._leases.pop(lease_id, None) is not None:
            self._ids_len -= len(str(lease_id)) + 1

    def stop(self) -> None:
        self._stop.set()
        with self._cond:
            self._kick_locked()
        if self._thread is not None and self._thread is not threading.current_thread():
            self._thread.join(timeout=5)

    def _kick_locked(self) -> None:
        """Makes the stream reopen: cut the open one, if any."""
        self._dirty = True
        self.connected.clear()
        self._cond.notify_all()
        c = self._conn
        if c is not None and c.sock is not None:
            try:
                c.sock.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass

    def _run(self) -> None:
        while not self._stop.is_set():
            with self._cond:
                for lid in [i for i, x in self._leases.items() if x.revoked.is_set() or x._is_prunable()]:
                    self._forget_locked(lid)
                while not self._leases and not self._stop.is_set():
                    self._dirty = False
                    self._cond.wait()
                if self._stop.is_set():
                    break
                ids = sorted(self._leases)
                self._dirty = False
                conn = self.client._new_conn(self.idle_s)
                self._conn = conn
            why = "the server ended it"
            try:
                self._stream(conn, ids)
            except Exception as e:
                why = type(e).__name__
            finally:
                self.connected.clear()
                with self._cond:
                    self._conn = None
                    dirty = self._dirty
                conn.close()
            with self._cond:
                # The gate ends a stream once every lease it lists was revoked: expected.
                done = all(x.revoked.is_set() for i in ids if (x := self._leases.get(i)) is not None)
            if not self._stop.is_set() and not dirty and not (done and why == "the server ended it"):
                # Not a reopen we asked for: back off (reset once a stream opens).
                log.warning("Revocation stream lost (%s); reopening in %.2f s.", why, self._backoff)
                self._stop.wait(self._backoff)
                self._backoff = min(self._backoff * 2, self.reconnect_max_s)

    def _stream(self, conn: http.client.HTTPConnection, ids: list[int]) -> None:
        path = self.client._prefix + "/v1/revocations?leases=" + ",".join(map(str, ids))
        conn.request("GET", path, headers=self.client._headers("text/event-stream"))
        resp = conn.getresponse()
        if resp.status != 200:
            raw = resp.read()
            try:
                err = json.loads(raw)
            except ValueError:
                err = {}
            raise error_for(resp.status, err.get("error"), err.get("message"))
        self.reconnects += 1
        self._backoff = 0.05
        parser = SseParser()
        with self._cond:
            if self._dirty:
                return
            self.connected.set()
        while not self._stop.is_set():
            chunk = resp.read1(65536)
            if not chunk:
                return
            for ev in parser.feed(chunk):
                if ev.event != "revoked":
                    continue
                try:
                    lid = int(json.loads(ev.data)["lease_id"])
                except (ValueError, KeyError, TypeError):
                    log.warning("Ignoring a revocation event whose data is not {\"lease_id\": N}.")
                    continue
                with self._cond:
                    lease = self._leases.get(lid)
                if lease is not None:
                    lease._mark_revoked()
            with self._cond:
                if self._dirty:
                    return
