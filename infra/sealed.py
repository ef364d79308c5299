"""Model files encrypted at rest: AES-256-GCM under a data key per registry version, the data key
wrapped by a key-encryption key (KEK) that never sits in the registry folder.

Turned on by one setting, ``INDUSFLOW_REGISTRY_KEY`` (off when unset), which names where the KEK
comes from:

- ``file:/path/to/kek``: a file holding 32 random bytes, raw or as hex / base64 text
  (``openssl rand -hex 32 > kek``);
- ``env:NAME``: an environment variable holding the same text;
- ``kms:package.module:factory``: a callable returning a :class:`KeyWrapper` (a cloud KMS
  client, an HSM): the KEK then never enters this process.

Layout (see ``infra.registry``): each model artifact of a version (:data:`ARTIFACT_SUFFIXES`) is
``MAGIC + nonce + AES-GCM(data key, file bytes, aad = "<name>/<version>/<file>")``; the data keys
sit in ``registry/<name>/keys.json`` (version -> KEK id + wrapped key), outside the version folders,
so a key rotation (``ModelRegistry.rotate_key``) rewraps them without touching a stored file (whose hash the trail keeps).
The associated data binds a file to its model, version and name: a file moved to another version,
renamed, or altered by one bit fails authentication. Files are decrypted in memory only.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import importlib
import json
import os
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol, runtime_checkable

from pydantic import BaseModel, ConfigDict

from infra.errors import RegistryError
from infra.store import write_json_atomic

MAGIC = b"INDUSFLOW-SEALED\x01"
NONCE_BYTES = 12
KEYRING_FILE = "keys.json"
#: Files of a version that are model artifacts (weights, skops, ONNX, checkpoints): sealed when a
#: key is configured. Documents (meta.json, cards, lineage, profiles) stay readable.
ARTIFACT_SUFFIXES = (".safetensors", ".skops", ".onnx", ".ckpt", ".pt")
SETTING = "INDUSFLOW_REGISTRY_KEY"


class SealError(RegistryError):
    """A sealed model file cannot be opened: no key, the wrong key, or an altered file."""


@runtime_checkable
class KeyWrapper(Protocol):
    """Wraps and unwraps data keys with a key-encryption key (a local KEK or a KMS client).

    ``key_id`` names the KEK (never the key itself); ``unwrap`` raises on a key wrapped by another KEK.
    """

    key_id: str

    def wrap(self, data_key: bytes) -> bytes: ...

    def unwrap(self, wrapped: bytes) -> bytes: ...


class LocalKek:
    """A 256-bit KEK held in this process (from a file or an environment variable): RFC 3394 AES key wrap."""

    def __init__(self, key: bytes, source: str) -> None:
        if len(key) != 32:
            raise SealError(f"the registry key from {source} is {len(key)} bytes; it must be 32 random bytes "
                            "(raw, hex or base64), e.g. `openssl rand -hex 32`")
        self._key = key
        self.source = source
        self.key_id = "local:" + hashlib.sha256(b"indusflow-kek\0" + key).hexdigest()[:16]

    def wrap(self, data_key: bytes) -> bytes:
        from cryptography.hazmat.primitives.keywrap import aes_key_wrap

        return aes_key_wrap(self._key, data_key)

    def unwrap(self, wrapped: bytes) -> bytes:
        from cryptography.hazmat.primitives.keywrap import InvalidUnwrap, aes_key_unwrap

        try:
            return aes_key_unwrap(self._key, wrapped)
        except InvalidUnwrap as exc:
            raise SealError(f"the key from {self.source} does not unwrap this data key") from exc

    def __repr__(self) -> str:  # never the key
        return f"LocalKek({self.source}, {self.key_id})"


def _decode_key(raw: bytes, source: str) -> bytes:
    if len(raw) == 32:
        return raw
    text = raw.decode("ascii", errors="replace").strip()
    try:
        return bytes.fromhex(text) if len(text) == 64 else base64.b64decode(text, validate=True)
    except (ValueError, binascii.Error) as exc:
        raise SealError(f"the registry key from {source} is neither 32 raw bytes nor hex/base64 text of "
                        "32 bytes (make one with `openssl rand -hex 32`)") from exc


def key_from_reference(reference: str) -> KeyWrapper:
    """The KEK a reference names: ``file:PATH``, ``env:NAME`` or ``kms:module:factory``."""
    kind, _, where = reference.partition(":")
    if kind == "file" and where:
        path = Path(where).expanduser()
        if not path.is_file():
            raise SealError(f"{SETTING}=file:{where}: no such file (create one: openssl rand -hex 32 > {where})")
        return LocalKek(_decode_key(path.read_bytes(), f"file {path}"), f"file {path}")
    if kind == "env" and where:
        value = os.environ.get(where)
        if not value:
            raise SealError(f"{SETTING}=env:{where}: the variable {where} is not set")
        return LocalKek(_decode_key(value.encode("ascii", errors="replace"), f"${where}"), f"${where}")
    if kind == "kms" and ":" in where:
        module, _, factory = where.partition(":")
        try:
            client = getattr(importlib.import_module(module), factory)()
        except (ImportError, AttributeError) as exc:
            raise SealError(f"{SETTING}=kms:{where}: cannot load the KMS client factory ({exc})") from exc
        if not isinstance(client, KeyWrapper):
            raise SealError(f"{SETTING}=kms:{where} returned {type(client).__name__}, which lacks "
                            "key_id / wrap(data_key) / unwrap(wrapped)")
        return client
    raise SealError(f"{SETTING} must be file:PATH, env:NAME or kms:module:factory (got {kind!r}:…)")


def configured_key() -> KeyWrapper | None:
    """The KEK of ``INDUSFLOW_REGISTRY_KEY`` (None: encryption at rest is off)."""
    from infra.settings import get_core_settings

    reference = (get_core_settings().registry_key or "").strip()
    return key_from_reference(reference) if reference else None


def is_artifact(file_name: str) -> bool:
    """Whether a version file is a model artifact (sealed when a key is configured)."""
    return file_name.endswith(ARTIFACT_SUFFIXES)


# -- the keyring: registry/<name>/keys.json -----------------------------------------------


class WrappedKey(BaseModel):
    """A version's data key as stored: wrapped by the KEK named ``kek``."""

    model_config = ConfigDict(frozen=True)

    kek: str
    wrapped: str  # base64


def _keyring_path(model_dir: Path) -> Path:
    return model_dir / KEYRING_FILE


def read_keyring(model_dir: Path) -> dict[int, WrappedKey]:
    """Version -> wrapped data key of one model (empty: nothing sealed)."""
    path = _keyring_path(model_dir)
    if not path.is_file():
        return {}
    return {int(v): WrappedKey(**entry) for v, entry in json.loads(path.read_text()).items()}


def write_keyring(model_dir: Path, keys: dict[int, WrappedKey]) -> None:
    """Replace the keyring atomically (the caller holds the model's registry lock)."""
    write_json_atomic(_keyring_path(model_dir), {str(v): k.model_dump() for v, k in sorted(keys.items())})


# -- sealing and opening files ----------------------------------------------------------


def _aad(name: str, version: int, file_name: str) -> bytes:
    return f"{name}/{int(version)}/{file_name}".encode()


@dataclass(frozen=True)
class VersionKey:
    """The data key of one version, unwrapped (in memory only)."""

    name: str
    version: int
    data_key: bytes

    def seal(self, file_name: str, plaintext: bytes) -> bytes:
        from cryptography.hazmat.primitives.ciphers.aead import AESGCM

        nonce = os.urandom(NONCE_BYTES)
        return MAGIC + nonce + AESGCM(self.data_key).encrypt(nonce, plaintext, _aad(self.name, self.version, file_name))

    def open(self, file_name: str, blob: bytes) -> bytes:
        from cryptography.exceptions import InvalidTag
        from cryptography.hazmat.primitives.ciphers.aead import AESGCM

        body = memoryview(blob)[len(MAGIC):]  # views, not copies: a model file can be large
        try:
            return AESGCM(self.data_key).decrypt(body[:NONCE_BYTES], body[NONCE_BYTES:],
                                                 _aad(self.name, self.version, file_name))
        except InvalidTag as exc:
            raise SealError(f"model {self.name}:{self.version}: {file_name} fails authentication: it was altered, "
                            "or moved from another version or name; restore it from a backup or register the "
                            "model again") from exc

    def __repr__(self) -> str:  # never the key
        return f"VersionKey({self.name}:{self.version})"


def new_version_key(model_dir: Path, name: str, version: int, kek: KeyWrapper) -> VersionKey:
    """A fresh data key for ``name:version``, wrapped into the keyring (call inside the model's lock,
    before the version folder appears)."""
    data_key = os.urandom(32)
    keys = read_keyring(model_dir)
    keys[int(version)] = WrappedKey(kek=kek.key_id, wrapped=base64.b64encode(kek.wrap(data_key)).decode())
    write_keyring(model_dir, keys)
    return VersionKey(name, int(version), data_key)


def forget_version_key(model_dir: Path, version: int) -> None:
    """Drop a version's keyring entry (its registration failed before the folder appeared)."""
    keys = read_keyring(model_dir)
    if keys.pop(int(version), None) is not None:
        write_keyring(model_dir, keys)


def write_artifact(path: Path, data: bytes, key: VersionKey | None) -> None:
    """Write a model artifact of a version being registered: sealed under ``key``, or plain (None)."""
    path.write_bytes(key.seal(path.name, data) if key is not None else data)


def _unwrap(name: str, version: int, entry: WrappedKey, kek: KeyWrapper, named_by: str = SETTING) -> bytes:
    if entry.kek != kek.key_id:
        raise SealError(f"model {name}:{version} is sealed under key {entry.kek}, but {named_by} names key "
                        f"{kek.key_id}: set {named_by} to the key it was sealed with (after a rotate-key, the new one)")
    try:
        return kek.unwrap(base64.b64decode(entry.wrapped))
    except SealError as exc:
        raise SealError(f"model {name}:{version}: {exc}; its keys.json entry was altered or the key is wrong") from exc
    except Exception as exc:  # a KMS client's own error: named by type only (its text may echo a request)
        raise SealError(f"model {name}:{version}: the key service could not unwrap its data key "
                        f"({type(exc).__name__}); check the KMS client and its permissions") from exc


def version_key(model_dir: Path, name: str, version: int) -> VersionKey | None:
    """The unwrapped data key of a sealed version (None: the version was stored in plaintext)."""
    entry = read_keyring(model_dir).get(int(version))
    if entry is None:
        return None
    kek = configured_key()
    if kek is None:
        raise SealError(f"model {name}:{version} is encrypted at rest (key {entry.kek}); set {SETTING} to its "
                        "key-encryption key: file:PATH, env:NAME or kms:module:factory (docs/encryption.md)")
    return VersionKey(name, int(version), _unwrap(name, version, entry, kek))


def stored_plain(path: Path) -> bool:
    """Whether a file of a version folder is stored in plaintext and may be read as it is (the file's
    version was not sealed): callers with a faster file reader (safetensors' ``load_file``) use it then.

    Raises:
        RegistryError: the file is missing.
        SealError: the version was stored sealed and this model file is plaintext (replaced).
    """
    if not path.is_file():
        raise RegistryError(f"model file {path} is missing")
    with open(path, "rb") as handle:
        if handle.read(len(MAGIC)) == MAGIC:
            return False
    folder = path.parent
    if folder.name.isdigit() and is_artifact(path.name) and int(folder.name) in read_keyring(folder.parent):
        raise SealError(f"model {folder.parent.name}:{folder.name} was stored encrypted but {path.name} is plaintext: "
                        "the file was replaced outside the registry; restore it from a backup or register the model "
                        "again")
    return True


def read_artifact(path: Path) -> bytes:
    """The plaintext bytes of a file stored in a version folder (``<root>/<name>/<version>/<file>``),
    decrypted in memory when it is sealed.

    Raises:
        RegistryError: the file is missing.
        SealError: the file is sealed and the key is missing or wrong, or the file was altered; or the
            version was stored sealed and this file is not (replaced by a plaintext file).
    """
    if stored_plain(path):
        return path.read_bytes()
    folder = path.parent
    if not folder.name.isdigit():
        raise SealError(f"{path} is sealed but is not in a registry version folder (<name>/<version>/)")
    name, version = folder.parent.name, int(folder.name)
    key = version_key(folder.parent, name, version)
    if key is None:
        raise SealError(f"model {name}:{version}: {path.name} is sealed but keys.json has no key for this version; "
                        f"restore registry/{name}/{KEYRING_FILE} from a backup")
    return key.open(path.name, path.read_bytes())


def discard_plaintext(paths: Iterable[Path]) -> int:
    """With a registry key, delete staged plaintext copies of model files (a trained GBM's skops, a
    compress run's candidates): the registry holds the kept ones sealed. Returns how many went."""
    if configured_key() is None:
        return 0
    gone = 0
    for path in paths:
        if is_artifact(path.name) and path.is_file() and not path.is_symlink():
            with open(path, "rb") as handle:
                sealed = handle.read(len(MAGIC)) == MAGIC
            if not sealed:
                path.unlink()
                gone += 1
    return gone


# -- rotation ---------------------------------------------------------------------------


class RotationReport(BaseModel):
    """What :func:`rotate_keys` rewrapped."""

    model_config = ConfigDict(frozen=True)

    new_key: str
    rewrapped: int
    already_current: int
    models: list[str]


def rotation_keys(old_reference: str) -> tuple[KeyWrapper, KeyWrapper]:
    """(old, new) KEKs of a rotation: ``old_reference`` and the one ``INDUSFLOW_REGISTRY_KEY`` names now.

    Raises:
        SealError: no new key is configured, either cannot be read, or both are the same key.
    """
    new = configured_key()
    if new is None:
        raise SealError(f"set {SETTING} to the NEW key-encryption key; --old-key names the one in use until now")
    old = key_from_reference(old_reference)
    if old.key_id == new.key_id:
        raise SealError(f"--old-key and {SETTING} name the same key ({new.key_id}): nothing to rotate")
    return old, new


def iter_model_dirs(root: Path) -> Iterator[Path]:
    """The model folders of a registry root that hold a keyring."""
    if root.is_dir():
        yield from sorted(p for p in root.iterdir() if p.is_dir() and _keyring_path(p).is_file())


def rewrap_model(model_dir: Path, old: KeyWrapper, new: KeyWrapper) -> tuple[int, int]:
    """Rewrap one model's data keys from ``old`` to ``new`` (inside its lock); (rewrapped, already new)."""
    keys = read_keyring(model_dir)
    done = current = 0
    for version, entry in sorted(keys.items()):
        if entry.kek == new.key_id:
            current += 1
            continue
        data_key = _unwrap(model_dir.name, version, entry, old, named_by="--old-key")
        keys[version] = WrappedKey(kek=new.key_id, wrapped=base64.b64encode(new.wrap(data_key)).decode())
        done += 1
    if done:
        write_keyring(model_dir, keys)
    return done, current
