// Loads the tokenizer of Hugging Face folders that anytune export wrote with
// transformers.js (@huggingface/transformers: AutoTokenizer.from_pretrained
// on a local folder, no network) and checks what test_tokenizer_hf_js.c
// expects: the ids of each text (llama.cpp's test vectors, made by Hugging
// Face's own tokenizers), BOS/EOS added by the post-processor, decoding, and
// the chat template.
//
//   node tests/js/check_hf_tokenizer.mjs EXPECT.json
//
// EXPECT.json: [{ "dir": FOLDER,
//                 "cases": [{"text": T, "ids": [..]}, ...]        encode without special tokens
//                 "with_special": {"text": T, "ids": [..]},       optional: encode with them
//                 "decode": true,                                 decode(ids) must give the text back
//                 "chat": {"messages": [..], "text": T},          optional: apply_chat_template
//                 "model": true }, ...]                            optional: a model folder (below)
// "model": the folder is a whole model (a full fine-tuning checkpoint):
// transformers.js reads its config.json (AutoConfig), and model.safetensors
// must hold exactly the parameters transformers' model class builds from that
// config (names and shapes as modeling_llama / modeling_qwen2 / modeling_qwen3
// declare them; from_pretrained reports any missing or unexpected one).
// Prints one line per folder; exits 1 on any difference.
import { readFileSync } from "node:fs";
import path from "node:path";
import { AutoConfig, AutoTokenizer, env } from "@huggingface/transformers";

// The parameters of LlamaForCausalLM (Mistral's, Qwen2's, Qwen3's) for config c.
function modelParameters(c) {
  const h = c.hidden_size, nh = c.num_attention_heads, kv = c.num_key_value_heads ?? nh;
  const hd = c.head_dim ?? h / nh, ffn = c.intermediate_size, V = c.vocab_size;
  const qwen2 = c.model_type === "qwen2", qwen3 = c.model_type === "qwen3";
  const bias = !qwen2 && c.attention_bias === true;
  const p = { "model.embed_tokens.weight": [V, h], "model.norm.weight": [h] };
  if (!c.tie_word_embeddings) p["lm_head.weight"] = [V, h];
  for (let i = 0; i < c.num_hidden_layers; i++) {
    const l = `model.layers.${i}.`;
    const proj = { q: nh * hd, k: kv * hd, v: kv * hd };
    for (const [n, out] of Object.entries(proj)) {
      p[`${l}self_attn.${n}_proj.weight`] = [out, h];
      if (qwen2 || bias) p[`${l}self_attn.${n}_proj.bias`] = [out];
    }
    p[`${l}self_attn.o_proj.weight`] = [h, nh * hd];
    if (bias) p[`${l}self_attn.o_proj.bias`] = [h];
    if (qwen3) {
      p[`${l}self_attn.q_norm.weight`] = [hd];
      p[`${l}self_attn.k_norm.weight`] = [hd];
    }
    p[`${l}mlp.gate_proj.weight`] = [ffn, h];
    p[`${l}mlp.up_proj.weight`] = [ffn, h];
    p[`${l}mlp.down_proj.weight`] = [h, ffn];
    p[`${l}input_layernorm.weight`] = [h];
    p[`${l}post_attention_layernorm.weight`] = [h];
  }
  return p;
}

// Differences between model.safetensors (its header) and what the config builds.
async function checkModel(dir) {
  const cfg = await AutoConfig.from_pretrained(path.basename(dir), { local_files_only: true });
  const want = modelParameters(cfg);
  const buf = readFileSync(path.join(dir, "model.safetensors"));
  const n = Number(buf.readBigUInt64LE(0));
  const header = JSON.parse(buf.subarray(8, 8 + n).toString("utf8"));
  const errs = [];
  for (const [name, t] of Object.entries(header)) {
    if (name === "__metadata__") continue;
    if (!(name in want)) errs.push(`unexpected ${name}`);
    else if (JSON.stringify(t.shape) !== JSON.stringify(want[name])) errs.push(`${name}: shape [${t.shape}], the config builds [${want[name]}]`);
    else if (!["F32", "BF16", "F16"].includes(t.dtype)) errs.push(`${name}: dtype ${t.dtype}`);
    else if (t.data_offsets[1] - t.data_offsets[0] !== want[name].reduce((a, b) => a * b, 1) * (t.dtype === "F32" ? 4 : 2))
      errs.push(`${name}: ${t.data_offsets[1] - t.data_offsets[0]} bytes for its shape`);
  }
  for (const name of Object.keys(want)) if (!(name in header)) errs.push(`missing ${name}`);
  return { cfg, errs, count: Object.keys(want).length };
}

env.allowRemoteModels = false;
env.allowLocalModels = true;

const expect = JSON.parse(readFileSync(process.argv[2], "utf8"));
let bad = 0;
const same = (a, b) => a.length === b.length && a.every((x, i) => x === b[i]);
const show = (s) => JSON.stringify(s.length > 60 ? s.slice(0, 60) + "..." : s);

for (const e of expect) {
  env.localModelPath = path.dirname(e.dir) + "/";
  let tok;
  try {
    tok = await AutoTokenizer.from_pretrained(path.basename(e.dir), { local_files_only: true });
  } catch (err) {
    bad++;
    console.error(`${e.dir}: transformers.js cannot load it: ${err.message}`);
    continue;
  }
  let ok = 0, dec = 0;
  for (const c of e.cases) {
    const got = tok.encode(c.text, { add_special_tokens: false });
    if (same(got, c.ids)) ok++;
    else {
      bad++;
      console.error(`${e.dir}: ${show(c.text)}: [${got}], expected [${c.ids}]`);
    }
    if (e.decode && c.ids.length) {
      const text = tok.decode(c.ids, { skip_special_tokens: false, clean_up_tokenization_spaces: false });
      if (text === c.text) dec++;
      else {
        bad++;
        console.error(`${e.dir}: decode of [${c.ids}] gives ${show(text)}, expected ${show(c.text)}`);
      }
    }
  }
  let extra = "";
  if (e.model) {
    try {
      const { cfg, errs, count } = await checkModel(e.dir);
      for (const m of errs) console.error(`${e.dir}: model.safetensors: ${m}`);
      bad += errs.length;
      if (!errs.length) extra += `, a ${cfg.model_type} model: its ${count} parameters are the ones the config builds`;
    } catch (err) {
      bad++;
      console.error(`${e.dir}: transformers.js cannot read it as a model: ${err.message}`);
    }
  }
  if (e.with_special) {
    const got = tok.encode(e.with_special.text, { add_special_tokens: true });
    if (!same(got, e.with_special.ids)) {
      bad++;
      console.error(`${e.dir}: with special tokens: [${got}], expected [${e.with_special.ids}]`);
    } else extra += ", special tokens added as expected";
  }
  if (e.chat) {
    const got = tok.apply_chat_template(e.chat.messages, { tokenize: false, add_generation_prompt: true });
    if (got !== e.chat.text) {
      bad++;
      console.error(`${e.dir}: chat template gives ${JSON.stringify(got)}, expected ${JSON.stringify(e.chat.text)}`);
    } else extra += ", chat template renders";
  }
  console.log(`transformers.js ${path.basename(e.dir)}: ${ok}/${e.cases.length} encode as expected` +
              (e.decode ? `, ${dec}/${e.cases.filter((c) => c.ids.length).length} decode back` : "") + extra);
}
process.exit(bad ? 1 : 0);
