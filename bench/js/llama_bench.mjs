// llama.cpp's prefill and decode speed on a GGUF file, through node-llama-cpp's
// prebuilt CPU binaries: the peer of bench/infer.c, which starts it as
//   node bench/js/llama_bench.mjs MODEL.gguf THREADS PROMPT_TOKENS DECODE_TOKENS RUNS
// and reads the one JSON line it prints:
//   {"prefill_tok_s": median, "decode_tok_s": median, "runs": N, "build": "..."}
// The prompt is PROMPT_TOKENS pseudo-random ids (the same rule as
// bench/infer.c), evaluated in one batch; then DECODE_TOKENS tokens are
// generated greedily one at a time. Each run starts on a cleared sequence,
// so nothing comes from the cache.
import {getLlama} from "node-llama-cpp";

const [model_path, threads_s, prompt_s, decode_s, runs_s] = process.argv.slice(2);
const threads = Number(threads_s), n_prompt = Number(prompt_s), n_decode = Number(decode_s);
const runs = Number(runs_s || 3);
if (!model_path || !(threads > 0) || !(n_prompt > 0) || !(n_decode > 0)) {
    console.error("usage: llama_bench.mjs MODEL.gguf THREADS PROMPT_TOKENS DECODE_TOKENS [RUNS]");
    process.exit(2);
}

const llama = await getLlama({gpu: false, build: "never", logLevel: "error"});
const model = await llama.loadModel({modelPath: model_path, gpuLayers: 0});
const ctx = await model.createContext({
    contextSize: n_prompt + n_decode + 16, batchSize: Math.max(n_prompt, 32), threads: {ideal: threads, min: threads},
    sequences: 1,
});
const seq = ctx.getSequence();
const vocab = model.tokens.vocabularySize ?? 512;
const median = (v) => [...v].sort((a, b) => a - b)[Math.floor(v.length / 2)];

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
console.log(JSON.stringify({
    prefill_tok_s: median(prefill), decode_tok_s: median(decode), runs,
    build: `llama.cpp ${llama.llamaCppRelease?.release ?? "?"} (${llama.buildType ?? "prebuilt"}, cpu)`,
}));
await ctx.dispose();
await model.dispose();
await llama.dispose();
