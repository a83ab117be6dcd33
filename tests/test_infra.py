"""infra/: every manifest parses, holds no secret, and agrees with the tools that read it.

All offline and fast. Where a tool ships its schema or rule with an installed package, the
check uses it: Ray's cluster schema (ray/autoscaler/ray-schema.json) and Ray's own
prepare_config/validate_config, the steps `ray up` runs before it calls AWS. Prefect's
template rule and prefect-kubernetes' required Job shape are restated here (prefect-kubernetes
is not a dependency). The last tests feed broken copies to the same checks, so that a check
that could never fail would show.
"""

from __future__ import annotations

import copy
import json
import re
import shlex
from collections.abc import Iterator
from pathlib import Path, PurePath, PurePosixPath
from typing import Any

import pytest
import yaml

from rcpipe import layout
from rcpipe.config import load_config

REPO = Path(__file__).resolve().parents[1]
INFRA = REPO / "infra"
DOCKERFILE = INFRA / "docker" / "Dockerfile"
RAY_CLUSTER = INFRA / "ray" / "cluster-aws.yaml"
RAYJOB = INFRA / "kuberay" / "rayjob.yaml"
RAYCLUSTER = INFRA / "kuberay" / "raycluster.yaml"
STORAGE = INFRA / "kuberay" / "storage.yaml"
RAYSERVICE = INFRA / "kuberay" / "rayservice.yaml"
SERVE_CONFIG = INFRA / "serve" / "rcpipe.yaml"  # `serve deploy`'s: the same config
JOB_TEMPLATE = INFRA / "prefect" / "base-job-template.json"

MANIFESTS = sorted(p for p in INFRA.rglob("*") if p.suffix in {".yaml", ".yml", ".json"})
TEXT_FILES = sorted(p for p in INFRA.rglob("*") if p.is_file())

# prefect.utilities.templating.PLACEHOLDER_CAPTURE_REGEX: what Prefect counts as a placeholder
PLACEHOLDER = re.compile(r"({{\s*([\w\.\-\[\]$]+)\s*}})")
# AWS access key ids: long-term (AKIA) and temporary (ASIA)
AWS_KEY_ID = re.compile(r"\b(?:AKIA|ASIA)[0-9A-Z]{16}\b")
# `secret_access_key = wJal...`, `"aws_secret_access_key": "..."` or `dvc remote modify
# storage secret_access_key wJal...` with a literal value; a reference ($VAR, "$VAR",
# <placeholder>, {{ template }}) is fine
SECRET_ASSIGNMENT = re.compile(
    r"""(?i)(?:secret_access_key["']?\s*[:=]|remote modify .*\bsecret_access_key)\s*["']?"""
    r"""(?![$<{"'\s]|$)(\S+)""")
SECRET_NAME = re.compile(r"(?i)secret|password|passwd|token|access_key|api_key|private_key")


def load(path: Path) -> Any:
    text = path.read_text()
    return json.loads(text) if path.suffix == ".json" else yaml.safe_load(text)


def walk(node: Any) -> Iterator[Any]:
    """Every dict, list and scalar of a parsed document, depth first."""
    yield node
    children = node.values() if isinstance(node, dict) else node if isinstance(node, list) else []
    for child in children:
        yield from walk(child)


def pods(doc: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """A RayJob's, RayService's or RayCluster's pod specs by group: "head" and each worker
    group's name."""
    spec = {"RayJob": lambda s: s["rayClusterSpec"], "RayService": lambda s: s[
        "rayClusterConfig"]}.get(doc["kind"], lambda s: s)(doc["spec"])
    found = {"head": spec["headGroupSpec"]["template"]["spec"]}
    for group in spec["workerGroupSpecs"]:
        found[group["groupName"]] = group["template"]["spec"]
    return found


def gpus(pod: dict[str, Any]) -> int:
    return sum(int(c.get("resources", {}).get("limits", {}).get("nvidia.com/gpu", 0))
               for c in pod["containers"])


# ------------------------------------------------------------------- every file


def test_infra_holds_what_the_walkthrough_names() -> None:
    for path in (DOCKERFILE, RAY_CLUSTER, RAYJOB, RAYCLUSTER, STORAGE, JOB_TEMPLATE,
                 INFRA / "README.md", INFRA / "prefect" / "README.md"):
        assert path.is_file(), path
    assert len(MANIFESTS) >= 5


@pytest.mark.parametrize("path", MANIFESTS, ids=lambda p: str(p.relative_to(INFRA)))
def test_manifest_parses_without_tabs(path: Path) -> None:
    text = path.read_text()
    assert "\t" not in text, f"{path}: tab character (YAML forbids tabs in indentation)"
    doc = load(path)
    assert isinstance(doc, dict) and doc, f"{path}: expected a non-empty mapping"


def secrets_in_text(text: str) -> list[str]:
    return AWS_KEY_ID.findall(text) + SECRET_ASSIGNMENT.findall(text)


def secrets_in_doc(doc: Any) -> list[str]:
    """Literal values where a reference belongs: env entries and Kubernetes Secrets."""
    found = []
    for node in walk(doc):
        if not isinstance(node, dict):
            continue
        if node.get("kind") == "Secret" and ("data" in node or "stringData" in node):
            found.append(f"Secret {node.get('metadata', {}).get('name')} with values")
        name = node.get("name")
        if isinstance(name, str) and "value" in node and SECRET_NAME.search(name):
            found.append(f"env {name} has a literal value")
    return found


@pytest.mark.parametrize("path", TEXT_FILES, ids=lambda p: str(p.relative_to(INFRA)))
def test_no_secret_values(path: Path) -> None:
    assert secrets_in_text(path.read_text()) == [], path
    if path in MANIFESTS:
        assert secrets_in_doc(load(path)) == [], path


def test_one_image_everywhere() -> None:
    """The driver, Ray Client and every Ray node must run the same image."""
    cluster = load(RAY_CLUSTER)
    images = {("ray", cluster["docker"]["image"])}
    for path in (RAYJOB, RAYCLUSTER, RAYSERVICE):
        for group, pod in pods(load(path)).items():
            images |= {(f"{path.name}:{group}", c["image"]) for c in pod["containers"]}
    template = load(JOB_TEMPLATE)
    images.add(("prefect", template["variables"]["properties"]["image"]["default"]))
    assert len({image for _, image in images}) == 1, sorted(images)


# ------------------------------------------------------------------ Ray on AWS


def ray_schema() -> dict[str, Any]:
    import ray.autoscaler

    return json.loads((Path(ray.autoscaler.__file__).parent / "ray-schema.json").read_text())


def ray_schema_errors(config: dict[str, Any]) -> list[str]:
    schema = ray_schema()
    try:
        import jsonschema
    except ImportError:  # without jsonschema: the schema's required keys, by hand
        return [f"missing {key}" for key in schema["required"] if key not in config]
    validator = jsonschema.Draft7Validator(schema)
    return [f"{list(e.path)}: {e.message}" for e in validator.iter_errors(config)]


def test_ray_cluster_matches_rays_schema() -> None:
    assert ray_schema_errors(load(RAY_CLUSTER)) == []


def test_ray_cluster_passes_rays_own_checks() -> None:
    """`ray up` merges the AWS defaults and validates before it calls AWS: do the same."""
    util = pytest.importorskip("ray.autoscaler._private.util")  # private: skip if moved
    config = load(RAY_CLUSTER)
    prepared = util.prepare_config(copy.deepcopy(config))
    util.validate_config(prepared)
    # The defaults must not slip in: they pip-install packages over the image at every start.
    for key in ("setup_commands", "head_setup_commands", "worker_setup_commands"):
        assert prepared[key] == [], key
    assert prepared["file_mounts"] == {}, "the image carries the code; nothing is uploaded"


def test_ray_cluster_has_a_cpu_head_and_gpu_workers() -> None:
    config = load(RAY_CLUSTER)
    types = config["available_node_types"]
    head = types[config["head_node_type"]]
    assert head["resources"].get("GPU", 0) == 0
    workers = [t for name, t in types.items() if name != config["head_node_type"]]
    assert workers and all(t["resources"]["GPU"] >= 1 for t in workers)
    assert all(t.get("min_workers", 0) <= t["max_workers"] <= config["max_workers"]
               for t in workers)
    assert config["provider"]["type"] == "aws"
    assert any("/app/data" in option for option in config["docker"]["run_options"])


# -------------------------------------------------------------------- KubeRay


def entrypoint_commands(entrypoint: str) -> list[list[str]]:
    """A shell entrypoint `a && b && c` as its commands' argument lists."""
    commands: list[list[str]] = [[]]
    for token in shlex.split(entrypoint):
        if token == "&&":
            commands.append([])
        else:
            commands[-1].append(token)
    return commands


def rcpipe_train(entrypoint: str) -> tuple[str, str, list[str]]:
    """(variant, params file, --set items) of the entrypoint's `rcpipe train` command."""
    train = [c for c in entrypoint_commands(entrypoint) if c[:2] == ["rcpipe", "train"]]
    assert len(train) == 1, f"one `rcpipe train` expected in {entrypoint!r}"
    args, params, sets = train[0][3:], "params.yaml", []
    for flag, value in zip(args[::2], args[1::2], strict=True):
        assert flag in {"--params", "--set"}, flag
        if flag == "--params":
            params = value
        else:
            sets.append(value)
    return train[0][2], params, sets


def test_rayjob_runs_rcpipe_train_on_the_cluster() -> None:
    job = load(RAYJOB)
    assert (job["apiVersion"], job["kind"]) == ("ray.io/v1", "RayJob")
    assert job["spec"]["shutdownAfterJobFinishes"] is True
    # the RayCluster, GPU pod and all, is deleted this long after the end: keep it short
    assert 0 <= job["spec"]["ttlSecondsAfterFinished"] <= 120
    variant, params, sets = rcpipe_train(job["spec"]["entrypoint"])
    # the overrides must pass rcpipe's own config (unknown keys are errors there)
    cfg = load_config(REPO / params, sets)
    cfg.models.of(variant)
    assert cfg.train.ray_address == "auto"
    assert cfg.train.storage_path and cfg.train.storage_path.startswith("s3://")
    assert cfg.train.device == "cuda"
    groups = job["spec"]["rayClusterSpec"]["workerGroupSpecs"]
    cluster_gpus = sum(g["replicas"] * gpus(g["template"]["spec"]) for g in groups)
    assert cluster_gpus >= cfg.train.num_workers, "one GPU per Ray Train worker"


@pytest.mark.parametrize("path", [RAYJOB, RAYCLUSTER], ids=lambda p: p.name)
def test_kuberay_gpu_workers_and_referenced_secrets(path: Path) -> None:
    doc = load(path)
    assert doc["apiVersion"] == "ray.io/v1" and doc["kind"] in {"RayJob", "RayCluster"}
    groups = pods(doc)
    assert gpus(groups.pop("head")) == 0
    assert groups and all(gpus(pod) >= 1 for pod in groups.values())
    for pod in groups.values():
        mounts = {m["mountPath"] for c in pod["containers"] for m in c.get("volumeMounts", [])}
        assert "/dev/shm" in mounts, "NCCL needs more than the default 64 MiB /dev/shm"
    # the driver (head) gets its S3 keys, and by reference only
    head = pods(doc)["head"]["containers"][0]
    refs = {e["name"]: e.get("valueFrom", {}).get("secretKeyRef") for e in head.get("env", [])}
    assert refs.get("AWS_ACCESS_KEY_ID") and refs.get("AWS_SECRET_ACCESS_KEY"), refs
    for node in walk(doc):
        if isinstance(node, dict) and str(node.get("name", "")).startswith("AWS_") \
                and SECRET_NAME.search(node["name"]):
            assert "value" not in node and "secretKeyRef" in node["valueFrom"], node


@pytest.mark.parametrize("path", [RAYJOB, RAYCLUSTER], ids=lambda p: p.name)
def test_kuberay_matches_image_and_shared_volume(path: Path) -> None:
    doc = load(path)
    spec = doc["spec"]["rayClusterSpec"] if doc["kind"] == "RayJob" else doc["spec"]
    assert spec["rayVersion"] == dockerfile_args()["RAY_VERSION"]
    claim = load(STORAGE)
    assert claim["kind"] == "PersistentVolumeClaim"
    assert "ReadWriteMany" in claim["spec"]["accessModes"]
    for group, pod in pods(doc).items():
        claims = {v["name"]: v["persistentVolumeClaim"]["claimName"]
                  for v in pod["volumes"] if "persistentVolumeClaim" in v}
        data = [m for c in pod["containers"] for m in c.get("volumeMounts", [])
                if m["mountPath"] == "/app/data"]
        assert data and claims[data[0]["name"]] == claim["metadata"]["name"], group
        assert doc["metadata"]["namespace"] == claim["metadata"]["namespace"]


# ------------------------------------------------------------- Prefect work pool


def template_problems(template: dict[str, Any]) -> list[str]:
    """Prefect's rule (server/schemas/actions.py validate_base_job_template) and more."""
    if not ("job_configuration" in template and "variables" in template):
        return ["needs job_configuration and variables"]
    properties = template["variables"].get("properties")
    if not isinstance(properties, dict) or not properties:
        return ["variables needs a JSON-schema properties block"]
    used = {name for value in template["job_configuration"].values()
            for _, name in PLACEHOLDER.findall(json.dumps(value))}
    problems = [f"undeclared placeholder {name}" for name in sorted(used - set(properties))]
    try:
        import jsonschema
    except ImportError:
        return problems
    try:
        jsonschema.Draft7Validator.check_schema(template["variables"])
    except jsonschema.SchemaError as e:
        return [*problems, f"variables is not a JSON schema: {e.message}"]
    for name, prop in properties.items():
        if "default" in prop and not jsonschema.Draft7Validator(prop).is_valid(prop["default"]):
            problems.append(f"default of {name} does not match its schema")
    return problems


def test_prefect_template_declares_every_placeholder() -> None:
    assert template_problems(load(JOB_TEMPLATE)) == []


def test_a_deployments_env_is_merged_over_the_pools() -> None:
    """infra/prefect/README.md's claim, by Prefect's own code: a deployment's
    job_variables.env is laid over the template's default env, not put in its place."""
    import asyncio

    from prefect.workers.base import BaseJobConfiguration

    pool = load(JOB_TEMPLATE)["variables"]["properties"]["env"]["default"]
    deployment = {"AWS_DEFAULT_REGION": "eu-west-1", "RCPIPE_EXTRA": "1"}
    # no block or variable reference in the template: the client is never called
    job = asyncio.run(BaseJobConfiguration.from_template_and_values(
        load(JOB_TEMPLATE), {"env": deployment}, client=object()))
    assert job.env == pool | deployment
    assert job.env["RAY_ADDRESS"] == pool["RAY_ADDRESS"]


def test_prefect_template_is_a_kubernetes_job_next_to_the_ray_cluster() -> None:
    template = load(JOB_TEMPLATE)
    manifest = template["job_configuration"]["job_manifest"]
    # what prefect-kubernetes' worker requires of a job manifest (_get_base_job_manifest)
    assert (manifest["apiVersion"], manifest["kind"]) == ("batch/v1", "Job")
    pod = manifest["spec"]["template"]["spec"]
    assert (pod["parallelism"], pod["completions"], pod["restartPolicy"]) == (1, 1, "Never")
    container = pod["containers"][0]
    assert container["name"] == "prefect-job"
    # keys come from the Secret named by a variable, never from the template
    assert [e["secretRef"]["name"] for e in container["envFrom"]] == ["{{ aws_secret_name }}"]
    defaults = {k: v.get("default") for k, v in template["variables"]["properties"].items()}
    cluster = load(RAYCLUSTER)
    name, namespace = cluster["metadata"]["name"], cluster["metadata"]["namespace"]
    head = pods(cluster)["head"]["containers"][0]
    dashboard = next(p["containerPort"] for p in head.get("ports", [])
                     if p["name"] == "dashboard")
    # the Jobs API of the head Service (not Ray Client): where each variant is submitted
    assert defaults["env"]["RAY_ADDRESS"] == \
        f"http://{name}-head-svc.{namespace}.svc.cluster.local:{dashboard}"
    # the jobs' drivers on the head write models/ where the flow-run pod evaluates it
    shared = {(m["mountPath"], m.get("subPath")) for m in container["volumeMounts"]}
    assert shared >= {("/app/data", "data"), ("/app/models", "models")}
    assert shared <= {(m["mountPath"], m.get("subPath")) for m in head["volumeMounts"]}
    assert defaults["namespace"] == namespace
    assert defaults["data_volume_claim"] == load(STORAGE)["metadata"]["name"]
    assert {m["mountPath"] for m in container["volumeMounts"]} >= {"/app/data"}


# --------------------------------- where a Ray job writes is where the flow-run pod reads

GPU_POOL = "rcpipe-gpu"  # the work pool of base-job-template.json (infra/prefect/README.md)


def output_folders() -> set[str]:
    """Every top-level folder a run writes, relative to its working directory: each path
    rcpipe.layout names (found in the module, so a folder added there later is checked
    too) and the params' data folders (prepare's data.out_dir, fetch's data.cache_dir)."""
    cfg = load_config(REPO / "params.yaml")
    paths = [v for v in vars(layout).values() if isinstance(v, PurePath)]
    paths += [cfg.data.out_dir, cfg.data.cache_dir]
    assert not [p for p in paths if p.is_absolute()], "layout's paths are relative"
    return {p.parts[0] for p in paths}


def run_storage_folders() -> set[str]:
    """Where Ray Train workers read and write by the driver's paths: the prepared data, and
    a run's storage without train.storage_path (a training's, a search's)."""
    cfg = load_config(REPO / "params.yaml")
    return {layout.model_dir("v").parts[0], layout.tune_run("v").parts[0],
            cfg.data.out_dir.parts[0]}


def pods_workdir() -> PurePosixPath:
    """Where the pods' relative paths resolve: the flow-run pod's working directory (the
    pull step of every deployment in the pool), which a Ray job's driver changes into
    (rcpipe/cluster/jobs_api.py, entrypoint); the image's WORKDIR, where a RayJob's entrypoint
    starts."""
    dirs = {step["directory"] for d in load(REPO / "prefect.yaml")["deployments"]
            if d["work_pool"]["name"] == GPU_POOL for entry in d.get("pull", [])
            for name, step in entry.items()
            if name == "prefect.deployments.steps.set_working_directory"}
    workdirs = {rest for word, rest in dockerfile_instructions(DOCKERFILE.read_text())
                if word == "WORKDIR"}
    assert len(dirs) == 1 and dirs == workdirs, (dirs, workdirs)
    return PurePosixPath(dirs.pop())


def flow_run_pod(template: dict[str, Any]) -> dict[str, Any]:
    """The flow-run pod's spec as the worker fills the template, with the variables'
    defaults (no deployment of the pool overrides the claim)."""
    defaults = {k: v.get("default") for k, v in template["variables"]["properties"].items()}

    def fill(node: Any) -> Any:
        if isinstance(node, dict):
            return {k: fill(v) for k, v in node.items()}
        if isinstance(node, list):
            return [fill(v) for v in node]
        if isinstance(node, str) and (m := PLACEHOLDER.fullmatch(node)):
            return defaults.get(m[2])
        return node

    return fill(template["job_configuration"]["job_manifest"])["spec"]["template"]["spec"]


def volume_place(pod: dict[str, Any], path: PurePosixPath) -> tuple[str, str] | None:
    """(claim, path inside it) where ``path`` lands in the pod's main container, through the
    deepest mount above it; None where no persistent volume holds it (the container's own
    file system, an emptyDir): what is written there is the pod's alone."""
    claims = {v["name"]: v["persistentVolumeClaim"]["claimName"]
              for v in pod.get("volumes", []) if "persistentVolumeClaim" in v}
    above = [m for m in pod["containers"][0].get("volumeMounts", [])
             if path.is_relative_to(m["mountPath"])]
    if not above:
        return None
    mount = max(above, key=lambda m: len(PurePosixPath(m["mountPath"]).parts))
    if mount["name"] not in claims:
        return None
    inside = PurePosixPath(mount.get("subPath", "")) / path.relative_to(mount["mountPath"])
    return claims[mount["name"]], str(inside)


def unshared_outputs(cluster: dict[str, Any], template: dict[str, Any] | None,
                     workdir: PurePosixPath) -> list[str]:
    """Each output folder the Ray head does not keep on a volume, or, with the flow-run
    pod's ``template``, does not share with that pod (the same claim and subPath); and each
    folder a Ray worker reads or writes by the driver's path elsewhere than the head."""
    groups = pods(cluster)
    head = groups.pop("head")
    flow = flow_run_pod(template) if template is not None else None
    problems = []
    for folder in sorted(output_folders()):
        written = volume_place(head, workdir / folder)
        read = volume_place(flow, workdir / folder) if flow is not None else written
        if written is None or written != read:
            problems.append(f"{folder}/: the head's {written}, the flow-run pod's {read}")
    for group, pod in groups.items():
        for folder in sorted(run_storage_folders()):
            place = volume_place(pod, workdir / folder)
            if place is None or place != volume_place(head, workdir / folder):
                problems.append(f"{folder}/: worker group {group}'s {place}")
    return problems


def test_every_output_a_ray_job_writes_is_where_the_flow_run_pod_reads() -> None:
    """`rcpipe train` and `rcpipe tune` through the Jobs API run their driver on the head,
    in the flow-run pod's directory: models/<variant>/, tune/<variant>.yaml and every other
    output folder must be the same folder of the same volume in both pods."""
    folders = output_folders()
    assert {"data", "models", "predictions", "metrics", "reports", "explanations",
            "packages", "tune"} <= folders, folders
    assert unshared_outputs(load(RAYCLUSTER), load(JOB_TEMPLATE), pods_workdir()) == []


def test_a_rayjob_keeps_every_output_on_the_volume() -> None:
    """A RayJob's cluster is deleted a minute after its entrypoint (run in the image's
    WORKDIR) ends: what it wrote must be on the volume, and at raycluster.yaml's places."""
    job, workdir = load(RAYJOB), pods_workdir()
    assert entrypoint_commands(job["spec"]["entrypoint"])[0] == ["cd", str(workdir)]
    assert unshared_outputs(job, None, workdir) == []
    head, cluster_head = pods(job)["head"], pods(load(RAYCLUSTER))["head"]
    for folder in output_folders():
        assert volume_place(head, workdir / folder) == \
            volume_place(cluster_head, workdir / folder), folder


# ---------------------------------------------------------------------- Dockerfile


def dockerfile_instructions(text: str) -> list[tuple[str, str]]:
    """(INSTRUCTION, arguments) with continuation lines joined and comments dropped."""
    instructions, pending = [], ""
    for line in text.splitlines():
        if line.lstrip().startswith("#") or not line.strip():
            continue
        pending += line.rstrip()
        if pending.endswith("\\"):
            pending = pending[:-1] + " "
            continue
        word, _, rest = pending.strip().partition(" ")
        instructions.append((word.upper(), " ".join(rest.split())))
        pending = ""
    return instructions


def dockerfile_args(text: str | None = None) -> dict[str, str]:
    """Defaults of the ARGs declared before the first FROM (those a FROM line can use)."""
    args = {}
    for word, rest in dockerfile_instructions(text or DOCKERFILE.read_text()):
        if word == "FROM":
            break
        if word == "ARG" and "=" in rest:
            key, _, value = rest.partition("=")
            args[key] = value
    return args


def dockerfile_problems(text: str) -> list[str]:
    instructions = dockerfile_instructions(text)
    args = dockerfile_args(text)
    base = next(rest for word, rest in instructions if word == "FROM").split()[0]
    base = re.sub(r"\$\{?(\w+)\}?", lambda m: args.get(m[1], m[0]), base)
    problems = []
    python = re.search(r"py3(\d+)", base.partition(":")[2])
    if not python or python[1] not in {"11", "12"}:
        problems.append(f"base image {base}: its tag names no Python 3.11 or 3.12")
    users = [rest for word, rest in instructions if word == "USER"]
    if not users or users[-1].split(":")[0] in {"root", "0"}:
        problems.append("runs as root: the last USER must be an unprivileged user")
    runs = [rest for word, rest in instructions if word == "RUN"]
    if not any(re.search(r"pip install (?:[^&;|]* )?\.(?:\s|$)", run) for run in runs):
        problems.append("does not install the project (pip install .)")
    copied = " ".join(rest for word, rest in instructions if word == "COPY")
    if not ("pyproject.toml" in copied and "rcpipe/" in copied):
        problems.append("does not copy pyproject.toml and rcpipe/")
    if ("WORKDIR", "/app") not in instructions:
        problems.append("WORKDIR is not /app")
    return problems


def test_dockerfile_installs_the_project_as_a_user_on_python_311_or_312() -> None:
    assert dockerfile_problems(DOCKERFILE.read_text()) == []


def test_dockerfile_copies_only_what_exists_and_is_not_ignored() -> None:
    ignore = (INFRA / "docker" / "Dockerfile.dockerignore").read_text().split()
    allowed = {line[1:].rstrip("/") for line in ignore if line.startswith("!")}
    for word, rest in dockerfile_instructions(DOCKERFILE.read_text()):
        if word != "COPY":
            continue
        sources = [s for s in rest.split()[:-1] if not s.startswith("--")]
        for source in sources:
            assert (REPO / source).exists(), f"COPY {source}: not in the repository"
            assert source.rstrip("/") in allowed, f"COPY {source}: excluded by .dockerignore"


# ------------------------------------------------- the checks above can fail


def test_checks_reject_broken_copies() -> None:
    cluster = load(RAY_CLUSTER)
    cluster["available_node_types"]["head"]["node_config"] = "m5.2xlarge"
    cluster["idle_timeout"] = 5  # not a Ray key
    assert len(ray_schema_errors(cluster)) >= 2

    template = load(JOB_TEMPLATE)
    template["job_configuration"]["job_manifest"]["metadata"]["name"] = "{{ job_name }}"
    template["variables"]["properties"]["stream_output"]["default"] = "yes"
    assert template_problems(template) == [
        "undeclared placeholder job_name", "default of stream_output does not match its schema"]

    dockerfile = DOCKERFILE.read_text()
    assert len(dockerfile_problems(dockerfile.replace("py311", "py310")
                                   .replace("USER ray\n", "USER ray\nUSER root\n")
                                   .replace("--no-deps . ", "--no-deps rcpipe "))) == 3

    key_id = "AKIA" + "Q" * 16  # built here, so this file holds no key-shaped string itself
    assert secrets_in_text(f"aws_access_key_id = {key_id}")
    assert secrets_in_text("aws_secret_access_key: wJalrXUtnFEMI/K7MDENG")
    assert secrets_in_text("dvc remote modify --local storage secret_access_key wJalrXUtn")
    assert not secrets_in_text('secret_access_key "$AWS_SECRET_ACCESS_KEY"')
    env = {"env": [{"name": "AWS_SECRET_ACCESS_KEY", "value": "x"}]}
    assert secrets_in_doc(env) == ["env AWS_SECRET_ACCESS_KEY has a literal value"]
    assert secrets_in_doc({"kind": "Secret", "stringData": {"k": "v"}})


def test_the_shared_paths_check_rejects_broken_copies(monkeypatch: pytest.MonkeyPatch) -> None:
    workdir = pods_workdir()

    def without(pod: dict[str, Any], folder: str) -> None:
        for container in pod["containers"]:
            container["volumeMounts"] = [m for m in container["volumeMounts"]
                                         if m["mountPath"] != str(workdir / folder)]

    template = load(JOB_TEMPLATE)  # the flow-run pod reads no tune/ of the volume
    without(template["job_configuration"]["job_manifest"]["spec"]["template"]["spec"], "tune")
    assert unshared_outputs(load(RAYCLUSTER), template, workdir) == [
        "tune/: the head's ('rcpipe-data', 'tune'), the flow-run pod's None"]

    cluster = load(RAYCLUSTER)  # the head writes tune/ into its own container
    without(pods(cluster)["head"], "tune")
    assert unshared_outputs(cluster, load(JOB_TEMPLATE), workdir) == [
        "tune/: the head's None, the flow-run pod's ('rcpipe-data', 'tune')",
        "tune/: worker group gpu-4x's ('rcpipe-data', 'tune')"]

    cluster = load(RAYCLUSTER)  # mounted in both, but another folder of the volume
    mount = next(m for m in pods(cluster)["head"]["containers"][0]["volumeMounts"]
                 if m["mountPath"] == str(workdir / "models"))
    mount["subPath"] = "models-head"
    problems = unshared_outputs(cluster, load(JOB_TEMPLATE), workdir)
    assert problems[0] == \
        "models/: the head's ('rcpipe-data', 'models-head'), the flow-run pod's " \
        "('rcpipe-data', 'models')"
    assert len(problems) == 2 and problems[1].startswith("models/: worker group gpu-4x")

    job = load(RAYJOB)  # a worker writes checkpoints of an S3-less run into its own pod
    without(pods(job)["gpu-4x"], "tune")
    assert unshared_outputs(job, None, workdir) == ["tune/: worker group gpu-4x's None"]

    # a folder layout names later is checked without a word here
    monkeypatch.setattr(layout, "PLOTS", Path("plots"), raising=False)
    assert unshared_outputs(load(RAYCLUSTER), load(JOB_TEMPLATE), workdir) == [
        "plots/: the head's None, the flow-run pod's None"]


# ------------------------------------------------- DVC: the remote and the nightly's workspace


def dvc_repo_config() -> dict[str, Any]:
    """.dvc/config as DVC reads and validates it (its own schema, dvc/config_schema.py)."""
    from dvc.config import Config

    return Config(dvc_dir=str(REPO / ".dvc"), validate=True).load_one("repo")


def test_dvc_remote_is_the_infra_bucket_and_holds_no_key() -> None:
    config = dvc_repo_config()
    remote = config["remote"][config["core"]["remote"]]
    assert set(remote) == {"url"}, "keys and endpoints go to .dvc/config.local (--local)"
    bucket = remote["url"].removeprefix("s3://").split("/")[0]
    nightly = next(d for d in load(REPO / "prefect.yaml")["deployments"]
                   if d["name"] == "nightly")
    assert nightly["parameters"]["storage_path"].startswith(f"s3://{bucket}/")
    assert secrets_in_text((REPO / ".dvc/config").read_text()) == []
    assert "/config.local" in (REPO / ".dvc/.gitignore").read_text().split()


def test_the_image_is_the_dvc_workspace_the_nightly_versions() -> None:
    """The nightly runs in /app with version=true: dvc.yaml, .dvc/config and params.yaml
    must be there, and DVC must run without a git checkout."""
    instructions = dockerfile_instructions(DOCKERFILE.read_text())
    copied = {s for word, rest in instructions if word == "COPY"
              for s in rest.split()[:-1] if not s.startswith("--")}
    assert {"dvc.yaml", ".dvc/config", "params.yaml", "flows/"} <= copied
    runs = " ".join(rest for word, rest in instructions if word == "RUN")
    assert "no_scm = true" in runs and ".dvc/config.local" in runs
    nightly = next(d for d in load(REPO / "prefect.yaml")["deployments"]
                   if d["name"] == "nightly")
    assert nightly["parameters"]["version"] is True
    assert nightly["parameters"]["params"] == "params.yaml"
    steps = [step for entry in nightly["pull"] for step in entry.items()]
    assert ("prefect.deployments.steps.set_working_directory", {"directory": "/app"}) in steps
    assert ("WORKDIR", "/app") in instructions


def test_walkthrough_goes_from_bucket_to_dvc_pull() -> None:
    """infra/README.md's commands, in the order a first run needs them."""
    text = (INFRA / "README.md").read_text()
    steps = ["aws s3 mb s3://rcpipe-artifacts", "dvc remote modify --local storage",
             "docker build", "ray up infra/ray/cluster-aws.yaml",
             "kubectl apply -f infra/kuberay/raycluster.yaml", "prefect deploy",
             "python -m flows.alerts", "prefect deployment run train-all/nightly", "dvc pull"]
    at = [text.find(step) for step in steps]
    assert -1 not in at, [s for s, i in zip(steps, at, strict=True) if i < 0]
    assert at == sorted(at), "walkthrough steps out of order"


def test_the_nightly_never_runs_twice_at_once() -> None:
    """prefect.yaml's nightly, read by Prefect's own deployment model: one run at a time, a
    run started while one is still going is cancelled (not queued behind it)."""
    from prefect.cli.deploy._models import PrefectYamlModel
    from prefect.client.schemas.objects import ConcurrencyLimitStrategy

    model = PrefectYamlModel.model_validate(load(REPO / "prefect.yaml"))
    nightly = next(d for d in model.deployments if d.name == "nightly")
    limit = nightly.concurrency_limit
    assert limit is not None and not isinstance(limit, int)
    assert limit.limit == 1
    assert ConcurrencyLimitStrategy(limit.collision_strategy) is ConcurrencyLimitStrategy.CANCEL_NEW


@pytest.mark.parametrize("path", [RAYJOB, RAYCLUSTER], ids=lambda p: p.name)
def test_every_ray_pod_has_its_own_way_to_s3(path: Path) -> None:
    """rcpipe hands the workers no key: each pod that trains gets S3 access itself, by the
    service account's role (IRSA / Pod Identity) or the Secret's keys, by reference only."""
    account = load(INFRA / "kuberay" / "serviceaccount.yaml")
    assert account["kind"] == "ServiceAccount"
    assert account["metadata"]["namespace"] == load(path)["metadata"]["namespace"]
    for group, pod in pods(load(path)).items():
        assert pod["serviceAccountName"] == account["metadata"]["name"], group
        if group != "head":
            refs = [e["secretRef"] for c in pod["containers"] for e in c.get("envFrom", [])]
            assert refs == [{"name": "rcpipe-aws", "optional": True}], group


# ------------------------------------------------------------- the answer service


def serve_config(doc: dict[str, Any]) -> dict[str, Any]:
    return yaml.safe_load(doc["spec"]["serveConfigV2"])


def rayservice_problems(doc: dict[str, Any]) -> list[str]:
    """What keeps the RayService from serving the champion: Ray Serve's own schema for its
    config, the application's builder, the deployments it names, the Ray version."""
    from ray.serve.schema import ServeDeploySchema

    from rcpipe.serve.deployments import Reader

    problems = []
    config = serve_config(doc)
    try:
        ServeDeploySchema.model_validate(config)
    except ValueError as e:
        problems.append(f"Ray Serve's schema: {str(e).splitlines()[0]}")
    for app in config.get("applications", []):
        module, _, name = app.get("import_path", "").partition(":")
        try:
            builder = getattr(__import__(module, fromlist=[name]), name)
        except (ImportError, AttributeError, ValueError):
            problems.append(f"{app.get('import_path')}: no such builder")
            continue
        if builder.__name__ != "champion_app":
            problems.append(f"{app['import_path']}: not the champion's builder")
        args = app.get("args", {})
        if "package" in args:  # the app follows champion.json: nothing to edit by hand
            problems.append(f"package {args['package']!r} named by hand")
        if args.get("workspace") != "/app":
            problems.append(f"workspace {args.get('workspace')!r} is not the image's /app "
                            "(its .dvc/config names the remote holding champion.json)")
        names = {d.get("name") for d in app.get("deployments", [])}
        # Reader-0: the first (here the only) model's Reader, as deployments.application
        # names it; one model is served without an Ingress (deployments.Solo)
        known = {f"{Reader.name}-0"}
        problems += [f"deployment {n} is not one the application has" for n in names - known]
    if doc["spec"]["rayClusterConfig"]["rayVersion"] != dockerfile_args()["RAY_VERSION"]:
        problems.append("rayVersion is not the image's Ray")
    if config != yaml.safe_load(SERVE_CONFIG.read_text()):
        problems.append(f"serveConfigV2 is not {SERVE_CONFIG.relative_to(REPO)}")
    gpus = [g["groupName"] for g in doc["spec"]["rayClusterConfig"].get("workerGroupSpecs", [])
            for c in g["template"]["spec"]["containers"]
            if c.get("resources", {}).get("limits", {}).get("nvidia.com/gpu")]
    if not gpus:  # Readers on GPUs (serve.replica_gpus) need a group to scale up
        problems.append("no worker group with a GPU")
    return problems + guard_problems(doc, config["http_options"])


def guard_problems(doc: dict[str, Any], http: dict[str, Any]) -> list[str]:
    """Every pod that runs Serve's proxy has the guard in front of it (serve/guard.py): it
    relays to the proxy's own address and listens on the port the serve Service targets."""
    cluster = doc["spec"]["rayClusterConfig"]
    pods = [("head", cluster["headGroupSpec"])] + [
        (g["groupName"], g) for g in cluster.get("workerGroupSpecs", [])]
    problems = []
    for name, group in pods:
        containers = group["template"]["spec"]["containers"]
        guards = [c for c in containers if c.get("name") == "serve-guard"]
        if len(guards) != 1:
            problems.append(f"{name}: no serve-guard container in front of Serve's proxy")
            continue
        argv = [str(a) for a in guards[0]["command"]]
        upstream = argv[argv.index("--upstream") + 1] if "--upstream" in argv else ""
        if upstream != f"{http['host']}:{http['port']}":
            problems.append(f"{name}: the guard relays to {upstream}, Serve's proxy is on "
                            f"{http['host']}:{http['port']}")
        listen = argv[argv.index("--listen") + 1] if "--listen" in argv else ""
        if name == "head":
            ports = {p.get("name"): p["containerPort"] for c in containers
                     for p in c.get("ports", [])}
            if not listen.endswith(f":{ports.get('serve')}"):
                problems.append(f"head: the guard listens on {listen}, the serve port is "
                                f"{ports.get('serve')}")
    return problems


def test_the_rayservice_serves_the_champions_package() -> None:
    doc = load(RAYSERVICE)
    assert doc["kind"] == "RayService" and rayservice_problems(doc) == []
    http = serve_config(doc)["http_options"]
    serve = load_config(REPO / "params.yaml").serve
    assert http["keep_alive_timeout_s"] == serve.keep_alive_s
    assert http["request_timeout_s"] > serve.timeout_s + serve.body_timeout_s  # the app's first


def test_the_rayservice_check_rejects_broken_copies() -> None:
    good = load(RAYSERVICE)
    for break_it, words in (
            (lambda c: c["applications"][0].update(import_path="rcpipe.stages.nowhere:app"),
             "no such builder"),
            (lambda c: c["applications"][0]["args"].update(package="/tmp/pkg"),
             "named by hand"),
            (lambda c: c["applications"][0]["args"].update(workspace="/tmp"),
             "is not the image's /app"),
            (lambda c: c["applications"][0]["deployments"][0].update(name="Reader"),
             "deployment Reader is not one"),
            (lambda c: c["applications"][0].update(route_prefix=7), "Ray Serve's schema"),
            (lambda c: c["http_options"].update(port=8002), "the guard relays to"),
            (lambda c: c["applications"][0]["args"].update(threads=3), "serveConfigV2 is not")):
        doc = copy.deepcopy(good)
        config = serve_config(doc)
        break_it(config)
        doc["spec"]["serveConfigV2"] = yaml.safe_dump(config)
        assert any(words in p for p in rayservice_problems(doc)), words


def test_a_run_in_the_checkout_leaves_git_clean() -> None:
    """`make demo` or `dvc repro` here writes the stages' stamps and the locks beside their
    outputs (`.predictions.lock` at the top, as predictions/ is there): git ignores them."""
    import subprocess

    from rcpipe.locks import lock_file

    made = [str(layout.stamp("evaluate-bidaf")), str(lock_file(Path("predictions"))),
            str(lock_file(Path("metrics"))), str(lock_file(Path("models/bidaf")))]
    checked = subprocess.run(["git", "check-ignore", "--no-index", *made], cwd=REPO,
                             capture_output=True, text=True)
    assert sorted(checked.stdout.split()) == sorted(made)
