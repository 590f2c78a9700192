"""dedal: Spack environment -> per-package squashfs layers -> verified Apptainer SIF."""

__version__ = "0.1.0"
