"""Data stages: synthetic SQuAD and preparation into Parquet."""

from __future__ import annotations

import logging
import os
import time
from collections import Counter
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path
from typing import TYPE_CHECKING, Any

from rcpipe.config import Config
from rcpipe.data.prepared import Prepared
from rcpipe.errors import InputError
from rcpipe.fingerprints import Fingerprint, of_stage
from rcpipe.locks import hold
from rcpipe.outputs import OutputSet, output_set

if TYPE_CHECKING:  # prepare's modules are imported when it runs: `rcpipe --help` needs none
    import pyarrow as pa

    from rcpipe.config import DataConfig
    from rcpipe.data.articles import Article, SquadWriter, Survey
    from rcpipe.data.features import Indexer
    from rcpipe.data.shards import SplitWriter
    from rcpipe.data.squad import SquadFile
    from rcpipe.data.token_cache import TokenCache, Tokenized
    from rcpipe.data.tokenize import Tokenizes

log = logging.getLogger(__name__)

# report.json's train "windows": questions whose context was over data.limits.para, the
# rows their windows gave (of which no_answer: v2.0's windows without the answer) and the
# windows left out (part of the answer; v1.1: none of it)
WINDOW_COUNTS = ("questions", "rows", "no_answer", "left_out")
# questions prepare labels and writes at once, a split's articles gathered to about this
# many (a row group's worth: shards.group_rows' default)
BATCH = 1024

# ------------------------------------------------------------------------------------ synth


def synth(cfg: Config) -> dict[str, Path]:
    """Write the synthetic train and dev files that data.train_file / data.dev_file name."""
    from rcpipe.data import synth as gen

    s = cfg.synth
    out = {}
    splits = (
        ("train", cfg.data.train_file, s.seed, s.train_articles),
        ("dev", cfg.data.dev_file, s.seed + 1_000_003, s.dev_articles),
    )
    for split, uri, _, _ in splits:  # both checked before either file is written
        if "://" in uri:
            raise InputError("params", f"data.{split}_file", "synth writes local files only")
    for split, uri, seed, articles in splits:
        doc = gen.generate(seed, articles, s.paragraphs_per_article, s.questions_per_paragraph,
                           version=s.version, unanswerable_fraction=s.unanswerable_fraction,
                           title_prefix=f"synth-{split}",
                           facts_per_paragraph=s.facts_per_paragraph)
        gen.write(doc, Path(uri))
        n = sum(len(p["qas"]) for a in doc["data"] for p in a["paragraphs"])
        log.info(f"synth: {split}: {n} questions (SQuAD v{s.version}) -> {uri}")
        out[split] = Path(uri)
    return out


# ---------------------------------------------------------------------------------- prepare


def prepared_changes(cfg: Config) -> str | None:
    """What differs between data.out_dir's prepared data and what preparing cfg's would make
    (its key, its row's `fingerprints.of_stage`, kept in meta.json), in one phrase; None: it is
    current."""
    out = Prepared.of(cfg)
    try:
        meta = out.meta()  # within cfg.limits, as every reader of it
    except (OSError, InputError):  # none, or not JSON: prepared anew
        return "nothing prepared"
    kept = meta.get("fingerprint") if isinstance(meta, dict) else None
    if not isinstance(kept, dict) or not out.report.is_file():
        return "nothing prepared with a key"
    return of_stage(cfg, "prepare").changes(Fingerprint.from_dict(kept))


def prepare(cfg: Config, wait: bool = False) -> dict[str, Any]:
    """SQuAD JSON -> Parquet splits, vocab.json, word_emb.npy (with vectors), report.json:
    one run at a time per data.out_dir (``wait``: for the one running), its files in place
    together or not at all."""
    out = cfg.data.out_dir
    with hold(out, f"{out} is being prepared", wait), output_set("prepare", [out]) as files:
        return _prepare(cfg, files)


def _prepare(cfg: Config, files: OutputSet) -> dict[str, Any]:
    """Four passes over the inputs, an article at a time, none of them held: (a) read and
    validate each file, keeping the titles (the held-out draw); (b) tokenize (each article's
    tokens kept in the token cache) and count the training words; (c) the vocabularies from
    the counts; (d) label, index and write each article's rows to its split."""
    from rcpipe.data.features import Indexer
    from rcpipe.data.token_cache import TokenCache

    d = cfg.data
    t0 = time.perf_counter()
    phases: dict[str, float] = {}  # seconds per phase, kept in meta.json

    def done(phase: str) -> None:
        phases[phase] = round(time.perf_counter() - t0 - sum(phases.values()), 3)

    cache = TokenCache(d.cache_dir / "tokens")
    out = Prepared(d.out_dir)
    with tokenizer_of(cfg) as tokenizer:  # its processes load spaCy as the files are read
        inputs = _read_inputs(cfg)
        done("read")
        counts = _count_words(cfg, inputs, cache, tokenizer)
        done("tokenize")
        words, chars, emb, hits, trained = _vocabularies(cfg, counts)
        done("vocab")
        rows = _Rows(cfg, inputs, cache, tokenizer, Indexer(words, chars, d.limits.char))
        written = _write_prepared(files, out, rows, words, chars, emb, d.shards)
    tally = rows.tally
    if not tally.rows["train"]:  # nothing to train on is the user's to know now, not later
        why = ", ".join(f"{n} {reason}" for reason, n in sorted(tally.dropped.items()))
        raise InputError(d.train_file, "", f"no usable training question "
                         f"({tally.questions['train']} read{': ' + why if why else ''}); "
                         "nothing was written")
    report = tally.report()
    files.write_json(out.report, report)
    done("write")
    seconds = time.perf_counter() - t0
    files.write_json(out.meta_file, {
        "train_file": d.train_file, "dev_file": d.dev_file,
        "version": {"train": inputs.train.version, "dev": inputs.dev.version},
        "words": len(words), "chars": len(chars), "char_limit": d.limits.char,
        "word_vectors": d.word_vectors, "word_dim": d.word_dim, "vectors_found": hits,
        # with vectors: what training words they lack became, and how many of those have
        # a trainable row (ids 2 .. 1 + trained_words; trained/model_file.py's prepared_inputs)
        "missing_vectors": d.missing_vectors if d.word_vectors else None,
        "trained_words": trained, "heldout": inputs.held.record(),
        "seconds": round(seconds, 2),
        "phases": phases, "fingerprint": of_stage(cfg, "prepare").as_dict(),
        "layout": Prepared.LAYOUT, "splits": written})
    # every file prepare writes is one set (rcpipe/outputs.py): an earlier run's file this one
    # did not write (no vectors: word_emb.npy; nothing held out: heldout/*; fewer parts; an
    # older layout's train.parquet) goes at the commit
    for path in out.files():
        files.remove(path)
    for split in Prepared.SPLITS:  # a split not written this time: its folder goes whole
        if split not in written:
            files.remove(out.split(split))
    tr, dv, windows = report["train"], report["dev"], tally.windows
    read_as = f", {windows['questions']} read as {windows['rows']} windows" \
        if windows["questions"] else ""
    log.info(
        f"prepare: train {tr['kept']}/{tr['questions']} kept{read_as} "
        f"({sum(tally.dropped.values())} dropped: {dict(tally.dropped) or 'none'}), "
        f"dev {dv['kept']}/{dv['questions']}; {inputs.held.described()}; vocab {len(words)} "
        f"words, {len(chars)} chars; {seconds:.1f}s -> {d.out_dir}"
    )
    return report


def tokenizer_of(cfg: Config) -> Any:
    """What passes (b) and (d) tokenize with (a context): Ray tasks over the cluster with
    data.on_ray, else data.workers processes here."""
    if cfg.data.on_ray:
        from rcpipe.cluster.jobs_api import is_jobs_api
        from rcpipe.cluster.tokenize_tasks import RayTokenizer

        address = cfg.train.ray_address or os.environ.get("RAY_ADDRESS")
        if is_jobs_api(address):  # a job's submitter, not a driver: ray.init takes no URL
            raise InputError(cfg.source, "data.on_ray", f"prepare joins the cluster as a "
                             f"driver, and {address} is a Jobs API: set train.ray_address "
                             "to the head's GCS address (head:6379) for prepare, or run it "
                             "on the head node")
        return RayTokenizer(cfg.train.ray_address)
    from rcpipe.data.tokenize import Tokenizer

    return Tokenizer(cfg.data.workers)


# ------------------------------------------------------------------- (a) the inputs, read


@dataclass(frozen=True)
class HeldOut:
    """The questions the no-answer threshold is chosen and checkpoints are ranked on: a
    seeded share of the training file's articles (``indices``), or a file's."""

    source: str | None  # "heldout" (a slice of train), "file:<path>" or None
    articles: int
    questions: int
    indices: frozenset[int] = frozenset()  # of the training file's articles (a slice)

    def record(self) -> dict[str, Any] | None:
        """meta.json's "heldout": where the held-out questions came from, how many."""
        if self.source is None:
            return None
        return {"source": self.source, "articles": self.articles, "questions": self.questions}

    def described(self) -> str:
        if self.source is None:
            return "nothing held out"
        where = "of train" if self.source == "heldout" else self.source
        return f"held out {self.articles} articles, {self.questions} questions ({where})"


@dataclass(frozen=True)
class Inputs:
    """The files prepare reads, each read through once (data/articles.py's Survey), and
    the held-out articles chosen."""

    train: Survey  # data.train_file's
    dev: Survey
    held_file: Survey | None  # data.heldout.file's, or None (a slice of train, or nothing)
    held: HeldOut

    def articles(self) -> Iterator[tuple[tuple[str, Article], SquadFile]]:
        """((split, Article), its SquadFile) of every article, file after file: train's
        (those held out to "heldout"), dev's, then the held-out file's."""
        for article, sq in self.train.source.files(self.train.version):
            split = "heldout" if article.index in self.held.indices else "train"
            yield (split, article), sq
        for article, sq in self.dev.source.files(self.dev.version):
            yield ("dev", article), sq
        if self.held_file is not None:
            for article, sq in self.held_file.source.files(self.held_file.version):
                yield ("heldout", article), sq

    @property
    def total(self) -> int:
        """Articles in all, for the progress bars."""
        return sum(s.articles for s in (self.train, self.dev, self.held_file) if s)


def _read_inputs(cfg: Config) -> Inputs:
    """Each input read through and validated (a located error stops prepare before anything
    is tokenized), and the held-out articles drawn from the training file's titles."""
    from rcpipe.data.articles import JSON_LINES, survey
    from rcpipe.data.heldout import heldout_articles
    from rcpipe.data.squad import fetch

    d, h = cfg.data, cfg.data.heldout
    if d.dev_file.endswith(JSON_LINES):  # evaluate and the official scorer read it whole
        raise InputError(cfg.source, "data.dev_file", f"{d.dev_file}: a SQuAD JSON file, "
                         "not JSON Lines: evaluate scores it as the official scorer reads it")

    def read(uri: str) -> Survey:
        return survey(fetch(uri, d.cache_dir, limits=cfg.limits), uri, cfg.limits)

    train, dev = read(d.train_file), read(d.dev_file)
    held_file = read(h.file) if h.file else None
    if held_file is not None:
        held = HeldOut(f"file:{h.file}", held_file.articles, held_file.questions)
    else:
        try:
            indices = frozenset(heldout_articles(train.titles, h.fraction, h.seed,
                                                 train.sizes, h.max_questions))
        except ValueError as e:
            raise InputError(cfg.source, "data.heldout.fraction", f"{e} ({d.train_file}); "
                             "set data.heldout.fraction=0 (then eval.na_threshold) or name "
                             "data.heldout.file") from None
        held = HeldOut("heldout" if indices else None, len(indices),
                       sum(train.sizes[i] for i in indices), indices)
    if held.source is not None and not held.questions:
        raise InputError(h.file or d.train_file, "", "the held-out articles have no "
                         "questions (data.heldout)")
    return Inputs(train, dev, held_file, held)


# ------------------------------------------------------------- (b) tokens and word counts


@dataclass
class Counts:
    """What pass (b) counts: the training split's words (each context once, each question
    once) and, with word vectors, every dev and held-out word (a vector admits it)."""

    words: Counter[str] = field(default_factory=Counter)
    candidates: set[str] = field(default_factory=set)
    overlap: Counter[str] = field(default_factory=Counter)  # training ids also in dev ...


def _count_words(cfg: Config, inputs: Inputs, cache: TokenCache, tokenizer: Tokenizes
                 ) -> Counts:
    """Pass (b): every article tokenized (or its tokens taken from the cache) and counted."""
    from rcpipe.console import progress
    from rcpipe.data.features import add_words
    from rcpipe.data.token_cache import tokenized

    d, counts = cfg.data, Counts()
    held = inputs.held.questions
    train = inputs.train.questions - (held if inputs.held_file is None else 0)
    log.info(f"prepare: tokenizing {train} train, {inputs.dev.questions} dev and {held} "
             f"held-out questions ({inputs.total} articles) on {tokenizer.described()}")
    others = {"dev": inputs.dev.ids}
    if inputs.held_file is not None:  # a slice of train shares none: a file's ids are unique
        others["held-out"] = inputs.held_file.ids
    with progress() as bar:
        task = bar.add_task("tokenize", total=inputs.total)
        for t in tokenized(inputs.articles(), cache, tokenizer):
            split, _ = t.item
            if split == "train":
                add_words(counts.words, t.contexts, t.questions)
                for name, ids in others.items():  # ids shared with dev or held out: warned of
                    counts.overlap[name] += sum(q.qid in ids for q in t.sq.questions)
            elif d.word_vectors:
                counts.candidates.update(w for tok in (*t.contexts, *t.questions)
                                         for w in tok.words)
            bar.advance(task)
    log.info(f"prepare: {cache.described()}")
    for name in others:  # legitimate when measuring on a split of one file; worth a warning
        if counts.overlap[name]:
            log.warning(f"{counts.overlap[name]} {name} question ids are also in the "
                        "training file")
    return counts


# ----------------------------------------------------------------- (c) the vocabularies

_MISSING = {"unk": "out of vocabulary, the trainable OOV vector stands for them",
            "train": "a trainable row each", "fixed": "a frozen random row each"}


def _vocabularies(cfg: Config, counts: Counts) -> tuple:
    """(words, chars, word vectors or None, words found in them, words trained alone): the
    training split's words and chars, plus any dev or held-out word the pretrained vectors
    know (it gets its vector); a training word they lack as data.missing_vectors says."""
    from rcpipe.data.features import char_counts
    from rcpipe.data.squad import fetch
    from rcpipe.data.vocab import (
        build_vocab,
        build_word_vocab,
        case_forms,
        embedding_matrix,
        read_vectors,
    )

    d, word_counts = cfg.data, counts.words
    vectored: set[str] | None = None
    if d.word_vectors:
        log.info(f"prepare: reading word vectors {d.word_vectors}")
        candidates = set(word_counts) | counts.candidates
        wanted = {f for w in candidates for f in case_forms(w)}
        vectors = read_vectors(fetch(d.word_vectors, d.cache_dir, limits=cfg.limits), wanted,
                               d.word_dim, d.word_vectors, cfg.limits.vectors_bytes())
        vectored = {w for w in candidates if any(f in vectors for f in case_forms(w))}
    words, trained = build_word_vocab(word_counts, d.min_word_count, vectored,
                                      d.missing_vectors)
    chars = build_vocab(char_counts(word_counts), d.min_char_count)
    if vectored is None:
        return words, chars, None, 0, 0
    lacking = sum(1 for w in word_counts if w not in vectored)
    log.info(f"prepare: {lacking} of {len(word_counts)} training words have no vector: "
             f"{_MISSING[d.missing_vectors]} (data.missing_vectors={d.missing_vectors})")
    # a trained word's row here is its trainable row's start (embeddings.WordEmbedding)
    emb, hits = embedding_matrix(words, vectors, d.word_dim)
    return words, chars, emb, hits, trained


# ------------------------------------------------------------ (d) each article's rows


@dataclass
class Tally:
    """report.json's counts, as the articles' rows are written: each split's questions, and
    the training split's drops (by reason) and windows."""

    questions: Counter[str] = field(default_factory=Counter)
    kept: Counter[str] = field(default_factory=Counter)  # questions with a row
    rows: Counter[str] = field(default_factory=Counter)
    dropped: Counter[str] = field(default_factory=Counter)
    windows: Counter[str] = field(default_factory=Counter)
    held_out: bool = False

    def report(self) -> dict[str, Any]:
        """report.json: each split's questions read, kept and dropped (with why), so
        ``questions == kept + sum(dropped)`` holds for every split."""
        report = {
            # kept counts questions; rows the Parquet's rows (a long context: a row a window)
            "train": {"questions": self.questions["train"], "kept": self.kept["train"],
                      "dropped": dict(sorted(self.dropped.items())),
                      "rows": self.rows["train"],
                      "windows": {k: self.windows[k] for k in WINDOW_COUNTS}},
            "dev": {"questions": self.questions["dev"], "kept": self.kept["dev"],
                    "dropped": {}},
        }
        if self.held_out:  # like dev, never dropped; meta.json says where from
            n = self.questions["heldout"]
            report["heldout"] = {"questions": n, "kept": n, "dropped": {}}
        return report


@dataclass
class Part:
    """A batch of one split's articles labelled and indexed: its rows, and report.json's
    counts of it."""

    table: pa.Table | None  # None: no question of the batch gave a row
    questions: int
    kept: int  # questions with a row
    rows: int
    dropped: Counter[str]
    windows: Counter[str]


def labelled(job: tuple[str, list[Tokenized]], cfg: DataConfig, indexer: Indexer) -> Part:
    """A split's batch of tokenized articles as rows: training's rules for train (its drops
    and windows counted), every question for dev and held out. Pure: pass (d) runs it here
    or, with data.on_ray, in a Ray task on any node."""
    from rcpipe.data import features as F
    from rcpipe.data.squad import joined

    split, batch = job
    sq = joined([t.sq for t in batch])
    ctx = [c for t in batch for c in t.contexts]  # sq's contexts' tokens, in order
    qs = [q for t in batch for q in t.questions]
    dropped, windows = Counter[str](), Counter[str]()
    if split == "train":
        rows, dropped, windows = F.label_train(sq, ctx, qs, cfg)
    else:
        rows = F.label_dev(sq, ctx, cfg)
    table = F.build_table(sq, ctx, qs, rows, indexer) if rows else None
    return Part(table, len(sq.questions), len({r.index for r in rows}), len(rows), dropped,
                windows)


class _Rows:
    """Pass (d): each article labelled (training's rules for train, every question for dev
    and held out), indexed and written to its split's writer; the held-out articles to
    heldout.json too."""

    def __init__(self, cfg: Config, inputs: Inputs, cache: TokenCache, tokenizer: Tokenizes,
                 indexer: Indexer) -> None:
        self.cfg, self.inputs, self.cache, self.tokenizer = cfg, inputs, cache, tokenizer
        self.indexer = indexer
        self.splits = ["train", "dev"] + (["heldout"] if inputs.held.source else [])
        self.tally = Tally(held_out=inputs.held.source is not None)

    def write(self, writers: dict[str, SplitWriter], doc: SquadWriter | None) -> None:
        """Every article through, its split's rows labelled and written a batch of articles
        at a time (Arrow's calls are paid a batch, not an article), each batch's part in
        order from the tokenizer (in this process, or Ray tasks with data.on_ray)."""
        from rcpipe.console import progress

        label = partial(labelled, cfg=self.cfg.data, indexer=self.indexer)
        with progress() as bar:
            task = bar.add_task("write", total=self.inputs.total)
            jobs = ((split, (split, batch))
                    for split, batch in self._batches(doc, lambda: bar.advance(task)))
            for split, part in self.tokenizer.mapped(jobs, label):
                self._add(split, part, writers[split])

    def _batches(self, doc: SquadWriter | None, advance: Callable[[], Any]
                 ) -> Iterator[tuple[str, list[Tokenized]]]:
        """(split, its batch of about BATCH questions' articles), in the inputs' order; the
        held-out articles into ``doc`` as they pass."""
        from rcpipe.data.token_cache import tokenized

        batches: dict[str, list[Tokenized]] = {split: [] for split in self.splits}
        waiting = Counter[str]()  # questions in each split's batch
        for t in tokenized(self.inputs.articles(), self.cache, self.tokenizer):
            split, article = t.item
            if split == "heldout":
                doc.add(article.raw)
            batches[split].append(t)
            waiting[split] += len(t.sq.questions)
            if waiting[split] >= BATCH:
                yield split, batches[split]
                batches[split], waiting[split] = [], 0
            advance()
        for split, batch in batches.items():
            if batch:
                yield split, batch

    def _add(self, split: str, part: Part, writer: SplitWriter) -> None:
        """A batch's part counted and its rows written."""
        tally = self.tally
        tally.dropped.update(part.dropped)
        tally.windows.update(part.windows)
        tally.questions[split] += part.questions
        tally.kept[split] += part.kept
        tally.rows[split] += part.rows
        if part.table is not None:
            writer.write(part.table)


def _write_prepared(files: OutputSet, out: Prepared, rows: _Rows, words: Any, chars: Any,
                    emb: Any, shards: Any) -> dict[str, Any]:
    """The splits as folders of Parquet parts (data/shards.py), written as pass (d) gives
    their rows, heldout.json beside the held-out split, vocab.json and (with pretrained
    vectors) word_emb.npy; each split's manifest entry, for meta.json."""
    import hashlib
    from contextlib import ExitStack

    import numpy as np

    from rcpipe.data.shards import SplitWriter

    vocab = files.json_bytes({"words": words.items, "chars": chars.items})
    files.write(out.vocab_file, vocab)
    digest = hashlib.sha256(vocab).hexdigest()  # Prepared.vocab_digest of the file
    with ExitStack() as stack:
        writers = {split: stack.enter_context(SplitWriter(
            lambda name, f=out.split(split): files.path(f / name), shards.file_rows,
            shards.group_rows, digest)) for split in rows.splits}
        doc = stack.enter_context(_heldout_doc(files, out, rows.inputs))
        rows.write(writers, doc)
        written = {split: writer.close() for split, writer in writers.items()}
    if emb is not None:
        np.save(files.path(out.word_emb), emb)
    return written


@contextmanager
def _heldout_doc(files: OutputSet, out: Prepared, inputs: Inputs
                 ) -> Iterator[SquadWriter | None]:
    """heldout.json, the held-out SQuAD JSON the official scorer reads, written beside the
    held-out split an article at a time (data/articles.py's SquadWriter): a slice keeps the
    training file's other entries ("version"), "data" last; a file is written as it is."""
    from rcpipe.data.articles import SquadWriter
    from rcpipe.safe_open import create_new

    if inputs.held.source is None:  # no held-out split: no article comes
        yield None
        return
    if inputs.held_file is not None:
        head = inputs.held_file.source.head
    else:
        head = {k: v for k, v in inputs.train.source.head.items() if k != "data"}
        head["data"] = None
    with os.fdopen(create_new(files.path(out.heldout_doc)), "wb") as f:
        doc = SquadWriter(f, head)
        yield doc
        doc.close()
        f.flush()
        os.fsync(f.fileno())  # as every file of the set (safe_open.write_new)
