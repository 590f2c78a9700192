# debsrc overlay: Open MPI from Debian's source package (recipes/debsrc/README.md)
import os

from spack.package import *
from spack.pkg.builtin.openmpi import Openmpi as BuiltinOpenmpi


class Openmpi(BuiltinOpenmpi):
    """The builtin openmpi recipe, plus version 5.0.7 from Debian trixie (openmpi 5.0.7-1).

    Debian re-tarred upstream's release tree as .tar.xz (upstream publishes .tar.bz2, whose
    sha256 is 119f2009...): the tree is the release one (configure, docs/_build, the bundled
    3rd-party/openpmix 5.0.5 and 3rd-party/prrte 3.0.8), so nothing else changes."""

    # The Debian archive: packages.yaml `openmpi: {package_attributes: {debian_mirror: URL}}`,
    # else DEDAL_DEBIAN_MIRROR in Spack's environment, else deb.debian.org
    debian_mirror = os.environ.get("DEDAL_DEBIAN_MIRROR") or "http://deb.debian.org/debian"
    debian_pool = {"5.0.7": "pool/main/o/openmpi/openmpi_5.0.7.orig.tar.xz"}

    version("5.0.7", sha256="97f10c04e9b9a1771db3fd005009e4c07afa3ce739f940e41eb0fc7397cb9473")

    # GCC 14 (debian-trixie) stops in oshmem on -Wint-conversion; Debian's own patch
    patch("debian-sshmem.patch", when="@5.0.7")

    def url_for_version(self, version):
        pool = self.debian_pool.get(str(version))
        if pool:
            return "{0}/{1}".format(self.debian_mirror.rstrip("/"), pool)
        return super().url_for_version(version)
