"""rcpipe.stages.data: synth, and prepare (report, determinism, v2.0, word vectors)."""

from __future__ import annotations

import gzip
import hashlib
import json
import logging
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow.parquet as pq
import pytest

from rcpipe import reads, stages
from rcpipe.config import Config, load_config
from rcpipe.data.squad import load_squad
from rcpipe.data.tokenize import tokenize
from rcpipe.errors import InputError
from tests.conftest import (
    Prepared,
    SynthData,
    prepared_files,
    questions_of,
    vectors_for_half,
)

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
    held = report["heldout"]["questions"]  # articles of the training file, never trained on
    for split, doc, less in (("train", prepared.data.train_doc, held),
                             ("dev", prepared.data.dev_doc, 0)):
        r = report[split]
        assert r["questions"] == len(questions_of(doc)) - less
        assert r["questions"] == r["kept"] + sum(r["dropped"].values())
        assert pq.read_table(prepared.out_dir / split).num_rows == r["kept"]
    for split in ("dev", "heldout"):
        assert report[split]["dropped"] == {}
        assert report[split]["kept"] == report[split]["questions"]

    meta = json.loads((prepared.out_dir / "meta.json").read_text())
    vocab = json.loads((prepared.out_dir / "vocab.json").read_text())
    assert meta["words"] == len(vocab["words"]) and meta["chars"] == len(vocab["chars"])
    assert meta["version"] == {"train": "1.1", "dev": "1.1"}
    assert not (prepared.out_dir / "word_emb.npy").exists()  # no vectors configured


def test_prepare_vocab_is_train_only(prepared: Prepared) -> None:
    def ids(split: str) -> set[int]:
        column = pq.read_table(prepared.out_dir / split).column("context_word_ids")
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
        ta, tb = pq.read_table(a / split), pq.read_table(b / split)
        assert ta.num_rows > 0 and ta.equals(tb)


def test_prepare_report_with_drops(make_config: MakeConfig, synth_v1: SynthData) -> None:
    cfg = make_config(synth_v1, data={"limits": {"para": 80, "question": 10, "answer": 2}})
    report = stages.prepare(cfg)
    train = report["train"]
    # a context over 80 tokens is read as windows, no longer dropped
    assert set(train["dropped"]) <= {"question_too_long", "answer_too_long",
                                     "answer_across_windows"}
    assert len(train["dropped"]) >= 2
    windows = train["windows"]
    assert windows["questions"] > 0 and windows["no_answer"] == 0  # v1.1: none
    assert train["rows"] == train["kept"] - windows["questions"] + windows["rows"]
    assert list(train["dropped"]) == sorted(train["dropped"])
    assert train["questions"] == train["kept"] + sum(train["dropped"].values())
    assert report["dev"]["kept"] == report["dev"]["questions"]
    assert json.loads((cfg.data.out_dir / "report.json").read_text()) == report
    table = pq.read_table(cfg.data.out_dir / "train")
    assert table.num_rows == train["rows"]
    y1, y2 = table.column("y1").to_numpy(), table.column("y2").to_numpy()
    assert table.num_rows > 0 and np.all((y2 - y1 >= 0) & (y2 - y1 < 2))  # answer limit 2


def test_prepare_with_no_usable_training_question_is_an_error(
        make_config: MakeConfig, synth_v1: SynthData) -> None:
    """Every question over the limit once gave a 0-row train.parquet and success."""
    cfg = make_config(synth_v1, data={"limits": {"question": 1}})
    with pytest.raises(InputError) as err:
        stages.prepare(cfg)
    assert err.value.file == str(synth_v1.train)
    assert "no usable training question" in err.value.what
    assert "question_too_long" in err.value.what
    assert not (cfg.data.out_dir / "train").exists()


def test_prepare_v2_keeps_unanswerable(make_config: MakeConfig, synth_v2: SynthData) -> None:
    cfg = make_config(synth_v2)
    report = stages.prepare(cfg)
    for splits, doc in ((("train", "heldout"), synth_v2.train_doc), (("dev",), synth_v2.dev_doc)):
        table = [r for split in splits
                 for r in pq.read_table(cfg.data.out_dir / split).to_pylist()]
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


@pytest.mark.parametrize("missing_vectors", ["unk", "train", "fixed"])
def test_training_words_without_a_vector(make_config: MakeConfig, prepared: Prepared,
                                         missing_vectors: str, tmp_path: Path) -> None:
    """unk: they read as OOV; train: ids 2 .. 1 + n, counted in meta.json; fixed: each its
    own frozen random row (the behaviour before data.missing_vectors)."""
    train_words, lacking = vectors_for_half(prepared, tmp_path / "vectors.txt")
    assert 0 < len(lacking) < len(train_words)
    cfg = make_config(prepared.data, data={"word_vectors": str(tmp_path / "vectors.txt"),
                                           "word_dim": 4, "missing_vectors": missing_vectors})
    stages.prepare(cfg)
    words = json.loads((cfg.data.out_dir / "vocab.json").read_text())["words"]
    meta = json.loads((cfg.data.out_dir / "meta.json").read_text())
    train_ids = {i for row in pq.read_table(cfg.data.out_dir / "train")
                 .column("context_word_ids").to_pylist() for i in row}
    n = meta["trained_words"]
    assert meta["missing_vectors"] == missing_vectors
    if missing_vectors == "unk":
        assert n == 0 and not lacking & set(words) and 1 in train_ids
    elif missing_vectors == "train":
        assert words[2 : 2 + n] == [w for w in train_words if w in lacking]  # count order
        assert not lacking & set(words[2 + n :]) and 1 not in train_ids
    else:
        assert n == 0 and set(train_words) <= set(words) and 1 not in train_ids
    emb = np.load(cfg.data.out_dir / "word_emb.npy")
    for w in set(words[2:]) - lacking:  # every word that stays frozen has its vector
        assert emb[words.index(w)].tolist()[1:3] == [1, 2]


def test_prepares_key_says_what_changed_and_nothing_when_current(
        prepared: Prepared, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """prepare's key (its row's: fingerprints.of_stage) is kept in meta.json: the flow skips prepare
    when it is current and names what changed otherwise: an input, a setting, the code."""
    import shutil

    from rcpipe import fingerprints

    cfg = prepared.cfg
    meta = json.loads((prepared.out_dir / "meta.json").read_text())
    assert meta["fingerprint"] == fingerprints.of_stage(cfg, "prepare").as_dict()
    assert stages.prepared_changes(cfg) is None
    # how prepare runs (its workers) is not what it makes
    assert stages.prepared_changes(cfg.model_copy(update={"data": cfg.data.model_copy(
        update={"workers": 7})})) is None
    copy = tmp_path / "train.json"  # the same text in another file, newer: the same input
    shutil.copy(cfg.data.train_file, copy)
    moved = cfg.model_copy(update={"data": cfg.data.model_copy(
        update={"train_file": str(copy)})})
    assert stages.prepared_changes(moved) is None
    copy.write_text(copy.read_text().replace('"title": "', '"title": "x', 1))  # another text
    assert stages.prepared_changes(moved) == "data changed (data.train_file)"
    rarer = cfg.model_copy(update={"data": cfg.data.model_copy(
        update={"min_word_count": cfg.data.min_word_count + 1})})
    assert stages.prepared_changes(rarer) == "settings changed (data.min_word_count 1 -> 2)"
    edited = {**fingerprints.code_of("prepare"), "rcpipe/data/vocab.py": "0" * 64}
    monkeypatch.setattr(fingerprints, "code_of", lambda name: edited)
    assert stages.prepared_changes(cfg) == "code changed (rcpipe/data/vocab.py)"


def test_prepare_bad_vectors_file(make_config: MakeConfig, synth_v1: SynthData,
                                  tmp_path: Path) -> None:
    glove = tmp_path / "vectors.txt"
    glove.write_text("the 1 2 3 4\nbroken 1 2\n")
    cfg = make_config(synth_v1, data={"word_vectors": str(glove), "word_dim": 4})
    with pytest.raises(InputError) as info:
        stages.prepare(cfg)
    assert (info.value.file, info.value.location) == (str(glove), "line 2")


# ---------------------------------------------------------------------- the held-out slice


def test_prepare_holds_out_training_articles_never_trained_on(prepared: Prepared) -> None:
    out = prepared.out_dir
    held = json.loads((out / "heldout.json").read_text())
    meta = json.loads((out / "meta.json").read_text())
    # 5% of 3 articles rounds to none: at least one goes held out
    assert meta["heldout"] == {"source": "heldout", "articles": 1,
                               "questions": len(questions_of(held))}
    assert prepared.report["heldout"]["questions"] == len(questions_of(held)) > 0
    held_ids = {q["id"] for q in questions_of(held)}
    train_ids = set(pq.read_table(out / "train").column("id").to_pylist())
    assert held_ids and not held_ids & train_ids
    assert set(pq.read_table(out / "heldout").column("id").to_pylist()) == held_ids
    assert train_ids | held_ids == {q["id"] for q in questions_of(prepared.data.train_doc)}
    assert held["data"][0] in prepared.data.train_doc["data"]


def test_the_heldout_slice_follows_its_seed(make_config: MakeConfig, synth_v1: SynthData,
                                            tmp_path: Path) -> None:
    def titles(seed: int, name: str) -> list[str]:
        cfg = make_config(synth_v1, data={"out_dir": str(tmp_path / name),
                                          "heldout": {"seed": seed, "fraction": 0.5}})
        stages.prepare(cfg)
        return [a["title"] for a in json.loads((tmp_path / name / "heldout.json").read_text())
                ["data"]]

    assert titles(0, "a") == titles(0, "b")
    assert any(titles(s, f"s{s}") != titles(0, "a") for s in (1, 2, 3))


def test_prepare_heldout_from_a_file_trains_every_article(
        make_config: MakeConfig, synth_v1: SynthData) -> None:
    cfg = make_config(synth_v1, data={"heldout": {"file": str(synth_v1.dev)}})
    report = stages.prepare(cfg)
    assert report["train"]["questions"] == len(questions_of(synth_v1.train_doc))
    meta = json.loads((cfg.data.out_dir / "meta.json").read_text())
    assert meta["heldout"]["source"] == f"file:{synth_v1.dev}"
    assert meta["heldout"]["questions"] == len(questions_of(synth_v1.dev_doc))


def test_prepare_with_nothing_held_out_leaves_no_stale_slice(
        make_config: MakeConfig, synth_v1: SynthData) -> None:
    stages.prepare(make_config(synth_v1))
    cfg = make_config(synth_v1, data={"heldout": {"fraction": 0}})
    report = stages.prepare(cfg)
    assert "heldout" not in report
    assert not (cfg.data.out_dir / "heldout").exists()
    assert not (cfg.data.out_dir / "heldout.json").exists()
    assert json.loads((cfg.data.out_dir / "meta.json").read_text())["heldout"] is None


def test_a_one_article_training_file_cannot_give_a_heldout_slice(
        make_config: MakeConfig, synth_v1: SynthData, tmp_path: Path) -> None:
    one = tmp_path / "one.json"
    one.write_text(json.dumps(synth_v1.train_doc | {"data": synth_v1.train_doc["data"][:1]}))
    cfg = make_config(synth_v1, data={"train_file": str(one)})
    with pytest.raises(InputError) as info:
        stages.prepare(cfg)
    assert info.value.location == "data.heldout.fraction"
    assert "at least 2 articles, the file has 1" in str(info.value)
    assert "data.heldout.fraction=0" in str(info.value)


# ------------------------------------------------------- prepare streams: the same output


def one_pass_build(cfg: Config) -> dict[str, Any]:
    """What prepare made before it read an article at a time (commit 508e4c1), for data
    without word vectors: each file read whole, every split's texts tokenized in one call,
    each split's table built at once; its tables, vocabulary, report and heldout.json."""
    from rcpipe.data import features as F
    from rcpipe.data.heldout import heldout_articles
    from rcpipe.data.squad import parse_squad
    from rcpipe.data.vocab import build_vocab, build_word_vocab
    from rcpipe.stages.data import WINDOW_COUNTS

    d, h = cfg.data, cfg.data.heldout
    train_doc, dev_doc = (json.loads(Path(f).read_text()) for f in (d.train_file, d.dev_file))
    if h.file:
        held_doc = json.loads(Path(h.file).read_text())
    else:  # the held-out articles out of the training file, both in the file's order
        held = set(heldout_articles([a.get("title", "") for a in train_doc["data"]],
                                    h.fraction, h.seed))
        rest = {k: v for k, v in train_doc.items() if k != "data"}
        held_doc = rest | {"data": [a for i, a in enumerate(train_doc["data"]) if i in held]}
        train_doc = rest | {"data": [a for i, a in enumerate(train_doc["data"])
                                     if i not in held]}
    sq = {name: parse_squad(doc, name) for name, doc in
          (("train", train_doc), ("dev", dev_doc), ("heldout", held_doc))}
    toks = {name: (tokenize(s.contexts, quiet=True),
                   tokenize([q.question for q in s.questions], quiet=True))
            for name, s in sq.items()}
    kept, dropped, windows = F.label_train(sq["train"], *toks["train"], d)
    rows = {"train": kept, **{name: F.label_dev(sq[name], toks[name][0], d)
                              for name in ("dev", "heldout")}}
    word_counts, char_counts = F.count_words(sq["train"], *toks["train"])
    words = build_word_vocab(word_counts, d.min_word_count, None)[0]
    chars = build_vocab(char_counts, d.min_char_count)
    indexer = F.Indexer(words, chars, d.limits.char)
    n = len(sq["heldout"].questions)
    return {
        "tables": {name: F.build_table(sq[name], *toks[name], rows[name], indexer)
                   for name in sq},
        "vocab.json": {"words": words.items, "chars": chars.items},
        "report.json": {
            "train": {"questions": len(sq["train"].questions),
                      "kept": len({r.index for r in kept}),
                      "dropped": dict(sorted(dropped.items())), "rows": len(kept),
                      "windows": {k: windows[k] for k in WINDOW_COUNTS}},
            "dev": {"questions": len(sq["dev"].questions), "kept": len(rows["dev"]),
                    "dropped": {}},
            "heldout": {"questions": n, "kept": n, "dropped": {}}},
        "heldout.json": (json.dumps(held_doc, indent=1, ensure_ascii=False) + "\n").encode(),
    }


ONE_PASS_CASES = {
    "v1.1": ("1", {}),
    # v2.0, windows (no-answer rows) and drops, half the articles held out
    "v2.0 windows": ("2", {"limits": {"para": 60, "question": 10, "answer": 4},
                           "heldout": {"fraction": 0.5, "seed": 3}}),
    "held-out file": ("1", {"heldout": {"file": "dev"}}),
}


@pytest.mark.parametrize("case", list(ONE_PASS_CASES))
def test_prepare_writes_what_the_one_pass_build_wrote(
        make_config: MakeConfig, synth_v1: SynthData, synth_v2: SynthData, case: str) -> None:
    """Row for row: the same rows in the same order in each split, the same vocab.json,
    report.json and heldout.json, read an article at a time or each file whole."""
    version, data = ONE_PASS_CASES[case]
    synth_data = synth_v1 if version == "1" else synth_v2
    if data.get("heldout", {}).get("file") == "dev":
        data = {"heldout": {"file": str(synth_data.dev)}}
    cfg = make_config(synth_data, data={**data, "shards": {"group_rows": 7}})
    stages.prepare(cfg)
    out, want = cfg.data.out_dir, one_pass_build(cfg)
    for split, table in want["tables"].items():
        got = pq.read_table(out / split)
        assert got.num_rows == table.num_rows > 0, split
        assert got.to_pylist() == table.to_pylist(), split
    assert json.loads((out / "vocab.json").read_text()) == want["vocab.json"]
    assert json.loads((out / "report.json").read_text()) == want["report.json"]
    assert (out / "heldout.json").read_bytes() == want["heldout.json"]
    if case == "v2.0 windows":  # the case reaches what it is for
        report = want["report.json"]["train"]
        assert report["dropped"] and report["windows"]["no_answer"] > 0


# the output of prepare before it streamed (commit 508e4c1, the one-pass build), on the
# session's synth_v1 and synth_v2 (their sha256 below): each split's rows (sha256 of their
# JSON), vocab.json, report.json, heldout.json and word_emb.npy (sha256 of the file), the
# first 16 hex digits each. Made by running that commit's `stages.prepare` on each case.
FROZEN_INPUTS = {
    "1": {"train": "63f2b141ba28fa13", "dev": "499e9a2454fa56a2"},
    "2": {"train": "5d8c88833365e412", "dev": "335403d17a35b763"},
}
FROZEN = {
    "v1.1": ("1", {}, {
        "train": "309c82ab6cd1f10f", "dev": "f3eab5d040bc3275", "heldout": "b9e010697698dfe8",
        "vocab.json": "89a571f7b3a3b936", "report.json": "0e78a73e6823df7c",
        "heldout.json": "a7d2b10ebd84cd04"}),
    "v2.0 windows": ("2", ONE_PASS_CASES["v2.0 windows"][1], {
        "train": "28e2399c84defc3f", "dev": "f3c41f1d1db2c092", "heldout": "e5b2ff42d99599ce",
        "vocab.json": "3f68e2458b81d2ad", "report.json": "8f063247efd5a2a0",
        "heldout.json": "36128740142324e7"}),
    "held-out file": ("1", {"heldout": {"file": "dev"}}, {
        "train": "df22edc474ce3306", "dev": "1a7a1c230ea408be", "heldout": "1a7a1c230ea408be",
        "vocab.json": "d3d19d6c0793a055", "report.json": "74ba63415d1d56ff",
        "heldout.json": "e6885e83a65e4991"}),
    "v2.0 vectors": ("2", {"word_vectors": "vectors", "word_dim": 4,
                           "missing_vectors": "train"}, {
        "train": "9eb835d2461f0d25", "dev": "cc45602a5898a170", "heldout": "318382449915815f",
        "vocab.json": "959254ea88fe97b1", "report.json": "0e78a73e6823df7c",
        "heldout.json": "2865f31385b627ab", "word_emb.npy": "4c1e79c51d49c6f4"}),
}


def _short_sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()[:16]


def digests(out: Path) -> dict[str, str]:
    """FROZEN's digests of a prepared folder."""
    found = {split: _short_sha(json.dumps(pq.read_table(out / split).to_pylist(),
                                          sort_keys=True).encode())
             for split in ("train", "dev", "heldout") if (out / split).is_dir()}
    return found | {name: _short_sha((out / name).read_bytes()) for name in
                    ("vocab.json", "report.json", "heldout.json", "word_emb.npy")
                    if (out / name).is_file()}


@pytest.mark.parametrize("case", list(FROZEN))
def test_prepare_writes_what_prepare_wrote_before_it_streamed(
        make_config: MakeConfig, synth_v1: SynthData, synth_v2: SynthData, tmp_path: Path,
        case: str) -> None:
    version, data, frozen = FROZEN[case]
    synth_data = synth_v1 if version == "1" else synth_v2
    inputs = {split: _short_sha(getattr(synth_data, split).read_bytes())
              for split in ("train", "dev")}
    assert inputs == FROZEN_INPUTS[version], (
        "the session's synthetic data changed (tests/conftest.py or rcpipe/data/synth.py): "
        "these digests are of the old files; test_prepare_writes_what_the_one_pass_build_"
        "wrote still compares prepare with the one-pass build")
    if data.get("heldout", {}).get("file") == "dev":
        data = {"heldout": {"file": str(synth_data.dev)}}
    if data.get("word_vectors") == "vectors":
        vectors = tmp_path / "vectors.txt"
        vectors.write_text("".join(f"{w} {i % 7} 1 2 {i % 3}\n" for i, w in enumerate(
            ["the", "The", "of", "in", "is", "was", "a", "and", "river", "city", "zzz"])))
        data = {**data, "word_vectors": str(vectors)}
    cfg = make_config(synth_data, data=data)
    stages.prepare(cfg)
    assert digests(cfg.data.out_dir) == frozen


def _as_json_lines(doc: dict[str, Any], path: Path) -> Path:
    """``doc`` as JSON Lines: its version on the first line, then an article a line."""
    lines = [json.dumps({"version": doc["version"]}), *(json.dumps(a) for a in doc["data"])]
    data = ("\n".join(lines) + "\n").encode()
    path.write_bytes(gzip.compress(data) if path.suffix == ".gz" else data)
    return path


@pytest.mark.parametrize("name", ["train.jsonl", "train.jsonl.gz"])
def test_json_lines_prepare_as_the_json_file(make_config: MakeConfig, synth_v2: SynthData,
                                             tmp_path: Path, name: str) -> None:
    lines = _as_json_lines(synth_v2.train_doc, tmp_path / name)
    cfg = make_config(synth_v2, data={"out_dir": str(tmp_path / "json")})
    stages.prepare(cfg)
    cfg_lines = make_config(synth_v2, data={"train_file": str(lines),
                                            "out_dir": str(tmp_path / "lines")})
    stages.prepare(cfg_lines)
    assert prepared_files(tmp_path / "lines") == prepared_files(tmp_path / "json")


def test_json_lines_dev_file_is_refused(make_config: MakeConfig, synth_v1: SynthData,
                                        tmp_path: Path) -> None:
    dev = _as_json_lines(synth_v1.dev_doc, tmp_path / "dev.jsonl")
    cfg = make_config(synth_v1, data={"dev_file": str(dev)})
    with pytest.raises(InputError) as info:
        stages.prepare(cfg)
    assert info.value.location == "data.dev_file" and "not JSON Lines" in info.value.what


# -------------------------------------------------------------------- the token cache


def test_a_second_prepare_tokenizes_only_the_new_articles(
        make_config: MakeConfig, synth_v1: SynthData, tmp_path: Path,
        caplog: pytest.LogCaptureFixture) -> None:
    """A night with one more article: only it is tokenized, the rest come from the cache,
    and what is written is what a prepare with no cache writes."""
    doc = synth_v1.train_doc
    (tmp_path / "train.json").write_text(json.dumps(doc | {"data": doc["data"][:-1]}))
    cache = {"cache_dir": str(tmp_path / "cache")}
    with caplog.at_level(logging.INFO, logger="rcpipe.stages.data"):
        stages.prepare(make_config(synth_v1, data={"train_file": str(tmp_path / "train.json"),
                                                   **cache}))
        (tmp_path / "train.json").write_text(json.dumps(doc))  # one more article
        caplog.clear()
        stages.prepare(make_config(synth_v1, data={"train_file": str(tmp_path / "train.json"),
                                                   **cache}))
    n = len(doc["data"]) + len(synth_v1.dev_doc["data"])
    assert f"prepare: 1 articles tokenized, {n - 1} from the token cache" in caplog.messages
    stages.prepare(make_config(synth_v1, data={"out_dir": str(tmp_path / "cold"),
                                               "cache_dir": str(tmp_path / "cold-cache")}))
    assert prepared_files(tmp_path / "prepared") == prepared_files(tmp_path / "cold")


def test_a_corrupt_token_cache_entry_is_tokenized_again(
        make_config: MakeConfig, synth_v1: SynthData, tmp_path: Path,
        caplog: pytest.LogCaptureFixture) -> None:
    cfg = make_config(synth_v1)
    stages.prepare(cfg)
    before = prepared_files(cfg.data.out_dir)
    entries = sorted((cfg.data.cache_dir / "tokens").rglob("*.tok"))
    assert len(entries) == len(synth_v1.train_doc["data"]) + len(synth_v1.dev_doc["data"])
    data = bytearray(entries[0].read_bytes())
    data[-5] ^= 0xFF  # one token's end, its checksum now wrong
    entries[0].write_bytes(bytes(data))
    with caplog.at_level(logging.INFO):
        stages.prepare(cfg)
    said = [m for m in caplog.messages if str(entries[0]) in m]
    assert said and "its checksum does not match its content; tokenized again" in said[0]
    assert any("1 articles tokenized" in m and "(1 of its entries unreadable" in m
               for m in caplog.messages)
    assert prepared_files(cfg.data.out_dir) == before


# ---------------------------------------------------------------- bad input, nothing written


def test_prepare_stops_at_a_training_file_cut_mid_article(
        make_config: MakeConfig, synth_v1: SynthData, tmp_path: Path) -> None:
    text = synth_v1.train.read_text()
    cut = tmp_path / "cut.json"
    cut.write_text(text[: text.index(synth_v1.train_doc["data"][2]["title"]) + 40])
    cfg = make_config(synth_v1, data={"train_file": str(cut)})
    with pytest.raises(InputError) as info:
        stages.prepare(cfg)
    assert info.value.line() == f"error: {cut}: data[2]: not valid JSON (parse error: " \
                                "premature EOF)"
    assert not cfg.data.out_dir.exists() and not (cfg.data.cache_dir / "tokens").exists()


def test_prepare_stops_at_a_bad_json_lines_line(make_config: MakeConfig, synth_v1: SynthData,
                                                tmp_path: Path) -> None:
    path = _as_json_lines(synth_v1.train_doc, tmp_path / "train.jsonl")
    lines = path.read_text().splitlines()
    lines[2] = lines[2].replace('"context"', '"text"', 1)  # the second article's first
    path.write_text("\n".join(lines) + "\n")
    cfg = make_config(synth_v1, data={"train_file": str(path)})
    with pytest.raises(InputError) as info:
        stages.prepare(cfg)
    assert info.value.line() == f"error: {path}: line 3: paragraphs[0]: missing key 'context'"
    assert not cfg.data.out_dir.exists()


def test_limits_json_mb_caps_each_article_prepare_reads(make_config: MakeConfig,
                                                        synth_v1: SynthData,
                                                        tmp_path: Path) -> None:
    """A training file several times the cap prepares, each of its articles under it; an
    article over it is one located line."""
    doc = synth_v1.train_doc
    largest = max(len(json.dumps(a)) for a in doc["data"])
    cap = {"json_mb": 1.5 * largest / 1e6}
    assert synth_v1.train.stat().st_size > 2 * 1.5 * largest  # the file: over twice the cap
    assert stages.prepare(make_config(synth_v1, limits=cap))["train"]["kept"] > 0
    padded = tmp_path / "padded.json"  # a key prepare does not read, 3 times the largest
    padded.write_text(json.dumps(doc | {"data": [
        a | ({"notes": "x" * 3 * largest} if i == 2 else {}) for i, a in enumerate(doc["data"])]}))
    with pytest.raises(InputError) as info:
        stages.prepare(make_config(synth_v1, data={"train_file": str(padded)}, limits=cap))
    assert info.value.line() == f"error: {padded}: data[2]: an article over the cap of " \
        f"{reads.size_text(int(cap['json_mb'] * 1e6))} (limits.json_mb, each article)"


def test_ids_shared_with_dev_or_the_heldout_file_are_warned_of(
        make_config: MakeConfig, synth_v1: SynthData, caplog: pytest.LogCaptureFixture) -> None:
    """Legitimate when measuring on a split of one file, worth a line: each training
    question whose id dev (or data.heldout.file) has too, counted by its id's hash."""
    train = str(synth_v1.train)
    cfg = make_config(synth_v1, data={"dev_file": train, "heldout": {"file": train}})
    with caplog.at_level(logging.WARNING):
        n = stages.prepare(cfg)["train"]["questions"]
    assert n == len(questions_of(synth_v1.train_doc))
    assert caplog.messages == [f"{n} dev question ids are also in the training file",
                               f"{n} held-out question ids are also in the training file"]
