"""docs/measurements.md is the one home of every measured figure, and the README and docs quote it faithfully.

- every section of measurements.md names the command that regenerates its figures (a line
  ``Regenerate: `...` ``);
- every link to measurements.md (from README.md and docs/*.md) lands on one of its sections, and
  every figure in the sentence holding the link (a number with a decimal point, a sign or a unit:
  ``-0.29``, ``2866x``, ``9.7%``, ``10 min``) appears among that section's figures, so a figure
  copied into the README that the section no longer states (``-0.37`` where it says ``-0.29``)
  fails here;
- every relative link in README.md and docs/*.md resolves to a file, and a ``#anchor`` into a
  Markdown page to one of its headings;
- the README keeps no timing diary: no dates, no CPU models, no run time outside a sentence that
  links to measurements.md; the README stays a user's path of at most 300 lines.

The checks are functions of a folder, so the last test runs them on a copy with one figure changed.
"""

from __future__ import annotations

import re
import shutil
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
MEASUREMENTS = "docs/measurements.md"

# a figure: a number with a decimal point, a sign or a unit; not part of a word, a version or a range's left end
FIGURE = re.compile(
    r"(?<![\w.])[-+]?\d+(?:\.\d+)?(?:\s?(?:x|%|min|h|s|dex|GB|MB|kB))?(?![\w.])",
)
TIME = re.compile(r"(?<![\w.])\d+(?:\.\d+)?\s(?:min|h|s)\b")
LINK = re.compile(r"\[([^\]]*)\]\(([^)\s]+)\)")
DATE = re.compile(r"\b20\d\d-\d\d-\d\d\b")
CPU_MODELS = re.compile(r"\b(EPYC|Xeon|Ryzen|AVX2|AVX-512|AVX512)\b")


def figures(text: str) -> set[str]:
    """The figure-like tokens of ``text``: signed, decimal or with a unit (a bare integer is not one)."""
    found = set()
    for match in FIGURE.finditer(text):
        token = re.sub(r"\s+", " ", match.group(0))
        if token[0] in "+-" or "." in token or not token.replace(" ", "").isdigit():
            found.add(token)
    return found


def slug(heading: str) -> str:
    """GitHub's anchor of a Markdown heading."""
    text = re.sub(r"[^\w\- ]", "", heading.strip().lower().replace("`", ""))
    return text.replace(" ", "-")


def prose(text: str) -> str:
    """``text`` without its fenced code blocks (their numbers are code, not quoted figures)."""
    return re.sub(r"^```.*?^```", "", text, flags=re.S | re.M)


def sections(page: str) -> dict[str, str]:
    """The ``## `` sections of a page by anchor, each with its text up to the next ``## ``."""
    parts = re.split(r"^## (.+)$", page, flags=re.M)
    return {slug(parts[i]): parts[i + 1] for i in range(1, len(parts), 2)}


def sentences(paragraph: str) -> list[str]:
    return re.split(r"(?<=[.!?])\s+(?=[A-Z`*(>])", " ".join(paragraph.split()))  # "X: [link]" stays one


def pages(root: Path) -> list[Path]:
    return [root / "README.md", *sorted((root / "docs").glob("*.md"))]


def unregenerable_sections(root: Path) -> list[str]:
    found = sections((root / MEASUREMENTS).read_text())
    return [name for name, body in found.items() if not re.search(r"^Regenerate: `[^`]+`", body, flags=re.M)]


def mismatched_figures(root: Path) -> list[str]:
    """Each figure quoted beside a link to measurements.md that its section does not state."""
    home = {name: figures(body) for name, body in sections((root / MEASUREMENTS).read_text()).items()}
    wrong = []
    for page in pages(root):
        if page == root / MEASUREMENTS:
            continue
        for paragraph in re.split(r"\n\s*\n", prose(page.read_text())):
            for sentence in sentences(paragraph):
                for _, target in LINK.findall(sentence):
                    path, _, anchor = target.partition("#")
                    if (page.parent / path).resolve() != (root / MEASUREMENTS).resolve():
                        continue
                    if anchor and anchor not in home:
                        wrong.append(f"{page.name}: no section #{anchor} in measurements.md")
                        continue
                    stated = home[anchor] if anchor else set().union(*home.values())
                    quoted = figures(LINK.sub(lambda m: m.group(1), sentence))
                    wrong += [f"{page.name}: {figure} is not in #{anchor or '(any)'}" for figure in quoted - stated]
    return wrong


def broken_links(root: Path) -> list[str]:
    broken = []
    for page in pages(root):
        for _, target in LINK.findall(prose(page.read_text())):
            if re.match(r"[a-z]+:", target) or target.startswith("mailto"):
                continue
            path, _, anchor = target.partition("#")
            file = (page.parent / path).resolve() if path else page
            if not file.exists():
                broken.append(f"{page.name}: {target} (no such file)")
            elif anchor and file.suffix == ".md":
                anchors = {slug(h) for h in re.findall(r"^#+ (.+)$", prose(file.read_text()), flags=re.M)}
                if anchor not in anchors:
                    broken.append(f"{page.name}: {target} (no such heading)")
    return broken


def diary(root: Path) -> list[str]:
    """Dates, CPU models and run times in the README outside a sentence that links to measurements.md."""
    text = prose((root / "README.md").read_text())
    found = [f"README.md: date {d}" for d in DATE.findall(text)]
    found += [f"README.md: CPU model {m}" for m in CPU_MODELS.findall(text)]
    for paragraph in re.split(r"\n\s*\n", text):
        for sentence in sentences(paragraph):
            if "measurements.md" not in sentence:
                found += [
                    f"README.md: run time {t!r} without a link to measurements.md" for t in TIME.findall(sentence)
                ]
    found += [f"{page.name}: date {d}" for page in pages(root) for d in DATE.findall(page.read_text())
              if page.name in ("README.md", "measurements.md")]  # fmt: skip
    return found


def test_every_measured_section_names_its_command():
    assert sections((ROOT / MEASUREMENTS).read_text()), "measurements.md has no sections"
    assert unregenerable_sections(ROOT) == []


def test_figures_beside_a_link_are_the_measured_ones():
    assert mismatched_figures(ROOT) == []


def test_links_resolve():
    assert broken_links(ROOT) == []


def test_the_readme_is_a_short_path_with_no_diary():
    assert diary(ROOT) == []
    assert len((ROOT / "README.md").read_text().splitlines()) <= 300
    assert "](docs/measurements.md" in (ROOT / "README.md").read_text()


def test_a_copy_with_one_figure_changed_fails(tmp_path):
    """The check can fail: a README sentence quoting the demo's dose ratio, in a copy, then the
    measured figure changed under it; and a section that loses its command."""
    copy = tmp_path / "repo"
    (copy / "docs").mkdir(parents=True)
    for page in pages(ROOT):
        shutil.copy(page, copy / page.relative_to(ROOT))
    readme = copy / "README.md"
    readme.write_text(
        readme.read_text()
        + "\nThe demo reads a log10 dose ratio of -0.29, measured:\n[docs/measurements.md](docs/measurements.md#the-demo).\n"
    )
    assert mismatched_figures(copy) == []
    home = copy / MEASUREMENTS
    home.write_text(home.read_text().replace("-0.29", "-0.37"))
    assert mismatched_figures(copy) == ["README.md: -0.29 is not in #the-demo"]
    home.write_text(home.read_text().replace("Regenerate: `make demo`", "Run the demo"))
    assert unregenerable_sections(copy) == ["the-demo"]
    readme.write_text(readme.read_text() + "\nIt took 10 min on 2026-11-26.\n")
    assert diary(copy)[:2] == [
        "README.md: date 2026-11-26",
        "README.md: run time '10 min' without a link to measurements.md",
    ]
