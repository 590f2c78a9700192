# debsrc overlay: fmt from Debian's source package (recipes/debsrc/README.md)
import os

from spack.package import *
from spack.pkg.builtin.fmt import Fmt as BuiltinFmt


class Fmt(BuiltinFmt):
    """The builtin fmt recipe; version 10.1.1 from Debian's fmtlib_10.1.1+ds1.orig.tar.gz
    (trixie fmtlib 10.1.1+ds1-4), with Debian's sha256: a +ds1 repack (the tree has
    CMakeLists.txt, include, src, support, test, doc); version unknown to this Spack;
    arbor asks for fmt@9.1:."""

    # The Debian archive: packages.yaml `fmt: {package_attributes: {debian_mirror: URL}}`,
    # else DEDAL_DEBIAN_MIRROR in Spack's environment, else deb.debian.org
    debian_mirror = os.environ.get("DEDAL_DEBIAN_MIRROR") or "http://deb.debian.org/debian"
    debian_pool = {"10.1.1": "pool/main/f/fmtlib/fmtlib_10.1.1+ds1.orig.tar.gz"}

    version("10.1.1", sha256="7000f214d2628f04174822f8048c573f1608194408d7931121595a03f1c18a17")

    def url_for_version(self, version):
        pool = self.debian_pool.get(str(version))
        if pool:
            return "{0}/{1}".format(self.debian_mirror.rstrip("/"), pool)
        return super().url_for_version(version)


# The builtin's GitHub patch for @10.0.0:10.1.1 fixes compiling with clang in CUDA mode
# (fmtlib/fmt#3740); GitHub is unreachable here and this stack builds fmt with GCC: not applied
Fmt.patches = {
    when: [p for p in plist if "89860eb9013a345608c8144b1aad5f12b0682d7e" not in getattr(p, "url", "")]
    for when, plist in Fmt.patches.items()
}
