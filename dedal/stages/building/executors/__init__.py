"""Executors run the build jobs of a plan: locally with a process pool, or on Slurm."""
