// Cargo runner for the micro-benchmarks compiled to wasm32-wasip1 (bench/run.py sets it through
// CARGO_TARGET_WASM32_WASIP1_RUNNER): runs them under Node's WASI, that is under V8 like the
// filter in Envoy. The library's proxy-wasm glue is linked in, so its imports get stubs the
// benchmarks never call, and only `_start` runs (not the glue's `_initialize`).
import { readFile } from "node:fs/promises";
import { dirname } from "node:path";
import { WASI } from "node:wasi";
import { argv, env, exit } from "node:process";

const [wasmPath, ...args] = argv.slice(2);
// The results file is written from inside the sandbox: give it its directory.
const preopens = env.SLUICE_BENCH_JSON ? { [dirname(env.SLUICE_BENCH_JSON)]: dirname(env.SLUICE_BENCH_JSON) } : {};
const wasi = new WASI({ version: "preview1", args: [wasmPath, ...args], env, preopens, returnOnExit: true });
const module = await WebAssembly.compile(await readFile(wasmPath));
const imports = wasi.getImportObject();
for (const { module: from, name } of WebAssembly.Module.imports(module)) {
  if (from !== "wasi_snapshot_preview1") {
    imports[from] ??= {};
    imports[from][name] = () => 0;
  }
}
const instance = await WebAssembly.instantiate(module, imports);
const { memory, _start } = instance.exports;
exit(wasi.start({ exports: { memory, _start } }));
