# dedal overlay: Arbor 0.9.0 from its PyPI sdist (spack-envs/README.md)
from spack.package import *
from spack.pkg.builtin.arbor import Arbor as BuiltinArbor


class Arbor(BuiltinArbor):
    """The builtin Arbor recipe; version 0.9.0 from PyPI's sdist arbor-0.9.0.tar.gz
    instead of GitHub's arbor-v0.9.0-full.tar.gz (unreachable here).

    The sdist is the same source tree with its submodules under ext/ (fmt, googletest,
    json, pugixml, pybind11, random123, google-benchmark, tinyopt) and the CMake build
    the recipe drives; its sha256 is PyPI's (listed in https://pypi.org/simple/arbor/,
    file https://files.pythonhosted.org/packages/.../arbor-0.9.0.tar.gz, 17,479,771
    bytes). The URL is PyPI's source alias: where it answers, Spack downloads it; where
    it does not, `dedal fetch` takes the file with this sha256 from PyPI's simple index."""

    version(
        "0.9.0",
        sha256="8b229d3832c76552ccff8358b087ccae7d407251860e32b488329bcc7577f695",
        url="https://files.pythonhosted.org/packages/source/a/arbor/arbor-0.9.0.tar.gz",
    )

    # Spack's cuda_arch, which the builtin recipe does not pass on: without it Arbor 0.9
    # compiles its kernels for its own list (60 70 80 90), one more architecture than the
    # environment asks for and the longest step of the build. Only for +cuda: a CPU Arbor's
    # package hash (and its layer, esd-neuro's) stays what it was. Spack's canonical source of a
    # ~cuda spec drops this method and, with it gone, writes the class body as it wrote it
    # before only if a statement remains: the `pass` below is that statement.
    pass

    @when("+cuda")
    def cmake_args(self):
        # imported here: an import at the top would change every Arbor's package hash
        from spack.build_systems.cmake import CMakeBuilder

        return super().cmake_args() + [CMakeBuilder.define_cuda_architectures(self)]
