#!/usr/bin/env bash
# Installs what the build and the test suite need on a fresh machine. Idempotent: each step
# checks before it installs, so a second run costs seconds.
set -euo pipefail
cd "$(dirname "$0")/.."

need_apt=()
command -v rabbitmq-server >/dev/null 2>&1 || [ -x /usr/sbin/rabbitmq-server ] || need_apt+=(rabbitmq-server)
ls /usr/lib/postgresql/*/bin/postgres >/dev/null 2>&1 || need_apt+=(postgresql)
# The state proxy's Redis connector is tested against a real Redis.
command -v redis-server >/dev/null 2>&1 || need_apt+=(redis-server)
command -v curl >/dev/null 2>&1 || need_apt+=(curl)
command -v openssl >/dev/null 2>&1 || need_apt+=(openssl)
# The container runtime the image tests (and the test node) run images with, and the builder
# of the Python image's Debian base (make images).
command -v containerd >/dev/null 2>&1 || need_apt+=(containerd)
command -v runc >/dev/null 2>&1 || need_apt+=(runc)
command -v mmdebstrap >/dev/null 2>&1 || need_apt+=(mmdebstrap)
[ -f /etc/ssl/certs/ca-certificates.crt ] || need_apt+=(ca-certificates)
# ElasticMQ, the test SQS server (tests/services/elasticmq), is a JVM server fetched by Maven.
command -v java >/dev/null 2>&1 || need_apt+=(default-jre-headless)
command -v mvn >/dev/null 2>&1 || need_apt+=(maven)
# The test node (tests/cluster): pod networking and kube-proxy's tools.
[ -x /usr/lib/cni/bridge ] || need_apt+=(containernetworking-plugins)
command -v iptables >/dev/null 2>&1 || need_apt+=(iptables)
command -v conntrack >/dev/null 2>&1 || need_apt+=(conntrack)
command -v ip >/dev/null 2>&1 || need_apt+=(iproute2)
if [ ${#need_apt[@]} -gt 0 ]; then
  echo "deps: apt-get install ${need_apt[*]}"
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq
  # The package's postinst starts a broker we do not want; our scripts start their own.
  RUNLEVEL=1 apt-get install -y -qq --no-install-recommends "${need_apt[@]}" >/dev/null
  service rabbitmq-server stop >/dev/null 2>&1 || true
  # Same for PostgreSQL: tests/services/postgres runs its own cluster on its own port.
  service postgresql stop >/dev/null 2>&1 || true
  # Likewise the package's containerd: tests/services/containerd runs one of our own.
  service containerd stop >/dev/null 2>&1 || true
  # And Redis: tests/services/redis runs its own on loopback.
  service redis-server stop >/dev/null 2>&1 || true
fi

py_missing=$(python3 - <<'PY'
import importlib.util
# matplotlib draws docs/img/actors-dashboard.png from Prometheus (scripts/plot-actors-dashboard.py);
# pytest-xdist runs the end-to-end tests that may share the cluster in parallel (tests/e2e/run).
wanted = {"pytest": "pytest", "moto": "moto[server]", "flask": "moto[server]", "yaml": "pyyaml", "boto3": "boto3", "mcp": "mcp", "pika": "pika",
          "matplotlib": "matplotlib==3.10.9", "xdist": "pytest-xdist==3.8.0"}
print(" ".join(sorted({pkg for mod, pkg in wanted.items() if importlib.util.find_spec(mod) is None})))
PY
)
if [ -n "$py_missing" ]; then
  echo "deps: pip install $py_missing"
  python3 -m pip install -q $py_missing
fi

# ElasticMQ's jars, cached by version under $HOME/.cache/asya-rs/elasticmq.
tests/services/elasticmq install

for comp in rustfmt clippy; do
  cargo "${comp/rustfmt/fmt}" --version >/dev/null 2>&1 || rustup component add "$comp"
done

# actionlint (a Go module) checks the release workflow in `make lint`.
ACTIONLINT_VERSION=v1.7.12
tools="$HOME/.cache/asya-rs/bin"
if [ ! -x "$tools/actionlint-$ACTIONLINT_VERSION" ]; then
  command -v go >/dev/null || { echo "deps: go is needed to build actionlint" >&2; exit 1; }
  echo "deps: building actionlint $ACTIONLINT_VERSION (Go module)"
  mkdir -p "$tools"
  tmp="$(mktemp -d)"
  (cd / && GOBIN="$tmp" GOFLAGS=-buildvcs=false go install -ldflags "-s -w" "github.com/rhysd/actionlint/cmd/actionlint@$ACTIONLINT_VERSION")
  mv "$tmp/actionlint" "$tools/actionlint-$ACTIONLINT_VERSION"
  rmdir "$tmp"
fi
ln -sfn "actionlint-$ACTIONLINT_VERSION" "$tools/actionlint"
