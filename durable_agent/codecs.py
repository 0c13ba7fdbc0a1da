"""What the data converter does to payload bytes when history is encrypted.

With `DURABLE_AGENT_ENCRYPTION_KEY` set (base64 of 32 random bytes, or
`id1:base64,id2:base64`: the first key encrypts, every key decrypts, for rotation), every
payload is zlib-compressed when that makes it smaller (`PayloadCompression`; ciphertext
does not compress, so this comes first) and then encrypted with AES-256-GCM
(`PayloadEncryption`). The key id travels in the payload's metadata and is bound to the
ciphertext. A payload that was altered, or names a key id this process does not hold,
fails loudly with that id; it is never read as plain text. Each payload also carries a
check of its key (`KEY_CHECK`, an HMAC of a constant under the key: it says nothing of the
key), so a process holding a different key under the same id says so (`KeyNotHeld`)
rather than "altered". A payload that was never
encrypted (a run started by a client without the key, e.g. `temporal workflow start`) is
read as it is.

Without a key, payloads are left alone, so the plain Temporal CLI and Web UI read every
one. That is also why compression is not applied then: a codec cannot tell a
continue-as-new carry from a query result, and the `transcript` query must stay readable
to `temporal workflow query`. The carry packs its own transcript instead
(`workflows.types.Carry.messages`).
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import hmac
import logging
import os
import re
import zlib
from collections.abc import Sequence
from dataclasses import dataclass

from cryptography.exceptions import InvalidTag
from cryptography.hazmat.primitives.ciphers.aead import AESGCM
from temporalio.api.common.v1 import Payload
from temporalio.converter import PayloadCodec

KEY_ENV = "DURABLE_AGENT_ENCRYPTION_KEY"
DEFAULT_KEY_ID = "default"
"""The id of a key given bare (without `id:`); name it `default:` in a rotation list."""
ENCRYPTED = b"binary/encrypted"
KEY_ID = "encryption-key-id"
KEY_CHECK = "encryption-key-check"
HOLDER = {"name": "process"}
"""What "not held by this …" names: `worker.py` sets it to "worker" at start."""
COMPRESSED = b"binary/zlib"
MIN_COMPRESSED_BYTES = 512
"""Smaller payloads (most of a step's) gain little from zlib and pay its fixed cost."""
MAX_INFLATED_BYTES = 256 * 2**20
"""Far above any payload Temporal accepts (2 MB by default); a bound against a crafted one."""
NONCE_BYTES = 12
_KEY_ID_SHAPE = re.compile(r"[A-Za-z0-9._-]{1,64}")


def key_check(key: bytes) -> bytes:
    return hmac.new(key, b"durable-agent key check", hashlib.sha256).hexdigest()[:16].encode()


class CodecError(ValueError):
    """A payload that cannot be decoded, or a key setting that cannot be used; says why."""


class KeyNotHeld(CodecError):
    """A payload encrypted with a key this process does not hold. Its message names only the
    key id, so it may stand in clear in history (durable_agent/connection.py): a run whose
    worker lacks the key says why it waits, where the failure would otherwise be encrypted
    with the wrong key and unreadable to everyone."""


@dataclass(frozen=True)
class EncryptionKeys:
    """Key id -> 32-byte key; `current` encrypts."""

    keys: dict[str, bytes]
    current: str

    @classmethod
    def parse(cls, setting: str) -> EncryptionKeys:
        """From `DURABLE_AGENT_ENCRYPTION_KEY`'s format. Errors never quote a key."""
        keys: dict[str, bytes] = {}
        for index, part in enumerate(p.strip() for p in setting.split(",")):
            key_id, _, encoded = part.rpartition(":") if ":" in part else (DEFAULT_KEY_ID, "", part)
            where = f"{KEY_ENV}: key {index + 1} ({key_id!r})"
            if not _KEY_ID_SHAPE.fullmatch(key_id):
                raise CodecError(f"{KEY_ENV}: key {index + 1} has a bad id: use 1-64 of A-Z a-z 0-9 . _ -")
            if key_id in keys:
                raise CodecError(f"{where}: the id is used twice")
            try:
                key = base64.b64decode(encoded, validate=True)
            except binascii.Error:
                raise CodecError(f"{where} is not valid base64") from None
            if len(key) != 32:
                raise CodecError(f"{where} is {len(key)} bytes; AES-256 needs 32 (e.g. `openssl rand -base64 32`)")
            keys[key_id] = key
        return cls(keys, next(iter(keys)))

    @classmethod
    def from_env(cls) -> EncryptionKeys | None:
        setting = os.environ.get(KEY_ENV, "").strip()
        return cls.parse(setting) if setting else None


class PayloadCompression:
    """Packs payloads of `min_bytes` or more (None: none) when zlib makes them smaller."""

    def __init__(self, min_bytes: int | None) -> None:
        self._min_bytes = min_bytes

    def encode_one(self, payload: Payload) -> Payload:
        if self._min_bytes is None or payload.ByteSize() < self._min_bytes:
            return payload
        packed = zlib.compress(payload.SerializeToString())
        if len(packed) >= payload.ByteSize():
            return payload
        return Payload(metadata={"encoding": COMPRESSED}, data=packed)

    def decode_one(self, payload: Payload) -> Payload:
        if payload.metadata.get("encoding") != COMPRESSED:
            return payload
        inflater = zlib.decompressobj()
        try:
            data = inflater.decompress(payload.data, MAX_INFLATED_BYTES)
        except zlib.error as e:
            raise CodecError(f"a compressed payload is damaged: {e}") from None
        if inflater.unconsumed_tail:
            raise CodecError(f"a compressed payload inflates to more than {MAX_INFLATED_BYTES:,} bytes")
        return Payload.FromString(data)


class PayloadEncryption:
    """Encrypts with the current key if there is one; decrypts with any held key."""

    def __init__(self, keys: EncryptionKeys | None) -> None:
        self._keys = keys
        self._ciphers = {key_id: AESGCM(key) for key_id, key in keys.keys.items()} if keys else {}
        self._checks = {key_id: key_check(key) for key_id, key in keys.keys.items()} if keys else {}

    def encode_one(self, payload: Payload) -> Payload:
        if self._keys is None:
            return payload
        key_id = self._keys.current
        nonce = os.urandom(NONCE_BYTES)
        sealed = self._ciphers[key_id].encrypt(nonce, payload.SerializeToString(), key_id.encode())
        metadata = {"encoding": ENCRYPTED, KEY_ID: key_id.encode(), KEY_CHECK: self._checks[key_id]}
        return Payload(metadata=metadata, data=nonce + sealed)

    def decode_one(self, payload: Payload) -> Payload:
        if payload.metadata.get("encoding") != ENCRYPTED:
            return payload  # never encrypted (see the module docstring)
        key_id = payload.metadata.get(KEY_ID, b"").decode(errors="replace")
        cipher = self._ciphers.get(key_id)
        check = payload.metadata.get(KEY_CHECK)
        if cipher is None or (check is not None and check != self._checks[key_id]):
            held = ", ".join(repr(k) for k in self._ciphers) or "none: it is not set"
            other = " (it holds another key under that id)" if cipher is not None else ""
            raise KeyNotHeld(
                f"cannot decrypt: key id {key_id} not held by this {HOLDER['name']}{other}; {KEY_ENV} holds {held}"
            )
        nonce, sealed = payload.data[:NONCE_BYTES], payload.data[NONCE_BYTES:]
        try:
            return Payload.FromString(cipher.decrypt(nonce, sealed, key_id.encode()))
        except InvalidTag:
            raise CodecError(
                f"payload encrypted with key id {key_id!r} does not authenticate: it was altered, "
                f"or {KEY_ENV} holds a different key under that id"
            ) from None


class PayloadCodecChain(PayloadCodec):
    """With keys: compression, then encryption; decoding undoes them in reverse. Without:
    payloads pass as they are, and an encrypted one fails to decode, naming its key id."""

    def __init__(self, keys: EncryptionKeys | None) -> None:
        self.keys = keys
        self._compression = PayloadCompression(MIN_COMPRESSED_BYTES if keys else None)
        self._encryption = PayloadEncryption(keys)

    async def encode(self, payloads: Sequence[Payload]) -> list[Payload]:
        return self.encode_all(payloads)

    async def decode(self, payloads: Sequence[Payload]) -> list[Payload]:
        return self.decode_all(payloads)

    def encode_all(self, payloads: Sequence[Payload]) -> list[Payload]:
        return [self._encryption.encode_one(self._compression.encode_one(p)) for p in payloads]

    def decode_all(self, payloads: Sequence[Payload]) -> list[Payload]:
        return [self._compression.decode_one(self._encryption.decode_one(p)) for p in payloads]


class KeyNotHeldOnce(logging.Filter):
    """On the SDK's workflow-task log: a task that failed because this worker lacks a run's
    key becomes one line per run, "cannot decrypt: key id k1 not held by this worker …",
    instead of a traceback at every retry of the task."""

    def __init__(self) -> None:
        super().__init__()
        self._said: set[str] = set()

    def filter(self, record: logging.LogRecord) -> bool:
        error = record.exc_info[1] if record.exc_info else None
        if not isinstance(error, KeyNotHeld):
            return True
        line = f"{error} (run {record.args[0] if record.args else '?'}); the run waits for a worker that holds it"
        if line in self._said:
            return False
        self._said.add(line)
        record.msg, record.args, record.exc_info, record.exc_text = line, (), None, None
        return True


def act_as_worker() -> None:
    """Name this process a worker in codec errors, and log a missing key once per run."""
    HOLDER["name"] = "worker"
    logging.getLogger("temporalio.worker._workflow").addFilter(KeyNotHeldOnce())
