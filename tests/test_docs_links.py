"""Every link between the README and docs/ lands: the file is there, and a
`#anchor` is one of its headings as GitHub spells them. The README is the
front page and the reference lives in docs/; a link that no longer lands
is a reader lost."""
from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
LINK = re.compile(r"\[[^\]]*\]\(([^)\s]+)\)")


def slug(heading: str) -> str:
    """GitHub's anchor for a heading: lower case, punctuation but `-` and `_`
    dropped, each space a `-`."""
    return re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")


def anchors(page: Path) -> set[str]:
    text = re.sub(r"```.*?```", "", page.read_text(), flags=re.S)
    return {slug(m.group(1)) for m in re.finditer(r"^#{1,6} (.+)$", text, re.M)}


def test_every_link_between_the_readme_and_docs_lands():
    broken = []
    for page in PAGES:
        text = re.sub(r"```.*?```|<!--.*?-->", "", page.read_text(), flags=re.S)
        for target in LINK.findall(text):
            if re.match(r"[a-z]+:", target):
                continue                       # https:, mailto:
            path, _, anchor = target.partition("#")
            where = (page.parent / path).resolve() if path else page
            if not where.exists():
                broken.append(f"{page.relative_to(ROOT)}: {target}: no such file")
            elif anchor and where.suffix == ".md" and anchor not in anchors(where):
                broken.append(f"{page.relative_to(ROOT)}: {target}: no such heading in "
                              f"{where.relative_to(ROOT)}")
    assert not broken, "\n".join(broken)


def test_the_slug_is_githubs():
    assert slug("Programs that ignore the proxy settings (`--capture`)") == \
        "programs-that-ignore-the-proxy-settings---capture"
    assert slug("Ubuntu 23.10 and later: the AppArmor profile") == "ubuntu-2310-and-later-the-apparmor-profile"
    assert slug("The machine's own services (`localhost:PORT`)") == "the-machines-own-services-localhostport"
