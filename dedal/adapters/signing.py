"""Apptainer's image signatures: ``apptainer sign`` and ``apptainer verify`` with the PGP
keys of Apptainer's keyring (``apptainer key newpair``/``key import``; the keyring of
``$APPTAINER_KEYSDIR``, else ``~/.apptainer/keys``), so that an image dedal signs is one
``apptainer verify`` accepts, and the other way round.

A signature is a SIF object Apptainer adds to the image (over the object group of its
partition): signing changes the file, so callers sign a copy. The key's passphrase goes
to ``apptainer sign`` on its standard input, never on a command line, in a log or in an
error; verification uses the local keyring only (``--local``: no key server is asked, a
build node has no network) and reads Apptainer's ``--json`` answer. As root without
``CAP_SYS_RESOURCE`` Apptainer is told to drop it (:func:`.runtime.apptainer.process_env`).
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import List, Optional, Sequence

from dedal.adapters import proc
from dedal.adapters.runtime.apptainer import process_env
from dedal.errors import UserError

TOOL = "apptainer"
HINT = "install Apptainer (https://apptainer.org/docs/admin/main/installation.html)"
_FATAL = re.compile(r"FATAL:\s*(.*)")


@dataclass
class Signers:
    """Who signed an image, as ``apptainer verify`` found it."""

    fingerprints: List[str] = field(default_factory=list)  # lower-case hex, 40 digits
    names: List[str] = field(default_factory=list)  # "Name (comment) <email>"

    def to_json(self) -> dict:
        return {"fingerprints": self.fingerprints, "names": self.names}


def _fatal(res: proc.Result) -> str:
    """Apptainer's own reason (its last FATAL line), without the rest of its output."""
    text = f"{res.stderr or ''}\n{res.stdout or ''}"
    found = _FATAL.findall(text)
    if found:
        return found[-1].strip()
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    return lines[-1] if lines else f"exit code {res.returncode}"


def sign(image: Path, *, keyidx: int = 0, passphrase: Optional[str] = None) -> Signers:
    """Sign ``image`` in place with the PGP secret key ``keyidx`` of Apptainer's keyring
    (``apptainer key list --secret``); the passphrase, when the key has one, on stdin.
    UserError (one line, Apptainer's reason, no secret) when it cannot; returns the signer."""
    proc.which(TOOL, HINT)
    cmd = [TOOL, "sign", "--keyidx", str(int(keyidx)), str(image)]
    res = proc.run(cmd, what="apptainer sign", env=process_env(), check=False, input=(passphrase or "") + "\n")
    if res.returncode != 0:
        reason = _fatal(res)
        if "checksum failure" in reason or "passphrase" in reason.lower() or "decrypt" in reason:
            reason += " (a wrong or missing passphrase: set DEDAL_SIGN_PASSPHRASE)"
        raise UserError(f"{image}: apptainer sign --keyidx {keyidx} failed: {reason}")
    return verify(image)


def verify(image: Path, *, signers: Sequence[str] = ()) -> Signers:
    """``apptainer verify --local``: the image's signatures are valid and made by keys of
    the local keyring (and, where ``signers`` names fingerprints, by one of them).
    UserError, one line, for an unsigned image, a signature by an unknown key, content
    that does not match its signature, or a signer not among ``signers``."""
    proc.which(TOOL, HINT)
    cmd = [TOOL, "verify", "--local", "--json", str(image)]
    res = proc.run(cmd, what="apptainer verify", env=process_env(), check=False)
    try:
        data = json.loads(res.stdout or "{}")
    except ValueError:
        data = {}
    if not isinstance(data, dict):
        data = {}
    keys = [k.get("Signer") for k in data.get("SignerKeys") or [] if isinstance(k, dict)]
    keys = [k for k in keys if isinstance(k, dict)]
    if res.returncode != 0:
        if not data.get("Signatures"):
            raise UserError(f"{image}: the image is not signed (apptainer verify: {_fatal(res)})")
        raise UserError(f"{image}: its signature is not accepted (apptainer verify: {_fatal(res)})")
    if not keys or not all(k.get("KeyCheck") and k.get("DataCheck") for k in keys):
        raise UserError(f"{image}: its signature is not accepted (apptainer verify found no valid signer)")
    found = Signers(
        sorted({str(k.get("Fingerprint", "")).lower() for k in keys}), sorted({str(k.get("Name", "")) for k in keys})
    )
    wanted = {s.lower().replace(" ", "") for s in signers if s}
    if wanted and not set(found.fingerprints) & wanted:
        raise UserError(
            f"{image}: signed by {', '.join(found.fingerprints)}, not by a key of the setting "
            f"`signers` ({', '.join(sorted(wanted))})"
        )
    return found


def check_tool() -> None:
    """ToolMissing before anything is written, where Apptainer is not installed."""
    proc.which(TOOL, HINT)


__all__ = ["Signers", "check_tool", "sign", "verify"]
