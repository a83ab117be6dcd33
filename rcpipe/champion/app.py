"""The champion app: the RayService's application (infra/kuberay/rayservice.yaml,
infra/serve/rcpipe.yaml), serving the champion that the DVC remote's champion record names
and following it from night to night (``Champion``), on the answer service's deployments
(rcpipe/serve/deployments.py), its models loaded as every answering command loads them
(trained/reader.py). No training code is imported.
"""

from __future__ import annotations

import logging
from functools import partial
from pathlib import Path
from typing import Any

from pydantic import Field, ValidationError, field_validator

from rcpipe.config import Config, load_config
from rcpipe.config.load import located
from rcpipe.config.section import Section, usable_cpus
from rcpipe.errors import InputError
from rcpipe.inference.combination import Combination
from rcpipe.trained.reader import load_reader, on_device

log = logging.getLogger(__name__)

def ensemble_of(pointer: dict[str, Any], source: str) -> Combination:
    """How champion.json (at ``source``) says its ensemble combines its voters (the vote
    when it does not say: a promotion from before ensemble.method); a malformed one is one
    located line."""
    try:
        return Combination.parse(pointer.get("ensemble"))
    except ValueError as e:
        raise InputError(source, "ensemble", str(e)) from None


CHAMPION = "champion"  # the name the champion app serves under, whichever night it is


class Champion:
    """In a Reader replica: the champion the DVC remote's champion record names
    (release/record.py: its "package"; an ensemble champion: its voters' "packages", whose
    answers this replica combines as `rcpipe ensemble` does), and ``update``, which the
    Reader calls every serve.champion_poll_s: a new entry's packages are downloaded, checked
    (config.json's sha256 against the entry's "package_sha256" or "packages_sha256", every
    other file against config.json's, trained/package_dir.py) and loaded while the old one
    answers, then swapped in between two batches. A record that cannot be read, or names a
    package without its pin, is refused (fail closed); a package that fails (missing, half
    written, changed) is tried again at each poll until it loads or another entry replaces
    it; either way the current champion goes on answering and the reason is logged once.
    Every answer, and /health, names the entry answering (``about``)."""

    def __init__(self, cfg: Config, workspace: str, remote: str | None, threads: int,
                 replica: bool = True) -> None:
        from rcpipe.release.remote import Remote

        self.cfg, self.threads = on_device(cfg, replica), threads
        self.where = Remote(Path(workspace), remote)
        self.url: str | None = None  # the key of the entry answering
        self._current: tuple[Any, dict[str, Any]] | None = None  # (answer, entry's name)
        self._said = ""  # the last refusal logged (a poll that fails alike says nothing)
        self.no_answer = False
        if not self.update():
            raise InputError(self.where.url + "/rcpipe/champion.json", "",
                             self._said or "no champion to serve (no night promoted yet)")

    def update(self) -> bool:
        """Load the champion the record names now if it is a new one; True if swapped."""
        from rcpipe.release import record

        try:
            head = record.read(self.where, self.cfg.limits)
        except InputError as e:
            self._say(f"the champion record is refused: {e.line()[7:]}")
            return False
        pointer = head.entry
        if pointer is None:
            return False
        url, voters = pointer.get("package"), dict(pointer.get("packages") or {})
        # an ensemble has no package of its own: its voters' packages are what answers
        key = f"#{head.seq} " + (url or " ".join(f"{v}={u}" for v, u in sorted(voters.items())))
        if key == self.url:
            return False
        try:
            if url:
                answer, no_answer, _ = self._load(url, pointer["package_sha256"])
            else:
                answer, no_answer = self._vote(voters, pointer["packages_sha256"],
                                               ensemble_of(pointer, self._record()))
        except InputError as e:
            self._say(f"champion {head.names()} refused, tried again at the next poll: "
                      f"{e.line()[7:]}")
            return False
        score = pointer["score"]
        name = {"seq": head.seq, "run": score["run"], "model": score["model"]}
        self._current, self.url, self.no_answer = (answer, name), key, no_answer
        self._said = ""
        log.info(f"champion {head.names()} answering ({key})")
        return True

    def _say(self, line: str) -> None:
        """A refusal, logged once while it stays the same (one line, not one a poll)."""
        if line != self._said:
            log.error(f"{line}; {self._night()} keeps answering")
        self._said = line

    def about(self) -> dict[str, Any] | None:
        """The record entry answering now: {seq, run, model} (/health shows it)."""
        return dict(self._current[1]) if self._current else None

    def _vote(self, voters: dict[str, str], sha256s: dict[str, str], how: Combination
              ) -> tuple[Any, bool]:
        """An ensemble champion: each voter's package loaded (``_load``), a pair's answer
        combined as `rcpipe ensemble` combined them (``how``: their majority vote, or the
        mean of their distributions with its weights, only the weighted voters loaded and
        asked); a context one voter refuses, all do (one limit)."""
        from rcpipe.inference.answer import averaged, voted

        names = how.voters(sorted(voters))
        if not names:
            raise InputError(self._record(), "ensemble",
                             f"weighs none of its voters ({', '.join(sorted(voters))})")
        weights = [how.weights[v] for v in names] if not how.votes else []
        loaded = [self._load(voters[v], sha256s[v]) for v in names]
        max_len = loaded[0][2]  # the packages' decoding

        def combined(pair: tuple[str, str], found: tuple[dict[str, Any], ...]
                     ) -> dict[str, Any]:
            if how.votes:
                return voted(list(found))
            return averaged(list(found), weights, pair[0], max_len, how.na_threshold)

        def answer(pairs: list[tuple[str, str]]) -> list[dict[str, Any]]:
            each = [voter(pairs) for voter, _, _ in loaded]  # (voters, pairs)
            return [next((a for a in found if "refused" in a), None) or combined(pair, found)
                    for pair, found in zip(pairs, zip(*each, strict=True), strict=True)]

        return answer, any(no_answer for _, no_answer, _ in loaded)

    def _record(self) -> str:
        return self.where.url + "/rcpipe/champion.json"

    def _night(self) -> str:
        if not self._current:
            return "nothing"
        return f"#{self._current[1]['seq']} (night {self._current[1]['run']})"

    def _load(self, url: str, config_sha256: str) -> tuple[Any, bool, int]:
        """A package from the remote, checked and loaded: (its answer function, whether it
        answers v2.0, the max answer length it decodes with)."""
        import shutil
        import tempfile

        from rcpipe.trained.package_dir import CONFIG, sha256

        tmp = Path(tempfile.mkdtemp(prefix="rcpipe-champion-"))
        try:
            self.where.download(url, tmp, self.cfg.limits)
            # an InputError, not FileNotFoundError: ``update`` logs it once and tries the
            # package again at each poll (its config.json may be on its way back)
            if not (tmp / CONFIG).is_file():
                raise InputError(f"{url}/{CONFIG}", "", "missing: the package cannot be "
                                 "checked against the record's pin")
            if sha256((tmp / CONFIG).read_bytes()) != config_sha256:
                raise InputError(url, CONFIG, "sha256 is not the record's pin")
            reader = load_reader(self.cfg, [str(tmp)], "torch", self.threads)
        finally:  # the model is in memory: its files are not read again
            shutil.rmtree(tmp, ignore_errors=True)
        name = str(tmp)

        def answer(pairs: list[tuple[str, str]]) -> list[dict[str, Any]]:
            return [{"refused": str(a)} if isinstance(a, Exception) else a
                    for a in reader.answer_pairs(pairs, name, token_probs=True)]

        return answer, reader.no_answer, reader.max_answer_len

    def __call__(self, pairs: list[tuple[str, str]]) -> list[dict[str, Any]]:
        assert self._current is not None, "a Champion is built with one"
        answer, name = self._current  # one champion for the whole batch
        return [a | {"night": name["run"], "champion": dict(name)} for a in answer(pairs)]


ARGS = "champion_app args"  # where a Serve config's args are at fault (its own file unknown)


class ChampionArgs(Section):
    """The Serve config's ``args`` of ``champion_app`` (infra/serve/rcpipe.yaml), checked as
    params are: unknown keys, types and bounds, one located line."""

    workspace: str = "."
    params: str = "params.yaml"
    set: tuple[str, ...] = ()
    remote: str | None = None
    threads: int = Field(1, ge=1, description="torch threads a Reader replica uses")

    @field_validator("threads")
    @classmethod
    def _threads_fit(cls, v: int) -> int:
        if v > (cpus := usable_cpus()):
            raise ValueError(f"{v:,} threads, over the {cpus} CPUs this machine gives rcpipe")
        return v

    @classmethod
    def of(cls, args: Any) -> ChampionArgs:
        if not isinstance(args, dict):
            raise InputError(ARGS, "", "expected a mapping")
        try:
            return cls.model_validate(args)
        except ValidationError as e:
            raise InputError(ARGS, *located(e)) from None


def champion_app(args: dict[str, Any]) -> Any:
    """The RayService's application (infra/kuberay/rayservice.yaml): the champion of the
    DVC remote that ``args["workspace"]``'s .dvc/config names (``args["remote"]``: another
    remote than the default), served as the model "champion" and followed: each Reader
    replica swaps in a newly promoted champion by itself (``Champion``), so a promotion
    needs no edit of the manifest and no redeploy. ``args["params"]``: the params file
    (its serve section, data.window), ``args["set"]``: dotted overrides laid over it as
    `--set` does (the Readers' CPUs, GPUs, autoscaling: infra/serve/rcpipe.yaml);
    ``args["threads"]``: torch threads a replica uses."""
    from rcpipe.serve.app import Limits
    from rcpipe.serve.deployments import Scaling
    from rcpipe.serve.deployments import application as bind

    a = ChampionArgs.of(args)
    cfg = load_config(a.params, list(a.set))
    workspace = str(Path(a.workspace).resolve())
    threads = a.threads
    # loaded here once first: no champion, or a broken one, fails the deploy with its reason
    first = Champion(cfg, workspace, a.remote, threads, replica=False)
    s = cfg.serve
    limits = Limits(max_batch=s.max_batch, max_wait_ms=s.batch_wait_ms, timeout_s=s.timeout_s,
                    max_pending=s.max_pending, body_timeout_s=s.body_timeout_s)
    load = partial(Champion, cfg, workspace, a.remote, threads)
    scaling = Scaling(replicas=s.replicas, replica_cpus=s.replica_cpus,
                      replica_gpus=s.replica_gpus,
                      autoscaling=None if s.autoscaling is None else s.autoscaling.model_dump())
    return bind({CHAMPION: load}, {}, None, [CHAMPION], limits, first.no_answer, scaling,
                follow_s=s.champion_poll_s)
