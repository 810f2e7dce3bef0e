#!/usr/bin/env python3
"""Cargo runner for wasm32-wasip1 test binaries: runs the module under the PyPI `wasmtime`
package with the test's arguments, its environment, and the working directory preopened
(as `cargo test` expects), and exits with the module's exit code."""
import os
import sys

import wasmtime


def main() -> int:
    if len(sys.argv) < 2:
        print("usage: wasi-run.py MODULE.wasm [ARGS...]", file=sys.stderr)
        return 2
    module_path = sys.argv[1]
    engine = wasmtime.Engine()
    store = wasmtime.Store(engine)
    wasi = wasmtime.WasiConfig()
    wasi.argv = [os.path.basename(module_path)] + sys.argv[2:]
    wasi.env = [(k, v) for k, v in os.environ.items() if k.startswith(("RUST_", "PROPTEST_"))]
    wasi.inherit_stdout()
    wasi.inherit_stderr()
    wasi.preopen_dir(os.getcwd(), ".")
    store.set_wasi(wasi)
    linker = wasmtime.Linker(engine)
    linker.define_wasi()
    module = wasmtime.Module.from_file(engine, module_path)
    instance = linker.instantiate(store, module)
    start = instance.exports(store)["_start"]
    try:
        start(store)
    except wasmtime.ExitTrap as e:
        return e.code
    return 0


if __name__ == "__main__":
    sys.exit(main())
