"""Benchmark: whole documents, read as windows against the old cut at 1,000 tokens
(docs/results/long-documents.md).

The article split's test articles, each article's paragraphs joined into one document,
every question keeping its gold answers at their shifted offsets, answered by one bidaf
three ways: each question in its own paragraph (``paragraph``), over its whole document read
as params.yaml's data.window (``windows``: the Reader of predict and serve), and over its
document cut at data.window.length tokens as before windows (``cut``); for each F1/EM,
seconds per question and windows per document. The model is trained with the CPU preset for
``--minutes`` as bench/accuracy.py trains (or ``--model FILE``, on the same prepared data).
``--questions N`` answers N questions of each article, spread over it: a question over a
whole document costs all its windows. Quote as "article split of SQuAD dev, articles as
documents".

    .venv/bin/python bench/documents.py --minutes 5 --questions 40
"""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

from accuracy import PRESETS, prepare, train
from common import OUT, ROOT, SPLIT, parser, write

SEP = "\n\n"  # between an article's paragraphs in its document


def as_documents(doc: dict[str, Any], questions: int) -> dict[str, Any]:
    """Each article's paragraphs joined into one context, its questions' answers shifted;
    only ``questions`` of each article's questions, evenly spread over it (0: all)."""
    out = []
    for article in doc["data"]:
        context, qas = "", []
        for p in article["paragraphs"]:
            shift = len(context) + (len(SEP) if context else 0)
            context = context + SEP + p["context"] if context else p["context"]
            for qa in p["qas"]:
                answers = [{"text": a["text"], "answer_start": a["answer_start"] + shift}
                           for a in qa["answers"]]
                for a in answers:
                    assert context[a["answer_start"]:][: len(a["text"])] == a["text"]
                qas.append({**qa, "answers": answers})
        if questions and len(qas) > questions:  # spread over the document, not its start
            qas = [qas[k * len(qas) // questions] for k in range(questions)]
        out.append({"title": article["title"], "paragraphs": [{"context": context,
                                                               "qas": qas}]})
    return {"version": doc.get("version", "1.1"), "data": out}


def only(doc: dict[str, Any], qids: set[str]) -> dict[str, Any]:
    """``doc`` (paragraphs as SQuAD gives them) holding only the questions ``qids``."""
    return {"version": doc.get("version", "1.1"), "data": [
        {"title": a["title"], "paragraphs": [
            {"context": p["context"], "qas": [qa for qa in p["qas"] if qa["id"] in qids]}
            for p in a["paragraphs"]]} for a in doc["data"]]}


def answer(reader: Any, doc: dict[str, Any], name: str) -> tuple[dict[str, Any], float]:
    """(qid -> answer, seconds) for every question of ``doc``, tokenizing included."""
    from rcpipe.data.squad import parse_squad

    t0 = time.perf_counter()
    ds = reader.encoder.squad(parse_squad(doc, name, require_answers=False), reader.para_limit)
    found = reader.answer_dataset(ds, "bidaf")
    return found, time.perf_counter() - t0


def main() -> None:
    ap = parser(__doc__, sets=False)
    ap.add_argument("--split", type=Path, default=SPLIT)
    ap.add_argument("--workdir", type=Path, default=OUT / "documents")
    ap.add_argument("--minutes", type=float, default=4.0)
    ap.add_argument("--questions", type=int, default=40, help="an article's (0: all)")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--model", type=Path, default=None, help="a trained bidaf model.pt")
    ap.add_argument("--window", type=int, nargs=2, action="append", default=[],
                    metavar=("LENGTH", "STRIDE"), help="also read the documents as windows "
                    "of this shape (e.g. 400 200: the training length)")
    args = ap.parse_args()

    import torch

    from rcpipe.config import Window, load_config
    from rcpipe.data.encode import TextEncoder
    from rcpipe.data.prepared import Prepared
    from rcpipe.data.squad import read_json
    from rcpipe.data.tokenize import tokenize
    from rcpipe.data.windows import window_starts
    from rcpipe.inference.answer import Reader
    from rcpipe.scoring import metrics
    from rcpipe.trained.model_file import model_from_payload

    torch.set_num_threads(args.threads)
    train_file, test = args.split / "train-v1.1.json", args.split / "test-v1.1.json"
    prepared = args.workdir / "prepared"
    prepare(PRESETS["cpu"], train_file, test, prepared, [])
    model_file = args.model
    if model_file is None:
        run = args.workdir / "bidaf"
        if not (run / "model.pt").is_file():
            train("bidaf", PRESETS["cpu"], prepared, train_file, test, run, 42, args.minutes,
                  100, threads=args.threads)
        model_file = run / "model.pt"
    saved = torch.load(model_file, map_location="cpu", weights_only=True)
    model, _ = model_from_payload(saved, "bidaf", Prepared(prepared).vocab_digest())
    model.eval()

    big = load_config(ROOT / "params.yaml")  # params.yaml's window
    small = load_config(PRESETS["cpu"])
    meta = json.loads((prepared / "meta.json").read_text())
    encoder = TextEncoder.from_vocab(json.loads((prepared / "vocab.json").read_text()),
                                     meta["char_limit"])

    def reader(**reading: Any) -> Any:
        return Reader(encoder, {"bidaf": model}, torch.device("cpu"),
                      small.eval.max_answer_len, **reading)

    source = read_json(test, str(test))
    documents = as_documents(source, args.questions)
    qids = {qa["id"] for a in documents["data"] for qa in a["paragraphs"][0]["qas"]}
    paragraphs = only(source, qids)
    readers = [("paragraph", reader(), paragraphs),
               ("windows", reader(window=big.data.window), documents),
               ("cut", reader(para_limit=big.data.window.length), documents)]
    readers += [(f"windows {n}/{s}", reader(window=Window(length=n, stride=s)), documents)
                for n, s in args.window]
    rows = {}
    for name, read, doc in readers:
        found, seconds = answer(read, doc, name)
        scores = metrics.score(doc, {q: v["text"] for q, v in found.items()})
        past = [q for q, v in found.items() if v["windows"] > 1 and v["window"] > 0]
        rows[name] = {"f1": scores["f1"], "em": scores["exact_match"],
                      "questions": len(found), "seconds": round(seconds, 2),
                      "s_per_question": seconds / len(found),
                      "answers_past_the_first_window": len(past)}
        print(f"{name:>16}: F1 {scores['f1']:.1f} EM {scores['exact_match']:.1f} on "
              f"{len(found)} questions, {seconds / len(found) * 1000:.1f} ms a question",
              flush=True)
    contexts = [a["paragraphs"][0]["context"] for a in documents["data"]]
    tokens = [len(t.words) for t in tokenize(contexts, quiet=True)]
    w = big.data.window
    windows = [len(window_starts(n, w.length, w.stride)) for n in tokens]
    out = {"device": "cpu", "threads": args.threads, "model": str(model_file),
           "window": big.data.window.model_dump(), "cut_at": big.data.window.length,
           "documents": len(contexts), "tokens_per_document": tokens,
           "windows_per_document": windows, "rows": rows}
    print(f"{len(contexts)} documents of {min(tokens):,}-{max(tokens):,} tokens, "
          f"{min(windows)}-{max(windows)} windows (mean {sum(windows) / len(windows):.1f})")
    write(args.workdir / "documents.json", out)


if __name__ == "__main__":
    main()
