#!/usr/bin/env python3
"""validate-manifests: checks every Kubernetes and Istio manifest prewarm ships, offline.

    .venv/bin/python tools/validate-manifests.py [--root REPO] [--crds ISTIO_CRDS] [FILE ...]

- Istio objects (`*.istio.io`) against the OpenAPI v3 schema of their CRD in
  `../shared/schemas/istio-crds.yaml` (`spec.versions[].schema.openAPIV3Schema`), the way the
  API server treats a structural schema: unknown fields are refused except under
  `x-kubernetes-preserve-unknown-fields`, `x-kubernetes-int-or-string` admits both, and the
  `x-kubernetes-validations` rules of the "at most one of" / "exactly one of" shapes Istio uses
  are evaluated (any other CEL rule is reported as not evaluated).
- Istio policy attachment (`targetRef`/`targetRefs` of a WasmPlugin, EnvoyFilter, ...): the
  kinds Istio attaches to, each with its group (a Gateway of `gateway.networking.k8s.io`, a
  Service of the core group, ...). The CRD schema takes any kind and group, and istiod ignores a
  reference it does not support without an error, so a wrong group would silently attach nothing.
- Other custom resources against the CRDs of every other `*.yaml` file beside the Istio CRDs
  (none is shipped there today for the Inference Extension's InferencePool, so an InferencePool
  is reported as having no schema rather than passed unchecked).
- Kubernetes objects against the upstream schemas of `kubernetes-validate` (strict: unknown
  fields are errors), Kubernetes 1.37.
- Kustomizations (`kustomization.yaml`) are rendered first: `resources` and
  `configMapGenerator` with `files` (and their labels and annotations); the rendered objects are
  validated. tests/test_manifests.py compares the rendering with `kubectl kustomize`.
- PrometheusRules (`monitoring.coreos.com/v1`) against `tools/schemas/prometheusrule.schema.json`,
  written from the Prometheus Operator's API reference (its CRDs are not available here).
- A strategic-merge patch (a file named `*-patch.yaml`, no `kind`) is applied to a skeleton
  Deployment and the result validated.

Without FILE arguments: everything under envoy/istio/ and envoy/k8s/. Prints one line per
object; exits 1 when any object has a problem, 2 on bad usage.
"""
from __future__ import annotations

import argparse
import copy
import re
import sys
from pathlib import Path
from typing import Iterable, Iterator

import jsonschema
import kubernetes_validate
import yaml

ROOT = Path(__file__).resolve().parents[1]
DEFAULT_CRDS = ROOT.parent / "shared" / "schemas" / "istio-crds.yaml"
K8S_VERSION = "1.37.0"
MANIFEST_DIRS = ("envoy/istio", "envoy/k8s")

Obj = tuple[str, dict]  # (where it came from, the object)


# --- Istio: CRD schemas ----------------------------------------------------------------------


def structural(schema: dict) -> dict:
    """The schema as the API server applies it (see the module docs)."""
    s = copy.deepcopy(schema)

    def walk(node):
        if isinstance(node, list):
            for n in node:
                walk(n)
            return
        if not isinstance(node, dict):
            return
        if node.pop("x-kubernetes-int-or-string", False):
            node.pop("type", None)
            node.setdefault("anyOf", [{"type": "integer"}, {"type": "string"}])
        preserve = node.get("x-kubernetes-preserve-unknown-fields", False)
        if "properties" in node and not preserve and "additionalProperties" not in node:
            node["additionalProperties"] = False
        for key, value in node.items():
            if key in ("properties", "patternProperties"):
                for sub in value.values():
                    walk(sub)
            elif key in ("items", "additionalProperties", "not") or key in ("anyOf", "oneOf", "allOf"):
                walk(value)

    walk(s)
    return s


def load_istio_schemas(path: Path) -> dict:
    """{(apiVersion, kind): structural openAPIV3Schema} of every served CRD version."""
    schemas = {}
    for doc in yaml.safe_load_all(path.read_text()):
        if not doc or doc.get("kind") != "CustomResourceDefinition":
            continue
        spec = doc["spec"]
        for version in spec["versions"]:
            if not version.get("served", True):
                continue
            raw = version["schema"]["openAPIV3Schema"]
            schemas[(f"{spec['group']}/{version['name']}", spec["names"]["kind"])] = structural(raw)
    return schemas


def load_crd_schemas(istio_crds: Path) -> dict:
    """The Istio CRDs' schemas and those of every other CRD file in the same folder (another
    project's CRDs, such as the Inference Extension's, once they are put there)."""
    schemas = load_istio_schemas(istio_crds)
    for other in sorted(istio_crds.parent.glob("*.yaml")):
        if other.resolve() != istio_crds.resolve():
            for key, schema in load_istio_schemas(other).items():
                schemas.setdefault(key, schema)
    return schemas


AT_MOST_ONE = re.compile(r"^\s*(\(has\(self\.\w+\) \? 1 : 0\)\s*\+?\s*)+<= 1\s*$")
EXACTLY_ONE_OF_TWO = re.compile(r"^\s*has\(self\.(\w+)\) != has\(self\.(\w+)\)\s*$")


def _url_scheme_allowed(url: str) -> bool:
    scheme = url.split("://", 1)[0] if "://" in url else ""
    return scheme in ("", "http", "https", "oci", "file")


# The other CEL rules of the EnvoyFilter, WasmPlugin and AuthorizationPolicy schemas, by their
# text (prefix).
KNOWN_RULES = {
    'has(self.context) ? ((self.context == "WAYPOINT")': lambda v: (
        ("waypoint" in v) == (v.get("context") == "WAYPOINT")),
    "0 < self && self <= 65535": lambda v: 0 < v <= 65535,
    "self.size() == 0": lambda v: len(v) == 0,
    '!self.contains("*")': lambda v: "*" not in v,
    'self.all(key, !key.contains("*"))': lambda v: all("*" not in k for k in v),
    "self.all(key, key.size() != 0)": lambda v: all(len(k) != 0 for k in v),
    "isURL(self) ?": _url_scheme_allowed,
    '(has(self.valueFrom) ? self.valueFrom : "") != "HOST" || !has(self.value)': lambda v: (
        v.get("valueFrom") != "HOST" or "value" not in v),
    "(has(self.serviceAccounts) || has(self.notServiceAccounts)) ?": lambda v: not (
        {"serviceAccounts", "notServiceAccounts"} & v.keys()
        and {"principals", "notPrincipals", "namespaces", "notNamespaces"} & v.keys()),
}


def rule_holds(text: str, value) -> bool | None:
    """Whether a CEL rule holds for `value`; None when the rule is not one known here."""
    if isinstance(value, dict) and AT_MOST_ONE.match(text):
        return len([f for f in re.findall(r"has\(self\.(\w+)\)", text) if f in value]) <= 1
    if isinstance(value, dict) and (m := EXACTLY_ONE_OF_TWO.match(text)):
        return (m[1] in value) != (m[2] in value)
    for prefix, holds in KNOWN_RULES.items():
        if text.strip().startswith(prefix):
            return bool(holds(value))
    return None


def cel_problems(schema: dict, value, at: str = "") -> Iterator[str]:
    """Evaluates `x-kubernetes-validations` along `value`; a rule not known here is reported
    as `CEL rule not evaluated: ...` (never silently passed)."""
    for rule in schema.get("x-kubernetes-validations", []):
        text = rule.get("rule", "")
        holds = rule_holds(text, value)
        if holds is None:
            yield f"{at or '(root)'}: CEL rule not evaluated: {text}"
        elif not holds:
            yield f"{at or '(root)'}: {rule.get('message') or text}"
    if isinstance(value, dict):
        for key, sub in value.items():
            where = f"{at}.{key}" if at else key
            if key in schema.get("properties", {}):
                yield from cel_problems(schema["properties"][key], sub, where)
            elif isinstance(schema.get("additionalProperties"), dict):
                yield from cel_problems(schema["additionalProperties"], sub, where)
    elif isinstance(value, list) and "items" in schema:
        for i, item in enumerate(value):
            yield from cel_problems(schema["items"], item, f"{at}[{i}]")


# (group, kind) a targetRef of an Istio policy may name (istio.io "Policy attachment": Gateway API
# gateways and classes, Services, ServiceEntries).
ATTACHABLE = {
    ("gateway.networking.k8s.io", "Gateway"),
    ("gateway.networking.k8s.io", "GatewayClass"),
    ("", "Service"),
    ("networking.istio.io", "ServiceEntry"),
}


def target_ref_problems(obj: dict) -> list[str]:
    """A targetRef naming a kind Istio does not attach to, or a kind under the wrong group."""
    spec = obj.get("spec") or {}
    refs = [("spec.targetRef", spec["targetRef"])] if isinstance(spec.get("targetRef"), dict) else []
    refs += [(f"spec.targetRefs[{i}]", r) for i, r in enumerate(spec.get("targetRefs") or []) if isinstance(r, dict)]
    out = []
    for where, ref in refs:
        pair = (ref.get("group", ""), ref.get("kind"))
        if pair not in ATTACHABLE:
            allowed = ", ".join(f"{k} ({g or 'core'})" for g, k in sorted(ATTACHABLE, key=lambda p: p[1]))
            out.append(f"{where}: {pair[1]} of group {pair[0]!r}: Istio attaches only to {allowed}")
    return out


def istio_problems(obj: dict, schemas: dict) -> list[str]:
    key = (obj.get("apiVersion"), obj.get("kind"))
    schema = schemas.get(key)
    if schema is None:
        return [f"no Istio CRD serves {key[0]} {key[1]}"]
    problems = []
    meta = obj.get("metadata") or {}
    if not meta.get("name"):
        problems.append("metadata.name: missing")
    body = {k: v for k, v in obj.items() if k not in ("apiVersion", "kind", "metadata")}
    validator = jsonschema.Draft7Validator({**schema, "properties": {
        k: v for k, v in schema.get("properties", {}).items() if k not in ("apiVersion", "kind", "metadata")
    }})
    for error in sorted(validator.iter_errors(body), key=lambda e: list(e.path)):
        where = ".".join(str(p) for p in error.path) or "(root)"
        problems.append(f"{where}: {error.message}")
    problems += list(cel_problems(schema, body))
    if key[0].split("/")[0].endswith(".istio.io"):
        problems += target_ref_problems(obj)
    return problems


# --- Kubernetes ------------------------------------------------------------------------------


def k8s_problems(obj: dict) -> list[str]:
    try:
        kubernetes_validate.validate(obj, K8S_VERSION, strict=True)
    except kubernetes_validate.ValidationError as e:
        where = ".".join(str(p) for p in e.path) or "(root)"
        return [f"{where}: {e.message}"]
    except kubernetes_validate.SchemaNotFoundError as e:
        return [f"{obj.get('apiVersion')} {obj.get('kind')}: no Kubernetes {K8S_VERSION} schema and no CRD "
                f"beside {shown(DEFAULT_CRDS)}{f': {e}' if str(e) else ''}"]
    return []


# --- Sources: files, kustomizations, patches ------------------------------------------------


def render_kustomization(path: Path) -> list[Obj]:
    """The objects a kustomization produces (resources and configMapGenerator with files)."""
    k = yaml.safe_load(path.read_text()) or {}
    base = path.parent
    out: list[Obj] = []
    for resource in k.get("resources", []):
        target = base / resource
        if target.is_dir():
            out += render_kustomization(target / "kustomization.yaml")
        else:
            out += [(shown(target), d) for d in yaml.safe_load_all(target.read_text()) if d]
    for gen in k.get("configMapGenerator", []):
        data = {}
        for entry in gen.get("files", []):
            key, _, file = entry.rpartition("=")
            data[key or Path(file).name] = (base / file).read_text()
        meta = {"name": gen["name"]}
        if gen.get("namespace") or k.get("namespace"):
            meta["namespace"] = gen.get("namespace") or k.get("namespace")
        # Labels and annotations from `generatorOptions` and the generator's `options` (the
        # name hash suffix is not reproduced: the kustomizations here disable it).
        for field in ("labels", "annotations"):
            merged = {**(k.get("generatorOptions") or {}).get(field, {}), **(gen.get("options") or {}).get(field, {})}
            if merged:
                meta[field] = merged
        out.append((f"{shown(path)}#configMapGenerator", {
            "apiVersion": "v1", "kind": "ConfigMap", "metadata": meta, "data": data,
        }))
    if k.get("namespace"):
        for _, obj in out:
            obj.setdefault("metadata", {})["namespace"] = k["namespace"]
    return out


def strategic_merge(base, patch):
    """Strategic merge for what patches here use: maps merge, lists of named maps merge by name."""
    if isinstance(base, dict) and isinstance(patch, dict):
        merged = dict(base)
        for key, value in patch.items():
            merged[key] = strategic_merge(base[key], value) if key in base else value
        return merged
    if isinstance(base, list) and isinstance(patch, list) and all(isinstance(x, dict) and "name" in x for x in base + patch):
        merged = [dict(x) for x in base]
        for item in patch:
            match = next((i for i, x in enumerate(merged) if x["name"] == item["name"]), None)
            if match is None:
                merged.append(item)
            else:
                merged[match] = strategic_merge(merged[match], item)
        return merged
    return patch


SKELETON_GATEWAY = {
    "apiVersion": "apps/v1",
    "kind": "Deployment",
    "metadata": {"name": "istio-ingressgateway", "namespace": "istio-system"},
    "spec": {
        "selector": {"matchLabels": {"istio": "ingressgateway"}},
        "template": {
            "metadata": {"labels": {"istio": "ingressgateway"}},
            "spec": {"containers": [{"name": "istio-proxy", "image": "auto"}]},
        },
    },
}


def patched_skeleton(path: Path) -> Obj:
    patch = yaml.safe_load(path.read_text())
    return (f"{shown(path)} (applied to an ingress gateway Deployment)",
            strategic_merge(SKELETON_GATEWAY, patch))


def shown(path: Path) -> str:
    """`path` relative to the repository when it is inside it."""
    return str(path.relative_to(ROOT)) if path.is_relative_to(ROOT) else str(path)


def objects_of(path: Path) -> list[Obj]:
    if path.name == "kustomization.yaml":
        return render_kustomization(path)
    if path.name.endswith("-patch.yaml"):
        return [patched_skeleton(path)]
    return [(shown(path), d) for d in yaml.safe_load_all(path.read_text()) if d]


def default_objects() -> list[Obj]:
    """Everything under envoy/istio and envoy/k8s: kustomizations rendered, files they do not
    reference validated on their own."""
    out: list[Obj] = []
    covered: set[Path] = set()
    for d in MANIFEST_DIRS:
        for k in sorted((ROOT / d).rglob("kustomization.yaml")):
            rendered = render_kustomization(k)
            out += rendered
            covered.add(k)
            covered.update(ROOT / src for src, _ in rendered if "#" not in src)
    for d in MANIFEST_DIRS:
        for f in sorted((ROOT / d).rglob("*.yaml")):
            if f not in covered:
                out += objects_of(f)
    return out


# --- Prometheus Operator: PrometheusRule ----------------------------------------------------

PROMETHEUS_RULE_SCHEMA = ROOT / "tools" / "schemas" / "prometheusrule.schema.json"


def prometheus_rule_problems(obj: dict) -> list[str]:
    """A PrometheusRule against tools/schemas/prometheusrule.schema.json (no CRD of the
    operator is available here: the schema is written from its API reference)."""
    import json

    schema = json.loads(PROMETHEUS_RULE_SCHEMA.read_text())
    validator = jsonschema.Draft202012Validator(schema)
    out = []
    for e in sorted(validator.iter_errors(obj), key=lambda e: list(e.absolute_path)):
        at = ".".join(str(p) for p in e.absolute_path) or "(root)"
        out.append(f"{at}: {e.message}")
    return out


def problems_of(obj: dict, istio: dict) -> list[str]:
    if not isinstance(obj, dict) or "kind" not in obj or "apiVersion" not in obj:
        return ["not a Kubernetes object (no apiVersion/kind)"]
    if obj["apiVersion"].split("/")[0].endswith(".istio.io") or (obj["apiVersion"], obj["kind"]) in istio:
        return istio_problems(obj, istio)
    if obj["apiVersion"].split("/")[0] == "monitoring.coreos.com":
        return prometheus_rule_problems(obj)
    return k8s_problems(obj)


def describe(obj: dict) -> str:
    meta = obj.get("metadata") or {}
    ns = f"{meta['namespace']}/" if meta.get("namespace") else ""
    return f"{obj.get('kind', '?')} {ns}{meta.get('name', '?')}"


def main(argv: Iterable[str] = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--crds", type=Path, default=DEFAULT_CRDS, help="Istio CRDs (default %(default)s)")
    parser.add_argument("files", nargs="*", type=Path, help="manifests (default: envoy/istio, envoy/k8s)")
    args = parser.parse_args(argv)
    istio = load_crd_schemas(args.crds)
    objects = [o for f in args.files for o in objects_of(f.resolve())] if args.files else default_objects()
    if not objects:
        print("validate-manifests: no manifests found", file=sys.stderr)
        return 1
    bad = 0
    for source, obj in objects:
        problems = problems_of(obj, istio)
        label = describe(obj) if isinstance(obj, dict) else repr(obj)
        print(f"{'ok ' if not problems else 'BAD'} {source}: {label}")
        for p in problems:
            print(f"      {p}")
        bad += bool(problems)
    print(f"validate-manifests: {len(objects)} objects, {bad} with problems")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
