"""What an image tells the person who runs it: ``apptainer run-help IMAGE.sif`` (its
``/.singularity.d/runscript.help``) and ``apptainer test IMAGE.sif`` (its
``/.singularity.d/test``).

A scientist who pulls an image, or a site that installs one, has Apptainer and not dedal.
The help says what the image is (environment, top-level packages, MPI stack, date, where
its bill of materials lies) and how it is run, under Slurm too. The test is a check they
can run on their own machine in seconds, with no network and no Slurm: the top-level
packages are there, every program and library of the view finds its libraries *there*
(where the host's binds, ``--nv`` and ``LD_LIBRARY_PATH`` take part, which assembly's
closure check cannot see), Open MPI runs and starts in one process, a GPU is seen; notes
name what comes from outside and may replace the image's own (an ``LD_LIBRARY_PATH`` set
outside, the user's ``pip install --user`` packages). It prints one line per check and exits
1 when one fails. The environment file may add its
own help text (printed first) and its own test (run after dedal's checks, from
:data:`~dedal.model.image.ENV_TEST`).

Both are plain text written at assembly from what assembly knows; the test is POSIX sh
with the image's facts written in, so it needs only the base's ``sh`` and coreutils.
"""

from __future__ import annotations

import re
import shlex
from typing import List, Mapping, Sequence

from dedal.adapters.runtime.nvidia import NV_LIBRARIES
from dedal.model.image import ENV_IN_IMAGE, SBOM_IN_IMAGE
from dedal.stages.assemble.metadata import Contents

#: the stack's components, as the help names them (the order it lists them in)
_STACK_NAMES = {"openmpi": "Open MPI", "pmix": "PMIx", "ucx": "UCX", "cuda": "CUDA", "nccl": "NCCL"}
#: where the dynamic loader lives, per architecture (the first one the image has is used)
_LOADERS = ("/lib64/ld-linux-x86-64.so.2", "/lib/ld-linux-aarch64.so.1", "/lib64/ld64.so.2")
#: the bundled program that starts MPI in one process (package dedal-benchmarks)
MPI_START_PROGRAM = "dedal_init"


def _prefixes(contents: Contents) -> List[str]:
    plan = contents.plan
    out = []
    for h in contents.roots:
        node = plan.nodes[h]
        out.append(
            node.external_path if node.external and node.external_path else f"{plan.install_root}/{node.prefix_name}"
        )
    return out


def help_text(
    contents: Contents, labels: Mapping[str, str], *, user_help: str = "", own_runscript: bool = False
) -> str:
    """``/.singularity.d/runscript.help``: the environment file's ``help`` first, then the
    image's facts and how to run it. ``own_runscript``: the environment file (or a base built
    by Apptainer) set the runscript, so ``apptainer run`` does what that says."""
    plan = contents.plan
    name = f"{plan.env_name}:{plan.tag}"
    description = labels.get("org.label-schema.description", "")
    lines: List[str] = []
    if user_help.strip():
        lines += [user_help.strip("\n"), ""]
    lines.append(f"{name}" + (f": {description}" if description else ""))
    made = f"Made by dedal {labels.get('dedal.version', '?')} from the Spack environment {plan.env_name}"
    spack = labels.get("dedal.spack.version", "")
    commit = labels.get("dedal.spack.commit", "")
    if spack or commit:
        made += f" (Spack {spack or '?'}" + (f", commit {commit[:12]}" if commit else "") + ")"
    # the base the image is made on: its runtime twin where it has one (the layers were built on plan.base_image)
    on_base, os_key = ("dedal.runtime_base.image", "dedal.runtime_base.os")
    if not labels.get(on_base):
        on_base, os_key = ("dedal.base.image", "dedal.base.os")
    on = labels.get(on_base, plan.base_image) + (f" ({labels[os_key]})" if labels.get(os_key) else "")
    lines += [f"{made},", f"on {on}, dated {labels.get('org.label-schema.build-date', '?')}.", ""]
    tops = [plan.nodes[h] for h in contents.roots]
    lines.append(
        f"Top-level packages ({len(tops)}, with {len(contents.infos)} Spack-built packages in all; "
        f"the view {plan.view} is on PATH):"
    )
    lines += [f"  {n.name}@{n.version}" for n in sorted(tops, key=lambda n: n.name)]
    stack = [f"{_STACK_NAMES[c]} {contents.versions[c]}" for c in _STACK_NAMES if contents.versions.get(c)]
    if stack:
        lines.append("Stack: " + ", ".join(stack))
    mpi = bool(contents.versions.get("openmpi"))
    gpu = bool(contents.versions.get("cuda"))
    rows = [
        ("apptainer exec IMAGE.sif PROGRAM [ARG...]", "a program of the image, in its environment"),
        (
            "apptainer run IMAGE.sif [ARG...]",
            "the image's own runscript (apptainer inspect --runscript IMAGE.sif)"
            if own_runscript
            else "the same as exec; without a program, a shell",
        ),
    ]
    if mpi:
        rows += [
            (
                "srun --mpi=pmix apptainer exec IMAGE.sif PROGRAM",
                "MPI under Slurm: srun starts the ranks, Slurm's PMIx connects them",
            ),
            (
                "srun --mpi=pmix apptainer exec --sharens IMAGE.sif setsid PROGRAM",
                "the same, the ranks of a node in one container (Apptainer >= 1.3): a faster start",
            ),
        ]
    if gpu:
        rows.append(("apptainer exec --nv IMAGE.sif PROGRAM", "on a GPU node, with the host's NVIDIA driver"))
    rows.append(("apptainer test IMAGE.sif", "check the image on this machine: packages, libraries, MPI start"))
    facts = [
        ("apptainer inspect IMAGE.sif", "labels: versions, layers, provenance"),
        (SBOM_IN_IMAGE, "the software bill of materials (CycloneDX)"),
        (ENV_IN_IMAGE + "/", "the Spack environment (spack.yaml, spack.lock) it was made from"),
    ]
    for title, entries in (("Run it", rows), ("What is inside", facts)):
        lines += ["", title]
        for what, why in entries:  # as a manual page: the command, what it does beneath
            lines += [f"  {what}", f"      {why}"]
    return "\n".join(lines) + "\n"


def test_script(contents: Contents, *, image_library_path: Sequence[str] = (), env_test: str = "") -> str:
    """``/.singularity.d/test``: dedal's checks of the image where it runs (see the module
    documentation). ``image_library_path``: the directories the image's own environment
    puts on ``LD_LIBRARY_PATH`` (any other entry was set outside it); ``env_test``: where the
    environment file's test lies in the image (:data:`~dedal.model.image.ENV_TEST`), run
    last; empty: none."""
    plan = contents.plan
    q = shlex.quote
    name = f"{plan.env_name}:{plan.tag}"
    prefixes = _prefixes(contents)
    names = [f"{lib}*" for lib in NV_LIBRARIES]
    driver = " \\\n                | ".join("|".join(names[i : i + 6]) for i in range(0, len(names), 6))
    # written into a double-quoted word: only plain absolute paths
    own_paths = " ".join(p for p in ["/.singularity.d/libs", *image_library_path] if re.fullmatch(r"/[\w./+-]*", p))
    parts = [
        "#!/bin/sh",
        f"# `apptainer test IMAGE.sif`: dedal's check of image {name} on the machine it runs on, in",
        "# seconds, with no network and no Slurm. One line per check; exit 1 when one fails.",
        "checks=0",
        "failed=0",
        'say() { printf \'%-5s %s\\n\' "$1" "$2"; }',
        'ok() { checks=$((checks + 1)); say ok "$1"; }',
        'fail() { checks=$((checks + 1)); failed=$((failed + 1)); say FAIL "$1"; }',
        f"view={q(plan.view)}",
        "",
        "# the top-level packages and the view",
        "missing=''",
        "for prefix in " + " ".join(q(p) for p in prefixes) + ' "$view"; do',
        '    [ -d "$prefix" ] || missing="$missing $prefix"',
        "done",
        'if [ -n "$missing" ]; then',
        '    fail "missing from the image:$missing"',
        "else",
        f'    ok "the {len(prefixes)} top-level package(s) and the view $view are there"',
        "fi",
        "",
        "# every program and library of the view finds its libraries, as the loader does here",
        "loader=''",
        "for candidate in " + " ".join(_LOADERS) + "; do",
        '    if [ -x "$candidate" ]; then loader=$candidate; break; fi',
        "done",
        'if [ -z "$loader" ]; then',
        '    say skip "libraries: no dynamic loader at a known place in this image"',
        "else",
        "    files=0",
        "    lost=''",
        "    driver=''",
        "    # programs, libraries, Python extension modules one level down (arbor/_arbor...so; not numpy's deeper ones)",
        '    for f in "$view"/bin/* "$view"/lib/*.so "$view"/lib/*.so.* "$view"/lib64/*.so "$view"/lib64/*.so.* \\',
        '        "$view"/lib/python3*/site-packages/*.so "$view"/lib/python3*/site-packages/*/*.so; do',
        '        [ -f "$f" ] || continue',
        '        "$loader" --verify "$f" >/dev/null 2>&1',
        "        case $? in 0 | 2) ;; *) continue ;; esac  # as ldd: 1, not a dynamic ELF file",
        "        files=$((files + 1))",
        '        out=$(LC_ALL=C LD_TRACE_LOADED_OBJECTS=1 "$loader" "$f" 2>&1)  # as ldd does',
        '        case "$out" in *"not found"*) ;; *) continue ;; esac',
        "        for lib in $(printf '%s\\n' \"$out\" | sed -n 's/^[[:space:]]*\\([^[:space:]]*\\) => not found.*$/\\1/p'); do",
        '            case "$lib" in',
        f"                {driver})",
        '                    driver="$driver $lib" ;;',
        '                *) lost="$lost$lib needed by $f\n" ;;',
        "            esac",
        "        done",
        "    done",
        '    if [ -z "$lost" ]; then',
        '        ok "the libraries of the $files programs and libraries of the view are found"',
        "    else",
        "        n=$(printf '%s' \"$lost\" | sed -n '$=')",
        '        fail "libraries not found ($n):"',
        "        printf '%s' \"$lost\" | sort | sed 's/^/      /'",
        "    fi",
        '    if [ -n "$driver" ]; then',
        "        names=$(printf '%s\\n' $driver | sort -u | tr '\\n' ' ')",
        '        say note "the host\'s NVIDIA driver is not bound ($names): on a GPU node, run with --nv"',
        "    fi",
        "fi",
        "",
        "# LD_LIBRARY_PATH entries the image does not set (apptainer --env, APPTAINERENV_...)",
        "extra=''",
        "IFS_was=$IFS",
        "IFS=:",
        "for entry in ${LD_LIBRARY_PATH:-}; do",
        '    case " ' + own_paths + ' " in *" $entry "*) ;; *) [ -n "$entry" ] && extra="$extra $entry" ;; esac',
        "done",
        "IFS=$IFS_was",
        'if [ -n "$extra" ]; then',
        '    say note "LD_LIBRARY_PATH set outside the image: libraries there may replace the image\'s:$extra"',
        "fi",
        "",
        "# the user's own Python packages (pip install --user, in $HOME, which Apptainer binds) come",
        "# before the interpreter's site-packages, the view's among them",
        "if command -v python3 >/dev/null 2>&1; then",
        "    user_site=$(python3 -c 'import os, site; p = site.getusersitepackages(); "
        'print(p if site.ENABLE_USER_SITE and os.path.isdir(p) else "")\' 2>/dev/null)',
        '    if [ -n "$user_site" ]; then',
        '        say note "python3 imports from $user_site (pip install --user) before its own site-packages;'
        ' PYTHONNOUSERSITE=1 leaves it out"',
        "    fi",
        "fi",
    ]
    if contents.versions.get("openmpi"):
        parts += [
            "",
            "# Open MPI: it runs, has its UCX layer, and starts in one process",
            "if command -v ompi_info >/dev/null 2>&1; then",
            "    if version=$(ompi_info --version 2>&1); then",
            '        ok "$(printf \'%s\\n\' "$version" | head -n 1) runs"',
            "    else",
            '        fail "ompi_info --version exits $?: $(printf \'%s\\n\' "$version" | tail -n 1)"',
            "    fi",
            "    if ompi_info 2>/dev/null | grep -q 'MCA pml: ucx'; then",
            '        ok "Open MPI has its UCX messaging layer (pml ucx)"',
            "    else",
            '        say note "Open MPI has no pml ucx: messages take ob1 and its BTLs"',
            "    fi",
            "else",
            '    fail "the image records Open MPI, but ompi_info is not on PATH"',
            "fi",
            f'start="$view/bin/{MPI_START_PROGRAM}"',
            'if [ -x "$start" ]; then',
            "    limit=''",
            "    command -v timeout >/dev/null 2>&1 && limit='timeout 120'",
            '    if out=$($limit "$start" 2>&1); then',
            "        ok \"MPI starts in one process ($(printf '%s\\n' \"$out\" | grep '^nprocs' | head -n 1))\"",
            "    else",
            "        fail \"MPI_Init in one process failed (exit $?): $(printf '%s\\n' \"$out\" | tail -n 3 | tr '\\n' ' ')\"",
            "    fi",
            "else",
            f'    say skip "MPI start: no {MPI_START_PROGRAM} in the view (package dedal-benchmarks)"',
            "fi",
        ]
    if contents.versions.get("cuda"):
        parts += [
            "",
            "# a GPU, where --nv bound the driver",
            'if command -v nvidia-smi >/dev/null 2>&1 && gpus=$(nvidia-smi -L 2>/dev/null) && [ -n "$gpus" ]; then',
            "    ok \"GPU: $(printf '%s\\n' \"$gpus\" | head -n 1) ($(printf '%s\\n' \"$gpus\" | sed -n '$=') in all)\"",
            "else",
            '    say note "no NVIDIA GPU seen: on a GPU node, run with --nv"',
            "fi",
        ]
    if env_test:
        parts += [
            "",
            "# the environment file's own test (dedal.test)",
            f'if {q(env_test)} "$@"; then',
            '    ok "the environment file\'s test passes"',
            "else",
            '    fail "the environment file\'s test exits $?"',
            "fi",
        ]
    parts += [
        "",
        'if [ "$failed" -eq 0 ]; then',
        f'    echo "{name}: all $checks checks passed"',
        "    exit 0",
        "fi",
        f'echo "{name}: $failed of $checks checks failed"',
        "exit 1",
    ]
    return "\n".join(parts) + "\n"
