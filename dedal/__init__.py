"""dedal: Spack environment -> per-package squashfs layers -> verified Apptainer SIF."""

from pathlib import Path

__version__ = "0.1.0"

# The checkout dedal runs from: base-images/, recipes/ and slurm/ lie beside the package.
CHECKOUT = Path(__file__).resolve().parent.parent
