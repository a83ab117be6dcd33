"""rcpipe.stages.data: synth, and prepare (report, determinism, v2.0, word vectors)."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pyarrow.parquet as pq
import pytest

from rcpipe import stages
from rcpipe.config import Config, load_config
from rcpipe.data.squad import load_squad
from rcpipe.data.tokenize import tokenize
from rcpipe.errors import InputError
from tests.conftest import Prepared, SynthData, questions_of, vectors_for_half

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
