"""The prepared directory (data.out_dir): what `rcpipe prepare` writes there and what every
other stage reads of it, in one place.

    train/, dev/                 the splits, a row per question (train: per window), each a
                                 folder of Parquet part files in row groups (data/shards.py)
    heldout/, heldout.json       the held-out questions, rows and SQuAD JSON (data/heldout.py
                                 chooses them), or neither when nothing is held out
    vocab.json                   {"words": [...], "chars": [...]}: a model's ids
    word_emb.npy                 the pretrained vectors' rows, only with data.word_vectors
    meta.json                    where it came from, versions, limits, "heldout", fingerprint,
                                 "layout" and "splits": each split's parts and row groups
    report.json                  the questions kept and dropped per split

`Prepared` is the only place these names are spelled; a model's package directory has its
own files (trained/package_dir.py), and a run's outputs theirs (layout.py).
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar

from rcpipe import reads
from rcpipe.config import ReadLimits
from rcpipe.errors import InputError
from rcpipe.outputs import settle

if TYPE_CHECKING:
    import numpy as np

    from rcpipe.config import Config
    from rcpipe.data.shards import Shards


@dataclass(frozen=True)
class PreparedHeldout:
    """Prepare's held-out questions (data/heldout.py chose them): the rows, their SQuAD
    JSON, where they came from."""

    parquet: Path
    doc: Path
    source: str  # "heldout" (a slice of train) or "file:<path>"


@dataclass(frozen=True)
class Prepared:
    """data.out_dir and its files; JSON read within ``limits`` (the params' defaults when a
    caller has no config)."""

    out_dir: Path
    limits: ReadLimits = field(default_factory=ReadLimits)

    SPLITS: ClassVar[dict[str, str]] = {"train": "train", "dev": "dev", "heldout": "heldout"}
    # meta.json's "layout": 2, the splits as folders of parts (data/shards.py); a folder
    # prepared before (one train.parquet a split) is refused with a line to prepare again
    LAYOUT: ClassVar[int] = 2
    OLD_FILES: ClassVar[tuple[str, ...]] = ("train.parquet", "dev.parquet", "heldout.parquet")
    HELDOUT_DOC: ClassVar[str] = "heldout.json"
    VOCAB: ClassVar[str] = "vocab.json"
    WORD_EMB: ClassVar[str] = "word_emb.npy"
    REPORT: ClassVar[str] = "report.json"
    META: ClassVar[str] = "meta.json"
    # every file prepare may write beside the split folders, in the order it lists them
    FILES: ClassVar[tuple[str, ...]] = (HELDOUT_DOC, VOCAB, WORD_EMB, REPORT, META)

    def __post_init__(self) -> None:
        # a set a killed prepare committed is moved into place before anything is read
        # (rcpipe/outputs.py): evaluate and train read train/ beside its vocab.json
        settle(self.out_dir)

    @classmethod
    def of(cls, cfg: Config) -> Prepared:
        """cfg's prepared directory (data.out_dir), read within cfg.limits."""
        return cls(Path(cfg.data.out_dir), cfg.limits)

    # -------------------------------------------------------------------------- the files

    def split(self, name: str) -> Path:
        """A split's folder of Parquet parts: "train", "dev" or "heldout"."""
        return self.out_dir / self.SPLITS[name]

    def shards(self, name: str) -> Shards:
        """A split's parts as meta.json's manifest records them (data/shards.py); a folder
        prepared before the layout, or none, is one line saying to prepare again."""
        from rcpipe.data.shards import AGAIN, Shards

        meta = self.meta_file
        if not meta.is_file():
            raise InputError(self.out_dir, "", f"nothing prepared here; {AGAIN}"
                             .replace("again", "first"))
        record = self.meta()
        if not isinstance(record, dict) or record.get("layout") != self.LAYOUT:
            raise InputError(meta, "layout", "prepared by an older rcpipe (one Parquet file "
                             f"a split; now a folder of parts a split): {AGAIN}")
        splits = record.get("splits")
        if not isinstance(splits, dict) or name not in splits:
            raise InputError(meta, f"splits.{name}", f"no {name} split prepared here")
        return Shards.from_manifest(self.split(name), splits[name], meta)

    def has(self, name: str) -> bool:
        """Whether meta.json records a split ``name`` (a held-out one may be absent)."""
        try:
            record = self.meta()
        except (OSError, InputError):
            return False
        return isinstance(record, dict) and record.get("layout") == self.LAYOUT \
            and name in (record.get("splits") or {})

    @property
    def train(self) -> Path:
        return self.split("train")

    @property
    def dev(self) -> Path:
        return self.split("dev")

    @property
    def heldout_parquet(self) -> Path:
        return self.split("heldout")

    @property
    def heldout_doc(self) -> Path:
        return self.out_dir / self.HELDOUT_DOC

    @property
    def vocab_file(self) -> Path:
        return self.out_dir / self.VOCAB

    @property
    def word_emb(self) -> Path:
        return self.out_dir / self.WORD_EMB

    @property
    def report(self) -> Path:
        return self.out_dir / self.REPORT

    @property
    def meta_file(self) -> Path:
        return self.out_dir / self.META

    def files(self) -> list[Path]:
        """Every file prepare may have written here, the split folders' parts and an older
        layout's splits among them (a run that writes fewer removes the rest)."""
        parts = [p for name in self.SPLITS.values() if (self.out_dir / name).is_dir()
                 for p in sorted((self.out_dir / name).iterdir())]
        return [self.out_dir / name for name in (*self.FILES, *self.OLD_FILES)] + parts

    # ---------------------------------------------------------------------- what they say

    def read(self, path: Path) -> Any:
        """A JSON file of this directory, read within ``limits``."""
        from rcpipe.data.squad import read_json

        return read_json(path, str(path), self.limits)

    def vocab(self) -> dict[str, Any]:
        return self.read(self.vocab_file)

    def meta(self) -> dict[str, Any]:
        return self.read(self.meta_file)

    def word_vectors(self) -> np.ndarray | None:
        """(words, word_dim) the pretrained vectors' rows, None when prepare had none."""
        import numpy as np

        return np.load(self.word_emb) if self.word_emb.is_file() else None

    def vocab_digest(self) -> str:
        """sha256 of vocab.json's bytes: a model file records the vocabulary it learnt."""
        data = reads.read_bytes(self.vocab_file, self.limits.json_bytes(), "limits.json_mb")
        return hashlib.sha256(data).hexdigest()

    def heldout(self) -> PreparedHeldout | None:
        """The held-out questions prepared here (meta.json's "heldout" says), or None when
        nothing was held out (data.heldout.fraction 0 and no file) or the data predates it."""
        try:
            record = reads.read_json(self.meta_file).get("heldout")
        except (InputError, AttributeError):
            return None
        if not record or not self.has("heldout"):
            return None
        return PreparedHeldout(self.heldout_parquet, self.heldout_doc, record["source"])

    # --------------------------------------------------------------- what training takes

    def job_fields(self) -> dict[str, str]:
        """What a training Job (train/worker.py) takes of the prepared data: train_path,
        dev_path (as strings: Ray pickles the Job; each rank reads them) and vocab_sha256."""
        return {"train_path": str(self.train), "dev_path": str(self.dev),
                "vocab_sha256": self.vocab_digest()}
