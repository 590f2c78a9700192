# debsrc overlay: zlib from Debian's source package (recipes/debsrc/README.md)
import os

from spack.package import *

# Spack looks the builder classes up in the package's own module
from spack.pkg.builtin.zlib import GenericBuilder, MakefileBuilder  # noqa: F401
from spack.pkg.builtin.zlib import Zlib as BuiltinZlib


class Zlib(BuiltinZlib):
    """The builtin zlib recipe; version 1.3.1 from Debian trixie (zlib 1:1.3.dfsg+really1.3.1-1).

    Debian's orig is a DFSG repack of 1.3.1 (parts of contrib/ removed), so its sha256
    differs from upstream's zlib-1.3.1.tar.gz (9a93b2b7...). Built rather than taken from
    the base: Open MPI's bundled PMIx is configured --with-zlib=<prefix>, and Debian's
    multiarch /usr/lib/x86_64-linux-gnu is not where it looks under /usr."""

    # The Debian archive: packages.yaml `zlib: {package_attributes: {debian_mirror: URL}}`,
    # else DEDAL_DEBIAN_MIRROR in Spack's environment, else deb.debian.org
    debian_mirror = os.environ.get("DEDAL_DEBIAN_MIRROR") or "http://deb.debian.org/debian"
    debian_pool = {"1.3.1": "pool/main/z/zlib/zlib_1.3.dfsg+really1.3.1.orig.tar.gz"}

    version("1.3.1", sha256="60dd315c07f616887caa029408308a018ace66e3d142726a97db164b3b8f69fb")

    def url_for_version(self, version):
        pool = self.debian_pool.get(str(version))
        if pool:
            return "{0}/{1}".format(self.debian_mirror.rstrip("/"), pool)
        return super().url_for_version(version)
