# debsrc overlay: UCX from Debian's source package (recipes/debsrc/README.md)
import os

from spack.package import *
from spack.pkg.builtin.ucx import Ucx as BuiltinUcx


class Ucx(BuiltinUcx):
    """The builtin ucx recipe; version 1.13.1 from Debian bookworm (ucx 1.13.1-1).

    Debian's orig is a snapshot of the git tag, not upstream's release tarball (efc37829...):
    there is no configure, so ./autogen.sh runs first (with the autotools as build
    dependencies). (trixie's ucx 1.18.1+ds orig is not served by the Debian mirror used
    here: HTTP 404.)"""

    # The Debian archive: packages.yaml `ucx: {package_attributes: {debian_mirror: URL}}`,
    # else DEDAL_DEBIAN_MIRROR in Spack's environment, else deb.debian.org
    debian_mirror = os.environ.get("DEDAL_DEBIAN_MIRROR") or "http://deb.debian.org/debian"
    debian_pool = {"1.13.1": "pool/main/u/ucx/ucx_1.13.1.orig.tar.xz"}

    version("1.13.1", sha256="1a88e09ca1b406c046a469c2ae271d2c330050b5664c0bcd9890e26c6ef09f3c")

    for _tool in ("autoconf", "automake", "libtool", "m4"):
        depends_on(_tool, type="build", when="@1.13.1")

    # The sockaddr test application misses #include <cstdint>, which GCC 14's libstdc++
    # (debian-trixie) no longer pulls in through <string>: `make` stops with "'uint32_t'
    # does not name a type". UCX 1.14 has the include.
    patch("gcc14-sa-util-cstdint.patch", when="@1.13.1")

    def url_for_version(self, version):
        pool = self.debian_pool.get(str(version))
        if pool:
            return "{0}/{1}".format(self.debian_mirror.rstrip("/"), pool)
        return super().url_for_version(version)

    @when("@1.13.1")
    def autoreconf(self, spec, prefix):
        Executable("./autogen.sh")()

    def patch(self):
        super().patch()
        if self.spec.satisfies("@1.13.1"):
            # The orig tarball leaves out upstream's debian/ packaging templates, which
            # configure.ac still lists (AC_CONFIG_FILES): automake stops with "required
            # file 'debian/rules.in' not found" unless they exist.
            mkdirp("debian")
            for name in ("rules.in", "control.in", "changelog.in", "compat", "copyright", "ucx.prerm"):
                touch(join_path("debian", name))
