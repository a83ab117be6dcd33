"""Reading SQuAD v1.1 / v2.0 JSON: fetch (path, URL, s3://), validate fully, flatten.

Structural faults stop the run with a located InputError (``data[3].paragraphs[7].qas[2].id``);
records that are well formed but unusable for training are judged later, by ``check_answer``
and the length limits, and counted with a reason.
"""

from __future__ import annotations

import gzip
import hashlib
import json
import os
import shutil
import tempfile
import time
import urllib.request
import zlib
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import urlparse

from rcpipe.errors import InputError


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


def fetch(uri: str, cache_dir: Path, retries: int = 3) -> Path:
    """A local path for ``uri``: itself if local, else a cached download (atomic rename)."""
    if not is_remote(uri):
        path = Path(uri)
        if not path.is_file():
            raise InputError(uri, "", "no such file")
        return path
    target = cache_path(uri, cache_dir)
    if target.is_file():
        return target
    cache_dir.mkdir(parents=True, exist_ok=True)
    for attempt in range(1, retries + 1):
        fd, tmp = tempfile.mkstemp(dir=cache_dir, prefix=".part-")
        os.close(fd)
        try:
            _download(uri, Path(tmp))
            os.replace(tmp, target)
            return target
        except InputError:
            Path(tmp).unlink(missing_ok=True)
            raise
        except Exception as e:  # network errors: retry with backoff, then one clear line
            Path(tmp).unlink(missing_ok=True)
            if attempt == retries:
                raise InputError(uri, "", f"download failed after {retries} tries: {e}") from None
            time.sleep(2 ** (attempt - 1))
    raise AssertionError("unreachable")


def _download(uri: str, dest: Path) -> None:
    parsed = urlparse(uri)
    if parsed.scheme == "s3":
        import boto3  # slow import: only when an s3:// URI is used
        from botocore.exceptions import ClientError

        try:
            boto3.client("s3").download_file(parsed.netloc, parsed.path.lstrip("/"), str(dest))
        except ClientError as e:
            code = e.response.get("Error", {}).get("Code", "")
            if code in ("404", "NoSuchKey", "NoSuchBucket", "403", "AccessDenied"):
                raise InputError(uri, "", f"S3 refused: {code}") from None
            raise
        return
    with urllib.request.urlopen(uri, timeout=60) as resp, dest.open("wb") as out:
        shutil.copyfileobj(resp, out, length=1 << 20)


# ----------------------------------------------------------------------------------- parsing


def read_json(path: Path, name: str) -> Any:
    """Parse JSON (gzip when the file says so); syntax errors located by line and column."""
    try:
        raw = path.read_bytes()
        if raw[:2] == b"\x1f\x8b":
            raw = gzip.decompress(raw)
        text = raw.decode("utf-8")
    except (OSError, EOFError, zlib.error) as e:  # zlib.error: corrupt deflate data
        raise InputError(name, "", f"cannot read: {e}") from None
    except UnicodeDecodeError as e:
        raise InputError(name, f"byte {e.start}", "not UTF-8") from None
    try:
        return json.loads(text)
    except json.JSONDecodeError as e:
        raise InputError(name, f"line {e.lineno} column {e.colno}", e.msg) from None


def _expect(value: Any, kind: type | tuple[type, ...], name: str, where: str, what: str) -> Any:
    # bool is an int in Python; SQuAD never means a bool where it asks for a number
    if not isinstance(value, kind) or (kind is int and isinstance(value, bool)):
        raise InputError(name, where, f"expected {what}, got {type(value).__name__}")
    return value


def _field(obj: dict, key: str, kind: type | tuple[type, ...], name: str, where: str,
           what: str) -> Any:
    if key not in obj:
        raise InputError(name, where, f"missing key '{key}'")
    return _expect(obj[key], kind, name, f"{where}.{key}" if where else key, what)


def _answers(qa: dict, key: str, name: str, where: str) -> tuple[Answer, ...]:
    out = []
    for k, a in enumerate(_field(qa, key, list, name, where, "a list")):
        at = f"{where}.{key}[{k}]"
        _expect(a, dict, name, at, "an object")
        text = _field(a, "text", str, name, at, "a string")
        start = _field(a, "answer_start", int, name, at, "an integer")
        out.append(Answer(text, start))
    return tuple(out)


def parse_squad(doc: Any, name: str, require_answers: bool = True) -> SquadFile:
    """Validate the whole structure of a SQuAD v1.1/v2.0 document and flatten it.

    ``require_answers=False`` accepts questions to be answered (`rcpipe predict --input`):
    "answers" may be missing or empty; any that are given are still checked.
    """
    _expect(doc, dict, name, "", "a JSON object at the top level")
    version = doc.get("version", "")
    _expect(version, str, name, "version", "a string")
    data = _field(doc, "data", list, name, "", "a list")
    contexts: list[str] = []
    titles: list[str] = []
    questions: list[Question] = []
    seen: dict[str, str] = {}
    for i, article in enumerate(data):
        art = f"data[{i}]"
        _expect(article, dict, name, art, "an object")
        title = article.get("title", "")
        _expect(title, str, name, f"{art}.title", "a string")
        for j, para in enumerate(_field(article, "paragraphs", list, name, art, "a list")):
            pw = f"{art}.paragraphs[{j}]"
            _expect(para, dict, name, pw, "an object")
            context = _field(para, "context", str, name, pw, "a string")
            contexts.append(context)
            titles.append(title)
            for k, qa in enumerate(_field(para, "qas", list, name, pw, "a list")):
                questions.append(_question(qa, len(contexts) - 1, name, f"{pw}.qas[{k}]", seen,
                                           require_answers))
    return SquadFile(name, version, contexts, titles, questions)


def _question(qa: Any, context_index: int, name: str, where: str,
              seen: dict[str, str], require_answers: bool = True) -> Question:
    _expect(qa, dict, name, where, "an object")
    qid = _field(qa, "id", str, name, where, "a string")
    if not qid:
        raise InputError(name, f"{where}.id", "empty question id")
    if qid in seen:
        raise InputError(name, f"{where}.id",
                         f"duplicate question id '{qid}' (first at {seen[qid]})")
    seen[qid] = where
    text = _field(qa, "question", str, name, where, "a string")
    answers = _answers(qa, "answers", name, where) \
        if require_answers or "answers" in qa else ()
    impossible = qa.get("is_impossible", False)
    _expect(impossible, bool, name, f"{where}.is_impossible", "true or false")
    plausible = _answers(qa, "plausible_answers", name, where) if "plausible_answers" in qa else ()
    if impossible and answers:
        raise InputError(name, f"{where}.answers", "is_impossible is true but answers is not empty")
    if not impossible and not answers and require_answers:
        raise InputError(name, f"{where}.answers", "no answers for an answerable question")
    return Question(qid, text, context_index, answers, impossible, plausible, where)


def load_squad(uri: str, cache_dir: Path, require_answers: bool = True) -> SquadFile:
    return parse_squad(read_json(fetch(uri, cache_dir), uri), uri, require_answers)


def load_document(uri: str, cache_dir: Path) -> dict[str, Any]:
    """The raw SQuAD JSON (for the official scorer), validated by the same reader as prepare."""
    doc = read_json(fetch(uri, cache_dir), uri)
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
