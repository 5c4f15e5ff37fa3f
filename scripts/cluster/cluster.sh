#!/usr/bin/env bash
# A real single-node Kubernetes on this machine (issue 38): Kubernetes' own etcd, kube-apiserver,
# kube-controller-manager, kube-scheduler, kubelet and kube-proxy over containerd 2 + runc and the CNI
# bridge plugin, all built from Go modules by build.sh (versions.env).
#
#   scripts/cluster/cluster.sh up       build what is missing, clean a cluster a killed run left, start one,
#                                       wait until the node is Ready (prints the times)
#   scripts/cluster/cluster.sh down     stop it and remove every process, pod, mount, cgroup, bridge and
#                                       iptables rule it made (also what a killed run left)
#   scripts/cluster/cluster.sh env      print `export KUBECONFIG=... PATH=...` for a shell
#   scripts/cluster/cluster.sh status   what runs (PIDs) and `kubectl get nodes`
#   scripts/cluster/cluster.sh restart-apiserver [SECONDS]   stop kube-apiserver, wait, start it again
#
# State lives outside the checkout in $HOLDFAST_CLUSTER_STATE (default /var/lib/holdfast/cluster): pki/,
# kubeconfigs, logs/<component>.log, pids/<component>.pid, etcd's data, containerd's root, the kubelet's
# root dir. Every daemon is started inside the pids cgroup /holdfast-cluster/<component>, so whatever it
# spawns (containerd's shims) is found again by cgroup, never by name; pods run under the kubelet's
# cgroupRoot /holdfast-k8s (not /kubepods, which the containerd backend's tests use).
#
# Addresses: API server https://<node IP>:6443 (also 127.0.0.1), etcd 127.0.0.1:12379 (plain HTTP, loopback
# only), pods 10.213.0.0/24 on the bridge hfk8s0 (gateway 10.213.0.1), Services 10.214.0.0/24.
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
# shellcheck source=versions.env
source "$here/versions.env"
STATE="${HOLDFAST_CLUSTER_STATE:-/var/lib/holdfast/cluster}"
CACHE="${HOLDFAST_CLUSTER_CACHE:-/var/cache/holdfast/cluster}"
K8S_BIN="$CACHE/kubernetes-$KUBERNETES/bin"
ETCD_BIN="$CACHE/etcd-$ETCD/bin"
CTRD_BIN="$CACHE/containerd-$CONTAINERD/bin"
RUNC_BIN="$CACHE/runc-$RUNC/bin"
CRICTL_BIN="$CACHE/crictl-$CRICTL/bin"
NODE="${HOLDFAST_CLUSTER_NODE:-holdfast-node}"
POD_CIDR=10.213.0.0/24
POD_GW=10.213.0.1
SVC_CIDR=10.214.0.0/24
SVC_API=10.214.0.1
BRIDGE=hfk8s0
CG_DAEMONS=holdfast-cluster
CG_PODS=holdfast-k8s
CGROOT=/sys/fs/cgroup
PAUSE_IMAGE=localhost/holdfast/busybox:local
KUBECONFIG_ADMIN="$STATE/admin.kubeconfig"

log() { echo "cluster: $*" >&2; }
die() { echo "cluster: $*" >&2; exit 1; }
now_ms() { date +%s%3N; }

node_ip() {
    local ip
    ip="$(ip -4 route get 1.1.1.1 2>/dev/null | sed -n 's/.* src \([0-9.]*\).*/\1/p' | head -1)"
    [[ -n "$ip" ]] || ip="$(ip -4 -o addr show scope global | awk '{print $4}' | cut -d/ -f1 | head -1)"
    [[ -n "$ip" ]] || die "no global IPv4 address on this machine for the node and the API server's advertise address"
    echo "$ip"
}

# --- cleanup -------------------------------------------------------------------------------------------

# The hierarchies the kubelet's cgroupfs driver writes (v1 controllers here, and the v2 unified mount).
hierarchies() {
    local d
    for d in "$CGROOT"/*/; do
        d="${d%/}"
        [[ -f "$d/cgroup.procs" ]] && echo "$d"
    done
    [[ -f "$CGROOT/cgroup.procs" ]] && echo "$CGROOT"
    return 0
}

# Every process in cgroup $1 (all hierarchies, recursively).
cgroup_pids() {
    local h
    for h in $(hierarchies); do
        if [[ -d "$h/$1" ]]; then find "$h/$1" -name cgroup.procs -exec cat {} + 2>/dev/null || true; fi
    done | sort -un
}

# Running (not gone, not a zombie: a daemon whose starter exited is reaped by PID 1, not by us).
running() {
    local st
    st="$(sed 's/^.*) \(.\).*/\1/' "/proc/$1/stat" 2>/dev/null)" || return 1
    [[ -n "$st" && "$st" != Z && "$st" != X ]]
}

kill_pid() { # pid: TERM, then KILL after 5 s
    local pid="$1" i
    kill -TERM "$pid" 2>/dev/null || return 0
    for i in $(seq 100); do
        running "$pid" || return 0
        sleep 0.05
    done
    kill -KILL "$pid" 2>/dev/null || true
}

# A daemon by its recorded PID, only if that PID still runs the binary we started (a reused PID is left).
stop_daemon() {
    local name="$1" pidf="$STATE/pids/$1.pid" pid exe
    [[ -f "$pidf" ]] || return 0
    pid="$(cat "$pidf")"
    exe="$(readlink "/proc/$pid/exe" 2>/dev/null || true)"
    if [[ -n "$exe" && "$exe" == "$(cat "$STATE/pids/$name.exe" 2>/dev/null)" ]]; then
        local t0
        t0=$(now_ms)
        kill_pid "$pid"
        log "stopped $name (pid $pid) in $(($(now_ms) - t0)) ms"
    fi
    rm -f "$pidf" "$STATE/pids/$name.exe"
}

remove_cgroups() {
    local h cg
    for h in $(hierarchies); do
        for cg in "$CG_PODS" "$CG_DAEMONS"; do
            [[ -d "$h/$cg" ]] || continue
            find "$h/$cg" -depth -type d -exec rmdir {} \; 2>/dev/null || true
            [[ -d "$h/$cg" ]] && log "left: cgroup $h/$cg (processes still in it?)"
        done
    done
    return 0
}

cleanup() {
    [[ -d "$STATE" ]] || { remove_cgroups; return 0; }
    local t0 name pid
    t0=$(now_ms)
    # The control plane and the node's daemons, newest first; kube-proxy's rules after it stops.
    for name in kube-proxy kubelet kube-scheduler kube-controller-manager kube-apiserver etcd; do
        stop_daemon "$name"
    done
    if [[ -x "$K8S_BIN/kube-proxy" ]]; then
        "$K8S_BIN/kube-proxy" --cleanup --v=0 >"$STATE/logs/kube-proxy-cleanup.log" 2>&1 || true
    fi
    kubelet_iptables_cleanup
    # Pods: through our own containerd (started again if a killed run left it dead), which tears down each
    # sandbox's netns and veth as the kubelet would have.
    if [[ -x "$CRICTL_BIN/crictl" && -d "$STATE/containerd/root" ]]; then
        if ! crictl_ok; then start_containerd >/dev/null 2>&1 || true; fi
        if crictl_ok; then
            "$CRICTL_BIN/crictl" --config /dev/null --runtime-endpoint "unix://$STATE/containerd/containerd.sock" rmp -fa >/dev/null 2>&1 || true
        fi
    fi
    stop_daemon containerd
    # Whatever is left in our cgroups (shims, container processes) by PID.
    for pid in $(cgroup_pids "$CG_PODS") $(cgroup_pids "$CG_DAEMONS"); do
        kill -KILL "$pid" 2>/dev/null || true
    done
    sleep 0.2
    # Mounts under the state dir (pod volumes, containerd's rootfs and shm), deepest first.
    local m
    for m in $(awk -v s="$STATE/" 'index($5, s) == 1 {print $5}' /proc/self/mountinfo | sort -r); do
        umount -l "$m" 2>/dev/null || log "left: mount $m"
    done
    remove_cgroups
    if [[ -d "/sys/class/net/$BRIDGE" ]]; then ip link del "$BRIDGE" 2>/dev/null || log "left: bridge $BRIDGE"; fi
    rm -rf --one-file-system "$STATE" 2>/dev/null || log "left: some of $STATE"
    log "cleaned up in $(($(now_ms) - t0)) ms"
}

# The kubelet's own chains (pkg/kubelet/kubelet_network_linux.go): KUBE-FIREWALL (drops packets to
# 127.0.0.0/8 from elsewhere, jumped to from INPUT and OUTPUT), KUBE-KUBELET-CANARY and KUBE-IPTABLES-HINT, in
# iptables and ip6tables. `kube-proxy --cleanup` leaves them; nothing else here may keep them.
kubelet_iptables_cleanup() {
    local ipt t c
    for ipt in iptables ip6tables; do
        command -v "$ipt" >/dev/null || continue
        while "$ipt" -w -D INPUT -j KUBE-FIREWALL 2>/dev/null; do :; done
        while "$ipt" -w -D OUTPUT -j KUBE-FIREWALL 2>/dev/null; do :; done
        for t in filter nat mangle; do
            for c in KUBE-FIREWALL KUBE-KUBELET-CANARY KUBE-IPTABLES-HINT; do
                "$ipt" -w -t "$t" -F "$c" 2>/dev/null && "$ipt" -w -t "$t" -X "$c" 2>/dev/null || true
            done
        done
    done
    return 0
}

crictl_ok() {
    [[ -S "$STATE/containerd/containerd.sock" ]] &&
        "$CRICTL_BIN/crictl" --config /dev/null --runtime-endpoint "unix://$STATE/containerd/containerd.sock" --timeout 2s version >/dev/null 2>&1
}

# --- starting ------------------------------------------------------------------------------------------

# spawn NAME BINARY ARGS...: in its own session and pids cgroup, output to logs/NAME.log, PID recorded.
spawn() {
    local name="$1" bin="$2"
    shift 2
    local h cg
    for h in $(hierarchies); do
        [[ "$h" == "$CGROOT/pids" ]] || continue
        cg="$h/$CG_DAEMONS/$name"
        mkdir -p "$cg"
    done
    [[ -n "${cg:-}" ]] || die "no pids cgroup hierarchy at $CGROOT/pids: cannot track the daemons' processes"
    # The child joins the cgroup before it execs, so everything it ever spawns is in there too.
    setsid bash -c 'echo $$ > "$1/cgroup.procs" && shift && exec "$@"' _ "$cg" "$bin" "$@" \
        </dev/null >>"$STATE/logs/$name.log" 2>&1 &
    echo $! >"$STATE/pids/$name.pid"
    readlink -f "$bin" >"$STATE/pids/$name.exe"
}

alive() { running "$(cat "$STATE/pids/$1.pid")"; }

# wait_for NAME SECONDS CMD...: until CMD succeeds; fails naming the log if NAME died or time ran out.
wait_for() {
    local name="$1" secs="$2" i
    shift 2
    for i in $(seq $((secs * 10))); do
        if "$@" >/dev/null 2>&1; then return 0; fi
        if ! alive "$name"; then
            tail -20 "$STATE/logs/$name.log" >&2
            die "$name exited while starting: see $STATE/logs/$name.log"
        fi
        sleep 0.1
    done
    tail -20 "$STATE/logs/$name.log" >&2
    die "$name not ready after ${secs}s: see $STATE/logs/$name.log"
}

cert() { # cert NAME CN O SAN...: a key and a certificate signed by the cluster CA
    local name="$1" cn="$2" o="$3"
    shift 3
    local subj="/CN=$cn" ext="$STATE/pki/$name.ext"
    [[ -n "$o" ]] && subj="/O=$o$subj"
    {
        echo "basicConstraints=CA:FALSE"
        echo "keyUsage=critical,digitalSignature,keyEncipherment"
        echo "extendedKeyUsage=serverAuth,clientAuth"
        if [[ $# -gt 0 ]]; then
            local IFS=,
            echo "subjectAltName=$*"
        fi
    } >"$ext"
    openssl ecparam -name prime256v1 -genkey -noout -out "$STATE/pki/$name.key" 2>/dev/null
    openssl req -new -key "$STATE/pki/$name.key" -subj "$subj" -out "$STATE/pki/$name.csr" 2>/dev/null
    openssl x509 -req -in "$STATE/pki/$name.csr" -CA "$STATE/pki/ca.crt" -CAkey "$STATE/pki/ca.key" \
        -CAcreateserial -days 30 -extfile "$ext" -out "$STATE/pki/$name.crt" 2>/dev/null
}

kubeconfig() { # kubeconfig FILE CERTNAME SERVER
    cat >"$1" <<EOF
apiVersion: v1
kind: Config
clusters:
- name: holdfast
  cluster:
    certificate-authority: $STATE/pki/ca.crt
    server: $3
users:
- name: $2
  user:
    client-certificate: $STATE/pki/$2.crt
    client-key: $STATE/pki/$2.key
contexts:
- name: holdfast
  context: {cluster: holdfast, user: $2}
current-context: holdfast
EOF
}

make_pki() {
    local ip="$1"
    mkdir -p "$STATE/pki"
    openssl ecparam -name prime256v1 -genkey -noout -out "$STATE/pki/ca.key" 2>/dev/null
    openssl req -x509 -new -key "$STATE/pki/ca.key" -subj "/CN=holdfast-cluster-ca" -days 30 \
        -addext "basicConstraints=critical,CA:TRUE" -addext "keyUsage=critical,keyCertSign,cRLSign" \
        -out "$STATE/pki/ca.crt" 2>/dev/null
    cert apiserver kube-apiserver "" DNS:kubernetes DNS:kubernetes.default DNS:kubernetes.default.svc \
        DNS:kubernetes.default.svc.cluster.local DNS:localhost "IP:$SVC_API" IP:127.0.0.1 "IP:$ip"
    cert apiserver-kubelet-client kube-apiserver-kubelet-client system:masters
    cert admin kubernetes-admin system:masters
    cert controller-manager system:kube-controller-manager ""
    cert scheduler system:kube-scheduler ""
    cert kube-proxy system:kube-proxy ""
    # NodeRestriction knows a node by this identity.
    cert kubelet "system:node:$NODE" system:nodes
    cert kubelet-serving "$NODE" "" "DNS:$NODE" "IP:$ip" IP:127.0.0.1
    openssl genrsa -out "$STATE/pki/sa.key" 2048 2>/dev/null
    openssl rsa -in "$STATE/pki/sa.key" -pubout -out "$STATE/pki/sa.pub" 2>/dev/null
    local server="https://$ip:6443"
    kubeconfig "$KUBECONFIG_ADMIN" admin "$server"
    kubeconfig "$STATE/controller-manager.kubeconfig" controller-manager "$server"
    kubeconfig "$STATE/scheduler.kubeconfig" scheduler "$server"
    kubeconfig "$STATE/kube-proxy.kubeconfig" kube-proxy "$server"
    kubeconfig "$STATE/kubelet.kubeconfig" kubelet "$server"
}

# An OCI layout of Debian's static busybox (sh, sleep, ...; its default command sleeps forever): the
# sandbox ("pause") image and the base of test pods, imported without a registry as tests/src/cri/image.rs
# does for the containerd backend.
busybox_image() {
    local d="$STATE/image" layer cfg man sz_l sz_c sz_m dl dc dm a
    rm -rf "$d" && mkdir -p "$d/root/bin" "$d/oci/blobs/sha256"
    [[ -x /bin/busybox ]] || die "/bin/busybox missing: apt-get install busybox-static (just setup)"
    cp /bin/busybox "$d/root/bin/busybox"
    for a in sh sleep cat ls echo id kill true wget nc date; do ln -s busybox "$d/root/bin/$a"; done
    # As tests/src/cri/image.rs lays out the containerd backend's base image, so the same pods run here
    # (tests/tests/cluster_promises.rs): Debian's merged /usr (/lib, /lib64, /sbin point into /usr, which
    # those pods get from the host as a read-only hostPath), a world-writable /tmp for the proxy's uid
    # 1337, PATH in the image config.
    mkdir -p "$d/root/etc" "$d/root/tmp" "$d/root/usr" "$d/root/run" "$d/root/var/run"
    chmod 1777 "$d/root/tmp"
    ln -s usr/lib "$d/root/lib" && ln -s usr/lib64 "$d/root/lib64" && ln -s usr/sbin "$d/root/sbin"
    tar --sort=name --mtime=@0 --owner=0 --group=0 --numeric-owner -C "$d/root" -cf "$d/layer.tar" bin etc lib lib64 run sbin tmp usr var
    dl="$(sha256sum "$d/layer.tar" | cut -d' ' -f1)"
    sz_l="$(stat -c %s "$d/layer.tar")"
    mv "$d/layer.tar" "$d/oci/blobs/sha256/$dl"
    cfg='{"architecture":"amd64","os":"linux","config":{"Env":["PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"],"Cmd":["/bin/sleep","2147483647"]},"rootfs":{"type":"layers","diff_ids":["sha256:'"$dl"'"]}}'
    printf '%s' "$cfg" >"$d/cfg"
    dc="$(sha256sum "$d/cfg" | cut -d' ' -f1)"
    sz_c="$(stat -c %s "$d/cfg")"
    mv "$d/cfg" "$d/oci/blobs/sha256/$dc"
    man='{"schemaVersion":2,"mediaType":"application/vnd.oci.image.manifest.v1+json","config":{"mediaType":"application/vnd.oci.image.config.v1+json","digest":"sha256:'"$dc"'","size":'"$sz_c"'},"layers":[{"mediaType":"application/vnd.oci.image.layer.v1.tar","digest":"sha256:'"$dl"'","size":'"$sz_l"'}]}'
    printf '%s' "$man" >"$d/man"
    dm="$(sha256sum "$d/man" | cut -d' ' -f1)"
    sz_m="$(stat -c %s "$d/man")"
    mv "$d/man" "$d/oci/blobs/sha256/$dm"
    echo '{"imageLayoutVersion":"1.0.0"}' >"$d/oci/oci-layout"
    echo '{"schemaVersion":2,"manifests":[{"mediaType":"application/vnd.oci.image.manifest.v1+json","digest":"sha256:'"$dm"'","size":'"$sz_m"',"annotations":{"io.containerd.image.name":"'"$PAUSE_IMAGE"'","org.opencontainers.image.ref.name":"local"}}]}' >"$d/oci/index.json"
    tar -C "$d/oci" -cf "$d/busybox.tar" .
    "$CTRD_BIN/ctr" --address "$STATE/containerd/containerd.sock" -n k8s.io images import "$d/busybox.tar" >/dev/null
}

start_containerd() {
    local c="$STATE/containerd"
    mkdir -p "$c/root" "$c/state" "$c/cni" "$c/certs.d/127.0.0.1:5000" "$STATE/logs" "$STATE/pids"
    # containerd 2's config (version 3): docs/cri/config.md of containerd v2. restrict_oom_score_adj: this
    # machine refuses a negative oom_score_adj (../shared/reference/containerd-cri.md).
    cat >"$c/config.toml" <<EOF
version = 3
root = "$c/root"
state = "$c/state"
[grpc]
  address = "$c/containerd.sock"
[plugins.'io.containerd.cri.v1.images']
  snapshotter = "overlayfs"
  [plugins.'io.containerd.cri.v1.images'.pinned_images]
    sandbox = "$PAUSE_IMAGE"
  [plugins.'io.containerd.cri.v1.images'.registry]
    config_path = "$c/certs.d"
[plugins.'io.containerd.cri.v1.runtime']
  restrict_oom_score_adj = true
  [plugins.'io.containerd.cri.v1.runtime'.cni]
    bin_dirs = ["/usr/lib/cni"]
    conf_dir = "$c/cni"
  [plugins.'io.containerd.cri.v1.runtime'.containerd.runtimes.runc]
    runtime_type = "io.containerd.runc.v2"
    [plugins.'io.containerd.cri.v1.runtime'.containerd.runtimes.runc.options]
      BinaryName = "$RUNC_BIN/runc"
      SystemdCgroup = false
EOF
    printf 'runtime-endpoint: unix://%s\nimage-endpoint: unix://%s\ntimeout: 10\n' "$c/containerd.sock" "$c/containerd.sock" >"$STATE/crictl.yaml"
    # The loopback registry `just image` pushes to, over plain HTTP.
    cat >"$c/certs.d/127.0.0.1:5000/hosts.toml" <<EOF
server = "http://127.0.0.1:5000"
[host."http://127.0.0.1:5000"]
  capabilities = ["pull", "resolve"]
EOF
    cat >"$c/cni/10-holdfast.conflist" <<EOF
{"cniVersion": "0.4.0", "name": "holdfast-k8s", "plugins": [
  {"type": "bridge", "bridge": "$BRIDGE", "isGateway": true, "ipMasq": true, "hairpinMode": true,
   "ipam": {"type": "host-local", "ranges": [[{"subnet": "$POD_CIDR", "gateway": "$POD_GW"}]],
            "routes": [{"dst": "0.0.0.0/0"}], "dataDir": "$c/cni-ipam"}},
  {"type": "portmap", "capabilities": {"portMappings": true}},
  {"type": "loopback"}]}
EOF
    # The shim containerd execs is found on PATH: ours, not Debian's 1.6 one.
    PATH="$CTRD_BIN:$RUNC_BIN:$PATH" spawn containerd "$CTRD_BIN/containerd" --config "$c/config.toml"
    wait_for containerd 30 crictl_ok
}

# The API server (also alone: `restart-apiserver`, the agent's watch across an outage).
start_apiserver() {
    local ip="$1" pki="$STATE/pki"
    spawn kube-apiserver "$K8S_BIN/kube-apiserver" \
        --etcd-servers=http://127.0.0.1:12379 --advertise-address="$ip" --secure-port=6443 \
        --service-cluster-ip-range="$SVC_CIDR" --allow-privileged=true \
        --authorization-mode=Node,RBAC \
        --enable-admission-plugins=NodeRestriction,PodSecurity,ResourceQuota,ValidatingAdmissionPolicy,ServiceAccount,Priority \
        --admission-control-config-file="$STATE/admission.yaml" \
        --client-ca-file="$pki/ca.crt" --tls-cert-file="$pki/apiserver.crt" --tls-private-key-file="$pki/apiserver.key" \
        --kubelet-client-certificate="$pki/apiserver-kubelet-client.crt" --kubelet-client-key="$pki/apiserver-kubelet-client.key" \
        --kubelet-certificate-authority="$pki/ca.crt" --kubelet-preferred-address-types=InternalIP \
        --service-account-issuer=https://kubernetes.default.svc.cluster.local \
        --service-account-key-file="$pki/sa.pub" --service-account-signing-key-file="$pki/sa.key" \
        --profiling=false --v=1
    wait_for kube-apiserver 90 "$K8S_BIN/kubectl" --kubeconfig "$KUBECONFIG_ADMIN" get --raw /readyz
}

start() {
    local ip t0 t
    ip="$(node_ip)"
    t0=$(now_ms)
    mkdir -p "$STATE/logs" "$STATE/pids" "$STATE/etcd" "$STATE/kubelet" "$STATE/pod-logs"
    make_pki "$ip"
    local pki="$STATE/pki"
    t=$(now_ms); log "pki: $((t - t0)) ms"

    spawn etcd "$ETCD_BIN/etcd" --name holdfast --data-dir "$STATE/etcd" \
        --listen-client-urls http://127.0.0.1:12379 --advertise-client-urls http://127.0.0.1:12379 \
        --listen-peer-urls http://127.0.0.1:12380 --initial-advertise-peer-urls http://127.0.0.1:12380 \
        --initial-cluster holdfast=http://127.0.0.1:12380 --listen-metrics-urls http://127.0.0.1:12381 \
        --log-level warn
    wait_for etcd 30 curl -sf http://127.0.0.1:12379/health

    # The GKE-shaped quota rule (GKE limits system-node-critical pods to namespaces with a quota covering
    # that priority class; docs/install.md): ResourceQuota's `limitedResources`, as the Kubernetes docs'
    # "Limit Priority Class consumption by default" configures it.
    cat >"$STATE/admission.yaml" <<EOF
apiVersion: apiserver.config.k8s.io/v1
kind: AdmissionConfiguration
plugins:
- name: ResourceQuota
  configuration:
    apiVersion: apiserver.config.k8s.io/v1
    kind: ResourceQuotaConfiguration
    limitedResources:
    - resource: pods
      matchScopes:
      - scopeName: PriorityClass
        operator: In
        values: ["system-node-critical", "system-cluster-critical"]
EOF
    start_apiserver "$ip"
    t=$(now_ms); log "etcd + kube-apiserver ready: $((t - t0)) ms"

    spawn kube-controller-manager "$K8S_BIN/kube-controller-manager" \
        --kubeconfig="$STATE/controller-manager.kubeconfig" \
        --authentication-kubeconfig="$STATE/controller-manager.kubeconfig" \
        --authorization-kubeconfig="$STATE/controller-manager.kubeconfig" \
        --service-account-private-key-file="$pki/sa.key" --root-ca-file="$pki/ca.crt" \
        --cluster-signing-cert-file="$pki/ca.crt" --cluster-signing-key-file="$pki/ca.key" \
        --use-service-account-credentials=true --leader-elect=false --bind-address=127.0.0.1 \
        --service-cluster-ip-range="$SVC_CIDR" --v=1
    spawn kube-scheduler "$K8S_BIN/kube-scheduler" --kubeconfig="$STATE/scheduler.kubeconfig" \
        --authentication-kubeconfig="$STATE/scheduler.kubeconfig" \
        --authorization-kubeconfig="$STATE/scheduler.kubeconfig" \
        --leader-elect=false --bind-address=127.0.0.1 --v=1

    start_containerd
    busybox_image
    t=$(now_ms); log "containerd + images: $((t - t0)) ms"

    # The kubelet's cgroupRoot exists in every hierarchy before it starts (it refuses a missing one); the
    # cpuset one gets its parent's CPUs and memory nodes (a new v1 cpuset is empty).
    local h
    for h in $(hierarchies); do
        mkdir -p "$h/$CG_PODS"
        if [[ -f "$h/cpuset.cpus" ]]; then
            cat "$h/cpuset.cpus" >"$h/$CG_PODS/cpuset.cpus"
            cat "$h/cpuset.mems" >"$h/$CG_PODS/cpuset.mems"
        fi
    done
    cat >"$STATE/kubelet.yaml" <<EOF
apiVersion: kubelet.config.k8s.io/v1beta1
kind: KubeletConfiguration
# cgroup v1 here (v1 controllers + a v2 unified mount): 1.35 refuses it unless told (KEP-5573).
failCgroupV1: false
cgroupDriver: cgroupfs
cgroupRoot: /$CG_PODS
containerRuntimeEndpoint: unix://$STATE/containerd/containerd.sock
podLogsDir: $STATE/pod-logs
authentication:
  anonymous: {enabled: false}
  webhook: {enabled: true}
  x509: {clientCAFile: $pki/ca.crt}
authorization: {mode: Webhook}
tlsCertFile: $pki/kubelet-serving.crt
tlsPrivateKeyFile: $pki/kubelet-serving.key
clusterDomain: cluster.local
readOnlyPort: 0
healthzBindAddress: 127.0.0.1
serializeImagePulls: false
# The agent's startup taint, as node pools set it (manifests/agent/node-taint-policy.yaml, docs/install.md).
registerWithTaints:
- {key: holdfast.io/agent-not-ready, effect: NoSchedule}
# Absolute floors, not percentages: this machine's disk runs near full while four builds share it, and
# 1% of it (2.5 GB) evicted the test's pods once (DiskPressure).
evictionHard: {memory.available: "100Mi", nodefs.available: "100Mi", imagefs.available: "100Mi", nodefs.inodesFree: "1%"}
imageGCHighThresholdPercent: 100
resolvConf: /etc/resolv.conf
EOF
    spawn kubelet "$K8S_BIN/kubelet" --config="$STATE/kubelet.yaml" \
        --kubeconfig="$STATE/kubelet.kubeconfig" --root-dir="$STATE/kubelet" \
        --hostname-override="$NODE" --node-ip="$ip" --v=2

    cat >"$STATE/kube-proxy.yaml" <<EOF
apiVersion: kubeproxy.config.k8s.io/v1alpha1
kind: KubeProxyConfiguration
mode: iptables
clientConnection: {kubeconfig: $STATE/kube-proxy.kubeconfig}
hostnameOverride: $NODE
clusterCIDR: $POD_CIDR
bindAddress: 127.0.0.1
metricsBindAddress: 127.0.0.1:10249
healthzBindAddress: 127.0.0.1:10256
# No sysctl writes this machine may refuse: conntrack table sizes as they are, no route_localnet.
conntrack: {maxPerCore: 0, min: 0, tcpEstablishedTimeout: 0s, tcpCloseWaitTimeout: 0s}
iptables: {localhostNodePorts: false}
EOF
    spawn kube-proxy "$K8S_BIN/kube-proxy" --config="$STATE/kube-proxy.yaml" --v=1

    wait_for kubelet 120 node_ready
    t=$(now_ms); log "node $NODE Ready: $((t - t0)) ms after the start of 'up'"
}

node_ready() {
    [[ "$("$K8S_BIN/kubectl" --kubeconfig "$KUBECONFIG_ADMIN" get node "$NODE" \
        -o 'jsonpath={.status.conditions[?(@.type=="Ready")].status}' 2>/dev/null)" == True ]]
}

main() {
case "${1:-}" in
up)
    [[ $EUID -eq 0 ]] || die "needs root (it runs a kubelet, containerd and kube-proxy)"
    t_up=$(now_ms)
    "$here/build.sh" | grep -v '^go: downloading' || die "building the cluster's programs failed (above)"
    t_built=$(now_ms)
    cleanup
    start
    log "up: $(($(now_ms) - t_up)) ms in all, of which building/checking the programs $((t_built - t_up)) ms"
    main env
    ;;
down)
    [[ $EUID -eq 0 ]] || die "needs root"
    cleanup
    ;;
restart-apiserver)
    [[ $EUID -eq 0 ]] || die "needs root"
    t0=$(now_ms)
    stop_daemon kube-apiserver
    t1=$(now_ms)
    sleep "${2:-0}"
    start_apiserver "$(node_ip)"
    log "kube-apiserver: stopped in $((t1 - t0)) ms (TERM, KILL after 5 s), ready again $(($(now_ms) - t1)) ms later (${2:-0} s of waiting included)"
    ;;
env)
    echo "export KUBECONFIG=$KUBECONFIG_ADMIN CRI_CONFIG_FILE=$STATE/crictl.yaml PATH=$K8S_BIN:$CRICTL_BIN:\$PATH"
    ;;
status)
    for f in "$STATE"/pids/*.pid; do
        [[ -f "$f" ]] || continue
        n="$(basename "$f" .pid)"
        if alive "$n"; then echo "$n: pid $(cat "$f")"; else echo "$n: not running"; fi
    done
    "$K8S_BIN/kubectl" --kubeconfig "$KUBECONFIG_ADMIN" get nodes -o wide
    ;;
*)
    sed -n '2,20p' "$0" | sed 's/^# \{0,1\}//'
    [[ "${1:-}" == "-h" || "${1:-}" == "--help" ]] || exit 2
    ;;
esac
}

# Sourced (a test harness's helpers), nothing runs.
[[ "${BASH_SOURCE[0]}" != "$0" ]] || main "$@"
