# debsrc overlay: nlohmann-json from Debian's source package (recipes/debsrc/README.md)
import os

from spack.package import *
from spack.pkg.builtin.nlohmann_json import NlohmannJson as BuiltinNlohmannJson


class NlohmannJson(BuiltinNlohmannJson):
    """The builtin nlohmann-json recipe, unchanged: Debian's
    nlohmann-json3_3.11.2.orig.tar.gz (bookworm nlohmann-json3 3.11.2-2) is
    byte-identical to the file Spack pins for 3.11.2, so the builtin version and sha256
    stay; only the URL points at Debian."""

    # The Debian archive: packages.yaml `nlohmann-json: {package_attributes: {debian_mirror: URL}}`,
    # else DEDAL_DEBIAN_MIRROR in Spack's environment, else deb.debian.org
    debian_mirror = os.environ.get("DEDAL_DEBIAN_MIRROR") or "http://deb.debian.org/debian"
    debian_pool = {"3.11.2": "pool/main/n/nlohmann-json3/nlohmann-json3_3.11.2.orig.tar.gz"}

    def url_for_version(self, version):
        pool = self.debian_pool.get(str(version))
        if pool:
            return "{0}/{1}".format(self.debian_mirror.rstrip("/"), pool)
        return super().url_for_version(version)
