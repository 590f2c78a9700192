# dedal overlay: the OSU micro-benchmarks from a git repository archived into the mirror
# (recipes/gitsrc/README.md; origin, commit and sha256 in ../../git-sources.json)
from spack.package import *
from spack.pkg.builtin.osu_micro_benchmarks import OsuMicroBenchmarks as BuiltinOsuMicroBenchmarks


class OsuMicroBenchmarks(BuiltinOsuMicroBenchmarks):
    """The builtin OSU micro-benchmarks recipe (variants, configure arguments, run
    environment unchanged); version 7.4-bed60f5: the OSU 7.4 source tree as imported into
    github.com/sherrywong1220/osu-micro-benchmarks-7.4 (its first commit, bed60f5; CHANGES
    and configure say v7.4), archived by recipes/gitsrc/archive.py as `git archive` of that
    commit, gzip -n: the file GitHub's archive URL of the commit serves. Not OSU's release
    tarball (the builtin 7.4, sha256 1edd0c2e..., from mvapich.cse.ohio-state.edu, which
    is unreachable here), hence a version of its own; the tree ships configure, so no
    autoreconf."""

    version(
        "7.4-bed60f5",
        sha256="4d0b9ee6069db92422452f8bdfe0470853a4daf477b578a31ecf555c224883c7",
        url="https://github.com/sherrywong1220/osu-micro-benchmarks-7.4/archive/"
        "bed60f564c2908a6123315f49f6dd0c0ff5440a3.tar.gz",
        preferred=True,
    )
