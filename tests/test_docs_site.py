"""The documentation site builds (mkdocs.yml, MkDocs + Material) in strict mode: a broken
link or anchor, a page under docs/ left out of the nav, or a missing snippet is a warning,
and a warning fails the build (`make docs` runs the same build)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[1]
ENV = os.environ | {"NO_MKDOCS_2_WARNING": "1"}


def build(config: Path, site: Path, cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "mkdocs", "build", "--strict", "-f",
                           str(config), "-d", str(site)], cwd=cwd, env=ENV,
                          capture_output=True, text=True, timeout=600)


def test_the_site_builds_strict_without_a_warning(tmp_path: Path) -> None:
    done = build(ROOT / "mkdocs.yml", tmp_path / "site", ROOT)
    said = done.stdout + done.stderr
    assert done.returncode == 0, said
    assert "WARNING" not in said, said
    assert (tmp_path / "site" / "guide" / "running" / "index.html").is_file()
    # the GPU kit's page shows bench/gpu/README.md itself (a snippet), not a link out
    kit = (tmp_path / "site" / "dev" / "gpu-kit" / "index.html").read_text()
    assert "The plan: one draw, two calls" in kit


def test_every_page_is_in_the_nav() -> None:
    config = yaml.safe_load((ROOT / "mkdocs.yml").read_text())

    def pages(nav: list) -> set[str]:
        found = set()
        for item in nav:
            for value in item.values():
                found |= pages(value) if isinstance(value, list) else {value}
        return found

    on_disk = {str(p.relative_to(ROOT / "docs")) for p in (ROOT / "docs").rglob("*.md")}
    assert pages(config["nav"]) == on_disk


def test_a_broken_link_or_a_page_left_out_fails_the_build(tmp_path: Path) -> None:
    """The site's own validation settings, on a two-page site with both faults."""
    ours = yaml.safe_load((ROOT / "mkdocs.yml").read_text())
    docs = tmp_path / "docs"
    docs.mkdir()
    (docs / "index.md").write_text("# Home\n\n[gone](missing.md)\n")
    (docs / "orphan.md").write_text("# Orphan\n")
    config = tmp_path / "mkdocs.yml"
    config.write_text(yaml.safe_dump({
        "site_name": "t", "strict": ours["strict"], "validation": ours["validation"],
        "nav": [{"Home": "index.md"}]}))
    done = build(config, tmp_path / "site", tmp_path)
    said = done.stdout + done.stderr
    assert done.returncode != 0, said
    assert "missing.md" in said and "orphan.md" in said, said
