# debsrc-tools overlay: curl from Debian's source package (recipes/debsrc-tools/README.md)
import os

from spack.package import *
from spack.pkg.builtin.curl import AutotoolsBuilder, NMakeBuilder  # noqa: F401  (the builtin's configure arguments)
from spack.pkg.builtin.curl import Curl as BuiltinCurl


class Curl(BuiltinCurl):
    """The builtin curl recipe; version 8.14.1 from Debian trixie's curl_8.14.1.orig.tar.gz
    (curl 8.14.1-2+deb13u7), with Debian's sha256: curl.se's release tarball, in the .tar.gz
    form (Spack pins the .tar.bz2 ones), and a version unknown to this Spack. It is here
    only because Spack's cmake always links Spack's curl (cmake's own downloads, never used
    by a build here)."""

    # The Debian archive: packages.yaml `curl: {package_attributes: {debian_mirror: URL}}`,
    # else DEDAL_DEBIAN_MIRROR in Spack's environment, else deb.debian.org
    debian_mirror = os.environ.get("DEDAL_DEBIAN_MIRROR") or "http://deb.debian.org/debian"
    debian_pool = {"8.14.1": "pool/main/c/curl/curl_8.14.1.orig.tar.gz"}

    version("8.14.1", sha256="6766ada7101d292b42b8b15681120acd68effa4a9660935853cf6d61f0d984d4")

    def url_for_version(self, version):
        pool = self.debian_pool.get(str(version))
        if pool:
            return "{0}/{1}".format(self.debian_mirror.rstrip("/"), pool)
        return super().url_for_version(version)
