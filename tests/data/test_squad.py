"""Reading SQuAD: flattening (a file, an article), fetching (path, http, s3, gzip) and answer
span checks."""

from __future__ import annotations

import gzip
import http.server
import json
import socket
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from rcpipe.data import squad
from rcpipe.data.squad import (
    Answer,
    article_file,
    cache_path,
    check_answer,
    fetch,
    flatten_article,
    joined,
    load_squad,
    parse_squad,
    place,
    question_places,
)
from rcpipe.errors import InputError

DOC: dict[str, Any] = {
    "version": "v2.0",
    "data": [
        {"title": "First", "paragraphs": [
            {"context": "Ada wrote code.", "qas": [
                {"id": "a", "question": "Who wrote code?",
                 "answers": [{"text": "Ada", "answer_start": 0},
                             {"text": "Ada", "answer_start": 0}]},
            ]},
            {"context": "Bob read books.", "qas": [
                {"id": "b", "question": "What did Bob read?",
                 "answers": [{"text": "books", "answer_start": 9}], "is_impossible": False},
                {"id": "c", "question": "What did Bob write?", "answers": [],
                 "is_impossible": True,
                 "plausible_answers": [{"text": "books", "answer_start": 9}]},
            ]},
        ]},
        {"title": "Second", "paragraphs": [
            {"context": "Empty paragraph.", "qas": []},
            {"context": "Cy sang.", "qas": [
                {"id": "d", "question": "Who sang?",
                 "answers": [{"text": "Cy", "answer_start": 0}]},
            ]},
        ]},
        {"paragraphs": []},  # an article without a title or paragraphs is allowed
    ],
}


# ---------------------------------------------------------------------------------- parsing


def test_parse_squad_flattens() -> None:
    sq = parse_squad(DOC, "doc.json")
    assert sq.name == "doc.json" and sq.version == "v2.0"
    assert sq.contexts == ["Ada wrote code.", "Bob read books.", "Empty paragraph.", "Cy sang."]
    assert sq.titles == ["First", "First", "Second", "Second"]
    assert [q.qid for q in sq.questions] == ["a", "b", "c", "d"]
    assert [q.context_index for q in sq.questions] == [0, 1, 1, 3]

    a, b, c, d = sq.questions
    assert a.answers == (Answer("Ada", 0), Answer("Ada", 0))
    assert a.is_impossible is False and a.plausible_answers == ()
    assert a.location == "data[0].paragraphs[0].qas[0]"
    assert b.answers == (Answer("books", 9),) and b.is_impossible is False
    assert c.answers == () and c.is_impossible is True
    assert c.plausible_answers == (Answer("books", 9),)
    assert c.location == "data[0].paragraphs[1].qas[1]"
    assert d.location == "data[1].paragraphs[1].qas[0]"


def test_parse_squad_v1_without_version() -> None:
    doc = {"data": [{"title": "T", "paragraphs": [
        {"context": "x y", "qas": [{"id": "q", "question": "?", "answers": [
            {"text": "y", "answer_start": 2}]}]}]}]}
    sq = parse_squad(doc, "v1")
    assert sq.version == "" and len(sq.questions) == 1


def test_parse_squad_locates_faults() -> None:
    doc = json.loads(json.dumps(DOC))
    doc["data"][1]["paragraphs"][1]["qas"][0]["id"] = "b"
    with pytest.raises(InputError) as info:
        parse_squad(doc, "f.json")
    err = info.value
    assert (err.file, err.location) == ("f.json", "data[1].paragraphs[1].qas[0].id")
    assert "first at data[0].paragraphs[1].qas[0]" in err.what


def test_an_article_flattened_alone_is_its_part_of_the_file() -> None:
    """parse_squad is flatten_article over the articles, the contexts counted on: prepare
    flattens an article at a time (article_file) and joins a batch of them (joined)."""
    whole = parse_squad(DOC, "doc.json")
    seen: dict[str, str] = {}
    title, contexts, questions = flatten_article(DOC["data"][1], "data[1]", "doc.json", seen,
                                                 first_context=2)
    assert (title, contexts) == ("Second", whole.contexts[2:])
    assert questions == whole.questions[3:] and seen == {"d": "data[1].paragraphs[1].qas[0]"}
    alone = [article_file(a, f"data[{i}]", "doc.json", "v2.0")
             for i, a in enumerate(DOC["data"])]
    assert [q.context_index for q in alone[0].questions] == [0, 1, 1]
    assert alone[1].titles == ["Second", "Second"] and alone[1].version == "v2.0"
    assert joined(alone) == whole


def test_an_articles_places_in_a_json_lines_file() -> None:
    assert place("", "data") == "data" and place("data[3]", "title") == "data[3].title"
    assert place("line 12", "paragraphs[0]") == "line 12: paragraphs[0]"
    assert place("line 12: paragraphs[0]", "qas") == "line 12: paragraphs[0].qas"
    with pytest.raises(InputError) as info:
        article_file({"paragraphs": [{"context": 1}]}, "line 4", "f.jsonl", "")
    assert info.value.line() == "error: f.jsonl: line 4: paragraphs[0].context: expected a " \
                                "string, got int"
    assert list(question_places(DOC["data"][0], "line 2")) == [
        ("a", "line 2: paragraphs[0].qas[0]"), ("b", "line 2: paragraphs[1].qas[0]"),
        ("c", "line 2: paragraphs[1].qas[1]")]
    assert list(question_places({"paragraphs": [7, {"qas": "x"}]}, "data[0]")) == []


def test_load_squad_reads_json_and_gzip(tmp_path: Path) -> None:
    plain, packed = tmp_path / "d.json", tmp_path / "d.json.gz"
    plain.write_text(json.dumps(DOC))
    packed.write_bytes(gzip.compress(json.dumps(DOC).encode()))
    a = load_squad(str(plain), tmp_path / "cache")
    b = load_squad(str(packed), tmp_path / "cache")
    assert a.questions == b.questions and a.contexts == b.contexts
    assert b.name == str(packed)
    assert not (tmp_path / "cache").exists()  # local files are never copied


def test_gzip_is_detected_by_content_not_name(tmp_path: Path) -> None:
    path = tmp_path / "looks-plain.json"
    path.write_bytes(gzip.compress(json.dumps(DOC).encode()))
    assert squad.read_json(path, "x") == DOC


def test_read_json_unicode(tmp_path: Path) -> None:
    path = tmp_path / "u.json"
    path.write_text(json.dumps({"k": "café — 東京"}, ensure_ascii=False), encoding="utf-8")
    assert squad.read_json(path, "u")["k"] == "café — 東京"


# ------------------------------------------------------------------------------- fetch: local


def test_fetch_local_path(tmp_path: Path) -> None:
    path = tmp_path / "local.json"
    path.write_text("{}")
    assert fetch(str(path), tmp_path / "cache") == path
    with pytest.raises(InputError) as info:
        fetch(str(tmp_path / "missing.json"), tmp_path / "cache")
    assert info.value.what == "no such file"
    with pytest.raises(InputError):
        fetch(str(tmp_path), tmp_path / "cache")  # a directory is not a file


def test_cache_path_keyed_by_url(tmp_path: Path) -> None:
    a = cache_path("https://a.example/x/train.json", tmp_path)
    b = cache_path("https://b.example/x/train.json", tmp_path)
    assert a != b and a.name.endswith("-train.json") and b.name.endswith("-train.json")
    assert a == cache_path("https://a.example/x/train.json", tmp_path)
    assert cache_path("https://a.example/", tmp_path).name.endswith("-download")
    assert cache_path("s3://bucket/k/v.json.gz", tmp_path).name.endswith("-v.json.gz")


# -------------------------------------------------------------------------------- fetch: http


class _Server:
    """Serves ``files`` (URL path -> bytes) on 127.0.0.1 and records every requested path."""

    def __init__(self) -> None:
        self.files: dict[str, bytes] = {}
        self.requests: list[str] = []
        server = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_GET(self) -> None:  # noqa: N802 (the http.server API)
                server.requests.append(self.path)
                body = server.files.get(self.path)
                if body is None:
                    self.send_error(404)
                    return
                self.send_response(200)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *args: Any) -> None:
                pass

        self.httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}"
        self.thread = threading.Thread(target=self.httpd.serve_forever,
                                       kwargs={"poll_interval": 0.05}, daemon=True)

    def __enter__(self) -> _Server:
        self.thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()
        self.thread.join()


@pytest.fixture
def server() -> Iterator[_Server]:
    with _Server() as s:
        yield s


def test_fetch_http_caches_by_url(server: _Server, tmp_path: Path) -> None:
    body = json.dumps(DOC).encode()
    server.files["/v1/train.json"] = body
    url = server.url + "/v1/train.json"
    cache = tmp_path / "cache"

    first = fetch(url, cache)
    assert first.read_bytes() == body
    assert first == cache_path(url, cache) and first.parent == cache
    assert server.requests == ["/v1/train.json"]

    second = fetch(url, cache)
    assert second == first
    assert server.requests == ["/v1/train.json"]  # served from the cache
    assert sorted(p.name for p in cache.iterdir()) == [first.name]  # no partial files left


def test_fetch_http_same_basename_different_files(server: _Server, tmp_path: Path) -> None:
    server.files["/a/train.json"] = b'{"which": "a"}'
    server.files["/b/train.json"] = b'{"which": "b"}'
    cache = tmp_path / "cache"
    pa = fetch(server.url + "/a/train.json", cache)
    pb = fetch(server.url + "/b/train.json", cache)
    assert pa != pb
    assert json.loads(pa.read_text()) == {"which": "a"}
    assert json.loads(pb.read_text()) == {"which": "b"}


def test_fetch_http_gzip_then_load(server: _Server, tmp_path: Path) -> None:
    server.files["/dev.json.gz"] = gzip.compress(json.dumps(DOC).encode())
    url = server.url + "/dev.json.gz"
    sq = load_squad(url, tmp_path / "cache")
    assert sq.name == url and len(sq.questions) == 4
    assert cache_path(url, tmp_path / "cache").name.endswith("-dev.json.gz")


def test_fetch_http_404_after_retries(server: _Server, tmp_path: Path,
                                      monkeypatch: pytest.MonkeyPatch) -> None:
    sleeps: list[float] = []
    monkeypatch.setattr(squad.time, "sleep", sleeps.append)
    url = server.url + "/missing.json"
    with pytest.raises(InputError) as info:
        fetch(url, tmp_path / "cache", retries=3)
    err = info.value
    assert err.file == url and err.location == ""
    assert "download failed after 3 tries" in err.what and "404" in err.what
    assert server.requests == ["/missing.json"] * 3
    assert sleeps == [1, 2]  # exponential backoff between tries
    assert list((tmp_path / "cache").iterdir()) == []  # no partial download left behind


def test_fetch_http_retry_then_success(server: _Server, tmp_path: Path,
                                       monkeypatch: pytest.MonkeyPatch) -> None:
    url = server.url + "/late.json"

    def sleep(seconds: float) -> None:  # the file appears while fetch waits to retry
        server.files["/late.json"] = b"{}"

    monkeypatch.setattr(squad.time, "sleep", sleep)
    assert fetch(url, tmp_path / "cache").read_bytes() == b"{}"
    assert server.requests == ["/late.json", "/late.json"]


def test_fetch_unreachable_host(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(squad.time, "sleep", lambda s: None)
    with socket.socket() as s:  # a port nothing listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    with pytest.raises(InputError) as info:
        fetch(f"http://127.0.0.1:{port}/x.json", tmp_path / "cache", retries=2)
    assert "after 2 tries" in info.value.what


# ---------------------------------------------------------------------------------- fetch: s3


@pytest.mark.integration
def test_fetch_s3(s3: Any, tmp_path: Path) -> None:
    body = gzip.compress(json.dumps(DOC).encode())
    s3.put_object(Bucket="rcpipe-test", Key="squad/dev-v2.0.json.gz", Body=body)
    uri = "s3://rcpipe-test/squad/dev-v2.0.json.gz"
    path = fetch(uri, tmp_path / "cache")
    assert path.read_bytes() == body
    assert path == cache_path(uri, tmp_path / "cache")
    assert [q.qid for q in load_squad(uri, tmp_path / "cache").questions] == ["a", "b", "c", "d"]

    s3.delete_object(Bucket="rcpipe-test", Key="squad/dev-v2.0.json.gz")
    assert fetch(uri, tmp_path / "cache") == path  # cached: S3 is not asked again


@pytest.mark.integration
@pytest.mark.parametrize("uri", ["s3://rcpipe-test/nope.json", "s3://no-such-bucket/x.json"])
def test_fetch_s3_missing(s3: Any, tmp_path: Path, uri: str) -> None:
    with pytest.raises(InputError) as info:
        fetch(uri, tmp_path / "cache")
    assert info.value.file == uri
    assert info.value.what.startswith("S3 refused: ")
    assert list((tmp_path / "cache").iterdir()) == []


# ------------------------------------------------------------------------------ check_answer

CONTEXT = "The cat sat. The dog ran. The cat slept."
#          0123456789012345678901234567890123456789


def test_check_answer_exact() -> None:
    assert check_answer(CONTEXT, Answer("cat", 4), 10) == (4, 7)
    assert check_answer(CONTEXT, Answer("The cat slept.", 26), 0) == (26, 40)
    assert check_answer(CONTEXT, Answer("T", 0), 0) == (0, 1)


def test_check_answer_misplaced_nearest_wins() -> None:
    # "cat" occurs at 4 and 30; a start of 27 is nearer the second
    assert check_answer(CONTEXT, Answer("cat", 27), 10) == (30, 33)
    assert check_answer(CONTEXT, Answer("cat", 6), 10) == (4, 7)
    # both within the window: the nearer one wins whichever side it is on
    assert check_answer(CONTEXT, Answer("cat", 18), 20) == (30, 33)
    assert check_answer(CONTEXT, Answer("cat", 16), 20) == (4, 7)


def test_check_answer_beyond_window() -> None:
    assert check_answer(CONTEXT, Answer("slept", 2), 10) == "answer_text_mismatch"
    assert check_answer(CONTEXT, Answer("slept", 2), 0) == "answer_text_mismatch"
    assert check_answer(CONTEXT, Answer("cat", 5), 0) == "answer_text_mismatch"
    assert check_answer(CONTEXT, Answer("horse", 4), 100) == "answer_text_mismatch"
    # searched: [start - window, start + len(text) + window) = [29, 40) holds "slept" at 34
    assert check_answer(CONTEXT, Answer("slept", 32), 3) == (34, 39)
    assert check_answer(CONTEXT, Answer("slept", 32), 1) == "answer_text_mismatch"  # [31, 38)


@pytest.mark.parametrize("start", [-1, -100, len(CONTEXT), len(CONTEXT) + 5])
def test_check_answer_start_out_of_range(start: int) -> None:
    assert check_answer(CONTEXT, Answer("cat", start), 1000) == "answer_start_out_of_range"


@pytest.mark.parametrize("text", ["", " ", "\n\t "])
def test_check_answer_blank(text: str) -> None:
    assert check_answer(CONTEXT, Answer(text, 3), 10) == "blank_answer"


def test_check_answer_empty_context() -> None:
    assert check_answer("", Answer("x", 0), 10) == "answer_start_out_of_range"
