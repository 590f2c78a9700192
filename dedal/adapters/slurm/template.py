"""Job-script templates: the shipped one (``slurm/build-job.sh.in``) and their rendering.

A template is a batch script with ``{{name}}`` placeholders (:data:`TEMPLATE_FIELDS`);
sites may set ``slurm.template`` to their own. Rendering replaces placeholders
verbatim and leaves comments and shell syntax alone; nothing here runs a command.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Mapping

from dedal import CHECKOUT
from dedal.errors import UserError

TEMPLATE_FIELDS = ("job_name", "packages", "command", "log", "stage_dir")
_PLACEHOLDER = re.compile(r"\{\{\s*([A-Za-z_][A-Za-z0-9_]*)\s*\}\}")


def default_template() -> Path:
    """The job-script template shipped with dedal (``slurm/build-job.sh.in``)."""
    for cand in (CHECKOUT / "slurm" / "build-job.sh.in", CHECKOUT / "dedal" / "data" / "slurm" / "build-job.sh.in"):
        if cand.is_file():
            return cand
    raise UserError(
        "the default Slurm job-script template build-job.sh.in is missing from this "
        "installation; set slurm.template to a template file"
    )


def render_job_script(template: str, values: Mapping[str, str], *, source: str = "job-script template") -> str:
    """Replace each ``{{name}}`` in ``template`` with ``values[name]``, verbatim.

    Comment lines (starting with ``#``, except ``#SBATCH`` and ``#!``) are left as they
    are, so a template can document its placeholders; so is everything that is not a
    placeholder (``${VAR}``, ``$@``). A placeholder without a value is a UserError that
    names it and the known ones. Quoting is the caller's business (see the placeholder
    list at the top of build-job.sh.in).
    """
    lines = template.splitlines(keepends=True)

    def live(line: str) -> bool:
        text = line.lstrip()
        return not text.startswith("#") or text.startswith(("#SBATCH", "#!"))

    used = {m.group(1) for line in lines if live(line) for m in _PLACEHOLDER.finditer(line)}
    unknown = sorted(used - set(values))
    if unknown:
        raise UserError(
            f"{source}: unknown placeholder(s) {', '.join('{{' + u + '}}' for u in unknown)}; "
            f"known: {', '.join('{{' + k + '}}' for k in sorted(values))}"
        )
    return "".join(_PLACEHOLDER.sub(lambda m: str(values[m.group(1)]), line) if live(line) else line for line in lines)
