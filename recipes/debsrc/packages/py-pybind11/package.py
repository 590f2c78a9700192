# debsrc overlay: py-pybind11 from Debian's source package (recipes/debsrc/README.md)
import os

from spack.package import *

# Spack looks the builder classes up in the package's own module
from spack.pkg.builtin.py_pybind11 import CMakeBuilder  # noqa: F401
from spack.pkg.builtin.py_pybind11 import PyPybind11 as BuiltinPyPybind11


class PyPybind11(BuiltinPyPybind11):
    """The builtin py-pybind11 recipe; version 2.10.3 from Debian's
    pybind11_2.10.3.orig.tar.gz (bookworm pybind11 2.10.3-1), with Debian's sha256:
    version unknown to this Spack (trixie's 2.13.6 orig answers 404 on this mirror);
    arbor asks for py-pybind11@2.10.1:."""

    # The Debian archive: packages.yaml `py-pybind11: {package_attributes: {debian_mirror: URL}}`,
    # else DEDAL_DEBIAN_MIRROR in Spack's environment, else deb.debian.org
    debian_mirror = os.environ.get("DEDAL_DEBIAN_MIRROR") or "http://deb.debian.org/debian"
    debian_pool = {"2.10.3": "pool/main/p/pybind11/pybind11_2.10.3.orig.tar.gz"}

    version("2.10.3", sha256="5d8c4c5dda428d3a944ba3d2a5212cb988c2fae4670d58075a5a49075a6ca315")

    def url_for_version(self, version):
        pool = self.debian_pool.get(str(version))
        if pool:
            return "{0}/{1}".format(self.debian_mirror.rstrip("/"), pool)
        return super().url_for_version(version)
