# debsrc overlay: hwloc from Debian's source package (recipes/debsrc/README.md)
import os

from spack.package import *
from spack.pkg.builtin.hwloc import Hwloc as BuiltinHwloc


class Hwloc(BuiltinHwloc):
    """The builtin hwloc recipe; version 2.9.0 from Debian bookworm (hwloc 2.9.0-1).

    Debian ships a .tar.bz2 of the 2.9.0 release tree (configure included); Spack's builtin
    2.9.0 is upstream's .tar.gz (9d7d3450...), and upstream's own .tar.bz2 is 2070e963...,
    so this entry replaces the builtin 2.9.0 with Debian's sha256. (trixie's hwloc 2.12.0
    orig is not served by the Debian mirror used here: HTTP 404.)"""

    # The Debian archive: packages.yaml `hwloc: {package_attributes: {debian_mirror: URL}}`,
    # else DEDAL_DEBIAN_MIRROR in Spack's environment, else deb.debian.org
    debian_mirror = os.environ.get("DEDAL_DEBIAN_MIRROR") or "http://deb.debian.org/debian"
    debian_pool = {"2.9.0": "pool/main/h/hwloc/hwloc_2.9.0.orig.tar.bz2"}

    version("2.9.0", sha256="b3fb1a43a14d8fbcd8e976de5ede2ea7ce1d768ed173adb33c7ceaaf098dc970")

    def url_for_version(self, version):
        pool = self.debian_pool.get(str(version))
        if pool:
            return "{0}/{1}".format(self.debian_mirror.rstrip("/"), pool)
        return super().url_for_version(version)
