# debsrc overlay: util-linux-uuid from Debian's source package (recipes/debsrc/README.md)
import os

from spack.package import *
from spack.pkg.builtin.util_linux_uuid import UtilLinuxUuid as BuiltinUtilLinuxUuid


class UtilLinuxUuid(BuiltinUtilLinuxUuid):
    """The builtin util-linux-uuid recipe; version 2.41.5 from Debian's
    util-linux_2.41.5.orig.tar.xz (trixie util-linux 2.41.5-0+deb13u1), with Debian's
    sha256: kernel.org's .tar.xz of the whole util-linux tree (with configure) that the
    builtin recipe builds libuuid from; Spack pins the .tar.gz."""

    # The Debian archive: packages.yaml `util-linux-uuid: {package_attributes: {debian_mirror: URL}}`,
    # else DEDAL_DEBIAN_MIRROR in Spack's environment, else deb.debian.org
    debian_mirror = os.environ.get("DEDAL_DEBIAN_MIRROR") or "http://deb.debian.org/debian"
    debian_pool = {"2.41.5": "pool/main/u/util-linux/util-linux_2.41.5.orig.tar.xz"}

    version("2.41.5", sha256="f586e35d320ff537aab3ffeca37e9ecd482ccbe013590db4429a414d8aa6a728")

    def url_for_version(self, version):
        pool = self.debian_pool.get(str(version))
        if pool:
            return "{0}/{1}".format(self.debian_mirror.rstrip("/"), pool)
        return super().url_for_version(version)
