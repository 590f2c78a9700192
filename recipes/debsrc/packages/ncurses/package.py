# debsrc overlay: ncurses from Debian's source package (recipes/debsrc/README.md)
import os

from spack.package import *
from spack.pkg.builtin.ncurses import Ncurses as BuiltinNcurses


class Ncurses(BuiltinNcurses):
    """The builtin ncurses recipe, unchanged: Debian bookworm's ncurses_6.4.orig.tar.gz
    (ncurses 6.4-4) is byte-identical to upstream's ncurses-6.4.tar.gz (its upstream
    OpenPGP signature verifies), so the builtin version and sha256 stay; only the URL
    points at Debian. (trixie's 6.5+20250216 is a snapshot Spack does not know.)"""

    # The Debian archive: packages.yaml `ncurses: {package_attributes: {debian_mirror: URL}}`,
    # else DEDAL_DEBIAN_MIRROR in Spack's environment, else deb.debian.org
    debian_mirror = os.environ.get("DEDAL_DEBIAN_MIRROR") or "http://deb.debian.org/debian"
    debian_pool = {"6.4": "pool/main/n/ncurses/ncurses_6.4.orig.tar.gz"}

    def url_for_version(self, version):
        pool = self.debian_pool.get(str(version))
        if pool:
            return "{0}/{1}".format(self.debian_mirror.rstrip("/"), pool)
        return super().url_for_version(version)
