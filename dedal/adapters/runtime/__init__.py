"""The container runtime: THE seam for running a command inside a root filesystem.

Builds, ``dedal exec``/``shell`` and verification all go through ``run_in`` (to
completion) or ``start_in`` (a launcher such as ``mpirun`` that runs alongside). The
root may be

* a directory (a base root filesystem, a sandbox),
* a squashfs file or a SIF (mounted read-only with squashfuse, a SIF at the offset of
  its primary system partition, and unmounted afterwards),
* ``None``: the host's own root in a private mount namespace (bwrap ``--bind / /``),
* an :class:`Instance`: a running Apptainer instance, joined (``apptainer exec instance://``).

Backends (``runtime``): ``apptainer`` (``apptainer exec``), ``bwrap`` (bubblewrap, the
default where Apptainer is absent) and ``charliecloud`` (``ch-run``). ``auto`` picks
apptainer if on PATH and able to run containers, else bwrap, else ch-run
(``choose_runtime`` says which and why).

Every backend gives the same environment inside: a clean environment (``PATH``,
``HOME``, ``LANG``, ``TERM``, ``USER``), then the image's own ``/.singularity.d/env/*.sh``
sourced in order as Apptainer does, then the caller's ``env`` (last word), plus
``OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1`` when running as root.

The modules, one concern each:

* :mod:`.common`: ``Bind``, roots (``root_kind``, ``mounted``), the environment inside,
  the path resolution in an image, ``Request`` (one command: cmd, binds, env, cwd,
  writable, nv, per node), ``Prepared`` and the ``Backend`` interface;
* :mod:`.bwrap`, :mod:`.charliecloud`, :mod:`.apptainer`: one backend each, every one
  with ``TOOL``, ``command(root, request, ...)`` and ``prepare(root, kind, request)``
  (how it gets at the root), plus that runtime's own extras (the bwrap split view,
  Apptainer's sandbox builds);
* :mod:`.nvidia`: the host's NVIDIA driver (libraries, binaries, files, ``/dev/nvidia*``)
  found as Apptainer's ``--nv`` finds it (nvliblist.conf names, the ld cache), for the
  GPU passthrough (``nv``) of bwrap and Charliecloud; Apptainer does its own (``--nv``);
* :mod:`.launch`: the table of backends by name, ``resolve_runtime``, ``prepared``,
  ``run_in``, ``run_interactive``, ``start_in``/``Running``, ``rpm_packages``,
  ``shares_per_node``.

This package is the public face: callers use the names below.
"""

from dedal.adapters.runtime.apptainer import apptainer_build_sandbox, instance_start_command, instance_stop_command
from dedal.adapters.runtime.apptainer import process_env as apptainer_env
from dedal.adapters.runtime.apptainer import command as apptainer_command
from dedal.adapters.runtime.bwrap import command as bwrap_command
from dedal.adapters.runtime.charliecloud import command as charliecloud_command
from dedal.adapters.runtime.common import (
    Bind,
    Instance,
    Prepared,
    Request,
    RootArg,
    base_env,
    cannot_mount,
    host_path,
    image_env_scripts,
    mount_source,
    mounted,
    root_kind,
    wrap_with_image_env,
)
from dedal.adapters.runtime.nvidia import HostDriver, find_driver, host_driver
from dedal.adapters.runtime.launch import (
    BACKENDS,
    RUNTIMES,
    Running,
    choose_runtime,
    prepared,
    resolve_runtime,
    rpm_packages,
    run_in,
    run_interactive,
    shares_per_node,
    start_in,
)

__all__ = [
    "BACKENDS",
    "RUNTIMES",
    "Bind",
    "HostDriver",
    "Instance",
    "Prepared",
    "Request",
    "RootArg",
    "Running",
    "apptainer_build_sandbox",
    "apptainer_command",
    "apptainer_env",
    "instance_start_command",
    "instance_stop_command",
    "base_env",
    "bwrap_command",
    "cannot_mount",
    "charliecloud_command",
    "choose_runtime",
    "find_driver",
    "host_driver",
    "host_path",
    "image_env_scripts",
    "mount_source",
    "mounted",
    "prepared",
    "resolve_runtime",
    "root_kind",
    "rpm_packages",
    "run_in",
    "run_interactive",
    "shares_per_node",
    "start_in",
    "wrap_with_image_env",
]
