"""docs/reference/commands.md and params.md, made from the CLI and the config's own fields;
README.md's command and variant tables, the guide's variant table (training.md) and attention
views (evaluating.md), made from the CLI, the variant registry and each family's VIEWS.

    .venv/bin/python -m rcpipe.docs_reference          writes the pages and the tables
    .venv/bin/python -m rcpipe.docs_reference --check  exit 1 when one is stale

commands.md is the `rcpipe` typer app (rcpipe/cli.py): each command's docstring, arguments
and options with their help; params.md is the params tree (rcpipe/config/): each key's type,
default, bounds and pydantic description, and each variant's paper settings
(rcpipe/variants.py). The pages are checked in for the documentation site (mkdocs.yml);
tests/test_docs_reference.py fails when they differ from what this module makes, so the
reference cannot drift from the code.
"""

from __future__ import annotations

import argparse
import html
import inspect
import sys
import types
from pathlib import Path
from typing import Any, Literal, Union, get_args, get_origin

import annotated_types
from pydantic import BaseModel
from pydantic.fields import FieldInfo
from pydantic_core import PydanticUndefined

ROOT = Path(__file__).resolve().parents[1]
REFERENCE = ROOT / "docs" / "reference"
MADE_BY = ("<!-- made by `python -m rcpipe.docs_reference` from {source}: edit those, not "
           "this page (tests/test_docs_reference.py fails on a stale one) -->\n\n")


def _prose(s: str | None) -> str:
    """A docstring as Markdown: no raw HTML outside code (``<variant>`` is text)."""
    parts = inspect.cleandoc(s or "").split("`")
    return "`".join(html.escape(p, quote=False) if i % 2 == 0 else p
                    for i, p in enumerate(parts))


def _text(s: str | None) -> str:
    """Prose for a table cell: one line, no raw HTML, no bar."""
    return " ".join(_prose(s).split()).replace("|", "\\|")


def _code(value: Any) -> str:
    s = str(value).replace("|", "\\|")
    return f"`{s}`" if s else ""


# ---------------------------------------------------------------------------- commands


def _group() -> Any:
    """The `rcpipe` typer app as its click group."""
    import typer

    from rcpipe.cli import app

    # typer's own click (vendored from typer 0.29): used through the objects it hands back
    return typer.main.get_command(app)


def _commands(group: Any) -> list[tuple[str, Any]]:
    """The group's commands, in its help's order, as (name, click command)."""
    ctx = group.context_class(group, info_name="rcpipe")
    return [(name, group.get_command(ctx, name)) for name in group.list_commands(ctx)]


def _arguments(cmd: Any) -> list[str]:
    return [p.name.upper() if p.required else f"[{p.name.upper()}]"
            for p in cmd.params if p.param_type_name == "argument"]


def _command_rows(commands: list[tuple[str, Any]], link: str) -> list[str]:
    """One table row a command: its name and arguments, linked to its section; its help's
    first sentence."""
    return [f"| [`{' '.join(['rcpipe', name, *_arguments(cmd)])}`]({link}{name}) | "
            f"{_text(cmd.get_short_help_str(200))} |\n" for name, cmd in commands]


def render_commands() -> str:
    group = _group()
    out = [MADE_BY.format(source="rcpipe/cli.py"), "# Commands\n\n",
           f"{_text(group.help)} `rcpipe --help` lists them; `python -m rcpipe` is the same "
           "program. Every command that reads params takes `--params FILE` (repeatable: "
           "each later file laid over the earlier ones, key by key) and `--set "
           "dotted.key=value` ([params](params.md)).\n\n",
           "| command | what it does |\n|---|---|\n"]
    commands = _commands(group)
    out.extend(_command_rows(commands, "#rcpipe-"))
    for name, cmd in commands:
        out.extend(_command_section("##", f"rcpipe {name}", cmd))
        if hasattr(cmd, "list_commands"):  # a group (`rcpipe champion`): its subcommands
            ctx = cmd.context_class(cmd, info_name=name)
            for sub in cmd.list_commands(ctx):
                out.extend(_command_section("###", f"rcpipe {name} {sub}",
                                               cmd.get_command(ctx, sub)))
    return "".join(out)


def _command_section(level: str, title: str, cmd: Any) -> list[str]:
    """A command's section: its usage, help and a row an argument or option."""
    usage = " ".join(["[OPTIONS]"] + _arguments(cmd)
                     + (["[COMMAND]"] if hasattr(cmd, "list_commands") else []))
    out = [f"\n{level} {title}\n\n```\n{title} {usage}\n```\n\n", _prose(cmd.help) + "\n\n"]
    rows = [_param_row(p) for p in cmd.params if p.name != "help"]
    if rows:
        out.append("| argument or option | type | default | what |\n|---|---|---|---|\n")
        out.extend(rows)
    return out


def _param_row(p: Any) -> str:
    if p.param_type_name == "argument":
        names = f"`{p.name.upper()}`" + ("" if p.required else " (optional)")
    else:
        names = ", ".join(f"`{o}`" for o in [*p.opts, *p.secondary_opts])
        if getattr(p, "multiple", False):
            names += " (repeatable)"
        if p.required:
            names += " (required)"
    kind = "flag" if getattr(p, "is_flag", False) else _type(p.type_descriptor.annotation)
    default = p.default
    shown = "" if default is None or default == () or getattr(p, "is_flag", False) and \
        default is False else _code(str(default) if isinstance(default, Path) else default)
    return f"| {names} | {kind} | {shown} | {_text(getattr(p, 'help', None))} |\n"


# ------------------------------------------------------------------------------ params


def _type(annotation: Any) -> str:
    origin, args = get_origin(annotation), get_args(annotation)
    if origin is Literal:
        return " \\| ".join(f"`{a}`" for a in args)
    if origin in (Union, types.UnionType):
        named = [_type(a) for a in args if a is not type(None)]
        return " or ".join(named) + (" or null" if type(None) in args else "")
    if origin in (tuple, list):
        return f"list of {_type(args[0])}"
    if origin is dict:
        return "mapping"
    if annotation is Path:
        return "path"
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return "section"
    return getattr(annotation, "__name__", str(annotation))


BOUNDS = ((annotated_types.Ge, ">=", "ge"), (annotated_types.Gt, ">", "gt"),
          (annotated_types.Le, "<=", "le"), (annotated_types.Lt, "<", "lt"))


def _bounds(field: FieldInfo) -> str:
    said = []
    for m in field.metadata:
        for kind, sign, attr in BOUNDS:
            if isinstance(m, kind):
                said.append(f"{sign} {getattr(m, attr)}")
    return ", ".join(said)


def _default(field: FieldInfo) -> str:
    if field.default_factory is not None:
        return _code(field.default_factory())
    if field.default is PydanticUndefined:
        return "required"
    if isinstance(field.default, BaseModel):
        return ""
    value = field.default
    if isinstance(value, Path):
        value = str(value)
    return _code("null" if value is None else value)


def _section(model: type[BaseModel]) -> type[BaseModel] | None:
    for a in (model, *get_args(model)):
        if isinstance(a, type) and issubclass(a, BaseModel):
            return a
    return None


def _rows(model: type[BaseModel], prefix: str, skip: set[str]) -> tuple[list[str],
                                                                         list[tuple]]:
    """A row per key of ``model`` under ``prefix``; the sections inside it, to list after."""
    rows, sections = [], []
    for name, field in model.model_fields.items():
        if name in skip:
            continue
        key = f"{prefix}.{name}"
        inner = _section(field.annotation)
        if inner is not None and get_origin(field.annotation) is None:
            sections.append((key, inner))
            continue
        arch = isinstance(field.json_schema_extra, dict) and \
            field.json_schema_extra.get("architecture")
        what = _text(field.description) + (" (shapes the weights)" if arch else "")
        if inner is not None:  # an optional section: its keys below
            sections.append((key, inner))
            what = (what + " " if what else "") + "(a section: its keys below; null: none)"
        rows.append(f"| `{key}` | {_type(field.annotation)} | {_default(field)} | "
                    f"{_bounds(field)} | {what} |\n")
    return rows, sections


def _doc(model: type[BaseModel]) -> str:
    own = model.__dict__.get("__doc__")
    return _prose(own) + "\n\n" if own else ""


def render_params() -> str:
    from rcpipe.config import Config, ModelsConfig, SearchConfig, VariantSearch
    from rcpipe.config.models import ModelConfig
    from rcpipe.variants import REGISTRY

    variants = list(REGISTRY)
    out = [MADE_BY.format(source="rcpipe/config/ and rcpipe/variants.py"), "# Params\n\n",
           "Every key of the params, section by section. A params file names only what it "
           "changes; an unknown key is an error; `rcpipe config [KEY]` prints the effective "
           "values (every default filled in, each variant's paper included). Bounds are "
           "checked on load (a number is also at most 2,147,483,647 in size).\n\n"]
    todo: list[tuple[str, type[BaseModel]]] = [
        (name, _section(f.annotation)) for name, f in Config.model_fields.items()]
    while todo:
        key, model = todo.pop(0)
        skip = set(variants) if model in (ModelsConfig, SearchConfig) else set()
        out.append(f"\n## {key}\n\n{_doc(model)}")
        if model is ModelsConfig:
            out.append("A section per variant, `models.<variant>`, with the keys of "
                       "`models.<variant>` below; each starts from its paper's settings "
                       "(`rcpipe/variants.py`, listed at the end of this page) and the params "
                       "file's keys are laid over them key by key.\n\n")
            todo[0:0] = [("models.<variant>", ModelConfig)]
            continue
        if model is SearchConfig:
            todo[0:0] = [("tune.<variant>", VariantSearch)]
        rows, sections = _rows(model, key, skip)
        if rows:
            out.append("| key | type | default | bounds | what |\n|---|---|---|---|---|\n")
            out.extend(rows)
        todo[0:0] = sections
    out.append(_papers(variants))
    return "".join(out)


def _papers(variants: list[str]) -> str:
    from rcpipe.config import ModelsConfig
    from rcpipe.config.section import flatten

    models = ModelsConfig.model_validate({})
    values = {v: flatten(models.of(v).model_dump()) for v in variants}
    out = ["\n## Each variant's paper settings\n\n",
           "`models.<variant>` with nothing set in the params: the paper's settings "
           "(`rcpipe/variants.py`, each entry's `paper` names its sources) over the defaults "
           "above.\n\n",
           "| key | " + " | ".join(f"`{v}`" for v in variants) + " |\n",
           "|---" * (len(variants) + 1) + "|\n"]
    for key in values[variants[0]]:
        row = [_code("null" if values[v][key] is None else values[v][key]) for v in variants]
        out.append(f"| `{key}` | " + " | ".join(row) + " |\n")
    return "".join(out)


# ------------------------------------------- the tables kept in hand-written pages

README = ROOT / "README.md"
GUIDE = ROOT / "docs" / "guide"
# README's command table lies between these two lines; the rest of README is by hand
BEGIN = ("<!-- the command table: made by `python -m rcpipe.docs_reference` from "
         "rcpipe/cli.py -->\n")
END = "<!-- end of the command table -->\n"
VARIANTS_BEGIN = ("<!-- the variant table: made by `python -m rcpipe.docs_reference` from "
                  "rcpipe/variants.py -->\n")
VARIANTS_END = "<!-- end of the variant table -->\n"
VIEWS_BEGIN = ("<!-- the attention views: made by `python -m rcpipe.docs_reference` from "
               "each family's VIEWS -->\n")
VIEWS_END = "<!-- end of the attention views -->\n"


class NoTable(ValueError):
    """A page without one of its tables' two marker lines."""


def command_table() -> str:
    rows = _command_rows(_commands(_group()), "docs/reference/commands.md#rcpipe-")
    return "".join(["| command | what it does |\n|---|---|\n", *rows])


def variant_table() -> str:
    """Every registered variant: its paper and what it is (rcpipe.variants.REGISTRY)."""
    from rcpipe.variants import REGISTRY

    rows = [f"| `{v.name}` | {v.cite} | {v.summary} |\n" for v in REGISTRY.values()]
    return "".join(["| variant | paper | what it is |\n|---|---|---|\n", *rows])


def views_table() -> str:
    """What `rcpipe explain` shows of each variant (each family module's VIEWS)."""
    from rcpipe.models import views_of  # the family modules: torch, for this page alone
    from rcpipe.variants import REGISTRY

    rows = [f"| `{name}` | {view.title} | {view.note} |\n"
            for name in REGISTRY for view in views_of(name)]
    return "".join(["| variant | view | what it shows |\n|---|---|---|\n", *rows])


def render_tables(text: str, path: Path, tables: list[tuple[str, str, Any]]) -> str:
    """``text`` (read from ``path``) with each (begin, end, render) table made again."""
    for begin, end, render in tables:
        head, sep, rest = text.partition(begin)
        _, sep2, tail = rest.partition(end)
        if not (sep and sep2):
            name = begin.split(":", 1)[0].removeprefix("<!-- the ")
            raise NoTable(f"{path}: no {name} between {begin.strip()} and "
                                 f"{end.strip()}")
        text = "".join([head, begin, render(), end, tail])
    return text


def render_readme(text: str, path: Path = README) -> str:
    """README.md's text (read from ``path``) with its command and variant tables made again."""
    return render_tables(text, path, [(BEGIN, END, command_table),
                                      (VARIANTS_BEGIN, VARIANTS_END, variant_table)])


# the guide's pages that keep a made table: page -> its tables
GUIDE_TABLES: dict[str, list[tuple[str, str, Any]]] = {
    "training.md": [(VARIANTS_BEGIN, VARIANTS_END, variant_table)],
    "evaluating.md": [(VIEWS_BEGIN, VIEWS_END, views_table)],
}


# -------------------------------------------------------------------------------- main

PAGES = {"commands.md": render_commands, "params.md": render_params}


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--check", action="store_true", help="exit 1 when a page is stale")
    ap.add_argument("--out", type=Path, default=REFERENCE, help="the pages' folder")
    ap.add_argument("--readme", type=Path, default=README, help="the README to keep")
    args = ap.parse_args(argv)
    stale = []
    made = {args.out / name: render for name, render in PAGES.items()}
    made[args.readme] = lambda: render_readme(args.readme.read_text(), args.readme)
    for name, tables in GUIDE_TABLES.items():
        page = GUIDE / name
        made[page] = lambda page=page, tables=tables: render_tables(page.read_text(), page,
                                                                    tables)
    for path, render in made.items():
        try:
            text = render()
        except NoTable as e:
            sys.exit(f"error: {e}")
        if args.check:
            if not path.is_file() or path.read_text() != text:
                stale.append(path)
            continue
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
        print(f"-> {path}")
    if args.check:
        for path in stale:
            print(f"{path}: stale: run python -m rcpipe.docs_reference")
        if not stale:
            print("current")
        sys.exit(1 if stale else 0)


if __name__ == "__main__":
    main()
