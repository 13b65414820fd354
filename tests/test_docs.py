"""The documentation site: it builds strictly and offline, its pages stay short and current, and the
code blocks of Getting started and the how-to guides run as written."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from docs_blocks import RUNNABLE, blocks

ROOT = Path(__file__).resolve().parent.parent
DOCS = ROOT / "docs"
#: pages whose blocks a reader copies: each is run by the tests or says why it cannot be
TUTORIAL_PAGES = [DOCS / "getting-started.md", *sorted((DOCS / "how-to").glob("*.md"))]
MAX_PAGE_LINES = 400
HISTORY_HEADING = re.compile(r"^#+ .*\b(pass|round|issues?)\b", re.IGNORECASE)
#: an asset a browser would fetch from another host: a script, a stylesheet, a font, an image
EXTERNAL_ASSET = re.compile(r"<(script|link|img|iframe)\b[^>]*\b(src|href)=\"(https?:)?//", re.IGNORECASE)
CSS_IMPORT = re.compile(r"@import\s+url\(\s*['\"]?(https?:)?//|url\(\s*['\"]?https?://", re.IGNORECASE)


def test_block_parser_reads_markers_languages_and_indented_fences(tmp_path: Path) -> None:
    page = tmp_path / "page.md"
    page.write_text(
        "text\n<!-- run -->\n```bash\necho one\n```\n\n<!-- skip: needs a GPU -->\n```python\nprint(2)\n```\n"
        "```text\noutput\n```\n1. a step\n\n    ```bash\n    echo indented\n    ```\n"
    )
    found = blocks(page)
    assert [(block.language, block.code, block.marker, block.reason) for block in found] == [
        ("bash", "echo one", "run", ""),
        ("python", "print(2)", "skip", "needs a GPU"),
        ("text", "output", None, ""),
        ("bash", "echo indented", None, ""),
    ]
    assert found[1].line == 8


@pytest.mark.parametrize("page", TUTORIAL_PAGES, ids=lambda page: page.name)
def test_every_runnable_block_is_run_or_says_why_not(page: Path) -> None:
    unmarked = [block.where for block in blocks(page) if block.language in RUNNABLE and block.marker is None]
    assert not unmarked, f"mark these blocks <!-- run --> or <!-- skip: REASON -->: {unmarked}"
    no_reason = [block.where for block in blocks(page) if block.marker == "skip" and not block.reason]
    assert not no_reason, f"a skipped block must say why: {no_reason}"
    wrong = [block.where for block in blocks(page) if block.marker and block.language not in RUNNABLE]
    assert not wrong, f"only {RUNNABLE} blocks can be marked: {wrong}"


def _run_environment() -> dict[str, str]:
    env = dict(os.environ)
    env["PATH"] = f"{Path(sys.executable).parent}{os.pathsep}{env.get('PATH', '')}"  # this environment's isotrope
    env.update(HF_HUB_OFFLINE="1", TOKENIZERS_PARALLELISM="false", OMP_NUM_THREADS="1", MKL_NUM_THREADS="1")
    return env


@pytest.mark.slow
@pytest.mark.parametrize(
    "page", [page for page in TUTORIAL_PAGES if any(b.marker == "run" for b in blocks(page))], ids=lambda page: page.name
)
def test_marked_blocks_run_in_order_in_an_empty_folder(page: Path, tmp_path: Path) -> None:
    env = _run_environment()
    # a how-to guide starts where Getting started left the reader: with its notes/ folder
    seed = [] if page.name == "getting-started.md" else [b for b in blocks(TUTORIAL_PAGES[0]) if "mkdir -p notes" in b.code]
    for block in [*seed, *blocks(page)]:
        if block.marker != "run":
            continue
        if block.language in ("python", "py"):
            command = [sys.executable, "-c", block.code]
        else:
            command = ["bash", "-euo", "pipefail", "-c", block.code]
        result = subprocess.run(command, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=600)
        assert result.returncode == 0, (
            f"{block.where} failed:\n{block.code}\n--- stdout\n{result.stdout}\n--- stderr\n{result.stderr}"
        )


def test_pages_are_short_and_headings_name_no_history() -> None:
    for page in sorted(DOCS.rglob("*.md")):
        lines = page.read_text().splitlines()
        assert len(lines) <= MAX_PAGE_LINES, f"{page.relative_to(ROOT)} has {len(lines)} lines: split it"
        in_fence = False
        for number, line in enumerate(lines, 1):
            in_fence ^= line.lstrip().startswith(("```", "~~~"))
            if not in_fence and HISTORY_HEADING.match(line):
                raise AssertionError(f"{page.relative_to(ROOT)}:{number}: a heading narrates history: {line!r}")


def test_readme_is_a_front_door() -> None:
    readme = (ROOT / "README.md").read_text().splitlines()
    assert len(readme) <= 150
    assert readme[3].startswith("make demo") and readme[4].startswith("make test")
    for target in re.findall(r"\]\((docs/[^)#]+)", "\n".join(readme)):
        assert (ROOT / target).is_file(), f"README links to {target}, which does not exist"


@pytest.mark.slow
def test_site_builds_strictly_and_fetches_nothing_from_another_host(tmp_path: Path) -> None:
    pytest.importorskip("mkdocs", reason="the docs extra is not installed")
    site = tmp_path / "site"
    result = subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", str(site)],
        cwd=ROOT,
        env={**_run_environment(), "NO_MKDOCS_2_WARNING": "1"},
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert result.returncode == 0, result.stderr[-4000:]
    assert "WARNING" not in result.stderr, result.stderr[-4000:]
    html = sorted(site.rglob("*.html"))
    assert len(html) > 20
    for path in html:
        text = path.read_text()
        assert not EXTERNAL_ASSET.search(text), f"{path.relative_to(site)} loads an asset from another host"
        assert 'class="mermaid"' not in text, "a mermaid diagram makes Material fetch mermaid.js from a CDN"
    for path in site.rglob("*.css"):
        assert not CSS_IMPORT.search(path.read_text()), f"{path.relative_to(site)} imports from another host"
    cli = (site / "reference" / "cli.html").read_text()
    from isotrope.cli import app

    commands = [command.name or command.callback.__name__ for command in app.registered_commands if command.callback]
    assert len(commands) >= 10
    for name in commands:
        assert f"isotrope {name}</code>" in cli, f"the CLI reference lacks isotrope {name}"


def _read(name: str) -> str:
    return " ".join((ROOT / name).read_text(encoding="utf-8").split())  # one line: wrapped text joins up


def test_the_documented_fusion_is_the_shipped_one() -> None:
    """What the pages and docstrings say the hybrid fusion is, read from isotrope.fusion's constants."""
    from isotrope import fusion, search

    alpha, candidates, share = fusion.DEFAULT_ALPHA, fusion.DEFAULT_CANDIDATES, fusion.KEYWORD_SHARE
    keywords = fusion.keyword_depth(candidates, 10)
    results, concepts = _read("docs/results/hybrid.md"), _read("docs/concepts/search-modes.md")
    assert f"`DEFAULT_ALPHA = {alpha}`" in results and f"`DEFAULT_CANDIDATES = {candidates}`" in results
    assert f"`KEYWORD_SHARE = {share}`" in results
    assert f"z-score normalisation, the dense top {candidates} and the keyword top {keywords}, α {alpha}" in results
    assert f"take the dense top {candidates} and the BM25 top {keywords}" in concepts and "z-score-normalise" in concepts
    docstring = " ".join((search.Collection.search.__doc__ or "").split())
    assert "z-score" in docstring and "min-max" not in docstring
    assert "z-score normalised" in " ".join((fusion.__doc__ or "").split())


def test_the_documented_store_defaults_are_the_code_s() -> None:
    """The default metric and the size where ``--index auto`` leaves exact search, as the pages state them."""
    from isotrope.stores import index_plan
    from isotrope.stores.base import DEFAULT_METRIC

    architecture, concepts = _read("docs/ARCHITECTURE.md"), _read("docs/concepts/store.md")
    assert f"a new store's default is `{DEFAULT_METRIC}` in every store" in architecture
    assert f"`auto`: exact below {index_plan.EXACT_BELOW:,} rows" in architecture
    assert f"searches exactly below {index_plan.EXACT_BELOW:,} chunks" in concepts
