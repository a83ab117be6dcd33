"""The fetch stage: the raw SQuAD files and word vectors, downloaded once and verified.

dvc.yaml's first stage. A remote source (http(s)://, s3://) is downloaded into
data.cache_dir under the name that prepare, evaluate and ensemble look for
(rcpipe.data.squad.cache_path), so no later stage touches the network. A source pinned in
data.sha256 must match its pin, else its download is deleted and the run stops.
``sources.json`` next to the downloads records every source's sha256 and size, local files
included: DVC versions it with the downloads, so the digests travel with each version.
"""

from __future__ import annotations

import logging
from typing import Any

from rcpipe.config import Config
from rcpipe.errors import InputError
from rcpipe.layout import write_json
from rcpipe.reads import sha256_of

log = logging.getLogger(__name__)
MANIFEST = "sources.json"


def sources(cfg: Config) -> dict[str, str]:
    """role -> URI of every input file the params name (word vectors only when set)."""
    d = cfg.data
    found = {"train": d.train_file, "dev": d.dev_file}
    return found | ({"word_vectors": d.word_vectors} if d.word_vectors else {})


def check_pin(uri: str, digest: str, pins: dict[str, str]) -> None:
    """Raise when ``uri`` is pinned to another digest (pins compare case-insensitively)."""
    expected = pins.get(uri)
    if expected is not None and expected.strip().lower() != digest:
        raise InputError(uri, "", f"sha256 {digest} does not match data.sha256 "
                                  f"({expected.strip().lower()}): the file changed upstream "
                                  "or the download is corrupt")


def fetch(cfg: Config) -> dict[str, dict[str, Any]]:
    """Download and verify every source; write the manifest; return it."""
    from rcpipe.data.squad import cache_path, is_remote
    from rcpipe.data.squad import fetch as download

    cache = cfg.data.cache_dir
    cache.mkdir(parents=True, exist_ok=True)
    manifest: dict[str, dict[str, Any]] = {}
    for role, uri in sources(cfg).items():
        path = download(uri, cache, limits=cfg.limits)  # a local source is its own path
        digest = sha256_of(path)
        try:
            check_pin(uri, digest, cfg.data.sha256)
        except InputError:
            if is_remote(uri):
                path.unlink(missing_ok=True)  # the next run downloads it again
            raise
        manifest[role] = {"uri": uri, "sha256": digest, "bytes": path.stat().st_size,
                          "pinned": uri in cfg.data.sha256}
        log.info(f"fetch: {role}: {uri} sha256 {digest[:12]}"
                 + (" (pinned)" if uri in cfg.data.sha256 else ""))
    keep = {cache_path(m["uri"], cache).name for m in manifest.values() if is_remote(m["uri"])}
    for stale in cache.iterdir():  # the directory is one DVC output: only current sources
        if stale.is_file() and stale.name != MANIFEST and stale.name not in keep:
            stale.unlink()
    write_json(cache / MANIFEST, manifest)
    return manifest
