"""Typed errors of the gate's HTTP API.

Each error carries the server's stable ``code`` and its message (a sentence the server keeps
free of identifiers), never a tenant, subject or memory id: an exception's text ends up in
logs and traces, and identifiers are personal data.
"""

from __future__ import annotations


class GateError(Exception):
    """Any error from the gate. ``code`` is the server's stable error code."""

    code = "gate_error"

    def __init__(self, message: str = "", *, status: int | None = None, code: str | None = None):
        if code is not None:
            self.code = code
        self.status = status
        self.message = message or self.code
        super().__init__(f"{self.code}: {self.message}")


class Refused(GateError):
    """The gate refused a lease or permit because of an erasure, a stale or expired lease.

    The work the permit would have covered must not happen. Catch this to handle every refusal
    the same way (abort the run, take a new lease after re-reading memory).
    """


class Fenced(Refused):
    """An erasure of the subject or tenant is in progress (HTTP 409 ``fenced``)."""

    code = "fenced"


class Revoked(Refused):
    """The lease was revoked by an erasure (HTTP 409 ``revoked``, or the revocation push)."""

    code = "revoked"


class StaleEpoch(Refused):
    """The lease read memory that has since been erased (HTTP 409 ``stale_epoch``)."""

    code = "stale_epoch"


class Tombstoned(Refused):
    """The lease read a memory version that was erased (HTTP 409 ``tombstoned``)."""

    code = "tombstoned"


class Expired(Refused):
    """The lease's TTL passed; take a new lease (HTTP 409 ``expired``)."""

    code = "expired"


class KeyUsed(Refused):
    """A take's key named another take of the lease (one that ended, or for another sink): a
    key is one take's (HTTP 409 ``key_used``). The client makes a new key for each take."""

    code = "key_used"


class NoSuchLease(GateError):
    """The gate knows no such lease (HTTP 404 ``no_such_lease``)."""

    code = "no_such_lease"


class NoSuchPermit(GateError):
    """The permit is unknown or no longer active (HTTP 404 ``no_such_permit``)."""

    code = "no_such_permit"


class Unauthorized(GateError):
    """No token, or a token the gate does not know (HTTP 401)."""

    code = "unauthorized"


class Forbidden(GateError):
    """The token's role may not do this, e.g. a runtime token starting a job (HTTP 403)."""

    code = "forbidden"


class BadRequest(GateError):
    """The request was malformed, e.g. an empty identifier (HTTP 400 ``bad_request``)."""

    code = "bad_request"


class Held(GateError):
    """A legal hold covers the job's scope: it stays REQUESTED, nothing touched, until the hold
    is released and the job resumed (HTTP 409 ``held``; operator calls only)."""

    code = "held"


class KeyDestroyed(GateError):
    """The data key a ciphertext names was destroyed by an erasure: what was written under it
    is erased and cannot be read again (HTTP 410 ``key_destroyed``)."""

    code = "key_destroyed"


class KeysOff(GateError):
    """The deployment has no ``[keys]``: crypto-shredding is off (HTTP 404 ``keys_off``)."""

    code = "keys_off"


class Unavailable(GateError):
    """The gate could not be reached, or answered something that is not the API.

    Fail closed: treat it as a refusal for anything that needs a permit.
    """

    code = "unavailable"


_BY_CODE: dict[str, type[GateError]] = {
    c.code: c
    for c in (
        Fenced,
        Revoked,
        StaleEpoch,
        Tombstoned,
        Expired,
        KeyUsed,
        NoSuchLease,
        NoSuchPermit,
        Unauthorized,
        Forbidden,
        BadRequest,
        Held,
        KeyDestroyed,
        KeysOff,
        Unavailable,
    )
}
# The server's own 503 (its control store did not answer) is ``Unavailable`` like a transport
# error, so one ``except Unavailable`` covers an outage whichever timer fires first; so are a
# proxy's 502 and 504.
_BY_STATUS: dict[int, type[GateError]] = {
    400: BadRequest,
    401: Unauthorized,
    403: Forbidden,
    502: Unavailable,
    503: Unavailable,
    504: Unavailable,
}


def error_for(status: int, code: str | None, message: str | None) -> GateError:
    """The typed exception for an error response (unknown codes give a plain ``GateError``)."""
    cls = _BY_CODE.get(code or "") or _BY_STATUS.get(status)
    if cls is None:
        return GateError(message or f"HTTP {status}", status=status, code=code or f"http_{status}")
    return cls(message or cls.code, status=status, code=code or cls.code)
