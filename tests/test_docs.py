"""The documentation's own rules: the README and docs/results.md stay short, prose lines stay
within 100 columns, table cells within 200 characters, and every relative link points to a file.

Plain file reads: no Ray, no database, no torch."""

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
README = ROOT / "README.md"
RESULTS = ROOT / "docs" / "results.md"
LINE_LIMIT = 100
CELL_LIMIT = 200

# [text](target), the text possibly wrapped over lines; images too.
LINK = re.compile(r"!?\[[^\]]*\]\(([^)\s]+)(?:\s+\"[^\"]*\")?\)")
# A line that is one link or one URL and cannot wrap.
UNBREAKABLE = re.compile(r"^\s*(?:[-*+]\s+)?(?:<?https?://\S+>?|!?\[[^\]]*\]\([^)\s]+\)[.,;:]?|\S+)\s*$")


def markdown_files():
    files = [README]
    benchmarks = ROOT / "BENCHMARKS.md"
    if benchmarks.exists():
        files.append(benchmarks)
    files += sorted((ROOT / "docs").rglob("*.md"))
    return files


def prose_and_tables(path):
    """(line number, line, is_table_row) for every line outside fenced code blocks."""
    fence = None
    for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
        stripped = line.strip()
        marker = re.match(r"^(`{3,}|~{3,})", stripped)
        if marker:
            if fence is None:
                fence = marker.group(1)[0]
            elif stripped.startswith(fence * 3):
                fence = None
            continue
        if fence is None:
            yield number, line, stripped.startswith("|")


def cells(row):
    """A table row's cells; a `|` inside backticks or escaped does not split a cell."""
    row = row.strip().strip("|")
    out, current, code = [], [], False
    i = 0
    while i < len(row):
        ch = row[i]
        if ch == "\\" and i + 1 < len(row):
            current.append(row[i : i + 2])
            i += 2
            continue
        if ch == "`":
            code = not code
        if ch == "|" and not code:
            out.append("".join(current))
            current = []
        else:
            current.append(ch)
        i += 1
    out.append("".join(current))
    return [c.strip() for c in out]


def relative(path):
    return path.relative_to(ROOT).as_posix()


def test_readme_is_at_most_250_lines():
    n = len(README.read_text(encoding="utf-8").splitlines())
    assert n <= 250, f"README.md has {n} lines (at most 250: move detail into docs/)"


def test_results_is_at_most_300_lines():
    n = len(RESULTS.read_text(encoding="utf-8").splitlines())
    assert n <= 300, f"docs/results.md has {n} lines (at most 300: history goes in docs/journal/)"


@pytest.mark.parametrize("path", markdown_files(), ids=relative)
def test_prose_lines_and_table_cells_are_short(path):
    problems = []
    for number, line, is_table in prose_and_tables(path):
        if is_table:
            for cell in cells(line):
                if len(cell) > CELL_LIMIT:
                    problems.append(f"{number}: a table cell of {len(cell)} characters")
        elif len(line) > LINE_LIMIT and not UNBREAKABLE.match(line):
            problems.append(f"{number}: a line of {len(line)} characters")
    assert not problems, f"{relative(path)}: " + "; ".join(problems)


@pytest.mark.parametrize("path", markdown_files(), ids=relative)
def test_relative_links_point_to_files(path):
    text = "\n".join(line for _, line, _ in prose_and_tables(path))
    broken = []
    for target in LINK.findall(text):
        if re.match(r"^[a-z][a-z0-9+.-]*:", target, re.I) or target.startswith("#"):
            continue  # http(s), mailto and the like; an anchor in this file
        file_part = target.split("#", 1)[0]
        if not (path.parent / file_part).exists():
            broken.append(target)
    assert not broken, f"{relative(path)} links to missing files: {broken}"
