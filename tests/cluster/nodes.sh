# shellcheck shell=bash
# Where node I of the test cluster lives on this machine (sourced by tests/cluster/up, down,
# node-up, extra-node and tests/e2e/up). Node 0 is the cluster's own (children of `run`,
# tests/cluster/node-up); nodes 1.. are extra nodes (tests/cluster/extra-node), one process
# tree each. Every node has its own:
#   name       asya-test-node, asya-test-node-1, ...
#   address    10.245.0.(I+1) on lo (node 0's is tests/services/network's ASYA_TEST_HOST_IP)
#   pod CIDR   10.244.I.0/24 on the bridge asyaI, gateway 10.244.I.1
#   containerd root and state (socket), kubelet root, cgroup root, pod log directory.
_nodes_root="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"

node_name() { if [ "$1" = 0 ]; then echo asya-test-node; else echo "asya-test-node-$1"; fi; }
node_ip() { "$_nodes_root/tests/services/network" ip "$1"; }
node_bridge() { echo "asya$1"; }  # every one matched by `asya+` in the firewall rules
node_cidr() { echo "10.244.$1.0/24"; }
node_gateway() { echo "10.244.$1.1"; }
node_containerd_base() {
  if [ "$1" = 0 ]; then echo "${ASYA_TEST_CONTAINERD_BASE:-$HOME/.cache/asya-rs/containerd}"
  else echo "$HOME/.cache/asya-rs/containerd-node$1"; fi
}
node_containerd_state() {
  if [ "$1" = 0 ]; then echo "${ASYA_TEST_CONTAINERD_STATE:-/run/asya-containerd}"; else echo "/run/asya-containerd-node$1"; fi
}
node_kubelet_root() {
  if [ "$1" = 0 ]; then echo "${ASYA_TEST_KUBELET_ROOT:-/var/lib/asya-test-kubelet}"; else echo "/var/lib/asya-test-kubelet-$1"; fi
}
# Node 0's kubelet uses the machine's root (its pods under /kubepods) and /var/log/pods.
node_cgroup_root() { echo "/asya-test-node-$1"; }
node_pod_logs() { echo "/var/log/asya-test-pods-$1"; }
# The gateways of nodes 0..N-1: where the API server's calls to a pod come from (this
# machine routes to node I's pods through asyaI). tests/e2e/up admits them at the webhook.
node_gateways() { local i out=""; for ((i = 0; i < $1; i++)); do out+="${out:+,}$(node_gateway "$i")/32"; done; echo "$out"; }
# Nodes the machine's test setup can hold (addresses 10.245.0.1-.8, tests/services/network).
NODES_MAX=8

# node_ctr I ARGS...: ctr against node I's containerd.
node_ctr() {
  local i="$1"; shift
  ASYA_TEST_CONTAINERD_BASE="$(node_containerd_base "$i")" ASYA_TEST_CONTAINERD_STATE="$(node_containerd_state "$i")" \
    "$_nodes_root/tests/services/containerd" ctr "$@"
}

# write_cni_config I: the CNI configuration in node I's containerd conf dir (bridge asyaI,
# its pod CIDR, host-local IPAM in its containerd's state directory, portmap).
write_cni_config() {
  local i="$1" dir
  dir="$(node_containerd_base "$i")/cni/net.d"
  mkdir -p "$dir"
  cat > "$dir/10-asya.conflist.tmp" <<JSON
{
  "cniVersion": "1.0.0",
  "name": "asya-test",
  "plugins": [
    {
      "type": "bridge",
      "bridge": "$(node_bridge "$i")",
      "isGateway": true,
      "isDefaultGateway": true,
      "ipMasq": false,
      "hairpinMode": true,
      "ipam": {
        "type": "host-local",
        "ranges": [[{"subnet": "$(node_cidr "$i")", "gateway": "$(node_gateway "$i")"}]],
        "dataDir": "$(node_containerd_state "$i")/cni-ipam"
      }
    },
    {"type": "portmap", "capabilities": {"portMappings": true}}
  ]
}
JSON
  mv "$dir/10-asya.conflist.tmp" "$dir/10-asya.conflist"
}

# load_images I: target/images/*.oci.tar into node I's containerd (k8s.io namespace), each
# only when its digest changed; prints the names loaded.
load_images() {
  local i="$1" archive name want have loaded=()
  for archive in "$_nodes_root"/target/images/*.oci.tar; do
    [ -f "$archive" ] || continue
    name="$(basename "$archive" .oci.tar)"
    want="$(tar -xOf "$archive" index.json | python3 -c 'import json,sys; print(json.load(sys.stdin)["manifests"][0]["digest"])')"
    have="$(node_ctr "$i" -n k8s.io images ls "name==localhost/asya-rs/$name:dev" 2>/dev/null | awk 'NR==2 {print $3}' || true)"
    if [ "$want" != "$have" ]; then
      node_ctr "$i" -n k8s.io images import "$archive" >/dev/null || { echo "loading $archive into node $i's containerd failed" >&2; return 1; }
      loaded+=("$name")
    fi
  done
  echo "${loaded[*]}"
}
