#!/usr/bin/env bash
# The Helm chart on the real cluster (issue 41): sourced by scripts/cluster/test-install.sh after its
# checks of the kustomize install, with its helpers (pass, fail, now_ms, refused), $STATE, $NODE and the
# images `just image` pushed to the loopback registry (still served).
#
#   1. The kustomize install is deleted (`kubectl delete -k`, as a user switching installs would).
#   2. `helm install holdfast charts/holdfast -n default` (the chart creates holdfast-system itself) with
#      the same images, pinned by digest as the chart's values say (image.repository, image.digest,
#      filter.oci): the real scheduler and kubelet run the agent, Ready, and it removes the startup
#      taint an admin put back.
#   3. `helm upgrade --reuse-values --set agent.log=holdfast=debug`: the DaemonSet rolls to a new pod
#      with the new HOLDFAST_LOG, Ready again.
#   4. `helm uninstall --wait`: every object of the release's manifest is gone (namespaced and
#      cluster-scoped: the ClusterRole, its binding, the admission policy and its binding, the
#      WasmPlugins in istio-system, the namespace holdfast-system itself), and no agent process is left.
# The chart's agreement with the kustomize render is tests/tests/helm_chart.rs (`just test`).

helm_bin="$repo/${CARGO_TARGET_DIR:-target}/bin/helm"
[[ -x "$helm_bin" ]] || { fail "no helm at $helm_bin (just setup builds it)"; return 0; }
helm() { "$helm_bin" "$@"; }

# The images of the kustomize install, read from the cluster before it goes.
agent_image="$(kubectl -n holdfast-system get ds holdfast-agent -o jsonpath='{.spec.template.spec.containers[0].image}')"
filter_oci="$(kubectl -n istio-system get wasmplugins -o jsonpath='{.items[0].spec.url}')"
echo "  images: agent $agent_image, filter $filter_oci"
[[ "$agent_image" == *@sha256:* ]] || { fail "the kustomize install's agent image is not pinned by digest: $agent_image"; return 0; }

t_h=$(now_ms)
kubectl delete -k "$STATE/install" --wait=true --timeout=120s >/dev/null 2>&1 ||
    fail "kubectl delete -k of the kustomize install did not finish in 120 s"
kubectl get namespace holdfast-system >/dev/null 2>&1 && fail "holdfast-system still there after kubectl delete -k" ||
    pass "the kustomize install deleted ($(($(now_ms) - t_h)) ms), namespace holdfast-system gone"
# The startup taint back, as on a node that joins before any agent runs: the Helm-installed agent must
# remove it too.
kubectl taint node "$NODE" holdfast.io/agent-not-ready=:NoSchedule --overwrite >/dev/null

# helm_rolled_out WHAT: the DaemonSet rolled out and its (only) pod Ready, within 180 s.
helm_rolled_out() {
    if kubectl -n holdfast-system rollout status ds/holdfast-agent --timeout=180s >/dev/null 2>&1; then
        pass "$1: the DaemonSet rolled out in $(($(now_ms) - t_h)) ms"
        return 0
    fi
    fail "$1: the DaemonSet's pod is not Ready after 180 s"
    kubectl -n holdfast-system describe pods >&2 || true
    return 1
}
# The agent's running pod that is not being deleted (after a rollout the old one may still terminate).
helm_agent_pod() {
    kubectl -n holdfast-system get pods -l app.kubernetes.io/name=holdfast -o json | python3 -c '
import json, sys
pods = [p["metadata"]["name"] for p in json.load(sys.stdin)["items"]
        if not p["metadata"].get("deletionTimestamp") and p.get("status", {}).get("phase") == "Running"]
print(pods[0] if len(pods) == 1 else " ".join(pods) or "none")'
}

echo "== 8a. helm install"
t_h=$(now_ms)
if out="$(helm install holdfast "$repo/charts/holdfast" -n default --wait=false \
    --set image.repository="${agent_image%@*}" --set image.digest="${agent_image#*@}" \
    --set filter.oci="$filter_oci" 2>&1)"; then
    pass "helm install: $(grep -m1 '^STATUS' <<<"$out")"
else
    fail "helm install failed: $out"
    return 0
fi
helm_rolled_out "helm install" || return 0
installed_pod="$(helm_agent_pod)"
gone=""
for _ in $(seq 60); do
    taints="$(kubectl get node "$NODE" -o jsonpath='{.spec.taints[*].key}')"
    [[ " $taints " != *" holdfast.io/agent-not-ready "* ]] && { gone=1; break; }
    sleep 0.5
done
[[ -n "$gone" ]] && pass "the Helm-installed agent ($installed_pod) removed the startup taint" ||
    fail "the Helm-installed agent left holdfast.io/agent-not-ready on the node"
if out="$(timeout 30 "$agent_bin" status --node "$NODE" 2>&1)" && [[ "$out" == *"node $NODE"* ]]; then
    pass "holdfast status --node $NODE answers from the Helm-installed agent"
else
    fail "holdfast status --node $NODE after helm install: $out"
fi
manifest="$(helm get manifest holdfast -n default)"

echo "== 8b. helm upgrade"
t_h=$(now_ms)
if out="$(helm upgrade holdfast "$repo/charts/holdfast" -n default --reuse-values \
    --set agent.log=holdfast=debug 2>&1)"; then
    pass "helm upgrade --set agent.log=holdfast=debug: $(grep -m1 '^STATUS' <<<"$out")"
else
    fail "helm upgrade failed: $out"
fi
if helm_rolled_out "helm upgrade"; then
    upgraded_pod="$(helm_agent_pod)"
    log="$(kubectl -n holdfast-system get pod "$upgraded_pod" \
        -o jsonpath='{.spec.containers[0].env[?(@.name=="HOLDFAST_LOG")].value}' 2>/dev/null || true)"
    [[ "$upgraded_pod" != "$installed_pod" && "$log" == holdfast=debug ]] &&
        pass "the upgrade replaced the agent's pod ($installed_pod -> $upgraded_pod) with HOLDFAST_LOG=$log" ||
        fail "after the upgrade: pod $upgraded_pod (was $installed_pod), HOLDFAST_LOG='$log'"
fi

echo "== 8c. helm uninstall"
t_h=$(now_ms)
if out="$(helm uninstall holdfast -n default --wait --timeout 180s 2>&1)"; then
    pass "helm uninstall in $(($(now_ms) - t_h)) ms: $(head -1 <<<"$out")"
else
    fail "helm uninstall failed: $out"
fi
# Every object of the release's manifest, by kind, namespace and name (helm's rendered documents); the
# namespace may take a few seconds to finish terminating, so each is given 90 s.
objects="$(python3 -c '
import sys
kind = ns = name = None
in_meta = False
for line in sys.stdin.read().splitlines() + ["---"]:
    if line.startswith("---"):
        if kind and name:
            print(kind, ns or "-", name)
        kind = ns = name = None
        in_meta = False
    elif line.startswith("kind:"):
        kind = line.split(":", 1)[1].strip()
    elif line.startswith("metadata:"):
        in_meta = True
    elif in_meta and line.startswith("  name:") and name is None:
        name = line.split(":", 1)[1].strip().strip("\"")
    elif in_meta and line.startswith("  namespace:"):
        ns = line.split(":", 1)[1].strip().strip("\"")
    elif line and not line.startswith(" "):
        in_meta = False
' <<<"$manifest")"
checked="$(grep -c . <<<"$objects" || true)"
still_there() { # lists the objects of $objects that the API server still returns
    local kind ns name
    while read -r kind ns name; do
        if [[ "$ns" != - ]]; then
            kubectl get "$kind" "$name" -n "$ns" >/dev/null 2>&1 && echo "$kind $ns/$name"
        else
            kubectl get "$kind" "$name" >/dev/null 2>&1 && echo "$kind $name"
        fi
    done <<<"$objects"
    return 0
}
left="$(still_there)"
for _ in $(seq 45); do
    [[ -z "$left" ]] && break
    sleep 2
    left="$(still_there)"
done
if [[ "$checked" -le 5 ]]; then
    fail "read only $checked objects from helm get manifest: $objects"
elif [[ -z "$left" ]]; then
    pass "none of the release's $checked objects is left after helm uninstall ($(($(now_ms) - t_h)) ms)"
else
    fail "left after helm uninstall: $(tr '\n' ';' <<<"$left")"
fi
# The agent's process is gone with its pod (the kubelet stopped the container).
if command crictl ps --name '^agent$' -q 2>/dev/null | grep -q .; then
    fail "an agent container still runs after helm uninstall"
else
    pass "no agent container runs after helm uninstall"
fi
