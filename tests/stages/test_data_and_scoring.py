"""Stages: synth, prepare (report, determinism, v2.0, vectors), score and ensemble files."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow.parquet as pq
import pytest

from rcpipe import stages
from rcpipe.config import Config, load_config
from rcpipe.data.squad import load_squad
from rcpipe.data.tokenize import tokenize
from rcpipe.errors import InputError
from tests.conftest import Prepared, SynthData, questions_of, write_params

MakeConfig = Callable[..., Config]

# ------------------------------------------------------------------------------------ synth


def test_synth_writes_both_files(workdir: Path) -> None:
    cfg = load_config("params.yaml")
    out = stages.synth(cfg)
    assert out == {"train": Path("data/synth/train.json"), "dev": Path("data/synth/dev.json")}
    train = json.loads(out["train"].read_text())
    dev = json.loads(out["dev"].read_text())
    s = cfg.synth
    per_article = s.paragraphs_per_article * s.questions_per_paragraph
    assert len(questions_of(train)) == s.train_articles * per_article
    assert len(questions_of(dev)) == s.dev_articles * per_article
    assert not {q["id"] for q in questions_of(train)} & {q["id"] for q in questions_of(dev)}
    before = out["train"].read_bytes()
    stages.synth(cfg)
    assert out["train"].read_bytes() == before  # same params, same bytes


def test_synth_v2(workdir: Path) -> None:
    cfg = load_config("params.yaml", ["synth.version=2.0"])
    stages.synth(cfg)
    doc = json.loads(Path("data/synth/dev.json").read_text())
    assert doc["version"] == "v2.0"
    assert any(q["is_impossible"] for q in questions_of(doc))


def test_synth_refuses_remote_before_writing(workdir: Path) -> None:
    cfg = load_config("params.yaml", ["data.dev_file=https://example.com/dev.json"])
    with pytest.raises(InputError) as info:
        stages.synth(cfg)
    assert info.value.location == "data.dev_file"
    assert not Path("data").exists()


# ---------------------------------------------------------------------------------- prepare


def test_prepare_report_equals_counts(prepared: Prepared) -> None:
    report = json.loads((prepared.out_dir / "report.json").read_text())
    assert report == prepared.report
    for split, doc in (("train", prepared.data.train_doc), ("dev", prepared.data.dev_doc)):
        r = report[split]
        assert r["questions"] == len(questions_of(doc))
        assert r["questions"] == r["kept"] + sum(r["dropped"].values())
        assert pq.read_metadata(prepared.out_dir / f"{split}.parquet").num_rows == r["kept"]
    assert report["dev"]["dropped"] == {} and report["dev"]["kept"] == report["dev"]["questions"]

    meta = json.loads((prepared.out_dir / "meta.json").read_text())
    vocab = json.loads((prepared.out_dir / "vocab.json").read_text())
    assert meta["words"] == len(vocab["words"]) and meta["chars"] == len(vocab["chars"])
    assert meta["version"] == {"train": "1.1", "dev": "1.1"}
    assert not (prepared.out_dir / "word_emb.npy").exists()  # no vectors configured


def test_prepare_vocab_is_train_only(prepared: Prepared) -> None:
    def ids(split: str) -> set[int]:
        column = pq.read_table(prepared.out_dir / f"{split}.parquet").column("context_word_ids")
        return {i for row in column.to_pylist() for i in row}

    assert 1 not in ids("train")  # min_word_count 1: every training word has an id
    assert 1 in ids("dev")  # words seen only in dev are OOV (no vectors to admit them)


def test_prepare_is_deterministic(make_config: MakeConfig, synth_v1: SynthData,
                                  tmp_path: Path) -> None:
    outs = []
    for name in ("a", "b"):
        cfg = make_config(synth_v1, data={"out_dir": str(tmp_path / name)})
        stages.prepare(cfg)
        outs.append(tmp_path / name)
    a, b = outs
    for name in ("vocab.json", "report.json"):
        assert (a / name).read_bytes() == (b / name).read_bytes()
    for split in ("train", "dev"):
        ta, tb = pq.read_table(a / f"{split}.parquet"), pq.read_table(b / f"{split}.parquet")
        assert ta.num_rows > 0 and ta.equals(tb)


def test_prepare_report_with_drops(make_config: MakeConfig, synth_v1: SynthData) -> None:
    cfg = make_config(synth_v1, data={"limits": {"para": 80, "question": 10, "answer": 2}})
    report = stages.prepare(cfg)
    train = report["train"]
    assert set(train["dropped"]) <= {"context_too_long", "question_too_long", "answer_too_long"}
    assert len(train["dropped"]) >= 2
    assert list(train["dropped"]) == sorted(train["dropped"])
    assert train["questions"] == train["kept"] + sum(train["dropped"].values())
    assert report["dev"]["kept"] == report["dev"]["questions"]
    assert json.loads((cfg.data.out_dir / "report.json").read_text()) == report
    table = pq.read_table(cfg.data.out_dir / "train.parquet")
    assert table.num_rows == train["kept"]
    y1, y2 = table.column("y1").to_numpy(), table.column("y2").to_numpy()
    assert table.num_rows > 0 and np.all((y2 - y1 >= 0) & (y2 - y1 < 2))  # answer limit 2


def test_prepare_v2_keeps_unanswerable(make_config: MakeConfig, synth_v2: SynthData) -> None:
    cfg = make_config(synth_v2)
    report = stages.prepare(cfg)
    for split, doc in (("train", synth_v2.train_doc), ("dev", synth_v2.dev_doc)):
        table = pq.read_table(cfg.data.out_dir / f"{split}.parquet").to_pylist()
        impossible = [r for r in table if r["is_impossible"]]
        n_impossible = sum(1 for q in questions_of(doc) if q["is_impossible"])
        assert impossible and len(impossible) == n_impossible
        assert all(r["y1"] == r["y2"] == -1 and r["answers"] == [] for r in impossible)
        assert all(r["y1"] >= 0 for r in table if not r["is_impossible"])
    assert report["train"]["kept"] == report["train"]["questions"]
    meta = json.loads((cfg.data.out_dir / "meta.json").read_text())
    assert meta["version"] == {"train": "v2.0", "dev": "v2.0"}


def test_prepare_with_word_vectors(make_config: MakeConfig, synth_v1: SynthData,
                                   tmp_path: Path) -> None:
    glove = tmp_path / "vectors.txt"
    # "the" (also found for "The"), and a word that only dev has
    train, dev = (load_squad(str(p), tmp_path) for p in (synth_v1.train, synth_v1.dev))
    train_words = {w for t in tokenize(train.contexts + [q.question for q in train.questions])
                   for w in t.words}
    dev_only = sorted({w for t in tokenize(dev.contexts) for w in t.words if w.isalpha()}
                      - train_words)[0]
    glove.write_text(f"the 1 2 3 4\n{dev_only} 5 6 7 8\nzzzunused 0 0 0 0\n")
    cfg = make_config(synth_v1, data={"word_vectors": str(glove), "word_dim": 4})
    stages.prepare(cfg)
    words = json.loads((cfg.data.out_dir / "vocab.json").read_text())["words"]
    emb = np.load(cfg.data.out_dir / "word_emb.npy")
    assert emb.shape == (len(words), 4) and emb.dtype == np.float32
    assert np.all(emb[0] == 0)
    assert dev_only in words  # a dev word with a vector joins the vocabulary
    np.testing.assert_array_equal(emb[words.index(dev_only)], [5, 6, 7, 8])
    for w in ("the", "The"):
        if w in words:
            np.testing.assert_array_equal(emb[words.index(w)], [1, 2, 3, 4])
    assert "zzzunused" not in words
    meta = json.loads((cfg.data.out_dir / "meta.json").read_text())
    assert meta["vectors_found"] >= 2


def test_prepare_bad_vectors_file(make_config: MakeConfig, synth_v1: SynthData,
                                  tmp_path: Path) -> None:
    glove = tmp_path / "vectors.txt"
    glove.write_text("the 1 2 3 4\nbroken 1 2\n")
    cfg = make_config(synth_v1, data={"word_vectors": str(glove), "word_dim": 4})
    with pytest.raises(InputError) as info:
        stages.prepare(cfg)
    assert (info.value.file, info.value.location) == (str(glove), "line 2")


# ------------------------------------------------------------------------------------ score


def test_score_direct(synth_v1: SynthData, tmp_path: Path) -> None:
    qas = questions_of(synth_v1.dev_doc)
    preds = {qa["id"]: qa["answers"][0]["text"] for qa in qas[: len(qas) // 2]}
    path = tmp_path / "p.json"
    path.write_text(json.dumps(preds))
    result = stages.score(str(synth_v1.dev), path, cache_dir=tmp_path / "cache")
    assert result["exact_match"] == pytest.approx(100.0 * len(preds) / len(qas))


# --------------------------------------------------------------------------------- ensemble


def _nbest(answers: dict[str, str], prob: float = 0.5, na_prob: float = 0.1
           ) -> dict[str, dict[str, Any]]:
    return {q: {"text": t, "prob": prob, "na_prob": na_prob} for q, t in answers.items()}


def _write(path: Path, obj: Any) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(obj))
    return path


@pytest.fixture
def ens_dir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, synth_v1: SynthData) -> Path:
    monkeypatch.chdir(tmp_path)
    write_params(tmp_path / "params.yaml", data={"dev_file": str(synth_v1.dev)})
    return tmp_path


def test_ensemble_majority_vote_files(ens_dir: Path, synth_v1: SynthData) -> None:
    gold = {qa["id"]: qa["answers"][0]["text"] for qa in questions_of(synth_v1.dev_doc)}
    wrong = {q: "nothing like it" for q in gold}
    first = next(iter(gold))
    _write(Path("predictions/bidaf.nbest.json"), _nbest(gold, 0.3))
    _write(Path("predictions/rnet.nbest.json"), _nbest({**wrong, first: gold[first]}, 0.9))
    _write(Path("predictions/qanet.nbest.json"), _nbest(gold, 0.4, na_prob=0.4))
    result = stages.ensemble(load_config("params.yaml"))

    assert result == {"exact_match": 100.0, "f1": 100.0}
    assert json.loads(Path("predictions/ensemble.json").read_text()) == gold
    assert json.loads(Path("metrics/ensemble.json").read_text()) == result
    voted = json.loads(Path("predictions/ensemble.nbest.json").read_text())
    assert voted[first] == {"text": gold[first], "prob": 0.9, "votes": 3,
                            "na_prob": pytest.approx(0.2)}
    other = next(q for q in gold if q != first)
    assert voted[other]["votes"] == 2 and voted[other]["prob"] == 0.4
    by_type = json.loads(Path("metrics/ensemble.by_type.json").read_text())
    assert sum(v["total"] for v in by_type.values()) == len(gold)


def test_ensemble_tie_goes_to_the_higher_prob(ens_dir: Path, synth_v1: SynthData) -> None:
    gold = {qa["id"]: qa["answers"][0]["text"] for qa in questions_of(synth_v1.dev_doc)}
    wrong = {q: "nothing like it" for q in gold}
    a = _write(ens_dir / "in/a.json", _nbest(wrong, 0.6))
    b = _write(ens_dir / "in/b.json", _nbest(gold, 0.7))
    out = Path("out/custom.json")
    result = stages.ensemble(load_config("params.yaml"), [a, b], out)
    assert result["exact_match"] == 100.0
    assert json.loads(out.read_text()) == gold
    assert Path("out/custom.nbest.json").is_file()
    assert json.loads(Path("metrics/custom.json").read_text()) == result
    # and the other way round: the wrong text wins the tie
    _write(a, _nbest(wrong, 0.8))
    assert stages.ensemble(load_config("params.yaml"), [a, b], out)["exact_match"] == 0.0


def test_ensemble_v2_empty_text_is_an_answer(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                             synth_v2: SynthData) -> None:
    monkeypatch.chdir(tmp_path)
    write_params(tmp_path / "params.yaml", data={"dev_file": str(synth_v2.dev)})
    gold = {qa["id"]: (qa["answers"][0]["text"] if qa["answers"] else "")
            for qa in questions_of(synth_v2.dev_doc)}
    blank = {q: "" for q in gold}
    _write(Path("predictions/bidaf.nbest.json"), _nbest(gold))
    _write(Path("predictions/rnet_mult.nbest.json"), _nbest(gold))
    _write(Path("predictions/qanet.nbest.json"), _nbest(blank, 0.99))
    result = stages.ensemble(load_config("params.yaml"))
    assert result["exact"] == 100.0 and result["total"] == len(gold)
    assert {"HasAns_exact", "NoAns_exact", "best_exact"} <= set(result)
    assert json.loads(Path("predictions/ensemble.json").read_text()) == gold


def test_ensemble_without_inputs(ens_dir: Path) -> None:
    with pytest.raises(InputError) as info:
        stages.ensemble(load_config("params.yaml"))
    assert info.value.file == "predictions/"


@pytest.mark.parametrize(
    ("entry", "location"),
    [
        ({"text": "x", "na_prob": 0.1}, '["q"].prob'),
        ({"text": "x", "prob": 0.5}, '["q"].na_prob'),
        ({"text": "x", "prob": "high", "na_prob": 0.1}, '["q"].prob'),
        ({"text": "x", "prob": True, "na_prob": 0.1}, '["q"].prob'),
        ({"prob": 0.5, "na_prob": 0.1}, '["q"]'),
        ("x", '["q"]'),
    ],
)
def test_ensemble_malformed_nbest(ens_dir: Path, entry: Any, location: str) -> None:
    path = _write(ens_dir / "bad.nbest.json", {"q": entry})
    with pytest.raises(InputError) as info:
        stages.ensemble(load_config("params.yaml"), [path])
    assert (info.value.file, info.value.location) == (str(path), location)
    assert not Path("predictions").exists()  # nothing written for a bad input


def test_ensemble_ids_from_another_dataset(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                           synth_v2: SynthData) -> None:
    monkeypatch.chdir(tmp_path)
    write_params(tmp_path / "params.yaml", data={"dev_file": str(synth_v2.dev)})
    path = _write(tmp_path / "other.nbest.json", _nbest({"not-a-dev-id": "x"}))
    with pytest.raises(InputError) as info:
        stages.ensemble(load_config("params.yaml"), [path])
    assert info.value.file == str(synth_v2.dev)
