"""docs/reference/*.md are generated from the code (orchestrator/reference_docs.py): the committed
files must equal what it renders, and what it renders must cover every key and command."""

from __future__ import annotations

import re
import tomllib
from dataclasses import fields
from pathlib import Path

import pytest

from orchestrator import config, reference_docs
from orchestrator.cli import EXAMPLES, build_parser
from trainers.hparams import PretrainConfig, TrialBudget, TrialHParams
from trainers.knobs import field_specs

REGENERATE = f"run `{reference_docs.WRITE_COMMAND}` and commit docs/reference/"

# Each section's keys as the config reads them, listed here apart from reference_docs.KEY_SECTIONS:
# a section or key added to the config and left out of the reference fails below.
SECTION_KEYS = {
    "study": [f.name for f in fields(config.StudySettings)],
    "corpus": [f.name for f in fields(config.CorpusSettings)],
    "model": list(config.MODEL_SPECS),
    "pretrain": [f.name for f in fields(PretrainConfig)],
    "trial": [f.name for f in fields(TrialBudget)],
    "search": [f.name for f in fields(TrialHParams)],
    "early_stopping": [f.name for f in fields(config.EarlyStopping)],
}


@pytest.fixture(scope="module")
def documents() -> dict[str, str]:
    return {
        "study-file.md": reference_docs.study_file_reference(),
        "cli.md": reference_docs.cli_reference(),
    }


def _sections(text: str) -> dict[str, str]:
    """A document's text by level-2 heading."""
    parts = re.split(r"^## (.+)$", text, flags=re.MULTILINE)
    return dict(zip(parts[1::2], parts[2::2]))


@pytest.mark.parametrize("name", ["study-file.md", "cli.md"])
def test_committed_reference_is_what_the_code_generates(documents, name):
    path = reference_docs.REFERENCE / name
    assert path.is_file(), f"{path} is missing: {REGENERATE}"
    assert path.read_text(encoding="utf-8") == documents[name], f"{path} is stale: {REGENERATE}"


def test_every_section_and_key_is_in_the_study_file_reference(documents):
    sections = _sections(documents["study-file.md"])
    assert list(sections) == [f"`[{s}]`" for s in config.SECTIONS]
    assert set(SECTION_KEYS) | {"startup"} == set(config.SECTIONS)
    for section, keys in SECTION_KEYS.items():
        text = sections[f"`[{section}]`"]
        missing = [key for key in keys if f"\n| `{key}` |" not in text]
        assert not missing, f"[{section}] {missing} not in the reference: {REGENERATE}"


def test_every_key_has_a_description():
    specs = {
        "study": field_specs(config.StudySettings),
        "corpus": field_specs(config.CorpusSettings),
        "model": config.MODEL_SPECS,
        "pretrain": field_specs(PretrainConfig),
        "trial": field_specs(TrialBudget),
        "search": field_specs(TrialHParams),
        "early_stopping": field_specs(config.EarlyStopping),
    }
    undocumented = [
        f"[{s}] {k}" for s, table in specs.items() for k, spec in table.items() if not spec.get("doc")
    ]
    assert not undocumented, f"give these a doc= (a spec's 'doc'): {undocumented}"


def test_the_study_file_reference_examples_are_valid(documents):
    """The TOML examples of [search] and [startup] load as a study file's tables."""
    sections = _sections(documents["study-file.md"])
    raw = {"study": {"name": "example"}, "corpus": {"path": "text.txt"}}
    for section in ("search", "startup"):
        blocks = re.findall(r"```toml\n(.*?)```", sections[f"`[{section}]`"], flags=re.DOTALL)
        assert blocks, f"[{section}] has no example"
        for block in blocks:
            raw.update(tomllib.loads(block))
    cfg = config.config_from_raw(Path("example.toml"), raw)
    assert cfg.search.searched() and cfg.search.startup


def test_every_command_and_argument_is_in_the_cli_reference(documents):
    _, _, commands = reference_docs._parser_parts(build_parser())
    assert set(commands) == set(EXAMPLES)
    sections = _sections(documents["cli.md"])
    assert list(sections) == [f"`launch-study {name}`" for name in commands]
    for name, command in commands.items():
        text = sections[f"`launch-study {name}`"]
        _, arguments, _ = reference_docs._parser_parts(command)
        for action in arguments:
            shown = action.option_strings[0] if action.option_strings else action.dest
            assert f"| `{shown}" in text, f"{name} {shown} not in the reference: {REGENERATE}"
        assert EXAMPLES[name] in text


@pytest.mark.parametrize("name", ["study-file.md", "cli.md"])
def test_markdown_rules(documents, name):
    """Prose lines at most 100 characters, no table cell over 200 (the project's rules)."""
    fenced = False
    for number, line in enumerate(documents[name].splitlines(), 1):
        if line.startswith("```"):
            fenced = not fenced
        elif line.startswith("|"):
            cells = re.split(r"(?<!\\)\|", line.strip("|"))
            assert max(len(c.strip()) for c in cells) <= 200, f"{name}:{number}: a table cell over 200"
        elif not fenced:
            assert len(line) <= 100, f"{name}:{number}: {len(line)} characters"


def test_check_names_the_stale_file(tmp_path, monkeypatch, capsys):
    monkeypatch.setattr(reference_docs, "ROOT", tmp_path)
    monkeypatch.setattr(reference_docs, "REFERENCE", tmp_path / "docs" / "reference")
    assert reference_docs.main([]) == 0  # writes both
    assert reference_docs.main(["--check"]) == 0
    capsys.readouterr()
    cli = tmp_path / "docs" / "reference" / "cli.md"
    cli.write_text(cli.read_text() + "an edit by hand\n")
    assert reference_docs.main(["--check"]) == 1
    err = capsys.readouterr().err.splitlines()
    assert len(err) == 1
    assert "docs/reference/cli.md" in err[0] and "study-file.md" not in err[0]
    assert reference_docs.WRITE_COMMAND in err[0]
