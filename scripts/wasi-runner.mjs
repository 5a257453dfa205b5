// Cargo runner for wasm32-wasip1 test binaries: runs them under Node's built-in WASI, so the
// pure core's tests also run compiled for the filter's target, offline.
import { readFile } from "node:fs/promises";
import { WASI } from "node:wasi";
import { argv, env, exit } from "node:process";

const [wasmPath, ...args] = argv.slice(2);
const wasi = new WASI({ version: "preview1", args: [wasmPath, ...args], env, returnOnExit: true });
const module = await WebAssembly.compile(await readFile(wasmPath));
const instance = await WebAssembly.instantiate(module, wasi.getImportObject());
exit(wasi.start(instance));
