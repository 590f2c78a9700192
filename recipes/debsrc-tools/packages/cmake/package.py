# debsrc-tools overlay: cmake from Debian's source package (recipes/debsrc-tools/README.md)
import os

from spack.package import *
from spack.pkg.builtin.cmake import Cmake as BuiltinCmake


class Cmake(BuiltinCmake):
    """The builtin cmake recipe, unchanged: Debian bookworm's cmake_3.25.1.orig.tar.gz
    (cmake 3.25.1-1) is byte-identical to Kitware's cmake-3.25.1.tar.gz, so the builtin
    version and sha256 stay; only the URL points at Debian. (trixie's 3.31.6 orig answers
    404 on the mirror used here.)

    The builtin keeps only the last patch release of each minor series (3.25.3) and marks
    3.25.1 deprecated, which Spack refuses to choose: it is declared again here, not deprecated.
    It runs only at build time, in the build sandbox, and is in no image."""

    # The Debian archive: packages.yaml `cmake: {package_attributes: {debian_mirror: URL}}`,
    # else DEDAL_DEBIAN_MIRROR in Spack's environment, else deb.debian.org
    debian_mirror = os.environ.get("DEDAL_DEBIAN_MIRROR") or "http://deb.debian.org/debian"
    debian_pool = {"3.25.1": "pool/main/c/cmake/cmake_3.25.1.orig.tar.gz"}

    version("3.25.1", sha256="1c511d09516af493694ed9baf13c55947a36389674d657a2d5e0ccedc6b291d8")

    # curl 8.14 (the one built beside it) declares CURLOPT_NETRC's values as the enum
    # CURL_NETRC_OPTION and checks setopt's argument types: 3.25's assignments of the long
    # constants to that enum no longer compile ("invalid conversion from 'long int' to
    # 'CURL_NETRC_OPTION'"). The patch makes the variable a long, as later CMake releases have it.
    patch("cmcurl-netrc-option-long.patch", when="@3.25.1")

    def url_for_version(self, version):
        pool = self.debian_pool.get(str(version))
        if pool:
            return "{0}/{1}".format(self.debian_mirror.rstrip("/"), pool)
        return super().url_for_version(version)
