# dedal: the Arbor "busyring" benchmark of the EUHPC container evaluation, from its git
# repository archived into the mirror (recipes/gitsrc/README.md; origin, commit and sha256
# in ../../git-sources.json)
import os

from spack.package import *


class ArborBusyring(CMakePackage):
    """The Arbor ring benchmark the EBRAINS/EUHPC container paper ran natively and in the
    container: ring.cpp of github.com/thorstenhater/euhpc-arbor-benchmark ("busyring"; its
    usage line calls it arbor-busyring) and gen-inputs.py, which writes the paper's inputs.

    The program reads one JSON file of parameters (`busyring input.json [opath]`; without
    one, 5,000 simple cells in rings of 5 for 200 ms) and prints the context (threads,
    ranks), the cell statistics, the number of spikes and Arbor's meter report (wall time
    and memory of model-init and model-run, averaged over ranks); it writes no files.
    `busyring-input CELLS [DURATION]` (installed beside it) prints the parameter file of
    the paper's model for CELLS cells in all, the values of gen-inputs.py (complex cells
    with the Allen catalogue's channels, depth 10, 10 synapses per cell, rings of 4,
    dt 0.025 ms, 200 ms) without its GPU arithmetic (cells per GPU x GPUs per node x nodes).

    Version 2024.09.19-0adb4ae: the head of main (0adb4ae, 2024-09-19), archived by
    recipes/gitsrc/archive.py as `git archive` of that commit, gzip -n (the file GitHub's
    archive URL of the commit serves). The repository has no tags.

    What changes in the tree, and why (patch(), each edit found exactly once or the build
    stops):
    - CMakeLists.txt adds the submodule ext/json, which no archive of the commit holds:
      nlohmann-json comes from Spack (find_package(nlohmann_json), as the repository's
      first commit did; Arbor itself needs the same 3.11.2). Arbor's exported arborio
      target names pugixml::pugixml and nlohmann_json::nlohmann_json without finding them
      (its config finds only Threads and MPI): both are found here. The Arbor version
      it asks for is the one it is built against, and busyring is installed to bin/
      (upstream has no install rule).
    - ring.cpp is written for Arbor 0.10 (typed units, arb::units, LLNL units). Against
      Arbor 0.9 (esd-neuro's) three lines change: `namespace U = arb::units` becomes
      plain factors of 1 (every quantity in ring.cpp is given in the unit Arbor 0.9 takes
      as a bare number: ms, mV, Ohm*cm for axial resistivity, F/m^2 for membrane
      capacitance, so the numbers Arbor sees are the same);
      explicit_generator_from_milliseconds is Arbor 0.9's explicit_generator (times in
      ms); the soma probe's tag "Um" is 0 (0.9's probe tags are integers; nothing
      samples that probe). With Arbor 0.10 or later the source is built unchanged.

    ring.cpp binds threads and processes (proc_allocation bind_threads/bind_procs): an
    Arbor built without hwloc throws 'Binding' at start-up. The paper built busyring with
    CXX=mpicxx, as here, and `CMAKE_INTERPROCEDURAL_OPTIMIZATION=ON`: Spack's `+ipo`
    (esd-neuro asks for it)."""

    homepage = "https://github.com/thorstenhater/euhpc-arbor-benchmark"
    url = (
        "https://github.com/thorstenhater/euhpc-arbor-benchmark/archive/0adb4ae9ff03a2158c1284634e9163665997506a.tar.gz"
    )

    version(
        "2024.09.19-0adb4ae",
        sha256="e258f781a5178baac07d3f69eb94e87ac1b7173a6c1ff618be7b64997676bc02",
        url="https://github.com/thorstenhater/euhpc-arbor-benchmark/archive/"
        "0adb4ae9ff03a2158c1284634e9163665997506a.tar.gz",
    )

    depends_on("cmake@3.19:", type="build")
    depends_on("arbor@0.9:+mpi")
    depends_on("mpi")
    depends_on("nlohmann-json@3.11.2:", type="build")  # header-only
    depends_on("pugixml")  # arbor::arborio links pugixml::pugixml (Spack's Arbor takes no bundled one)

    # (file, text in the tree, text it becomes; {arbor}: the Arbor version built against)
    CMAKE_EDITS = [
        ("CMakeLists.txt", "find_package(arbor 0.10.0 CONFIG REQUIRED)", "find_package(arbor {arbor} CONFIG REQUIRED)"),
        ("CMakeLists.txt", 'set(JSON_Install OFF CACHE INTERNAL "")\n', ""),
        (
            "CMakeLists.txt",
            "add_subdirectory(ext/json)\n",
            "find_package(nlohmann_json CONFIG REQUIRED)\nfind_package(pugixml CONFIG REQUIRED)\n",
        ),
    ]
    CMAKE_INSTALL = "\ninstall(TARGETS busyring RUNTIME DESTINATION bin)  # dedal\n"
    # builds against Arbor 0.9 (ring.cpp is written for 0.10's typed units)
    ARBOR_09_EDITS = [
        (
            "ring.cpp",
            "namespace U = arb::units;",
            "namespace U { constexpr double ms = 1, mV = 1, Ohm = 1, cm = 1, F = 1, m2 = 1; }"
            "  // dedal: Arbor 0.9's bare units",
        ),
        ("ring.cpp", "arb::explicit_generator_from_milliseconds(", "arb::explicit_generator("),
        ("ring.cpp", '{{cable_probe_membrane_voltage{loc}, "Um"}}', "{{cable_probe_membrane_voltage{loc}, 0}}"),
    ]

    # the paper's model (gen-inputs.py's write_input) for a total number of cells
    INPUT_SCRIPT = """#!/bin/sh
# busyring-input CELLS [DURATION_MS] [NAME]: the parameter file of the EUHPC paper's Arbor
# ring (gen-inputs.py of euhpc-arbor-benchmark, whose num-cells is cells x GPUs x nodes)
# for CELLS cells in all, on stdout. Installed by dedal's arbor-busyring recipe.
usage() { echo "usage: busyring-input CELLS [DURATION_MS] [NAME]" >&2; exit 2; }
cells=$1
duration=${2:-200}
name=${3:-run_cells-$cells}
case "$cells" in ''|*[!0-9]*) usage;; esac
case "$duration" in ''|*[!0-9.]*|.*|*.|*.*.*) usage;; esac
case "$name" in ""|*[!A-Za-z0-9._=-]*) usage;; esac
cat <<EOF
{
    "name": "$name",
    "num-cells": $cells,
    "synapses": 10,
    "min-delay": 5,
    "duration": $duration,
    "ring-size": 4,
    "dt": 0.025,
    "depth": 10,
    "complex": true,
    "branch-probs": [
        1,
        0.5
    ],
    "compartments": [
        20,
        2
    ],
    "lengths": [
        200,
        20
    ]
}
EOF
"""

    def _edit(self, edits, **values):
        for name, old, new in edits:
            path = join_path(self.stage.source_path, name)
            with open(path) as fh:
                text = fh.read()
            if text.count(old) != 1:
                raise InstallError(f"{name}: expected {old!r} once, found it {text.count(old)} times")
            with open(path, "w") as fh:
                fh.write(text.replace(old, new.format(**values) if values else new))

    def patch(self):
        self._edit(self.CMAKE_EDITS, arbor=self.spec["arbor"].version.up_to(3))
        with open(join_path(self.stage.source_path, "CMakeLists.txt"), "a") as fh:
            fh.write(self.CMAKE_INSTALL)
        if self.spec.satisfies("^arbor@:0.9"):
            self._edit(self.ARBOR_09_EDITS)

    def cmake_args(self):
        return [self.define("CMAKE_CXX_COMPILER", self.spec["mpi"].mpicxx)]

    @run_after("install")
    def install_inputs(self):
        share = join_path(self.prefix.share, "arbor-busyring")
        mkdirp(share)
        for name in ("gen-inputs.py", "readme.md"):
            install(join_path(self.stage.source_path, name), share)
        script = join_path(self.prefix.bin, "busyring-input")
        with open(script, "w") as fh:
            fh.write(self.INPUT_SCRIPT)
        os.chmod(script, 0o755)
