#!/usr/bin/env bash
# bench-filter.sh: Envoy with and without the prewarm filter, side by side, driven by wrk.
# Installs wrk from Debian when missing; the measurement itself is tools/bench-filter.py.
set -euo pipefail
cd "$(dirname "$0")/.."
if ! command -v wrk >/dev/null 2>&1; then
  echo "bench-filter: installing wrk (Debian package)"
  if [ "$(id -u)" = 0 ]; then apt-get install -y wrk >/dev/null; else sudo apt-get install -y wrk >/dev/null; fi
fi
exec .venv/bin/python tools/bench-filter.py "$@"
