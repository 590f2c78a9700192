"""The assemble stage: base root filesystem + the layers of the runtime closure -> one SIF.

The modules, in the order the stage uses them (each imports only those above it):

* :mod:`.selection`: which packages go in (``select_packages``, ``match_specs``);
* :mod:`dedal.stages.layer_audit` (shared with the build, the layer cache and ``dedal layers
  verify``): every layer checked before it is trusted (``audit_layers``, ``LayerInfo``);
* :mod:`.tree`: the image tree, an overlay of the base's root with the layers extracted;
* :mod:`.envscript`: ``spack env activate --sh`` as the image's environment script;
* :mod:`.apptainer_files`: ``/.singularity.d`` (actions, env scripts, runscript, labels);
* :mod:`.spack_run`: Spack inside the tree (reindex, view, activation, its database);
* :mod:`.closure`: every ELF file finds its libraries in the image (``check_closure``), and the
  files that a set of programs loads (``elf_closure``: what a slimmed copy of an image keeps);
* :mod:`.metadata`: versions, labels, the definition and inspect metadata of the SIF;
* :mod:`.usage`: what the image tells whoever runs it: the ``apptainer run-help`` text and the
  ``apptainer test`` script (its packages, its libraries where it runs, Open MPI's start);
* :mod:`.manifest`: file names, the result, the image manifest, the up-to-date check;
* :mod:`.stage`: :func:`assemble`, the stage itself (its documentation tells the steps).

This package is the public face: callers use the names below.
"""

from dedal.stages.assemble.apptainer_files import DEFAULT_RUNSCRIPT, runscript_text
from dedal.stages.layer_audit import LayerInfo, audit_layers, entry_problem
from dedal.stages.assemble.closure import ClosureReport, check_closure, elf_closure
from dedal.stages.assemble.envscript import activation_script
from dedal.stages.assemble.manifest import AssembleResult, image_paths
from dedal.stages.assemble.selection import select_packages
from dedal.stages.assemble.stage import assemble

__all__ = [
    "AssembleResult",
    "ClosureReport",
    "DEFAULT_RUNSCRIPT",
    "LayerInfo",
    "activation_script",
    "assemble",
    "audit_layers",
    "check_closure",
    "elf_closure",
    "entry_problem",
    "image_paths",
    "runscript_text",
    "select_packages",
]
