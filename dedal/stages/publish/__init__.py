"""Publish SIF images to OCI registries, and pull, list and inspect them, the way
``apptainer push|pull oras://`` does (../shared/notes/prior-art.md section D1):

* an OCI image manifest; config ``application/vnd.sylabs.sif.config.v1+json`` with the
  content ``{}`` (size 2, sha256:44136fa3...); exactly one layer
  ``application/vnd.sylabs.sif.layer.v1.sif`` whose digest is the SIF's sha256, with
  the annotation ``org.opencontainers.image.title`` = the file name; manifest
  annotations ``org.opencontainers.image.created`` (from the SIF's creation time),
  description, source, and dedal's provenance (environment, lock hash, Spack commit);
* pulls accept that layer type and the legacy ``appliciation/vnd.sylabs.sif.layer.tar``
  (sic), refuse any other layer count or type, check size and sha256, that the file is
  a SIF for the host's architecture, and only then rename it into place;
* the verification report and SBOMs are attached as OCI 1.1 artifacts whose
  ``subject`` is the image manifest; where the registry has no referrers API (the
  ``OCI-Subject`` header is missing from the answer) dedal maintains the
  ``sha256-<hex>`` tag (the referrers tag schema) that ``oras discover`` reads too.

All registry traffic goes through ``dedal.adapters.registry``; the values (references,
media types, manifests) are ``dedal.model.oci``'s. This package is the public face; the
work is in ``push`` (publish), ``pull``, ``attachments`` (grouping, artifacts, referrers
and the fallback index) and ``remote`` (list and inspect).
"""

from __future__ import annotations

from dedal.adapters.registry import Access, RegistryError
from dedal.model.oci import (
    EMPTY_JSON_DIGEST,
    SIF_CONFIG_MEDIA_TYPE,
    SIF_LAYER_MEDIA_TYPE,
    SIF_LAYER_MEDIA_TYPE_PROTO,
    Reference,
    is_remote,
    parse_reference,
)
from dedal.stages.publish.attachments import Attachment, group_attachments, verdict_of
from dedal.stages.publish.pull import IntegrityError, PullResult, default_pull_name, pull
from dedal.stages.publish.push import PublishResult, publish, source_url
from dedal.stages.publish.remote import ImageEntry, inspect_remote, list_images

__all__ = [
    "Reference",
    "parse_reference",
    "publish",
    "PublishResult",
    "pull",
    "PullResult",
    "list_images",
    "ImageEntry",
    "inspect_remote",
    "is_remote",
    "Attachment",
    "group_attachments",
    "verdict_of",
    "IntegrityError",
    "SIF_CONFIG_MEDIA_TYPE",
    "SIF_LAYER_MEDIA_TYPE",
    "SIF_LAYER_MEDIA_TYPE_PROTO",
    "EMPTY_JSON_DIGEST",
    "default_pull_name",
    "source_url",
    # re-exported from the registry adapter for callers that used them through this module
    "RegistryError",
    "Access",
]
