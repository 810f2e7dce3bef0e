# The prewarm filter as an OCI image for Istio (WasmPlugin `url: oci://...`), in Istio's
# "compat" layout: a single file `plugin.wasm` at the root of a scratch image. Build after
# `make wasm`, from the repository root:
#
#   docker build -f envoy/istio/filter-image.Dockerfile \
#     -t registry.example.com/prewarm/prewarm-filter:0.1.0 .
#
# (docs/deploy.md, "Publish the filter", also shows the same with `oras push`.)
FROM scratch
COPY target/wasm32-wasip1/wasm-release/prewarm_filter.wasm ./plugin.wasm
