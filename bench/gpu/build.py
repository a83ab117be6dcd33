"""Build the GPU kit: one ignored folder, gpu-kit/, holding what a bare GPU box lacks
(bench/gpu/README.md says what each part is and why).

  gpu-kit/base/  every call: the article split prepared at params.yaml's sizes (v1.1 and v2.0
                 Parquet, no word vectors) with each test file, the wheels the box lacks,
                 bench/peers.py's peers (box.PEERS) with the real-text batch both sides
                 read, and manifest.json (versions, sizes, the Ray archive's sha256, each
                 call's measured MiB)
  gpu-kit/ray/   call 2: Ray's cp312 wheel slimmed (box.RAY_LEFT_OUT), one tar.xz
  gpu-kit/peer-accuracy/  call 3: bench/peer_accuracy.py's shared-vectors folder (v1.1 at
                 the CPU preset's sizes, word_emb.npy the seeded matrix both sides start
                 from) and the test file

Versions are uv.lock's, and the Ray wheel is checked against the lock's sha256. Each call's
carry is measured with the working tree and held to its `mib_limit` in bench/gpu/plan.json
(a build leaves the tree clean). It needs the registry, ../shared (spaCy prepares here) and
the peers' checkouts (--peers: <owner>+<name>/repo git directories, as the fetch tool leaves
them): `make gpu-kit`, never the tests.
"""

from __future__ import annotations

import argparse
import json
import lzma
import shutil
import subprocess
import sys
import tarfile
import tempfile
import tomllib
import zipfile
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from bench.accuracy import prepare  # noqa: E402 - the repo root first
from bench.common import SPLIT, SQUAD  # noqa: E402
from bench.gpu.box import PEER_TEXT, PEERS, RAY, RAY_LEFT_OUT, WHEELS  # noqa: E402
from bench.gpu.results import CALLS  # noqa: E402
from rcpipe.reads import sha256_of  # noqa: E402

MiB = 2**20
VERSIONS = ("1.1", "2.0")
# the box: CPython 3.12 on x86-64 Linux (pip matches each manylinux tag exactly)
PLATFORM = ["--python-version", "3.12", "--implementation", "cp",
            *[a for p in ("manylinux_2_28_x86_64", "manylinux_2_17_x86_64",
                          "manylinux2014_x86_64") for a in ("--platform", p)]]


def locked(lock: Path = ROOT / "uv.lock") -> dict[str, dict[str, Any]]:
    """uv.lock's packages by name: {name: its [[package]] table}; a name locked at two
    versions (by Python marker) keeps the later, the one for 3.12."""
    return {p["name"]: p for p in tomllib.loads(lock.read_text())["package"]}


def download(names: list[str], lock: dict[str, dict[str, Any]], dest: Path) -> list[Path]:
    """Each package's cp312 manylinux (or pure) wheel at its locked version, no dependencies."""
    dest.mkdir(parents=True, exist_ok=True)
    pins = [f"{n}=={lock[n]['version']}" for n in names]
    subprocess.run([sys.executable, "-m", "pip", "download", "--quiet", "--no-deps",
                    "--only-binary=:all:", *PLATFORM, "-d", str(dest), *pins], check=True)
    return sorted(dest.glob("*.whl"))


def check_locked_hash(wheel: Path, package: dict[str, Any]) -> None:
    """The downloaded wheel is the one uv.lock names, byte for byte."""
    want = {w["url"].rsplit("/", 1)[1]: w["hash"] for w in package.get("wheels", [])}
    if want.get(wheel.name) != f"sha256:{sha256_of(wheel)}":
        raise SystemExit(f"{wheel.name}: not the wheel uv.lock pins")


def pack(tree: Path, archive: Path) -> Path:
    """``tree`` as one tar.xz (Python's lzma reads it on the box: no zstd needed there)."""
    archive.parent.mkdir(parents=True, exist_ok=True)
    with lzma.open(archive, "wb", preset=9) as xz, tarfile.open(fileobj=xz, mode="w") as tar:
        for path in sorted(tree.iterdir()):
            tar.add(path, arcname=path.name)  # file modes kept: Ray's gcs_server, raylet run
    return archive


def ray_slim(lock: dict[str, dict[str, Any]], kit: Path) -> dict[str, Any]:
    """Ray's locked cp312 wheel, checked, unpacked, slimmed and packed into gpu-kit/ray/."""
    with tempfile.TemporaryDirectory(prefix="gpu-kit-ray-") as tmp:
        wheel, = download([RAY], lock, Path(tmp) / "whl")
        check_locked_hash(wheel, lock[RAY])
        tree = Path(tmp) / "tree"
        with zipfile.ZipFile(wheel) as z:
            for info in z.infolist():  # zipfile drops the file modes: put them back
                z.extract(info, tree)
                if mode := info.external_attr >> 16:
                    (tree / info.filename).chmod(mode & 0o777)
        cut = 0  # what Ray Train on one node never loads
        for rel in RAY_LEFT_OUT:
            if (path := tree / rel).exists():
                cut += size_of(path)
                shutil.rmtree(path)
        archive = pack(tree, kit / "ray" / f"{wheel.name.removesuffix('.whl')}.tar.xz")
        return {"wheel": wheel.name, "wheel_bytes": wheel.stat().st_size, "cut_bytes": cut,
                "left_out": list(RAY_LEFT_OUT), "archive": archive.name,
                "archive_bytes": archive.stat().st_size, "archive_sha256": sha256_of(archive),
                "path": str(archive.relative_to(kit.parent))}


def size_of(path: Path) -> int:
    return sum(p.stat().st_size for p in path.rglob("*") if p.is_file()) if path.is_dir() \
        else path.stat().st_size


def working_tree_bytes() -> int:
    """What a device call sends besides the carried paths: tracked and untracked files git
    does not ignore."""
    listed = subprocess.run(["git", "ls-files", "-z", "--cached", "--others",
                             "--exclude-standard"], cwd=ROOT, capture_output=True,
                            check=True).stdout.split(b"\0")
    return sum((ROOT / p.decode()).stat().st_size for p in listed
               if p and (ROOT / p.decode()).is_file())


def measured_calls(kit: Path) -> dict[str, float]:
    """Each call of bench/gpu/plan.json: the MiB it sends, its carry and the working tree."""
    tree = working_tree_bytes()
    return {c["call"]: round((tree + sum(size_of(kit.parent / p) for p in c["carry"])) / MiB, 1)
            for c in CALLS}


def git_dir(peers: Path, repo: str) -> Path:
    """The peer's git directory under ``peers`` (the fetch tool's <owner>+<name>/repo)."""
    where = peers / repo.replace("/", "+") / "repo"
    for candidate in (where / ".git", where):
        if (candidate / "HEAD").is_file():
            return candidate
    raise SystemExit(f"{where}: no checkout of {repo} (fetch github:{repo} first)")


def peer_code(peers: Path, dest: Path) -> dict[str, Any]:
    """box.PEERS' files, each peer's from a `git archive` of its pinned commit."""
    shutil.rmtree(dest, ignore_errors=True)
    got = {}
    for variant, (repo, commit, folder, files) in PEERS.items():
        (dest / folder).mkdir(parents=True)
        archive = subprocess.run(["git", "--git-dir", str(git_dir(peers, repo)), "archive",
                                  "--format=tar", commit, "--", *files],
                                 capture_output=True, check=True).stdout
        with tempfile.TemporaryFile() as f:
            f.write(archive)
            f.seek(0)
            with tarfile.open(fileobj=f) as tar:
                tar.extractall(dest / folder, filter="data")
        got[variant] = {"repo": repo, "commit": commit, "folder": folder, "files": list(files)}
    return got


def peer_accuracy_data(split: Path, dest: Path) -> dict[str, Any]:
    """bench/peer_accuracy.py's shared vectors prepared here (spaCy), for --prepared there."""
    from bench.peer_accuracy import shared_vectors

    test = split / "test-v1.1.json"
    with tempfile.TemporaryDirectory(prefix="gpu-kit-peers-") as tmp:
        _, prepared = shared_vectors(Path(tmp), split / "train-v1.1.json", test)
        shutil.rmtree(dest, ignore_errors=True)
        shutil.copytree(prepared, dest / "prepared")
    shutil.copyfile(test, dest / test.name)
    meta = json.loads((dest / "prepared" / "meta.json").read_text())
    return {"bytes": size_of(dest), "words": meta["words"], "word_dim": meta["word_dim"]}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--split", type=Path, default=SPLIT, help="train-v<V>.json, test-v<V>.json")
    ap.add_argument("--kit", type=Path, default=ROOT / "gpu-kit")
    ap.add_argument("--params", type=Path, default=ROOT / "params.yaml")
    ap.add_argument("--peers", type=Path, default=ROOT.parent / ".mirror",
                    help="<owner>+<name>/repo dirs")
    args = ap.parse_args()
    kit, base = args.kit.resolve(), args.kit.resolve() / "base"
    lock = locked()
    data: dict[str, Any] = {}
    for version in VERSIONS:  # spaCy runs here: the box gets Parquet files
        out = base / f"v{version}"
        test = args.split / f"test-v{version}.json"
        prepare(args.params, args.split / f"train-v{version}.json", test, out / "prepared", [])
        shutil.copyfile(test, out / "test.json")  # the dev file: scored, never tuned on
        shutil.rmtree(out / "cache", ignore_errors=True)  # prepare's cache: not needed there
        data[version] = {"bytes": size_of(out),
                         "meta": json.loads((out / "prepared" / "meta.json").read_text())}
    from bench.peer_text import read_text_batch, save_text_batch

    peers = peer_code(args.peers, base / "peers")  # bench/peers.py's defaults: 32 x 300 + 30
    save_text_batch(read_text_batch(SQUAD, 32, 300, 30, 20_000), 20_000,
                    base / "peers" / PEER_TEXT)
    peer_accuracy = peer_accuracy_data(args.split, kit / "peer-accuracy")
    shutil.rmtree(base / "wheels", ignore_errors=True)
    wheels = download(list(WHEELS), lock, base / "wheels")
    for old in (*kit.glob("ray-*"), kit / "ray"):  # ray-1, ray-2: the kit before the slimming
        shutil.rmtree(old, ignore_errors=True)
    ray = ray_slim(lock, kit)
    manifest = {"params": str(args.params.relative_to(ROOT)), "split": str(args.split),
                "data": data, "wheels": {w.name: w.stat().st_size for w in wheels},
                "ray": ray, "peers": peers, "peer_accuracy": peer_accuracy}
    (base / "manifest.json").write_text(json.dumps(manifest, indent=1) + "\n")
    manifest["mib"] = measured_calls(kit)  # base's size with its manifest
    (base / "manifest.json").write_text(json.dumps(manifest, indent=1) + "\n")
    print(f"Ray {ray['wheel_bytes'] / MiB:.1f} MiB wheel, {ray['cut_bytes'] / MiB:.1f} MiB cut "
          f"-> {ray['archive_bytes'] / MiB:.1f} MiB archive")
    for c in CALLS:
        print(f"call {c['call']}: working tree + {' + '.join(c['carry'])} = "
              f"{manifest['mib'][c['call']]} MiB of at most {c['mib_limit']}, "
              f"{c['device_minutes']} device-minutes")
    if over := [c["call"] for c in CALLS if manifest["mib"][c["call"]] > c["mib_limit"]]:
        raise SystemExit(f"calls {over}: over their mib_limit in bench/gpu/plan.json")
    print(f"-> {kit}")


if __name__ == "__main__":
    main()
