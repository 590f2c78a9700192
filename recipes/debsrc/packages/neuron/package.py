# debsrc overlay: NEURON from Debian's source package (recipes/debsrc/README.md)
import os

from spack.package import *
from spack.pkg.builtin.neuron import Neuron as BuiltinNeuron


class Neuron(BuiltinNeuron):
    """The builtin NEURON recipe; version 8.2.6 from Debian's neuron_8.2.6.orig.tar.gz
    (trixie neuron 8.2.6-1), with Debian's sha256.

    The builtin 8.2.3 is a git clone with submodules (GitHub, unreachable here), and
    bookworm's 8.2.2 orig answers 404 on this mirror. Debian's orig is GitHub's tag
    archive: the submodule directories under external/ are empty. CMake initializes
    two of them unconditionally (external/coding-conventions, external/Random123);
    they come as resources from Debian's own source packages of those projects, as
    Debian builds NEURON (build-depends bluebrain-hpc-coding-conventions,
    librandom123-dev). CoreNEURON, InterViews, catch2 and backward are not in the
    tarball: the variants that need them are off."""

    # The Debian archive: packages.yaml `neuron: {package_attributes: {debian_mirror: URL}}`,
    # else DEDAL_DEBIAN_MIRROR in Spack's environment, else deb.debian.org
    debian_mirror = os.environ.get("DEDAL_DEBIAN_MIRROR") or "http://deb.debian.org/debian"
    debian_pool = {"8.2.6": "pool/main/n/neuron/neuron_8.2.6.orig.tar.gz"}
    # resources take a fixed URL: DEDAL_DEBIAN_MIRROR applies, package_attributes do not
    _deb = (os.environ.get("DEDAL_DEBIAN_MIRROR") or "http://deb.debian.org/debian").rstrip("/") + "/"

    version("8.2.6", sha256="6bda88abdb6ed4eae188c3fce347adff3ec38cc1e53cbe27c02e67eebcbbbb73")

    with when("@8.2.6"):
        # trixie bluebrain-hpc-coding-conventions 1.0.0+git20221201-2
        resource(
            name="coding-conventions",
            url=_deb + "pool/main/b/bluebrain-hpc-coding-conventions/"
            "bluebrain-hpc-coding-conventions_1.0.0+git20221201.orig.tar.gz",
            sha256="c7404548e9cb46944c6a88cb64e91caa07703796454212d4a0adc9fcf9d12139",
            destination="external",
            placement="coding-conventions.debian",
        )
        # trixie librandom123 1.14.0+dfsg-6 (a DFSG repack of the Random123 1.14.0 tree)
        resource(
            name="Random123",
            url=_deb + "pool/main/libr/librandom123/librandom123_1.14.0+dfsg.orig.tar.xz",
            sha256="0ed9bf1de7732303f35529ff9b42b0ab84e1fbeaad8ba97768440d8e2b109e87",
            destination="external",
            placement="Random123.debian",
        )
        # setup.py (the Python module, built by CMake) has setup_requires=["wheel"]: without
        # it in the build environment setuptools goes to PyPI for it, and offline stops
        depends_on("py-wheel", type="build", when="+python")
        for _variant in ("coreneuron", "interviews", "tests", "backtrace"):
            conflicts("+" + _variant, msg="Debian's 8.2.6 orig has no submodules: build it ~" + _variant)

    def patch(self):
        # Spack places a resource only where nothing is: the archive's empty submodule
        # directories make way for Debian's trees (staged next to them)
        if self.spec.satisfies("@8.2.6"):
            for name in ("coding-conventions", "Random123"):
                target = join_path("external", name)
                os.rmdir(target)
                os.rename(target + ".debian", target)

    def url_for_version(self, version):
        pool = self.debian_pool.get(str(version))
        if pool:
            return "{0}/{1}".format(self.debian_mirror.rstrip("/"), pool)
        return super().url_for_version(version)
