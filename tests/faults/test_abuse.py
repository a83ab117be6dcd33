"""Issue 36's abuse cases through the real command: each is the one line `error: <file>:
<place>: <what>` on stderr and exit code 2, no traceback, and (where a case could once eat
the machine) bounded memory and time.

The run directory is prepared once (the session's ``prepared`` data), with an untrained
bidaf model file and a package of it; each case copies or writes what it abuses. The cases
run ``rcpipe.cli.main`` in-process (the console script's code, without the interpreter's
start-up); those that once grew until the kernel killed them run as real processes under
an address-space limit.
"""

from __future__ import annotations

import gzip
import hashlib
import http.server
import json
import os
import re
import resource
import shutil
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from rcpipe import cli
from tests.conftest import TINY_MODEL, Prepared, save_untrained_model, write_params

PKG = "pkg"
DEEP = "[" * 100_000 + "]" * 100_000  # a JSON document nested 100,000 deep
MEMORY = 1 << 30  # the real-process cases run in 1 GiB of address space


def _package(cfg: Any, out: Path) -> None:
    """A package of bidaf's initial weights, as rcpipe package writes one."""
    import torch

    from rcpipe.models import build_model
    from rcpipe.trained.model_file import prepared_inputs
    from rcpipe.trained.package_dir import package_files

    torch.manual_seed(0)
    mc = cfg.models.of("bidaf")
    inputs = prepared_inputs(cfg.data.out_dir, cfg.data.word_dim)
    model = build_model("bidaf", mc, inputs)
    config = {"variant": "bidaf", "model_config": mc.model_dump(),
              "inputs": dict(vars(inputs)) | {"vectors": None},
              "data": {"version": "1.1", "char_limit": 16},
              "decoding": {"max_answer_len": 15, "length_prior": None}}
    files = package_files(config, model.state_dict(),
                          (cfg.data.out_dir / "vocab.json").read_bytes(),
                          {"na_threshold": 0.5}, "# card\n")
    out.mkdir()
    for name, data in files.items():
        (out / name).write_bytes(data)


@pytest.fixture(scope="module")
def run_dir(prepared: Prepared, tmp_path_factory: pytest.TempPathFactory) -> Path:
    from rcpipe.config import load_config

    root = tmp_path_factory.mktemp("abuse")
    params = write_params(root / "params.yaml", data={
        "train_file": str(prepared.data.train), "dev_file": str(prepared.data.dev),
        "out_dir": str(prepared.out_dir), "cache_dir": "data/cache"},
        models={"bidaf": TINY_MODEL})
    cfg = load_config(params)
    with pytest.MonkeyPatch.context() as mp:
        mp.chdir(root)
        save_untrained_model(cfg, "bidaf")
        _package(cfg, root / PKG)
    (root / "deep.json").write_text(DEEP)
    return root


@pytest.fixture
def here(run_dir: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.chdir(run_dir)
    return run_dir


def rcpipe(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, str]:
    """``rcpipe ARGS`` in-process: (exit code, stderr)."""
    capsys.readouterr()
    with pytest.raises(SystemExit) as info:
        cli.main(list(args))
    return info.value.code, capsys.readouterr().err  # type: ignore[return-value]


def assert_one_line(code: int, err: str, expected: str) -> None:
    assert "Traceback" not in err, err
    assert err.strip().splitlines() == [expected], err
    assert code == 2


# ------------------------------------------------------------------- a package tampered with


def _resigned(pkg: Path, name: str) -> None:
    """config.json's sha256 of ``name`` made to match it again (as an attacker would)."""
    config = json.loads((pkg / "config.json").read_text())
    config["sha256"][name] = hashlib.sha256((pkg / name).read_bytes()).hexdigest()
    (pkg / "config.json").write_text(json.dumps(config))


def _config(**edits: Any) -> Callable[[Path], None]:
    def edit(pkg: Path) -> None:
        config = json.loads((pkg / "config.json").read_text())
        for dotted, value in edits.items():
            *parents, key = dotted.split("__")
            node = config
            for p in parents:
                node = node[p]
            node[key] = value
        (pkg / "config.json").write_text(json.dumps(config))
    return edit


def _vocab_link(pkg: Path) -> None:
    (pkg / "vocab.json").unlink()
    (pkg / "vocab.json").symlink_to("/dev/zero")


def _vocab_fifo(pkg: Path) -> None:
    (pkg / "vocab.json").unlink()
    os.mkfifo(pkg / "vocab.json")


def _not_json(name: str) -> Callable[[Path], None]:
    def edit(pkg: Path) -> None:
        (pkg / name).write_text("not json\n")
        _resigned(pkg, name)
    return edit


def _deep_config(pkg: Path) -> None:
    (pkg / "config.json").write_text(DEEP)


P = f"{PKG}2"
PACKAGE_CASES = {
    "layers_1000000": (_config(model_config__layers=1_000_000),
                       f"{P}/config.json: model_config.layers: Input should be less than or "
                       "equal to 64"),
    "hidden_1000000000": (_config(model_config__hidden=1_000_000_000),
                          f"{P}/config.json: model_config.hidden: Input should be less than "
                          "or equal to 8192"),
    "word_vocab_1e9": (_config(inputs__word_vocab=10**9),
                       f"{P}/config.json: inputs.word_vocab: Input should be less than or "
                       "equal to 100000000"),
    "decoding_a_list": (_config(decoding=[]), f"{P}/config.json: decoding: expected a mapping"),
    "max_answer_len_negative": (_config(decoding__max_answer_len=-3),
                                f"{P}/config.json: decoding.max_answer_len: Input should be "
                                "greater than 0"),
    "dev_para_limit_text": (_config(data__dev_para_limit="abc"),
                            f"{P}/config.json: data.dev_para_limit: Input should be a valid "
                            "integer"),
    "config_nested_deep": (_deep_config, f"{P}/config.json: nested 100000 deep, over the "
                           "bound of 64 (limits.depth)"),
    "vocab_a_link_to_dev_zero": (_vocab_link, f"{P}/vocab.json: refused: a link out of {P} "
                                 "(to /dev/zero)"),
    "vocab_a_fifo": (_vocab_fifo, f"{P}/vocab.json: refused: a FIFO, not a regular file"),
    "vocab_not_json": (_not_json("vocab.json"),
                       f"{P}/vocab.json: line 1 column 1: Expecting value"),
    "threshold_not_json": (_not_json("na_threshold.json"),
                           f"{P}/na_threshold.json: line 1 column 1: Expecting value"),
}


@pytest.mark.parametrize("case", list(PACKAGE_CASES))
def test_a_package_abused_is_one_line(here: Path, capsys: pytest.CaptureFixture[str],
                                      case: str) -> None:
    edit, expected = PACKAGE_CASES[case]
    shutil.rmtree(here / P, ignore_errors=True)
    shutil.copytree(here / PKG, here / P)
    edit(here / P)
    started = time.monotonic()
    code, err = rcpipe(capsys, "predict", "--model", P, "--question", "who?", "--context",
                       "a b c")
    assert_one_line(code, err, f"error: {expected}")
    assert time.monotonic() - started < 20  # refused, not built (a FIFO never waited on)


def test_a_package_over_the_weights_bound_is_refused_before_it_is_built(
        here: Path, capsys: pytest.CaptureFixture[str]) -> None:
    # hidden 8,000 is within its own bound; the whole, 6.7 billion weights (27 GB), is not
    shutil.rmtree(here / P, ignore_errors=True)
    shutil.copytree(here / PKG, here / P)
    _config(model_config__hidden=8000)(here / P)
    code, err = rcpipe(capsys, "predict", "--model", P, "--question", "who?", "--context",
                       "a b c")
    assert_one_line(code, err, err.strip())
    assert re.fullmatch(rf"error: {P}/config.json: model_config: describes 6,6\d\d,\d{{3}},\d{{3}}"
                        r" weights, over the bound of 1,000,000,000 \(limits.parameters\)",
                        err.strip()), err


def test_the_package_untouched_answers(here: Path, capsys: pytest.CaptureFixture[str]
                                       ) -> None:
    capsys.readouterr()
    with pytest.raises(SystemExit) as info:  # typer's standalone mode exits 0
        cli.main(["predict", "--model", PKG, "--question", "who?", "--context", "a b c"])
    assert info.value.code in (0, None)
    assert json.loads(capsys.readouterr().out)["model"] == PKG


# ------------------------------------------------------------------------ files and values


def _write(name: str, data: bytes | str) -> Callable[[Path], None]:
    def make(root: Path) -> None:
        path = root / name
        path.write_bytes(data.encode() if isinstance(data, str) else data)
    return make


def _sparse(name: str, size: int) -> Callable[[Path], None]:
    def make(root: Path) -> None:
        with (root / name).open("wb") as f:
            f.truncate(size)
    return make


def _long_context(root: Path) -> None:
    doc = json.loads(Path(_dev_file(root)).read_text())
    doc["data"][0]["paragraphs"][1]["context"] = "word " * 10_000_000  # 50 MB
    (root / "long.json").write_text(json.dumps(doc))


def _dev_file(root: Path) -> str:
    import yaml

    return str(yaml.safe_load((root / "params.yaml").read_text())["data"]["dev_file"])


def _bomb(root: Path) -> None:
    # 2 MB of zeros inflated from ~2 KB: over a cap of 1 MB once inflated
    (root / "bomb.json.gz").write_bytes(gzip.compress(b" " * 2_000_000))


DEEP_SET = "[" * 900 + "]" * 900
PRED = ["predict", "--model", "bidaf", "--question", "who?"]
CASES: dict[str, tuple[Callable[[Path], None] | None, list[str], str]] = {
    "params_binary": (_write("bin.yaml", b"\x00\x01\xff\xfe"),
                      ["config", "--params", "bin.yaml"],
                      "bin.yaml: byte 2: not UTF-8 text"),
    "params_nested_900_deep": (_write("deep.yaml", "a: " + DEEP_SET),
                               ["config", "--params", "deep.yaml"],
                               "deep.yaml: nested over 64 deep (limits.depth)"),
    "params_a_fifo": (lambda root: os.path.exists(root / "fifo.yaml") or
                      os.mkfifo(root / "fifo.yaml"),
                      ["config", "--params", "fifo.yaml"],
                      "fifo.yaml: refused: a FIFO, not a regular file"),
    "params_over_its_cap": (_sparse("huge.yaml", 50_000_000),
                            ["config", "--params", "huge.yaml"],
                            "huge.yaml: 50.0 MB, over the cap of 1.0 MB (a params file's "
                            "cap)"),
    "set_nested_900_deep": (None, ["config", "--set", f"a={DEEP_SET}"],
                            "--set: a: nested over 64 deep (limits.depth)"),
    "set_a_dimension_out_of_bounds": (None, ["config", "--set",
                                             "models.bidaf.layers=1000000"],
                                      "--set: models.bidaf.layers: Input should be "
                                      "less than or equal to 64"),
    "set_a_bad_value_folded": (None, ["config", "--set", "eval.max_answer_len=-3"],
                               "--set: eval.max_answer_len: Input should be greater "
                               "than 0"),
    "predict_input_nested_deep": (None, ["predict", "--model", "bidaf", "--input",
                                         "deep.json"],
                                  "deep.json: nested 100000 deep, over the bound of 64 "
                                  "(limits.depth)"),
    "prepare_nested_deep": (None, ["prepare", "--set", "data.train_file=deep.json"],
                            "deep.json: nested 100000 deep, over the bound of 64 "
                            "(limits.depth)"),
    "score_dataset_nested_deep": (None, ["score", "deep.json", "deep.json"],
                                  "deep.json: nested 100000 deep, over the bound of 64 "
                                  "(limits.depth)"),
    "context_file_over_its_cap": (_sparse("big.txt", 50_000_000),
                                  [*PRED, "--context-file", "big.txt"],
                                  "big.txt: 50.0 MB, over the cap of 4.0 MB "
                                  "(limits.context_chars 1,000,000, at most 4 bytes each)"),
    "context_file_a_fifo": (lambda root: os.path.exists(root / "ctx.fifo") or
                            os.mkfifo(root / "ctx.fifo"),
                            [*PRED, "--context-file", "ctx.fifo"],
                            "ctx.fifo: refused: a FIFO, not a regular file"),
    "input_with_a_50_mb_context": (_long_context, ["predict", "--model", "bidaf", "--input",
                                                   "long.json"],
                                   "long.json: data[0].paragraphs[1].context: 50,000,000 "
                                   "characters, over the cap of 1,000,000 "
                                   "(limits.context_chars)"),
    "input_a_gzip_bomb": (_bomb, ["predict", "--model", "bidaf", "--input", "bomb.json.gz",
                                  "--set", "limits.json_mb=1"],
                          "bomb.json.gz: over 1.0 MB inflated, over the cap of 1.0 MB "
                          "(limits.json_mb)"),
}


@pytest.mark.parametrize("case", list(CASES))
def test_a_users_mistake_is_one_line(here: Path, capsys: pytest.CaptureFixture[str],
                                     case: str) -> None:
    make, args, expected = CASES[case]
    if make is not None:
        make(here)
    started = time.monotonic()
    code, err = rcpipe(capsys, *args)
    assert_one_line(code, err, f"error: {expected}")
    assert time.monotonic() - started < 20
    assert not (here / "data" / "prepared").exists()  # nothing written


# --------------------------------------------------- what once ate the machine, for real


def _limited() -> None:
    resource.setrlimit(resource.RLIMIT_AS, (MEMORY, MEMORY))


@pytest.mark.parametrize(("args", "expected"), [
    ([*PRED, "--context-file", "/dev/zero"],
     "error: /dev/zero: refused: a character device, not a regular file"),
    ([*PRED, "--context", "x", "--params", "/dev/zero"],
     "error: /dev/zero: refused: a character device, not a regular file"),
], ids=["context_file_dev_zero", "params_dev_zero"])
def test_dev_zero_is_refused_in_bounded_memory(here: Path, args: list[str], expected: str
                                                ) -> None:
    out = subprocess.run([sys.executable, "-m", "rcpipe", *args], cwd=here,
                         capture_output=True, text=True, timeout=60, preexec_fn=_limited,
                         env={**os.environ, "TERM": "dumb", "NO_COLOR": "1"})
    assert_one_line(out.returncode, out.stderr, expected)


# -------------------------------------------------------------------- a download trickling


class _Trickle(http.server.BaseHTTPRequestHandler):
    """Promises 1,000 bytes and sends one every 0.2 s (an idle socket's timeout never
    fires)."""

    def do_GET(self) -> None:  # noqa: N802 - http.server's name
        self.send_response(200)
        self.send_header("Content-Length", "1000")
        self.end_headers()
        try:
            for _ in range(1000):
                self.wfile.write(b" ")
                self.wfile.flush()
                time.sleep(0.2)
        except OSError:  # the client left, as it should
            pass

    def log_message(self, *args: Any) -> None:
        pass


@pytest.fixture
def trickle() -> Iterator[str]:
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Trickle)
    server.daemon_threads = True
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}/train.json"
    finally:
        server.shutdown()
        server.server_close()


def test_a_trickling_download_is_abandoned_at_its_deadline(
        here: Path, trickle: str, capsys: pytest.CaptureFixture[str]) -> None:
    cache = here / "data" / "cache"
    cache.mkdir(parents=True, exist_ok=True)
    gone = subprocess.Popen(["true"])
    gone.wait()
    orphan = cache / f".part-{gone.pid}-killed"  # a download killed mid-way, earlier
    orphan.write_bytes(b"partial")
    started = time.monotonic()
    code, err = rcpipe(capsys, "fetch", "--set", f"data.train_file={trickle}",
                       "--set", "limits.download_minutes=0.03")
    took = time.monotonic() - started
    assert_one_line(code, err, f"error: {trickle}: download abandoned: not complete within "
                    "limits.download_minutes (0.03); its partial file is removed")
    assert 1.5 < took < 10  # 1.8 s, not the 200 s the server would take
    assert not list(cache.glob(".part-*"))  # neither this one's nor the killed one's


def test_a_server_that_never_answers_is_left_at_the_idle_limit(
        here: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """Accepted, never answered: it held prepare to the two hours' deadline (issue 43)."""
    import socket

    with socket.create_server(("127.0.0.1", 0)) as server:  # the kernel accepts for it
        uri = f"http://127.0.0.1:{server.getsockname()[1]}/train.json"
        started = time.monotonic()
        code, err = rcpipe(capsys, "fetch", "--set", f"data.train_file={uri}",
                           "--set", "limits.download_idle_seconds=0.5")
    assert_one_line(code, err, f"error: {uri}: download abandoned: nothing received for "
                    "limits.download_idle_seconds (0.5); its partial file is removed")
    assert time.monotonic() - started < 10
