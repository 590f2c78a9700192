"""Apptainer's layout inside the image: ``/.singularity.d/{actions,env,libs}``, the env
scripts, the runscript, ``labels.json``, the mount points Apptainer expects; and what a base
built by Apptainer already carries there (which an image built on it inherits)."""

from __future__ import annotations

import json
import os
import posixpath
from pathlib import Path
from typing import Optional, TYPE_CHECKING, Any, Dict, Mapping

from dedal.model.image import ENV_TEST, HELP_FILE, MOUNT_POINTS, SYMLINKS, TEST_FILE
from dedal.stages.assemble.tree import mkdirs, write_file

if TYPE_CHECKING:
    from dedal.model.base import BaseImage


# Same behaviour as the files `apptainer build` writes (internal/pkg/build/sources/
# base_environment.go), written here in dedal's words.
_SOURCE_ENV = (
    'for script in /.singularity.d/env/*.sh; do\n    if [ -f "$script" ]; then\n        . "$script"\n    fi\ndone\n'
)
ACTIONS = {
    "exec": "#!/bin/sh\n" + _SOURCE_ENV + '\nexec "$@"\n',
    "run": "#!/bin/sh\n"
    + _SOURCE_ENV
    + (
        '\nif [ -n "${APPTAINER_APPNAME:-}" ]; then\n'
        '    if [ -x "/scif/apps/${APPTAINER_APPNAME}/scif/runscript" ]; then\n'
        '        exec "/scif/apps/${APPTAINER_APPNAME}/scif/runscript" "$@"\n'
        "    fi\n"
        '    echo "No runscript for the app ${APPTAINER_APPNAME} in this image" >&2\n'
        "    exit 1\n"
        "elif [ -x /.singularity.d/runscript ]; then\n"
        '    exec /.singularity.d/runscript "$@"\n'
        "fi\n"
        'echo "No runscript in this image, running /bin/sh" >&2\n'
        'exec /bin/sh "$@"\n'
    ),
    "shell": "#!/bin/sh\n"
    + _SOURCE_ENV
    + (
        '\nif [ -n "${APPTAINER_SHELL:-}" ] && [ -x "$APPTAINER_SHELL" ]; then\n'
        '    exec "$APPTAINER_SHELL" "$@"\n'
        "elif [ -x /bin/bash ]; then\n"
        "    SHELL=/bin/bash\n"
        '    PS1="Apptainer ${APPTAINER_NAME:-}:\\\\w> "\n'
        "    export SHELL PS1\n"
        '    exec /bin/bash --norc "$@"\n'
        "elif [ -x /bin/sh ]; then\n"
        "    SHELL=/bin/sh\n"
        "    export SHELL\n"
        '    exec /bin/sh "$@"\n'
        "fi\n"
        'echo "ERROR: no /bin/sh in this image" >&2\n'
        "exit 1\n"
    ),
    "start": "#!/bin/sh\n\n# tell the instance's PID 1 to go on (Apptainer instances)\nkill -CONT 1\n\n"
    + _SOURCE_ENV
    + ("\nif [ -x /.singularity.d/startscript ]; then\n    exec /.singularity.d/startscript\nfi\n"),
    "test": "#!/bin/sh\n"
    + _SOURCE_ENV
    + (
        '\nif [ -x /.singularity.d/test ]; then\n    exec /.singularity.d/test "$@"\nfi\n'
        'echo "No test in this image, running /bin/sh -c true" >&2\nexec /bin/sh -c true\n'
    ),
}
ENV_01_BASE = "#!/bin/sh\n# base environment of the image (Apptainer's 01-base.sh): nothing to set\n"
ENV_95_APPS = (
    "#!/bin/sh\n# SCIF apps (`apptainer run --app NAME`): dedal images define none\n"
    'if [ -n "${APPTAINER_APPNAME:-}" ] && [ ! -d "/scif/apps/${APPTAINER_APPNAME}" ]; then\n'
    '    echo "Could not locate the container application: ${APPTAINER_APPNAME}"\n    exit 1\nfi\n'
)
ENV_99_BASE = (
    "#!/bin/sh\n# Apptainer adds its bound libraries (e.g. --nv) after everything else\n"
    'if [ -z "${LD_LIBRARY_PATH:-}" ]; then\n    LD_LIBRARY_PATH=/.singularity.d/libs\n'
    'else\n    LD_LIBRARY_PATH="$LD_LIBRARY_PATH:/.singularity.d/libs"\nfi\n'
    'PS1="Apptainer> "\nexport LD_LIBRARY_PATH PS1\n'
)
ENV_99_RUNTIMEVARS = (
    "#!/bin/sh\n# PATH set by `apptainer --env PATH=...`, --env PREPEND_PATH / APPEND_PATH\n"
    'if [ -n "${SING_USER_DEFINED_PREPEND_PATH:-}" ]; then\n'
    '    PATH="${SING_USER_DEFINED_PREPEND_PATH}:${PATH}"\nfi\n'
    'if [ -n "${SING_USER_DEFINED_APPEND_PATH:-}" ]; then\n'
    '    PATH="${PATH}:${SING_USER_DEFINED_APPEND_PATH}"\nfi\n'
    'if [ -n "${SING_USER_DEFINED_PATH:-}" ]; then\n    PATH="${SING_USER_DEFINED_PATH}"\nfi\n'
    "unset SING_USER_DEFINED_PREPEND_PATH SING_USER_DEFINED_APPEND_PATH SING_USER_DEFINED_PATH\n"
    "export PATH\n"
)
DEFAULT_RUNSCRIPT = (
    "#!/bin/sh\n# dedal default runscript: `apptainer run IMAGE CMD [ARG...]` runs CMD in the\n"
    "# image's environment; without a command, a shell\n"
    'if [ $# -eq 0 ]; then\n    exec /bin/sh\nfi\nexec "$@"\n'
)
STARTSCRIPT = "#!/bin/sh\n"


def script_text(script: str) -> str:
    """A script of the environment file as a file: ``#!/bin/sh`` unless it names its own interpreter."""
    if script.startswith("#!"):
        return script if script.endswith("\n") else script + "\n"
    return "#!/bin/sh\n" + script.rstrip("\n") + "\n"


def runscript_text(runscript: str) -> str:
    return script_text(runscript) if runscript.strip() else DEFAULT_RUNSCRIPT


def write_apptainer_files(
    tree: Path,
    *,
    env90: str,
    env91: str,
    runscript: str,
    labels: Mapping[str, str],
    help: str = "",
    test: str = "",
    env_test: str = "",
) -> None:
    """Apptainer's files in ``tree``; ``help`` and ``test`` (:mod:`.usage`) when given, and
    the environment file's own test (``env_test``, a script) that ``test`` runs last."""
    for rel, mode in MOUNT_POINTS.items():
        p = tree / rel
        if not p.exists() and not p.is_symlink():
            mkdirs(tree, rel)
            os.chmod(p, mode)
    for rel in (".singularity.d/libs", ".singularity.d/actions", ".singularity.d/env"):
        mkdirs(tree, rel)
    for name, text in ACTIONS.items():
        write_file(tree / ".singularity.d/actions" / name, text, 0o755)
    env = tree / ".singularity.d/env"
    write_file(env / "01-base.sh", ENV_01_BASE, 0o755)
    write_file(env / "90-environment.sh", env90, 0o755)
    write_file(env / "91-environment.sh", env91, 0o755)
    write_file(env / "95-apps.sh", ENV_95_APPS, 0o755)
    write_file(env / "99-base.sh", ENV_99_BASE, 0o755)
    write_file(env / "99-runtimevars.sh", ENV_99_RUNTIMEVARS, 0o755)
    write_file(tree / ".singularity.d/runscript", runscript, 0o755)
    write_file(tree / ".singularity.d/startscript", STARTSCRIPT, 0o755)
    if help:
        write_file(tree / HELP_FILE.lstrip("/"), help, 0o644)
    if test:
        write_file(tree / TEST_FILE.lstrip("/"), test, 0o755)
    if env_test:
        mkdirs(tree, posixpath.dirname(ENV_TEST))
        write_file(tree / ENV_TEST.lstrip("/"), env_test, 0o755)
    write_file(tree / ".singularity.d/labels.json", json.dumps(dict(labels), indent=4, sort_keys=True) + "\n", 0o644)
    for name, target in SYMLINKS.items():
        p = tree / name
        if not p.exists() and not p.is_symlink():
            os.symlink(target, p)
    for name in ("hosts", "resolv.conf"):  # Apptainer binds the host's over these
        p = tree / "etc" / name
        if p.is_symlink() or not p.exists():
            write_file(p, "", 0o644)


def base_singularity(base: Optional[BaseImage]) -> Dict[str, Any]:
    """What a base built by Apptainer carries in /.singularity.d (labels, %environment,
    $SINGULARITY_ENVIRONMENT, runscript), which an image built from it inherits."""
    found: Dict[str, Any] = {"labels": {}, "90-environment.sh": "", "91-environment.sh": "", "runscript": ""}
    if base is None:
        return found
    sd = Path(base.rootfs_dir) / ".singularity.d"
    try:
        data = json.loads((sd / "labels.json").read_text())
        if isinstance(data, dict):
            found["labels"] = {str(k): str(v) for k, v in data.items()}
    except (OSError, ValueError):
        pass
    for name, rel in (
        ("90-environment.sh", "env/90-environment.sh"),
        ("91-environment.sh", "env/91-environment.sh"),
        ("runscript", "runscript"),
    ):
        try:
            text = (sd / rel).read_text()
        except (OSError, UnicodeDecodeError):
            continue
        body = [line for line in text.splitlines() if line.strip() and not line.startswith("#")]
        if body and "There is no runscript defined" not in text:  # Apptainer's placeholders carry nothing
            found[name] = text
    return found
