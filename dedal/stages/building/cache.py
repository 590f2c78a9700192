"""A remote layer cache in an OCI registry: layers shared by machines without shared storage.

``layer_cache: oras://HOST[:PORT]/REPO`` (``dedal build --cache``) names a registry
repository that holds layers as Spack's OCI build caches hold binaries: each layer is an
OCI artifact (:func:`dedal.model.oci.layer_artifact`) whose blobs are the layer's squashfs
and its manifest, tagged with the layer key (which pins the DAG hash, install root and
base, so a tag never names two contents). Before building, each layer the plan needs and
the store lacks is looked up there and pulled: the squashfs's bytes are checked against
the digest the artifact names, which is the sha256 its manifest records, and the manifest
against the plan (key, prefix, install root, base), and its entries with the audit every
layer gets (:func:`dedal.stages.layer_audit.check_packed`: no setuid file, no symlink out
of the install root, nothing outside its prefix, ...) before the layer enters the store:
a layer refused is one line naming it and why, nothing of it is stored, and it is built
here instead (refused, without a source mirror). After the
build, the layers it built are pushed (unless ``layer_cache_push`` is off), blobs the
registry has being skipped; ``dedal layers push`` seeds a cache from a store with the same
push (:meth:`LayerCache.push_layers`). Without a source mirror the build first asks the
cache which layers it holds (:meth:`LayerCache.lacking`): a build that would have to
build one from sources is refused, naming its packages.

The cache only saves work: a registry that cannot be reached, or a layer that fails its
checks, is reported and the layer built here instead; a push that fails is reported
without failing the build.
"""

from __future__ import annotations

import hashlib
import json
import re
from dataclasses import asdict, dataclass, field
from typing import Callable, Dict, List, Optional, Sequence, Tuple

from dedal.adapters import registry as reg
from dedal.adapters.registry import Access, IntegrityError, RegistryClient, download_blob
from dedal.errors import DedalError, UserError
from dedal.model.layers import LayerManifest, LayerStore
from dedal.model.oci import (
    ARTIFACT_LAYER,
    EMPTY_JSON,
    LAYER_MANIFEST,
    LAYER_SQUASHFS,
    OCI_MANIFEST,
    RegistryError,
    canonical_json,
    layer_artifact,
    parse_reference,
)
from dedal.model.plan import Plan
from dedal.stages.layer_audit import check_packed
from dedal.ui.console import human_size

ANN_KEY = "org.dedal.layer.key"
ANN_SPEC = "org.dedal.layer.spec"
_TAG_UNSAFE = re.compile(r"[^A-Za-z0-9_.-]")


def cache_tag(key: str) -> str:
    """The tag of a layer key: the key where it is a valid tag (``+`` becomes ``_``), else
    its start and a digest of it (tags have at most 128 characters)."""
    tag = _TAG_UNSAFE.sub("_", key)
    if len(tag) > 128:
        tag = tag[:100] + "-" + hashlib.sha256(key.encode()).hexdigest()[:27]
    return tag


@dataclass
class CacheReport:
    """What a build got from and gave to the layer cache (package labels)."""

    pulled: List[str] = field(default_factory=list)
    pushed: List[str] = field(default_factory=list)
    skipped: List[str] = field(default_factory=list)  # offered, but the cache had them already
    problems: List[str] = field(default_factory=list)
    bytes_pulled: int = 0
    bytes_pushed: int = 0

    def to_json(self) -> Dict[str, object]:
        return asdict(self)


class LayerCache:
    """One registry repository used as a layer cache."""

    def __init__(
        self,
        ref: str,
        *,
        access: Access = Access(),
        say: Callable[[str], None] = lambda line: None,
        client: Optional[RegistryClient] = None,
    ) -> None:
        r = parse_reference(ref, require_scheme=False, repository_only=True)
        self.ref = f"oras://{r.host}/{r.repository}"
        self.repository = r.repository
        self.client = client or access.client(r.host, r.repository)
        self.say = say

    # -- lookup ------------------------------------------------------------------------
    def lacking(self, plan: Plan, hashes: Sequence[str]) -> Tuple[List[str], str]:
        """The hashes among ``hashes`` whose layers the cache has no tag for (all of them
        when it cannot be asked), and why, in words, for a message."""
        self.client.begin()
        try:
            tags = set(self.client.tags(self.repository))
        except reg.NotFound:
            tags = set()
        except (RegistryError, DedalError, OSError) as exc:
            return list(hashes), f"the layer cache {self.ref} could not be asked ({_reason(exc)})"
        return (
            [h for h in hashes if cache_tag(plan.nodes[h].key or "") not in tags],
            f"the layer cache {self.ref} lacks them",
        )

    # -- pull --------------------------------------------------------------------------
    def pull(self, plan: Plan, hashes: Sequence[str], store: LayerStore, report: CacheReport) -> None:
        """Bring the layers of ``hashes`` the store lacks from the cache, where it has them."""
        wanted = [h for h in hashes if plan.nodes[h].key and not store.has(plan.nodes[h].key or "")]
        for h in wanted:
            node = plan.nodes[h]
            self.client.begin()  # each layer one registry operation, with its own deadline
            try:
                size = self._pull_one(plan, h, store)
            except reg.NotFound:
                continue
            except (RegistryError, DedalError, OSError, ValueError, TypeError) as exc:
                report.problems.append(f"{node.label}: {_reason(exc)}")
                self.say(f"layer cache {self.ref}: {node.label} not taken ({_reason(exc)}); building it here")
                if _unreachable(exc):
                    return  # one answer is enough: the rest would wait for the same timeouts
                continue
            report.pulled.append(node.label)
            report.bytes_pulled += size
            self.say(f"layer cache: pulled {node.label} ({human_size(size)})")

    def _pull_one(self, plan: Plan, h: str, store: LayerStore) -> int:
        node = plan.nodes[h]
        key = node.key or ""
        where = f"{self.ref}:{cache_tag(key)}"
        art = self.client.get_manifest_raw(self.repository, cache_tag(key), (OCI_MANIFEST,)).json()
        if art.get("artifactType") != ARTIFACT_LAYER:
            raise Refused(f"{where}: not a dedal layer (artifactType {art.get('artifactType')!r})")
        blobs = {d.get("mediaType"): d for d in art.get("layers") or [] if isinstance(d, dict)}
        sqfs, meta = blobs.get(LAYER_SQUASHFS), blobs.get(LAYER_MANIFEST)
        if not sqfs or not meta:
            raise Refused(f"{where}: the artifact lacks its squashfs or its manifest")
        try:
            data = json.loads(self.client.get_blob_bytes(self.repository, str(meta["digest"])))
        except RegistryError as exc:  # the bytes do not match their digest, among others
            raise Refused(f"{where}: its manifest blob: {_reason(exc)}") from None
        man = LayerManifest.from_json(data) if isinstance(data, dict) else None
        if man is None or man.key != key:
            raise Refused(f"{where}: its manifest is for {getattr(man, 'key', None)!r}, not {key}")
        if man.prefix != node.prefix_name:
            raise Refused(f"{where}: its manifest names prefix {man.prefix!r}, this plan needs {node.prefix_name!r}")
        if man.install_root != plan.install_root or man.base_id != plan.base_id or man.hash != h:
            raise Refused(
                f"{where}: built for install root {man.install_root} on base {man.base_id}, "
                f"this plan needs {plan.install_root} on {plan.base_id}"
            )
        if sqfs.get("digest") != f"sha256:{man.sha256}" or int(sqfs.get("size", -1)) != man.size:
            raise Refused(
                f"{where}: the squashfs descriptor ({sqfs.get('digest')}, {sqfs.get('size')} bytes) "
                f"is not the one its manifest records (sha256:{man.sha256}, {man.size} bytes)"
            )
        tmp = store.temp_path(key)
        try:
            download_blob(self.client, self.repository, str(sqfs["digest"]), man.size, tmp, where)  # length, sha256
            try:  # the entries, as every layer's before it is stored (a shared cache is where a bad one comes from)
                check_packed(tmp, man.prefix, plan.install_root, where)
            except UserError as exc:
                raise Refused(exc.one_line()) from None
            man.log = f"{where} (pulled; built on {man.host or 'another host'})"
            store.add(man, tmp)
        finally:
            tmp.unlink(missing_ok=True)
        return man.size

    # -- push --------------------------------------------------------------------------
    def push(self, plan: Plan, hashes: Sequence[str], store: LayerStore, report: CacheReport) -> None:
        """Offer the layers of ``hashes`` (built here) to the cache; those it has stay."""
        self.push_layers([(plan.nodes[h].label, plan.nodes[h].key or "") for h in hashes], store, report)

    def push_layers(self, layers: Sequence[Tuple[str, str]], store: LayerStore, report: CacheReport) -> None:
        """Offer the store's layers ``layers`` ((label, key) pairs; those not in the store
        are left out) to the cache; those it has are not sent again (``report.skipped``).
        The one push of every caller: the build's, and ``dedal layers push``'s."""
        for label, key in layers:
            if not key or not store.has(key):
                continue
            self.client.begin()
            try:
                sent = self._push_one(store.manifest(key), store)
            except (RegistryError, DedalError, OSError, ValueError, TypeError) as exc:
                report.problems.append(f"{label}: push failed ({_reason(exc)})")
                self.say(f"layer cache {self.ref}: pushing {label} failed ({_reason(exc)})")
                if _unreachable(exc):
                    return
                continue
            if sent is None:
                report.skipped.append(label)
                self.say(f"layer cache: {label} is there already")
            else:
                report.pushed.append(label)
                report.bytes_pushed += sent
                self.say(f"layer cache: pushed {label} ({human_size(sent)})")

    def _push_one(self, man: LayerManifest, store: LayerStore) -> Optional[int]:
        """Bytes sent for the layer (0 when the registry had its blobs), None when the
        cache already had it."""
        tag = cache_tag(man.key)
        if self.client.head_manifest(self.repository, tag):
            return None
        digest = f"sha256:{man.sha256}"
        sent = self.client.push_blob(self.repository, store.sqfs(man.key), digest, man.size)
        meta = canonical_json(man.to_json())
        meta_digest, meta_size, _ = self.client.push_bytes(self.repository, meta)
        self.client.push_bytes(self.repository, EMPTY_JSON)
        art = layer_artifact(
            squashfs={"digest": digest, "size": man.size},
            manifest={"digest": meta_digest, "size": meta_size},
            annotations={ANN_KEY: man.key, ANN_SPEC: f"{man.name}@{man.version}/{man.hash[:7]}"},
        )
        raw = canonical_json(art)
        self.client.put_manifest(self.repository, tag, raw, OCI_MANIFEST)
        return man.size if sent else 0


def _reason(exc: BaseException) -> str:
    return exc.one_line() if isinstance(exc, DedalError) else f"{type(exc).__name__}: {exc}"


def _unreachable(exc: BaseException) -> bool:
    """Whether ``exc`` is about the registry (unreachable, refusing us) rather than one
    layer's content: then the other layers are not asked for."""
    return not isinstance(exc, (Refused, IntegrityError, ValueError, TypeError))


class Refused(RegistryError):
    """A cached layer that fails its checks (not a layer, another key, another root)."""
