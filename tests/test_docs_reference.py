"""docs/reference/commands.md and params.md are what rcpipe/docs_reference.py makes from the
CLI and the config (as tests/test_dvc_pipeline.py holds dvc.yaml to its stage table): a
command, option, params key or description changed without regenerating fails here."""

from __future__ import annotations

from pathlib import Path

import pytest

from rcpipe import docs_reference
from rcpipe.config import Config

STALE = "stale: .venv/bin/python -m rcpipe.docs_reference"


@pytest.mark.parametrize("name", sorted(docs_reference.PAGES))
def test_the_reference_is_the_one_the_code_makes(name: str) -> None:
    page = docs_reference.REFERENCE / name
    assert page.read_text() == docs_reference.PAGES[name](), f"docs/reference/{name} {STALE}"


def test_the_stale_check_can_fail(tmp_path: Path) -> None:
    for name, render in docs_reference.PAGES.items():
        (tmp_path / name).write_text(render())
    with pytest.raises(SystemExit) as ended:
        docs_reference.main(["--check", "--out", str(tmp_path)])
    assert ended.value.code == 0
    params = tmp_path / "params.md"
    params.write_text(params.read_text().replace("| `train.seed` | int | `42`",
                                                 "| `train.seed` | int | `43`"))
    with pytest.raises(SystemExit) as ended:
        docs_reference.main(["--check", "--out", str(tmp_path)])
    assert ended.value.code == 1


def test_the_readmes_command_table_is_the_one_the_cli_makes(tmp_path: Path) -> None:
    readme = docs_reference.README.read_text()
    assert docs_reference.render_readme(readme) == readme, f"README.md's command table {STALE}"
    # a row edited by hand is stale; a README without the table's marker lines is one line
    for name, render in docs_reference.PAGES.items():
        (tmp_path / name).write_text(render())
    edited = tmp_path / "README.md"
    edited.write_text(readme.replace("| [`rcpipe train VARIANT`]", "| [`rcpipe train V`]"))
    with pytest.raises(SystemExit) as ended:
        docs_reference.main(["--check", "--out", str(tmp_path), "--readme", str(edited)])
    assert ended.value.code == 1
    edited.write_text(readme.replace(docs_reference.END, ""))
    with pytest.raises(SystemExit) as ended:
        docs_reference.main(["--check", "--out", str(tmp_path), "--readme", str(edited)])
    assert str(ended.value.code).startswith(f"error: {edited}: no command table")


@pytest.mark.parametrize("name", sorted(docs_reference.GUIDE_TABLES))
def test_the_guides_tables_are_the_ones_the_registry_makes(name: str) -> None:
    page = docs_reference.GUIDE / name
    text = page.read_text()
    assert docs_reference.render_tables(text, page, docs_reference.GUIDE_TABLES[name]) == \
        text, f"docs/guide/{name}'s table {STALE}"


def test_every_variant_is_a_row_of_the_variant_tables() -> None:
    from rcpipe.config import VARIANTS

    for page in (docs_reference.README, docs_reference.GUIDE / "training.md"):
        table = page.read_text().split(docs_reference.VARIANTS_BEGIN)[1]
        table = table.split(docs_reference.VARIANTS_END)[0]
        assert [row.split("`")[1] for row in table.splitlines()[2:]] == list(VARIANTS), page


def test_every_command_and_key_is_in_the_reference() -> None:
    import typer

    from rcpipe.cli import app

    group = typer.main.get_command(app)
    commands = docs_reference.render_commands()
    for name in group.list_commands(group.context_class(group, info_name="rcpipe")):
        assert f"\n## rcpipe {name}\n" in commands, name
    params = docs_reference.render_params()
    for key in ("data.train_file", "data.window.stride", "train.buckets.context",
                "models.<variant>.optim.lr", "tune.<variant>.space", "serve.autoscaling",
                "limits.json_mb", "version.min_gain"):
        assert f"`{key}`" in params, key
    for section in Config.model_fields:
        assert f"\n## {section}\n" in params, section
