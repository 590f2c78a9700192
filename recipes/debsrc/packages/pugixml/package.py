# debsrc overlay: pugixml from Debian's source package (recipes/debsrc/README.md)
import os

from spack.package import *
from spack.pkg.builtin.pugixml import Pugixml as BuiltinPugixml


class Pugixml(BuiltinPugixml):
    """The builtin pugixml recipe; version 1.14 from Debian's pugixml_1.14.orig.tar.gz
    (trixie pugixml 1.14-2), with Debian's sha256: not the release asset Spack pins
    (2f10e276...): another tarball of the same 1.14 tree."""

    # The Debian archive: packages.yaml `pugixml: {package_attributes: {debian_mirror: URL}}`,
    # else DEDAL_DEBIAN_MIRROR in Spack's environment, else deb.debian.org
    debian_mirror = os.environ.get("DEDAL_DEBIAN_MIRROR") or "http://deb.debian.org/debian"
    debian_pool = {"1.14": "pool/main/p/pugixml/pugixml_1.14.orig.tar.gz"}

    version("1.14", sha256="610f98375424b5614754a6f34a491adbddaaec074e9044577d965160ec103d2e")

    def url_for_version(self, version):
        pool = self.debian_pool.get(str(version))
        if pool:
            return "{0}/{1}".format(self.debian_mirror.rstrip("/"), pool)
        return super().url_for_version(version)
