# dedal: NEURON's ringtest, from its git repository archived into the mirror
# (recipes/gitsrc/README.md; origin, commit and sha256 in ../../git-sources.json)
import os

from spack.package import *


class NeuronRingtest(Package):
    """NEURON's ring network benchmark (github.com/neuronsimulator/ringtest), the NEURON
    application of the EBRAINS/EUHPC container paper: rings of ball-and-stick cells
    (B_BallStick of cell.hoc: hh in the soma, pas in 10-20 random branches), each ring
    started by one NetStim, spikes exchanged through ParallelContext over MPI.

    Installed: the tree of the pinned commit under share/neuron-ringtest (ringtest.py and
    the modules it imports, cell.hoc, mod/, reference_data/, the scripts), the mechanisms
    of mod/ compiled there by this NEURON's nrnivmodl (share/neuron-ringtest/x86_64/:
    special and libnrnmech.so, as `nrnivmodl mod` leaves them, with an RPATH to that
    directory), and bin/ringtest, which runs `special -mpi -python ringtest.py "$@"` with
    the tree on PYTHONPATH and HOC_LIBRARY_PATH: `srun -n 4 ringtest -nring 256 -tstop 100`
    from any directory. The spikes go to spk<ranks>.std in the working directory (one
    "time gid" line per spike, rank after rank: sort them, e.g. `sort -k1,1g -k2,2n`, or
    NEURON's sortspike, before comparing). Run as `special -mpi -python ringtest.py`,
    as ringtest's README and reference data were (python3 ringtest.py would need
    NEURON_INIT_MPI=1 and would not load mod/'s HalfGap, which only -gap uses).

    reference_data/spk1.100ms.std.ref holds the spikes of the defaults on one rank
    (`ringtest -tstop 100`: 16 rings of 8 cells, 688 spikes) as computed with hh.mod's
    TABLE (ringtest 6693ae2), which NEURON built ~coreneuron keeps (8.2's CoreNEURON
    builds comment it out).

    Version 2025.07.21-78b996a: the head of master (78b996a, 2025-07-21), archived by
    recipes/gitsrc/archive.py as `git archive` of that commit, gzip -n (the file GitHub's
    archive URL of the commit serves). The repository has no tags."""

    homepage = "https://github.com/neuronsimulator/ringtest"
    url = "https://github.com/neuronsimulator/ringtest/archive/78b996a7a9f2a9fadc23fd09a515d9a427cb2fab.tar.gz"

    version(
        "2025.07.21-78b996a",
        sha256="b01bebb8bfcb67fa11d0eb7cf529f0b8745656d55f88e08d5b6124b9274ce489",
        url="https://github.com/neuronsimulator/ringtest/archive/78b996a7a9f2a9fadc23fd09a515d9a427cb2fab.tar.gz",
    )

    depends_on("neuron+mpi+python", type=("build", "link", "run"))
    depends_on("mpi", type=("build", "link", "run"))
    depends_on("gmake", type="build")  # nrnivmodl runs make

    LAUNCHER = """#!/bin/sh
# ringtest [ringtest.py options]: NEURON's ringtest (dedal's neuron-ringtest recipe) with
# the mechanisms compiled for it, MPI initialized by NEURON (-mpi): under srun or mpirun
# every rank runs it; spikes go to spk<ranks>.std in the working directory.
share=@SHARE@
export PYTHONPATH="$share${PYTHONPATH:+:$PYTHONPATH}"
export HOC_LIBRARY_PATH="$share${HOC_LIBRARY_PATH:+:$HOC_LIBRARY_PATH}"
exec "$share/x86_64/special" -mpi -python "$share/ringtest.py" "$@"
"""

    @property
    def share(self):
        return join_path(self.prefix.share, "neuron-ringtest")

    def install(self, spec, prefix):
        share = self.share
        install_tree(self.stage.source_path, share, ignore=lambda path: path.startswith(".github"))
        mechs = join_path(share, "x86_64")
        nrnivmodl = Executable(join_path(spec["neuron"].prefix.bin, "nrnivmodl"))
        with working_dir(share):
            # compiled in place: special finds libnrnmech.so beside it at run time (its own
            # RPATH names only NEURON's lib and the working directory)
            nrnivmodl("-loadflags", "-Wl,-rpath," + mechs, "mod")
        for name in os.listdir(mechs):
            if name.endswith(".o"):
                os.remove(join_path(mechs, name))
        for name in ("special", "libnrnmech.so"):
            if not os.path.isfile(join_path(mechs, name)):
                raise InstallError(f"nrnivmodl left no {name} in {mechs}")
        mkdirp(prefix.bin)
        launcher = join_path(prefix.bin, "ringtest")
        with open(launcher, "w") as fh:
            fh.write(self.LAUNCHER.replace("@SHARE@", share))
        os.chmod(launcher, 0o755)
