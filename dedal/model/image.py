"""Where things are inside an image dedal assembles (and builds run in): fixed paths.

The same names serve the assembly that writes them, the base that precomputes what an
image leaves of it (:func:`image_tops`), and the runtimes and tests that read them.
"""

from __future__ import annotations

from typing import List

STD_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
ENV_IN_IMAGE = "/opt/dedal/env"  # spack.yaml + spack.lock of the image (like containerize's /opt/spack-environment)
# the files of ENV_IN_IMAGE besides spack.yaml and spack.lock: the environment file and the base
# definitions the image was assembled from (assemble writes them, rebuild reads them back)
ENV_FILE = "env.yaml"
BASE_FILE = "base.yaml"
RUNTIME_BASE_FILE = "runtime-base.yaml"
SBOM_IN_IMAGE = "/opt/dedal/sbom.cdx.json"
ENV_SCRIPT = "/.singularity.d/env/91-environment.sh"
HELP_FILE = "/.singularity.d/runscript.help"  # `apptainer run-help IMAGE`
TEST_FILE = "/.singularity.d/test"  # `apptainer test IMAGE`: dedal's checks, then ENV_TEST
ENV_TEST = "/opt/dedal/env-test"  # the environment file's own test (dedal.test), when it has one
SYMLINKS = {
    ".run": ".singularity.d/actions/run",
    ".exec": ".singularity.d/actions/exec",
    ".test": ".singularity.d/actions/test",
    ".shell": ".singularity.d/actions/shell",
    "apptainer": ".singularity.d/runscript",
    "singularity": ".singularity.d/runscript",
    "environment": ".singularity.d/env/90-environment.sh",
}
MOUNT_POINTS = {
    "dev": 0o755,
    "proc": 0o555,
    "sys": 0o555,
    "tmp": 0o1777,
    "etc": 0o755,
    "home": 0o755,
    "root": 0o700,
    "var": 0o755,
    "var/tmp": 0o1777,
}


def image_tops(install_root: str, view: str) -> List[str]:
    """The top-level names an assembly may change: the install root's, the view's,
    /opt/dedal's, Apptainer's files and mount points. Everything else in the image is the
    base's as it is (and is reused compressed, see :func:`base_part`)."""
    paths = [install_root, view, ENV_IN_IMAGE, SBOM_IN_IMAGE, ENV_SCRIPT, *SYMLINKS, *MOUNT_POINTS]
    return sorted({p.strip("/").split("/")[0] for p in paths})
