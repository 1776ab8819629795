// Writes Parquet test files with an independent writer (parquet-wasm: the
// Rust parquet crate; tables built with apache-arrow) for test_parquet.c.
// Usage: node write_parquet.mjs OUT_DIR
// For each case NAME it writes NAME.parquet and NAME.json: the rows given to
// the writer, as a JSON array, which the C reader must give back equal.
import { readFileSync, writeFileSync } from 'node:fs';
import { createRequire } from 'node:module';
import {
  Table, vectorFromArray, tableToIPC, Field, List, Struct, Utf8, Int32, Int64, Float64, Bool, Binary,
} from 'apache-arrow';
import * as pq from 'parquet-wasm/esm';

const require = createRequire(import.meta.url);
pq.initSync({ module: readFileSync(require.resolve('parquet-wasm/esm/parquet_wasm_bg.wasm')) });

const out = process.argv[2];
const utf8 = () => new Utf8();
const list = (t) => new List(new Field('item', t, true));
const struct = (fields) => new Struct(fields.map(([n, t]) => new Field(n, t, true)));

// columns: [name, arrow type, (row) => value for the writer, (row) => value in JSON]
function write(name, rows, columns, { codec, v2 = false, dictionary = true, rowGroup = 1024, pageRows = 0 }) {
  const vectors = {};
  for (const [col, type, toArrow] of columns) vectors[col] = vectorFromArray(rows.map(toArrow), type);
  const table = new Table(vectors);
  let props = new pq.WriterPropertiesBuilder()
    .setCompression(codec)
    .setDictionaryEnabled(dictionary)
    .setMaxRowGroupSize(rowGroup)
    .setWriterVersion(v2 ? pq.WriterVersion.V2 : pq.WriterVersion.V1);
  if (pageRows) props = props.setDataPageSizeLimit(pageRows).setWriteBatchSize(pageRows);
  const bytes = pq.writeParquet(pq.Table.fromIPCStream(tableToIPC(table, 'stream')), props.build());
  writeFileSync(`${out}/${name}.parquet`, bytes);
  const expect = rows.map((r) => Object.fromEntries(columns.map(([col, , , toJson]) => [col, toJson(r)])));
  writeFileSync(`${out}/${name}.json`, JSON.stringify(expect));
}

// A chat dataset as the Hub's conversions store it: messages list<struct<role, content>>.
const roles = ['system', 'user', 'assistant'];
const chat = [];
for (let i = 0; i < 23; i++) {
  const n = i % 4; // 0..3 messages; the empty list is a case of its own
  const messages = [];
  for (let k = 0; k < n; k++)
    messages.push({ role: roles[(k + 1) % 3], content: k === 1 && i % 5 === 0 ? null : `turn ${k} of ${i}: héllo ✓ ${'x'.repeat(i)}` });
  chat.push({ messages: i === 7 ? null : messages, system: i % 3 === 0 ? null : `sys ${i % 2}`, id: i });
}
const msgType = list(struct([['role', utf8()], ['content', utf8()]]));
const chatCols = [
  ['messages', msgType, (r) => r.messages, (r) => r.messages],
  ['system', utf8(), (r) => r.system, (r) => r.system],
  ['id', new Int64(), (r) => BigInt(r.id), (r) => r.id],
];
write('chat_snappy_v1', chat, chatCols, { codec: pq.Compression.SNAPPY, rowGroup: 5 });
write('chat_zstd_v2', chat, chatCols, { codec: pq.Compression.ZSTD, v2: true, rowGroup: 10, pageRows: 4 });
write('chat_gzip_plain', chat, chatCols, { codec: pq.Compression.GZIP, dictionary: false });
write('chat_none_v2', chat, chatCols, { codec: pq.Compression.UNCOMPRESSED, v2: true });

// Alpaca-style scalars of every physical type the reader maps, with nulls.
const alpaca = [];
for (let i = 0; i < 40; i++)
  alpaca.push({
    instruction: `Instruction ${i % 7}`, input: i % 4 ? `input ${i}` : null, output: `Output ${i} — ${'ü'.repeat(i % 5)}`,
    n: i * 1000 - 7, big: 4294967296 * (i % 3) + i, score: i / 8 - 1.5, flag: i % 3 === 0 ? null : i % 2 === 0,
    tokens: i % 6 === 5 ? null : Array.from({ length: i % 5 }, (_, k) => k * i - 3),
  });
const alpacaCols = [
  ['instruction', utf8(), (r) => r.instruction, (r) => r.instruction],
  ['input', utf8(), (r) => r.input, (r) => r.input],
  ['output', utf8(), (r) => r.output, (r) => r.output],
  ['n', new Int32(), (r) => r.n, (r) => r.n],
  ['big', new Int64(), (r) => BigInt(r.big), (r) => r.big],
  ['score', new Float64(), (r) => r.score, (r) => r.score],
  ['flag', new Bool(), (r) => r.flag, (r) => r.flag],
  ['tokens', list(new Int32()), (r) => r.tokens, (r) => r.tokens],
];
write('alpaca_snappy_v1', alpaca, alpacaCols, { codec: pq.Compression.SNAPPY, rowGroup: 16 });
write('alpaca_zstd_v2', alpaca, alpacaCols, { codec: pq.Compression.ZSTD, v2: true, rowGroup: 16 });
write('alpaca_gzip_plain', alpaca, alpacaCols, { codec: pq.Compression.GZIP, dictionary: false });

// Deeper nesting: a struct holding a list of lists and a struct.
const deep = [];
for (let i = 0; i < 12; i++)
  deep.push({
    meta: i % 4 === 3 ? null : {
      source: `src${i % 3}`,
      grid: i % 5 === 4 ? null : Array.from({ length: i % 3 }, (_, a) => (a === 1 && i % 2 ? null : Array.from({ length: (i + a) % 3 }, (_, b) => `${a}.${b}`))),
      inner: { k: i % 2 ? null : i, tags: i % 3 === 1 ? [] : [`t${i}`] },
    },
  });
const deepType = struct([
  ['source', utf8()],
  ['grid', list(list(utf8()))],
  ['inner', struct([['k', new Int32()], ['tags', list(utf8())]])],
]);
const deepCols = [['meta', deepType, (r) => r.meta, (r) => r.meta]];
write('deep_none_v1', deep, deepCols, { codec: pq.Compression.UNCOMPRESSED, rowGroup: 5 });
write('deep_zstd_v2', deep, deepCols, { codec: pq.Compression.ZSTD, v2: true });
write('deep_gzip_plain', deep, deepCols, { codec: pq.Compression.GZIP, dictionary: false });
// Bytes that are not UTF-8 in a string-like column: those rows are skipped
// as issues; the JSON holds the good rows and the (1-based) bad row numbers.
const raw = [];
for (let i = 0; i < 9; i++)
  raw.push(i % 4 === 2 ? Uint8Array.from([0x61, 0xff, 0xfe]) : new TextEncoder().encode(`text ${i}`));
write('binary_utf8', raw.map((b, i) => ({ b, i })), [
  ['text', new Binary(), (r) => r.b, (r) => new TextDecoder().decode(r.b)],
  ['i', new Int32(), (r) => r.i, (r) => r.i],
], { codec: pq.Compression.SNAPPY });
const rows = JSON.parse(readFileSync(`${out}/binary_utf8.json`, 'utf8'));
writeFileSync(`${out}/binary_utf8.json`, JSON.stringify({
  good: rows.filter((_, i) => i % 4 !== 2), bad: rows.map((_, i) => i + 1).filter((n) => (n - 1) % 4 === 2),
}));
console.log('ok');
