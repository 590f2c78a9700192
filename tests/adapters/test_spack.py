"""Spack's own error report, not the tail of its log, in the errors dedal raises."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from dedal.adapters import proc
from dedal.adapters.spack import Spack, error_lines, input_error
from dedal.errors import BuildError, ToolError, UserError

DATA = Path(__file__).parent / "data" / "spack"


def test_unknown_package_quotes_spack_not_its_advice():
    lines = error_lines((DATA / "concretize-unknown-package.out").read_text())
    assert lines[0] == "==> Error: Package 'spack.pkg.builtin.zlibb' not found."
    assert "Did you mean one of the following packages? zlib, libxcb, libusb" in lines


def test_conflicts_listed_once_without_their_derivation():
    lines = error_lines((DATA / "concretize-cuda-conflict.out").read_text())
    assert lines[0] == "==> Error: concretization failed for the following reasons:"
    assert lines[1] == "1. hwloc: '%gcc@12:' conflicts with '+cuda ^cuda@:11.8~allow-unsupported-compilers'"
    assert len(lines) == 5  # reasons 5-8 repeat 1-4 with their "required because" chains
    assert not any("required because" in line for line in lines)


def test_unsatisfiable_requirements_come_after_the_conflict_that_causes_them():
    """esd-gpu (CUDA 12.4, `require: '%gcc@13'`) concretized on debian-trixie, which has
    GCC 14 only (real Spack e8f8cf85): Spack lists 29 "cannot satisfy a requirement for
    package" reasons first and the conflict naming the cause after them. The error says
    the conflict within its first lines and the 29 as one line."""
    lines = error_lines((DATA / "concretize-cuda-gcc14-requirements.out").read_text())
    assert lines[0] == "==> Error: concretization failed for the following reasons:"
    assert "31. ucx: '%gcc@14:' conflicts with '+cuda ^cuda@:12.4~allow-unsupported-compilers'" in lines[:4]
    assert lines[-1] == (
        "cannot satisfy a requirement for 29 package(s): zlib-ng, ucx, slurm, rdma-core, pmix, "
        "pkgconf, perl, osu-micro-benchmarks and 21 more"
    )
    assert len(lines) == 8 and not any(
        "required because" in line or "cannot satisfy a requirement for package" in line for line in lines
    )


def test_build_failure_keeps_the_marked_log_lines():
    text = (DATA / "install-compile-error.out").read_text()
    lines = error_lines(text)
    assert lines[0] == "==> Error: ProcessError: Command exited with status 2: 'make' '-j2'"
    # the wrapped line rejoined; the context lines and the repeat ("Terminating after ...") left out
    assert ">> broken.c:2:25: error: 'undefined_symbol' undeclared (first use in this function)" in lines
    assert ">> make: *** [Makefile:2: all] Error 1" in lines
    assert lines[-1].startswith("See build log for details: /tmp/") and lines[-1].endswith("spack-build-out.txt")
    assert not any("Terminating" in line or "note:" in line for line in lines)
    # the compiler's own "error:" lines in the verbose output before the block are not Spack's report
    assert sum(1 for line in lines if "undefined_symbol" in line) == 1


def test_no_error_block_gives_nothing():
    assert error_lines("==> Warning: something\nmake: *** Error 1\n") == []
    assert error_lines("") == []


def test_long_reports_are_cut_with_a_pointer_to_the_log():
    text = "==> Error: many\n" + "".join(f"  {i}. reason number {i}\n" for i in range(1, 40))
    lines = error_lines(text, limit=6)
    assert len(lines) == 6 and lines[-1] == "... (35 more lines in the log)"


def _spack_root(tmp_path: Path, script: str) -> Path:
    exe = tmp_path / "spack" / "bin" / "spack"
    exe.parent.mkdir(parents=True)
    exe.write_text(f"#!{sys.executable}\n{script}")
    exe.chmod(0o755)
    return exe.parent.parent


@pytest.mark.parametrize("logged", [True, False])
def test_tool_error_leads_with_spack_lines_then_the_log(tmp_path, logged):
    output = (DATA / "concretize-unknown-package.out").read_text()
    root = _spack_root(tmp_path, f"import sys\nsys.stderr.write({output!r})\nsys.exit(1)\n")
    spack = Spack(root, tmp_path / "cache")
    log = tmp_path / "logs" / "concretize.log" if logged else None
    with pytest.raises(ToolError) as info:
        if logged:
            spack.python_script(tmp_path / "env", tmp_path / "list_sources.py", [], log)
        else:
            spack.activate_sh(tmp_path / "env")
    exc = info.value
    message = exc.one_line()
    assert message.startswith(exc.what + ": ==> Error: Package 'spack.pkg.builtin.zlibb' not found. | ")
    assert "Use 'spack create'" in message and "exited with code 1" in message
    if logged:
        assert message.index("not found") < message.index(f"log: {log}") < message.index("exited with code")
    wrapped = BuildError("zlibb@1.0", exc).one_line()
    assert "Package 'spack.pkg.builtin.zlibb' not found" in wrapped


def test_without_a_report_the_tail_stays(tmp_path):
    root = _spack_root(
        tmp_path, "import sys\nprint('Traceback (most recent call last):')\nprint('OSError: boom')\nsys.exit(3)\n"
    )
    with pytest.raises(ToolError) as info:
        Spack(root, tmp_path / "cache").reindex(tmp_path / "env", tmp_path / "r.log")
    assert info.value.quote == [] and "OSError: boom" in info.value.detail


def test_proc_keeps_only_this_commands_output(tmp_path):
    log = tmp_path / "x.log"
    log.write_text("==> Error: from an earlier command\n")
    with pytest.raises(ToolError) as info:
        proc.run([sys.executable, "-c", "print('now'); raise SystemExit(2)"], log=log)
    assert "earlier" not in info.value.output and "now" in info.value.output


# What Spack e8f8cf85 printed for `spack -e ENV concretize -f` in the debian-trixie base, one
# spec in ENV's spack.yaml (the spec named first): the user's input, or not.
INPUT = {
    "zlib+foo": '==> Error: trying to set variant "foo" in package "zlib", but the package has no such variant '
    "[happened when validating 'zlib+foo']\n",
    "zlib build_system=foo": '==> Error: invalid values for variant "build_system" in package "zlib": [\'foo\']\n\n',
    "zlib@@1": "==> Error: unexpected tokens in the spec string\nzlib@@1\n    ^  \n",
    "zlib @:1.2 @1.3:": "==> Error: zlib@:1.2 cannot have multiple versions\n",
    "zlib ^hdf5": "==> Error: Package zlib does not depend on hdf5\n",
    "zlib@99": (
        "==> Error: concretization failed for the following reasons:\n\n   1. Cannot satisfy 'zlib@99'\n"
        "   2. Cannot satisfy 'zlib@99'\n        required because zlib@99 requested explicitly \n"
    ),
    "zlib@1.3.1 ^zlib@1.2": (
        "==> Error: concretization failed for the following reasons:\n\n"
        '   1. Cannot select a single "version" for package "zlib"\n   2. Cannot satisfy \'zlib@1.3.1\'\n'
        "   3. Cannot satisfy 'zlib@1.2'\n   4. Cannot satisfy 'zlib@1.3.1'\n"
        "        required because zlib@1.3.1 ^zlib@1.2 requested explicitly \n"
        "   6. Cannot satisfy 'zlib@1.3.1' and 'zlib@1.2\n"
        "        required because zlib@1.3.1 ^zlib@1.2 requested explicitly \n"
    ),
    "packages: {zlib: {require: '@99'}}": "==> Error: Version requirement 99 on zlib for zlib cannot match any known "
    "version from package.py or externals\n",
    "include: [/nonexistent/x.yaml]": "==> Error: Detected 1 missing include path(s):\n   /nonexistent/x.yaml\n",
}
NOT_INPUT = {
    "zlib%gcc@99": (
        "==> Error: concretization failed for the following reasons:\n\n"
        "   1. No valid version for 'zlib' compiler 'gcc' satisfies '@99'\n"
    ),
    "zlib target=foo": (
        "==> Error: concretization failed for the following reasons:\n\n"
        "   1. 'zlib target=zen2' cannot satisfy constraint 'target=foo'\n"
    ),
    "zlib %foo": (
        "==> Error: concretization failed for the following reasons:\n\n"
        "   1. Cannot set the required compiler: zlib%foo\n"
    ),
    "no clingo": (
        '==> Error: cannot bootstrap the "clingo" Python module from spec "clingo-bootstrap@spack+python %gcc '
        'platform=linux target=x86_64" due to the following failures:\n'
        "github-actions-v0.5 raised RuntimeError: The binary index is empty\n"
    ),
    "a traceback": "Traceback (most recent call last):\nOSError: boom\n",
}


def test_input_errors_are_the_users_and_only_they() -> None:
    for spec, output in INPUT.items():
        lines = input_error(error_lines(output))
        assert lines and lines[0].startswith("==> Error: "), spec
        assert not any(line.strip(" ^") == "" for line in lines), spec  # the caret under zlib@@1 left out
    for spec, output in NOT_INPUT.items():
        assert input_error(error_lines(output)) == [], spec
    # the concretizer's package requirements (the base's GCC, not the user's spec) stay a failed tool
    for name in ("concretize-cuda-conflict.out", "concretize-cuda-gcc14-requirements.out"):
        assert input_error(error_lines((DATA / name).read_text())) == [], name


def test_an_unknown_package_is_bad_input_in_spacks_words(tmp_path) -> None:
    """Exit 2's UserError: Spack's ``==> Error:`` line and its suggestions, not its advice to
    run ``spack create``, nor the command; a failure that is not the input's stays a ToolError."""
    output = (DATA / "concretize-unknown-package.out").read_text()
    root = _spack_root(tmp_path, f"import sys\nsys.stderr.write({output!r})\nsys.exit(1)\n")
    with pytest.raises(UserError) as info:
        Spack(root, tmp_path / "cache").concretize(tmp_path / "env", tmp_path / "concretize.log", force=True)
    assert info.value.one_line() == (
        "Spack cannot concretize it: ==> Error: Package 'spack.pkg.builtin.zlibb' not "
        "found. | Did you mean one of the following packages? zlib, libxcb, libusb"
    )
    other = _spack_root(
        tmp_path / "other", f"import sys\nsys.stderr.write({NOT_INPUT['zlib%gcc@99']!r})\nsys.exit(1)\n"
    )
    with pytest.raises(ToolError) as failed:
        Spack(other, tmp_path / "cache").concretize(tmp_path / "env", tmp_path / "concretize.log", force=True)
    assert "No valid version for 'zlib' compiler 'gcc'" in failed.value.one_line()
    assert "exited with code 1" in failed.value.one_line()


def test_spack_reads_its_commit_from_a_checkout_another_user_owns(tmp_path) -> None:
    """A site's shared Spack is owned by its admin: git, run by Spack for its own commit,
    refused it ("dubious ownership"), spack.lock named no commit and the image was dated 1970.
    Spack runs with git told to trust its root: the real git answers."""
    import os
    import shutil
    import subprocess

    if os.geteuid() != 0 or not shutil.which("git"):
        pytest.skip("needs root (to give the checkout to another user) and git")
    root = tmp_path / "spack"
    (root / "bin").mkdir(parents=True)
    (root / "bin" / "spack").write_text("#!/bin/sh\n")
    ident = ["-c", "user.name=t", "-c", "user.email=t@example.org"]
    subprocess.run(["git", "init", "-q", str(root)], check=True)
    subprocess.run(["git", *ident, "-C", str(root), "add", "."], check=True)
    subprocess.run(["git", *ident, "-C", str(root), "commit", "-qm", "spack"], check=True)
    for d, _dirs, files in os.walk(root):
        for name in [d, *(os.path.join(d, f) for f in files)]:
            os.lchown(name, 65534, 65534)
    plain = {k: v for k, v in os.environ.items() if not k.startswith("GIT_CONFIG")}
    ask = ["git", "-C", str(root), "rev-parse", "HEAD"]
    refused = subprocess.run(ask, env=plain, capture_output=True, text=True)
    assert refused.returncode != 0 and "dubious ownership" in refused.stderr  # what the test stands on
    env = {**plain, **Spack(root, tmp_path / "cache").env()}
    answered = subprocess.run(ask, env=env, capture_output=True, text=True)
    assert answered.returncode == 0 and len(answered.stdout.strip()) == 40
