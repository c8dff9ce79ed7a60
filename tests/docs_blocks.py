"""The command blocks of README.md and docs/*.md, as a new user reads them.

A fenced block with info string `bash` holds commands. Either it runs as written (tests/test_docs_commands.py runs a
page's blocks in order, in one new shell), or the line just before it (blank lines skipped) marks why it cannot run
here: `*needs: cloud*` (a Nebius account and the Pulumi CLI), `*needs: gpu*` (an NVIDIA GPU), `*needs: your values*`
(placeholders the reader fills in: ADDR, RUN.json, `[--option]`), `*the test suite itself*` (CI runs it through
.ci/run), `*rewrites tracked files*` (`make lock`: it would change the checkout under test). A block marked
`*runs until stopped*` (a server) is started, reached at the loopback address its comment names, and stopped.
Other fenced blocks (output, tables, JSON) must not hold a command line.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
MARKERS = {
    "*needs: cloud*": "cloud",
    "*needs: gpu*": "gpu",
    "*needs: your values*": "your values",
    "*the test suite itself*": "suite",
    "*rewrites tracked files*": "rewrites",
    "*runs until stopped*": "server",
}
CONVENTION = "tests/test_docs_commands.py"
"""named in the intro of every page with a command block, where the page says how its blocks run"""
COMMAND_WORDS = {"make", "ftstack", "python", "python3", "sbatch", "srun", "scontrol", "squeue", "sinfo", "pulumi",
                 "jq", "curl", "ssh", "sudo", "pytest", "uv", "pip", "kubectl", "helm", "export", "source", "."}
SCRIPT = re.compile(r"^(scripts|bench|\.venv/bin)/\S*(\.sh|\.py)?$")
FENCE = re.compile(r"^(\s*)```(\S*)\s*$")
MARKER_LIKE = re.compile(r"^\*(needs:[^*]*|the test suite itself|rewrites tracked files|runs until stopped)\*\s*$")


@dataclass(frozen=True)
class Block:
    page: Path
    line: int
    """1-based line of the opening fence"""
    lang: str
    text: str
    marker: str | None
    """the line before the block when it looks like a marker (checked against MARKERS by the test)"""

    @property
    def where(self) -> str:
        return f"{self.page.relative_to(ROOT)}:{self.line}"

    @property
    def need(self) -> str | None:
        return MARKERS.get(self.marker) if self.marker else None

    @property
    def runs(self) -> bool:
        return self.lang == "bash" and self.marker is None

    @property
    def on_rehearsal_cluster(self) -> bool:
        """Whether the block drives the rehearsal cluster (run on the tests' cluster, not on the local Slurm)."""
        return "local-cluster.sh" in self.text or "--stack cluster" in self.text


def read_blocks(page: Path) -> list[Block]:
    """Every fenced block of a page, with its language and the marker line before it."""
    lines = page.read_text().splitlines()
    blocks: list[Block] = []
    i = 0
    while i < len(lines):
        opening = FENCE.match(lines[i])
        if not opening:
            i += 1
            continue
        end = next((j for j in range(i + 1, len(lines)) if lines[j].strip() == "```"), None)
        if end is None:
            raise ValueError(f"{page}:{i + 1}: a fenced block that never closes")
        before = next((lines[j].strip() for j in range(i - 1, -1, -1) if lines[j].strip()), "")
        indent = len(opening.group(1))
        text = "\n".join(line[indent:] for line in lines[i + 1:end])
        blocks.append(Block(page, i + 1, opening.group(2), text, before if MARKER_LIKE.match(before) else None))
        i = end + 1
    return blocks


def command_lines(text: str) -> list[str]:
    """Lines of a non-command block that read as a command (a first word a shell would run, or a `$ ` prompt)."""
    found = []
    for line in text.splitlines():
        words = line.split()
        if len(words) < 2:
            continue
        script = SCRIPT.match(words[0]) and (words[0].startswith(".venv/") or words[0].endswith((".sh", ".py")))
        # "pytest test, with ..." in a layout listing is prose: a command's next word is not punctuated
        if words[0] == "$" or script or (words[0] in COMMAND_WORDS and words[1][-1] not in ",;:."):
            found.append(line.strip())
    return found
