# debsrc overlay: xz from Debian's source package (recipes/debsrc/README.md)
import os

from spack.package import *

# Spack looks the builder classes up in the package's own module
from spack.pkg.builtin.xz import AutotoolsBuilder, MSBuildBuilder  # noqa: F401
from spack.pkg.builtin.xz import Xz as BuiltinXz


class Xz(BuiltinXz):
    """The builtin xz recipe; version 5.8.1 from Debian's xz-utils_5.8.1.orig.tar.xz
    (trixie xz-utils 5.8.1-1+deb13u1), with Debian's sha256: upstream's signed .tar.xz
    (Debian ships its .asc); Spack pins the .tar.bz2 of other versions, and 5.8.1 is
    unknown to it."""

    # The Debian archive: packages.yaml `xz: {package_attributes: {debian_mirror: URL}}`,
    # else DEDAL_DEBIAN_MIRROR in Spack's environment, else deb.debian.org
    debian_mirror = os.environ.get("DEDAL_DEBIAN_MIRROR") or "http://deb.debian.org/debian"
    debian_pool = {"5.8.1": "pool/main/x/xz-utils/xz-utils_5.8.1.orig.tar.xz"}

    version("5.8.1", sha256="0b54f79df85912504de0b14aec7971e3f964491af1812d83447005807513cd9e")

    def url_for_version(self, version):
        pool = self.debian_pool.get(str(version))
        if pool:
            return "{0}/{1}".format(self.debian_mirror.rstrip("/"), pool)
        return super().url_for_version(version)
