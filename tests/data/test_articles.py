"""Reading a SQuAD file an article at a time (rcpipe/data/articles.py): the same articles and
the same located errors as squad.parse_squad of the whole file, JSON or JSON Lines, gzipped
or not, each article within limits.json_mb and limits.depth; heldout.json's writer."""

from __future__ import annotations

import copy
import gzip
import io
import json
import os
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from rcpipe.config import ReadLimits
from rcpipe.data import articles
from rcpipe.data.articles import SquadSource, SquadWriter, survey
from rcpipe.data.squad import joined, parse_squad
from rcpipe.errors import InputError
from tests.data.test_squad import DOC


def write_json(path: Path, doc: Any) -> Path:
    data = json.dumps(doc).encode()
    path.write_bytes(gzip.compress(data) if path.name.endswith(".gz") else data)
    return path


def write_lines(path: Path, doc: dict[str, Any], head: bool = True) -> Path:
    """``doc`` as JSON Lines: its other entries on the first line, then an article a line."""
    first = [json.dumps({k: v for k, v in doc.items() if k != "data"})] if head else []
    data = "\n".join(first + [json.dumps(a) for a in doc["data"]]).encode() + b"\n"
    path.write_bytes(gzip.compress(data) if path.name.endswith(".gz") else data)
    return path


def read_whole(path: Path, name: str, limits: ReadLimits = ReadLimits()) -> Any:
    """The file as prepare sees it: surveyed, then its articles' SquadFiles joined."""
    s = survey(path, name, limits)
    return s, joined([sq for _, sq in s.source.files(s.version)])


@pytest.mark.parametrize("name", ["d.json", "d.json.gz", "d.jsonl", "d.jsonl.gz"])
def test_an_article_at_a_time_is_the_whole_file(tmp_path: Path, name: str) -> None:
    path = (write_lines if ".jsonl" in name else write_json)(tmp_path / name, DOC)
    s, sq = read_whole(path, name)
    whole = parse_squad(DOC, name)
    assert (s.version, s.titles, list(s.sizes)) == ("v2.0", ["First", "Second", ""], [3, 1, 0])
    assert (s.articles, s.questions, s.passages) == (3, 4, 4)
    assert sq.contexts == whole.contexts and sq.titles == whole.titles
    if ".jsonl" in name:  # the same questions, located by line
        assert [q.location for q in sq.questions] == [
            "line 2: paragraphs[0].qas[0]", "line 2: paragraphs[1].qas[0]",
            "line 2: paragraphs[1].qas[1]", "line 3: paragraphs[1].qas[0]"]
        assert sq.questions == [replace(q, location=m.location)
                                for q, m in zip(whole.questions, sq.questions, strict=True)]
    else:
        assert sq.questions == whole.questions
    assert s.source.head == {"version": "v2.0", "data": None}
    assert all(qid in s.ids for qid in "abcd") and "e" not in s.ids


def test_json_lines_without_a_first_line_has_no_version(tmp_path: Path) -> None:
    s, sq = read_whole(write_lines(tmp_path / "d.jsonl", DOC, head=False), "d.jsonl")
    assert s.version == "" and len(sq.questions) == 4 and s.source.head == {"data": None}


def test_a_json_file_keeps_its_entries_in_order(tmp_path: Path) -> None:
    doc = {"data": DOC["data"], "version": "1.1", "extra": {"k": [1, 2.5]}}
    s = survey(write_json(tmp_path / "d.json", doc), "d.json")
    assert list(s.source.head.items()) == [("data", None), ("version", "1.1"),
                                           ("extra", {"k": [1, 2.5]})]
    assert s.source.places["version"] == "version" and s.version == "1.1"


# ------------------------------------------------- the same located errors as parse_squad


def _edit(doc: dict[str, Any], path: str, value: Any) -> dict[str, Any]:
    """``doc`` with the value at ``path`` (JSON-ish: data.1.paragraphs.1.qas.0.id) set, or
    removed when ``value`` is DELETE."""
    doc = copy.deepcopy(doc)
    *parents, last = [int(p) if p.isdigit() else p for p in path.split(".")]
    node = doc
    for p in parents:
        node = node[p]
    if value is DELETE:
        del node[last]
    else:
        node[last] = value
    return doc


DELETE = object()
FAULTS = {
    "duplicate id across articles": ("data.1.paragraphs.1.qas.0.id", "b"),
    "duplicate id in an article": ("data.0.paragraphs.1.qas.1.id", "a"),
    "id not a string": ("data.0.paragraphs.1.qas.0.id", 7),
    "no paragraphs": ("data.1.paragraphs", DELETE),
    "a title not a string": ("data.1.title", ["x"]),
    "an article not an object": ("data.2", "text"),
    "an answer start not an integer": ("data.0.paragraphs.0.qas.0.answers.1.answer_start", True),
    "no answers": ("data.1.paragraphs.1.qas.0.answers", []),
    "a version not a string": ("version", 2.0),
    "data not a list": ("data", {"a": 1}),
    "no data": ("data", DELETE),
}


@pytest.mark.parametrize("fault", list(FAULTS))
def test_each_fault_is_located_as_parse_squad_locates_it(tmp_path: Path, fault: str) -> None:
    doc = _edit(DOC, *FAULTS[fault])
    with pytest.raises(InputError) as whole:
        parse_squad(doc, "f.json")
    with pytest.raises(InputError) as streamed:
        survey(write_json(tmp_path / "f.json", doc), "f.json")
    assert streamed.value.line() == whole.value.line()


def test_json_lines_locates_a_fault_by_its_line(tmp_path: Path) -> None:
    doc = _edit(DOC, "data.1.paragraphs.1.qas.0.id", "b")
    with pytest.raises(InputError) as info:
        survey(write_lines(tmp_path / "f.jsonl", doc), "f.jsonl")
    assert info.value.line() == ("error: f.jsonl: line 3: paragraphs[1].qas[0].id: duplicate "
                                 "question id 'b' (first at line 2: paragraphs[1].qas[0])")
    doc = _edit(DOC, "data.0.title", 5)
    with pytest.raises(InputError) as info:
        survey(write_lines(tmp_path / "g.jsonl", doc), "g.jsonl")
    assert (info.value.location, info.value.what) == ("line 2: title", "expected a string, "
                                                      "got int")


def test_ids_of_one_hash_are_no_duplicate(tmp_path: Path, monkeypatch: pytest.MonkeyPatch
                                          ) -> None:
    """Ids are kept as hashes: an id whose hash was met is looked up in the file again."""
    monkeypatch.setattr(articles, "hash", lambda qid: 0, raising=False)  # every id collides
    s = survey(write_json(tmp_path / "d.json", DOC), "d.json")
    assert s.questions == 4
    with pytest.raises(InputError, match=r"duplicate question id 'b' \(first at "
                       r"data\[0\]\.paragraphs\[1\]\.qas\[0\]\)"):
        survey(write_json(tmp_path / "e.json", _edit(DOC, "data.1.paragraphs.1.qas.0.id", "b")),
               "e.json")


# --------------------------------------------------------------- what parse_squad never met


def test_a_file_cut_mid_article_is_located_at_the_article(tmp_path: Path) -> None:
    text = json.dumps(DOC)
    cut = tmp_path / "cut.json"
    cut.write_text(text[: text.index('"Cy sang.')])  # inside data[1]
    with pytest.raises(InputError) as info:
        survey(cut, "cut.json")
    assert info.value.line() == "error: cut.json: data[1]: not valid JSON (parse error: " \
                                "premature EOF)"
    packed = tmp_path / "cut.json.gz"  # a gzip stream cut short
    packed.write_bytes(gzip.compress(text.encode())[:-30])
    with pytest.raises(InputError) as info:
        survey(packed, "cut.json.gz")
    assert info.value.file == "cut.json.gz" and info.value.what.startswith("cannot read:")


@pytest.mark.parametrize(("text", "where", "what"), [
    ('{"data": [{"paragraphs": []}, {"paragraphs": []},, 3]}', "data[2]", "not valid JSON "
     "(parse error: unallowed token at this point in JSON text)"),
    ('{"data": []} x', "", "not valid JSON (parse error: trailing garbage)"),
    ("[1, 2]", "", "expected a JSON object at the top level, got list"),
    ("", "", "not valid JSON (parse error: premature EOF)"),
    ('{"data": [], "data": []}', "data", "a second 'data' list"),
])
def test_a_json_file_that_is_no_squad_file(tmp_path: Path, text: str, where: str, what: str
                                           ) -> None:
    (tmp_path / "f.json").write_text(text)
    with pytest.raises(InputError) as info:
        survey(tmp_path / "f.json", "f.json")
    assert (info.value.location, info.value.what) == (where, what)


@pytest.mark.parametrize(("line", "where", "what"), [
    (b'{"paragraphs": [}', "line 3 column 17", "Expecting value"),
    (b'{"paragraphs": "\xff"}', "line 3 byte 16", "not UTF-8 text"),
    (b"[1]", "line 3", "expected an object, got list"),
    (b'{"title": "t"}', "line 3", "missing key 'paragraphs'"),
])
def test_a_bad_json_lines_line_is_located_by_its_number(tmp_path: Path, line: bytes,
                                                        where: str, what: str) -> None:
    path = write_lines(tmp_path / "f.jsonl", DOC)
    lines = path.read_bytes().splitlines()
    path.write_bytes(b"\n".join([*lines[:2], line, *lines[2:]]) + b"\n")
    with pytest.raises(InputError) as info:
        survey(path, "f.jsonl")
    assert (info.value.location, info.value.what) == (where, what)


def test_blank_lines_are_no_articles(tmp_path: Path) -> None:
    path = write_lines(tmp_path / "f.jsonl", DOC)
    path.write_bytes(b"\n\n" + path.read_bytes().replace(b"\n", b"\n  \n"))
    s, sq = read_whole(path, "f.jsonl")
    assert s.articles == 3 and s.version == "v2.0" and len(sq.questions) == 4


# ------------------------------------------------------------------------- each article's cap


def _big_doc(n: int) -> dict[str, Any]:
    """n articles of ~2 KB each."""
    return {"version": "1.1", "data": [
        {"title": f"t{i}", "paragraphs": [{"context": "word " * 400, "qas": [
            {"id": f"q{i}", "question": "which?", "answers": [{"text": "word",
                                                               "answer_start": 0}]}]}]}
        for i in range(n)]}


@pytest.mark.parametrize("name", ["big.json", "big.json.gz", "big.jsonl", "big.jsonl.gz"])
def test_the_cap_holds_each_article_not_the_file(tmp_path: Path, name: str) -> None:
    """limits.json_mb: 50 articles of ~2 KB pass a 10 KB cap (the file is ~100 KB); one
    article of 40 KB does not, located at it."""
    write = write_lines if ".jsonl" in name else write_json
    doc = _big_doc(50)
    cap = ReadLimits(json_mb=0.01)  # 10 KB
    assert len(json.dumps(doc)) > 10 * cap.json_bytes()
    assert survey(write(tmp_path / name, doc), name, cap).articles == 50
    doc["data"][7]["paragraphs"][0]["context"] = "word " * 8000
    with pytest.raises(InputError) as info:
        survey(write(tmp_path / name, doc), name, cap)
    where = "line 9" if ".jsonl" in name else "data[7]"
    assert info.value.line() == f"error: {name}: {where}: an article over the cap of " \
                                "10,000 bytes (limits.json_mb, each article)"


def test_a_gzip_bomb_is_stopped_at_the_cap(tmp_path: Path) -> None:
    bomb = tmp_path / "bomb.json.gz"
    bomb.write_bytes(gzip.compress(b'{"data": [{"title": "' + b"x" * 5_000_000 + b'"}]}'))
    with pytest.raises(InputError) as info:
        survey(bomb, "bomb.json.gz", ReadLimits(json_mb=1))
    assert info.value.location == "data[0]" and "over the cap of 1.0 MB" in info.value.what


# -------------------------------------------------------------------------------- the depth


def test_nesting_past_the_bound_is_said_as_deep_as_it_goes(tmp_path: Path) -> None:
    (tmp_path / "deep.json").write_text("[" * 100_000 + "]" * 100_000)  # not built: counted
    with pytest.raises(InputError) as info:
        survey(tmp_path / "deep.json", "deep.json")
    assert info.value.line() == "error: deep.json: nested 100000 deep, over the bound of 64 " \
                                "(limits.depth)"
    # an answer is 9 deep in a file (the document, data, the article ...), 7 in a line
    doc = _edit(DOC, "data.1.extra", [[[[[[[["deep"]]]]]]]])  # 8 in the article
    with pytest.raises(InputError) as info:
        survey(write_json(tmp_path / "d.json", doc), "d.json", ReadLimits(depth=9))
    assert (info.value.location, info.value.what) == ("data[1]", "nested 11 deep, over the "
                                                      "bound of 9 (limits.depth)")
    with pytest.raises(InputError) as info:
        survey(write_lines(tmp_path / "d.jsonl", doc), "d.jsonl", ReadLimits(depth=8))
    assert (info.value.location, info.value.what) == ("line 3", "nested 9 deep, over the "
                                                      "bound of 8 (limits.depth)")


# ------------------------------------------------------------------ read again, the same file


def test_a_file_changed_between_reads_is_refused(tmp_path: Path) -> None:
    path = write_json(tmp_path / "d.json", DOC)
    s = survey(path, "d.json")
    assert len(list(s.source.files(s.version))) == 3  # read again: unchanged
    write_json(path, _edit(DOC, "data.0.title", "Changed!"))
    os.utime(path, ns=(1, 1))
    with pytest.raises(InputError, match="changed while prepare read it; run prepare again"):
        list(s.source.files(s.version))


def test_a_read_after_the_survey_gives_the_same_articles(tmp_path: Path) -> None:
    """After the survey a SQuAD JSON is read by ijson's C code alone: the same objects."""
    doc = {"version": "1.1", "data": [*DOC["data"], {"title": "n", "paragraphs": [],
                                                     "x": [1.5, 1e-7, 12345678901, None]}]}
    source = SquadSource(write_json(tmp_path / "d.json", doc), "d.json")
    first = [a.raw for a in source.articles()]
    survey_of = survey(source.path, "d.json")
    again = [a.raw for a in survey_of.source.articles()]
    assert survey_of.source.surveyed and first == again == doc["data"]


# ------------------------------------------------------------------------------ heldout.json


@pytest.mark.parametrize("doc", [
    DOC, {"data": [], "version": "1.1"}, {"data": [{"é": "ü\n"}]},
    {"x": {"k": [1, 2]}, "data": [1, [], {}], "y": None},
])
def test_the_writer_writes_what_json_dumps_writes(doc: dict[str, Any]) -> None:
    f = io.BytesIO()
    writer = SquadWriter(f, {**doc, "data": None})
    for article in doc["data"]:
        writer.add(article)
    writer.close()
    assert f.getvalue() == (json.dumps(doc, indent=1, ensure_ascii=False) + "\n").encode()
