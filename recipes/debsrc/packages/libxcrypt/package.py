# debsrc overlay: libxcrypt from Debian's source package (recipes/debsrc/README.md)
import os

from spack.package import *
from spack.pkg.builtin.libxcrypt import Libxcrypt as BuiltinLibxcrypt


class Libxcrypt(BuiltinLibxcrypt):
    """The builtin libxcrypt recipe; version 4.4.38 from Debian's
    libxcrypt_4.4.38.orig.tar.xz (trixie libxcrypt 1:4.4.38-1), with Debian's sha256: a
    git snapshot without ``configure``: Spack's autoreconf step generates it (autotools
    as build dependencies, the base's externals)."""

    # The Debian archive: packages.yaml `libxcrypt: {package_attributes: {debian_mirror: URL}}`,
    # else DEDAL_DEBIAN_MIRROR in Spack's environment, else deb.debian.org
    debian_mirror = os.environ.get("DEDAL_DEBIAN_MIRROR") or "http://deb.debian.org/debian"
    debian_pool = {"4.4.38": "pool/main/libx/libxcrypt/libxcrypt_4.4.38.orig.tar.xz"}

    version("4.4.38", sha256="6a275a356622c64ba9f693892215dbb399c003a7a4afeed9c4c74070eaab20f4")

    # no configure in Debian's orig: autoreconf (the builtin adds these for @:4.4.17 only)
    with when("@4.4.38"):
        depends_on("autoconf", type="build")
        depends_on("automake@1.14:", type="build")
        depends_on("libtool", type="build")
        depends_on("m4", type="build")
        depends_on("pkgconfig", type="build")

    def url_for_version(self, version):
        pool = self.debian_pool.get(str(version))
        if pool:
            return "{0}/{1}".format(self.debian_mirror.rstrip("/"), pool)
        return super().url_for_version(version)
