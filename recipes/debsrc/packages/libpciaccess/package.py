# debsrc overlay: libpciaccess from Debian's source package (recipes/debsrc/README.md)
import os

from spack.package import *
from spack.pkg.builtin.libpciaccess import Libpciaccess as BuiltinLibpciaccess


class Libpciaccess(BuiltinLibpciaccess):
    """The builtin libpciaccess recipe, unchanged: Debian's libpciaccess_0.17.orig.tar.gz
    (bookworm 0.17-2, trixie 0.17-3) is byte-identical to X.org's libpciaccess-0.17.tar.gz,
    so the builtin version and sha256 stay; only the URL points at Debian."""

    # The Debian archive: packages.yaml `libpciaccess: {package_attributes: {debian_mirror: URL}}`,
    # else DEDAL_DEBIAN_MIRROR in Spack's environment, else deb.debian.org
    debian_mirror = os.environ.get("DEDAL_DEBIAN_MIRROR") or "http://deb.debian.org/debian"
    debian_pool = {"0.17": "pool/main/libp/libpciaccess/libpciaccess_0.17.orig.tar.gz"}

    def url_for_version(self, version):
        pool = self.debian_pool.get(str(version))
        if pool:
            return "{0}/{1}".format(self.debian_mirror.rstrip("/"), pool)
        return super().url_for_version(version)
