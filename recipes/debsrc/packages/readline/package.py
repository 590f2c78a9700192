# debsrc overlay: readline from Debian's source package (recipes/debsrc/README.md)
import os

from spack.package import *
from spack.pkg.builtin.readline import Readline as BuiltinReadline


class Readline(BuiltinReadline):
    """The builtin readline recipe, unchanged: Debian's readline_8.2.orig.tar.gz (bookworm
    8.2-1.3, trixie 8.2-6) is byte-identical to the file Spack pins for 8.2, so the
    builtin version and sha256 stay; only the URL points at Debian. Upstream's patch 001
    comes from Debian's packaging instead of GNU's FTP mirror."""

    # The Debian archive: packages.yaml `readline: {package_attributes: {debian_mirror: URL}}`,
    # else DEDAL_DEBIAN_MIRROR in Spack's environment, else deb.debian.org
    debian_mirror = os.environ.get("DEDAL_DEBIAN_MIRROR") or "http://deb.debian.org/debian"
    debian_pool = {"8.2": "pool/main/r/readline/readline_8.2.orig.tar.gz"}

    # upstream's readline82-001 (ftpmirror.gnu.org, unreachable here) as Debian ships it
    # (bookworm readline 8.2-1.3, debian/patches/0001-Readline-8.2-patch-1-...): the same
    # change to nls.c, in git form (-p1), without upstream's patchlevel bump
    patch("readline82-001-debian.patch", level=1, when="@8.2")

    def url_for_version(self, version):
        pool = self.debian_pool.get(str(version))
        if pool:
            return "{0}/{1}".format(self.debian_mirror.rstrip("/"), pool)
        return super().url_for_version(version)


# the builtin's GNU-hosted readline82-001 is replaced by Debian's copy above
Readline.patches = {
    when: [p for p in plist if "readline-8.2-patches/readline82-001" not in getattr(p, "url", "")]
    for when, plist in Readline.patches.items()
}
