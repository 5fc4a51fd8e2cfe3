#!/usr/bin/env bash
# Installs what the build and the test suite need on a fresh machine. Idempotent: each step
# checks before it installs, so a second run costs seconds.
set -euo pipefail
cd "$(dirname "$0")/.."

need_apt=()
command -v rabbitmq-server >/dev/null 2>&1 || [ -x /usr/sbin/rabbitmq-server ] || need_apt+=(rabbitmq-server)
ls /usr/lib/postgresql/*/bin/postgres >/dev/null 2>&1 || need_apt+=(postgresql)
command -v curl >/dev/null 2>&1 || need_apt+=(curl)
command -v openssl >/dev/null 2>&1 || need_apt+=(openssl)
if [ ${#need_apt[@]} -gt 0 ]; then
  echo "deps: apt-get install ${need_apt[*]}"
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq
  # The package's postinst starts a broker we do not want; our scripts start their own.
  RUNLEVEL=1 apt-get install -y -qq --no-install-recommends "${need_apt[@]}" >/dev/null
  service rabbitmq-server stop >/dev/null 2>&1 || true
  # Same for PostgreSQL: tests/services/postgres runs its own cluster on its own port.
  service postgresql stop >/dev/null 2>&1 || true
fi

py_missing=$(python3 - <<'PY'
import importlib.util
wanted = {"pytest": "pytest", "moto": "moto[server]", "flask": "moto[server]", "yaml": "pyyaml", "boto3": "boto3", "mcp": "mcp"}
print(" ".join(sorted({pkg for mod, pkg in wanted.items() if importlib.util.find_spec(mod) is None})))
PY
)
if [ -n "$py_missing" ]; then
  echo "deps: pip install $py_missing"
  python3 -m pip install -q $py_missing
fi

for comp in rustfmt clippy; do
  cargo "${comp/rustfmt/fmt}" --version >/dev/null 2>&1 || rustup component add "$comp"
done
