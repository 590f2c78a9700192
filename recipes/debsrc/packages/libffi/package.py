# debsrc overlay: libffi from Debian's source package (recipes/debsrc/README.md)
import os

from spack.package import *
from spack.pkg.builtin.libffi import Libffi as BuiltinLibffi


class Libffi(BuiltinLibffi):
    """The builtin libffi recipe; version 3.4.8 from Debian's libffi_3.4.8.orig.tar.gz
    (trixie libffi 3.4.8-2), with Debian's sha256.

    Not bookworm's 3.4.4, although that file is byte-identical to Spack's: the builtin
    applies a GitHub commit to 3.4.3:3.4.4 (unreachable here) that GCC 14 needs
    (a forward declaration; implicit function declarations are errors there), and 3.4.8
    has it. Debian's 3.4.8 orig is a git snapshot without ``configure``: Spack's
    autoreconf step generates it (autotools as build dependencies, the base's externals)."""

    # The Debian archive: packages.yaml `libffi: {package_attributes: {debian_mirror: URL}}`,
    # else DEDAL_DEBIAN_MIRROR in Spack's environment, else deb.debian.org
    debian_mirror = os.environ.get("DEDAL_DEBIAN_MIRROR") or "http://deb.debian.org/debian"
    debian_pool = {"3.4.8": "pool/main/libf/libffi/libffi_3.4.8.orig.tar.gz"}

    version("3.4.8", sha256="cbb7f0b3b095dc506387ec1e35b891bfb4891d05b90a495bc69a10f2293f80ff")

    with when("@3.4.8"):
        depends_on("autoconf", type="build")
        depends_on("automake", type="build")
        depends_on("libtool", type="build")
        depends_on("m4", type="build")

    def configure_args(self):
        args = super().configure_args()
        if self.spec.satisfies("@3.4.8"):
            # the snapshot has no prebuilt doc/libffi.info, and makeinfo (texinfo) is in no
            # base: `make` stops with "makeinfo: command not found" (Error 127). And its
            # autoreconf'd AX_ENABLE_BUILDDIR top-level Makefile recurses into the
            # <triplet>/ build directory for a target it lacks ("No rule to make target
            # 'all-configured'"): build in place, as Debian's packaging does.
            args += ["--disable-docs", "--disable-builddir"]
        return args

    def url_for_version(self, version):
        pool = self.debian_pool.get(str(version))
        if pool:
            return "{0}/{1}".format(self.debian_mirror.rstrip("/"), pool)
        return super().url_for_version(version)
