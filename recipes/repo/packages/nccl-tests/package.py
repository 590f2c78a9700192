# dedal overlay: nccl-tests from its git repository archived into the mirror
# (recipes/gitsrc/README.md; origin, commit and sha256 in ../../git-sources.json)
from spack.package import *
from spack.pkg.builtin.nccl_tests import NcclTests as BuiltinNcclTests


class NcclTests(BuiltinNcclTests):
    """The builtin nccl-tests recipe, unchanged; version 2.13.6 is the builtin's, sha256
    included: the tag's archive from github.com/NVIDIA/nccl-tests (v2.13.6, commit
    0b4c4cb9), which recipes/gitsrc/archive.py makes byte for byte with `git archive`
    of the tag, gzip -n, where GitHub cannot be reached. Restated here so that the
    manifest beside this repository and the recipe name the same file."""

    version(
        "2.13.6",
        sha256="52b472a58a4918d3221a9b8c4bd9335382643d7e241983918b64692d685cc3d1",
        preferred=True,
    )
