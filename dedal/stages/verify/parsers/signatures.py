"""Known failure signatures, detected in any log whatever its kind.

Each signature is a regular expression over single lines, a stable finding code, and
the verdict it implies. Matches are grouped per code: one finding per code, with the
number of matching lines and the first few as evidence. A signature may be
``suppressed_by`` a more precise one (the generic "container creation failed" gives way
to the GPU set-up failure that explains it). Lines that start with ``#``
are comments of benchmark outputs (OSU, nccl-tests, ``ucx_info``) and never match, so
a reference sheet that quotes a message does not count as the message itself.

Open MPI's "A requested component was not found" help text is read whole: its
``Framework:`` and ``Component:`` lines say what was missing, and a component listed in
:data:`OPTIONAL_COMPONENTS` (one the launcher does without) is a note, not a failure.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Dict, List, Sequence, Tuple

from dedal.stages.verify.findings import MAX_EVIDENCE, Finding


@dataclass(frozen=True)
class Signature:
    code: str
    pattern: "re.Pattern[str]"
    message: str
    severity: str = "error"
    verdict: str = "failed"
    keys: Tuple[str, ...] = ()  # lower-case literals, one of which a matching line contains (a fast pre-filter)
    suppressed_by: Tuple[
        str, ...
    ] = ()  # codes that explain the same lines better: when one is found, this one is dropped


def _sig(
    code: str,
    regex: str,
    message: str,
    severity: str = "error",
    verdict: str = "failed",
    suppressed_by: Tuple[str, ...] = (),
) -> Signature:
    return Signature(code, re.compile(regex, re.IGNORECASE), message, severity, verdict, _KEYS[code], suppressed_by)


_KEYS: Dict[str, Tuple[str, ...]] = {
    "segfault": ("segmentation fault", "sigsegv", "signal 11"),
    "crash-signal": (
        "process received signal",
        "signal:",
        "exited on signal",
        "aborted (core dumped)",
        "bus error",
        "illegal instruction",
        "floating point exception",
    ),
    "mpi-abort": ("mpi_abort", "mpi_errors_are_fatal"),
    "mpi-init-failed": ("mpi_init", "opal_init", "orte_init", "runtime init failed"),
    "pml-unavailable": ("pml framework",),
    "launcher-abort": ("has exited due to", "noticed that process", "primary job"),
    "slurm-task-failure": ("srun: error", "due to task failure"),
    "launcher-lost-daemon": ("daemon",),
    "slurm-step-failed": ("srun: error: unable to",),
    "ompi-component-missing": ("a requested component",),
    "timeout": ("time limit", "timed out", "job step aborted"),
    "out-of-memory": ("oom", "out of memory"),
    "not-enough-slots": ("not enough slots",),
    "pmix-error": ("pmix", "pmi2_init", "pmi_init"),
    "pmix-singletons": ("pmix server was reachable", "singletons"),
    "srun-pmix-plugin-missing": ("mpi/pmix", "mpi type"),
    "srun-pmix-plugin-broken": ("can not load pmix", "init() callback failed", "cannot create context for mpi/pmix"),
    "direct-launch-without-pmi": ("direct launched", "pmi support"),
    "cuda-driver-too-old": (
        "insufficient",
        "forward compatibility",
        "unsupported display driver",
        "unsatisfied condition",
    ),
    "gpu-runtime-setup-failed": ("nvidia-container-cli", "container creation failed", "failed to initialize nvml"),
    "container-start-failed": ("container creation failed", "retval ="),
    "nv-bind-failed": ("library bind directory", "nv files may not be bound"),
    "nv-files-not-bound": ("skipping user bind", "skipping mount"),
    "nvml-driver-mismatch": ("version mismatch",),
    "nv-tools-missing": ("nvidia-smi",),
    "nv-libraries-missing": (
        "nv libraries",
        "nv files",
        "nv binaries",
        "libcuda.so",
        "libnvidia-ml.so",
        "nvidia-smi has failed",
        "no nvidia driver",
        "cuda-capable",
        "cuda driver initialization",
        "cudaerrornodevice",
        "cuda_error_no_device",
    ),
    "cuda-failure": ("cuda failure", "cudaerror", "cuda error"),
    "loader-warning": ("no version information", "couldn't load driver", "cannot be preloaded"),
    "nccl-duplicate-gpu": ("duplicate gpu",),
    "nccl-failure": (
        "nccl failure",
        "nccl error",
        "any net plugin",
        "ncclinternal",
        "ncclsystem",
        "ncclunhandled",
        "ncclinvalid",
        "ncclremote",
        "nccl warn",
    ),
    "nccl-net-failure": ("net/ofi", " -> ", "got completion from peer"),
    "ucx-worker-create-failed": ("ucp worker", "ucp_worker_create", "ucp_init", "uct_iface_open", "ucx context"),
    "ucx-endpoint-failed": ("ucp_ep_create", "ucx endpoint"),
    "assertion-failed": ("assertion",),
    "crash-backtrace": ("==== backtrace",),
    "shm-single-copy-failed": ("process_vm_", "read -1, expected", "write -1, expected"),
    "shm-single-copy-refused": ("read -1, expected", "write -1, expected"),
    "shm-single-copy-unavailable": ("/dev/knem", "xpmem segment", "restrictive ptrace", "cma support is not available"),
}


SIGNATURES: Sequence[Signature] = (
    # --- crashes and aborts ---------------------------------------------------------
    _sig(
        "segfault",
        r"Segmentation fault|\bSIGSEGV\b|exited on signal 11\b",
        "a process crashed with a segmentation fault",
    ),
    _sig(
        "crash-signal",
        r"\*\*\* Process received signal \*\*\*|Signal: (?!Segmentation)[A-Z][a-z]+.*\(\d+\)|"
        r"exited on signal (?!11\b)\d+|\bAborted \(core dumped\)|\bBus error\b|\bIllegal instruction\b|"
        r"Floating point exception",
        "a process was killed by a signal",
    ),
    _sig(
        "mpi-abort",
        r"MPI_ABORT was invoked|\bMPI_Abort\(|\*\*\* MPI_ERRORS_ARE_FATAL",
        "an MPI process aborted the job",
    ),
    _sig(
        "mpi-init-failed",
        r"An error occurred in MPI_Init|It looks like MPI_INIT failed|MPI runtime init failed|"
        r"It looks like opal_init failed|It looks like orte_init failed|"
        r"Local abort before MPI_INIT completed",
        "MPI_Init failed",
    ),
    _sig(
        "pml-unavailable",
        r"No components were able to be opened in the pml framework",
        "Open MPI could not open any PML component (e.g. pml ucx without a usable transport)",
    ),
    _sig(
        "launcher-abort",
        r"(?:prterun|mpirun|mpiexec|prte) (?:has exited due to process rank|noticed that process rank)|"
        r"Primary job\s+terminated normally, but \d+ process(?:es)? returned",
        "the MPI launcher reports a failed process",
    ),
    _sig(
        "slurm-task-failure",
        r"srun: error: .*task[s]? [\d,\-\[\]]+: (?:Segmentation fault|Aborted|Killed|Bus error|Exited with exit code [1-9]|Terminated)|"
        r"\bDUE TO TASK FAILURE\b|srun: error: .*Exited with exit code [1-9]",
        "Slurm reports failed tasks",
    ),
    _sig(
        "launcher-lost-daemon",
        r"ORTE was unable to reliably start one or more daemons|PRTE has lost communication with a remote daemon|"
        r"ORTE has lost communication with a remote daemon|An ORTE daemon has unexpectedly failed",
        "the MPI launcher lost (or could not start) its daemons",
    ),
    _sig(
        "slurm-step-failed",
        r"srun: error: Unable to (?:create step|allocate resources|launch)",
        "Slurm could not start the job step",
    ),
    _sig(
        "ompi-component-missing",
        r"A requested component was not found, or was unable to be opened",
        "Open MPI could not open a component it was asked for (missing plugin or library)",
    ),
    _sig(
        "timeout",
        r"DUE TO TIME LIMIT|\bJob step timed out\b|srun: Job step aborted: Waiting up to",
        "the job step was cancelled at its time limit (hang or too slow)",
    ),
    _sig(
        "out-of-memory",
        r"oom-kill|Out Of Memory|OOM Killer|\boom_kill_process\b|Detected \d+ oom[-_ ]kill",
        "a process was killed for running out of memory",
    ),
    _sig(
        "not-enough-slots",
        r"There are not enough slots available in the system",
        "the launcher had not enough slots for the requested ranks",
    ),
    # --- PMIx / PMI / Slurm MPI plugin ----------------------------------------------
    _sig(
        "pmix-error",
        r"PMIX ERROR|PMIx_Init failed|PMIX_Init failed|OPAL ERROR: Unreachable in file .*(?:pmix|ext\dx_client)|"
        r"OPAL ERROR: .*pmix|mpi/pmix(?:_v\d+)?: .*(?:ERROR|error)|"
        r"PMI2?_Init failed|PMI_Init returned|pmix_init failed|PMIX_ERR_\w+",
        "PMIx/PMI error: the MPI library and the launcher's process manager do not talk",
    ),
    _sig(
        "pmix-singletons",
        r"No PMIx server was reachable|singletons will be started",
        "the ranks found no PMIx server and started as independent singletons (wrong --mpi= plugin)",
    ),
    _sig(
        "srun-pmix-plugin-missing",
        r"Couldn't find the specified plugin name for mpi/pmix|cannot find mpi plugin for mpi/pmix|"
        r"cannot create mpi context for mpi/pmix|--mpi=pmix\S*\"? -- long invalid MPI type|"
        r"invalid MPI type.*pmix",
        "Slurm has no PMIx plugin (srun --mpi=pmix cannot work; see `srun --mpi=list`)",
        suppressed_by=("srun-pmix-plugin-broken",),
    ),
    _sig(
        "srun-pmix-plugin-broken",
        r"pmi/pmix: can not load PMIx library|Couldn't load specified plugin name for mpi/pmix\S*: Plugin init\(\) "
        r"callback failed|MPI: Cannot create context for mpi/pmix",
        "Slurm's pmix plugin is installed but cannot load the PMIx library (libpmix missing on the node, or of "
        "another version than Slurm was built with): srun --mpi=pmix fails",
    ),
    _sig(
        "direct-launch-without-pmi",
        r"appears to have been direct launched using \"?srun|was not built with SLURM'?s PMI support",
        "MPI application direct-launched by srun, but its MPI has no Slurm PMI/PMIx support",
    ),
    # --- CUDA / GPU in containers ---------------------------------------------------
    _sig(
        "cuda-driver-too-old",
        r"CUDA driver version is insufficient for CUDA runtime version|cudaErrorInsufficientDriver|"
        r"CUDA_ERROR_INSUFFICIENT_DRIVER|forward compatibility was attempted on non supported HW|"
        r"system has unsupported display driver / cuda driver combination"
        r"|nvidia-container-cli: requirement error: unsatisfied condition: cuda\s*>=",
        "the host GPU driver is older than the CUDA runtime in the image",
    ),
    _sig(
        "gpu-runtime-setup-failed",
        r"nvidia-container-cli(?:\.real)?: (?:initialization|mount|detection|ldcache|device|load library) error|"
        r"container creation failed: .*nvidia|Failed to initialize NVML: (?:Unknown Error|Insufficient Permissions)",
        "the container runtime's GPU set-up failed (nvidia-container-cli missing or unable to reach the driver, or "
        "the GPU device nodes refused inside the container): the GPU is not usable in the container",
    ),
    _sig(
        "container-start-failed",
        r"FATAL:\s+container creation failed|^ABORT\s*:\s*Retval = [1-9]\d*",
        "the container runtime could not create the container",
        suppressed_by=("gpu-runtime-setup-failed",),
    ),
    _sig(
        "nvml-driver-mismatch",
        r"Failed to initialize NVML: Driver/library version mismatch",
        "the NVIDIA kernel driver and its user-space libraries have different versions (driver updated without a "
        "reboot, or another version's libraries bound into the container): no GPU is usable",
    ),
    _sig(
        "nv-bind-failed",
        r"Library bind directory not present in container|\bnv files may not be bound with --writable",
        "the container runtime could not bind the host's NVIDIA driver libraries into the container (no "
        "/.singularity.d/libs in the image, or --writable without an overlay): no usable GPU in the container",
    ),
    _sig(
        "nv-files-not-bound",
        r"Skipping user bind, non existent bind point \(file\) in container: '[^']*nvidia|"
        r"Skipping mount \S*nvidia\S* \[(?:files|libs|binaries)\]",
        "--nv skipped NVIDIA files it could not bind into the container (no such file in the image and no "
        "overlay/underlay): the driver's tools are missing inside",
        severity="warning",
        verdict="suboptimal",
    ),
    _sig(
        "nv-tools-missing",
        r"\bnvidia-smi: (?:command )?not found|\"nvidia-smi\": executable file not found",
        "the NVIDIA tools are not inside the container (started without `--nv` / the NVIDIA runtime)",
    ),
    _sig(
        "nv-libraries-missing",
        r"^(?:\s*(?:WARNING|WARN|INFO):?\s+)?Could not find any nv (?:libraries|files|binaries) on this host|"
        r"libcuda\.so(?:\.1)?: cannot open shared object file|libnvidia-ml\.so(?:\.1)?: cannot open shared object file|"
        r"NVIDIA-SMI has failed because it couldn't communicate with the NVIDIA driver|"
        r"Found no NVIDIA driver on your system|no CUDA-capable device is detected|"
        r"CUDA driver initialization failed|cudaErrorNoDevice|CUDA_ERROR_NO_DEVICE",
        "the GPU driver libraries are not visible in the container (missing `--nv`?)",
    ),
    _sig(
        "cuda-failure",
        r"(?:Test )?CUDA failure\b|\bCuda failure\b|\bcudaError[A-Z]\w+|CUDA error:",
        "a CUDA call failed",
    ),
    # --- warnings: the run went on, but something in the environment is off -------
    _sig(
        "loader-warning",
        r"no version information available \(required by|libibverbs: Warning: couldn't load driver|"
        r"ERROR: ld\.so: object .* cannot be preloaded",
        "the dynamic loader warns about a library mismatch (host libraries injected into the container, or "
        "libraries built for another system): the run went on, but the environment is not clean",
        severity="warning",
        verdict="suboptimal",
    ),
    _sig(
        "nccl-duplicate-gpu",
        r"Duplicate GPU detected",
        "two ranks of one NCCL communicator are on the same GPU: every rank sees the same device (more ranks "
        "than GPUs, or the launcher's GPU binding: srun --gpus-per-task / CUDA_VISIBLE_DEVICES)",
    ),
    _sig(
        "nccl-failure",
        r"Test NCCL failure|NCCL error[: ]|Failed to initialize any NET plugin|\bnccl(?:Internal|System|UnhandledCuda|InvalidUsage|Remote)Error\b|"
        r"NCCL WARN .*(?:unhandled (?:system|cuda) error|internal error|system error|remote process exited|"
        r"Connection closed|Call to (?!ibv_open_device\b)\w+ failed|Cuda failure)",
        "an NCCL call failed",
    ),
    _sig(
        "nccl-net-failure",
        r"NET/OFI (?:Couldn't|Could not|Unable to) (?!find)|NET/OFI Request completed with error|"
        r"NET/OFI Creating new endpoint .*failed|NET/IB\s*: ?Got completion from peer .* with (?:status=|error )[1-9]|"
        r"(?<![\w/])(?:transport/net\w*\.cc|include/net\.h|transport/coll_net\.cc)"
        r":\d+ -> [1-9]",
        "NCCL's network (NET plugin) failed while connecting or moving data: the multi-node run cannot complete",
    ),
    # --- UCX fatal errors at start-up -------------------------------------------------
    _sig(
        "ucx-worker-create-failed",
        r"Failed to create UCP worker|ucp_worker_create\(\) failed|ucp_init\(\) failed|"
        r"Failed to (?:create|initialize|init) UCX context|uct_iface_open\(.*\) failed",
        "UCX could not create its worker (a transport failed to open): MPI start-up over UCX failed",
    ),
    _sig(
        "ucx-endpoint-failed",
        r"ucp_ep_create\(.*\) failed|Failed to resolve UCX endpoint",
        "UCX could not connect to a peer (endpoint creation failed)",
    ),
    _sig("assertion-failed", r"Assertion [`'].*' failed", "an internal assertion failed (the process aborted)"),
    _sig(
        "crash-backtrace",
        r"^==== backtrace \(tid:?\s*\d+\) ====",
        "a process printed a fatal-error backtrace (UCX's error handler): it aborted",
    ),
    # --- shared-memory single copy (CMA/XPMEM/KNEM) ------------------------------------
    _sig(
        "shm-single-copy-failed",
        r"process_vm_(?:readv|writev)\(.*\) returned -1|process_vm_(?:readv|writev) delivered \d+ instead of \d+|"
        r"^(?:\[[^\]]+\]\s*)?(?:Read|Write) -1, expected \d+, errno = (?!1\b)\d+",
        "shared-memory single copy (CMA) between ranks failed: the kernel refused process_vm_readv/writev (ranks in "
        "separate container namespaces, no CAP_SYS_PTRACE, or kernel.yama.ptrace_scope); run the ranks in one "
        "container, or disable CMA (UCX_TLS=^cma, --mca btl_sm_single_copy_mechanism none)",
    ),
    _sig(
        "shm-single-copy-refused",
        r"^(?:\[[^\]]+\]\s*)?(?:Read|Write) -1, expected \d+, errno = 1\b",
        "Open MPI's shared-memory single copy (CMA: process_vm_readv/writev) is refused with errno 1 (EPERM) and "
        "each such transfer goes the slow way: the classic container slowdown (no CAP_SYS_PTRACE, ranks in separate "
        "namespaces, or kernel.yama.ptrace_scope); run the ranks in one container, or set "
        "btl_sm_single_copy_mechanism / btl_vader_single_copy_mechanism to none",
        verdict="bad",
    ),
    _sig(
        "shm-single-copy-unavailable",
        r"failed to open the /dev/knem device|Could not generate an xpmem segment id|"
        r"CMA support is not available due to restrictive ptrace settings",
        "a shared-memory single-copy mechanism (KNEM/XPMEM/CMA) is unavailable: Open MPI falls back to another "
        "or to copies through shared memory (large intra-node messages are slower)",
        severity="warning",
        verdict="suboptimal",
    ),
)


#: Components whose "A requested component was not found" help text is no failure: the
#: launcher was asked for a component it does not have, said so, and launched without it.
#: ``(framework, component)``: why. Every other component named there stays a failure.
OPTIONAL_COMPONENTS: Dict[Tuple[str, str], str] = {
    ("plm", "isolated"): "Open MPI 4's local-only launcher component (ORTE); Open MPI 5's launcher PRRTE has no such "
    "component and prints this when an MCA setting asks for it (e.g. OMPI_MCA_plm=isolated, "
    "which some container images set for Open MPI 4), then launches with its own",
}
_COMPONENT_HELP = "ompi-component-missing"
_FRAMEWORK = re.compile(r"^\s*Framework:\s*(\S+)")
_COMPONENT = re.compile(r"^\s*Component:\s*(\S+)")
_HELP_END = re.compile(r"^-{10,}\s*$")


def missing_components(lines: Sequence[str]) -> List[Tuple[str, str, List[str]]]:
    """``(framework, component, evidence)`` of every "A requested component was not found"
    help text of Open MPI, PRRTE or PMIx in ``lines``: its ``Framework:`` and ``Component:``
    lines, read up to the dashed line that closes it (``""`` where a text names none)."""
    sig = next(s for s in SIGNATURES if s.code == _COMPONENT_HELP)
    out: List[Tuple[str, str, List[str]]] = []
    for i, line in enumerate(lines):
        if line.strip().startswith("#") or not sig.pattern.search(line):
            continue
        framework = component = ""
        evidence = [line.strip()]
        for nxt in lines[i + 1 : i + 16]:
            if _HELP_END.match(nxt.strip()) or sig.pattern.search(nxt):
                break
            m = _FRAMEWORK.match(nxt) or _COMPONENT.match(nxt)
            if m:
                evidence.append(nxt.strip())
                if nxt.strip().startswith("Framework"):
                    framework = m.group(1)
                else:
                    component = m.group(1)
        out.append((framework, component, evidence))
    return out


def _component_findings(lines: Sequence[str], count: int) -> List[Finding]:
    """The findings of the component help texts: the optional ones (:data:`OPTIONAL_COMPONENTS`)
    one note, every other one (or a text that names none) the failure, naming what was missing."""
    sig = next(s for s in SIGNATURES if s.code == _COMPONENT_HELP)
    optional: Dict[Tuple[str, str], List[List[str]]] = {}
    missing: Dict[Tuple[str, str], List[List[str]]] = {}
    for framework, component, evidence in missing_components(lines):
        key = (framework, component)
        (optional if key in OPTIONAL_COMPONENTS else missing).setdefault(key, []).append(evidence)
    out: List[Finding] = []
    if missing:
        named = [f"{fw} {comp}" for fw, comp in missing if fw or comp]
        n = sum(len(v) for v in missing.values())
        msg = sig.message + (f": {', '.join(named)}" if named else "") + (f" ({n} help texts)" if n > 1 else "")
        out.append(Finding(sig.severity, sig.code, msg, next(iter(missing.values()))[0], sig.verdict))
    for (fw, comp), texts in optional.items():
        out.append(
            Finding(
                "info",
                "ompi-component-optional",
                f"the launcher was asked for the component {comp} of framework {fw}, which it does not "
                f"have, and went on without it ({len(texts)} help text(s)): {OPTIONAL_COMPONENTS[(fw, comp)]}",
                texts[0],
            )
        )
    if not out and count:  # matching lines that missing_components did not read as help texts
        out.append(Finding(sig.severity, sig.code, sig.message, [], sig.verdict))
    return out


def scan(lines: Sequence[str], signatures: Sequence[Signature] = SIGNATURES) -> List[Finding]:
    """One finding per signature code found in ``lines``, in order of first appearance (the
    component help texts of Open MPI: one per kind, :func:`_component_findings`)."""
    hits: Dict[str, List[str]] = {}
    counts: Dict[str, int] = {}
    order: List[str] = []
    sig_by_code = {s.code: s for s in signatures}
    for line in lines:
        stripped = line.strip()
        if not stripped or stripped.startswith("#"):
            continue
        low = stripped.lower()
        for sig in signatures:
            if sig.keys and not any(k in low for k in sig.keys):
                continue
            if sig.pattern.search(stripped):
                if sig.code not in counts:
                    order.append(sig.code)
                    counts[sig.code] = 0
                    hits[sig.code] = []
                counts[sig.code] += 1
                if len(hits[sig.code]) < MAX_EVIDENCE:
                    hits[sig.code].append(stripped)
    findings = []
    for code in order:
        sig = sig_by_code[code]
        if any(c in counts for c in sig.suppressed_by):
            continue
        if code == _COMPONENT_HELP:
            findings.extend(_component_findings(lines, counts[code]))
            continue
        n = counts[code]
        msg = sig.message + (f" ({n} matching lines)" if n > 1 else "")
        findings.append(Finding(sig.severity, code, msg, hits[code], sig.verdict))
    return findings


def failure_codes(findings: Sequence[Finding]) -> List[str]:
    return [f.code for f in findings if f.implied_verdict == "failed"]
