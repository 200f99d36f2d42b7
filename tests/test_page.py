"""The leaderboard page (index.html) written by `report`, opened in a real headless Chromium.

Needs Debian's chromium and chromium-driver (`make browser`) and selenium (the dev extra); the
browser tests are skipped, with the reason, when the browser is missing (SPECBENCH_SKIP_BROWSER=1 skips them
anyway), and fail then only under SPECBENCH_REQUIRE_BROWSER=1, which .ci/run sets: CI always opens the page.
"""

from __future__ import annotations

import os
import re
import shutil
import tempfile
from pathlib import Path

import pytest

from helpers import CATS, base_records, cli, record, write_run
from specbench.core.answers import read_meta, write_meta
from specbench.presentation.page import TEMPLATES

pytestmark = pytest.mark.fast  # the everyday tier, `make test-fast`: no zoo, seconds

CHROMIUM, CHROMEDRIVER = Path("/usr/bin/chromium"), Path("/usr/bin/chromedriver")
ODD = 'x<b>&"y'  # a method name that must show as text, not as markup
SCRIPT = "<script>window.__pwned = 1</script>"
SUBTASK_OF = {"writing": "mt_bench", "translation": "translation", "summarization": "summarization", "qa": "qa",
              "math_reasoning": "math_reasoning", "rag": "rag"}
#: seconds per question for 10 tokens (the baseline takes 1 s everywhere), by method and category
SECONDS = {
    0.0: {"fast": {**dict.fromkeys(CATS, 0.25), "qa": 1.25}, "mid": {**dict.fromkeys(CATS, 0.5), "qa": 0.2},
          "slow": dict.fromkeys(CATS, 0.8), ODD: dict.fromkeys(CATS, 0.9)},
    0.7: {"fast": dict.fromkeys(CATS, 0.5), "mid": dict.fromkeys(CATS, 0.4)},
}
MEMORY = {"peak_bytes": 123456789, "device": "cpu"}
CONTENTION = {"cpu_load_before": 1.5, "flagged": True, "note": "<i>busy</i>"}


def speedup(seconds: dict[str, float], subtask: str | None = None) -> float:
    """Upstream's speedup: mean per-question tokens/s over the baseline's (10 tok/s everywhere)."""
    rates = [10 / s for c, s in seconds.items() if subtask is None or SUBTASK_OF[c] == subtask]
    return sum(rates) / len(rates) / 10


def add_meta(folder: Path, **extra) -> None:
    meta = read_meta(folder / "meta.json")
    write_meta(folder / "meta.json", {**meta, **extra})


@pytest.fixture(scope="module")
def page(tmp_path_factory) -> Path:
    """Answers with known numbers at two temperatures, `report` run on them: the page's path."""
    tmp = tmp_path_factory.mktemp("page")
    root = tmp / "answers"
    env = {"device": "cpu", "git_commit": "abc123-test", "torch": "9.9"}
    for temperature, methods in SECONDS.items():
        for run in (1, 2) if temperature == 0 else (1,):
            add_meta(write_run(root, "baseline", base_records(), temperature=temperature, run=run), environment=env)
        for method, seconds in methods.items():
            facts = {"drafting": SCRIPT, "training": False} if method == ODD else {"drafting": "n-gram"}
            for run in (1, 2) if method == "fast" and temperature == 0 else (1,):
                records = [record(i, c, 10, seconds[c], [2] * 4 + [1], depths=[3] * 5) for i, c in enumerate(CATS)]
                folder = write_run(root, method, records, temperature=temperature, run=run, facts=facts)
                add_meta(folder, environment=env, memory={**MEMORY, "run": run}, contention=CONTENTION)
    out = tmp / "leaderboard"
    result = cli("report", str(root), "--out", str(out), cwd=tmp)
    assert result.code == 0, result
    assert (out / "index.html").exists() and "wrote" in result.out
    return out / "index.html"


@pytest.fixture(scope="module")
def driver():
    if os.environ.get("SPECBENCH_SKIP_BROWSER") == "1":
        pytest.skip("SPECBENCH_SKIP_BROWSER=1: the page is not opened in a browser")
    missing = [str(p) for p in (CHROMIUM, CHROMEDRIVER) if not p.exists()]
    if missing:
        why = (f"{' and '.join(missing)} not found, so the page is not opened in a browser here; `make browser` "
               "installs Debian's Chromium (sudo apt-get install -y chromium chromium-driver)")
        if os.environ.get("SPECBENCH_REQUIRE_BROWSER") == "1":  # .ci/run: CI always opens the page
            pytest.fail(f"SPECBENCH_REQUIRE_BROWSER=1 and {why}", pytrace=False)
        pytest.skip(why)
    try:
        from selenium import webdriver
        from selenium.webdriver.chrome.service import Service
    except ImportError:
        pytest.fail("selenium is not installed: .venv/bin/pip install -e '.[dev]'", pytrace=False)
    profile = tempfile.mkdtemp(prefix="specbench-chromium-")
    options = webdriver.ChromeOptions()
    options.binary_location = str(CHROMIUM)  # with the driver's path given, Selenium Manager never runs
    for arg in ("--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
                "--disable-background-networking", "--disable-component-update", "--disable-sync",
                f"--user-data-dir={profile}", "--window-size=1300,900"):
        options.add_argument(arg)
    options.set_capability("goog:loggingPrefs", {"browser": "ALL"})
    browser = webdriver.Chrome(service=Service(str(CHROMEDRIVER)), options=options)
    try:
        yield browser
    finally:
        browser.quit()
        shutil.rmtree(profile, ignore_errors=True)


def open_page(driver, path: Path):
    driver.get(path.as_uri())
    assert driver.execute_script("return document.readyState") == "complete"
    return driver


def console_errors(driver) -> list[dict]:
    return [e for e in driver.get_log("browser") if e["level"] in ("SEVERE", "ERROR")]


def header(section, title: str):
    """The main table's column header called `title`."""
    headers = section.find_elements("css selector", "table.main th[scope=col]")
    return next(th for th in headers if th.get_attribute("textContent") == title)


def methods_shown(section) -> list[str]:
    return [th.get_attribute("textContent") for th in section.find_elements("css selector", "table.main tbody th")]


def test_page_is_self_contained_and_escaped(page):
    text = page.read_text(encoding="utf-8")
    # nothing to fetch: no external src/href/url(), one inline script, no stylesheet links
    assert not re.search(r"""(?:src|href|action|poster|data)\s*=\s*["']?\s*(?:https?:)?//""", text, re.I)
    assert not re.search(r"""url\(\s*["']?\s*(?:https?:)?//|@import""", text, re.I)
    assert text.count("<script") == 1 and "<script>" in text and 'rel="stylesheet"' not in text
    # the template's CSS and JS come in verbatim (Jinja2 changes nothing in them)
    for name in ("page.css", "page.js"):
        assert (TEMPLATES / name).read_text(encoding="utf-8").strip() in text
    # user text is escaped: the odd method name and the script in its facts are shown, not run
    assert re.search(r"<summary>x&lt;b&gt;&amp;(?:&quot;|&#34;)y</summary>", text) and ODD not in text
    assert SCRIPT not in text and "&lt;script&gt;window.__pwned = 1&lt;/script&gt;" in text
    assert "&lt;i&gt;busy&lt;/i&gt;" in text  # the contention record, rendered generically
    assert text.count("<svg") == 5  # Figure 5 and acceptance at each temperature, Figure 6 once
    assert "<?xml" not in text and "<!DOCTYPE svg" not in text


def test_page_in_a_browser(page, driver):
    open_page(driver, page)
    assert console_errors(driver) == []
    assert driver.execute_script("return performance.getEntriesByType('resource').length") == 0
    assert driver.execute_script("return window.__pwned === undefined")
    sections = driver.find_elements("css selector", "section.group")
    assert [s.find_element("css selector", "h3").text for s in sections] == [
        "synthetic / tiny / temperature 0", "synthetic / tiny / temperature 0.7"]
    greedy, sampled = sections
    expected = {m: speedup(s) for m, s in SECONDS[0.0].items()} | {"baseline": 1.0}
    # the page opens in the report's order (best overall speedup first), one row per method
    assert methods_shown(greedy) == sorted(expected, key=lambda m: -expected[m])
    assert sorted(methods_shown(sampled)) == ["baseline", "fast", "mid"]
    row = greedy.find_element("css selector", "table.main tbody tr")
    assert row.find_elements("css selector", "td")[-1].text.startswith(f"{expected['fast']:.2f}x")

    # sorting: the Overall header sorts ascending, then descending; a subtask header by its own numbers
    overall = header(greedy, "Overall")
    overall.click()
    assert methods_shown(greedy) == sorted(expected, key=lambda m: expected[m])
    assert overall.get_attribute("aria-sort") == "ascending"
    overall.click()
    assert methods_shown(greedy) == sorted(expected, key=lambda m: -expected[m])
    qa_speedup = {m: speedup(s, "qa") for m, s in SECONDS[0.0].items()} | {"baseline": 1.0}
    assert len(set(qa_speedup.values())) == len(qa_speedup)  # no ties: one right order
    qa = header(greedy, "Question Answering")
    qa.click()
    assert methods_shown(greedy) == sorted(qa_speedup, key=lambda m: qa_speedup[m])
    assert methods_shown(greedy) != sorted(expected, key=lambda m: expected[m])  # a different order than overall
    name = header(greedy, "Method")
    name.click()
    assert methods_shown(greedy) == sorted(expected)  # text column: alphabetical

    # the subtask filter hides and shows that subtask's column (header and cells) in its table only
    box = greedy.find_element("css selector", 'input.subtask[data-col="qa"]')
    cells = greedy.find_elements("css selector", 'table.main [data-col="qa"]')
    assert len(cells) == 1 + len(expected) and all(c.is_displayed() for c in cells)
    box.click()
    assert not any(c.is_displayed() for c in cells)
    assert all(c.is_displayed() for c in sampled.find_elements("css selector", 'table.main [data-col="qa"]'))
    box.click()
    assert all(c.is_displayed() for c in cells)

    # figures inline as SVG and drawn: Figure 5 and acceptance per section, Figure 6 for the block
    for section in sections:
        svgs = section.find_elements("css selector", "figure svg")
        assert len(svgs) == 2 and all(s.size["width"] > 200 and s.size["height"] > 100 for s in svgs)
    block = driver.find_element("css selector", "section.block")
    assert len(block.find_elements("css selector", ":scope > figure svg")) == 1

    # details and provenance of every number: environment, answer folders, run counts, memory, contention
    text = greedy.get_attribute("textContent")
    assert "git_commit=abc123-test" in text and "device=cpu" in text
    for run in (1, 2):
        assert f"{Path('synthetic', 'tiny', 'fast', 'temp-0', f'run-{run}')}" in text
    assert "117.7 MiB" in text and "<i>busy</i>" in text and "cpu_load_before" in text
    assert greedy.find_elements("css selector", "details.method i") == []
    odd = [d for d in greedy.find_elements("css selector", "details.method")
           if d.find_element("css selector", "summary").get_attribute("textContent") == ODD]
    assert len(odd) == 1 and SCRIPT in odd[0].get_attribute("textContent")
    detail_rows = greedy.find_elements("css selector", "table.detail tbody tr")
    assert len(detail_rows) == len(expected)

    # definitions and footnotes are Markdown: `code` becomes <code>; a method name in a footnote stays text
    assert driver.find_element("css selector", "div.defs code").text == "report --recheck"
    note = greedy.find_element("css selector", "div.note")
    assert note.text.startswith("† Measured under contention") and ODD in note.text
    assert note.find_elements("css selector", "b") == []

    # the temperature selector shows one section
    driver.execute_script("var s = document.querySelector('select.pick-section');"
                          "s.value = arguments[0]; s.dispatchEvent(new Event('change'));", sampled.get_attribute("id"))
    assert sampled.is_displayed() and not greedy.is_displayed()
    assert console_errors(driver) == []


def test_page_without_figures(page, driver, tmp_path):
    """--no-figures: the page has no figures, even where an earlier report left SVG files."""
    out = tmp_path / "leaderboard"
    out.mkdir()
    for svg in page.parent.glob("*.svg"):
        shutil.copy(svg, out)
    result = cli("report", str(page.parent.parent / "answers"), "--out", str(out), "--no-figures", cwd=tmp_path)
    assert result.code == 0, result
    text = (out / "index.html").read_text(encoding="utf-8")
    assert "<svg" not in text and "<figure" not in text
    open_page(driver, out / "index.html")
    assert console_errors(driver) == []
    assert len(driver.find_elements("css selector", "section.group")) == 2
    assert len(driver.find_elements("css selector", "table.main tbody tr")) == 5 + 3


def test_definitions_and_footnotes_are_markdown_with_raw_html_escaped(page):
    """page.render on the fixture's groups, with Markdown and hostile HTML in the definitions and notes."""
    from specbench.analysis import report
    from specbench.presentation import leaderboard
    from specbench.presentation.page import Tables, render

    runs = report.load_runs(page.parent.parent / "answers", "upstream")
    groups = [report.analyse(g) for g in report.group_runs(runs)]
    tables = Tables(leaderboard.main_table, leaderboard.detail_table, leaderboard.environment_line, leaderboard.stem,
                    f"Speedup: see `report --recheck`, **bold** and [a link](javascript:alert(1)). {SCRIPT}",
                    main_notes=lambda group: ["† *contended* <img src=x onerror=alert(1)>"],
                    detail_notes=lambda group: [f"- a {ODD} item"])
    text = render(groups, tables)
    assert ('<div class="defs"><p>Speedup: see <code>report --recheck</code>, <strong>bold</strong> and '
            "[a link](javascript:alert(1)). &lt;script&gt;window.__pwned = 1&lt;/script&gt;</p>") in text
    assert text.count("<script") == 1 and SCRIPT not in text and 'href="javascript' not in text
    assert text.count('<div class="note"><p>† <em>contended</em> &lt;img src=x onerror=alert(1)&gt;</p>') == 2
    assert "<img" not in text
    assert text.count('<div class="note"><ul>\n<li>a x&lt;b&gt;&amp;&quot;y item</li>\n</ul>') == 2  # a Markdown list


def test_the_template_files_ship_as_package_data():
    tomllib = pytest.importorskip("tomllib")  # Python 3.11+
    root = Path(__file__).resolve().parents[1]
    setuptools = tomllib.loads((root / "pyproject.toml").read_text(encoding="utf-8"))["tool"]["setuptools"]
    package = TEMPLATES.parent
    shipped = {p for pattern in setuptools["package-data"]["specbench.presentation"] for p in package.glob(pattern)}
    files = {p for p in TEMPLATES.rglob("*") if p.is_file()}
    assert {"page.html.j2", "page.css", "page.js"} <= {p.name for p in files}
    assert files <= shipped, f"not in the wheel: {sorted(str(p) for p in files - shipped)}"
