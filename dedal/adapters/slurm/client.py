"""The Slurm client: the only module that runs Slurm commands (sbatch, squeue, sacct, scancel, scontrol, sinfo, srun).

Everything goes through :class:`Slurm`, which carries the environment the commands run
in (``SLURM_CONF`` among it; by default the process environment, so a site's or the
test cluster's ``SLURM_CONF`` passes straight through). Module-level functions with the
same names use a default client.

Job state comes from ``squeue -t all -j ...`` while slurmctld still holds the job
(pending, running, and finished jobs for ``MinJobAge`` seconds) and from ``sacct``
after that (and for the exit codes of finished jobs), falling back to ``sacct -c`` (the
job-completion log) where accounting storage is disabled. Slurm's many states are
mapped onto the small :class:`~dedal.adapters.slurm.reports.State` enum.

Facts of Slurm 22.05 callers should know: ``afterok`` on a job id slurmctld no longer
knows counts as satisfied (the job runs), so only pass dependencies on jobs known to be
active or completed; a job whose dependency failed is CANCELLED with reason
``DependencyNeverSatisfied`` when submitted with ``--kill-on-invalid-dep=yes``.

Verified against Slurm 22.05 (Debian bookworm); the JSON shapes of 23.02+ (state lists,
exit codes as objects) are handled too. See ../shared/notes/real-components.md section 5.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any, Dict, Iterable, List, Mapping, Optional, Sequence, Tuple, Union

from dedal.adapters import proc
from dedal.adapters.slurm import conf
from dedal.adapters.slurm.reports import JobState, Node, State, clean_node, clean_reason, exit_pair, wait_status
from dedal.errors import ToolError, ToolMissing

HINT = "install Slurm's client commands (apt-get install slurm-client) or load the site's Slurm module"


def _ids(job_ids: Iterable[Union[str, int]]) -> List[str]:
    seen: Dict[str, None] = {}
    for j in job_ids:
        text = str(j).strip()
        if text:
            seen.setdefault(text, None)
    return list(seen)


def _dependency(after_ok: Iterable[Union[str, int]], after_any: Iterable[Union[str, int]]) -> str:
    """Slurm's ``--dependency`` value: ``afterok:a:b,afterany:c`` ('','' joins: all must hold)."""
    parts = []
    for kind, ids in (("afterok", _ids(after_ok)), ("afterany", _ids(after_any))):
        if ids:
            parts.append(kind + ":" + ":".join(ids))
    return ",".join(parts)


class Slurm:
    """Runs Slurm's commands in one environment (``SLURM_CONF`` etc.)."""

    def __init__(
        self, environ: Optional[Mapping[str, str]] = None, *, timeout: float = 120.0, squeue_json: bool = False
    ) -> None:
        """``environ``: the environment of every command (default: this process's).

        ``squeue_json``: read job states from ``squeue --json`` (which also carries exit
        codes) instead of ``squeue -o``. Off by default: Slurm 22.05 ignores ``-j`` with
        ``--json`` and returns every job the controller holds, which is a lot of JSON on
        a busy production cluster; with plain output, exit codes of finished jobs come
        from ``sacct`` instead.
        """
        self._environ = dict(environ) if environ is not None else None
        self.timeout = timeout
        self._squeue_json: Optional[bool] = None if squeue_json else False
        self._sacct_mode: Optional[List[str]] = None  # ["sacct"] or ["sacct", "-c"]

    # -- plumbing ---------------------------------------------------------------------
    def environ(self, extra: Optional[Mapping[str, str]] = None) -> Dict[str, str]:
        env = dict(self._environ if self._environ is not None else os.environ)
        if extra:
            env.update({k: str(v) for k, v in extra.items()})
        return env

    def _run(
        self,
        cmd: List[str],
        *,
        what: str,
        check: bool = True,
        input: Optional[str] = None,
        env: Optional[Mapping[str, str]] = None,
    ) -> proc.Result:
        """Run one Slurm command; a missing or broken configuration and an unreachable
        controller become one clear error (:mod:`~dedal.adapters.slurm.conf`) instead of
        Slurm's own lines, whether or not the caller checks the exit code."""
        environ = self.environ(env)
        conf.before_use(environ)
        try:
            res = proc.run(cmd, what=what, env=environ, timeout=self.timeout, check=check, input=input)
        except ToolMissing as exc:
            raise ToolMissing(exc.tool, HINT) from None
        except ToolError as exc:
            raise conf.explain(exc.output, environ) or exc from None
        if res.returncode != 0:
            problem = conf.explain(res.stderr + res.stdout, environ)
            if problem:
                raise problem
        return res

    # -- submit -----------------------------------------------------------------------
    def submit(
        self,
        script: Union[Path, str],
        *,
        name: str,
        dependencies: Iterable[Union[str, int]] = (),
        after_any: Iterable[Union[str, int]] = (),
        kill_on_invalid_dep: bool = True,
        partition: str = "",
        account: str = "",
        qos: str = "",
        time: str = "",
        constraint: str = "",
        nodes: int = 1,
        cpus: int = 0,
        mem: str = "",
        extra_args: Sequence[str] = (),
        output: Optional[Path] = None,
        error: Optional[Path] = None,
        nice: Optional[int] = None,
        env: Optional[Mapping[str, str]] = None,
        requeue: bool = False,
        workdir: Optional[Path] = None,
    ) -> str:
        """Submit a batch job with ``sbatch --parsable``; return its job id.

        ``script`` is a script file, or the script text itself (a str starting with
        ``#!``, given to sbatch on stdin). ``dependencies`` become
        ``--dependency=afterok:a:b`` (with ``--kill-on-invalid-dep=yes`` unless turned
        off, so a failed dependency cancels this job instead of leaving it pending
        forever); ``after_any`` are jobs to wait for whatever their outcome
        (``afterany:c:d``, all of both lists: ``afterok:a:b,afterany:c:d``). ``env`` is
        added to the environment the job inherits (sbatch exports the submitting
        environment), which keeps values with commas intact.
        ``requeue=False`` passes ``--no-requeue``: a job lost to a node failure ends as
        NODE_FAIL and the caller decides about resubmitting. Empty or zero options are
        left to the site's defaults; ``extra_args`` go last, before the script.
        """
        cmd = ["sbatch", "--parsable", f"--job-name={name}"]
        deps = _dependency(dependencies, after_any)
        if deps:
            cmd.append("--dependency=" + deps)
            cmd.append("--kill-on-invalid-dep=" + ("yes" if kill_on_invalid_dep else "no"))
        for flag, value in (
            ("--partition", partition),
            ("--account", account),
            ("--qos", qos),
            ("--time", time),
            ("--constraint", constraint),
            ("--mem", mem),
        ):
            if value:
                cmd.append(f"{flag}={value}")
        if nodes:
            cmd.append(f"--nodes={int(nodes)}")
        if cpus:
            cmd.append(f"--cpus-per-task={int(cpus)}")
        if output is not None:
            cmd.append(f"--output={os.fspath(output)}")
        if error is not None:
            cmd.append(f"--error={os.fspath(error)}")
        if nice is not None:
            cmd.append(f"--nice={int(nice)}")
        if workdir is not None:
            cmd.append(f"--chdir={os.fspath(workdir)}")
        cmd.append("--requeue" if requeue else "--no-requeue")
        cmd += [str(a) for a in extra_args]
        stdin = None
        if isinstance(script, str) and script.startswith("#!"):
            stdin = script
        else:
            cmd.append(os.fspath(script))
        res = self._run(cmd, what=f"sbatch ({name})", input=stdin, env=env)
        job_id = res.stdout.strip().splitlines()[-1].split(";")[0].strip() if res.stdout.strip() else ""
        if not job_id.isdigit():
            raise ToolError(
                f"sbatch ({name})",
                cmd,
                res.returncode,
                None,
                f"no job id in the output: {res.stdout.strip()[:200]!r} {res.stderr.strip()[:200]!r}",
            )
        return job_id

    def set_dependencies(
        self,
        job_id: Union[str, int],
        dependencies: Iterable[Union[str, int]] = (),
        after_any: Iterable[Union[str, int]] = (),
    ) -> bool:
        """Replace a pending job's dependencies (``scontrol update JobId=.. Dependency=..``;
        empty lists: none). False when the job has started or ended meanwhile (nothing to
        change any more); other errors raise."""
        value = _dependency(dependencies, after_any)
        res = self._run(
            ["scontrol", "update", f"JobId={job_id}", f"Dependency={value}"],
            what=f"scontrol update (job {job_id})",
            check=False,
        )
        if res.returncode == 0:
            return True
        text = res.stderr + res.stdout
        if any(m in text for m in ("no longer pending", "already finished", "Invalid job id")):
            return False
        raise ToolError(f"scontrol update (job {job_id})", res.cmd, res.returncode, None, proc.output_tail(text))

    # -- state ------------------------------------------------------------------------
    def states(self, job_ids: Iterable[Union[str, int]]) -> Dict[str, JobState]:
        """The state of each job; ids neither squeue nor sacct know come back UNKNOWN."""
        ids = _ids(job_ids)
        if not ids:
            return {}
        found = self._squeue(ids)
        # finished jobs that squeue reports without an exit code (plain -o output) and
        # jobs slurmctld has already forgotten: ask accounting / the completion log
        rest = [
            j
            for j in ids
            if j not in found or (found[j].state.is_finished and found[j].exit_code is None and found[j].signal is None)
        ]
        if rest:
            for job, st in self._sacct(rest).items():
                old = found.get(job)
                if old is None:
                    found[job] = st
                elif st.state == old.state:
                    found[job] = JobState(
                        old.state, st.exit_code, old.node or st.node, old.reason, st.signal, old.source
                    )
        return {j: found.get(j, JobState(State.UNKNOWN)) for j in ids}

    def _squeue(self, ids: List[str]) -> Dict[str, JobState]:
        wanted = set(ids)
        if self._squeue_json is not False:
            res = self._run(["squeue", "--json", "-t", "all", "-j", ",".join(ids)], what="squeue", check=False)
            if res.returncode == 0 and res.stdout.lstrip().startswith("{"):
                self._squeue_json = True
                return self._parse_squeue_json(res.stdout, wanted)
            if self._invalid_ids(res):
                return {}
            if self._squeue_json is True:
                raise ToolError("squeue", res.cmd, res.returncode, None, proc.output_tail(res.stderr or res.stdout))
            self._squeue_json = False
        res = self._run(
            ["squeue", "-h", "-t", "all", "-j", ",".join(ids), "-o", "%i|%T|%r|%B|%N"], what="squeue", check=False
        )
        if res.returncode != 0:
            if self._invalid_ids(res):
                return {}
            raise ToolError("squeue", res.cmd, res.returncode, None, proc.output_tail(res.stderr or res.stdout))
        out: Dict[str, JobState] = {}
        for line in res.stdout.splitlines():
            parts = line.strip().split("|")
            if len(parts) < 5 or parts[0] not in wanted:
                continue
            node = clean_node(parts[3]) or clean_node(parts[4])
            out[parts[0]] = JobState(State.from_slurm(parts[1]), None, node, clean_reason(parts[2]), None, "squeue")
        return out

    @staticmethod
    def _invalid_ids(res: proc.Result) -> bool:
        # squeue -j with only unknown ids fails with this (it succeeds if one is known)
        return res.returncode != 0 and "Invalid job id" in (res.stderr + res.stdout)

    @staticmethod
    def _parse_squeue_json(text: str, wanted: set) -> Dict[str, JobState]:
        data = json.loads(text)
        out: Dict[str, JobState] = {}
        for job in data.get("jobs", []):
            job_id = str(job.get("job_id", ""))
            if job_id not in wanted:  # 22.05 ignores -j with --json
                continue
            state = State.from_slurm(job.get("job_state"))
            code, sig = (None, None)
            if state.is_finished:
                code, sig = wait_status(job.get("exit_code"))
            node = clean_node(job.get("batch_host")) or clean_node(job.get("nodes"))
            out[job_id] = JobState(state, code, node, clean_reason(job.get("state_reason")), sig, "squeue")
        return out

    def _sacct_rows(self, ids: List[str], fields: str) -> Tuple[str, str]:
        """(output, source) of ``sacct -X -n -P --format=fields`` for the jobs: from
        accounting, or from the job completion log (``sacct -c``) where accounting storage
        is disabled (found out on the first call)."""
        fmt = "--format=" + fields
        if self._sacct_mode is None:
            res = self._run(["sacct", "-X", "-n", "-P", "-j", ",".join(ids), fmt], what="sacct", check=False)
            text = res.stdout + res.stderr
            if "accounting storage is disabled" in text:
                self._sacct_mode = ["sacct", "-c"]
            elif res.returncode == 0:
                self._sacct_mode = ["sacct"]
                return res.stdout, "sacct"
            else:
                raise ToolError("sacct", res.cmd, res.returncode, None, proc.output_tail(text))
        cmd = [*self._sacct_mode, "-X", "-n", "-P", "-j", ",".join(ids), fmt]
        res = self._run(cmd, what=" ".join(self._sacct_mode))
        return res.stdout, " ".join(self._sacct_mode)

    def _sacct(self, ids: List[str]) -> Dict[str, JobState]:
        text, source = self._sacct_rows(ids, "JobID,State,ExitCode,NodeList")
        return self._parse_sacct(text, set(ids), source)

    def times(self, job_ids: Iterable[Union[str, int]]) -> Dict[str, Tuple[str, str]]:
        """(Start, End) of each finished job as sacct (or ``sacct -c``) prints them,
        ``YYYY-MM-DDTHH:MM:SS``; jobs it does not know are left out."""
        ids = _ids(job_ids)
        if not ids:
            return {}
        text, _ = self._sacct_rows(ids, "JobID,Start,End")
        wanted = set(ids)
        out: Dict[str, Tuple[str, str]] = {}
        for line in text.splitlines():
            parts = line.strip().split("|")
            if len(parts) == 3 and parts[0] in wanted:
                out[parts[0]] = (parts[1], parts[2])
        return out

    @staticmethod
    def _parse_sacct(text: str, wanted: set, source: str) -> Dict[str, JobState]:
        out: Dict[str, JobState] = {}
        for line in text.splitlines():
            parts = line.strip().split("|")
            if len(parts) < 4 or parts[0] not in wanted:
                continue
            code, sig = exit_pair(parts[2])
            # a requeued job has one row per run: the last one counts
            out[parts[0]] = JobState(State.from_slurm(parts[1]), code, clean_node(parts[3]), "", sig, source)
        return out

    # -- cancel -----------------------------------------------------------------------
    def cancel(self, job_ids: Iterable[Union[str, int]]) -> None:
        """``scancel`` the jobs; jobs that have already ended are not an error."""
        ids = _ids(job_ids)
        if not ids:
            return
        res = self._run(["scancel", *ids], what="scancel", check=False)
        if res.returncode == 0:
            return
        bad = [
            ln
            for ln in (res.stderr + res.stdout).splitlines()
            if ln.strip() and "already completing or completed" not in ln and "Invalid job id" not in ln
        ]
        if bad:
            raise ToolError("scancel", res.cmd, res.returncode, None, proc.output_tail("\n".join(bad)))

    # -- cluster ----------------------------------------------------------------------
    def nodes(self, partition: str = "") -> List[Node]:
        """The cluster's nodes (``sinfo -N``), optionally of one partition."""
        cmd = ["sinfo", "-h", "-N", "-o", "%N|%c|%T|%m|%P|%f"]
        if partition:
            cmd += ["-p", partition]
        res = self._run(cmd, what="sinfo")
        merged: Dict[str, Node] = {}
        for line in res.stdout.splitlines():
            parts = line.strip().split("|")
            if len(parts) < 6 or not parts[0]:
                continue
            name, cpus, state, mem, part, feats = parts[:6]
            part = part.rstrip("*")
            features = tuple(f for f in feats.split(",") if f and f != "(null)")
            try:
                n_cpus = int(cpus)
            except ValueError:
                n_cpus = 0
            try:
                mem_mb = int(mem.rstrip("+"))
            except ValueError:
                mem_mb = 0
            prev = merged.get(name)
            parts_t = (prev.partitions if prev else ()) + ((part,) if part else ())
            merged[name] = Node(name, n_cpus, state.lower(), mem_mb, parts_t, features)
        return list(merged.values())

    def mpi_plugins(self) -> str:
        """Raw ``srun --mpi=list`` output (stdout and stderr); dedal.stages.verify parses it."""
        res = self._run(["srun", "--mpi=list"], what="srun --mpi=list")
        return (res.stdout + res.stderr).strip() + "\n"

    def version(self) -> str:
        """``sbatch --version``, e.g. ``slurm-wlm 22.05.8``."""
        return self._run(["sbatch", "--version"], what="sbatch --version").stdout.strip()


# module-level shortcuts: a fresh client on the current process environment each time


def submit(script: Union[Path, str], **kwargs: Any) -> str:
    return Slurm().submit(script, **kwargs)


def states(job_ids: Iterable[Union[str, int]]) -> Dict[str, JobState]:
    return Slurm().states(job_ids)


def cancel(job_ids: Iterable[Union[str, int]]) -> None:
    Slurm().cancel(job_ids)


def nodes(partition: str = "") -> List[Node]:
    return Slurm().nodes(partition)


def mpi_plugins() -> str:
    return Slurm().mpi_plugins()
