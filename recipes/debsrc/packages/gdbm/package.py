# debsrc overlay: gdbm from Debian's source package (recipes/debsrc/README.md)
import os

from spack.package import *
from spack.pkg.builtin.gdbm import Gdbm as BuiltinGdbm


class Gdbm(BuiltinGdbm):
    """The builtin gdbm recipe, unchanged: Debian's gdbm_1.23.orig.tar.gz (bookworm 1.23-3)
    is byte-identical to the file Spack pins for 1.23, so the builtin version and sha256
    stay; only the URL points at Debian."""

    # The Debian archive: packages.yaml `gdbm: {package_attributes: {debian_mirror: URL}}`,
    # else DEDAL_DEBIAN_MIRROR in Spack's environment, else deb.debian.org
    debian_mirror = os.environ.get("DEDAL_DEBIAN_MIRROR") or "http://deb.debian.org/debian"
    debian_pool = {"1.23": "pool/main/g/gdbm/gdbm_1.23.orig.tar.gz"}

    def url_for_version(self, version):
        pool = self.debian_pool.get(str(version))
        if pool:
            return "{0}/{1}".format(self.debian_mirror.rstrip("/"), pool)
        return super().url_for_version(version)
