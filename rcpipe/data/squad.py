"""Reading SQuAD v1.1 / v2.0 JSON: fetch (path, URL, s3://), validate fully, flatten.

Structural faults stop the run with a located InputError (``data[3].paragraphs[7].qas[2].id``);
records that are well formed but unusable for training are judged later, by ``check_answer``
and the length limits, and counted with a reason.
"""

from __future__ import annotations

import hashlib
import json
import os
import tempfile
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol
from urllib.parse import urlparse

from rcpipe import reads
from rcpipe.config import ReadLimits
from rcpipe.errors import InputError
from rcpipe.retry import GaveUp, retried

DEFAULT = ReadLimits()  # a caller without a config reads within the params' defaults


@dataclass(frozen=True)
class Answer:
    text: str
    start: int


@dataclass(frozen=True)
class Question:
    qid: str
    question: str
    context_index: int  # index into SquadFile.contexts
    answers: tuple[Answer, ...]
    is_impossible: bool
    plausible_answers: tuple[Answer, ...]
    location: str  # JSON path of the question, for messages


@dataclass(frozen=True)
class SquadFile:
    name: str
    version: str
    contexts: list[str]
    titles: list[str]  # the article title of each context
    questions: list[Question]


# ---------------------------------------------------------------------------------- fetching


def is_remote(uri: str) -> bool:
    return urlparse(uri).scheme in ("http", "https", "s3")


def cache_path(uri: str, cache_dir: Path) -> Path:
    """Downloads live under cache_dir keyed by the URL, so two URLs never share a file."""
    digest = hashlib.sha256(uri.encode()).hexdigest()[:16]
    name = Path(urlparse(uri).path).name or "download"
    return cache_dir / f"{digest}-{name}"


PART = ".part-"  # a download in progress: .part-<pid>-<random>, renamed when complete


def fetch(uri: str, cache_dir: Path, retries: int = 3, limits: ReadLimits = DEFAULT) -> Path:
    """A local path for ``uri``: itself if local, else a cached download (atomic rename),
    abandoned past limits.download_minutes, its retries included, its partial file removed
    (a killed download's, too, on the next fetch)."""
    if not is_remote(uri):
        path = Path(uri)
        if not path.is_file():  # a device or FIFO is refused here too, unread
            raise InputError(uri, "", "refused: not a regular file" if path.exists()
                             else "no such file")
        return path
    target = cache_path(uri, cache_dir)
    if target.is_file():
        return target
    cache_dir.mkdir(parents=True, exist_ok=True)
    _remove_orphans(cache_dir)
    deadline = time.monotonic() + limits.download_minutes * 60

    def once() -> Path:
        fd, tmp = tempfile.mkstemp(dir=cache_dir, prefix=f"{PART}{os.getpid()}-")
        os.close(fd)
        try:
            _download(uri, Path(tmp), deadline, limits.download_idle_seconds)
            os.replace(tmp, target)
            return target
        finally:  # an interrupt too leaves no partial file
            Path(tmp).unlink(missing_ok=True)

    try:  # network errors: retried with backoff, then one clear line
        return retried(once, retries, 1.0, deadline=deadline,
                       retryable=lambda e: not isinstance(e, InputError | Overdue | Idle))
    except GaveUp as e:
        raise InputError(uri, "", f"download failed after {e.tries} tries: {e.error}"
                         ) from None
    except Overdue:
        raise InputError(uri, "", "download abandoned: not complete within "
                         f"limits.download_minutes ({limits.download_minutes:g}); its "
                         "partial file is removed") from None
    except Idle:
        raise InputError(uri, "", "download abandoned: nothing received for "
                         f"limits.download_idle_seconds ({limits.download_idle_seconds:g}"
                         "); its partial file is removed") from None


def _remove_orphans(cache_dir: Path) -> None:
    """Partial files of downloads whose process is gone (killed mid-download)."""
    for part in cache_dir.glob(f"{PART}*"):
        pid = part.name.removeprefix(PART).split("-")[0]
        if not pid.isdigit() or not _alive(int(pid)):
            part.unlink(missing_ok=True)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # another user's process: alive
        return True
    return True


class Overdue(Exception):
    """A download past its deadline (a server sending a byte now and then is not slow
    enough for the socket's timeout, which each read restarts)."""


class Idle(Exception):
    """A download that received nothing for limits.download_idle_seconds: a server that
    accepts and never answers (it held prepare until the two hours' deadline)."""


def _waiting(deadline: float, idle: float, uri: str) -> float:
    """How long the next wait may last: the idle limit, or the time left if shorter."""
    left = deadline - time.monotonic()
    if left <= 0:
        raise Overdue(uri)
    return max(0.05, min(idle, left))


def _timed_out(deadline: float, uri: str) -> Exception:
    """A socket's timeout, as the deadline's or the idle limit's (whichever fell)."""
    return Overdue(uri) if time.monotonic() >= deadline - 0.05 else Idle(uri)


def _copy_until(resp: Any, out: Any, deadline: float, idle: float, uri: str) -> None:
    while True:
        # each read waits at most the idle limit or the time left: read1 returns what
        # has arrived
        resp.fp.raw._sock.settimeout(_waiting(deadline, idle, uri))  # noqa: SLF001
        try:
            block = resp.read1(1 << 20)
        except TimeoutError:
            raise _timed_out(deadline, uri) from None
        if not block:
            return
        out.write(block)


def _download(uri: str, dest: Path, deadline: float = float("inf"),
              idle: float = DEFAULT.download_idle_seconds) -> None:
    parsed = urlparse(uri)
    if parsed.scheme == "s3":
        import boto3  # slow import: only when an s3:// URI is used
        from botocore.config import Config as Boto
        from botocore.exceptions import ClientError

        waits = Boto(connect_timeout=idle, read_timeout=idle)  # each wait, not the whole
        try:
            boto3.client("s3", config=waits).download_file(parsed.netloc,
                                                           parsed.path.lstrip("/"), str(dest))
        except ClientError as e:
            code = e.response.get("Error", {}).get("Code", "")
            if code in ("404", "NoSuchKey", "NoSuchBucket", "403", "AccessDenied"):
                raise InputError(uri, "", f"S3 refused: {code}") from None
            raise
        return
    try:  # connecting and the answer's head: each wait within the idle limit
        resp = urllib.request.urlopen(uri, timeout=_waiting(deadline, idle, uri))
    except TimeoutError:
        raise _timed_out(deadline, uri) from None
    except urllib.error.URLError as e:
        if isinstance(e.reason, TimeoutError):
            raise _timed_out(deadline, uri) from None
        raise
    with resp, dest.open("wb") as out:
        _copy_until(resp, out, deadline, idle, uri)


# ----------------------------------------------------------------------------------- parsing


def read_json(path: Path, name: str, limits: ReadLimits = DEFAULT) -> Any:
    """reads.read_json within the params' limits.json_mb (inflated) and limits.depth."""
    return reads.read_json(path, limits.json_bytes(), limits.depth, name=name)



def read_mapping(path: Path, value: type | tuple[type, ...], what: str,
                 limits: ReadLimits = DEFAULT) -> dict[str, Any]:
    """A JSON object of question ids to values of type ``value`` (predictions, n-best or
    no-answer probabilities), read within ``limits``."""
    obj = read_json(path, str(path), limits)
    if not isinstance(obj, dict):
        raise InputError(path, "", "expected a JSON object mapping question ids to answers")
    for k, v in obj.items():
        if not isinstance(v, value) or isinstance(v, bool):
            raise InputError(path, json.dumps([k]), f"expected {what}, got {type(v).__name__}")
    return obj


def _is(value: Any, kind: type | tuple[type, ...]) -> bool:
    # bool is an int in Python; SQuAD never means a bool where it asks for a number
    return isinstance(value, kind) and not (kind is int and isinstance(value, bool))


def _expect(value: Any, kind: type | tuple[type, ...], name: str, where: str, what: str) -> Any:
    if not _is(value, kind):
        raise InputError(name, where, f"expected {what}, got {type(value).__name__}")
    return value


def place(where: str, key: str) -> str:
    """The JSON path of ``key`` inside ``where``: ``data[3].paragraphs``; at the top level
    ``key`` alone; in a JSON Lines file, whose line is an article, ``line 12: paragraphs``
    (then ``line 12: paragraphs[0].qas``: a path holds no text of the file's own)."""
    if not where:
        return key
    if where.startswith("line ") and ":" not in where:
        return f"{where}: {key}"
    return f"{where}.{key}"


def _field(obj: dict, key: str, kind: type | tuple[type, ...], name: str, where: str,
           what: str) -> Any:
    if key not in obj:
        raise InputError(name, where, f"missing key '{key}'")
    value = obj[key]
    if not _is(value, kind):  # its path spelled for the message alone (prepare reads
        _expect(value, kind, name, place(where, key), what)  # every field thrice)
    return value


def _answers(qa: dict, key: str, name: str, where: str) -> tuple[Answer, ...]:
    out = []
    for k, a in enumerate(_field(qa, key, list, name, where, "a list")):
        if not (isinstance(a, dict) and isinstance(a.get("text"), str)
                and _is(a.get("answer_start"), int)):  # at fault: said where
            at = place(where, f"{key}[{k}]")
            _expect(a, dict, name, at, "an object")
            _field(a, "text", str, name, at, "a string")
            _field(a, "answer_start", int, name, at, "an integer")
        out.append(Answer(a["text"], a["answer_start"]))
    return tuple(out)


def file_version(head: dict[str, Any], name: str, where: str = "version") -> str:
    """A SQuAD file's "version" ("" when it has none), a string (``where``: its place)."""
    return _expect(head.get("version", ""), str, name, where, "a string")


def parse_squad(doc: Any, name: str, require_answers: bool = True) -> SquadFile:
    """Validate the whole structure of a SQuAD v1.1/v2.0 document and flatten it.

    ``require_answers=False`` accepts questions to be answered (`rcpipe predict --input`):
    "answers" may be missing or empty; any that are given are still checked.
    """
    _expect(doc, dict, name, "", "a JSON object at the top level")
    version = file_version(doc, name)
    data = _field(doc, "data", list, name, "", "a list")
    contexts: list[str] = []
    titles: list[str] = []
    questions: list[Question] = []
    seen: dict[str, str] = {}
    for i, article in enumerate(data):
        title, texts, qs = flatten_article(article, f"data[{i}]", name, seen, require_answers,
                                           first_context=len(contexts))
        contexts.extend(texts)
        titles.extend([title] * len(texts))
        questions.extend(qs)
    return SquadFile(name, version, contexts, titles, questions)


class Seen(Protocol):
    """The question ids met so far and where (a dict, or data/articles.py's ids of a file
    read an article at a time): ``get`` gives the first place of an id met before."""

    def get(self, qid: str) -> str | None: ...

    def __setitem__(self, qid: str, where: str) -> None: ...


def flatten_article(article: Any, where: str, name: str, seen: Seen,
                    require_answers: bool = True, first_context: int = 0
                    ) -> tuple[str, list[str], list[Question]]:
    """One article of a SQuAD file, validated whole and flattened: (its title, its contexts,
    its questions, whose context_index counts from ``first_context``). ``where`` is its
    place in messages (``data[3]``; ``line 12`` of a JSON Lines file); a question id in
    ``seen`` is a duplicate, and each of this article's ids is added to it."""
    _expect(article, dict, name, where, "an object")
    title = article.get("title", "")
    _expect(title, str, name, place(where, "title"), "a string")
    contexts: list[str] = []
    questions: list[Question] = []
    for j, para in enumerate(_field(article, "paragraphs", list, name, where, "a list")):
        pw = place(where, f"paragraphs[{j}]")
        _expect(para, dict, name, pw, "an object")
        contexts.append(_field(para, "context", str, name, pw, "a string"))
        for k, qa in enumerate(_field(para, "qas", list, name, pw, "a list")):
            questions.append(_question(qa, first_context + len(contexts) - 1, name,
                                       f"{pw}.qas[{k}]", seen, require_answers))
    return title, contexts, questions


def article_file(article: Any, where: str, name: str, version: str,
                 require_answers: bool = True) -> SquadFile:
    """One article as a SquadFile of its own (``version``: its file's): what prepare
    tokenizes, labels and writes an article at a time."""
    title, contexts, questions = flatten_article(article, where, name, {}, require_answers)
    return SquadFile(name, version, contexts, [title] * len(contexts), questions)


def joined(files: list[SquadFile]) -> SquadFile:
    """Several articles' SquadFiles (one file's) as one, their contexts and questions in
    order: what prepare labels and writes a batch at a time."""
    contexts: list[str] = []
    titles: list[str] = []
    questions: list[Question] = []
    for sq in files:
        first = len(contexts)  # this article's contexts are counted from here
        questions.extend(Question(q.qid, q.question, first + q.context_index, q.answers,
                                  q.is_impossible, q.plausible_answers, q.location)
                         for q in sq.questions)
        contexts.extend(sq.contexts)
        titles.extend(sq.titles)
    return SquadFile(files[0].name, files[0].version, contexts, titles, questions)


def question_places(article: Any, where: str) -> Iterator[tuple[Any, str]]:
    """(id, place) of each question of an article, walked as flatten_article walks it, with
    nothing checked: where an id met again was first met, in an article already read."""
    paragraphs = article.get("paragraphs") if isinstance(article, dict) else None
    for j, para in enumerate(paragraphs if isinstance(paragraphs, list) else ()):
        qas = para.get("qas") if isinstance(para, dict) else None
        for k, qa in enumerate(qas if isinstance(qas, list) else ()):
            if isinstance(qa, dict):
                yield qa.get("id"), f"{place(where, f'paragraphs[{j}]')}.qas[{k}]"


def _question(qa: Any, context_index: int, name: str, where: str,
              seen: Seen, require_answers: bool = True) -> Question:
    _expect(qa, dict, name, where, "an object")
    qid = _field(qa, "id", str, name, where, "a string")
    if not qid:
        raise InputError(name, f"{where}.id", "empty question id")
    first = seen.get(qid)
    if first is not None and first != where:  # data/articles.py's ids may find this one
        raise InputError(name, f"{where}.id", f"duplicate question id '{qid}' (first at {first})")
    seen[qid] = where
    text = _field(qa, "question", str, name, where, "a string")
    answers = _answers(qa, "answers", name, where) \
        if require_answers or "answers" in qa else ()
    impossible = qa.get("is_impossible", False)
    if not isinstance(impossible, bool):
        _expect(impossible, bool, name, f"{where}.is_impossible", "true or false")
    plausible = _answers(qa, "plausible_answers", name, where) if "plausible_answers" in qa else ()
    if impossible and answers:
        raise InputError(name, f"{where}.answers", "is_impossible is true but answers is not empty")
    if not impossible and not answers and require_answers:
        raise InputError(name, f"{where}.answers", "no answers for an answerable question")
    return Question(qid, text, context_index, answers, impossible, plausible, where)


def load_squad(uri: str, cache_dir: Path, require_answers: bool = True,
               limits: ReadLimits = DEFAULT) -> SquadFile:
    doc = read_json(fetch(uri, cache_dir, limits=limits), uri, limits)
    return parse_squad(doc, uri, require_answers)


def load_document(uri: str, cache_dir: Path, limits: ReadLimits = DEFAULT) -> dict[str, Any]:
    """The raw SQuAD JSON (for the official scorer), validated by the same reader as prepare."""
    doc = read_json(fetch(uri, cache_dir, limits=limits), uri, limits)
    parse_squad(doc, uri)
    return doc


# ---------------------------------------------------------------------- usable for training


def check_answer(context: str, answer: Answer, window: int) -> tuple[int, int] | str:
    """The answer's (start, end) character span, or the reason it is unusable.

    Some SQuAD answers are misplaced by a few characters; the text found nearest to
    answer_start within ``window`` characters is taken instead of dropping the question.
    """
    text = answer.text
    if not text.strip():
        return "blank_answer"
    if answer.start < 0 or answer.start >= len(context):
        return "answer_start_out_of_range"
    if context.startswith(text, answer.start):
        return answer.start, answer.start + len(text)
    lo = max(0, answer.start - window)
    hi = min(len(context), answer.start + len(text) + window)
    found = [m for m in _find_all(context[lo:hi], text)]
    if not found:
        return "answer_text_mismatch"
    best = lo + min(found, key=lambda m: abs(lo + m - answer.start))
    return best, best + len(text)


def _find_all(haystack: str, needle: str) -> list[int]:
    out, at = [], haystack.find(needle)
    while at >= 0:
        out.append(at)
        at = haystack.find(needle, at + 1)
    return out
