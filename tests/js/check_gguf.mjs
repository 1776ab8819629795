// Reads GGUF files with Hugging Face's own parser (@huggingface/gguf) and
// compares them with what tests/test_export_gguf_js.c expects.
//
//   node tests/js/check_gguf.mjs EXPECT.json
//
// EXPECT.json: [{ "file": PATH, "metadata": {key: value, ...},
//                 "array_lengths": {key: n, ...},
//                 "tensors": [{"name", "shape": [ne0, ne1, ...], "dtype": ggml type}, ...] }, ...]
// The tensor list must be exactly the file's (same names, shapes, types).
// Optional: "arrays": {key: [numbers]} (compared element by element, as the
// metadata numbers), "values": [{"tensor", "at": [flat index, ...],
// "want": [value, ...]}] (F32 tensors, exact in float32): values read from the file's
// tensor data (tensorDataOffset + the tensor's offset), ggml order.
// Prints one line per file; exits 1 on any difference.
import { readFileSync, openSync, readSync, closeSync } from "node:fs";
import { gguf } from "@huggingface/gguf";

const expect = JSON.parse(readFileSync(process.argv[2], "utf8"));
let bad = 0;
const fail = (file, msg) => {
  bad++;
  console.error(`${file}: ${msg}`);
};
const norm = (v) => (typeof v === "bigint" ? Number(v) : v);

for (const e of expect) {
  const { metadata, tensorInfos, tensorDataOffset } = await gguf(e.file, { allowLocalFile: true });
  const close = (got, want) => Math.abs(got - want) <= 1e-6 * Math.max(1, Math.abs(want));
  for (const [k, want] of Object.entries(e.arrays ?? {})) {
    const got = metadata[k];
    if (!Array.isArray(got) || got.length !== want.length || got.some((g, i) => !close(norm(g), want[i])))
      fail(e.file, `metadata ${k} = ${JSON.stringify(got)}, expected ${JSON.stringify(want)}`);
  }
  if (e.values?.length) {
    const fd = openSync(e.file, "r");
    for (const v of e.values) {
      const t = tensorInfos.find((x) => x.name === v.tensor);
      if (!t || t.dtype !== 0) {
        fail(e.file, `values: tensor ${v.tensor} ${t ? "is not F32" : "missing"}`);
        continue;
      }
      v.at.forEach((idx, i) => {
        const buf = Buffer.alloc(4);
        readSync(fd, buf, 0, 4, Number(tensorDataOffset) + Number(t.offset) + 4 * idx);
        const got = buf.readFloatLE(0);
        // want goes through JSON as a double of ~15 digits: rounded to float32 it is the value again
        if (got !== Math.fround(v.want[i])) fail(e.file, `tensor ${v.tensor}[${idx}] = ${got}, expected ${v.want[i]}`);
      });
    }
    closeSync(fd);
  }
  for (const [k, want] of Object.entries(e.metadata ?? {})) {
    const got = norm(metadata[k]);
    const ok = typeof want === "number" && typeof got === "number" ? Math.abs(got - want) <= 1e-6 * Math.max(1, Math.abs(want)) : got === want;
    if (!ok) fail(e.file, `metadata ${k} = ${JSON.stringify(got)}, expected ${JSON.stringify(want)}`);
  }
  for (const [k, n] of Object.entries(e.array_lengths ?? {})) {
    const got = metadata[k];
    if (!Array.isArray(got) || got.length !== n) fail(e.file, `metadata ${k}: ${Array.isArray(got) ? got.length : typeof got} entries, expected ${n}`);
  }
  const byName = new Map(tensorInfos.map((t) => [t.name, t]));
  if (tensorInfos.length !== e.tensors.length) fail(e.file, `${tensorInfos.length} tensors, expected ${e.tensors.length}`);
  for (const t of e.tensors) {
    const g = byName.get(t.name);
    if (!g) {
      fail(e.file, `tensor ${t.name} missing`);
      continue;
    }
    const shape = g.shape.map(Number);
    if (JSON.stringify(shape) !== JSON.stringify(t.shape)) fail(e.file, `tensor ${t.name} shape [${shape}], expected [${t.shape}]`);
    if (g.dtype !== t.dtype) fail(e.file, `tensor ${t.name} type ${g.dtype}, expected ${t.dtype}`);
  }
  console.log(`@huggingface/gguf read ${e.file}: ${tensorInfos.length} tensors, ${Object.keys(e.metadata ?? {}).length} metadata values, ${Object.keys(e.arrays ?? {}).length} arrays and ${(e.values ?? []).reduce((n, v) => n + v.at.length, 0)} tensor values checked`);
}
process.exit(bad ? 1 : 0);
