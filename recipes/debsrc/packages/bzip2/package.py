# debsrc overlay: bzip2 from Debian's source package (recipes/debsrc/README.md)
import os

from spack.package import *
from spack.pkg.builtin.bzip2 import Bzip2 as BuiltinBzip2


class Bzip2(BuiltinBzip2):
    """The builtin bzip2 recipe, unchanged: Debian's bzip2_1.0.8.orig.tar.gz (bookworm
    1.0.8-5, trixie 1.0.8-6) is byte-identical to the file Spack pins for 1.0.8, so the
    builtin version and sha256 stay; only the URL points at Debian."""

    # The Debian archive: packages.yaml `bzip2: {package_attributes: {debian_mirror: URL}}`,
    # else DEDAL_DEBIAN_MIRROR in Spack's environment, else deb.debian.org
    debian_mirror = os.environ.get("DEDAL_DEBIAN_MIRROR") or "http://deb.debian.org/debian"
    debian_pool = {"1.0.8": "pool/main/b/bzip2/bzip2_1.0.8.orig.tar.gz"}

    def url_for_version(self, version):
        pool = self.debian_pool.get(str(version))
        if pool:
            return "{0}/{1}".format(self.debian_mirror.rstrip("/"), pool)
        return super().url_for_version(version)
