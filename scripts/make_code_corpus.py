"""Build studies/data/python_code/: a second corpus, of another kind than tinyshakespeare.

Why it exists: the recipe in studies/tinyshakespeare.toml was tuned on 1.1 MB of English verse.
A corpus of another kind, Python source code, confirms it (studies/python_code.toml keeps every
setting). The text must be the same on every machine, so it is not read from the machine's own
Python (its standard library differs between versions and builds): it is the library code of a
dozen well-known, permissively licensed, pure-Python packages, downloaded from PyPI as the sdists
pinned below, each checked against its pinned sha256.

Split by package, so that near-duplicate files never straddle two splits: most packages train,
two validate (the split a study selects on), two test (scored, selected on by nothing). Which
package goes where is written below (SPLIT), not chosen when the script runs.

What is kept: the .py files of each package's own import package (tests, docs, examples, setup
scripts and vendored or generated files left out; DROPPED says which and why), decoded as UTF-8,
deduplicated by exact content and by content with whitespace collapsed. Each split's file is its
source files in sorted path order, each under a line "# file: PATH" and separated by a blank line.
MANIFEST.md (versions, licenses, hashes, sizes, character sets) and LICENSES.txt are written too.

Standard library only. Usage, from the repository root:

    python3 scripts/make_code_corpus.py                # download, build, write the files
    python3 scripts/make_code_corpus.py --sdists DIR   # keep the sdists in DIR (reused if there)
    python3 scripts/make_code_corpus.py --check        # rebuild, compare with the files, write nothing
"""

from __future__ import annotations

import argparse
import hashlib
import re
import subprocess
import sys
import tarfile
import tempfile
from collections import Counter
from dataclasses import dataclass
from pathlib import Path

OUT = Path(__file__).resolve().parent.parent / "studies" / "data" / "python_code"
SPLITS = ("train", "val", "test")


@dataclass(frozen=True)
class Package:
    name: str  # as pip knows it
    version: str
    sdist: str  # the file pip downloads
    sha256: str  # of that file
    license: str  # SPDX expression, from the package's metadata and license file
    roots: tuple[str, ...]  # inside the sdist (below its top folder): import packages or modules
    license_files: tuple[str, ...]  # inside the sdist, copied into LICENSES.txt


# fmt: off
PACKAGES = (
    Package("attrs", "23.2.0", "attrs-23.2.0.tar.gz",
            "935dc3b529c262f6cf76e50877d35a4bd3c1de194fd41f47a2b7ae8f19971f30",
            "MIT", ("src/attr", "src/attrs"), ("LICENSE",)),
    Package("click", "8.1.7", "click-8.1.7.tar.gz",
            "ca9853ad459e787e2192211578cc907e7594e294c7ccc834310722b41b9ca6de",
            "BSD-3-Clause", ("src/click",), ("LICENSE.rst",)),
    Package("itsdangerous", "2.2.0", "itsdangerous-2.2.0.tar.gz",
            "e0050c0b7da1eea53ffaf149c0cfbb5c6e2e2b69c4bef22c81fa6eb73e5f6173",
            "BSD-3-Clause", ("src/itsdangerous",), ("LICENSE.txt",)),
    Package("jinja2", "3.1.4", "jinja2-3.1.4.tar.gz",
            "4a3aee7acbbe7303aede8e9648d13b8bf88a429282aa6122a993f0ac800cb369",
            "BSD-3-Clause", ("src/jinja2",), ("LICENSE.txt",)),
    Package("more-itertools", "10.3.0", "more-itertools-10.3.0.tar.gz",
            "e5d93ef411224fbcef366a6e8ddc4c5781bc6359d43412a65dd5964e46111463",
            "MIT", ("more_itertools",), ("LICENSE",)),
    Package("packaging", "24.1", "packaging-24.1.tar.gz",
            "026ed72c8ed3fcce5bf8950572258698927fd1dbda10a5e981cdf0ac37f4f002",
            "Apache-2.0 OR BSD-2-Clause", ("src/packaging",),
            ("LICENSE", "LICENSE.APACHE", "LICENSE.BSD")),
    Package("pluggy", "1.5.0", "pluggy-1.5.0.tar.gz",
            "2cffa88e94fdc978c4c574f15f9e59b7f4201d439195c3715ca9e2486f1d0cf1",
            "MIT", ("src/pluggy",), ("LICENSE",)),
    Package("pyparsing", "3.1.2", "pyparsing-3.1.2.tar.gz",
            "a1bac0ce561155ecc3ed78ca94d3c9378656ad4c94c1270de543f621420f94ad",
            "MIT", ("pyparsing",), ("LICENSE",)),
    Package("requests", "2.32.3", "requests-2.32.3.tar.gz",
            "55365417734eb18255590a9ff9eb97e9e1da868d4ccd6402399eaf68af20a760",
            "Apache-2.0", ("src/requests",), ("LICENSE", "NOTICE")),
    Package("six", "1.16.0", "six-1.16.0.tar.gz",
            "1e61c37477a1626458e36f7b1d82aa5c9b094fa4802892072e49de9c60c4c926",
            "MIT", ("six.py",), ("LICENSE",)),
    Package("tomli", "2.0.1", "tomli-2.0.1.tar.gz",
            "de526c12914f0c550d15924c62d72abc48d6fe7364aa87328337a31007fe8a4f",
            "MIT", ("src/tomli",), ("LICENSE",)),
    Package("toolz", "0.12.1", "toolz-0.12.1.tar.gz",
            "ecca342664893f177a13dac0e6b41cbd8ac25a358e5f215316d43e2100224f4d",
            "BSD-3-Clause", ("toolz",), ("LICENSE.txt",)),
)
# fmt: on

# Chosen once, by hand, and only here: two packages a held-out split, about a tenth of the
# characters each (MANIFEST.md has the shares), none from the same authors as a training package
# (click, jinja2 and itsdangerous, the Pallets projects, share one house style: all three train).
# The smaller pair validates, since every trial scores the whole validation split.
SPLIT = {
    "toolz": "val",
    "pluggy": "val",
    "more-itertools": "test",
    "six": "test",
}  # every other package: train

# Files inside the roots that are not kept, by corpus path, with the reason written to MANIFEST.md.
DROPPED = {
    "jinja2/_identifier.py": "generated: a regular expression of Unicode identifier characters",
    "pyparsing/unicode.py": "mostly tables of Unicode code-point ranges",
    "toolz/_version.py": "generated by versioneer",
}
TEST_DIRS = {"tests", "test", "testing"}  # a folder of tests inside an import package


def sha256_file(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as fh:
        for block in iter(lambda: fh.read(1 << 16), b""):
            digest.update(block)
    return digest.hexdigest()


def fetch(folder: Path) -> None:
    """Download with pip every pinned sdist that ``folder`` lacks, then check every hash."""
    missing = [p for p in PACKAGES if not (folder / p.sdist).is_file()]
    if missing:
        cmd = [sys.executable, "-m", "pip", "download", "--disable-pip-version-check", "--quiet"]
        cmd += ["--no-deps", "--no-binary", ":all:", "--dest", str(folder)]
        cmd += [f"{p.name}=={p.version}" for p in missing]
        print(f"pip: downloading {len(missing)} sdists into {folder}", file=sys.stderr)
        subprocess.run(cmd, check=True)
    for p in PACKAGES:
        path = folder / p.sdist
        if not path.is_file():
            sys.exit(f"{path}: pip did not download it")
        if (got := sha256_file(path)) != p.sha256:
            sys.exit(f"{path}: sha256 {got}, pinned {p.sha256}")


def corpus_path(inner: str) -> str:
    """The path a file is named by in the corpus: inside the sdist, without a leading src/."""
    return inner.removeprefix("src/")


def read_sdist(package: Package, folder: Path) -> tuple[dict[str, str], dict[str, str], list[str]]:
    """The package's kept source files and its license files (path -> text), and what was left
    out inside its roots, each as "path: reason"."""
    sources: dict[str, str] = {}
    licenses: dict[str, str] = {}
    left_out: list[str] = []
    with tarfile.open(folder / package.sdist) as tar:
        for member in sorted(tar.getmembers(), key=lambda m: m.name):
            top, _, inner = member.name.partition("/")
            if not member.isfile() or top != package.sdist.removesuffix(".tar.gz"):
                continue
            if inner in package.license_files:
                licenses[inner] = tar.extractfile(member).read().decode("utf-8")
                continue
            in_roots = any(inner == r or inner.startswith(r + "/") for r in package.roots)
            if not in_roots or not inner.endswith(".py"):
                continue
            path = corpus_path(inner)
            if path in DROPPED:
                left_out.append(f"{path}: {DROPPED[path]}")
                continue
            if TEST_DIRS & set(path.split("/")[:-1]):
                left_out.append(f"{path}: a test")
                continue
            text = tar.extractfile(member).read().decode("utf-8").replace("\r\n", "\n")
            text = text.rstrip() + "\n"  # no trailing blank lines: one blank line between files
            if not text.strip():
                left_out.append(f"{path}: empty")
                continue
            sources[path] = text
    if missing := sorted(set(package.license_files) - set(licenses)):
        sys.exit(f"{package.sdist}: no {', '.join(missing)}")
    return sources, licenses, left_out


def squeeze(text: str) -> str:
    return re.sub(r"\s+", " ", text).strip()


def build(folder: Path) -> dict[str, bytes]:
    """Every output file's name and bytes."""
    unknown = set(SPLIT) - {p.name for p in PACKAGES}
    if unknown or not set(SPLIT.values()) <= set(SPLITS):
        sys.exit(f"SPLIT names packages or splits that are not pinned: {sorted(unknown)}")
    split_of = {p.name: SPLIT.get(p.name, "train") for p in PACKAGES}
    files: dict[str, list[tuple[str, str]]] = {s: [] for s in SPLITS}  # split -> (path, text)
    kept: Counter[str] = Counter()  # package -> files kept
    kept_chars: Counter[str] = Counter()
    left_out: dict[str, list[str]] = {}
    licenses: dict[str, dict[str, str]] = {}
    seen: dict[str, str] = {}  # hash of a text, exact or squeezed -> the path that kept it
    # Deduplicated in split order (train first), so a copy is dropped from the held-out split.
    reads = {p.name: read_sdist(p, folder) for p in PACKAGES}
    found = {x.split(":")[0] for _, _, out in reads.values() for x in out}
    if stale := sorted(set(DROPPED) - found):
        sys.exit(f"DROPPED names files that no sdist has: {', '.join(stale)}")
    for split in SPLITS:
        for p in (p for p in PACKAGES if split_of[p.name] == split):
            sources, licenses[p.name], left_out[p.name] = reads[p.name]
            for path, text in sorted(sources.items()):
                keys = [hashlib.sha256(t.encode()).hexdigest() for t in (text, "\0" + squeeze(text))]
                if first := next((seen[k] for k in keys if k in seen), None):
                    left_out[p.name].append(f"{path}: a copy of {first}")
                    continue
                seen.update(dict.fromkeys(keys, path))
                files[split].append((path, text))
                kept[p.name] += 1
                kept_chars[p.name] += len(text)
    texts = {s: "\n".join(f"# file: {path}\n{text}" for path, text in sorted(files[s])) for s in SPLITS}
    out = {f"{s}.txt": texts[s].encode("utf-8") for s in SPLITS}
    out["LICENSES.txt"] = licenses_text(licenses).encode("utf-8")
    n_files = {s: len(files[s]) for s in SPLITS}
    out["MANIFEST.md"] = manifest(split_of, kept, kept_chars, left_out, n_files, texts, out).encode("utf-8")
    return out


def licenses_text(licenses: dict[str, dict[str, str]]) -> str:
    parts = [
        "The license files of the packages whose source is in train.txt, val.txt and test.txt,\n"
        "as their sdists ship them (MANIFEST.md names the versions).\n"
    ]
    for p in PACKAGES:
        for name in p.license_files:
            rule = "=" * 78
            parts.append(f"{rule}\n{p.name} {p.version} ({p.license}): {name}\n{rule}\n\n")
            parts.append(licenses[p.name][name].rstrip() + "\n\n")
    return "".join(parts).rstrip() + "\n"


def shown(ch: str) -> str:
    return f"`{ch}`" if ch.isprintable() and ch != "`" else f"U+{ord(ch):04X}"


def manifest(
    split_of: dict[str, str],
    kept: Counter[str],
    kept_chars: Counter[str],
    left_out: dict[str, list[str]],
    n_files: dict[str, int],
    texts: dict[str, str],
    out: dict[str, bytes],
) -> str:
    """MANIFEST.md: what the corpus is made of, and how to make it again."""
    train_chars = set(texts["train"])
    lines = [
        "# python_code: Python source code, split by package",
        "",
        "A corpus of another kind than tinyshakespeare (English verse): the library code of",
        f"{len(PACKAGES)} pure-Python packages from PyPI, at pinned versions. Written by",
        "`scripts/make_code_corpus.py` (its docstring says why and how); every file in this",
        "folder is rebuilt byte for byte, this one included, from the repository root by:",
        "",
        "    python3 scripts/make_code_corpus.py           # downloads the sdists with pip",
        "    python3 scripts/make_code_corpus.py --check   # rebuilds and compares, writes nothing",
        "",
        "## Packages",
        "",
        "| package | version | license | split | files | characters | sdist sha256 |",
        "| --- | --- | --- | --- | ---: | ---: | --- |",
    ]
    for p in PACKAGES:
        lines.append(
            f"| {p.name} | {p.version} | {p.license} | {split_of[p.name]} | {kept[p.name]} "
            f"| {kept_chars[p.name]:,} | `{p.sha256}` |"
        )
    total = sum(len(texts[s]) for s in SPLITS)
    lines += [
        "",
        "The split is by package (near-duplicate files never straddle two splits), chosen once",
        "and written in the script (SPLIT): toolz and pluggy validate, more-itertools and six test,",
        "every other package trains. LICENSES.txt has each package's license files.",
        "",
        "## Splits",
        "",
        "| split | packages | files | characters | share | UTF-8 bytes | distinct characters "
        "| characters not in train (occurrences) | sha256 |",
        "| --- | --- | ---: | ---: | ---: | ---: | ---: | --- | --- |",
    ]
    for s in SPLITS:
        text = texts[s]
        names = ", ".join(p.name for p in PACKAGES if split_of[p.name] == s)
        if s == "train":
            unknown = "-"
        else:
            counts = Counter(ch for ch in text if ch not in train_chars)
            unknown = f"{len(counts)} ({sum(counts.values())})"
            if counts:
                unknown += ": " + ", ".join(f"{shown(c)} x{n}" for c, n in sorted(counts.items()))
        lines.append(
            f"| {s} | {names} | {n_files[s]} | {len(text):,} | {len(text) / total:.1%} "
            f"| {len(out[s + '.txt']):,} | {len(set(text))} | {unknown} "
            f"| `{hashlib.sha256(out[s + '.txt']).hexdigest()}` |"
        )
    lines += ["", "Characters other than printable ASCII and the newline, by split:", ""]
    for s in SPLITS:
        odd = Counter(ch for ch in texts[s] if not (" " <= ch <= "~" or ch == "\n"))
        listed = ", ".join(f"{shown(c)} x{n}" for c, n in sorted(odd.items())) or "none"
        lines.append(f"- {s}: {listed}")
    lines += [
        "",
        "## What was left out",
        "",
        "Only the .py files of each package's own import package are read (not its tests, docs,",
        "examples or setup script), decoded as UTF-8, with trailing blank lines removed. A file",
        "whose text, exact or with whitespace collapsed, was already kept is dropped as a copy",
        "(train first, so a copy leaves a held-out split). Inside the import packages:",
        "",
    ]
    for p in PACKAGES:
        lines += [f"- {p.name}: {x}" for x in sorted(left_out[p.name])]
    return "\n".join(lines) + "\n"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--sdists", type=Path, help="folder for the sdists (default: a temporary one)")
    parser.add_argument("--out", type=Path, default=OUT, help=f"output folder (default: {OUT})")
    parser.add_argument("--check", action="store_true", help="compare with the files in --out, write none")
    args = parser.parse_args()

    with tempfile.TemporaryDirectory() as tmp:
        folder = args.sdists or Path(tmp)
        folder.mkdir(parents=True, exist_ok=True)
        fetch(folder)
        out = build(folder)

    if args.check:
        on_disk = {n: (args.out / n).read_bytes() if (args.out / n).is_file() else None for n in out}
        stale = [n for n, data in out.items() if on_disk[n] != data]
        if stale:
            sys.exit(f"{args.out}: differs from a rebuild: {', '.join(sorted(stale))}")
        print(f"{args.out}: the same as a rebuild")
        return
    args.out.mkdir(parents=True, exist_ok=True)
    for name, data in sorted(out.items()):
        (args.out / name).write_bytes(data)
        print(f"{args.out / name}: {len(data):,} bytes, sha256 {hashlib.sha256(data).hexdigest()}")


if __name__ == "__main__":
    main()
