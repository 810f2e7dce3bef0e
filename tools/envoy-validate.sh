#!/usr/bin/env bash
# envoy-validate.sh ENVOY CONFIG: `envoy --mode validate` on a config, with the filter's .wasm
# path substituted for the placeholder `@PREWARM_FILTER_WASM@` that shipped configs carry.
set -euo pipefail
envoy=$1 config=$2
tmp=$(mktemp --suffix=.yaml)
trap 'rm -f "$tmp"' EXIT
sed "s#@PREWARM_FILTER_WASM@#${PREWARM_FILTER_WASM:?}#g" "$config" >"$tmp"
"$envoy" --mode validate -c "$tmp" --log-level warn
