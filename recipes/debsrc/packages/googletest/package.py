# debsrc overlay: googletest from Debian's source package (recipes/debsrc/README.md)
import os

from spack.package import *
from spack.pkg.builtin.googletest import Googletest as BuiltinGoogletest


class Googletest(BuiltinGoogletest):
    """The builtin googletest recipe, unchanged: Debian's googletest_1.12.1.orig.tar.gz
    (bookworm 1.12.1-0.2) is byte-identical to the file Spack pins for 1.12.1, so the
    builtin version and sha256 stay; only the URL points at Debian."""

    # The Debian archive: packages.yaml `googletest: {package_attributes: {debian_mirror: URL}}`,
    # else DEDAL_DEBIAN_MIRROR in Spack's environment, else deb.debian.org
    debian_mirror = os.environ.get("DEDAL_DEBIAN_MIRROR") or "http://deb.debian.org/debian"
    debian_pool = {"1.12.1": "pool/main/g/googletest/googletest_1.12.1.orig.tar.gz"}

    def url_for_version(self, version):
        pool = self.debian_pool.get(str(version))
        if pool:
            return "{0}/{1}".format(self.debian_mirror.rstrip("/"), pool)
        return super().url_for_version(version)
