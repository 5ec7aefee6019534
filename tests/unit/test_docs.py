"""The documentation: README.md is a short front page, docs/ a MkDocs site (mkdocs.yml) whose strict
build fails on a broken link or anchor (README's included: it is the site's home page) and on a page
left out of the nav, and whose generated tables equal what the code generates now."""
from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[2]
DOCS = ROOT / "docs"


def test_the_site_builds_strict(tmp_path):
    env = dict(os.environ, NO_MKDOCS_2_WARNING="1")
    res = subprocess.run([sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", str(tmp_path / "site")],
                         cwd=ROOT, capture_output=True, text=True, timeout=120, env=env)
    assert res.returncode == 0, res.stderr[-4000:]
    assert (tmp_path / "site" / "index.html").is_file()


def test_readme_is_a_front_page():
    lines = (ROOT / "README.md").read_text().splitlines()
    assert len(lines) <= 320, f"README.md has {len(lines)} lines; the rest belongs in docs/"
    text = "\n".join(lines)
    assert "make train" in text and "make test" in text  # the two commands that do all set-up


def _nav_pages(nav) -> list[str]:
    out = []
    for item in nav:
        value = next(iter(item.values())) if isinstance(item, dict) else item
        out += _nav_pages(value) if isinstance(value, list) else [value]
    return out


def test_every_docs_page_is_in_the_nav():
    # mkdocs.yml holds no Python tags, so the safe loader reads it
    nav = _nav_pages(yaml.safe_load((ROOT / "mkdocs.yml").read_text())["nav"])
    pages = sorted(p.relative_to(DOCS).as_posix() for p in DOCS.rglob("*.md"))
    assert sorted(nav) == pages, f"in docs/ but not in the nav: {sorted(set(pages) - set(nav))}; " \
                                 f"in the nav but not in docs/: {sorted(set(nav) - set(pages))}"


def _between(page: str, marker: str) -> str:
    text = (DOCS / page).read_text()
    m = re.search(rf"<!-- {marker}: [^\n]*-->\n(.*?)\n<!-- /{marker} -->", text, re.S)
    assert m, f"docs/{page} lacks its generated block '{marker}'"
    return m.group(1)


def test_the_config_table_is_what_the_code_generates():
    from mpippo import config as C
    assert _between("config.md", "config-keys") == C.describe(markdown=True), \
        "docs/config.md's table is stale: replace it with the output of python -m mpippo.config --markdown"


@pytest.mark.parametrize("marker,table", [("metrics-keys", "COMMON"), ("metrics-keys-sync", "SYNC_PPO"),
                                          ("metrics-keys-actor-learner", "ACTOR_LEARNER")])
def test_the_metrics_keys_are_what_the_code_generates(marker, table):
    from mpippo.metrics import keys
    assert _between("outputs.md", marker) == keys.make_doc(getattr(keys, table)), \
        f"docs/outputs.md's {marker} is stale: replace it with mpippo.metrics.keys.make_doc(keys.{table})"


def test_the_tensorboard_tags_are_what_the_code_generates():
    from mpippo.metrics import tags
    assert _between("outputs.md", "tags") == tags.doc().rstrip("\n"), \
        "docs/outputs.md's tag table is stale: replace it with mpippo.metrics.tags.doc()"


def test_every_tools_help_opens_with_whole_sentences():
    """A tool's --help description is its docstring's first paragraph (toolcli.about), or its first line
    where that is a whole sentence: a first line alone stopped mid-sentence ("..., by how much, and")."""
    import ast
    from mpippo.toolcli import about
    tools = sorted([*ROOT.glob("analysis/*.py"), *ROOT.glob("benchmarks/*.py"), *ROOT.glob("mpippo/**/*.py")])
    for path in tools:
        text = path.read_text()
        for form, said in (("description=about(__doc__)", about), ("description=__doc__.splitlines()[0]",
                                                                    lambda doc: doc.splitlines()[0])):
            if form in text:
                words = said(ast.get_docstring(ast.parse(text)))
                assert words.rstrip(")").endswith((".", "?", ":")) and len(words) < 600, (path.name, words[-80:])
