// llama.cpp's own multimodal path (mtmd, through @fugood/llama.node's prebuilt
// CPU binary) on the GGUF pair anytune export writes: loads MODEL.gguf and
// its mmproj, and for each image answers the Qwen2-VL chat prompt of one
// user turn (<__media__> where mtmd puts <|vision_start|> image <|vision_end|>)
// greedily. Prints one JSON line per image: {"image", "text", "tokens": [the
// generated tokens' strings], "n": tokens predicted}. test_vlm_llamacpp.c
// compares them with anytune infer's.
//
//   node vlm_llamacpp_check.mjs MODEL.gguf MMPROJ.gguf N_PREDICT QUESTION IMAGE...
import { loadModel } from '@fugood/llama.node'

const [model, mmproj, nPredict, question, ...images] = process.argv.slice(2)
const ctx = await loadModel({ model, n_ctx: 1024, n_threads: 2, n_gpu_layers: 0, lib_variant: 'default' })
if (!(await ctx.initMultimodal({ path: mmproj, use_gpu: false }))) {
  console.error('llama.cpp did not accept the mmproj file ' + mmproj)
  process.exit(1)
}
const prompt = '<|im_start|>system\nYou are a helpful assistant.<|im_end|>\n<|im_start|>user\n<__media__>' +
  question + '<|im_end|>\n<|im_start|>assistant\n'
for (const image of images) {
  // n_probs 1: the result lists each generated token (the streaming callback may lag the result);
  // the list also holds the earlier completions' tokens of this context: this one's are its last n
  const r = await ctx.completion({ prompt, media_paths: [image], n_predict: Number(nPredict), temperature: 0, top_k: 1,
    n_probs: 1 })
  const tokens = (r.completion_probabilities || []).slice(-r.tokens_predicted).map((p) => p.content)
  console.log(JSON.stringify({ image, text: r.text, tokens, n: r.tokens_predicted }))
}
// no release: releasing the context crashed @fugood/llama.node now and then
// (SIGSEGV in ~llama_context, 2 of 30 runs of the Qwen2.5-VL pair, also with
// the vision context released first), after every answer was printed; the
// process ends here and the system takes the memory back
process.exit(0)
