"""deploy/kubernetes: rendered by kustomize (`kubectl kustomize`: kustomize v5 built into kubectl,
which this machine image ships; neither Debian nor PyPI has it, so a second, tool-free check below
also makes sure every file exists and every patch applies), then every resource validated:

- built-in kinds with kubernetes-validate (PyPI; ships the Kubernetes JSON schemas, strict mode:
  unknown fields are errors), for the Kubernetes version llm-d requires at least (1.30);
- Prometheus Operator kinds (ServiceMonitor, PodMonitor, PrometheusRule) with structural JSON
  schemas of our own in deploy/kubernetes/schemas/: no package ships the operator's CRD schemas,
  and copying them is not ours to do, so we check the fields we use (names, types, required,
  unknown keys refused).

Then the wiring a schema cannot see: probes hit the daemon's health endpoint on its configured
port, the Service and monitors select what they should, generated names resolve, the rules are
the rules file's, the overlay makes a pool.
"""

from __future__ import annotations

import base64
import json
import shlex
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import jsonschema
import kubernetes_validate
import pytest
import yaml

from tabletune.admin.auth import TOKEN_FILE_ENV, auth_from_env, own_token
from tabletune.daemon import settings
from tabletune.errors import InputError
from tabletune.schemas.table import normalize_ranges

from .conftest import DEPLOY, explain, run_tool

KUBERNETES = DEPLOY / "kubernetes"
KUBERNETES_VERSION = "1.30.0"
RULES = DEPLOY / "prometheus" / "rules" / "tabletune.rules.yml"
CRD_SCHEMAS = {
    kind: json.loads((KUBERNETES / "schemas" / f"{kind.lower()}-monitoring-v1.json").read_text())
    for kind in ("ServiceMonitor", "PodMonitor", "PrometheusRule")
}
KUSTOMIZATIONS = ("base", "vllm", "overlays/pool")

Resource = dict[str, Any]


def _render(tool: Callable[[str], str], kustomization: str) -> list[Resource]:
    result = run_tool([tool("kubectl"), "kustomize", str(KUBERNETES / kustomization)])
    assert result.returncode == 0, explain(result)
    return [doc for doc in yaml.safe_load_all(result.stdout) if doc]


def _one(resources: list[Resource], kind: str, name: str | None = None) -> Resource:
    found = [
        r
        for r in resources
        if r["kind"] == kind and (name is None or r["metadata"]["name"] == name)
    ]
    assert len(found) == 1, f"{kind} {name}: {len(found)} found"
    return found[0]


def _validate(resource: Resource) -> None:
    schema = CRD_SCHEMAS.get(resource["kind"])
    if schema is not None:
        jsonschema.Draft202012Validator(schema).validate(resource)
    else:
        kubernetes_validate.validate(resource, KUBERNETES_VERSION, strict=True)


@pytest.mark.parametrize("kustomization", KUSTOMIZATIONS)
def test_renders_and_every_resource_validates(
    tool: Callable[[str], str], kustomization: str
) -> None:
    resources = _render(tool, kustomization)
    assert resources
    for resource in resources:
        _validate(resource)


def test_validation_catches_a_misspelt_field(tool: Callable[[str], str]) -> None:
    resources = _render(tool, "base")
    deployment = _one(resources, "Deployment", "tabletune-daemon")
    deployment["spec"]["template"]["spec"]["containers"][0]["livenesProbe"] = {}
    with pytest.raises(kubernetes_validate.ValidationError):
        _validate(deployment)
    monitor = _one(resources, "ServiceMonitor")
    monitor["spec"]["endpoints"][0]["intervall"] = "15s"
    with pytest.raises(jsonschema.ValidationError):
        _validate(monitor)
    rule = _one(resources, "PrometheusRule")
    rule["spec"]["groups"][1]["rules"][0]["for"] = "five minutes"
    with pytest.raises(jsonschema.ValidationError):
        _validate(rule)


def test_prometheusrule_is_the_rules_file() -> None:
    result = subprocess.run(
        [sys.executable, str(KUBERNETES / "render_prometheusrule.py"), "--check"],
        capture_output=True,
        text=True,
        check=False,
    )
    assert result.returncode == 0, result.stderr
    generated = yaml.safe_load((KUBERNETES / "base" / "prometheusrule.yaml").read_text())
    assert generated["spec"]["groups"] == yaml.safe_load(RULES.read_text())["groups"]


def _env_of(resources: list[Resource]) -> dict[str, str]:
    config = _one(resources, "ConfigMap")
    return dict(config["data"])


def test_daemon_probes_its_health_endpoint_on_the_configured_port(
    tool: Callable[[str], str],
) -> None:
    resources = _render(tool, "base")
    container = _one(resources, "Deployment", "tabletune-daemon")["spec"]["template"]["spec"][
        "containers"
    ][0]
    ports = {port["name"]: port["containerPort"] for port in container["ports"]}
    assert ports["metrics"] == int(_env_of(resources)["TABLETUNE_SERVER__PORT"])
    for probe in ("startupProbe", "livenessProbe", "readinessProbe"):
        assert container[probe]["httpGet"] == {"path": "/healthz", "port": "metrics"}, probe
    assert container["command"] == ["tabletune", "daemon"]


def _token_mount(container: Resource, volumes: list[Resource]) -> tuple[str, str]:
    """(mount path, Secret name) of the container's admin token volume."""
    [mount] = [m for m in container["volumeMounts"] if m["name"] == "admin-token"]
    assert mount["readOnly"] is True
    [volume] = [v for v in volumes if v["name"] == "admin-token"]
    return mount["mountPath"], volume["secret"]["secretName"]


def test_daemon_config_is_accepted_by_the_daemons_settings(tool: Callable[[str], str]) -> None:
    for kustomization in ("base", "overlays/pool"):
        resources = _render(tool, kustomization)
        secret = _one(resources, "Secret")
        assert set(secret["data"]) == {"admin-token"}
        loaded = settings.load_settings(_env_of(resources))
        assert loaded.server.port == 9465
        assert str(loaded.state.dir) == "/var/lib/tabletune"
        pod = _one(resources, "Deployment", "tabletune-daemon")["spec"]["template"]["spec"]
        path, secret_name = _token_mount(pod["containers"][0], pod["volumes"])
        assert loaded.admin.token_file == Path(path) / "admin-token"
        assert secret_name == secret["metadata"]["name"]
        assert "secretRef" not in str(pod["containers"][0]["envFrom"])  # a file, not a variable


def test_the_example_token_cannot_be_used_as_is(tool: Callable[[str], str]) -> None:
    secret = _one(_render(tool, "base"), "Secret")
    shipped = base64.b64decode(secret["data"]["admin-token"]).decode()
    assert shipped == (KUBERNETES / "base" / "admin-token").read_text()
    with pytest.raises(InputError, match="placeholder"):
        own_token(None, KUBERNETES / "base" / "admin-token")
    assert auth_from_env({TOKEN_FILE_ENV: str(KUBERNETES / "base" / "admin-token")}).closed


def test_generated_names_resolve(tool: Callable[[str], str]) -> None:
    for kustomization in ("base", "overlays/pool"):
        resources = _render(tool, kustomization)
        names = {(r["kind"], r["metadata"]["name"]) for r in resources}
        daemon = _one(resources, "Deployment", "tabletune-daemon")["spec"]["template"]["spec"]
        for source in daemon["containers"][0]["envFrom"]:
            if "configMapRef" in source:
                assert ("ConfigMap", source["configMapRef"]["name"]) in names
            else:
                assert ("Secret", source["secretRef"]["name"]) in names
    pool = _render(tool, "overlays/pool")
    vllm = _one(pool, "Deployment", "vllm-decode")["spec"]["template"]["spec"]
    env = {e["name"]: e.get("value") for e in vllm["containers"][0]["env"]}
    path, secret_name = _token_mount(vllm["containers"][0], vllm["volumes"])
    secret = _one(pool, "Secret")
    assert secret_name == secret["metadata"]["name"]
    assert env[TOKEN_FILE_ENV] == f"{path}/admin-token"
    assert env[TOKEN_FILE_ENV] == _env_of(pool)[TOKEN_FILE_ENV]  # the daemon's token


def _matches(selector: dict[str, str], labels: dict[str, str]) -> bool:
    return all(labels.get(key) == value for key, value in selector.items())


def test_service_and_monitors_select_their_targets(tool: Callable[[str], str]) -> None:
    resources = _render(tool, "overlays/pool")
    daemon = _one(resources, "Deployment", "tabletune-daemon")
    vllm = _one(resources, "Deployment", "vllm-decode")
    service = _one(resources, "Service", "tabletune-daemon")
    assert _matches(service["spec"]["selector"], daemon["spec"]["template"]["metadata"]["labels"])
    assert service["spec"]["ports"][0]["targetPort"] == "metrics"
    service_monitor = _one(resources, "ServiceMonitor")
    assert _matches(
        service_monitor["spec"]["selector"]["matchLabels"], service["metadata"]["labels"]
    )
    assert service_monitor["spec"]["endpoints"][0]["port"] == "metrics"
    pod_monitor = _one(resources, "PodMonitor")
    pod_labels = vllm["spec"]["template"]["metadata"]["labels"]
    assert _matches(pod_monitor["spec"]["selector"]["matchLabels"], pod_labels)
    assert not _matches(
        pod_monitor["spec"]["selector"]["matchLabels"],
        daemon["spec"]["template"]["metadata"]["labels"],
    )
    vllm_ports = {p["name"] for p in vllm["spec"]["template"]["spec"]["containers"][0]["ports"]}
    assert pod_monitor["spec"]["podMetricsEndpoints"][0]["port"] in vllm_ports
    # TableTuneDaemonDown looks for job="tabletune-daemon": a ServiceMonitor's job is the Service.
    assert 'job="tabletune-daemon"' in RULES.read_text()


def test_pool_overlay(tool: Callable[[str], str]) -> None:
    resources = _render(tool, "overlays/pool")
    assert {r["metadata"].get("namespace") for r in resources} == {"llm-d"}
    assert _one(resources, "Deployment", "vllm-decode")["spec"]["replicas"] == 4
    assert _one(resources, "Deployment", "tabletune-daemon")["spec"]["replicas"] == 1
    env = _env_of(resources)
    assert env["TABLETUNE_ESTIMATOR__SCOPE"] == "pool"
    assert env["TABLETUNE_SOURCE__PROMETHEUS_URL"]  # a pool is discovered through Prometheus


def test_vllm_example_enables_the_plugin_with_every_k(tool: Callable[[str], str]) -> None:
    container = _one(_render(tool, "vllm"), "Deployment")["spec"]["template"]["spec"]["containers"][
        0
    ]
    env = {e["name"]: e.get("value") for e in container["env"]}
    assert env["VLLM_PLUGINS"] == "tabletune_engine,tabletune_http,tabletune_metrics"
    assert env["VLLM_USE_V2_MODEL_RUNNER"] == "1"
    args = {a.split("=", 1)[0]: a.split("=", 1)[1] for a in container["args"] if "=" in a}
    config = json.loads(args["--speculative-config"])
    big_k = config["num_speculative_tokens"]
    ranges = normalize_ranges(config["num_speculative_tokens_per_batch_size"], max_k=big_k)
    assert {k for _, _, k in ranges} == set(range(big_k + 1))
    assert ranges[-1][1] == int(args["--max-num-seqs"])
    assert shlex.split(" ".join(container["command"]))[:2] == ["vllm", "serve"]


# --- without kubectl: the kustomizations are consistent (files exist, patches apply) ---
# kubectl comes with this machine image, not from Debian or PyPI; this check needs neither.


def _kustomization(folder: Path) -> dict[str, Any]:
    loaded: dict[str, Any] = yaml.safe_load((folder / "kustomization.yaml").read_text())
    return loaded


def _plain_resources(folder: Path) -> list[Resource]:
    """Resources a kustomization lists, recursively (no generators, no transformers)."""
    out: list[Resource] = []
    for entry in _kustomization(folder).get("resources", []):
        path = (folder / entry).resolve()
        assert path.exists(), f"{folder}: resource {entry} does not exist"
        if path.is_dir():
            out.extend(_plain_resources(path))
        else:
            out.extend(doc for doc in yaml.safe_load_all(path.read_text()) if doc)
    return out


def _resolve(document: Any, pointer: str) -> Any:
    for part in pointer.strip("/").split("/"):
        document = document[int(part)] if isinstance(document, list) else document[part]
    return document


@pytest.mark.parametrize("kustomization", KUSTOMIZATIONS)
def test_kustomization_files_exist_and_patches_apply(kustomization: str) -> None:
    folder = KUBERNETES / kustomization
    resources = _plain_resources(folder)
    spec = _kustomization(folder)
    for generator in spec.get("configMapGenerator", []) + spec.get("secretGenerator", []):
        for env_file in generator.get("envs", []):
            lines = (folder / env_file).read_text().splitlines()
            assert all("=" in line for line in lines if line and not line.startswith("#"))
        for source in generator.get("files", []):
            assert (folder / source.split("=")[-1]).is_file(), f"{folder}: {source} is missing"
    for patch in spec.get("patches", []):
        target = patch["target"]
        document = _one(resources, target["kind"], target["name"])
        for operation in yaml.safe_load(patch["patch"]):
            assert operation["op"] in {"replace", "add", "remove"}
            parent, _, _ = operation["path"].rpartition("/")
            _resolve(document, parent if operation["op"] == "add" else operation["path"])
    for replica in spec.get("replicas", []):
        _one(resources, "Deployment", replica["name"])
