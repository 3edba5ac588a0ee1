"""Python client of the Lethe gate (``lethe serve``): leases, permits, revocation push.

Standard library only. Start with :class:`GateClient`; the LangGraph wiring is in
:mod:`lethe_gate.langgraph` (needs ``langgraph``, imported only there).
"""

from .client import SINKS, GateClient, Lease, Permit
from .errors import (
    BadRequest,
    Expired,
    KeyDestroyed,
    KeysOff,
    KeyUsed,
    Fenced,
    Forbidden,
    Held,
    GateError,
    NoSuchLease,
    NoSuchPermit,
    Refused,
    Revoked,
    StaleEpoch,
    Tombstoned,
    Unauthorized,
    Unavailable,
)

__all__ = [
    "SINKS",
    "BadRequest",
    "Expired",
    "KeyDestroyed",
    "KeysOff",
    "KeyUsed",
    "Fenced",
    "Forbidden",
    "GateClient",
    "GateError",
    "Held",
    "Lease",
    "NoSuchLease",
    "NoSuchPermit",
    "Permit",
    "Refused",
    "Revoked",
    "StaleEpoch",
    "Tombstoned",
    "Unauthorized",
    "Unavailable",
]

__version__ = "0.1.0"
