"""Reading a file a user hands rcpipe, within limits: a regular file only (a device such as
/dev/zero never ends, a FIFO waits for a writer forever), at most a cap of bytes, known
before anything is read, and JSON or YAML nested no deeper than a bound (Python's parsers
recurse, so a deep one is a RecursionError, not a located error). Every refusal is one
located InputError naming the params key that raises the cap (config.ReadLimits).
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import stat
import unicodedata
import zlib
from itertools import accumulate
from pathlib import Path
from typing import IO, Any

from rcpipe.errors import InputError

MB = 1_000_000
BLOCK = 1 << 20  # a checksum's reads: a file of any size costs this much memory to check
# the defaults of limits.json_mb and limits.depth (config.ReadLimits): what a JSON file read
# without a config (one rcpipe wrote itself: a summary, a journal, export.json) is held to
JSON_MB = 512
DEPTH = 64


def size_text(n: int) -> str:
    return f"{n / MB:,.1f} MB" if n >= MB / 10 else f"{n:,} bytes"


def too_big(name: str | Path, size: int | str, cap: int, key: str) -> InputError:
    size = size_text(size) if isinstance(size, int) else size
    return InputError(name, "", f"{size}, over the cap of {size_text(cap)} ({key})")


def kind_of(mode: int) -> str:
    """What a file that is not a regular one is, for a refusal ("a FIFO")."""
    for test, kind in ((stat.S_ISDIR, "a directory"), (stat.S_ISFIFO, "a FIFO"),
                       (stat.S_ISCHR, "a character device"), (stat.S_ISBLK, "a block device"),
                       (stat.S_ISSOCK, "a socket")):
        if test(mode):
            return kind
    return "not a regular file"


def open_regular(path: Path, name: str | Path | None = None, inside: Path | None = None
                 ) -> IO[bytes]:
    """``path`` open for reading, refused unless it is a regular file and, with ``inside``,
    lies in that directory once links are followed (a package's file linked elsewhere)."""
    name = path if name is None else name
    if inside is not None and not path.resolve().is_relative_to(inside.resolve()):
        raise InputError(name, "", f"refused: a link out of {inside} (to {path.resolve()})")
    try:
        # O_NONBLOCK: opening a FIFO returns at once instead of waiting for a writer; the
        # file is checked on the descriptor itself, so it cannot be swapped in between
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
    except FileNotFoundError:
        raise InputError(name, "", "no such file") from None
    except OSError as e:
        raise InputError(name, "", e.strerror or "cannot read") from None
    mode = os.fstat(fd).st_mode
    if not stat.S_ISREG(mode):
        os.close(fd)
        raise InputError(name, "", f"refused: {kind_of(mode)}, not a regular file")
    os.set_blocking(fd, True)
    return os.fdopen(fd, "rb")


def read_bytes(path: Path, cap: int, key: str, name: str | Path | None = None,
               inside: Path | None = None) -> bytes:
    """The bytes of a regular file of at most ``cap`` bytes (``key``: the params key of the
    cap, named by the refusal)."""
    name = path if name is None else name
    with open_regular(path, name, inside) as f:
        size = os.fstat(f.fileno()).st_size
        if size > cap:
            raise too_big(name, size, cap, key)
        data = read_up_to(f, cap + 1)  # a file growing as it is read is held to the cap too
    if len(data) > cap:
        raise too_big(name, f"over {size_text(cap)}", cap, key)
    return data


def blank(text: str) -> bool:
    """Whether ``text`` says nothing: only spaces and invisible format characters
    (zero-width spaces and joiners, U+2060, a BOM: Unicode's Cf), which str.strip keeps
    and the tokenizer reads as no token."""
    return all(c.isspace() or unicodedata.category(c) == "Cf" for c in text)


def read_up_to(f: IO[bytes], n: int) -> bytes:
    """At most ``n`` bytes of ``f``, a block at a time: ``f.read(n)`` allocates all ``n``
    at once (a cap of 512 MB for a 2 KB file was a MemoryError in 1 GiB)."""
    blocks, total = [], 0
    while total < n and (block := f.read(min(BLOCK, n - total))):
        blocks.append(block)
        total += len(block)
    return b"".join(blocks)


def decode(data: bytes, name: str | Path) -> str:
    """UTF-8 text, or the located byte where it is not."""
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as e:
        raise InputError(name, f"byte {e.start}", "not UTF-8 text") from None


def read_text(path: Path, cap: int, key: str, name: str | Path | None = None) -> str:
    return decode(read_bytes(path, cap, key, name), path if name is None else name)


def sha256_of(path: Path) -> str:
    """sha256 of a regular file's bytes, read a block at a time (a device or FIFO named
    as a source would never end: refused)."""
    h = hashlib.sha256()
    with open_regular(path) as f:
        for block in iter(lambda: f.read(BLOCK), b""):
            h.update(block)
    return h.hexdigest()


def read_checked(path: Path, sha256: str | None, cap: int, key: str,
                 inside: Path | None = None, hint: str = "") -> bytes:
    """The bytes of ``path`` once their sha256 is known to be ``sha256``: the file is
    hashed as it streams (a block at a time), and read whole only after it matched; the
    bytes read are hashed again, so a file changed in between is refused too."""
    with open_regular(path, inside=inside) as f:
        size = os.fstat(f.fileno()).st_size
        if size > cap:
            raise too_big(path, size, cap, key)
        h = hashlib.sha256()
        for block in iter(lambda: f.read(BLOCK), b""):
            h.update(block)
            if f.tell() > cap:
                raise too_big(path, f"over {size_text(cap)}", cap, key)
        if h.hexdigest() != sha256:
            raise InputError(path, "", f"refused: its sha256 is not the one recorded{hint}")
        f.seek(0)
        data = read_up_to(f, cap + 1)
    if hashlib.sha256(data).hexdigest() != sha256:
        raise InputError(path, "", f"refused: changed while read{hint}")
    return data


def gunzip(data: bytes, cap: int, key: str, name: str | Path) -> bytes:
    """A gzip file's content, refused once it inflates past ``cap`` (a small file may
    inflate a thousandfold)."""
    inflate = zlib.decompressobj(wbits=31)
    try:
        out = inflate.decompress(data, cap + 1)
    except zlib.error as e:  # corrupt deflate data
        raise InputError(name, "", f"cannot read: {e}") from None
    if len(out) > cap:
        raise too_big(name, f"over {size_text(cap)} inflated", cap, key)
    if not inflate.eof:
        raise InputError(name, "", "cannot read: the gzip stream ends early")
    return out


# ------------------------------------------------------------------------------ nesting

_STRING = re.compile(r'"[^"\\]*(?:\\.[^"\\]*)*"')  # a JSON string, escapes included
_NOT_BRACKET = re.compile(r"[^\[\]{}]+")
_STEP = {"[": 1, "{": 1, "]": -1, "}": -1}


def json_depth(text: str) -> int:
    """How deep ``text``'s arrays and objects nest, counted without parsing: its brackets
    outside strings (0.5 s for 40 MB; an unclosed or malformed text counts as far as it
    goes, and json.loads then says where it breaks)."""
    brackets = _NOT_BRACKET.sub("", _STRING.sub("", text))
    return max(accumulate(map(_STEP.__getitem__, brackets)), default=0)


def parse_json(text: str | bytes, name: str | Path, depth: int = DEPTH,
               key: str = "limits.depth") -> Any:
    """JSON ``text`` (bytes: UTF-8) parsed, refused when nested deeper than ``depth``; syntax
    errors located by line and column."""
    if isinstance(text, bytes):
        text = decode(text, name)
    found = json_depth(text)
    if found > depth:
        raise InputError(name, "", f"nested {found} deep, over the bound of {depth} ({key})")
    try:
        return json.loads(text)
    except json.JSONDecodeError as e:
        raise InputError(name, f"line {e.lineno} column {e.colno}", e.msg) from None


def read_json(path: Path, cap: int = JSON_MB * MB, depth: int = DEPTH, *,
              cap_key: str = "limits.json_mb", name: str | Path | None = None,
              inside: Path | None = None) -> Any:
    """The one way rcpipe reads a JSON file: a regular file (``inside``: not a link out of
    it) of at most ``cap`` bytes (gzip, when the file says so, inflated), UTF-8, nested at
    most ``depth`` deep; syntax errors located by line and column; each refusal one located
    InputError."""
    name = path if name is None else name
    raw = read_bytes(path, cap, cap_key, name, inside)
    if raw[:2] == b"\x1f\x8b":
        raw = gunzip(raw, cap, cap_key, name)
    return parse_json(raw, name, depth)


def yaml_depth_over(text: str, depth: int) -> int | None:
    """The depth a YAML ``text`` reaches past ``depth``, else None: counted on PyYAML's
    event stream, which (unlike its composer) does not recurse. Syntax errors are left to
    the load that follows."""
    import yaml

    level = 0
    try:
        for event in yaml.parse(text, Loader=yaml.SafeLoader):
            if isinstance(event, yaml.CollectionStartEvent):
                level += 1
                if level > depth:
                    return level
            elif isinstance(event, yaml.CollectionEndEvent):
                level -= 1
    except yaml.YAMLError:
        return None
    return None
