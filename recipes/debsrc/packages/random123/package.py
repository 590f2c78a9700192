# debsrc overlay: random123 from Debian's source package (recipes/debsrc/README.md)
import os

from spack.package import *
from spack.pkg.builtin.random123 import Random123 as BuiltinRandom123


class Random123(BuiltinRandom123):
    """The builtin random123 recipe; version 1.14.0 from Debian's
    librandom123_1.14.0+dfsg.orig.tar.xz (trixie librandom123 1.14.0+dfsg-6), with
    Debian's sha256: a DFSG repack (include/, docs, examples, tests kept): other sha256
    than the GitHub tag archive Spack pins; the recipe installs include/ only."""

    # The Debian archive: packages.yaml `random123: {package_attributes: {debian_mirror: URL}}`,
    # else DEDAL_DEBIAN_MIRROR in Spack's environment, else deb.debian.org
    debian_mirror = os.environ.get("DEDAL_DEBIAN_MIRROR") or "http://deb.debian.org/debian"
    debian_pool = {"1.14.0": "pool/main/libr/librandom123/librandom123_1.14.0+dfsg.orig.tar.xz"}

    version("1.14.0", sha256="0ed9bf1de7732303f35529ff9b42b0ab84e1fbeaad8ba97768440d8e2b109e87")

    def url_for_version(self, version):
        pool = self.debian_pool.get(str(version))
        if pool:
            return "{0}/{1}".format(self.debian_mirror.rstrip("/"), pool)
        return super().url_for_version(version)
