"""The ``data`` section: where SQuAD comes from, how it is prepared, the length limits and
the windows a long context is read as."""

from __future__ import annotations

from pathlib import Path
from typing import Literal

from pydantic import Field, field_validator, model_validator

from rcpipe.config.section import Section, usable_cpus


class Limits(Section):
    """Length limits, in tokens, applied to the training split only (dev keeps everything)."""

    para: int = Field(400, gt=0, description="context tokens")
    question: int = Field(50, gt=0, description="question tokens")
    answer: int = Field(30, gt=0, description="answer tokens")
    char: int = Field(16, gt=0, description="characters kept per word")


class Heldout(Section):
    """Training questions held out to choose the v2.0 no-answer threshold and rank
    checkpoints on (never on dev, which reports): a seeded share of the training file's
    articles, never trained on, or a SQuAD file of the user's."""

    fraction: float = Field(0.05, ge=0, lt=1, description="share of the training articles "
                            "held out (at least one when there are two or more); 0: none")
    seed: int = Field(0, description="which articles: the same seed, the same slice")
    # SQuAD's 5% is ~4,400 questions, the demo's 250: the cap bounds what every checkpoint
    # is scored on, and what a worker holds for it, as a training file grows to millions
    max_questions: int | None = Field(10_000, gt=0, description="hold out no more of the "
                                      "drawn articles than hold this many questions (the "
                                      "first drawn always); None: the fraction alone")
    file: str | None = Field(None, description="a SQuAD JSON or JSON Lines (path, URL, "
                             "s3://) held out instead of a slice: then every training "
                             "article trains")


class Window(Section):
    """A context longer than a model reads at once is read as overlapping windows.

    Answering (evaluate, predict, serve, explain): windows of ``length`` tokens, ``stride``
    apart, the last one ending at the context's end; each window is answered and the best
    span across them is the answer (docs/guide/long-documents.md). Training (prepare):
    a context over data.limits.para is windows of that many tokens, ``train_stride`` apart.
    An answer of k tokens cut by a window's end is whole in the next window when the
    windows share at least 2k - 1 tokens.
    """

    # 1,000: the papers' test-time limit (QANet's code; the old train.dev_para_limit), so
    # no SQuAD paragraph is read differently from before windows
    length: int = Field(1000, gt=0, description="answering: context tokens a model reads "
                        "at once; a longer context is read as windows of this many")
    # half the window: every token but the first and last 250 is read twice, and the
    # window it is answered from has at least 250 tokens of context on each side of it
    stride: int = Field(500, gt=0, description="answering: tokens from one window's start "
                        "to the next's (each shares length - stride with the next)")
    train_stride: int | None = Field(None, gt=0, description="training: tokens from one "
                                     "window's start to the next's in a context over "
                                     "data.limits.para; None: half of data.limits.para")
    max_tokens: int = Field(20_000, gt=0, description="predict and serve refuse a context "
                            "over this many tokens with one error (never a cut): it bounds "
                            "what a request costs (20,000 tokens: 39 windows at 1,000/500)")

    @model_validator(mode="after")
    def _windows_overlap(self) -> Window:
        if self.stride >= self.length:
            raise ValueError(f"stride {self.stride} must be below length {self.length}: "
                             "windows that do not overlap cut answers in two")
        return self


class Shards(Section):
    """How prepare cuts a split into Parquet (data/shards.py): files of at most
    ``file_rows`` rows, each in row groups of ``group_rows``. A row group is what a reader
    holds and what a training stream hands a rank; a file what one writer makes."""

    # ~5 KB a row in memory: 1,024 rows a group is ~5 MB read at once, a few MB on disk
    group_rows: int = Field(1024, gt=0, description="rows a row group holds: the unit a "
                            "training stream permutes and a rank reads")
    # ~100 row groups a file: files of tens of MB, as many as S3 and DVC move well
    file_rows: int = Field(100_000, gt=0, description="rows a part file holds at most")


class DataConfig(Section):
    train_file: str = Field(description="SQuAD JSON (.json, .json.gz) or JSON Lines, an "
                            "article a line (.jsonl, .jsonl.gz): path, http(s) URL or s3:// "
                            "URI; read an article at a time")
    dev_file: str = Field(description="SQuAD JSON scored by evaluate; never filtered")
    out_dir: Path = Field(Path("data/prepared"), description="Parquet, vocab and report.json")
    cache_dir: Path = Field(Path("data/cache"), description="downloads, keyed by URL, and "
                            "each article's tokens (tokens/: a prepare tokenizes only the "
                            "articles it has not seen)")
    word_vectors: str | None = Field(
        None, description="GloVe-format text (.txt/.txt.gz/.zip); None: trainable vectors"
    )
    word_dim: int = Field(300, gt=0, le=8192, description="word vector size (must match "
                          "word_vectors)")
    min_word_count: int = Field(1, ge=1, description="training count a word needs for the vocab")
    # unk by default: the QANet paper's, and the one setting under which the model's
    # trainable OOV vector learns. Each training occurrence of a word the vectors lack
    # trains it, and it is what a dev or served word outside the vocabulary gets, so
    # unknown words look the same in training and at test time. train (BiDAF's code) keeps
    # each such word's identity at the cost of a row per word; fixed is the behaviour
    # before the setting existed (prepared data and models from then match it).
    missing_vectors: Literal["unk", "train", "fixed"] = Field(
        "unk", description="with word_vectors, training words they lack: unk = out of "
        "vocabulary (the trainable OOV vector, QANet); train = a trainable row each, "
        "beside the frozen vectors; fixed = a frozen random row each. Without "
        "word_vectors every word trains anyway")
    min_char_count: int = Field(1, ge=1, description="training count a char needs for the vocab")
    answer_search_window: int = Field(
        64, ge=0, description="chars around answer_start searched for a misplaced answer text"
    )
    limits: Limits = Limits()
    heldout: Heldout = Heldout()
    window: Window = Window()
    shards: Shards = Shards()
    workers: int = Field(2, ge=1, description="tokenizer processes (nlp.pipe n_process), at "
                         "most the CPUs this machine gives the process")
    on_ray: bool = Field(False, description="prepare tokenizes and labels as Ray tasks over "
                         "the nodes of train.ray_address's cluster (RAY_ADDRESS's; a local Ray "
                         "without either) instead of data.workers processes here; the output "
                         "is the same row for row")
    sha256: dict[str, str] = Field(
        default_factory=dict, description="source URI -> sha256 of its content: `rcpipe "
        "fetch` refuses a file that does not match (the official files' digests pinned)")

    @field_validator("workers")
    @classmethod
    def _workers_fit(cls, v: int) -> int:
        # each is a process with its own spaCy pipeline: 12 on 2 cores only contend
        if v > (cpus := usable_cpus()):
            raise ValueError(f"{v:,} tokenizer processes, over the {cpus} CPUs this machine "
                             "gives rcpipe")
        return v

    @model_validator(mode="after")
    def _training_windows_overlap(self) -> DataConfig:
        if self.window.train_stride is not None and \
                self.window.train_stride >= self.limits.para:
            raise ValueError(f"window.train_stride {self.window.train_stride} must be below "
                             f"limits.para {self.limits.para}: training windows must overlap")
        return self

    def train_window(self) -> tuple[int, int]:
        """(length, stride) of the windows a training context over limits.para becomes."""
        return self.limits.para, self.window.train_stride or max(1, self.limits.para // 2)
