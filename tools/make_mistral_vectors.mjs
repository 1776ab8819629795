// Makes tests/data/tokenizers/mistral-v0.3/vectors.json: Mistral-7B-Instruct-v0.3
// token ids for varied text, computed by an independent implementation, the
// @lenml/tokenizers npm package (a port of transformers.js' tokenizers).
//
// Run by hand (the tests only read the committed output):
//   mkdir -p /tmp/lenml && (cd /tmp/lenml && npm install @lenml/tokenizers)
//   NODE_PATH=/tmp/lenml/node_modules node tools/make_mistral_vectors.mjs [SHARED_DATA_DIR]
// SHARED_DATA_DIR defaults to ../shared/data (relative to the repo root); it
// must hold tokenizers/mistral-7b-instruct-v0.3/ and datasets/llama-factory/.
import { createRequire } from "node:module";
import fs from "node:fs";
import path from "node:path";

const require = createRequire(import.meta.url);
const pkgDir = path.join((process.env.NODE_PATH || "node_modules").split(":")[0], "@lenml/tokenizers");
const { TokenizerLoader } = require(pkgDir);
const pkgVersion = JSON.parse(fs.readFileSync(path.join(pkgDir, "package.json"), "utf8")).version;

const shared = process.argv[2] || "../shared/data";
const tokDir = path.join(shared, "tokenizers/mistral-7b-instruct-v0.3");
const config = JSON.parse(fs.readFileSync(path.join(tokDir, "tokenizer_config.json"), "utf8"));
// transformers.js runs Mistral as LlamaTokenizer with legacy=false: it always
// prepends "▁" to the text and then applies Metaspace(prepend_scheme=first).
// Hugging Face `tokenizers` (Rust) prepends only when the text does not
// already start with a space. The two agree on every text that does not
// start with a space, so texts that do are left out below.
const tok = TokenizerLoader.fromPreTrained({
  tokenizerJSON: JSON.parse(fs.readFileSync(path.join(tokDir, "tokenizer.json"), "utf8")),
  tokenizerConfig: config,
});

const ds = (f) => path.join(shared, "datasets/llama-factory", f);
const texts = [];
// Dataset lines: every 97th record, so the picks spread over the files.
const en = JSON.parse(fs.readFileSync(ds("alpaca_en_demo.json"), "utf8"));
const zh = JSON.parse(fs.readFileSync(ds("alpaca_zh_demo.json"), "utf8"));
for (let i = 0; i < en.length && texts.length < 10; i += 97) texts.push(en[i].instruction, en[i].output);
for (let i = 0; i < zh.length && texts.length < 20; i += 97) texts.push(zh[i].instruction, zh[i].output);
const c4 = fs.readFileSync(ds("c4_demo.jsonl"), "utf8").split("\n").filter(Boolean);
for (let i = 0; i < 3; i++) texts.push(JSON.parse(c4[i * 50]).text.slice(0, 600));
const wiki = fs.readFileSync(ds("wiki_demo.txt"), "utf8");
texts.push(wiki.slice(0, 500), wiki.slice(20000, 20400));
// Code, emoji, whitespace and odd characters.
texts.push(
  "def fib(n):\n    if n < 2:\n        return n\n    return fib(n - 1) + fib(n - 2)\n",
  "#include <stdio.h>\nint main(void) {\n\tprintf(\"%d\\n\", 42);\n\treturn 0;\n}\n",
  "for (let i = 0; i < 10; i++) { console.log(`i=${i}`); }",
  "Emoji: 😀🎉👍🏽 🇫🇷 👨‍👩‍👧‍👦 and ❤️‍🔥!",
  "trailing spaces   ",
  "Tabs\tand\nnewlines\r\nand   multiple    spaces",
  "Numbers: 3.14159, 1,000,000 and 2024-06-01T12:00:00Z",
  "Mixed 中文 and English, Ελληνικά, русский, العربية, हिन्दी, 日本語のテキスト。",
  "",
  "\n\n",
  "\n  indented after a newline",
  "ÅÄÖ åäö ñ ç ß Œ œ — “quotes” ‘single’ …"
);
// Texts with control tokens written in them: transformers.js always splits
// added tokens, which is our AT_TOK_PARSE_SPECIAL.
const special = [
  "<s>[INST] What is 2+2? [/INST] 4</s>",
  "[INST]Hello[/INST]",
  "a</s>b",
  "[AVAILABLE_TOOLS] [{\"name\": \"f\"}][/AVAILABLE_TOOLS][INST] hi [/INST]",
  "[INST] this text has brackets [/INST] and a space first",
  "[INST] x</s>  two spaces after a control token",
];
const startsWithSpace = (t) => t.length > 0 && t[0] === " ";
for (const list of [texts, special])
  for (let i = list.length - 1; i >= 0; i--) if (startsWithSpace(list[i])) list.splice(i, 1);
const enc = (t) => Array.from(tok.encode(t, { add_special_tokens: false }));
const out = {
  generator: "tools/make_mistral_vectors.mjs with @lenml/tokenizers " + pkgVersion,
  tokenizer: "mistralai/Mistral-7B-Instruct-v0.3 tokenizer.json",
  cases: texts.map((text) => ({ text, ids: enc(text) })),
  special_cases: special.map((text) => ({ text, ids: enc(text) })),
  with_bos: { text: texts[0], ids: Array.from(tok.encode(texts[0], { add_special_tokens: true })) },
};
const dst = "tests/data/tokenizers/mistral-v0.3/vectors.json";
fs.mkdirSync(path.dirname(dst), { recursive: true });
// One case per line keeps the file readable and its diffs small.
const lines = (list) => list.map((c) => "  " + JSON.stringify(c)).join(",\n");
fs.writeFileSync(dst, "{\n" +
  ` "generator": ${JSON.stringify(out.generator)},\n` +
  ` "tokenizer": ${JSON.stringify(out.tokenizer)},\n` +
  ` "cases": [\n${lines(out.cases)}\n ],\n` +
  ` "special_cases": [\n${lines(out.special_cases)}\n ],\n` +
  ` "with_bos": ${JSON.stringify(out.with_bos)}\n}\n`);
console.log(`wrote ${dst}: ${out.cases.length} cases, ${out.special_cases.length} special cases`);
