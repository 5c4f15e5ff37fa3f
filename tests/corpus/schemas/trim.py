#!/usr/bin/env python3
"""Writes the schema corpus tests/tests/manifests.rs validates every manifest against, trimmed to
the kinds holdfast's manifests use (and those planned: NetworkPolicy, ValidatingAdmissionPolicy
and its binding) and without descriptions, to keep the repository small.

  pip download --no-deps kubernetes-validate==1.37.0      # Kubernetes' OpenAPI as JSON Schema
  git -C <istio/istio> show 1.24.6:manifests/charts/base/files/crd-all.gen.yaml > crd-1.24.6.yaml
  git -C <istio/istio> show 1.30.3:manifests/charts/base/files/crd-all.gen.yaml > crd-1.30.3.yaml
  git -C <istio/istio> show 86c9f01:manifests/charts/base/files/crd-all.gen.yaml > crd-master-86c9f01.yaml
  python3 trim.py kubernetes_validate-1.37.0-py3-none-any.whl crd-1.24.6.yaml crd-1.30.3.yaml crd-master-86c9f01.yaml
  for v in v0.73.2 v0.93.0; do for k in podmonitors prometheusrules; do
    git -C <prometheus-operator/prometheus-operator> show \
      $v:example/prometheus-operator-crd/monitoring.coreos.com_$k.yaml > monitoring-$k-$v.yaml
  done; done
  python3 trim.py --prometheus-operator v0.73.2 v0.93.0    # reads monitoring-*-<v>.yaml
  for v in v2.13.10 v2.14.3 348b652; do
    git -C <kumahq/kuma> show $v:deployments/charts/kuma/crds/kuma.io_meshproxypatches.yaml \
      > kuma-meshproxypatches-$v.yaml
  done
  python3 trim.py --kuma v2.13.10 v2.14.3 348b652          # reads kuma-meshproxypatches-<v>.yaml

Kubernetes: the "local-strict" schemas kubernetes-validate (PyPI, by Will Thames; Apache-2.0)
generates from each release's api/openapi-spec/swagger.json (openapi2jsonschema): every object
has additionalProperties: false, which is what `kubectl apply --validate=strict` (server-side
field validation, the default) enforces. Istio: the openAPIV3Schema of the CRDs in
istio/istio manifests/charts/base/files/crd-all.gen.yaml, CEL rules (x-kubernetes-validations)
kept. Prometheus Operator: the openAPIV3Schema of its PodMonitor and PrometheusRule CRDs
(example/prometheus-operator-crd/ in prometheus-operator/prometheus-operator), for the optional
monitoring component (manifests/monitoring/). Kuma: the openAPIV3Schema of its MeshProxyPatch CRD
(deployments/charts/kuma/crds/ in kumahq/kuma), for manifests/kuma-filter/.
"""
import json
import os
import sys
import zipfile

import yaml

K8S_VERSIONS = ["v1.30.0", "v1.37.0"]
K8S_KINDS = {
    # apiVersion/kind: kubernetes-validate's file name
    "v1/Namespace": "namespace-v1.json",
    "v1/ServiceAccount": "serviceaccount-v1.json",
    "v1/ResourceQuota": "resourcequota-v1.json",
    "rbac.authorization.k8s.io/v1/ClusterRole": "clusterrole-rbac-v1.json",
    "rbac.authorization.k8s.io/v1/ClusterRoleBinding": "clusterrolebinding-rbac-v1.json",
    "rbac.authorization.k8s.io/v1/Role": "role-rbac-v1.json",
    "rbac.authorization.k8s.io/v1/RoleBinding": "rolebinding-rbac-v1.json",
    "apps/v1/DaemonSet": "daemonset-apps-v1.json",
    "networking.k8s.io/v1/NetworkPolicy": "networkpolicy-networking-v1.json",
    "admissionregistration.k8s.io/v1/ValidatingAdmissionPolicy":
        "validatingadmissionpolicy-admissionregistration-v1.json",
    "admissionregistration.k8s.io/v1/ValidatingAdmissionPolicyBinding":
        "validatingadmissionpolicybinding-admissionregistration-v1.json",
}
# TrafficExtension: Istio 1.30+ (the 1.24.6 file has none).
ISTIO_KINDS = {("WasmPlugin", "v1alpha1"), ("EnvoyFilter", "v1alpha3"), ("TrafficExtension", "v1alpha1")}
PROMETHEUS_OPERATOR_KINDS = {("PodMonitor", "v1"), ("PrometheusRule", "v1")}
PROMETHEUS_OPERATOR_CRDS = ["podmonitors", "prometheusrules"]
KUMA_KINDS = {("MeshProxyPatch", "v1alpha1")}
REF_PREFIX = "/api/_definitions.json#/$defs/"


def strip(schema, refs):
    """A schema without descriptions, its $refs local (#/$defs/NAME); collects referenced names."""
    if isinstance(schema, list):
        return [strip(s, refs) for s in schema]
    if not isinstance(schema, dict):
        return schema
    out = {}
    for k, v in schema.items():
        if k == "description" and isinstance(v, str):
            continue
        if k == "$ref":
            name = v[len(REF_PREFIX):] if v.startswith(REF_PREFIX) else v.split("/")[-1]
            refs.add(name)
            out[k] = "#/$defs/" + name
        elif k in ("properties", "$defs", "patternProperties"):
            out[k] = {name: strip(s, refs) for name, s in v.items()}
        elif k in ("additionalProperties", "items", "not", "allOf", "anyOf", "oneOf"):
            out[k] = strip(v, refs)
        else:
            out[k] = v
    return out


def kubernetes(wheel):
    z = zipfile.ZipFile(wheel)
    base = "kubernetes_validate/kubernetes-json-schema/"
    for version in K8S_VERSIONS:
        d = base + version + "-local-strict/"
        defs = json.loads(z.read(d + "_definitions.json"))["$defs"]
        kinds, refs = {}, set()
        for gvk, file in K8S_KINDS.items():
            try:
                root = json.loads(z.read(d + file))
            except KeyError:
                print(f"{version}: no {file}: {gvk} is not in this release", file=sys.stderr)
                continue
            for k in ("$schema", "$id"):
                root.pop(k, None)
            kinds[gvk] = strip(root, refs)
        kept, todo = {}, sorted(refs)
        while todo:
            name = todo.pop()
            if name in kept:
                continue
            more = set()
            kept[name] = strip(defs[name], more)
            todo.extend(sorted(more - set(kept)))
        out = {
            "source": f"Kubernetes {version} OpenAPI (api/openapi-spec/swagger.json) as JSON Schema, "
            f"'local-strict' variant, from kubernetes-validate 1.37.0 (PyPI); trimmed by "
            f"tests/corpus/schemas/trim.py to the kinds below and what they reference, "
            f"descriptions removed",
            "kinds": kinds,
            "$defs": dict(sorted(kept.items())),
        }
        path = f"kubernetes-{version}.json"
        with open(path, "w") as f:
            json.dump(out, f, sort_keys=True, separators=(",", ":"))
            f.write("\n")
        print(f"{path}: {len(kinds)} kinds, {len(kept)} definitions", file=sys.stderr)


def object_meta(wheel):
    """ObjectMeta and what it references, from the floor Kubernetes release: the API server
    validates a custom resource's metadata as ObjectMeta (its CRD schema leaves it out)."""
    z = zipfile.ZipFile(wheel)
    d = "kubernetes_validate/kubernetes-json-schema/" + K8S_VERSIONS[0] + "-local-strict/"
    defs = json.loads(z.read(d + "_definitions.json"))["$defs"]
    kept, todo = {}, ["io.k8s.apimachinery.pkg.apis.meta.v1.ObjectMeta"]
    while todo:
        name = todo.pop()
        if name in kept:
            continue
        more = set()
        kept[name] = strip(defs[name], more)
        todo.extend(sorted(more - set(kept)))
    return kept


def crd_kinds(crd_files, wanted):
    """The openAPIV3Schema of each wanted (kind, version) in the CRD files, as the API server
    sees it (apiVersion, kind and metadata added)."""
    kinds = {}
    for crd_file in crd_files:
        for doc in yaml.safe_load_all(open(crd_file)):
            if not doc or doc.get("kind") != "CustomResourceDefinition":
                continue
            spec = doc["spec"]
            for v in spec["versions"]:
                if (spec["names"]["kind"], v["name"]) not in wanted:
                    continue
                gvk = f'{spec["group"]}/{v["name"]}/{spec["names"]["kind"]}'
                root = strip(v["schema"]["openAPIV3Schema"], set())
                # What the API server adds to every custom resource's schema.
                root["properties"]["apiVersion"] = {"type": "string", "enum": [f'{spec["group"]}/{v["name"]}']}
                root["properties"]["kind"] = {"type": "string", "enum": [spec["names"]["kind"]]}
                root["properties"]["metadata"] = {"$ref": "#/$defs/io.k8s.apimachinery.pkg.apis.meta.v1.ObjectMeta"}
                kinds[gvk] = root
    return kinds


def istio(crd_file, meta_defs):
    version = crd_file.rsplit("crd-", 1)[-1].removesuffix(".yaml")
    kinds = crd_kinds([crd_file], ISTIO_KINDS)
    out = {
        "source": f"istio/istio {version} manifests/charts/base/files/crd-all.gen.yaml, "
        f"openAPIV3Schema of the kinds below (served versions holdfast uses), descriptions removed, "
        f"apiVersion/kind/metadata added as the API server adds them (metadata: Kubernetes "
        f"{K8S_VERSIONS[0]}'s ObjectMeta), by tests/corpus/schemas/trim.py",
        "kinds": kinds,
        "$defs": meta_defs,
    }
    path = f"istio-{version}.json"
    with open(path, "w") as f:
        json.dump(out, f, sort_keys=True, separators=(",", ":"))
        f.write("\n")
    print(f"{path}: {sorted(kinds)}", file=sys.stderr)


def prometheus_operator(version, meta_defs):
    files = [f"monitoring-{k}-{version}.yaml" for k in PROMETHEUS_OPERATOR_CRDS]
    kinds = crd_kinds(files, PROMETHEUS_OPERATOR_KINDS)
    out = {
        "source": f"prometheus-operator/prometheus-operator {version} "
        f"example/prometheus-operator-crd/monitoring.coreos.com_{{podmonitors,prometheusrules}}.yaml, "
        f"openAPIV3Schema of the kinds below, descriptions removed, apiVersion/kind/metadata added "
        f"as the API server adds them (metadata: Kubernetes {K8S_VERSIONS[0]}'s ObjectMeta), by "
        f"tests/corpus/schemas/trim.py",
        "kinds": kinds,
        "$defs": meta_defs,
    }
    path = f"prometheus-operator-{version}.json"
    with open(path, "w") as f:
        json.dump(out, f, sort_keys=True, separators=(",", ":"))
        f.write("\n")
    print(f"{path}: {sorted(kinds)}", file=sys.stderr)


def kuma(version, meta_defs):
    kinds = crd_kinds([f"kuma-meshproxypatches-{version}.yaml"], KUMA_KINDS)
    name = version if version.startswith("v") else f"master-{version}"
    out = {
        "source": f"kumahq/kuma {name} deployments/charts/kuma/crds/kuma.io_meshproxypatches.yaml, "
        f"openAPIV3Schema of the kinds below, descriptions removed, apiVersion/kind/metadata added "
        f"as the API server adds them (metadata: Kubernetes {K8S_VERSIONS[0]}'s ObjectMeta), by "
        f"tests/corpus/schemas/trim.py",
        "kinds": kinds,
        "$defs": meta_defs,
    }
    path = f"kuma-{name}.json"
    with open(path, "w") as f:
        json.dump(out, f, sort_keys=True, separators=(",", ":"))
        f.write("\n")
    print(f"{path}: {sorted(kinds)}", file=sys.stderr)


if __name__ == "__main__":
    if sys.argv[1] in ("--prometheus-operator", "--kuma"):
        # ObjectMeta from the committed Istio file (the same floor release's), so this step
        # needs no Kubernetes wheel.
        istio_file = sorted(f for f in os.listdir(".") if f.startswith("istio-"))[0]
        meta = json.load(open(istio_file))["$defs"]
        for v in sys.argv[2:]:
            (prometheus_operator if sys.argv[1] == "--prometheus-operator" else kuma)(v, meta)
        sys.exit(0)
    kubernetes(sys.argv[1])
    meta = object_meta(sys.argv[1])
    for crd in sys.argv[2:]:
        istio(crd, meta)
