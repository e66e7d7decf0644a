"""docs/design.md is the design the code cites, and every citation resolves.

Comments, docstrings and documents cite the design as `docs/design.md §N` or
`docs/design.md §N.M`. Each such citation must name a section heading of
docs/design.md; the design's own `§N` references must too; its contents list must
list exactly its numbered headings, in order, with links that reach them; and
sections are numbered without gaps, so `§3.2` is the second subsection of §3. The
brief's old form of citation (the word DESIGN before a section sign) points at a
document that is not in the repository, so none may remain.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from pathlib import Path

from tests.support import REPO

DESIGN = REPO / "docs" / "design.md"

# Files that carry prose a reader follows: code, docs, config, templates, Slurm files.
TEXT_SUFFIXES = {".py", ".md", ".lua", ".toml", ".cfg", ".ini", ".txt", ".in", ".service", ".timer", ".html"}
TEXT_NAMES = {"Makefile"}
NOT_SEARCHED = {"build", "dist", "var", "node_modules", "__pycache__"}

HEADING = re.compile(r"^(#{2,4}) (\d+(?:\.\d+)*)\.? (.+?)\s*$")
CITATION = re.compile(r"docs/design\.md §(\d+(?:\.\d+)*)")
# A `§N` in the design itself: its own section unless a document's name comes first.
REFERENCE = re.compile(r"(?:(\S+\.md) )?§(\d+(?:\.\d+)*)")
CONTENTS_LINE = re.compile(r"^(\s*)- \[(\d+(?:\.\d+)*)\.? (.+?)\]\(#([^)]+)\)\s*$")
LINK = re.compile(r"design\.md#([\w-]+)")
OLD_FORM = "DESIGN" + " §"  # spelt apart so this file is not a citation of it


def headings() -> list[tuple[str, str]]:
    """(number, title) of every numbered heading, in document order, outside code blocks."""
    found = []
    fenced = False
    for line in DESIGN.read_text(encoding="utf-8").splitlines():
        if line.startswith("```"):
            fenced = not fenced
            continue
        match = None if fenced else HEADING.match(line)
        if match:
            found.append((match.group(2), match.group(3)))
    return found


def text_files() -> Iterator[Path]:
    for path in sorted(REPO.rglob("*")):
        parts = path.relative_to(REPO).parts
        if any(part.startswith(".") or part in NOT_SEARCHED or part.endswith(".egg-info") for part in parts):
            continue
        if path.is_file() and (path.suffix in TEXT_SUFFIXES or path.name in TEXT_NAMES):
            yield path


def citations() -> list[tuple[str, str]]:
    """('path:line', section number) of every `docs/design.md §N` in the repository."""
    found = []
    for path in text_files():
        for number, line in enumerate(path.read_text(encoding="utf-8", errors="replace").splitlines(), 1):
            for match in CITATION.finditer(line):
                found.append((f"{path.relative_to(REPO)}:{number}", match.group(1)))
    return found


def slug(title: str) -> str:
    """The anchor GitHub gives a heading: lower case, punctuation dropped, spaces to hyphens."""
    return re.sub(r"[^\w\- ]", "", title.lower()).replace(" ", "-")


def anchor(number: str, title: str) -> str:
    """The anchor of the heading of section `number` (top-level headings read `1. Title`)."""
    return slug(f"{number}{'' if '.' in number else '.'} {title}")


def test_every_citation_of_the_design_names_one_of_its_sections() -> None:
    sections = {number for number, _ in headings()}
    found = citations()
    assert len(found) >= 20, "the code cites the design in twenty-odd places; the search found fewer"
    assert [f"{where}: §{number}" for where, number in found if number not in sections] == []


def test_the_designs_own_references_name_its_sections() -> None:
    sections = {number for number, _ in headings()}
    wrong = []
    for number, line in enumerate(DESIGN.read_text(encoding="utf-8").splitlines(), 1):
        for match in REFERENCE.finditer(line):
            document, section = match.groups()
            if document is not None and not document.endswith("design.md"):
                continue  # another document's section (docs/slurm-facts.md §11)
            if section not in sections:
                wrong.append(f"docs/design.md:{number}: §{section}")
    assert wrong == []


def test_every_link_into_the_design_reaches_a_heading() -> None:
    anchors = {anchor(number, title) for number, title in headings()}
    found = [
        f"{path.relative_to(REPO)}:{number}: #{match.group(1)}"
        for path in text_files()
        for number, line in enumerate(path.read_text(encoding="utf-8", errors="replace").splitlines(), 1)
        for match in LINK.finditer(line)
        if match.group(1) not in anchors
    ]
    assert found == []


def test_no_citation_of_the_absent_brief_remains() -> None:
    found = [
        f"{path.relative_to(REPO)}:{number}"
        for path in text_files()
        for number, line in enumerate(path.read_text(encoding="utf-8", errors="replace").splitlines(), 1)
        if OLD_FORM in line
    ]
    assert found == []


def test_sections_are_numbered_in_order_without_gaps() -> None:
    numbers = [tuple(int(part) for part in number.split(".")) for number, _ in headings()]
    assert numbers, "no numbered headings found"
    previous: tuple[int, ...] = ()
    for number in numbers:
        parent = number[:-1]
        expected_first = (*parent, 1)
        if len(number) > len(previous):  # a first subsection
            assert number == expected_first and parent == previous, f"§{number} after §{previous}"
        else:  # the next at its level, after any subsections of the one before
            assert number == (*parent, previous[len(number) - 1] + 1), f"§{number} after §{previous}"
        previous = number
    assert numbers[0] == (1,)


def test_the_contents_list_every_numbered_section_with_a_working_link() -> None:
    listed = []
    contents = DESIGN.read_text(encoding="utf-8").split("## Contents", 1)[1].split("\n## ", 1)[0]
    for line in contents.splitlines():
        match = CONTENTS_LINE.match(line)
        if match:
            indent, number, title, link = match.groups()
            assert len(indent) == 2 * number.count("."), f"§{number} is indented as another level"
            assert link == anchor(number, title), f"§{number}: link #{link}, heading #{anchor(number, title)}"
            listed.append((number, title))
    assert listed == headings()


def test_the_slug_is_githubs() -> None:
    assert slug("3.1 Submit: job_submit.lua asks for a quote") == "31-submit-job_submitlua-asks-for-a-quote"
    assert slug("1. What it is") == "1-what-it-is"
    assert slug("5.3 The daemon's socket protocol") == "53-the-daemons-socket-protocol"
