# dedal's bundled microbenchmarks: MPI init time, point-to-point latency and bandwidth,
# an all-reduce, the CUDA floor of device-buffer messages, and (with +cuda) an NCCL
# all-reduce. The sources ship with this recipe (src/), so the package needs no download
# and no mirror entry.
import hashlib
import os

from spack.package import *


class DedalBenchmarks(Package):
    """MPI and NCCL microbenchmarks that dedal runs natively and in the container to
    verify an image (output in the OSU / nccl-tests table layouts)."""

    homepage = "https://github.com/dedal-hpc/dedal"
    has_code = False

    # Spack's DAG hash covers package.py, not the files beside it: this checksum of src/
    # ties the hash to the sources (tests check that it is current).
    SOURCES_SHA256 = "60932038f9bc184da7d1c352424d9b2e4b8dd5d592fe19aac904ea4e70b76b10"

    version("1.1")  # 1.1: an untimed pass over every size before the timed ones (1.0: none)

    variant("cuda", default=False, description="Build the NCCL all-reduce benchmark")

    depends_on("mpi")
    depends_on("cuda", when="+cuda")
    depends_on("nccl", when="+cuda")

    # dedal_cuda_floor: the CUDA floor of device-buffer messages; plain C that finds the CUDA
    # driver at run time (dlopen), so it builds without CUDA and runs only where a GPU is
    MPI_BENCHMARKS = ["dedal_init", "dedal_latency", "dedal_bw", "dedal_allreduce", "dedal_cuda_floor"]

    def _sources(self):
        return join_path(self.package_dir, "src")

    def install(self, spec, prefix):
        src = self._sources()
        digest = hashlib.sha256()
        for name in sorted(os.listdir(src)):
            with open(join_path(src, name), "rb") as fh:
                digest.update(fh.read())
        mkdirp(prefix.bin)
        mpicc = Executable(spec["mpi"].mpicc)
        for name in self.MPI_BENCHMARKS:
            mpicc("-O2", "-std=c11", "-I" + src, "-o", join_path(prefix.bin, name), join_path(src, name + ".c"), "-ldl")
        if spec.satisfies("+cuda"):
            nvcc = Executable(join_path(spec["cuda"].prefix.bin, "nvcc"))
            nvcc(
                "-O2",
                "-ccbin",
                spec["mpi"].mpicxx,
                "-I" + spec["nccl"].prefix.include,
                "-o",
                join_path(prefix.bin, "dedal_nccl_allreduce"),
                join_path(src, "dedal_nccl_allreduce.cu"),
                "-L" + spec["nccl"].prefix.lib,
                "-lnccl",
                "-Xlinker",
                "-rpath=" + spec["nccl"].prefix.lib,
            )
        mkdirp(prefix.share.dedal)
        with open(join_path(prefix.share.dedal, "sources.sha256"), "w") as fh:
            fh.write(digest.hexdigest() + "\n")
