# debsrc overlay: python from Debian's source package (recipes/debsrc/README.md)
import os

from spack.package import *
from spack.pkg.builtin.python import Python as BuiltinPython


class Python(BuiltinPython):
    """The builtin python recipe, unchanged: Debian's python3.11_3.11.2.orig.tar.gz
    (bookworm python3.11 3.11.2-6+deb12u8) is byte-identical to the file Spack pins for
    3.11.2, so the builtin version and sha256 stay; only the URL points at Debian."""

    # The Debian archive: packages.yaml `python: {package_attributes: {debian_mirror: URL}}`,
    # else DEDAL_DEBIAN_MIRROR in Spack's environment, else deb.debian.org
    debian_mirror = os.environ.get("DEDAL_DEBIAN_MIRROR") or "http://deb.debian.org/debian"
    debian_pool = {"3.11.2": "pool/main/p/python3.11/python3.11_3.11.2.orig.tar.gz"}

    def url_for_version(self, version):
        pool = self.debian_pool.get(str(version))
        if pool:
            return "{0}/{1}".format(self.debian_mirror.rstrip("/"), pool)
        return super().url_for_version(version)
