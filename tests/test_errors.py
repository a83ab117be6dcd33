"""rcpipe/errors.py: the located errors survive pickling (a Ray worker's reach the driver)."""

from __future__ import annotations

import pickle

import pytest

from rcpipe.errors import InputError, RunError


@pytest.mark.parametrize("kind", [InputError, RunError])
def test_a_located_error_pickles_and_unpickles_whole(kind: type[InputError]) -> None:
    error = kind("data/prepared/dev.parquet", "row 3", "not a readable Parquet file")
    again = pickle.loads(pickle.dumps(error))
    assert type(again) is kind
    assert (again.file, again.location, again.what) == (error.file, error.location, error.what)
    assert again.line() == error.line() == str(again)
    assert again.exit_code == error.exit_code
