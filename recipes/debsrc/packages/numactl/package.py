# debsrc overlay: numactl from Debian's source package (recipes/debsrc/README.md)
import os

from spack.package import *
from spack.pkg.builtin.numactl import Numactl as BuiltinNumactl


class Numactl(BuiltinNumactl):
    """The builtin numactl recipe, plus version 2.0.16 from Debian bookworm (numactl 2.0.16-1).

    Debian's orig is GitHub's tag archive (no configure), like the builtin's own URLs; the
    builtin recipe runs ./autogen.sh in any case."""

    # The Debian archive: packages.yaml `numactl: {package_attributes: {debian_mirror: URL}}`,
    # else DEDAL_DEBIAN_MIRROR in Spack's environment, else deb.debian.org
    debian_mirror = os.environ.get("DEDAL_DEBIAN_MIRROR") or "http://deb.debian.org/debian"
    debian_pool = {"2.0.16": "pool/main/n/numactl/numactl_2.0.16.orig.tar.gz"}

    version("2.0.16", sha256="a35c3bdb3efab5c65927e0de5703227760b1101f5e27ab741d8f32b3d5f0a44c")

    def url_for_version(self, version):
        pool = self.debian_pool.get(str(version))
        if pool:
            return "{0}/{1}".format(self.debian_mirror.rstrip("/"), pool)
        return super().url_for_version(version)
