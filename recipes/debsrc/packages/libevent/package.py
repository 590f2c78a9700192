# debsrc overlay: libevent from Debian's source package (recipes/debsrc/README.md)
import os

from spack.package import *
from spack.pkg.builtin.libevent import Libevent as BuiltinLibevent


class Libevent(BuiltinLibevent):
    """The builtin libevent recipe, unchanged: Debian's libevent_2.1.12-stable.orig.tar.gz
    (bookworm 2.1.12-stable-8, trixie 2.1.12-stable-10) is byte-identical to upstream's
    release file, so the builtin version and sha256 stay; only the URL points at Debian."""

    # The Debian archive: packages.yaml `libevent: {package_attributes: {debian_mirror: URL}}`,
    # else DEDAL_DEBIAN_MIRROR in Spack's environment, else deb.debian.org
    debian_mirror = os.environ.get("DEDAL_DEBIAN_MIRROR") or "http://deb.debian.org/debian"
    debian_pool = {"2.1.12": "pool/main/libe/libevent/libevent_2.1.12-stable.orig.tar.gz"}

    def url_for_version(self, version):
        pool = self.debian_pool.get(str(version))
        if pool:
            return "{0}/{1}".format(self.debian_mirror.rstrip("/"), pool)
        return super().url_for_version(version)
