"""The answer service: POST /answer, GET /models, GET /health, and the web page at GET /.

Every failure a client can cause is a 4xx with a one-sentence ``detail``: a body over the
size limit, a context/question over its character limit or a context over the answering
function's token cap (``TooLarge``: data.window.max_tokens) is 413, malformed JSON, a wrong
type, a missing or unknown field or an unknown model is 422. A full queue is 503 and a
request the model did not reach in time is 504; the service itself keeps running.
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass
from importlib import resources
from typing import Any

from fastapi import FastAPI, HTTPException, Request
from fastapi.responses import HTMLResponse
from pydantic import BaseModel, ConfigDict, Field, StrictStr, ValidationError

from rcpipe.serve.batcher import AnswerFn, Batcher, Overloaded

log = logging.getLogger("rcpipe.serve")


@dataclass(frozen=True)
class Limits:
    max_context_chars: int = 20_000  # SQuAD's longest passage is about 4,000
    max_question_chars: int = 1_000
    max_batch: int = 16  # requests per forward pass (1: one at a time)
    max_wait_ms: float = 5.0  # how long a batch waits to fill
    timeout_s: float = 30.0  # from arrival to answer, else 504
    max_pending: int = 1024  # queued requests, else 503

    @property
    def max_body_bytes(self) -> int:  # UTF-8 and JSON escapes: 6 bytes per char at worst
        return 6 * (self.max_context_chars + self.max_question_chars) + 4096


class TooLarge(ValueError):
    """What the answering function returns in place of an answer it refuses to compute (a
    context over its token cap): the request gets 413 with this message."""


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
    ms: float = Field(description="time in the service, milliseconds")


def create_app(answer: AnswerFn, models: list[str], limits: Limits = Limits(),
               no_answer: bool = False) -> FastAPI:
    """The service over ``answer(pairs, model) -> [{"text", "start", "end", "prob",
    "na_prob", "tokens", "p_start", "p_end", "windows", "window"} or TooLarge]``
    (eval.answer.Reader.answer_pairs with token probabilities); ``models`` are the names it
    serves, the first is the default."""
    batcher = Batcher(answer, limits.max_batch, limits.max_wait_ms, limits.max_pending)

    @asynccontextmanager
    async def lifespan(_: FastAPI) -> AsyncIterator[None]:
        await batcher.start()
        yield
        await batcher.stop()

    app = FastAPI(title="rcpipe answer service", lifespan=lifespan,
                  description="Extractive QA with rcpipe's trained SQuAD models.")
    app.state.batcher, app.state.models = batcher, models

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
        s = batcher.stats
        return {"status": "ok", "models": models, "batches": s.batches, "answered": s.answered,
                "largest_batch": s.largest, "max_batch": limits.max_batch}

    @app.post("/answer", response_model=AnswerResponse, openapi_extra=_body_schema())
    async def answer_one(request: Request) -> AnswerResponse:
        t0 = time.perf_counter()
        req = _parse(await _body(request, limits.max_body_bytes))
        model = req.model or models[0]
        if model not in models:
            raise HTTPException(422, f"unknown model {model!r}; this service has "
                                     f"{', '.join(models)}")
        _check_text("context", req.context, limits.max_context_chars)
        _check_text("question", req.question, limits.max_question_chars)
        try:
            found = await batcher.submit((req.context, req.question), model, limits.timeout_s)
        except Overloaded:
            raise HTTPException(503, "too many requests queued; try again shortly",
                                headers={"Retry-After": "1"}) from None
        except TimeoutError:
            raise HTTPException(504, f"no answer within {limits.timeout_s:g} s") from None
        except TooLarge as e:
            raise HTTPException(413, str(e)) from None
        except Exception:  # logged by the batcher; the service goes on
            raise HTTPException(500, "the model failed on this request") from None
        return AnswerResponse(
            model=model, answer=found["text"], start=found["start"], end=found["end"],
            prob=found["prob"], na_prob=found["na_prob"], tokens=found["tokens"],
            p_start=_rounded(found["p_start"]), p_end=_rounded(found["p_end"]),
            votes=found.get("votes"), windows=found.get("windows", 1),
            window=found.get("window", 0),
            ms=round(1000 * (time.perf_counter() - t0), 2))

    return app


async def _body(request: Request, limit: int) -> bytes:
    """The request body, refused (413) as soon as it passes ``limit`` bytes."""
    declared = request.headers.get("content-length", "")
    if declared.isdigit() and int(declared) > limit:
        raise HTTPException(413, f"request body of {declared} bytes; the limit is {limit}")
    body = bytearray()
    async for chunk in request.stream():
        body += chunk
        if len(body) > limit:
            raise HTTPException(413, f"request body over {limit} bytes")
    return bytes(body)


def _parse(body: bytes) -> AnswerRequest:
    try:
        obj = json.loads(body)
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise HTTPException(422, f"body is not JSON: {e}") from None
    if not isinstance(obj, dict):
        raise HTTPException(422, 'body must be a JSON object {"context", "question", "model"}')
    try:
        return AnswerRequest.model_validate(obj)
    except ValidationError as e:
        err = e.errors()[0]
        where = ".".join(str(p) for p in err["loc"]) or "body"
        what = "unknown field" if err["type"] == "extra_forbidden" else err["msg"]
        raise HTTPException(422, f"{where}: {what}") from None


def _check_text(name: str, text: str, limit: int) -> None:
    if len(text) > limit:
        raise HTTPException(413, f"{name} is {len(text)} characters; the limit is {limit}")
    if not text.strip():
        raise HTTPException(422, f"{name} is empty")


def _rounded(values: list[float]) -> list[float]:
    return [round(v, 5) for v in values]


def _body_schema() -> dict[str, Any]:
    """The request body in the OpenAPI docs (the endpoint parses it itself, for the limits)."""
    return {"requestBody": {"required": True, "content": {
        "application/json": {"schema": AnswerRequest.model_json_schema()}}}}

