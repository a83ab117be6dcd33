"""The records versioning keeps on the DVC remote (``<remote>/rcpipe/``), the push of a run's
outputs to it (``push``, retried), and the git and dvc runners of versioning.

`rcpipe version` (rcpipe/stages/version.py), the champion gate (gate.py), the nights page
(nights.py) and the service's champion lookup all reach the remote through ``Remote``, and
git through ``git``. This module imports none of them, so the imports among them run one
way: version -> gate, nights -> remote.
"""

from __future__ import annotations

import hashlib
import logging
import os
import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from rcpipe import reads
from rcpipe.config import ReadLimits
from rcpipe.errors import InputError
from rcpipe.locks import locked
from rcpipe.reads import size_text, too_big
from rcpipe.release.rules import classify_failure
from rcpipe.retry import GaveUp, retried
from rcpipe.safe_open import write_new

log = logging.getLogger(__name__)
RECORDS = "rcpipe"  # <remote>/rcpipe/: champion.json and versions/<run>/ (DVC uses files/, runs/)


class Changed(Exception):
    """A compare-and-swap lost: the record changed since it was read (Remote.write_if)."""


def _digest(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def dvc(root: Path, *args: str) -> subprocess.CompletedProcess[str]:
    """One dvc command in ``root`` (waiting for DVC's own lock), output captured."""
    env = {**os.environ, "DVC_NO_ANALYTICS": "1"}
    return subprocess.run([sys.executable, "-m", "dvc", "--wait-for-lock", *args], cwd=root,
                          env=env, capture_output=True, text=True)


def git(root: Path, *args: str) -> subprocess.CompletedProcess[str]:
    """One git command in ``root``, its output captured (the one git runner of versioning)."""
    return subprocess.run(["git", *args], cwd=root, capture_output=True, text=True)


def identity(root: Path) -> tuple[str, str]:
    """Who commits and tags: the checkout's git identity, else rcpipe's (a pod has none)."""
    name = git(root, "config", "user.name").stdout.strip()
    email = git(root, "config", "user.email").stdout.strip()
    return (name, email) if email else ("rcpipe", "rcpipe@localhost")


class Remote:
    """The DVC remote, through DVC's own file system for it: its URL, endpoint and keys
    (``.dvc/config``, ``.dvc/config.local``, else the standard AWS environment)."""

    def __init__(self, root: Path, name: str | None) -> None:
        from dvc.config import RemoteConfigError
        from dvc.exceptions import NotDvcRepoError
        from dvc.repo import Repo

        try:
            with Repo(str(root)) as repo:
                remote = repo.cloud.get_remote(name, command="push")
                self.url = repo.config["remote"][remote.name]["url"].rstrip("/")
        except RemoteConfigError as e:
            what = (str(e).splitlines() or ["no remote"])[0].rstrip(".")
            raise InputError(root / ".dvc/config", f"remote {name or '(default)'}",
                             f"{what}; add one: `dvc remote add -d storage s3://BUCKET/PREFIX`"
                             ) from None
        except NotDvcRepoError:
            raise InputError(root, "", "not a DVC workspace (no .dvc): its .dvc/config names "
                             "the remote; run there, or `dvc init` and `dvc remote add`"
                             ) from None
        self.name, self.fs, self.path = remote.name, remote.fs, remote.path

    def _where(self, *parts: str) -> tuple[str, str]:
        """(the file system's path, the URL) of ``<remote>/rcpipe/<parts>``; refused in one
        line when a part would lead out of it (a night named ``n1/../n2``, a package URL
        through ``..``): S3 keys are names, but a directory remote's are paths."""
        url = "/".join((self.url, RECORDS, *parts))
        names = [n for part in parts for n in part.split("/")]
        if any(n in ("", ".", "..") or "\0" in n or "\\" in n for n in names):
            raise InputError(url, "", "refused: a name that leads out of the remote's "
                             "records (an empty, '.' or '..' part)")
        return self.fs.join(self.path, RECORDS, *names), url

    def read_json(self, *parts: str, cap: int = reads.JSON_MB * reads.MB,
                  key: str = "limits.json_mb") -> dict[str, Any] | None:
        """A record under ``<remote>/rcpipe/`` parsed (None when absent), refused past
        ``cap`` bytes as they arrive."""
        path, url = self._where(*parts)
        try:
            if not self.fs.exists(path):
                return None
            with self.fs.open(path, "rb") as f:
                data = f.read(cap + 1)
            if len(data) > cap:
                raise too_big(url, f"over {size_text(cap)}", cap, key)
            return reads.parse_json(data, url)
        except InputError:
            raise
        except ValueError:
            raise InputError(url, "", "not valid JSON") from None
        except Exception as e:  # noqa: BLE001 - s3fs/botocore raise many types
            raise InputError(url, "", f"cannot read: {str(e).splitlines()[0][:200]}") from None

    def write(self, data: bytes, *parts: str) -> str:
        path, url = self._where(*parts)
        try:
            if self.fs.protocol == "local":  # a directory remote needs its folders; S3 none
                self.fs.makedirs(self.fs.parent(path), exist_ok=True)
            self.fs.pipe_file(path, data)
        except Exception as e:  # noqa: BLE001
            raise InputError(url, "", f"cannot write: {str(e).splitlines()[0][:200]}") from None
        return url

    def read_tagged(self, cap: int, *parts: str, key: str = "limits.record_kb"
                    ) -> tuple[bytes | None, str | None]:
        """(the bytes of ``<remote>/rcpipe/<parts>`` or None when absent, its version tag
        for ``write_if``): refused past ``cap`` bytes (the params key ``key``) as they
        arrive. The tag is S3's ETag of the very bytes read (one GET), else their sha256."""
        path, url = self._where(*parts)
        try:
            if self.fs.protocol == "s3":
                return self._s3_get(path, cap, url, key)
            if self.fs.protocol != "local":  # read like any record; write_if refuses a swap
                if not self.fs.exists(path):
                    return None, None
                with self.fs.open(path, "rb") as f:
                    data = f.read(cap + 1)
            else:
                # the record's lock, taken by its readers and compare-and-swap writers on
                with locked(Path(f"{path}.lock")):  # every machine sharing the directory
                    if not os.path.isfile(path):
                        return None, None
                    with open(path, "rb") as f:
                        data = f.read(cap + 1)
        except InputError:
            raise
        except Exception as e:  # noqa: BLE001 - s3fs/botocore raise many types
            raise InputError(url, "", f"cannot read: {str(e).splitlines()[0][:200]}") from None
        if len(data) > cap:
            raise too_big(url, f"over {size_text(cap)}", cap, key)
        return data, _digest(data)

    def swaps(self) -> bool:
        """Whether ``write_if`` can compare-and-swap on this remote (S3, a directory)."""
        return self.fs.protocol in ("s3", "local")

    def write_if(self, data: bytes, tag: str | None, *parts: str) -> str:
        """Write ``data`` to ``<remote>/rcpipe/<parts>`` only if it is still the version
        ``tag`` read_tagged gave (None: only if nothing is there): compare-and-swap, S3's
        conditional PUT (If-Match / If-None-Match), a directory remote's under a file lock.
        Raises Changed when another writer came first; the URL otherwise."""
        path, url = self._where(*parts)
        try:
            if self.fs.protocol == "s3":
                if not self._s3_put_if(path, data, tag):
                    raise Changed(url)
                return url
            if not self.swaps():
                raise InputError(url, "", f"a {self.fs.protocol} remote: the champion record "
                                 "is changed by compare-and-swap, which rcpipe does on S3 and "
                                 "directory remotes only")
            os.makedirs(os.path.dirname(path), exist_ok=True)
            with locked(Path(f"{path}.lock")):  # the record's lock (read_tagged)
                now = None
                if os.path.isfile(path):
                    with open(path, "rb") as f:
                        now = _digest(f.read())
                if now != tag:
                    raise Changed(url)
                tmp = f"{path}.{os.getpid()}.part"
                write_new(Path(tmp), data)
                os.replace(tmp, path)
        except (InputError, Changed):
            raise
        except Exception as e:  # noqa: BLE001
            raise InputError(url, "", f"cannot write: {str(e).splitlines()[0][:200]}") from None
        return url

    def _s3_get(self, path: str, cap: int, url: str, key: str
                ) -> tuple[bytes | None, str | None]:
        from fsspec.asyn import sync

        s3 = self.fs.fs  # s3fs under DVC's file system
        bucket, key, _ = s3.split_path(path)

        async def get() -> tuple[bytes | None, str | None]:
            try:
                found = await s3._call_s3("get_object", Bucket=bucket, Key=key)
            except FileNotFoundError:
                return None, None
            body, chunks, got = found["Body"], [], 0
            try:  # one read() may return what has arrived so far: read to the end or cap
                while got <= cap and (chunk := await body.read(cap + 1 - got)):
                    chunks.append(chunk)
                    got += len(chunk)
            finally:
                body.close()
            return b"".join(chunks), found["ETag"]

        data, etag = sync(s3.loop, get)
        if data is not None and len(data) > cap:
            raise too_big(url, f"over {size_text(cap)}", cap, key)
        return data, etag

    def _s3_put_if(self, path: str, data: bytes, tag: str | None) -> bool:
        """The conditional PUT; False when its condition failed (another writer first)."""
        s3 = self.fs.fs
        bucket, key, _ = s3.split_path(path)
        condition = {"IfNoneMatch": "*"} if tag is None else {"IfMatch": tag}
        try:
            s3.call_s3("put_object", Bucket=bucket, Key=key, Body=data, **condition)
        except OSError as e:  # FileExistsError included (If-None-Match)
            code = getattr(e.__cause__, "response", {}).get("Error", {}).get("Code", "")
            if isinstance(e, FileExistsError) or code in ("PreconditionFailed",
                                                          "ConditionalRequestConflict"):
                return False
            raise
        return True

    def list(self, *parts: str) -> list[str]:
        """The names directly under ``<remote>/rcpipe/<parts>`` (none when it is absent)."""
        path, url = self._where(*parts)
        try:
            if not self.fs.exists(path):
                return []
            return sorted(p.rstrip("/").rsplit("/", 1)[-1] for p in self.fs.ls(path))
        except Exception as e:  # noqa: BLE001
            raise InputError(url, "", f"cannot list: {str(e).splitlines()[0][:200]}") from None

    def link(self, seconds: int, *parts: str) -> str:
        """A link a browser opens: presigned for ``seconds`` where the remote signs (S3),
        else the remote's URL."""
        path, url = self._where(*parts)
        try:
            return str(self.fs.sign(path, expiration=seconds))
        except Exception:  # noqa: BLE001 - a local or HTTP remote does not sign
            return url

    def _parts(self, url: str) -> list[str]:
        """The parts under ``<remote>/rcpipe/`` of a URL this remote wrote."""
        head = f"{self.url}/{RECORDS}/"
        if not url.startswith(head):
            raise InputError(url, "", f"not under this remote's records ({head})")
        return url.removeprefix(head).split("/")

    def read_url(self, url: str) -> dict[str, Any] | None:
        """read_json of a URL this remote wrote (None when it is gone)."""
        return self.read_json(*self._parts(url))

    def download(self, url: str, dest: Path, limits: ReadLimits) -> Path:
        """Every file under the directory ``url`` (a package this remote holds) into
        ``dest``. A key is a name the remote's writer chose: each must name a file inside
        ``dest`` (no ``..``, empty or absolute part, no link on the way) and each object be
        within limits.weights_mb (a package's largest file is its weights). Every key and
        size is checked before anything is written: a refused package writes nothing."""
        path, _ = self._where(*self._parts(url))
        cap = limits.weights_bytes()
        try:
            found = [(file, self.fs.info(file)["size"]) for file in self.fs.find(path)]
        except Exception as e:  # noqa: BLE001 - s3fs/botocore raise many types
            raise InputError(url, "", f"cannot read: {str(e).splitlines()[0][:200]}") from None
        if not found:
            raise InputError(url, "", "nothing there")
        files = []
        for file, size in found:
            name, target = confined(file, path, url, dest)
            if size is not None and size > cap:
                raise too_big(name, size, cap, "limits.weights_mb")
            _real_dirs(target.parent, dest, name)
            files.append((file, name, target))
        for file, name, target in files:
            data = self._read_capped(file, name, cap)
            target.parent.mkdir(parents=True, exist_ok=True)
            tmp = target.with_name(f".{target.name}.part")
            write_new(tmp, data)  # a link planted at either name is replaced, not followed
            os.replace(tmp, target)
        return dest

    def _read_capped(self, file: str, name: str, cap: int) -> bytes:
        """An object's bytes, refused past ``cap`` as they arrive (a size the listing
        understated)."""
        try:
            with self.fs.open(file, "rb") as f:
                data = f.read(cap + 1)
        except Exception as e:  # noqa: BLE001 - s3fs/botocore raise many types
            raise InputError(name, "", f"cannot read: {str(e).splitlines()[0][:200]}") from None
        if len(data) > cap:
            raise too_big(name, f"over {size_text(cap)}", cap, "limits.weights_mb")
        return data


def confined(key: str, under: str, url: str, dest: Path) -> tuple[str, Path]:
    """(the key's URL, its file in ``dest``) for a key found under the remote's path
    ``under``; refused when its parts would lead out of ``dest``."""
    head = under.rstrip("/") + "/"
    rel = key.removeprefix(head)
    name = f"{url}/{rel}"
    parts = rel.split("/")
    if not key.startswith(head) or any(p in ("", ".", "..") or "\0" in p for p in parts):
        raise InputError(name, "", "refused: a key that leads out of the package (an empty, "
                         f"'.' or '..' part, or an absolute path); nothing written to {dest}")
    return name, dest.joinpath(*parts)


def _real_dirs(folder: Path, dest: Path, name: str) -> None:
    """Refused unless each part of ``folder`` (inside ``dest``) that exists is a real
    directory: a link planted in ``dest`` would carry the write out of it."""
    for part in [*reversed(folder.relative_to(dest).parents), folder.relative_to(dest)]:
        at = dest / part
        if at.is_symlink() or (at.exists() and not at.is_dir()):
            raise InputError(name, "", f"refused: {at} is a link or not a directory")


def push(root: Path, targets: Sequence[str], remote: Remote, tries: int = 3,
         backoff: float = 2.0) -> None:
    """`dvc push` of ``targets`` to ``remote``, a failure that may pass retried with backoff
    (rcpipe.retry): the remote is content-addressed and an object appears only once uploaded
    whole, so a retry sends what is missing and nothing half-written is ever visible. A
    one-line InputError naming the remote when it gives up."""

    def once() -> None:
        out = dvc(root, "push", "-r", remote.name, *targets)
        if out.returncode != 0:
            failure = classify_failure(out.stdout + "\n" + out.stderr)
            if not failure.retryable:
                raise InputError(remote.url, "dvc push", f"{failure.what} ({failure.detail})")
            raise _Failed(failure)

    def waiting(e: Exception, n: int, wait: float) -> None:
        log.info(f"version: push failed ({e.args[0].detail}); try {n + 1} of {tries} in "
                 f"{wait:.0f}s")

    try:
        retried(once, tries, backoff, retryable=lambda e: isinstance(e, _Failed),
                waiting=waiting)
    except GaveUp as e:
        failure = e.error.args[0]
        raise InputError(remote.url, "dvc push", f"{failure.what} after {e.tries} tries "
                         f"({failure.detail}); what was uploaded is complete: push again "
                         "once it is up") from None


class _Failed(Exception):
    """A `dvc push` that failed in a way a retry may mend (its rules.Failure)."""
