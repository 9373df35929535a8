"""``bench/RESULTS.md``: one file, one ``## `` section per benchmark, each rewritten alone.

Several benchmarks (turn storage cost, cold start, sweep) write into the same
file. :func:`write_section` replaces only the section it is given, so a run of
one benchmark never erases the numbers of another.
"""

from __future__ import annotations

import fcntl
import hashlib
import os
import platform
import subprocess
import tempfile
from collections.abc import Sequence
from datetime import UTC, datetime
from pathlib import Path

RESULTS_PATH = Path(__file__).resolve().parent / "RESULTS.md"
_PREAMBLE = (
    "# Benchmarks\n\n"
    "Each section is written by its own benchmark (`make bench` runs them all); "
    "a run rewrites only its own section.\n"
)
_FENCE = "```"


def _is_section_heading(line: str) -> bool:
    return line.startswith("## ")


def _split(text: str) -> tuple[list[str], list[tuple[str, list[str]]]]:
    """The lines before the first section, and each section as (title, its lines)."""
    preamble: list[str] = []
    sections: list[tuple[str, list[str]]] = []
    in_fence = False
    for line in text.splitlines():
        if line.lstrip().startswith(_FENCE):
            in_fence = not in_fence
        if not in_fence and _is_section_heading(line):
            sections.append((line[3:].strip(), [line]))
        elif sections:
            sections[-1][1].append(line)
        else:
            preamble.append(line)
    return preamble, sections


def replace_section(text: str, title: str, markdown: str) -> str:
    """``text`` with the section ``## title`` replaced by ``markdown`` (appended if absent).

    The section runs from its heading to the next ``## `` heading outside a code
    fence. Every other section keeps its place and bytes.

    Raises:
        ValueError: ``markdown`` holds a ``## `` heading of its own, which would
            split it into two sections on the next rewrite.
    """
    _, own = _split(markdown)
    if own:
        raise ValueError(f"section {title!r} must not contain '## ' headings; use '### '")
    body = [f"## {title}", "", *markdown.strip("\n").splitlines(), ""]
    preamble, sections = _split(text)
    replaced = False
    for index, (existing, _lines) in enumerate(sections):
        if existing == title:
            sections[index] = (title, body)
            replaced = True
    if not replaced:
        sections.append((title, body))
    lines = preamble if any(line.strip() for line in preamble) else _PREAMBLE.splitlines()
    out = [*lines]
    for _, section in sections:
        if out and out[-1].strip():
            out.append("")
        out.extend(section)
    return "\n".join(out).rstrip("\n") + "\n"


def write_section(title: str, markdown: str, path: Path = RESULTS_PATH) -> None:
    """Replace the section ``## title`` of ``path`` with ``markdown``, keeping all others.

    Safe against another benchmark writing its own section at the same time: the
    read-modify-write holds an exclusive lock, and the new file replaces the old
    one atomically.

    Raises:
        ValueError: ``markdown`` contains a ``## `` heading.
    """
    path.parent.mkdir(parents=True, exist_ok=True)
    # The lock lives outside the repository, so no stray file is left next to the results.
    digest = hashlib.sha256(str(path.resolve()).encode()).hexdigest()[:16]
    lock_path = Path(tempfile.gettempdir()) / f"turnledger-results-{digest}.lock"
    with lock_path.open("w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        current = path.read_text(encoding="utf-8") if path.exists() else ""
        updated = replace_section(current, title, markdown)
        mode = path.stat().st_mode & 0o777 if path.exists() else 0o644
        fd, temporary = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.")
        try:
            with os.fdopen(fd, "w", encoding="utf-8") as handle:
                handle.write(updated)
            os.chmod(temporary, mode)  # mkstemp makes it private; keep the file's own mode
            os.replace(temporary, path)
        except BaseException:
            Path(temporary).unlink(missing_ok=True)
            raise


def machine_line() -> str:
    """When and where a benchmark ran: date (UTC), CPU count, OS and Python version."""
    now = datetime.now(UTC).strftime("%Y-%m-%d %H:%M UTC")
    return (
        f"{now}; {os.cpu_count()} CPUs (nproc {_nproc()}), {platform.system()} "
        f"{platform.machine()}, Python {platform.python_version()}"
    )


def _nproc() -> str:
    # nproc honours CPU affinity and cgroup limits, unlike os.cpu_count().
    try:
        done = subprocess.run(["nproc"], capture_output=True, text=True, check=True, timeout=5)
    except (OSError, subprocess.SubprocessError):
        return str(len(os.sched_getaffinity(0)))
    return done.stdout.strip()


def command_line(module: str, args: Sequence[str]) -> str:
    """The command that reproduces a run of ``module`` with ``args``."""
    line = " ".join([".venv/bin/python", "-m", module, *args])
    return f"`{line}` (`make bench` runs every benchmark with the defaults)"


def publish(title: str, markdown: str, *, print_only: bool) -> None:
    """A benchmark's last step: print its section (``--print-only``), or write it as
    ``## title`` of ``bench/RESULTS.md`` and say so."""
    if print_only:
        print(markdown)
    else:
        write_section(title, markdown)
        print(f"wrote '## {title}' of bench/RESULTS.md", flush=True)
