"""`rcpipe serve`'s address and options: a mistake is one line and exit code 2, at once,
before any model loads (a port of 99999 once printed a traceback)."""

from __future__ import annotations

import socket
from pathlib import Path

import pytest

from rcpipe import cli
from rcpipe.errors import InputError
from rcpipe.serve.server import listen
from tests.conftest import write_params


def test_listen_binds_the_address_it_is_given() -> None:
    sock = listen("127.0.0.1", _free_port())
    try:
        assert sock.getsockname()[0] == "127.0.0.1"
    finally:
        sock.close()


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_a_taken_port_is_named() -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        with pytest.raises(InputError) as err:
            listen("127.0.0.1", port)
    assert (err.value.file, err.value.location) == ("--port", str(port))
    assert "cannot listen on" in err.value.what


def _below(option: str, least: str) -> str:
    """typer's own range check (the option's min=), as rcpipe.cli.main puts it in one line."""
    return (f"error: rcpipe serve: Invalid value for '{option}': Input should be greater "
            f"than or equal to {least} (rcpipe serve --help)")


@pytest.mark.parametrize(
    ("args", "expected"),
    [
        (["--port", "99999"], "error: --port: 99999: must be between 1 and 65535"),
        (["--port", "0"], "error: --port: 0: must be between 1 and 65535"),
        (["--host", "no-such-host.invalid"],
         "error: --host: no-such-host.invalid: not an address or a name that resolves"),
        (["--timeout", "0"], _below("--timeout", "0.001")),
        (["--max-batch", "0"], _below("--max-batch", "1")),
        (["--batch-wait-ms", "-1"], _below("--batch-wait-ms", "0")),
        (["--max-context-chars", "0"], _below("--max-context-chars", "1")),
    ],
)
def test_serve_misconfiguration_is_one_line(args: list[str], expected: str, tmp_path: Path,
                                            capsys: pytest.CaptureFixture[str]) -> None:
    params = write_params(tmp_path / "params.yaml")
    with pytest.raises(SystemExit) as exit_:
        cli.main(["serve", "--params", str(params), *args])
    assert exit_.value.code == 2
    assert capsys.readouterr().err == expected + "\n"
