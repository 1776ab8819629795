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
//                 "chat": {"messages": [..], "text": T} }, ...]   optional: apply_chat_template
// Prints one line per folder; exits 1 on any difference.
import { readFileSync } from "node:fs";
import path from "node:path";
import { AutoTokenizer, env } from "@huggingface/transformers";

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
