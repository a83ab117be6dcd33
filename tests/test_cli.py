"""The `rcpipe` command contract: commands, output files, score JSON, and one-line errors.

Success paths and a sample of errors run the real command as a subprocess; the full table
of malformed inputs goes through ``rcpipe.cli.main`` in-process (the same code the console
script runs, minus the interpreter start-up), so it stays fast.
"""

from __future__ import annotations

import copy
import gzip
import json
import os
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pyarrow.parquet as pq
import pytest

from rcpipe import cli
from tests.conftest import SynthData, questions_of, write_params

RCPIPE = Path(sys.executable).parent / "rcpipe"
ENV = {**os.environ, "COLUMNS": "200", "TERM": "dumb", "NO_COLOR": "1"}

V1_KEYS = ["exact_match", "f1"]
V2_KEYS = ["exact", "f1", "total", "HasAns_exact", "HasAns_f1", "HasAns_total",
           "NoAns_exact", "NoAns_f1", "NoAns_total"]
V2_THRESH_KEYS = ["best_exact", "best_exact_thresh", "best_f1", "best_f1_thresh"]


def run(*args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "rcpipe", *args], cwd=cwd, env=ENV,
                          capture_output=True, text=True, timeout=120)


def assert_one_line_error(stderr: str, file: str) -> str:
    assert "Traceback" not in stderr
    lines = stderr.strip().splitlines()
    assert len(lines) == 1, stderr
    assert lines[0].startswith(f"error: {file}: "), lines[0]
    return lines[0]


def gold_predictions(doc: dict[str, Any]) -> dict[str, str]:
    return {qa["id"]: qa["answers"][0]["text"] if qa["answers"] else ""
            for qa in questions_of(doc)}


# ------------------------------------------------------------------------- real processes


def test_help_lists_commands(tmp_path: Path) -> None:
    exe = [str(RCPIPE)] if RCPIPE.exists() else [sys.executable, "-m", "rcpipe"]
    out = subprocess.run([*exe, "--help"], cwd=tmp_path, env=ENV, capture_output=True,
                         text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    for command in ("synth", "prepare", "score", "ensemble"):
        assert command in out.stdout


@pytest.mark.parametrize(("args", "expected"), [
    (["version", "--tries", "0"], "error: rcpipe version: Invalid value for '--tries': Input "
     "should be greater than or equal to 1 (rcpipe version --help)"),
    (["version", "--nope"], "error: rcpipe version: No such option: --nope (Possible options: "
     "--no-promote) (rcpipe version --help)"),
    (["train"], "error: rcpipe train: Missing argument 'variant'. (rcpipe train --help)"),
    (["export"], "error: rcpipe export: Missing option '--model'. (rcpipe export --help)"),
    (["no-such-command"], "error: rcpipe: No such command 'no-such-command'. (rcpipe --help)"),
])
def test_a_command_line_mistake_is_one_line_and_exit_2(
        args: list[str], expected: str, capsys: pytest.CaptureFixture[str]) -> None:
    """typer's usage errors (an unknown option or command, a value out of its range, a
    missing argument) as every other mistake: one line on stderr, exit code 2."""
    with pytest.raises(SystemExit) as done:
        cli.main(args)
    assert done.value.code == 2
    assert capsys.readouterr().err == expected + "\n"


def test_help_and_a_command_that_finishes_exit_0(capsys: pytest.CaptureFixture[str]) -> None:
    for args in (["--help"], ["train", "--help"]):
        with pytest.raises(SystemExit) as done:
            cli.main(args)
        assert done.value.code == 0
    assert "Usage: rcpipe train" in capsys.readouterr().out


def test_python_m_rcpipe_help(tmp_path: Path) -> None:
    out = run("--help", cwd=tmp_path)
    assert out.returncode == 0, out.stderr
    assert "Usage" in out.stdout and "prepare" in out.stdout


@pytest.mark.slow
def test_synth_then_prepare_writes_the_contract_files(workdir: Path) -> None:
    synth = run("synth", cwd=workdir)
    assert synth.returncode == 0, synth.stderr
    assert synth.stdout == ""  # messages go to stderr; stdout is for results
    assert (workdir / "data/synth/train.json").is_file()
    assert (workdir / "data/synth/dev.json").is_file()

    prep = run("prepare", "--set", "data.out_dir=out/prep", cwd=workdir)
    assert prep.returncode == 0, prep.stderr
    out = workdir / "out/prep"
    for name in ("train/part-00000.parquet", "dev/part-00000.parquet", "vocab.json",
                 "report.json"):
        assert (out / name).is_file(), name
    assert not (workdir / "data/prepared").exists()

    report = json.loads((out / "report.json").read_text())
    assert set(report) == {"train", "dev", "heldout"}
    for split in ("train", "dev"):
        r = report[split]
        doc = json.loads((workdir / f"data/synth/{split}.json").read_text())
        held = report["heldout"]["questions"] if split == "train" else 0
        assert r["questions"] == len(questions_of(doc)) - held
        assert r["questions"] == r["kept"] + sum(r["dropped"].values())
        assert pq.read_metadata(out / split / "part-00000.parquet").num_rows == r["kept"]
    assert report["dev"]["dropped"] == {}
    assert report["dev"]["kept"] == report["dev"]["questions"]

    vocab = json.loads((out / "vocab.json").read_text())
    assert vocab["words"][:2] == ["--NULL--", "--OOV--"]
    assert vocab["chars"][:2] == ["--NULL--", "--OOV--"]


def test_prepare_never_drops_dev(workdir: Path, synth_v1: SynthData,
                                 call: Callable[..., tuple[int, str, str]]) -> None:
    # tiny limits drop most training questions, and no dev question (in-process: fast)
    code, out, err = call("prepare", "--set", f"data.train_file={synth_v1.train}",
                          "--set", f"data.dev_file={synth_v1.dev}", "--set", "data.limits.para=80",
                          "--set", "data.limits.answer=1")
    assert code == 0, err
    assert out == ""
    report = json.loads((workdir / "data/prepared/report.json").read_text())
    train, dev = report["train"], report["dev"]
    assert train["dropped"] and train["kept"]
    assert train["questions"] == train["kept"] + sum(train["dropped"].values())
    assert dev == {"questions": len(questions_of(synth_v1.dev_doc)),
                   "kept": len(questions_of(synth_v1.dev_doc)), "dropped": {}}


def test_score_v1_gold_is_100(tmp_path: Path, synth_v1: SynthData) -> None:
    preds = tmp_path / "preds.json"
    preds.write_text(json.dumps(gold_predictions(synth_v1.dev_doc)))
    out = run("score", str(synth_v1.dev), str(preds), cwd=tmp_path)
    assert out.returncode == 0, out.stderr
    result = json.loads(out.stdout)  # exactly one JSON object on stdout
    assert list(result) == V1_KEYS
    assert result == {"exact_match": 100.0, "f1": 100.0}


def test_score_v2_gold_is_100(tmp_path: Path, synth_v2: SynthData) -> None:
    gold = gold_predictions(synth_v2.dev_doc)
    assert "" in gold.values() and any(gold.values())  # both kinds of question
    preds, na = tmp_path / "preds.json", tmp_path / "na.json"
    preds.write_text(json.dumps(gold))
    na.write_text(json.dumps({q: 0.0 if text else 1.0 for q, text in gold.items()}))

    out = run("score", str(synth_v2.dev), str(preds), cwd=tmp_path)
    assert out.returncode == 0, out.stderr
    result = json.loads(out.stdout)
    assert list(result) == V2_KEYS
    n_no = sum(1 for t in gold.values() if not t)
    assert result["total"] == len(gold)
    assert result["NoAns_total"] == n_no and result["HasAns_total"] == len(gold) - n_no
    for key in ("exact", "f1", "HasAns_exact", "HasAns_f1", "NoAns_exact", "NoAns_f1"):
        assert result[key] == 100.0, key

    out = run("score", str(synth_v2.dev), str(preds), "--na-prob-file", str(na),
              "--na-prob-thresh", "0.5", cwd=tmp_path)
    assert out.returncode == 0, out.stderr
    result = json.loads(out.stdout)
    assert list(result) == V2_KEYS + V2_THRESH_KEYS
    assert result["exact"] == result["best_exact"] == result["best_f1"] == 100.0


@pytest.mark.parametrize(
    ("args", "file"),
    [
        (["score", "missing.json", "preds.json"], "missing.json"),
        (["score", "bad.json", "preds.json"], "bad.json"),
        (["synth", "--set", "data.bogus=1"], "--set"),
        (["prepare", "--params", "nope.yaml"], "nope.yaml"),
        (["synth", "--set", "data.workers"], "--set"),
    ],
)
def test_bad_input_subprocess(workdir: Path, args: list[str], file: str) -> None:
    (workdir / "bad.json").write_text('{"data": [}')
    (workdir / "preds.json").write_text("{}")
    out = run(*args, cwd=workdir)
    assert out.returncode == 2
    assert out.stdout == ""
    assert_one_line_error(out.stderr, file)


# ------------------------------------------------------------------ every malformed input

Q = ["data", 0, "paragraphs", 1, "qas", 2]  # the question at data[0].paragraphs[1].qas[2]
QW = "data[0].paragraphs[1].qas[2]"


def _qa(qid: str, question: str, text: str, start: int) -> dict[str, Any]:
    return {"id": qid, "question": question, "answers": [{"text": text, "answer_start": start}]}


BASE: dict[str, Any] = {
    "version": "1.1",
    "data": [{"title": "Greek letters", "paragraphs": [
        {"context": "Alpha beta gamma.", "qas": [_qa("q0", "Which is second?", "beta", 6)]},
        {"context": "One two three four.", "qas": [
            _qa("q1", "First?", "One", 0),
            _qa("q2", "Second?", "two", 4),
            _qa("q3", "Third?", "three", 8),
        ]},
    ]}],
}


def _node(doc: Any, path: list[Any]) -> Any:
    for key in path:
        doc = doc[key]
    return doc


def put(path: list[Any], value: Any) -> Callable[[dict[str, Any]], None]:
    def edit(doc: dict[str, Any]) -> None:
        _node(doc, path[:-1])[path[-1]] = value

    return edit


def drop(path: list[Any]) -> Callable[[dict[str, Any]], None]:
    def edit(doc: dict[str, Any]) -> None:
        del _node(doc, path[:-1])[path[-1]]

    return edit


def _both(*edits: Callable[[dict[str, Any]], None]) -> Callable[[dict[str, Any]], None]:
    def edit(doc: dict[str, Any]) -> None:
        for e in edits:
            e(doc)

    return edit


def _corrupt_gzip() -> bytes:
    raw = bytearray(gzip.compress(json.dumps(BASE).encode() * 20))
    for i in range(12, 40):  # inside the deflate stream, past the 10-byte header
        raw[i] ^= 0xFF
    return bytes(raw)


# (edit of BASE or raw file bytes, exact json location, a piece of the message)
DATASET_CASES: dict[str, tuple[Any, str, str]] = {
    "invalid_json": (b'{"version": "1.1",\n "data": [}\n', "line 2 column 11", "Expecting value"),
    "not_utf8": (b'{"version": "1.1", "data": "\xff"}', "byte 28", "not UTF-8"),
    "gz_corrupt": (_corrupt_gzip(), "", "cannot read"),
    "gz_truncated": (gzip.compress(json.dumps(BASE).encode())[:30], "", "cannot read"),
    "top_level_list": (b"[]", "", "expected a JSON object at the top level, got list"),
    "version_not_string": (put(["version"], 1.1), "version", "expected a string"),
    "version_unknown": (put(["version"], "3.0"), "version", "unknown SQuAD version"),
    "missing_data": (drop(["data"]), "", "missing key 'data'"),
    "data_not_list": (put(["data"], {}), "data", "expected a list, got dict"),
    "article_not_object": (put(["data", 0], "x"), "data[0]", "expected an object, got str"),
    "title_not_string": (put(["data", 0, "title"], 3), "data[0].title", "expected a string"),
    "missing_paragraphs": (drop(["data", 0, "paragraphs"]), "data[0]",
                           "missing key 'paragraphs'"),
    "paragraph_not_object": (put(["data", 0, "paragraphs", 1], []), "data[0].paragraphs[1]",
                             "expected an object"),
    "paragraph_missing_context": (drop(["data", 0, "paragraphs", 1, "context"]),
                                  "data[0].paragraphs[1]", "missing key 'context'"),
    "context_not_string": (put(["data", 0, "paragraphs", 1, "context"], 5),
                           "data[0].paragraphs[1].context", "expected a string, got int"),
    "qas_not_list": (put(["data", 0, "paragraphs", 1, "qas"], {}),
                     "data[0].paragraphs[1].qas", "expected a list"),
    "qa_not_object": (put(Q, 3), QW, "expected an object, got int"),
    "qa_missing_id": (drop([*Q, "id"]), QW, "missing key 'id'"),
    "id_not_string": (put([*Q, "id"], 17), f"{QW}.id", "expected a string, got int"),
    "empty_id": (put([*Q, "id"], ""), f"{QW}.id", "empty question id"),
    "duplicate_id": (put([*Q, "id"], "q0"), f"{QW}.id",
                     "duplicate question id 'q0' (first at data[0].paragraphs[0].qas[0])"),
    "question_not_string": (put([*Q, "question"], None), f"{QW}.question",
                            "expected a string, got NoneType"),
    "question_missing": (drop([*Q, "question"]), QW, "missing key 'question'"),
    "answers_not_list": (put([*Q, "answers"], "three"), f"{QW}.answers", "expected a list"),
    "answer_not_object": (put([*Q, "answers"], ["three"]), f"{QW}.answers[0]",
                          "expected an object"),
    "answer_missing_text": (drop([*Q, "answers", 0, "text"]), f"{QW}.answers[0]",
                            "missing key 'text'"),
    "answer_text_not_string": (put([*Q, "answers", 0, "text"], 3), f"{QW}.answers[0].text",
                               "expected a string"),
    "answer_start_string": (put([*Q, "answers", 0, "answer_start"], "8"),
                            f"{QW}.answers[0].answer_start", "expected an integer, got str"),
    "answer_start_bool": (put([*Q, "answers", 0, "answer_start"], True),
                          f"{QW}.answers[0].answer_start", "expected an integer, got bool"),
    "answer_start_float": (put([*Q, "answers", 0, "answer_start"], 8.0),
                           f"{QW}.answers[0].answer_start", "expected an integer, got float"),
    "is_impossible_not_bool": (put([*Q, "is_impossible"], "yes"), f"{QW}.is_impossible",
                               "expected true or false, got str"),
    "is_impossible_int": (put([*Q, "is_impossible"], 1), f"{QW}.is_impossible",
                          "expected true or false, got int"),
    "impossible_with_answers": (put([*Q, "is_impossible"], True), f"{QW}.answers",
                                "is_impossible is true but answers is not empty"),
    "answerable_without_answers": (put([*Q, "answers"], []), f"{QW}.answers",
                                   "no answers for an answerable question"),
    "plausible_not_list": (_both(put([*Q, "answers"], []), put([*Q, "is_impossible"], True),
                                 put([*Q, "plausible_answers"], "x")),
                           f"{QW}.plausible_answers", "expected a list"),
}


@pytest.fixture
def call(workdir: Path, capsys: pytest.CaptureFixture[str]) -> Callable[..., tuple[int, str, str]]:
    """Run ``rcpipe.cli.main`` in the work dir: (exit code, stdout, stderr)."""

    def invoke(*args: str) -> tuple[int, str, str]:
        capsys.readouterr()
        with pytest.raises(SystemExit) as info:
            cli.main(list(args))
        out, err = capsys.readouterr()
        return info.value.code, out, err  # type: ignore[return-value]

    return invoke


def _write_dataset(directory: Path, name: str, case: Any) -> Path:
    path = directory / name
    if isinstance(case, bytes):
        path.write_bytes(case)
    else:
        doc = copy.deepcopy(BASE)
        case(doc)
        path.write_text(json.dumps(doc))
    return path


def test_base_dataset_is_valid(workdir: Path, call: Callable[..., tuple[int, str, str]]) -> None:
    (workdir / "base.json").write_text(json.dumps(BASE))
    (workdir / "preds.json").write_text(json.dumps(
        {"q0": "beta", "q1": "One", "q2": "two", "q3": "four"}))
    code, out, err = call("score", "base.json", "preds.json")
    assert code == 0, err
    assert json.loads(out) == {"exact_match": 75.0, "f1": 75.0}


@pytest.mark.parametrize("kind", list(DATASET_CASES))
def test_malformed_dataset(workdir: Path, call: Callable[..., tuple[int, str, str]],
                           kind: str) -> None:
    case, location, what = DATASET_CASES[kind]
    name = "bad.json.gz" if kind.startswith("gz_") else "bad.json"
    _write_dataset(workdir, name, case)
    (workdir / "preds.json").write_text("{}")
    code, out, err = call("score", name, "preds.json")
    assert code == 2 and out == ""
    line = assert_one_line_error(err, name)
    if location:
        assert line.startswith(f"error: {name}: {location}: "), line
    else:  # the whole file is at fault: error: <file>: <what>
        assert line.startswith(f"error: {name}: {what}"), line
    assert what in line


def test_malformed_training_file_fails_prepare_too(
        workdir: Path, call: Callable[..., tuple[int, str, str]]) -> None:
    _write_dataset(workdir, "train.json", put([*Q, "id"], ""))
    (workdir / "dev.json").write_text(json.dumps(BASE))
    write_params(workdir / "params.yaml", data={"train_file": "train.json",
                                                "dev_file": "dev.json"})
    code, _, err = call("prepare")
    assert code == 2
    line = assert_one_line_error(err, "train.json")
    assert line == f"error: train.json: {QW}.id: empty question id"
    assert not (workdir / "data/prepared").exists()


def test_nonexistent_dataset(workdir: Path, call: Callable[..., tuple[int, str, str]]) -> None:
    (workdir / "preds.json").write_text("{}")
    code, _, err = call("score", "nope.json", "preds.json")
    assert code == 2
    assert assert_one_line_error(err, "nope.json") == "error: nope.json: no such file"


PREDICTION_CASES: dict[str, tuple[str, str, str]] = {
    "not_an_object": ('["beta"]', "", "expected a JSON object"),
    "value_not_string": ('{"q0": "beta", "q1": 3}', '["q1"]', "expected an answer string"),
    "value_bool": ('{"q1": true}', '["q1"]', "got bool"),
    "value_null": ('{"q1": null}', '["q1"]', "got NoneType"),
    "invalid_json": ('{"q1": "One",}', "line 1 column 14", ""),
}


@pytest.mark.parametrize("kind", list(PREDICTION_CASES))
def test_malformed_predictions(workdir: Path, call: Callable[..., tuple[int, str, str]],
                               kind: str) -> None:
    text, location, what = PREDICTION_CASES[kind]
    (workdir / "base.json").write_text(json.dumps(BASE))
    (workdir / "preds.json").write_text(text)
    code, _, err = call("score", "base.json", "preds.json")
    assert code == 2
    line = assert_one_line_error(err, "preds.json")
    if location:
        assert line.startswith(f"error: preds.json: {location}: "), line
    assert what in line


def test_nonexistent_predictions(workdir: Path, call: Callable[..., tuple[int, str, str]]) -> None:
    (workdir / "base.json").write_text(json.dumps(BASE))
    code, _, err = call("score", "base.json", "missing.json")
    assert code == 2
    assert assert_one_line_error(err, "missing.json") == "error: missing.json: no such file"


@pytest.fixture
def v2_files(workdir: Path) -> Path:
    doc = copy.deepcopy(BASE)
    doc["version"] = "v2.0"
    put([*Q, "answers"], [])(doc)
    put([*Q, "is_impossible"], True)(doc)
    (workdir / "v2.json").write_text(json.dumps(doc))
    (workdir / "preds.json").write_text(json.dumps({"q0": "beta", "q1": "One", "q3": ""}))
    return workdir


@pytest.mark.parametrize(
    ("na", "location", "what"),
    [
        ({"q0": 0.1, "q3": 0.9}, '["q1"]', "no probability for this id"),
        ({"q0": 0.1, "q1": "0.2", "q3": 0.9}, '["q1"]', "expected a probability, got str"),
        ({"q0": 0.1, "q1": False, "q3": 0.9}, '["q1"]', "got bool"),
        ([0.1], "", "expected a JSON object"),
    ],
)
def test_malformed_na_probs(v2_files: Path, call: Callable[..., tuple[int, str, str]],
                            na: Any, location: str, what: str) -> None:
    (v2_files / "na.json").write_text(json.dumps(na))
    code, _, err = call("score", "v2.json", "preds.json", "--na-prob-file", "na.json")
    assert code == 2
    line = assert_one_line_error(err, "na.json")
    if location:
        assert line.startswith(f"error: na.json: {location}: "), line
    assert what in line


def test_na_probs_accepted(v2_files: Path, call: Callable[..., tuple[int, str, str]]) -> None:
    (v2_files / "na.json").write_text(json.dumps({"q0": 0.1, "q1": 0, "q3": 0.9}))
    code, out, err = call("score", "v2.json", "preds.json", "--na-prob-file", "na.json")
    assert code == 0, err
    result = json.loads(out)
    assert list(result) == V2_KEYS + V2_THRESH_KEYS
    assert result["total"] == 3 and result["exact"] == 100.0


def test_v2_predictions_answering_nothing(v2_files: Path,
                                          call: Callable[..., tuple[int, str, str]]) -> None:
    (v2_files / "other.json").write_text(json.dumps({"zz": "x"}))
    code, _, err = call("score", "v2.json", "other.json")
    assert code == 2
    assert "answer none" in assert_one_line_error(err, "other.json")


def test_v1_question_without_answers(workdir: Path,
                                     call: Callable[..., tuple[int, str, str]]) -> None:
    # well formed (is_impossible with no answers) but unscorable by the v1.1 rules
    _write_dataset(workdir, "v1.json", _both(put([*Q, "answers"], []),
                                             put([*Q, "is_impossible"], True)))
    (workdir / "preds.json").write_text(json.dumps({"q3": "three"}))
    code, _, err = call("score", "v1.json", "preds.json")
    assert code == 2
    assert "'q3' has no answers" in assert_one_line_error(err, "v1.json")


@pytest.mark.parametrize(
    ("args", "params_extra", "expected"),
    [
        (["synth", "--set", "data.bogus=1"], {}, "error: --set: data.bogus: unknown key"),
        (["prepare"], {"train": {"epoch": 3}}, "error: params.yaml: train.epoch: unknown key"),
        (["ensemble"], {"typo": 1}, "error: params.yaml: typo: unknown key"),
        (["synth", "--set", "train.epochs=many"], {}, "error: --set: train.epochs: "),
        (["prepare", "--set", "data.missing_vectors=zero"], {},
         "error: --set: data.missing_vectors: Input should be 'unk', 'train' or "
         "'fixed'"),
        (["synth", "--set", "synth.seed"], {}, "error: --set: synth.seed: expected "),
        (["synth", "--params", "none.yaml"], {}, "error: none.yaml: "),
        (["version"], {"version": {"min_gain": -0.5}}, "error: params.yaml: "
         "version.min_gain: Input should be greater than or equal to 0"),
    ],
)
def test_bad_params(workdir: Path, call: Callable[..., tuple[int, str, str]], args: list[str],
                    params_extra: dict[str, Any], expected: str) -> None:
    write_params(workdir / "params.yaml", **params_extra)
    code, _, err = call(*args)
    assert code == 2
    file = expected.split(": ")[1]
    assert assert_one_line_error(err, file).startswith(expected)
    assert not (workdir / "data").exists()  # nothing was written


def test_params_layers_are_laid_over_each_other(
        workdir: Path, call: Callable[..., tuple[int, str, str]]) -> None:
    (workdir / "tune").mkdir()
    (workdir / "tune" / "bidaf.yaml").write_text(
        "models:\n  bidaf:\n    dropout: 0.05\n    optim: {lr: 0.004}\n")
    layers = ("--params", "params.yaml", "--params", "tune/bidaf.yaml")
    code, out, _ = call("config", "models.bidaf.optim.lr", *layers)
    assert (code, out.strip()) == (0, "0.004")
    code, out, _ = call("config", "models.bidaf.dropout", *layers, "--set",
                        "models.bidaf.dropout=0.3")
    assert (code, out.strip()) == (0, "0.3")  # --set over every layer
    (workdir / "tune" / "bidaf.yaml").write_text("models:\n  bidaf:\n    dropuot: 0.05\n")
    code, _, err = call("config", *layers)
    assert code == 2
    assert assert_one_line_error(err, "tune/bidaf.yaml") == \
        "error: tune/bidaf.yaml: models.bidaf.dropuot: unknown key"


def test_synth_refuses_remote_targets(workdir: Path,
                                      call: Callable[..., tuple[int, str, str]]) -> None:
    code, _, err = call("synth", "--set", "data.dev_file=s3://bucket/dev.json")
    assert code == 2
    assert assert_one_line_error(err, "params") == \
        "error: params: data.dev_file: synth writes local files only"
    assert not (workdir / "data").exists()  # train.json was not written either


def test_version_refuses_a_negative_min_gain_and_a_gate_file_that_is_not_squad(
        workdir: Path, call: Callable[..., tuple[int, str, str]]) -> None:
    """Each a located line and exit 2 before anything is committed or pushed (the remote
    is named, never reached)."""
    dvc = [sys.executable, "-m", "dvc"]
    for cmd in (["init", "--no-scm", "-q"], ["remote", "add", "-d", "storage", "s3://b/p"]):
        subprocess.run([*dvc, *cmd], cwd=workdir, check=True, capture_output=True)
    (workdir / "dvc.yaml").write_text((Path(cli.__file__).parents[1] / "dvc.yaml").read_text())
    assert call("synth")[0] == 0
    code, _, err = call("version", "--promote", "--min-gain", "-1")
    assert code == 2
    assert assert_one_line_error(err, "min_gain").startswith("error: min_gain: -1: below 0")

    def gate_error(gate_file: str) -> str:
        """The one error line after fetch's log lines (the sources' digests)."""
        code, _, err = call("version", "--promote", "--set", f"version.gate_file={gate_file}")
        assert code == 2 and "Traceback" not in err
        lines = [ln for ln in err.strip().splitlines() if " INFO rcpipe.stages.fetch: " not in ln]
        assert len(lines) == 1, err
        return lines[0]

    (workdir / "gate.json").write_text('{"version": "1.1", "data": [\n  {"title": 3}]}')
    assert gate_error("gate.json") == "error: gate.json: data[0].title: expected a string, " \
        "got int"
    assert gate_error("").startswith("error: params.yaml: version.gate_file: no gate set: "
                                     "prepare held no questions out")  # nothing prepared
    assert gate_error("data/synth/dev.json").startswith(
        "error: params.yaml: version.gate_file: data/synth/dev.json holds data.dev_file's "
        "questions (the same sha256)")
    assert not (workdir / "dvc.lock").exists() and not (workdir / "data/prepared").exists()


def test_version_refuses_a_champion_record_it_cannot_read_before_committing(
        workdir: Path, call: Callable[..., tuple[int, str, str]]) -> None:
    """A champion record that is not an object (issue 57: `version --promote` once
    committed and pushed, then failed with a TypeError): one located line and exit 2, no
    dvc.lock and nothing under versions/ on the remote."""
    store = workdir.parent / "store"
    dvc = [sys.executable, "-m", "dvc"]
    for cmd in (["init", "--no-scm", "-q"], ["remote", "add", "-d", "storage", str(store)]):
        subprocess.run([*dvc, *cmd], cwd=workdir, check=True, capture_output=True)
    (workdir / "dvc.yaml").write_text((Path(cli.__file__).parents[1] / "dvc.yaml").read_text())
    (store / "rcpipe").mkdir(parents=True)
    (store / "rcpipe" / "champion.json").write_text("[1, 2]")
    assert call("synth")[0] == 0
    code, _, err = call("version", "--promote", "--set", "version.gate_file=data/synth/train.json")
    lines = [ln for ln in err.strip().splitlines() if " INFO rcpipe.stages.fetch: " not in ln]
    assert code == 2 and lines == [
        f"error: {store}/rcpipe/champion.json: expected a JSON object, found list"], err
    assert not (workdir / "dvc.lock").exists() and not (store / "rcpipe" / "versions").exists()
    # a remote rcpipe cannot compare-and-swap on (HTTP here; GCS, Azure): refused as early
    subprocess.run([*dvc, "remote", "modify", "storage", "url", "http://127.0.0.1:9/r"],
                   cwd=workdir, check=True, capture_output=True)
    code, _, err = call("version", "--promote", "--set", "version.gate_file=data/synth/train.json")
    lines = [ln for ln in err.strip().splitlines() if " INFO rcpipe.stages.fetch: " not in ln]
    assert code == 2 and len(lines) == 1 and "compare-and-swap" in lines[0], err
    assert not (workdir / "dvc.lock").exists()


def test_the_readme_lists_every_command_and_no_other() -> None:
    """The README's command table and the CLI stay one list (litgpt's rule)."""
    import re

    readme = (Path(__file__).resolve().parents[1] / "README.md").read_text()
    listed = set(re.findall(r"^\| \[`rcpipe (\w+)", readme, flags=re.MULTILINE))
    commands = {c.name or c.callback.__name__ for c in cli.app.registered_commands} | {
        g.name for g in cli.app.registered_groups}
    assert listed == commands
