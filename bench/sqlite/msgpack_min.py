"""A minimal msgpack codec (standard library only), enough to re-encode LangGraph's checkpoint
and writes blobs. Extension types are kept as (code, bytes) and re-emitted unchanged."""
from __future__ import annotations

import struct


class Ext:
    __slots__ = ("code", "data")

    def __init__(self, code: int, data: bytes):
        self.code, self.data = code, data

    def __eq__(self, o):
        return isinstance(o, Ext) and (o.code, o.data) == (self.code, self.data)


class F32(float):
    """A float that was encoded as float32."""


def unpackb(b: bytes):
    v, i = _dec(b, 0)
    if i != len(b):
        raise ValueError(f"trailing bytes at {i}/{len(b)}")
    return v


def _dec(b: bytes, i: int):
    t = b[i]
    i += 1
    if t <= 0x7F:
        return t, i
    if t >= 0xE0:
        return t - 0x100, i
    if 0x80 <= t <= 0x8F:
        return _map(b, i, t & 0x0F)
    if 0x90 <= t <= 0x9F:
        return _arr(b, i, t & 0x0F)
    if 0xA0 <= t <= 0xBF:
        n = t & 0x1F
        return b[i:i + n].decode(), i + n
    if t == 0xC0:
        return None, i
    if t == 0xC2:
        return False, i
    if t == 0xC3:
        return True, i
    if t in (0xC4, 0xC5, 0xC6):
        w = {0xC4: 1, 0xC5: 2, 0xC6: 4}[t]
        n = int.from_bytes(b[i:i + w], "big")
        i += w
        return bytes(b[i:i + n]), i + n
    if t in (0xC7, 0xC8, 0xC9):
        w = {0xC7: 1, 0xC8: 2, 0xC9: 4}[t]
        n = int.from_bytes(b[i:i + w], "big")
        i += w
        code = struct.unpack(">b", b[i:i + 1])[0]
        i += 1
        return Ext(code, bytes(b[i:i + n])), i + n
    if t == 0xCA:
        return F32(struct.unpack(">f", b[i:i + 4])[0]), i + 4
    if t == 0xCB:
        return struct.unpack(">d", b[i:i + 8])[0], i + 8
    if 0xCC <= t <= 0xCF:
        w = 1 << (t - 0xCC)
        return int.from_bytes(b[i:i + w], "big"), i + w
    if 0xD0 <= t <= 0xD3:
        w = 1 << (t - 0xD0)
        return int.from_bytes(b[i:i + w], "big", signed=True), i + w
    if 0xD4 <= t <= 0xD8:
        n = 1 << (t - 0xD4)
        code = struct.unpack(">b", b[i:i + 1])[0]
        i += 1
        return Ext(code, bytes(b[i:i + n])), i + n
    if t in (0xD9, 0xDA, 0xDB):
        w = {0xD9: 1, 0xDA: 2, 0xDB: 4}[t]
        n = int.from_bytes(b[i:i + w], "big")
        i += w
        return b[i:i + n].decode(), i + n
    if t in (0xDC, 0xDD):
        w = 2 if t == 0xDC else 4
        n = int.from_bytes(b[i:i + w], "big")
        return _arr(b, i + w, n)
    if t in (0xDE, 0xDF):
        w = 2 if t == 0xDE else 4
        n = int.from_bytes(b[i:i + w], "big")
        return _map(b, i + w, n)
    raise ValueError(f"unknown msgpack type byte 0x{t:02x} at {i - 1}")


def _arr(b, i, n):
    out = []
    for _ in range(n):
        v, i = _dec(b, i)
        out.append(v)
    return out, i


def _map(b, i, n):
    out = {}
    for _ in range(n):
        k, i = _dec(b, i)
        v, i = _dec(b, i)
        out[k] = v
    return out, i


def packb(v) -> bytes:
    out = bytearray()
    _enc(v, out)
    return bytes(out)


def _enc(v, out: bytearray):
    if v is None:
        out.append(0xC0)
    elif v is True:
        out.append(0xC3)
    elif v is False:
        out.append(0xC2)
    elif isinstance(v, int):
        if 0 <= v <= 0x7F:
            out.append(v)
        elif -32 <= v < 0:
            out.append(v + 0x100)
        elif v >= 0:
            for code, w in ((0xCC, 1), (0xCD, 2), (0xCE, 4), (0xCF, 8)):
                if v < 1 << (8 * w):
                    out.append(code)
                    out += v.to_bytes(w, "big")
                    return
            raise ValueError("int too large")
        else:
            for code, w in ((0xD0, 1), (0xD1, 2), (0xD2, 4), (0xD3, 8)):
                if v >= -(1 << (8 * w - 1)):
                    out.append(code)
                    out += v.to_bytes(w, "big", signed=True)
                    return
            raise ValueError("int too small")
    elif isinstance(v, F32):
        out.append(0xCA)
        out += struct.pack(">f", v)
    elif isinstance(v, float):
        out.append(0xCB)
        out += struct.pack(">d", v)
    elif isinstance(v, str):
        s = v.encode()
        n = len(s)
        if n < 32:
            out.append(0xA0 | n)
        elif n < 0x100:
            out += bytes((0xD9, n))
        elif n < 0x10000:
            out.append(0xDA)
            out += n.to_bytes(2, "big")
        else:
            out.append(0xDB)
            out += n.to_bytes(4, "big")
        out += s
    elif isinstance(v, (bytes, bytearray)):
        n = len(v)
        if n < 0x100:
            out += bytes((0xC4, n))
        elif n < 0x10000:
            out.append(0xC5)
            out += n.to_bytes(2, "big")
        else:
            out.append(0xC6)
            out += n.to_bytes(4, "big")
        out += v
    elif isinstance(v, Ext):
        n = len(v.data)
        fixed = {1: 0xD4, 2: 0xD5, 4: 0xD6, 8: 0xD7, 16: 0xD8}
        if n in fixed:
            out.append(fixed[n])
        elif n < 0x100:
            out += bytes((0xC7, n))
        elif n < 0x10000:
            out.append(0xC8)
            out += n.to_bytes(2, "big")
        else:
            out.append(0xC9)
            out += n.to_bytes(4, "big")
        out += struct.pack(">b", v.code)
        out += v.data
    elif isinstance(v, (list, tuple)):
        n = len(v)
        if n < 16:
            out.append(0x90 | n)
        elif n < 0x10000:
            out.append(0xDC)
            out += n.to_bytes(2, "big")
        else:
            out.append(0xDD)
            out += n.to_bytes(4, "big")
        for x in v:
            _enc(x, out)
    elif isinstance(v, dict):
        n = len(v)
        if n < 16:
            out.append(0x80 | n)
        elif n < 0x10000:
            out.append(0xDE)
            out += n.to_bytes(2, "big")
        else:
            out.append(0xDF)
            out += n.to_bytes(4, "big")
        for k, x in v.items():
            _enc(k, out)
            _enc(x, out)
    else:
        raise TypeError(f"cannot msgpack {type(v).__name__}")
