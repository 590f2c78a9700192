# debsrc overlay: gettext from Debian's source package (recipes/debsrc/README.md)
import os

from spack.package import *
from spack.pkg.builtin.gettext import Gettext as BuiltinGettext


class Gettext(BuiltinGettext):
    """The builtin gettext recipe, unchanged: Debian's gettext_0.21.orig.tar.xz (bookworm
    0.21-12) is byte-identical to the file Spack pins for 0.21, so the builtin version
    and sha256 stay; only the URL points at Debian (and libxml2's include directory is
    named where the base provides libxml2)."""

    # The Debian archive: packages.yaml `gettext: {package_attributes: {debian_mirror: URL}}`,
    # else DEDAL_DEBIAN_MIRROR in Spack's environment, else deb.debian.org
    debian_mirror = os.environ.get("DEDAL_DEBIAN_MIRROR") or "http://deb.debian.org/debian"
    debian_pool = {"0.21": "pool/main/g/gettext/gettext_0.21.orig.tar.xz"}

    def flag_handler(self, name, flags):
        # libxml2 from the base (external, prefix /usr): Spack adds no -I for a dependency in
        # a system prefix (build_environment skips it), and libxml2 keeps its headers in
        # include/libxml2, so libtextstyle's libcroco stops at <libxml/tree.h>
        if name == "cppflags" and self.spec.satisfies("+libxml2"):
            flags.append("-I" + join_path(self.spec["libxml2"].prefix.include, "libxml2"))
        return super().flag_handler(name, flags)

    def url_for_version(self, version):
        pool = self.debian_pool.get(str(version))
        if pool:
            return "{0}/{1}".format(self.debian_mirror.rstrip("/"), pool)
        return super().url_for_version(version)
