"""The answer service's HTTP side: POST /answer, GET /models, GET /health, and the page at
GET /, over an ``ask(pair, model)`` coroutine (deployments.py: a Reader deployment's handle).

Every failure a client can cause is a 4xx with a one-sentence JSON ``detail``, never a 500:
a body over the size limit, a context/question over its character limit or a context over
the Reader's token cap (``TooLarge``: data.window.max_tokens) is 413; a body that is not
JSON (a 5,000-digit integer, nesting past Python's recursion limit, bytes that are not
UTF-8 included), a wrong type, a missing or unknown field, text that is not Unicode (a lone
surrogate such as ``\\ud800``) or an unknown model is 422; a body that has not arrived
within ``body_timeout_s`` is 408. A full queue is 503 and a request the model did not reach
in time is 504; the service itself keeps running.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from importlib import resources
from typing import Any

from fastapi import FastAPI, HTTPException, Request
from fastapi.responses import HTMLResponse
from pydantic import BaseModel, ConfigDict, Field, StrictStr, ValidationError

from rcpipe import reads
from rcpipe.errors import InputError
from rcpipe.reads import blank

Pair = tuple[str, str]  # (context, question)
# the answer to one pair by one model: a dict with "batch" (the size of the forward pass
# it shared), or Overloaded / TimeoutError / TooLarge / ModelFailed raised
Ask = Callable[[Pair, str], Awaitable[dict[str, Any]]]


@dataclass(frozen=True)
class Limits:
    max_context_chars: int = 20_000  # SQuAD's longest passage is about 4,000
    max_question_chars: int = 1_000
    max_batch: int = 16  # requests per forward pass (1: one at a time)
    max_wait_ms: float = 5.0  # how long a batch waits to fill
    timeout_s: float = 30.0  # from arrival to answer, else 504
    max_pending: int = 1024  # queued requests per Reader replica, else 503
    body_timeout_s: float = 10.0  # the whole body within this, else 408

    @property
    def max_body_bytes(self) -> int:  # UTF-8 and JSON escapes: 6 bytes per char at worst
        return 6 * (self.max_context_chars + self.max_question_chars) + 4096


class TooLarge(ValueError):
    """An answer the Reader refuses to compute (a context over its token cap): 413 with
    this message."""


class Overloaded(Exception):
    """The Reader's queue is full: the service is answering as fast as it can (503)."""


class ModelFailed(Exception):
    """The model failed on this request (logged by its replica): 500, the service goes on."""


class AnswerRequest(BaseModel):
    model_config = ConfigDict(extra="forbid")

    context: StrictStr = Field(description="the passage")
    question: StrictStr = Field(description="a question the passage may answer")
    model: StrictStr | None = Field(None, description="a served model; default: the first")


class AnswerResponse(BaseModel):
    model: str
    answer: str = Field(description='the answer text, "" when the model finds none')
    start: int = Field(description="the answer's first character in the context (-1: none)")
    end: int = Field(description="one past its last character (-1: none)")
    prob: float = Field(description="p_start * p_end of the answer span")
    na_prob: float = Field(description="P(no answer) (SQuAD v2.0 models; 0 otherwise)")
    tokens: list[tuple[int, int]] = Field(description="context tokens as [start, end) chars")
    p_start: list[float] = Field(description="P(answer starts at token i)")
    p_end: list[float] = Field(description="P(answer ends at token i)")
    votes: int | None = Field(None, description="ensemble: models voting for the answer")
    windows: int = Field(1, description="windows the context was read as (1: whole)")
    window: int = Field(0, description="the window the answer came from (0: the first)")
    night: str | None = Field(None, description="the champion app: the night whose champion "
                              "answered")
    champion: dict[str, Any] | None = Field(None, description="the champion app: the "
                                            "champion record's entry that answered (seq, "
                                            "run, model)")
    ms: float = Field(description="time in the service, milliseconds")


@dataclass
class Stats:
    """What /health reports: requests answered and the forward passes they shared (each
    answer says how large its batch was, so a batch of n adds n times 1/n)."""

    answered: int = 0
    batch_share: float = 0.0
    largest: int = 0

    def add(self, batch: int) -> None:
        self.answered += 1
        self.batch_share += 1 / batch
        self.largest = max(self.largest, batch)


def create_app(ask: Ask, models: list[str], limits: Limits = Limits(),
               no_answer: bool = False,
               about: Callable[[], dict[str, Any] | None] | None = None) -> FastAPI:
    """The service over ``ask`` (one answer: {"text", "start", "end", "prob", "na_prob",
    "tokens", "p_start", "p_end", "windows", "window", "batch"}); ``models`` are the names
    it serves, the first is the default. ``about``: what /health says of the model answering
    now (the champion app: its record entry)."""
    # no /docs or /redoc: FastAPI's pages load Swagger UI and ReDoc from a public CDN (a
    # page that breaks offline, third-party script in the answer service); /openapi.json,
    # the description they render, stays
    app = FastAPI(title="rcpipe answer service",
                  description="Extractive QA with rcpipe's trained SQuAD models.",
                  docs_url=None, redoc_url=None)
    stats = Stats()
    app.state.models, app.state.stats = models, stats

    @app.get("/", response_class=HTMLResponse)
    def page() -> str:
        return resources.files("rcpipe.serve").joinpath("page.html").read_text("utf-8")

    @app.get("/models")
    def served() -> dict[str, Any]:
        return {"models": models, "default": models[0], "no_answer": no_answer,
                "max_context_chars": limits.max_context_chars,
                "max_question_chars": limits.max_question_chars}

    @app.get("/health")
    def health() -> dict[str, Any]:
        return {"status": "ok", "models": models, "batches": round(stats.batch_share),
                "answered": stats.answered, "largest_batch": stats.largest,
                "max_batch": limits.max_batch, **({"champion": about()} if about else {})}

    @app.post("/answer", response_model=AnswerResponse, openapi_extra=_body_schema())
    async def answer_one(request: Request) -> AnswerResponse:
        t0 = time.perf_counter()
        body = await _body(request, limits.max_body_bytes, limits.body_timeout_s)
        req = _parse(body)
        model = req.model or models[0]
        if model not in models:
            raise HTTPException(422, f"unknown model {model!r}; this service has "
                                     f"{', '.join(models)}")
        _check_text("context", req.context, limits.max_context_chars)
        _check_text("question", req.question, limits.max_question_chars)
        try:
            found = await asyncio.wait_for(ask((req.context, req.question), model),
                                           limits.timeout_s)
        except Overloaded:
            raise HTTPException(503, "too many requests queued; try again shortly",
                                headers={"Retry-After": "1"}) from None
        except TimeoutError:
            raise HTTPException(504, f"no answer within {limits.timeout_s:g} s") from None
        except TooLarge as e:
            raise HTTPException(413, str(e)) from None
        except ModelFailed:
            raise HTTPException(500, "the model failed on this request") from None
        stats.add(found.get("batch", 1))
        return AnswerResponse(
            model=model, answer=found["text"], start=found["start"], end=found["end"],
            prob=found["prob"], na_prob=found["na_prob"], tokens=found["tokens"],
            p_start=_rounded(found["p_start"]), p_end=_rounded(found["p_end"]),
            votes=found.get("votes"), windows=found.get("windows", 1),
            window=found.get("window", 0), night=found.get("night"),
            champion=found.get("champion"),
            ms=round(1000 * (time.perf_counter() - t0), 2))

    return app


async def _body(request: Request, limit: int, timeout_s: float) -> bytes:
    """The request body, refused as soon as it passes ``limit`` bytes (413) or when it has
    not arrived whole within ``timeout_s`` (408: a client trickling its body holds a
    connection no longer than this, whatever Serve's own request timeout says)."""
    declared = request.headers.get("content-length", "")
    if declared.isdigit() and int(declared) > limit:
        raise HTTPException(413, f"request body of {declared} bytes; the limit is {limit}")
    body = bytearray()

    async def read() -> None:
        async for chunk in request.stream():
            body.extend(chunk)
            if len(body) > limit:
                raise HTTPException(413, f"request body over {limit} bytes")

    try:
        await asyncio.wait_for(read(), timeout_s)
    except TimeoutError:
        raise HTTPException(408, f"the request body did not arrive within {timeout_s:g} s",
                            headers={"Connection": "close"}) from None
    return bytes(body)


def _parse(body: bytes) -> AnswerRequest:
    try:
        obj = reads.parse_json(body.removeprefix(b"\xef\xbb\xbf"), "body")  # a BOM: as before
    # InputError: not UTF-8, not JSON, nested past limits.depth (reads: counted before it
    # is parsed); ValueError: an integer over Python's 4,300 digits
    except (InputError, ValueError) as e:
        what = "nested too deeply" if isinstance(e, InputError) and "nested" in e.what \
            else e.what if isinstance(e, InputError) else str(e)
        raise HTTPException(422, f"body is not JSON: {what}") from None
    if not isinstance(obj, dict):
        raise HTTPException(422, 'body must be a JSON object {"context", "question", "model"}')
    try:
        req = AnswerRequest.model_validate(obj)
    except ValidationError as e:
        err = e.errors()[0]
        where = _printable(".".join(str(p) for p in err["loc"]) or "body")
        what = "unknown field" if err["type"] == "extra_forbidden" else err["msg"]
        raise HTTPException(422, f"{where}: {what}") from None
    for name in ("context", "question", "model"):
        _check_unicode(name, getattr(req, name))
    return req


def _check_unicode(name: str, text: str | None) -> None:
    """JSON's \\u escapes can spell half a surrogate pair, which no UTF-8 holds: the
    tokenizer and the response could not carry it."""
    if text is None:
        return
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as e:
        raise HTTPException(422, f"{name}: a lone surrogate {text[e.start]!a} at character "
                            f"{e.start} is not Unicode text") from None


def _printable(text: str, most: int = 80) -> str:
    """A client's own key, fit to quote in a detail: ASCII escapes, cut at ``most``."""
    text = ascii(text)[1:-1]
    return text if len(text) <= most else text[:most] + "..."


def _check_text(name: str, text: str, limit: int) -> None:
    if len(text) > limit:
        raise HTTPException(413, f"{name} is {len(text)} characters; the limit is {limit}")
    if blank(text):  # zero-width characters only: as empty as spaces
        raise HTTPException(422, f"{name} is empty")


def _rounded(values: list[float]) -> list[float]:
    return [round(v, 5) for v in values]


def _body_schema() -> dict[str, Any]:
    """The request body in the OpenAPI docs (the endpoint parses it itself, for the limits)."""
    return {"requestBody": {"required": True, "content": {
        "application/json": {"schema": AnswerRequest.model_json_schema()}}}}

