"""Issue 43: a package read from the DVC remote (stages/remote.Remote.download, the call the
RayService's champion app and the champion gate make) is confined to its destination: a
key whose parts lead out of it is refused in one line and nothing is written, anywhere;
an object over limits.weights_mb is refused before it is read whole. On a real moto S3
server on 127.0.0.1, in a real DVC workspace."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from rcpipe.config import ReadLimits
from rcpipe.errors import InputError
from rcpipe.release.remote import Remote

BUCKET = "rcpipe-test"  # made by the s3 fixture
PACKAGE = "t/rcpipe/versions/n1/bidaf"

pytestmark = pytest.mark.integration  # the s3 fixture: moto's server


@pytest.fixture
def remote(s3: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Remote:
    monkeypatch.chdir(tmp_path)
    for cmd in (["init", "--no-scm", "-q"], ["remote", "add", "-d", "storage", f"s3://{BUCKET}/t"]):
        subprocess.run([sys.executable, "-m", "dvc", *cmd], check=True, capture_output=True)
    for listed in s3.list_objects_v2(Bucket=BUCKET, Prefix="t/").get("Contents", []):
        s3.delete_object(Bucket=BUCKET, Key=listed["Key"])
    s3.put_object(Bucket=BUCKET, Key=f"{PACKAGE}/config.json", Body=b"{}")
    s3.put_object(Bucket=BUCKET, Key=f"{PACKAGE}/model.safetensors", Body=b"w" * 2000)
    return Remote(tmp_path, None)


def _written(root: Path) -> list[str]:
    """The files under ``root`` but the DVC workspace's own."""
    return sorted(p.relative_to(root).as_posix() for p in root.rglob("*") if p.is_file()
                  and not p.relative_to(root).parts[0].startswith(".dvc"))


def test_a_whole_package_downloads(remote: Remote, tmp_path: Path) -> None:
    dest = remote.download(f"{remote.url}/rcpipe/versions/n1/bidaf", tmp_path / "cache" / "p",
                           ReadLimits())
    assert _written(dest) == ["config.json", "model.safetensors"]


@pytest.mark.parametrize("key", ["../../evil", "sub/../../../evil", "/evil", "./evil"],
                         ids=["dotdot", "dotdot_inside", "absolute", "dot"])
def test_a_key_leading_out_of_the_package_is_refused_and_nothing_written(
        remote: Remote, s3: Any, tmp_path: Path, key: str) -> None:
    s3.put_object(Bucket=BUCKET, Key=f"{PACKAGE}/{key}", Body=b"owned")
    url = f"{remote.url}/rcpipe/versions/n1/bidaf"
    dest = tmp_path / "cache" / "p"  # ../../evil from here is tmp_path/evil
    with pytest.raises(InputError) as e:
        remote.download(url, dest, ReadLimits())
    assert e.value.line() == (
        f"error: {url}/{key}: refused: a key that "
        "leads out of the package (an empty, '.' or '..' part, or an absolute path); nothing "
        f"written to {dest}")
    assert _written(tmp_path) == []  # not the evil file, not the package's good ones


def test_a_link_planted_in_the_destination_is_not_followed(
        remote: Remote, s3: Any, tmp_path: Path) -> None:
    s3.put_object(Bucket=BUCKET, Key=f"{PACKAGE}/sub/x.json", Body=b"{}")
    dest, elsewhere = tmp_path / "cache" / "p", tmp_path / "elsewhere"
    dest.mkdir(parents=True)
    elsewhere.mkdir()
    (dest / "sub").symlink_to(elsewhere)  # a download's folder replaced by a link
    with pytest.raises(InputError) as e:
        remote.download(f"{remote.url}/rcpipe/versions/n1/bidaf", dest, ReadLimits())
    assert e.value.line() == (f"error: {remote.url}/rcpipe/versions/n1/bidaf/sub/x.json: "
                              f"refused: {dest / 'sub'} is a link or not a directory")
    assert list(elsewhere.iterdir()) == [] and _written(dest) == []


def test_an_object_over_the_weights_cap_is_refused_before_anything_is_written(
        remote: Remote, tmp_path: Path) -> None:
    url = f"{remote.url}/rcpipe/versions/n1/bidaf"
    with pytest.raises(InputError) as e:
        remote.download(url, tmp_path / "cache" / "p", ReadLimits(weights_mb=0.001))
    assert e.value.line() == (f"error: {url}/model.safetensors: 2,000 bytes, over the cap of "
                              "1,000 bytes (limits.weights_mb)")
    assert _written(tmp_path) == []
