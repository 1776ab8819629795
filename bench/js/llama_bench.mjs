// llama.cpp's prefill and decode speed on a GGUF file, through node-llama-cpp's
// prebuilt CPU binaries: the peer of bench/infer.c, which starts it as
//   node bench/js/llama_bench.mjs MODEL.gguf THREADS PROMPT_TOKENS DECODE_TOKENS RUNS [CPU_VARIANT]
// and reads the one JSON line it prints:
//   {"prefill_tok_s": median, "decode_tok_s": median, "runs": N, "build": "...",
//    "cpu_variant": "zen4", "cpu_features": "SSE3 = 1 | ..."}
// The prompt is PROMPT_TOKENS pseudo-random ids (the same rule as
// bench/infer.c), evaluated in one batch; then DECODE_TOKENS tokens are
// generated greedily one at a time. Each run starts on a cleared sequence,
// so nothing comes from the cache.
//
// The CPU variant: the prebuilt binaries hold one ggml CPU library per x86
// instruction-set level (libggml-cpu-haswell.so: AVX2; -zen4.so: AVX-512 ...)
// and ggml loads the one whose score is best on this CPU, from the folder of
// the addon (ggml_backend_load_best; no environment variable selects one).
// With CPU_VARIANT given, this script runs llama.cpp at that level instead: it
// copies the binaries' folder into a temporary one holding that CPU library
// alone and points node-llama-cpp's import of its binaries package there
// (a module resolve hook), so ggml finds nothing else to pick. Which library
// ggml loaded is read from llama.cpp's own log ("loaded CPU backend from
// PATH"), never assumed; the script fails when it is not the one asked for.
import fs from "node:fs";
import os from "node:os";
import path from "node:path";
import {register} from "node:module";
import {pathToFileURL} from "node:url";

const [model_path, threads_s, prompt_s, decode_s, runs_s, variant_arg] = process.argv.slice(2);
const threads = Number(threads_s), n_prompt = Number(prompt_s), n_decode = Number(decode_s);
const runs = Number(runs_s || 3), variant = variant_arg || "";
if (!model_path || !(threads > 0) || !(n_prompt > 0) || !(n_decode > 0) || !/^[a-z0-9_]*$/.test(variant)) {
    console.error("usage: llama_bench.mjs MODEL.gguf THREADS PROMPT_TOKENS DECODE_TOKENS [RUNS] [CPU_VARIANT]");
    process.exit(2);
}

// The binaries' folder with only libggml-cpu-<variant>.so among the CPU
// libraries, and a stand-in for the binaries package that names it.
// Returns the temporary folder (removed at exit).
async function only_cpu_variant(name) {
    const pkg = `@node-llama-cpp/${process.platform}-${process.arch}`;
    const real = await import(pkg);
    const {binsDir, packageVersion} = real.getBinsDir();
    const folder = `${process.platform}-${process.arch}`;
    const src = path.join(binsDir, folder);
    const want = `libggml-cpu-${name}.so`;
    if (!fs.existsSync(path.join(src, want)))
        throw new Error(`llama_bench: ${pkg} has no ${want} (CPU variants: ${fs.readdirSync(src)
            .filter((f) => f.startsWith("libggml-cpu-")).join(", ")})`);
    const tmp = fs.mkdtempSync(path.join(os.tmpdir(), "llama-bench-"));
    process.on("exit", () => fs.rmSync(tmp, {recursive: true, force: true}));
    const dst = path.join(tmp, "bins", folder);
    fs.mkdirSync(dst, {recursive: true});
    for (const f of fs.readdirSync(src))
        if (!f.startsWith("libggml-cpu-") || f === want) fs.copyFileSync(path.join(src, f), path.join(dst, f));
    const index = path.join(tmp, "index.mjs");
    fs.writeFileSync(index, `export function getBinsDir() { return ${JSON.stringify({
        binsDir: path.join(tmp, "bins"), packageVersion})}; }\n`);
    const hook = `export async function resolve(spec, ctx, next) {
        if (spec === ${JSON.stringify(pkg)}) return {url: ${JSON.stringify(pathToFileURL(index).href)}, shortCircuit: true};
        return next(spec, ctx);
    }`;
    register("data:text/javascript," + encodeURIComponent(hook));
    return tmp;
}

if (variant) await only_cpu_variant(variant);
const {getLlama} = await import("node-llama-cpp"); // after the hook: it imports the binaries package

let loaded_cpu = "";
const logger = (level, message) => {
    const m = /loaded CPU backend from (\S+)/.exec(message);
    if (m) loaded_cpu = m[1];
    else if (level === "error" || level === "fatal") console.error(message);
};
const llama = await getLlama({gpu: false, build: "never", logLevel: "log", logger});
const model = await llama.loadModel({modelPath: model_path, gpuLayers: 0});
const ctx = await model.createContext({
    contextSize: n_prompt + n_decode + 16, batchSize: Math.max(n_prompt, 32), threads: {ideal: threads, min: threads},
    sequences: 1,
});
const seq = ctx.getSequence();
const vocab = model.tokens.vocabularySize ?? 512;
const median = (v) => [...v].sort((a, b) => a - b)[Math.floor(v.length / 2)];

// "libggml-cpu-haswell.so" -> "haswell"
const cpu_variant = /libggml-cpu-?([^/]*)\.so$/.exec(loaded_cpu)?.[1] ?? "";
if (!loaded_cpu || (variant && cpu_variant !== variant)) {
    console.error(`llama_bench: asked for the CPU variant "${variant || "best"}", llama.cpp's log says it loaded ` +
                  `"${loaded_cpu || "(no CPU backend line)"}"`);
    process.exit(1);
}

const prefill = [], decode = [];
for (let r = 0; r < runs + 1; r++) { // the first run warms up
    // bench/infer.c's prompt rule: id_i = 3 + (i·7919 + r·104729) mod (vocab − 3)
    const prompt = Array.from({length: n_prompt}, (_, i) => 3 + ((i * 7919 + r * 104729) % (vocab - 3)));
    await seq.clearHistory();
    const t0 = performance.now();
    let t1 = 0, got = 0;
    for await (const tok of seq.evaluate(prompt, {temperature: 0})) {
        void tok;
        got++;
        if (got === 1) t1 = performance.now();
        if (got > n_decode) break;
    }
    const t2 = performance.now();
    if (r === 0) continue;
    prefill.push(n_prompt / ((t1 - t0) / 1e3));
    decode.push((got - 1) / ((t2 - t1) / 1e3));
}
const cpu_features = /CPU : ([^\n]*)/.exec(llama.systemInfo)?.[1]?.trim() ?? "";
console.log(JSON.stringify({
    prefill_tok_s: median(prefill), decode_tok_s: median(decode), runs,
    build: `llama.cpp ${llama.llamaCppRelease?.release ?? "?"} (${llama.buildType ?? "prebuilt"}, cpu)`,
    cpu_variant: cpu_variant || "generic", cpu_features,
}));
await ctx.dispose();
await model.dispose();
await llama.dispose();
