"""MUNGE credentials through libmunge (ctypes, the standard library): every Slurm node
runs munged with the cluster's one key, so a credential a node's root process encodes
is proof, on the controller, of who sent it and when.

    encode(payload, ttl)   a credential (text) carrying `payload`, valid for `ttl` seconds
    decode(credential)     the payload, the sender's uid and gid, when it was encoded;
                           MungeError when the credential is forged, expired, from the
                           future, or was decoded before (munged's replay cache)

libmunge talks to the local munged over its socket (`socket`, default munged's own,
/run/munge/munge.socket.2). One context per call: a context is not thread-safe.
"""

from __future__ import annotations

import ctypes
import ctypes.util
from dataclasses import dataclass

__all__ = [
    "EMUNGE_CRED_EXPIRED",
    "EMUNGE_CRED_REPLAYED",
    "EMUNGE_CRED_REWOUND",
    "Decoded",
    "Munge",
    "MungeError",
    "MungeUnavailable",
]

# munge.h: context options and the error codes this module tells apart.
_OPT_TTL = 4
_OPT_ENCODE_TIME = 6
_OPT_SOCKET = 8
EMUNGE_SOCKET = 6
EMUNGE_CRED_EXPIRED = 15
EMUNGE_CRED_REWOUND = 16
EMUNGE_CRED_REPLAYED = 17


class MungeUnavailable(RuntimeError):
    """libmunge is not installed (apt-get install libmunge2 munge)."""


class MungeError(Exception):
    """libmunge refused: `code` is munge.h's munge_err_t, `message` munged's words."""

    def __init__(self, code: int, message: str) -> None:
        super().__init__(f"MUNGE error {code}: {message}")
        self.code = code
        self.message = message


@dataclass(frozen=True)
class Decoded:
    payload: bytes
    uid: int
    gid: int
    encoded_at: int  # seconds since the epoch, munged's clock on the encoding host


class Munge:
    def __init__(self, socket: str | None = None) -> None:
        name = ctypes.util.find_library("munge") or "libmunge.so.2"
        try:
            lib = ctypes.CDLL(name)
            libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
        except OSError as error:
            raise MungeUnavailable(f"libmunge not found ({error}): apt-get install munge") from None
        lib.munge_ctx_create.restype = ctypes.c_void_p
        lib.munge_ctx_create.argtypes = []
        lib.munge_ctx_destroy.restype = None
        lib.munge_ctx_destroy.argtypes = [ctypes.c_void_p]
        lib.munge_ctx_strerror.restype = ctypes.c_char_p
        lib.munge_ctx_strerror.argtypes = [ctypes.c_void_p]
        lib.munge_strerror.restype = ctypes.c_char_p
        lib.munge_strerror.argtypes = [ctypes.c_int]
        lib.munge_encode.restype = ctypes.c_int
        lib.munge_encode.argtypes = [
            ctypes.POINTER(ctypes.c_void_p),
            ctypes.c_void_p,
            ctypes.c_char_p,
            ctypes.c_int,
        ]
        lib.munge_decode.restype = ctypes.c_int
        lib.munge_decode.argtypes = [
            ctypes.c_char_p,
            ctypes.c_void_p,
            ctypes.POINTER(ctypes.c_void_p),
            ctypes.POINTER(ctypes.c_int),
            ctypes.POINTER(ctypes.c_uint),
            ctypes.POINTER(ctypes.c_uint),
        ]
        lib.munge_ctx_set.restype = ctypes.c_int  # variadic: arguments typed at each call
        lib.munge_ctx_get.restype = ctypes.c_int
        libc.free.restype = None
        libc.free.argtypes = [ctypes.c_void_p]
        self._lib = lib
        self._free = libc.free
        self.socket = socket

    def _context(self) -> int:
        ctx = self._lib.munge_ctx_create()
        if not ctx:
            raise MemoryError("munge_ctx_create failed")
        if self.socket:
            code = self._lib.munge_ctx_set(
                ctypes.c_void_p(ctx), ctypes.c_int(_OPT_SOCKET), ctypes.c_char_p(self.socket.encode())
            )
            if code:
                self._lib.munge_ctx_destroy(ctx)
                raise MungeError(code, "cannot set the munged socket")
        return int(ctx)

    def _error(self, code: int, ctx: int) -> MungeError:
        said = self._lib.munge_ctx_strerror(ctx) or self._lib.munge_strerror(code) or b"unknown"
        return MungeError(code, said.decode(errors="replace"))

    def encode(self, payload: bytes, ttl: int) -> str:
        """A credential holding `payload`, valid for `ttl` seconds (munged caps it)."""
        ctx = self._context()
        try:
            code = self._lib.munge_ctx_set(ctypes.c_void_p(ctx), ctypes.c_int(_OPT_TTL), ctypes.c_int(ttl))
            if code:
                raise self._error(code, ctx)
            cred = ctypes.c_void_p()
            code = self._lib.munge_encode(ctypes.byref(cred), ctx, payload, len(payload))
            if code:
                raise self._error(code, ctx)
            try:
                return ctypes.string_at(cred.value or 0).decode("ascii")
            finally:
                self._free(cred)
        finally:
            self._lib.munge_ctx_destroy(ctx)

    def decode(self, credential: str) -> Decoded:
        """The payload and who encoded it, when; MungeError for any credential munged refuses."""
        ctx = self._context()
        buf = ctypes.c_void_p()
        length = ctypes.c_int()
        uid, gid = ctypes.c_uint(), ctypes.c_uint()
        try:
            code = self._lib.munge_decode(
                credential.encode("ascii"),
                ctx,
                ctypes.byref(buf),
                ctypes.byref(length),
                ctypes.byref(uid),
                ctypes.byref(gid),
            )
            try:
                if code:
                    raise self._error(code, ctx)
                encoded_at = ctypes.c_long()
                code = self._lib.munge_ctx_get(
                    ctypes.c_void_p(ctx), ctypes.c_int(_OPT_ENCODE_TIME), ctypes.byref(encoded_at)
                )
                if code:
                    raise self._error(code, ctx)
                payload = ctypes.string_at(buf.value, length.value) if buf.value else b""
                return Decoded(payload, uid.value, gid.value, encoded_at.value)
            finally:
                if buf.value:
                    self._free(buf)
        finally:
            self._lib.munge_ctx_destroy(ctx)
