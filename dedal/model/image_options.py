"""What an image is made of besides its plan: the environment file's image section (or a
command's flags over it) and the image's one date, resolved once at the command.

``SOURCE_DATE_EPOCH`` stays the user's way to fix the date; the command reads it once
(:func:`dedal.model.sif.source_date_epoch`) into :attr:`ImageOptions.source_date_epoch`, and
assembly takes that value, never the environment variable.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Dict, Mapping, Optional, Sequence, Tuple

from dedal.model.envfile import EnvFile


@dataclass(frozen=True)
class ImageOptions:
    only: Optional[Tuple[str, ...]] = None  # a subset image: these packages and their link/run closure
    keep_build_deps: bool = False
    runscript: str = ""
    help: str = ""  # printed by `apptainer run-help` before dedal's own text
    test: str = ""  # run by `apptainer test` after dedal's own checks
    labels: Dict[str, str] = field(default_factory=dict)
    description: str = ""
    runtime_base: str = ""  # a base name; empty: the plan's (else its build base)
    env_file: Optional[Path] = None  # the env.yaml whose dedal: section the image carries
    source_date_epoch: Optional[int] = None  # the image's date when fixed; None: the Spack commit's

    @classmethod
    def of(
        cls,
        env: Optional[EnvFile],
        *,
        only: Optional[Sequence[str]] = None,
        keep_build_deps: Optional[bool] = None,
        runscript: Optional[str] = None,
        labels: Optional[Mapping[str, str]] = None,
        description: Optional[str] = None,
        runtime_base: Optional[str] = None,
        source_date_epoch: Optional[int] = None,
    ) -> "ImageOptions":
        """The environment file's values (none for a lock or a plan), each flag given over it;
        ``source_date_epoch`` as the command read it (:func:`dedal.model.sif.source_date_epoch`)."""
        if only is None and env is not None and env.only:
            only = list(env.only)
        user_labels = dict(env.labels) if env is not None else {}
        user_labels.update(labels or {})
        return cls(
            only=tuple(only) if only is not None else None,
            keep_build_deps=bool(
                keep_build_deps if keep_build_deps is not None else (env.keep_build_deps if env is not None else False)
            ),
            runscript=runscript if runscript is not None else (env.runscript if env is not None else ""),
            help=env.help if env is not None else "",
            test=env.test if env is not None else "",
            labels=user_labels,
            description=description if description is not None else (env.description if env is not None else ""),
            runtime_base=runtime_base or (env.runtime_base if env is not None else None) or "",
            env_file=Path(env.path) if env is not None else None,
            source_date_epoch=source_date_epoch,
        )
