"""The champion gate's questions and answers, for `rcpipe version --promote`.

The gate set is ``version.gate_file`` (a SQuAD file) or else the held-out questions prepare
wrote (``<data.out_dir>/heldout.json``), never the dev set that reports. A run's models
answer it through the packages the run pushes (`rcpipe package`: the weights, vocabulary
and decoding a model is served with), the ensemble as `rcpipe ensemble` made it (its
ensemble.method: the majority vote of every variant's package in registry order, or the mean
of their distributions with the weights it chose on the held-out questions). The champion
answers the same questions: the answers its own night stored (``versions/<run>/gate.json``)
when the gate set is byte for byte the one it answered then, else its packages, downloaded
from the remote, answer the current set: new training data moves the held-out slice, and the two
sides must still answer the same questions. rcpipe.release.rules decides from the answers.
"""

from __future__ import annotations

import hashlib
import json
import logging
from collections.abc import Mapping
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from rcpipe import layout, reads
from rcpipe.config import VARIANTS, Config, ReadLimits, Window
from rcpipe.errors import InputError
from rcpipe.inference.combination import Combination
from rcpipe.release.rules import GateSet, Score
from rcpipe.variants import STUDENT

if TYPE_CHECKING:
    import torch

    from rcpipe.data.dataset import SquadDataset
    from rcpipe.data.squad import SquadFile
    from rcpipe.release.remote import Remote

log = logging.getLogger(__name__)
ENSEMBLE = layout.ENSEMBLE
ANSWERS = "gate.json"  # versions/<run>/gate.json: the gate set and every model's answers


@dataclass(frozen=True)
class Gate:
    """The gate set: its record, its SQuAD JSON (for scoring) and the questions parsed."""

    info: GateSet
    doc: dict[str, Any]
    squad: SquadFile
    window: Window  # data.window: a long context read as windows, as the service reads it
    limits: ReadLimits  # what a package answering it is read within


def gate_set(cfg: Config, dev_sha256: str) -> Gate:
    """``version.gate_file``, else the prepared held-out questions; a located InputError
    when there is none, when the file is not SQuAD, or when it is the dev set."""
    from rcpipe.data.prepared import Prepared
    from rcpipe.data.squad import fetch, parse_squad, read_json

    uri = cfg.version.gate_file
    if uri is not None:
        path, source = fetch(uri, cfg.data.cache_dir, limits=cfg.limits), "version.gate_file"
    else:
        found = Prepared.of(cfg).heldout()
        if found is None:
            raise InputError(cfg.source, "version.gate_file", "no gate set: prepare held no "
                             f"questions out in {cfg.data.out_dir} (data.heldout) and no "
                             "gate file is named; name a SQuAD file no model trains on")
        path, source, uri = found.doc, found.source, str(found.doc)
    # within limits.json_mb, a regular file: the digest is taken before it is parsed
    data = reads.read_bytes(path, cfg.limits.json_bytes(), "limits.json_mb", uri)
    digest = hashlib.sha256(data).hexdigest()
    if digest == dev_sha256:
        raise InputError(cfg.source, "version.gate_file", f"{uri} holds data.dev_file's "
                         "questions (the same sha256): the dev set reports and decides "
                         "nothing; name other questions")
    doc = read_json(path, uri, cfg.limits)
    squad = parse_squad(doc, uri)  # answers required: the gate scores them
    info = GateSet(source, uri, digest, len(squad.questions),
                   sum(1 for a in doc["data"] for p in a["paragraphs"] if p["qas"]))
    return Gate(info, doc, squad, cfg.data.window, cfg.limits)


def package_nbest(package: Path, gate: Gate, device: torch.device, token_probs: bool = False
                  ) -> tuple[dict[str, dict[str, Any]], SquadDataset, int]:
    """(qid -> {"text", "prob", "na_prob", ...}, the gate set as the package encoded it, its
    max answer length): the package answering the gate set as it serves (its vocabulary,
    decoding and no-answer threshold); ``token_probs``: with its start/end distributions."""
    from rcpipe.trained.package_dir import load_package
    from rcpipe.trained.reader import package_reader

    pkg = load_package(package, gate.limits)  # its own threshold: the run's, not the params'
    reader = package_reader(pkg, pkg.variant, device, pkg.na_threshold, gate.window)
    dataset = reader.encoder.squad(gate.squad)
    return reader.answer_dataset(dataset, pkg.variant, token_probs), dataset, \
        pkg.max_answer_len


def answers(packages: Mapping[str, Path], gate: Gate, device: torch.device,
            ensemble: Combination | None) -> dict[str, dict[str, str]]:
    """model -> (qid -> answer text) on the gate set: each variant's package, and with
    ``ensemble`` their ensemble as `rcpipe ensemble` made it (ensemble.method: the majority
    vote of all of them in registry order, or the mean of their distributions with its
    weights; prepare's tokenizer gives every package the same tokens); the student's
    package (`rcpipe distill`) answering alone, as one model."""
    from rcpipe.inference import distributions
    from rcpipe.inference.ensemble import majority_vote, mean_answers
    from rcpipe.inference.reading import Split

    mean = ensemble is not None and not ensemble.votes
    read = {v: package_nbest(packages[v], gate, device, mean) for v in VARIANTS
            if v in packages}
    dists = {v: distributions.split_off(n) for v, (n, _, _) in read.items()} if mean else {}
    found = {v: {q: a["text"] for q, a in n.items()} for v, (n, _, _) in read.items()}
    if ensemble is not None and not mean:
        found[ENSEMBLE] = {q: a["text"] for q, a in
                           majority_vote([n for n, _, _ in read.values()]).items()}
    elif ensemble is not None:
        names = list(read)
        chosen, weights = ensemble.members(names)
        if not chosen:
            raise InputError("ensemble", ensemble.method, "no member of the ensemble among "
                             f"the packages ({', '.join(names)})")
        _, dataset, max_len = read[names[chosen[0]]]
        mean_of = mean_answers([dists[names[i]] for i in chosen], weights,
                               Split(dataset, gate.doc), max_len, ensemble.na_threshold)
        found[ENSEMBLE] = {q: a["text"] for q, a in mean_of.items()}
    if STUDENT in packages:  # one model, as a variant: never a member of the ensemble
        nbest, _, _ = package_nbest(packages[STUDENT], gate, device, False)
        found[STUDENT] = {q: a["text"] for q, a in nbest.items()}
    return found


def gate_f1(gate: Gate, found: Mapping[str, Mapping[str, str]]) -> dict[str, float]:
    """Each model's official F1 on the gate set."""
    from rcpipe.scoring.metrics import score

    return {m: float(score(gate.doc, dict(a))["f1"]) for m, a in found.items()}


def store_answers(where: Remote, run: str, gate: Gate,
                  found: Mapping[str, Mapping[str, str]]) -> str:
    """The run's answers beside its record, for the nights it is the champion: their URL."""
    return where.write(json.dumps({"set": asdict(gate.info), "answers": found}).encode(),
                       "versions", run, ANSWERS)


def champion_answers(where: Remote, pointer: Mapping[str, Any], champion: Score, gate: Gate,
                     tmp: Path, device: torch.device) -> tuple[dict[str, str] | None, str]:
    """(the champion's answers on the gate set, how they were had), or (None, why not)."""
    try:
        stored = where.read_url(pointer["answers"]) if pointer.get("answers") else None
    except InputError as e:  # gone, or on another remote: its packages may still answer
        log.info(f"champion: its stored answers are out of reach ({e.line()[7:]})")
        stored = None
    if stored and stored.get("set", {}).get("sha256") == gate.info.sha256 and \
            champion.model in stored.get("answers", {}):
        return stored["answers"][champion.model], "its answers stored on this gate set"
    # another gate set (new training data moved the held-out slice): its packages answer
    packages = pointer.get("packages")
    if packages is None:  # a pointer from before the gate: its night's record lists them
        packages = (where.read_json("versions", champion.run, "version.json") or {}
                    ).get("packages", {})
    names = [v for v in VARIANTS if v in packages] if champion.model == ENSEMBLE \
        else [champion.model]
    missing = [v for v in names if not packages.get(v)]
    if not names or missing:
        return None, (f"no package of {', '.join(missing or ['its voters'])} on the remote "
                      "to answer the gate set with")
    try:
        how = Combination.parse(pointer.get("ensemble")) if champion.model == ENSEMBLE \
            else None
    except ValueError as e:
        return None, f"its champion.json's ensemble is not one ({e})"
    try:
        local = {v: where.download(packages[v], tmp / "champion" / v, gate.limits) for v in names}
        found = answers(local, gate, device, how)
    except InputError as e:
        return None, f"its package could not answer the gate set ({e.line()[7:]})"
    log.info(f"champion: {champion.model} (run {champion.run}) answered the gate set "
             f"{gate.info.line()} with its package(s)")
    return found[champion.model], "its package(s) answering this gate set"
