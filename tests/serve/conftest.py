"""The answer service over the session's trained models, on a free loopback port."""

from __future__ import annotations

import json
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from rcpipe.serve.server import background
from rcpipe.stages.predict import serve_app
from tests.conftest import Trained


@dataclass(frozen=True)
class Service:
    url: str
    trained: Trained
    nbest: dict[str, dict[str, Any]]  # model -> qid -> evaluate's (or ensemble's) answer
    contexts: dict[str, str]  # qid -> context
    questions: dict[str, str]  # qid -> question


@pytest.fixture(scope="module")
def service(trained: Trained) -> Iterator[Service]:
    with pytest.MonkeyPatch.context() as mp:
        mp.chdir(trained.root)  # models/ is relative to the run directory
        app = serve_app(trained.cfg, threads=0)  # 0: leave torch's threads to the suite
        nbest = {m: json.loads(Path(f"predictions/{m}.nbest.json").read_text())
                 for m in (*trained.variants, "ensemble")}
    contexts, questions = {}, {}
    for article in trained.data.dev_doc["data"]:
        for p in article["paragraphs"]:
            for qa in p["qas"]:
                contexts[qa["id"]], questions[qa["id"]] = p["context"], qa["question"]
    with background(app) as url:
        yield Service(url, trained, nbest, contexts, questions)
