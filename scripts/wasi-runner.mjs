// Cargo runner for wasm32-wasip1 binaries (.cargo/config.toml; bench/run.py for the
// micro-benchmarks): runs them under Node's built-in WASI, that is under V8 as the filter runs in
// Envoy, so the pure core's tests also run compiled for the filter's target, offline.
//
// Node 18.17 and later (Debian 12 ships 18.20.4): the first to give WASI without a flag. The
// imports are built from `wasiImport`, which every such Node has (`getImportObject` came with 20).
// A binary that links the proxy-wasm glue imports host functions too: they get stubs that throw,
// as nothing run here may call Envoy, and only `_start` runs (not the glue's `_initialize`).
// SLUICE_WASI_DIR names a directory the binary may write in (the benchmarks' results file).
import { readFile } from "node:fs/promises";
import { argv, env, exit, version } from "node:process";

const [wasmPath, ...args] = argv.slice(2);

/** Node's WASI, or exit 2 with what to do on a Node that has none this runner can use. */
async function wasiFor(options) {
  try {
    const { WASI } = await import("node:wasi");
    return new WASI(options);
  } catch (error) {
    console.error(
      `scripts/wasi-runner.mjs: Node ${version} cannot run wasm32-wasip1 binaries (${error.message}).\n` +
        "It runs on Node 18.17 or newer, WASI allowed: `scripts/ensure-deps node` checks the node on PATH and says how to get one."
    );
    exit(2);
  }
}

const dir = env.SLUICE_WASI_DIR;
const wasi = await wasiFor({
  version: "preview1",
  args: [wasmPath, ...args],
  env,
  preopens: dir ? { [dir]: dir } : {},
  returnOnExit: true,
});
const module = await WebAssembly.compile(await readFile(wasmPath));
const imports = { wasi_snapshot_preview1: wasi.wasiImport };
for (const { module: from, name } of WebAssembly.Module.imports(module)) {
  imports[from] ??= {};
  imports[from][name] ??= () => {
    throw new Error(`${from}.${name} is a host function, and there is no host here`);
  };
}
const instance = await WebAssembly.instantiate(module, imports);
const { memory, _start } = instance.exports;
exit(wasi.start({ exports: { memory, _start } }));
