"""Raw text -> model inputs, built by the very code `rcpipe prepare` uses for the dev split.

`rcpipe predict`, `rcpipe serve` and `rcpipe explain` all turn (context, question) text into
a batch here: spaCy's blank English tokenizer with the same character offsets
(data/tokenize.py), the prepared vocab.json through the same Indexer, the same Arrow schema
(data/features.py) and the same padded batches (data/dataset.py). So a question typed into
the web page becomes exactly the ids it would have as a row of the dev split, and a model
answers it as `rcpipe evaluate` would.

    encoder = TextEncoder.from_vocab(json.loads(vocab_json), char_limit)  # vocab.json's content
    ds = encoder.pairs([(context, question)])  # a SquadDataset, one row per pair
    batch = ds.collate([0])  # a Batch: what model(batch) takes
    token_spans(ds, 0)  # each context token's (start, end) characters, as the model saw it

No file I/O: the caller reads vocab.json (rcpipe/stages/predict.py does).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from rcpipe.config import DataConfig
from rcpipe.data.dataset import SquadDataset
from rcpipe.data.features import Indexer, build_table, label_dev
from rcpipe.data.squad import Question, SquadFile
from rcpipe.data.tokenize import tokenize
from rcpipe.data.vocab import Vocab


@dataclass(frozen=True)
class TextEncoder:
    """The prepared vocabularies and char limit; encodes raw text as prepare does."""

    words: Vocab
    chars: Vocab
    char_limit: int = 16
    indexer: Indexer = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "indexer", Indexer(self.words, self.chars, self.char_limit))

    @classmethod
    def from_vocab(cls, vocab: dict[str, Any], char_limit: int = 16) -> TextEncoder:
        """From the content of <data.out_dir>/vocab.json ({"words": [...], "chars": [...]})."""
        return cls(Vocab(list(vocab["words"])), Vocab(list(vocab["chars"])), char_limit)

    def squad(self, sq: SquadFile, para_limit: int | None = None) -> SquadDataset:
        """Every question of a SQuAD file, one row each, as prepare encodes the dev split.

        Answers, where the file has them, become span labels exactly as in the dev split;
        ``para_limit`` cuts long contexts (None: whole; readers read a long one as windows).
        """
        texts = sq.contexts + [q.question for q in sq.questions]
        toks = tokenize(texts, quiet=True)
        ctx, qs = toks[: len(sq.contexts)], toks[len(sq.contexts) :]
        rows = label_dev(sq, ctx, _NO_SEARCH)
        return SquadDataset(build_table(sq, ctx, qs, rows, self.indexer), para_limit,
                            self.char_limit)

    def pairs(self, pairs: Sequence[tuple[str, str]], para_limit: int | None = None
              ) -> SquadDataset:
        """(context, question) pairs -> one row each, with ids "0", "1", ... in order."""
        return self.squad(squad_of_pairs(pairs), para_limit)


_NO_SEARCH = DataConfig(train_file="", dev_file="")  # label_dev reads answer_search_window


def token_spans(ds: SquadDataset, i: int) -> list[tuple[int, int]]:
    """Row i's context tokens as character spans [start, end), cut to the dataset's
    para_limit: position t of the model's start/end distributions is token t here."""
    n = int(ds.context_lengths()[i])
    return list(zip(ds.starts.row(i)[:n].tolist(), ds.ends.row(i)[:n].tolist(), strict=True))


def squad_of_pairs(pairs: Sequence[tuple[str, str]]) -> SquadFile:
    """A SquadFile holding one unanswered question per pair (question ids "0", "1", ...)."""
    contexts = [c for c, _ in pairs]
    questions = [Question(qid=str(i), question=q, context_index=i, answers=(),
                          is_impossible=False, plausible_answers=(), location=f"[{i}]")
                 for i, (_, q) in enumerate(pairs)]
    return SquadFile("request", "", contexts, [""] * len(contexts), questions)
