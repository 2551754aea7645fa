"""The node's prepared claims, kept across restarts of kubelet and of the plugin.

kubelet prepares a claim once and does not ask again after a restart of either side, so what a
claim was given must outlive the process: a checkpoint file (JSON, versioned) is rewritten
atomically (temporary file, fsync, rename, fsync of the directory) after every change, and each
claim's CDI spec file is written the same way before the checkpoint names it. Prepare of a claim
already in the checkpoint returns what it was given; Unprepare of an unknown claim is a no-op.
Both are idempotent, as kubelet requires.

A crash between the spec and the checkpoint leaves a spec no claim names; ``load`` removes such
orphans, so the directory holds exactly the checkpoint's claims.
"""

from __future__ import annotations

import contextlib
import json
import os
import tempfile
import threading
from collections.abc import Callable, Mapping
from dataclasses import asdict
from pathlib import Path
from typing import Any

from draplugin.claims import (
    ClaimRef,
    PreparedClaim,
    PreparedDevice,
    claim_spec,
    claim_spec_file,
    claim_spec_prefix,
)
from gpushare.errors import GpushareError

CHECKPOINT_VERSION = 1
CHECKPOINT_NAME = "checkpoint.json"


class CheckpointError(GpushareError):
    """The checkpoint cannot be read; the message names the file and why. Nothing is rewritten:
    the plugin refuses to start rather than forget claims kubelet will not prepare again."""


def write_atomically(path: Path, data: bytes) -> None:
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.")
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.rename(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise
    dir_fd = os.open(path.parent, os.O_RDONLY)
    try:
        os.fsync(dir_fd)
    finally:
        os.close(dir_fd)


def _encode(claims: Mapping[str, PreparedClaim]) -> bytes:
    doc = {"version": CHECKPOINT_VERSION, "claims": {uid: asdict(c) for uid, c in sorted(claims.items())}}
    return json.dumps(doc, indent=1, sort_keys=True).encode()


def _decode(raw: bytes, where: Path) -> dict[str, PreparedClaim]:
    try:
        doc = json.loads(raw)
        if doc.get("version") != CHECKPOINT_VERSION:
            raise CheckpointError(f"{where}: version {doc.get('version')!r}, this plugin reads {CHECKPOINT_VERSION}")
        out: dict[str, PreparedClaim] = {}
        for uid, c in doc["claims"].items():
            devices = tuple(PreparedDevice(**{**d, "cdi_ids": tuple(d["cdi_ids"])}) for d in c["devices"])
            out[uid] = PreparedClaim(ClaimRef(**c["ref"]), devices)
        return out
    except CheckpointError:
        raise
    except (ValueError, KeyError, TypeError, AttributeError) as exc:
        raise CheckpointError(f"{where}: not a checkpoint this plugin wrote ({exc})") from None


class PreparedClaims:
    """The checkpoint and the claims' CDI specs, behind one lock."""

    def __init__(self, data_dir: Path, cdi_dir: Path, driver: str) -> None:
        self._path = data_dir / CHECKPOINT_NAME
        self._cdi_dir = cdi_dir
        self._driver = driver
        self._lock = threading.Lock()
        data_dir.mkdir(parents=True, exist_ok=True)
        cdi_dir.mkdir(parents=True, exist_ok=True)
        self._claims = self._load()

    def _load(self) -> dict[str, PreparedClaim]:
        try:
            claims = _decode(self._path.read_bytes(), self._path)
        except FileNotFoundError:
            claims = {}
        keep = {claim_spec_file(self._driver, uid) for uid in claims}
        prefix = claim_spec_prefix(self._driver)
        for entry in os.listdir(self._cdi_dir):
            if entry.startswith(prefix) and entry not in keep:
                with contextlib.suppress(OSError):
                    os.unlink(self._cdi_dir / entry)
        for claim in claims.values():
            self._write_spec(claim)  # a wiped /var/run/cdi (reboot) gets its specs back
        return claims

    def snapshot(self) -> dict[str, PreparedClaim]:
        with self._lock:
            return dict(self._claims)

    def held(self) -> dict[str, str]:
        """Each exclusive device prepared here → the UID of the claim holding it."""
        with self._lock:
            return {dev: uid for uid, c in self._claims.items() for dev in c.exclusive_devices}

    def get(self, uid: str) -> PreparedClaim | None:
        with self._lock:
            return self._claims.get(uid)

    def add(self, claim: PreparedClaim, check: Callable[[Mapping[str, str]], object] | None = None) -> PreparedClaim:
        """Record ``claim`` (its spec first, then the checkpoint); a claim already here is kept as is.

        ``check`` runs under the lock with the held devices, so two Prepare calls cannot both take
        one exclusive device; it raises to refuse.
        """
        with self._lock:
            existing = self._claims.get(claim.ref.uid)
            if existing is not None:
                return existing
            if check is not None:
                check({dev: uid for uid, c in self._claims.items() for dev in c.exclusive_devices})
            self._write_spec(claim)
            claims = {**self._claims, claim.ref.uid: claim}
            write_atomically(self._path, _encode(claims))
            self._claims = claims
            return claim

    def remove(self, uid: str) -> bool:
        """Forget ``uid`` (checkpoint first, then its spec); False when it was not prepared here."""
        with self._lock:
            if uid not in self._claims:
                return False
            claims = {k: v for k, v in self._claims.items() if k != uid}
            write_atomically(self._path, _encode(claims))
            self._claims = claims
            with contextlib.suppress(OSError):
                os.unlink(self._cdi_dir / claim_spec_file(self._driver, uid))
            return True

    def _write_spec(self, claim: PreparedClaim) -> None:
        if not claim.devices:
            return
        spec: dict[str, Any] = claim_spec(self._driver, claim)
        write_atomically(self._cdi_dir / claim_spec_file(self._driver, claim.ref.uid), json.dumps(spec).encode())
