"""One pinned stack: uv.lock is the one list of versions, and whatever installs rcpipe reads it.

`make setup` (here and in CI) and the cluster image (infra/docker/Dockerfile) install from
uv.lock; the image's Ray, KubeRay's rayVersion and any Ray that a file in infra/ names are
the lock's Ray, one with Train V2 on; and this test's own environment is the lock. Offline
and fast, like tests/test_infra.py, whose Dockerfile reader it uses. The last test feeds
broken copies to the same checks, so that a check that could never fail would show.
"""

from __future__ import annotations

import re
import shlex
import subprocess
import tomllib
from importlib import metadata
from pathlib import Path

import yaml

from rcpipe.cluster.ray_runtime import TRAIN_V2_DEFAULT_SINCE
from tests.test_infra import (
    DOCKERFILE,
    INFRA,
    RAYCLUSTER,
    RAYJOB,
    dockerfile_args,
    dockerfile_instructions,
)

REPO = Path(__file__).resolve().parents[1]
LOCK = REPO / "uv.lock"

# Ray versions as infra files name them: an image tag, a pin, KubeRay's field, the ARG
RAY_MENTION = re.compile(r"""rayproject/ray(?:-ml)?:(\d+\.\d+\.\d+)"""
                         r"""|\bray(?:\[[\w,]+\])?==(\d+\.\d+\.\d+)"""
                         r"""|rayVersion:\s*["']?(\d+\.\d+\.\d+)|RAY_VERSION=(\d+\.\d+\.\d+)""")


def normalized(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()  # PEP 503, as uv.lock writes names


def locked() -> dict[str, set[str]]:
    """uv.lock's versions by package (a package may have one per Python: numpy)."""
    found: dict[str, set[str]] = {}
    for package in tomllib.loads(LOCK.read_text())["package"]:
        if "version" in package:
            found.setdefault(package["name"], set()).add(package["version"])
    return found


def locked_one(name: str) -> str:
    versions = locked()[name]
    assert len(versions) == 1, f"uv.lock holds {name} {sorted(versions)}: one expected"
    return next(iter(versions))


def ray_problems(texts: dict[str, str], ray: str) -> list[str]:
    """Where infra/ (texts by path under it) names a Ray other than ``ray``, the lock's."""
    problems = []
    if (image := dockerfile_args(texts["docker/Dockerfile"]).get("RAY_VERSION")) != ray:
        problems.append(f"docker/Dockerfile: RAY_VERSION {image}")
    for name in (RAYJOB, RAYCLUSTER):
        doc = yaml.safe_load(texts[str(name.relative_to(INFRA))])
        spec = doc["spec"]["rayClusterSpec"] if doc["kind"] == "RayJob" else doc["spec"]
        if spec.get("rayVersion") != ray:
            problems.append(f"{name.name}: rayVersion {spec.get('rayVersion')}")
    for name, text in sorted(texts.items()):
        for match in RAY_MENTION.finditer(text):
            if (named := next(v for v in match.groups() if v)) != ray:
                problems.append(f"{name}: names Ray {named} ({match[0]})")
    return problems


def infra_texts() -> dict[str, str]:
    return {str(p.relative_to(INFRA)): p.read_text() for p in sorted(INFRA.rglob("*"))
            if p.is_file()}


def make_setup_commands() -> list[list[str]]:
    """What `make setup` runs on this machine, variables expanded (make -n: nothing runs)."""
    out = subprocess.run(["make", "--no-print-directory", "-n", "-B", "setup"], cwd=REPO,
                         capture_output=True, text=True, check=True, timeout=60).stdout
    return [shlex.split(line) for line in out.replace("\\\n", " ").splitlines()
            if line.strip() and not line.lstrip().startswith("#")]


def image_problems(text: str, uv_version: str) -> list[str]:
    """The image installs every dependency from uv.lock (hashes checked), then rcpipe alone."""
    instructions = dockerfile_instructions(text)
    problems = []
    if dockerfile_args(text).get("UV_VERSION") != uv_version:
        problems.append(f"UV_VERSION is not the Makefile's uv {uv_version}")
    copied = {s for word, rest in instructions if word == "COPY" for s in rest.split()[:-1]}
    if "uv.lock" not in copied:
        problems.append("does not copy uv.lock")
    runs = " && ".join(rest for word, rest in instructions if word == "RUN")
    if not re.search(r"uv export --frozen .*--output-file (\S+) && uv pip install --system "
                     r"--require-hashes -r \1", runs):
        problems.append("does not install uv export --frozen's pins with their hashes")
    for install in re.findall(r"pip install ([^&;|]*)", runs):
        args = install.split()
        if not ("-r" in args or args == ['"uv==${UV_VERSION}"']
                or args[-2:] == ["--no-deps", "."]):
            problems.append(f"installs past the lock: pip install {install.strip()}")
    return problems


def test_the_lock_covers_pythons_311_and_312() -> None:
    lock = tomllib.loads(LOCK.read_text())
    project = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
    assert lock["requires-python"].replace(" ", "") == project["requires-python"] \
        == ">=3.11,<3.13"
    assert locked_one("rcpipe") == project["version"]


def test_the_image_the_manifests_and_the_lock_run_one_ray_with_train_v2() -> None:
    ray = locked_one("ray")
    assert ray_problems(infra_texts(), ray) == []
    # the locked Ray runs Train V2 without being told (rcpipe's check refuses any other)
    since = tuple(int(x) for x in TRAIN_V2_DEFAULT_SINCE.split("."))
    assert tuple(int(x) for x in ray.split(".")[:2]) >= since


def test_make_setup_installs_the_lock() -> None:
    commands = make_setup_commands()
    exports = [c for c in commands if c[1:3] == ["export", "--locked"]]
    assert len(exports) == 1 and Path(exports[0][0]).name == "uv", commands
    pins = exports[0][exports[0].index("--output-file") + 1]
    installs = [c for c in commands if c[1:3] == ["pip", "install"] and "-c" in c]
    assert len(installs) == 1 and installs[0][installs[0].index("-c") + 1] == pins
    # the one thing besides rcpipe: a local CPU wheel of exactly the locked torch, if any
    torch = locked_one("torch")
    for wheel in (a for a in installs[0] if a.endswith(".whl")):
        assert Path(wheel).name.startswith(f"torch-{torch}+cpu-"), wheel
    uv = [c for c in commands if any(a.startswith("uv==") for a in c)]
    assert uv, "make setup installs an unpinned uv"


def makefile_uv() -> str:
    uv = re.search(r"^UV_VERSION := (\S+)$", (REPO / "Makefile").read_text(), re.M)
    assert uv, "Makefile: UV_VERSION"
    return uv[1]


def test_the_image_installs_the_lock_with_the_makefiles_uv() -> None:
    assert image_problems(DOCKERFILE.read_text(), makefile_uv()) == []
    ignore = (INFRA / "docker" / "Dockerfile.dockerignore").read_text().split()
    assert "!uv.lock" in ignore


def test_this_environment_is_the_lock() -> None:
    """Every installed package that uv.lock names is at its locked version (a local CPU
    build of the locked torch counts as the locked torch: PEP 440 ignores `+cpu` in ==)."""
    versions = locked()
    wrong = {}
    for dist in metadata.distributions():
        name = normalized(dist.metadata["Name"])
        if name in versions and dist.version.split("+")[0] not in versions[name]:
            wrong[name] = (dist.version, sorted(versions[name]))
    assert wrong == {}, f"installed vs locked: {wrong}; run make setup"


def test_checks_reject_broken_copies() -> None:
    texts, ray = infra_texts(), locked_one("ray")
    texts["docker/Dockerfile"] = texts["docker/Dockerfile"].replace(
        f"RAY_VERSION={ray}", "RAY_VERSION=2.40.0")
    texts["kuberay/rayjob.yaml"] = texts["kuberay/rayjob.yaml"].replace(
        f'rayVersion: "{ray}"', 'rayVersion: "2.40.0"')
    texts["ray/cluster-aws.yaml"] += "# docker: {image: rayproject/ray:2.40.0-py311-gpu}\n"
    assert len(ray_problems(texts, ray)) == 5  # 2 fields, and 3 mentions of another Ray

    dockerfile = DOCKERFILE.read_text()
    broken = (dockerfile.replace(f"ARG UV_VERSION={makefile_uv()}", "ARG UV_VERSION=0.1.0")
              .replace("--require-hashes ", "")
              .replace("uv.lock ./", "./")
              + 'RUN pip install "torch>=2.4"\n')
    assert len(image_problems(broken, makefile_uv())) == 4
