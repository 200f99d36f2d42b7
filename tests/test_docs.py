"""The README and docs/ hold to the code: every `specbench` command in their bash blocks parses (and
`run` commands compose), every `make` target they name exists, every script they run is there, and
every relative link points at a file. Nothing is run: the commands stop once parsed."""

from __future__ import annotations

import re
import shlex
from pathlib import Path

import pytest

from specbench.cli import main
from specbench.core.args import ParsedOnly, parse_only

pytestmark = pytest.mark.fast  # the everyday tier, `make test-fast`: no zoo, seconds

REPO = Path(__file__).resolve().parents[1]
PAGES = [REPO / "README.md", *sorted((REPO / "docs").glob("*.md"))]
SPECBENCH = (".venv/bin/python -m specbench", "python -m specbench", "specbench")
README_LINES = 250


def _blocks(text: str) -> list[str]:
    return re.findall(r"^```(?:bash|sh)\n(.*?)^```", text, flags=re.S | re.M)


def _commands(page: Path) -> list[str]:
    """The command lines of a page's bash blocks, continuations joined, comments cut."""
    out = []
    for block in _blocks(page.read_text(encoding="utf-8")):
        for line in block.replace("\\\n", " ").splitlines():
            line = re.sub(r"\s+#\s.*$", "", line).strip()
            if line and not line.startswith("#"):
                out.append(line)
    return out


def _doc_commands() -> list[tuple[str, str]]:
    return [(page.name if page.parent == REPO else f"docs/{page.name}", c) for page in PAGES for c in _commands(page)]


def _argv(command: str) -> list[str] | None:
    """The specbench argv of a command line (leading VAR=value settings skipped), or None."""
    words = shlex.split(command)
    while words and re.fullmatch(r"[A-Z_][A-Z0-9_]*=.*", words[0]):
        words = words[1:]
    text = " ".join(words)
    for prefix in SPECBENCH:
        if text.startswith(prefix + " ") or text == prefix:
            return words[len(prefix.split()):]
    return None


def _make_targets() -> set[str]:
    text = (REPO / "Makefile").read_text(encoding="utf-8")
    return set(re.findall(r"^([A-Za-z][\w.-]*)\s*:(?!=)", text, flags=re.M))


def _first_of_each_sweep(argv: list[str]) -> list[str]:
    """A multirun's first job: `-m` dropped and each `key=a,b,c` cut to `key=a`."""
    out = []
    for a in argv:
        if a in ("-m", "--multirun"):
            continue
        key, sep, value = a.partition("=")
        if sep and "," in value and not value.startswith(("[", "'", '"')):
            a = f"{key}={value.split(',')[0]}"
        out.append(a)
    return out


def test_the_readme_is_one_screenful_per_idea():
    lines = (REPO / "README.md").read_text(encoding="utf-8").count("\n")
    assert lines <= README_LINES, f"README.md has {lines} lines; move the depth to docs/ (at most {README_LINES})"
    assert len(PAGES) > 5 and all(p.read_text(encoding="utf-8").startswith("# ") for p in PAGES[1:])


def test_the_docs_name_commands_at_all():
    names = [c for _, c in _doc_commands()]
    assert sum(_argv(c) is not None for c in names) >= 20  # the parse test below checks something
    assert any(c.startswith("make bench") for c in names) and any(c.startswith("make test") for c in names)


@pytest.mark.parametrize("page,command", [pc for pc in _doc_commands() if _argv(pc[1]) is not None])
def test_every_specbench_command_in_the_docs_parses(page, command, monkeypatch, capsys):
    monkeypatch.chdir(REPO)  # methods/ (the bigram example) and configs/ as a user of the checkout sees them
    argv = _argv(command)
    if {"-m", "--multirun"} & set(argv):
        argv = _first_of_each_sweep(argv)
    if argv == [] or "--help" in argv:
        assert main(argv) == 0, f"{page}: `{command}`"
        return
    with parse_only():
        try:
            status = main(argv)
        except ParsedOnly:
            return
    err = capsys.readouterr().err.strip()
    pytest.fail(f"{page}: `{command}` did not parse (exit {status}): {err}")


@pytest.mark.parametrize("page,command", [pc for pc in _doc_commands() if pc[1].split()[0] == "make"])
def test_every_make_target_in_the_docs_exists(page, command):
    words = [w for w in shlex.split(command)[1:] if "=" not in w]
    missing = [w for w in words if w not in _make_targets()]
    assert not missing, f"{page}: `{command}` names no Makefile target {missing}"


def test_scripts_the_docs_run_exist():
    for page, command in _doc_commands():
        for path in re.findall(r"(?:bash|python3?) (scripts/\S+)", command):
            assert (REPO / path).is_file(), f"{page}: `{command}`: {path} is missing"


def test_relative_links_point_at_files():
    for page in PAGES:
        text = page.read_text(encoding="utf-8")
        for target in re.findall(r"\]\(([^)\s]+)\)", text):
            if re.match(r"[a-z]+:", target) or target.startswith("#"):
                continue
            path = (page.parent / target.split("#")[0]).resolve()
            assert path.exists(), f"{page.relative_to(REPO)} links to {target}, which is not there"


def test_a_bad_command_does_not_pass_for_parsed(capsys):
    """The failing condition of the parse test: a wrong option or override is caught, not parsed."""
    with parse_only():
        assert main(["report", "--no-such-option"]) == 2
        assert main(["run", "method=no_such_method"]) == 2
        with pytest.raises(ParsedOnly):
            main(["report", "--no-figures"])
    assert "no_such_method" in capsys.readouterr().err
