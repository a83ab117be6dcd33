"""A SQuAD file read an article at a time: what prepare reads, never holding the file.

Two forms, either gzipped (known by its first bytes, as reads.read_json knows it):

- a SQuAD JSON (``{"version": ..., "data": [article, ...]}``), streamed by ijson's parser;
- JSON Lines (a name ending ``.jsonl`` or ``.jsonl.gz``): one article object a line, in
  SQuAD's fields; a first line without "paragraphs" (``{"version": "v2.0"}``) holds what a
  SQuAD JSON holds beside "data".

Each article is validated as squad.parse_squad validates a whole file (the same located
lines: ``data[3].paragraphs[7].qas[2].id``, in JSON Lines ``line 12: paragraphs[0]...``).
A file is held to limits.json_mb an article (the bytes from the end of one to the end of
the next, to within the parser's reads: 64 KB, or a sixteenth of a smaller cap; a JSON
Lines line exactly), never the whole file, and to limits.depth, so no article past the cap
is built and no nesting recurses.
"""

from __future__ import annotations

import gzip
import json
import os
import zlib
from array import array
from collections.abc import Iterator
from contextlib import closing
from dataclasses import dataclass, field
from itertools import count
from pathlib import Path
from typing import IO, Any

from rcpipe import reads
from rcpipe.config import ReadLimits
from rcpipe.data.squad import (
    DEFAULT,
    SquadFile,
    article_file,
    file_version,
    flatten_article,
    place,
    question_places,
)
from rcpipe.errors import InputError

JSON_LINES = (".jsonl", ".jsonl.gz")
BUFFER = 64 * 1024  # the parser's reads (at most): how far an article's size may be misread
OPEN, CLOSE = ("start_map", "start_array"), ("end_map", "end_array")
# a JSON value's Python type by the parser's first event of it (a number: by its value)
KINDS = {"start_map": "dict", "start_array": "list", "string": "str", "boolean": "bool",
         "null": "NoneType"}
AGAIN = "run prepare again"


@dataclass(frozen=True)
class Article:
    """An article as read: its place in the file's list, where messages locate it
    (``data[3]``, ``line 12``), and its JSON as it is (heldout.json writes it again)."""

    index: int
    where: str
    raw: Any


class _OverCap(Exception):
    """The bytes read since the last article ended passed the cap."""


class _Capped:
    """A binary stream that counts what it gives the parser and stops past ``limit``."""

    def __init__(self, f: IO[bytes], cap: int) -> None:
        self.f, self.cap, self.pos, self.limit = f, cap, 0, cap
        # the parser's reads: at most a sixteenth of the cap, an article measured within it
        self.buffer = max(1, min(BUFFER, cap // 16))

    def read(self, n: int = -1) -> bytes:
        data = self.f.read(n)
        self.pos += len(data)
        if self.pos > self.limit:
            raise _OverCap
        return data

    def boundary(self) -> None:
        """An article ended: the next one has the cap to itself."""
        self.limit = self.pos + self.cap


class SquadSource:
    """A local SQuAD file (``name``: as the user named it), read an article at a time as
    often as asked; each read checks that the file is still the one first read."""

    def __init__(self, path: Path, name: str, limits: ReadLimits = DEFAULT) -> None:
        self.path, self.name, self.limits = path, name, limits
        self.lines = path.name.endswith(JSON_LINES) or name.endswith(JSON_LINES)
        # what the file holds beside its articles (SQuAD's "version"), in its order, "data"
        # among the keys (None: the articles' place); and where each is, for messages
        self.head: dict[str, Any] = {}
        self.places: dict[str, str] = {}
        self._identity: tuple[int, ...] | None = None
        self.surveyed = False  # read through once, every article checked (survey)

    def articles(self) -> Iterator[Article]:
        """Every article, in order; ``head`` and ``places`` are the file's once the last
        one is read."""
        with reads.open_regular(self.path, self.name) as raw:
            self._same_file(os.fstat(raw.fileno()))
            f: IO[bytes] = gzip.GzipFile(fileobj=raw) if raw.peek(2)[:2] == b"\x1f\x8b" \
                else raw  # type: ignore[assignment]
            reader = _Lines(self, f) if self.lines else \
                _Surveyed(self, f) if self.surveyed else _Json(self, f)
            yield from reader.articles()
            self._same_file(os.fstat(raw.fileno()))  # not written to as it was read
            self.head, self.places = reader.head, reader.places

    def _same_file(self, st: os.stat_result) -> None:
        identity = (st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns)
        if self._identity is not None and identity != self._identity:
            raise InputError(self.name, "", f"changed while prepare read it; {AGAIN}")
        self._identity = identity

    def version(self) -> str:
        """The file's "version" ("" when none), after a whole read."""
        return file_version(self.head, self.name, self.places.get("version", "version"))

    def first_place(self, qid: str) -> str | None:
        """Where question ``qid`` first is in the file, None if nowhere (read again: only a
        duplicate id's message asks)."""
        with closing(self.articles()) as articles:
            for article in articles:
                for found, where in question_places(article.raw, article.where):
                    if found == qid:
                        return where
        return None

    def files(self, version: str, require_answers: bool = True
              ) -> Iterator[tuple[Article, SquadFile]]:
        """Each article with its SquadFile of its own (its questions and contexts)."""
        for article in self.articles():
            yield article, article_file(article.raw, article.where, self.name, version,
                                        require_answers)

    def cap_error(self, where: str) -> InputError:
        cap = self.limits.json_bytes()
        return InputError(self.name, where, f"an article over the cap of "
                          f"{reads.size_text(cap)} (limits.json_mb, each article)")

    def read_error(self, where: str, e: BaseException) -> InputError:
        return InputError(self.name, where, f"cannot read: {e}")


# ------------------------------------------------------------------------------ SQuAD JSON


class _Json:
    """A SQuAD JSON's parser events (ijson's basic_parse: no prefixes, whose strings grow
    with the depth) turned into its articles and its head."""

    def __init__(self, source: SquadSource, f: IO[bytes]) -> None:
        import ijson  # here: the GPU box's image has none, and never prepares

        self.parse_error, self.builder = ijson.JSONError, ijson.ObjectBuilder
        self.source, self.name = source, source.name
        self.bound = source.limits.depth
        self.stream = _Capped(f, source.limits.json_bytes())
        self.events = ijson.basic_parse(self.stream, use_float=True,
                                        buf_size=self.stream.buffer)
        self.head: dict[str, Any] = {}
        self.places: dict[str, str] = {}
        self.depth = 0  # containers open
        self.unit = ""  # where the value being read is, for messages

    def articles(self) -> Iterator[Article]:
        try:
            yield from self._document()
        except _OverCap:
            raise self.source.cap_error(self.unit) from None
        except self.parse_error as e:
            raise InputError(self.name, self.unit, f"not valid JSON ({_said(e)})") from None
        except (OSError, EOFError, zlib.error) as e:  # a gzip stream cut or corrupt
            raise self.source.read_error(self.unit, e) from None

    def _document(self) -> Iterator[Article]:
        head, places = self.head, self.places
        event, value = next(self.events)
        if event != "start_map":  # read whole first: nested too deep is said first
            self._value(event, value, build=False)
            raise InputError(self.name, "", "expected a JSON object at the top level, got "
                             f"{_kind(event, value)}")
        self.depth = 1
        for event, key in self.events:  # the top level's keys, until its end_map
            if event == "end_map":
                break
            event, value = next(self.events)
            self.unit = places[key] = key  # a top-level key is its own path
            if key != "data":
                head[key] = self._value(event, value)
            elif "data" in head:
                raise InputError(self.name, "data", "a second 'data' list")
            elif event != "start_array":
                self._value(event, value, build=False)
                raise InputError(self.name, "data", f"expected a list, got "
                                 f"{_kind(event, value)}")
            else:
                head["data"] = None
                self.depth = 2
                yield from self._data()
            self._boundary()
        for _ in self.events:  # the parser says what follows the document, if anything
            pass
        if "data" not in head:
            raise InputError(self.name, "", "missing key 'data'")

    def _data(self) -> Iterator[Article]:
        for index in count():
            self.unit = f"data[{index}]"  # a fault after an article: at the next one
            event, value = next(self.events)
            if event == "end_array":
                self.depth = 1
                return
            yield Article(index, self.unit, self._value(event, value))
            self._boundary()

    def _boundary(self) -> None:
        self.unit = ""
        self.stream.boundary()

    def _value(self, event: str, value: Any, build: bool = True) -> Any:
        """The JSON value whose first event this is, read to its end (``build``: built)."""
        builder = self.builder() if build else None
        above = self.depth
        while True:
            if event in OPEN:
                self.depth += 1
                if self.depth > self.bound:
                    self._too_deep()
            elif event in CLOSE:
                self.depth -= 1
            if builder is not None:
                builder.event(event, value)
            if self.depth == above:
                return builder.value if builder is not None else None
            event, value = next(self.events)

    def _too_deep(self) -> None:
        """Past limits.depth: read on to the deepest point (nothing built), then refuse."""
        deepest = self.depth
        while self.depth > self.bound:
            event, _ = next(self.events)
            if event in OPEN:
                self.depth += 1
                deepest = max(deepest, self.depth)
            elif event in CLOSE:
                self.depth -= 1
        raise InputError(self.name, self.unit, f"nested {deepest} deep, over the bound of "
                         f"{self.bound} (limits.depth)")


class _Surveyed:
    """A SQuAD JSON read through before and unchanged since (SquadSource checks, before and
    after each read): its structure, depth and every article's size were checked then, so
    its articles are built by ijson's C code alone, no event passing through Python (a
    third of the time); the cap still holds each article, should the file change as read."""

    def __init__(self, source: SquadSource, f: IO[bytes]) -> None:
        import ijson

        self.source, self.head, self.places = source, source.head, source.places
        self.stream = _Capped(f, source.limits.json_bytes())
        self.items = ijson.items(self.stream, "data.item", use_float=True,
                                 buf_size=self.stream.buffer)

    def articles(self) -> Iterator[Article]:
        where = "data[0]"
        try:
            for index, raw in enumerate(self.items):
                yield Article(index, where, raw)
                where = f"data[{index + 1}]"
                self.stream.boundary()
        except _OverCap:
            raise self.source.cap_error(where) from None
        except Exception as e:  # the file read before, unchanged: only the disk can fail
            raise self.source.read_error(where, e) from None


def _kind(event: str, value: Any) -> str:
    return KINDS.get(event) or type(value).__name__


def _said(e: BaseException) -> str:
    """The parser's message, its first line (yajl's next lines point at the byte)."""
    text = str(e)
    if text[:2] in ("b'", 'b"'):  # yajl's lexical errors arrive as a bytes repr
        text = text[2:-1].encode().decode("unicode_escape", errors="replace")
    return text.strip().splitlines()[0] if text.strip() else type(e).__name__


# ------------------------------------------------------------------------------ JSON Lines


class _Lines:
    """A JSON Lines file's articles, a line each, each read within the cap."""

    def __init__(self, source: SquadSource, f: IO[bytes]) -> None:
        self.source, self.name, self.f = source, source.name, f
        self.cap, self.bound = source.limits.json_bytes(), source.limits.depth
        self.head: dict[str, Any] = {}
        self.places: dict[str, str] = {}

    def articles(self) -> Iterator[Article]:
        index, first = 0, True
        for n in count(1):
            where = f"line {n}"
            try:
                line = self.f.readline(self.cap + 1)
            except (OSError, EOFError, zlib.error) as e:
                raise self.source.read_error(where, e) from None
            if not line:
                break
            if len(line) > self.cap:
                raise self.source.cap_error(where)
            if not line.strip():
                continue
            obj = self._parse(line, where)
            if first and isinstance(obj, dict) and "paragraphs" not in obj:
                self._head(obj, where)  # the first line: the file's "version" and such
            else:
                yield Article(index, where, obj)
                index += 1
            first = False
        self.head["data"] = None  # the articles' place, after what the first line held

    def _head(self, obj: dict[str, Any], where: str) -> None:
        if "data" in obj:
            raise InputError(self.name, place(where, "data"), "a JSON Lines file's articles "
                             "are its lines, not a 'data' list")
        self.head.update(obj)
        self.places.update({key: place(where, key) for key in obj})

    def _parse(self, line: bytes, where: str) -> Any:
        """A line's JSON (reads.parse_json: UTF-8, limits.depth), its faults located in the
        file: ``line 12 column 40``, ``line 12 byte 7``."""
        try:
            return reads.parse_json(line.rstrip(b"\r\n"), self.name, self.bound)
        except InputError as e:  # located in the line (its line 1), or not at all
            at = e.location.removeprefix("line 1")
            raise InputError(self.name, f"{where} {at.strip()}".strip(), e.what) from None


# ----------------------------------------------------------------------------- the survey


class SeenIds:
    """A file's question ids met so far, as their hashes (about 60 bytes an id, neither the
    id nor its place held): an id whose hash was met is looked up in the file again, for
    where it first was (none: two ids of one hash, not a duplicate)."""

    def __init__(self, source: SquadSource) -> None:
        self.source = source
        self.hashes: set[int] = set()

    def get(self, qid: str) -> str | None:
        return self.source.first_place(qid) if hash(qid) in self.hashes else None

    def __setitem__(self, qid: str, where: str) -> None:
        self.hashes.add(hash(qid))

    def __contains__(self, qid: str) -> bool:
        """Whether ``qid`` is (by its hash) one of the file's ids: an overlap's count."""
        return hash(qid) in self.hashes


@dataclass
class Survey:
    """What a first read of a file keeps: every article validated, each one's title (the
    held-out draw's) and number of questions, its version and its ids (their hashes)."""

    source: SquadSource
    version: str
    titles: list[str]
    sizes: array[int]  # each article's questions
    passages: int
    ids: SeenIds = field(repr=False)

    @property
    def articles(self) -> int:
        return len(self.titles)

    @property
    def questions(self) -> int:
        return sum(self.sizes)


def survey(path: Path, name: str, limits: ReadLimits = DEFAULT,
           require_answers: bool = True) -> Survey:
    """Read ``path`` through once: every article validated (a duplicate question id too),
    nothing held but a title and a count an article, and the ids' hashes."""
    source = SquadSource(path, name, limits)
    ids = SeenIds(source)
    titles: list[str] = []
    sizes = array("I")
    passages = 0
    for article in source.articles():
        title, contexts, qs = flatten_article(article.raw, article.where, name, ids,
                                              require_answers)
        titles.append(title)
        sizes.append(len(qs))
        passages += len(contexts)
    source.surveyed = True
    return Survey(source, source.version(), titles, sizes, passages, ids)


# ------------------------------------------------------------------------------ writing


class SquadWriter:
    """A SQuAD JSON written an article at a time, the same bytes as
    ``json.dumps(doc, indent=1, ensure_ascii=False) + "\\n"`` of the whole document (how
    rcpipe writes JSON: outputs.OutputSet.json_bytes). ``head``: the document's entries
    in order, "data" among them (its value ignored: the articles go there)."""

    def __init__(self, f: IO[bytes], head: dict[str, Any]) -> None:
        keys = list(head)
        at = keys.index("data")
        self.f, self.head, self.after, self.articles = f, head, keys[at + 1 :], 0
        self._write("{" + "".join(self._entry(k, i) for i, k in enumerate(keys[:at]))
                    + ("," if at else "") + '\n "data": [')

    def _write(self, text: str) -> None:
        self.f.write(text.encode())

    def _entry(self, key: str, i: int) -> str:
        """A top-level entry, after a comma unless it is the first."""
        value = json.dumps(self.head[key], indent=1, ensure_ascii=False).replace("\n", "\n ")
        return ("," if i else "") + f"\n {json.dumps(key, ensure_ascii=False)}: {value}"

    def add(self, article: Any) -> None:
        text = json.dumps(article, indent=1, ensure_ascii=False).replace("\n", "\n  ")
        self._write(("," if self.articles else "") + "\n  " + text)
        self.articles += 1

    def close(self) -> None:
        """The list closed, the entries after it, the document's end."""
        self._write(("\n ]" if self.articles else "]")
                    + "".join(self._entry(k, 1) for k in self.after) + "\n}\n")
