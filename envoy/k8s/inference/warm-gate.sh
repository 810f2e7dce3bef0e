#!/bin/sh
# prewarm warm gate: the readiness check of the `prewarm-warm-gate` container beside each
# inference server. Exits 0 (ready) when the prewarm gateway says this pod is in its routing
# table (GET /v1/pods/<ip>:<port>/ready → 200), or once PREWARM_WARM_DEADLINE_SECONDS have
# passed since the container started (fail open: a gateway that is down or slow delays a new
# pod by at most the deadline, never forever). Anything else (503 warming, 404 not yet
# discovered, gateway unreachable) exits 1. Needs only sh, date, cat and wget (busybox).
#
# Environment: POD_IP (downward API), PREWARM_GATEWAY_URL (e.g.
# http://prewarm-gateway.prewarm.svc.cluster.local:9101), PREWARM_POD_PORT (default 8000),
# PREWARM_WARM_DEADLINE_SECONDS (default 600), PREWARM_STARTED_FILE (default
# /run/prewarm/started, written by the container's command at start).
started=$(cat "${PREWARM_STARTED_FILE:-/run/prewarm/started}" 2>/dev/null) || started=0
case "$started" in '' | *[!0-9]*) started=0 ;; esac
now=$(date +%s)
if [ $((now - started)) -ge "${PREWARM_WARM_DEADLINE_SECONDS:-600}" ]; then
  exit 0
fi
if wget -q -O /dev/null -T 2 \
  "${PREWARM_GATEWAY_URL:?}/v1/pods/${POD_IP:?}:${PREWARM_POD_PORT:-8000}/ready"; then
  exit 0
fi
exit 1
