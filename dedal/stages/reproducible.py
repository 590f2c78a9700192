"""The one date an image carries, as reproducible builds define it (``SOURCE_DATE_EPOCH``).

Every time stamp of an image (the labels ``org.opencontainers.image.created`` and
``org.label-schema.build-date``, ``dedal.source_date_epoch``, the SIF header and
descriptors, the SBOM's timestamp, the ``installation_time`` of every record of Spack's
database) is this date, so that the same inputs give the same bytes:

1. ``SOURCE_DATE_EPOCH`` from the environment, when set (https://reproducible-builds.org/specs/source-date-epoch/),
   as the command read it (:attr:`dedal.model.image_options.ImageOptions.source_date_epoch`);
2. else the committer date of the lock's Spack commit in the Spack checkout used: the
   newest input whose date the inputs themselves fix (the lock names that commit);
3. else 0 (1970-01-01T00:00:00Z: no date known, e.g. a Spack checkout without git).

Never the wall clock: when a build ran stays in the layer manifests, the build report
and the pipeline's artifacts, not in the image. `dedal rebuild` passes the
image's ``dedal.source_date_epoch`` label as that value.
"""

from __future__ import annotations

from pathlib import Path
from typing import Optional, Tuple

from dedal.adapters import git as git_adapter
from dedal.adapters import spack as spack_adapter
from dedal.errors import UserError
from dedal.model.config import Settings
from dedal.model.plan import Plan

LABEL = "dedal.source_date_epoch"


def image_date(plan: Plan, settings: Settings, sde: Optional[int]) -> Tuple[int, str]:
    """(seconds since 1970, where it came from) for an image of ``plan``; ``sde``: the
    ``SOURCE_DATE_EPOCH`` the command read (None when unset)."""
    if sde is not None:
        return sde, "SOURCE_DATE_EPOCH"
    commit = str(getattr(plan, "spack_commit", "") or "")
    if commit:
        try:
            root = spack_adapter.locate(settings)
        except UserError:
            root = None
        when = git_adapter.commit_time(Path(root), commit) if root is not None else None
        if when is not None:
            return when, f"the date of Spack commit {commit[:10]}"
    return 0, "no date known (SOURCE_DATE_EPOCH unset, no Spack commit date)"
