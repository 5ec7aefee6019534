"""MkDocs hook (mkdocs.yml: hooks).

1. The site's home page is the repository's README.md: docs/index.md is a stub that this hook
   replaces with README's text, its links made relative to docs/ (`docs/running.md` -> `running.md`,
   any other file `x` -> `../x`), so the strict build checks README's links too.
2. The pages link files outside docs/ (figures, result files, their history) with relative links
   such as `../analysis/figures/comparison.png`, which GitHub renders as they are. Each such link that
   names an existing file of the repository is added to the site as a plain copy (under `repo/`), so
   `mkdocs build --strict` accepts it; a link to a file that does not exist stays unresolved and fails
   the strict build like any broken link."""
from __future__ import annotations

import re
from pathlib import Path

from mkdocs.structure.files import File, InclusionLevel

# the target of a Markdown link or image: ](target) or ](target "title")
TARGET = re.compile(r"\]\(([^)\s]+)")
HOME = "index.md"


class RepoFile(File):
    """A repository file copied as it is, whatever its extension (a .md file is not rendered)."""

    def is_documentation_page(self) -> bool:
        return False

    def is_static_page(self) -> bool:
        return False


def readme_as_home(config) -> str:
    """README.md with its links relative to docs/."""
    def relink(m: re.Match) -> str:
        target = m.group(1)
        if re.match(r"[a-z]+:|#|/", target):
            return m.group(0)
        return "](" + (target[len("docs/"):] if target.startswith("docs/") else "../" + target)
    readme = Path(config.docs_dir).resolve().parent / "README.md"
    return TARGET.sub(relink, readme.read_text(encoding="utf-8"))


def on_files(files, config):
    docs = Path(config.docs_dir).resolve()
    root = docs.parent
    texts = [p.read_text(encoding="utf-8") for p in sorted(docs.glob("*.md"))] + [readme_as_home(config)]
    seen = set()
    for text in texts:
        for target in TARGET.findall(text):
            target = target.split("#")[0]
            if not target.startswith("../") or target in seen:
                continue
            path = (docs / target).resolve()
            if not path.is_file() or not path.is_relative_to(root) or path.is_relative_to(docs):
                continue
            seen.add(target)
            files.append(RepoFile(target, str(docs), config.site_dir, config.use_directory_urls,
                                  dest_uri="repo/" + path.relative_to(root).as_posix(),
                                  inclusion=InclusionLevel.NOT_IN_NAV))
    return files


def on_page_markdown(markdown, page, config, files):
    return readme_as_home(config) if page.file.src_uri == HOME else markdown
