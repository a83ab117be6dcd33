"""The ``limits`` section: caps on what rcpipe reads, and the params file's own cap."""

from __future__ import annotations

from pydantic import Field

from rcpipe import reads
from rcpipe.config.section import Section


class ReadLimits(Section):
    """Caps on what rcpipe reads (docs/guide/limits-and-errors.md): a file over its cap, a
    context over its length or a document nested too deep is one located error, found before
    it is read or parsed. A params file itself is held to PARAMS_BYTES (it cannot raise its
    own cap)."""

    # train-v2.0.json is 40 MB, dev 4 MB: the cap leaves room for a corpus ten times larger.
    # prepare streams its inputs (data/articles.py): a file of any size, no article held
    # past the cap (SQuAD's largest article is ~0.5 MB)
    json_mb: float = Field(reads.JSON_MB, gt=0, description="a JSON file rcpipe reads whole "
                           "(a .gz inflated): the dev file evaluate scores, predict's input, "
                           "predictions, n-best and probability files, vocab.json, a "
                           "package's config; a SQuAD file prepare reads an article at a "
                           "time (JSON or JSON Lines): each article (JSON Lines: each line)")
    # the papers' models with 300-d vectors over SQuAD's words are ~120 MB of fp32
    weights_mb: float = Field(4096, gt=0, description="a package's model.safetensors and a "
                              "model file (models/<variant>/model.pt)")
    parameters: int = Field(1_000_000_000, gt=0, description="a model a package or model "
                            "file describes is refused above this many weights, counted "
                            "before any is allocated")
    # 20,000 tokens (data.window.max_tokens) of English are ~120,000 characters
    context_chars: int = Field(1_000_000, gt=0, description="one context of predict "
                               "(--context, --context-file, each of --input's), refused "
                               "before it is tokenized")
    depth: int = Field(reads.DEPTH, gt=0, description="JSON and YAML nesting (SQuAD nests 7 deep)")
    # GloVe 840B (300-d) is 5.6 GB of text; its zip 2 GB
    vectors_mb: float = Field(8000, gt=0, description="data.word_vectors once inflated (a "
                              ".zip's or .gz's text, as read: an archive's sizes may lie)")
    download_idle_seconds: float = Field(60, gt=0, description="a download that receives "
                                         "nothing this long (connecting, waiting for its "
                                         "answer or its next byte) is left")
    download_minutes: float = Field(120, gt=0, description="a download's deadline, its "
                                    "retries included: a server that trickles is left")

    # a champion record is ~3 KB; every replica reads it every serve.champion_poll_s
    record_kb: float = Field(256, gt=0, description="the DVC remote's champion record "
                             "(rcpipe/champion.json) and each of its history entries, read "
                             "by `rcpipe version --promote`, `rcpipe champion` and every "
                             "champion app replica on each poll")

    def json_bytes(self) -> int:
        return int(self.json_mb * reads.MB)

    def vectors_bytes(self) -> int:
        return int(self.vectors_mb * reads.MB)

    def record_bytes(self) -> int:
        return int(self.record_kb * 1024)

    def weights_bytes(self) -> int:
        return int(self.weights_mb * reads.MB)


PARAMS_BYTES = 1_000_000  # a params file (params.yaml's 12 KB, or a tune layer's 1 KB)
