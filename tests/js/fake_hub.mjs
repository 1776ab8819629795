// A stand-in for the Hugging Face Hub and ModelScope on 127.0.0.1, for
// test_hub.c: the same routes as the real hubs (see src/hub/hub.h), with
// repositories made to fail in the ways real ones do.
// Usage: node fake_hub.mjs DEMO_MODEL_DIR DATASET_FILE ORIGIN_DIR
// Prints "port N" once listening; writes every repository file it serves to
// ORIGIN_DIR/<models|datasets>/<org>/<name>/<path> so the test can compare.
// GET /__log answers the requests seen so far (method, url, range, auth, host).
import { createServer } from 'node:http';
import { createHash } from 'node:crypto';
import { readFileSync, readdirSync, mkdirSync, writeFileSync } from 'node:fs';
import { createRequire } from 'node:module';
import { dirname } from 'node:path';
import { Table, vectorFromArray, tableToIPC, Field, List, Struct, Utf8 } from 'apache-arrow';
import * as pq from 'parquet-wasm/esm';

const [demoDir, datasetFile, originDir] = process.argv.slice(2);
const require = createRequire(import.meta.url);
pq.initSync({ module: readFileSync(require.resolve('parquet-wasm/esm/parquet_wasm_bg.wasm')) });

const sha1 = (b) => createHash('sha1').update(b).digest('hex');
const sha256 = (b) => createHash('sha256').update(b).digest('hex');
const gitBlob = (b) => sha1(Buffer.concat([Buffer.from(`blob ${b.length}\0`), b]));
const bytes = (n, seed) => { // deterministic pseudo-random content
  const b = Buffer.alloc(n);
  let x = seed >>> 0 || 1;
  for (let i = 0; i < n; i++) { x ^= x << 13; x >>>= 0; x ^= x >>> 17; x ^= x << 5; x >>>= 0; b[i] = x & 255; }
  return b;
};
const isLfs = (p) => /\.(safetensors|bin|parquet|gguf)$/.test(p);

function chatParquet() {
  const t = new List(new Field('item', new Struct([new Field('role', new Utf8(), true), new Field('content', new Utf8(), true)]), true));
  const rows = [0, 1, 2].map((i) => [{ role: 'user', content: `question ${i}` }, { role: 'assistant', content: `answer ${i}` }]);
  const table = new Table({ messages: vectorFromArray(rows, t) });
  const props = new pq.WriterPropertiesBuilder().setCompression(pq.Compression.SNAPPY).build();
  return Buffer.from(pq.writeParquet(pq.Table.fromIPCStream(tableToIPC(table, 'stream')), props));
}

// key "models/org/name" -> { revs: { revName: { commit, files: {path: Buffer} } }, token?, flaky?, badSha? , extra? }
const repos = {};
function repo(key, files, opts = {}) {
  const commit = sha1(key + (opts.salt || ''));
  repos[key] = { revs: { main: { commit, files }, master: { commit, files } }, ...opts };
  return repos[key];
}
repo('models/org/tiny', {
  'config.json': Buffer.from('{"model_type": "llama"}\n'), 'tokenizer.json': Buffer.from('{"version": "1.0"}\n'),
  'model.safetensors': bytes(300000, 1), 'pytorch_model.bin': bytes(1000, 2), 'README.md': Buffer.from('# tiny\n'),
  'sub/extra.json': Buffer.from('{"nested": true}\n'),
});
const stories = {};
for (const f of readdirSync(demoDir)) stories[f] = readFileSync(`${demoDir}/${f}`);
repo('models/org/stories', stories);
repo('models/org/gated', { 'config.json': Buffer.from('{"gated": 1}\n'), 'model.safetensors': bytes(5000, 3) }, { token: 'secret' });
repo('models/org/flaky', { 'config.json': Buffer.from('{}\n'), 'model.safetensors': bytes(400000, 4) }, { flaky: 1 });
repo('models/org/resume', { 'config.json': Buffer.from('{}\n'), 'model.safetensors': bytes(200000, 5) });
repo('models/org/badsha', { 'config.json': Buffer.from('{}\n'), 'model.safetensors': bytes(7000, 6) }, { badSha: 1 });
repo('models/org/evil', { 'config.json': Buffer.from('{}\n'), '../../../../evil.json': Buffer.from('{"evil": 1}\n') });
// its listing has a second object after the first (a hub or proxy gone wrong)
repo('models/org/trailing', { 'config.json': Buffer.from('{}\n') }, { trailing: 1 });
repo('models/org/full', { 'config.json': Buffer.from('{}\n'), 'model.safetensors': bytes(9000, 7) });
repo('models/org/mirror', { 'config.json': Buffer.from('{"mirror": 1}\n'), 'model.safetensors': bytes(6000, 12) }, { noBlobs: 1 });
repo('models/org/quant', {
  'config.json': Buffer.from('{}\n'), 'tiny-Q8_0.gguf': bytes(100, 8), 'tiny-Q4_K_M-00001-of-00002.gguf': bytes(120, 9),
  'tiny-Q4_K_M-00002-of-00002.gguf': bytes(130, 10), 'mmproj-tiny.gguf': bytes(50, 11),
});
repo('datasets/org/chat', {
  'data/train.json': readFileSync(datasetFile), 'data/test.json': Buffer.from('[]\n'), 'README.md': Buffer.from('# chat\n'),
});
const scripted = repo('datasets/org/scripted', { 'scripted.py': Buffer.from('# a loading script\n') });
scripted.revs['refs/convert/parquet'] = {
  commit: sha1('scripted-parquet'), files: { 'default/train/0000.parquet': chatParquet(), 'default/test/0000.parquet': chatParquet() },
};

for (const [key, r] of Object.entries(repos))
  for (const [path, b] of Object.entries(r.revs.main.files)) {
    if (path.includes('..')) continue;
    const out = `${originDir}/${key}/${path}`;
    mkdirSync(dirname(out), { recursive: true });
    writeFileSync(out, b);
  }

const log = [];
const cdn = {}; // sha256 -> { buf, flaky }
let port = 0;

function send(res, status, body, headers = {}) {
  res.writeHead(status, { 'Content-Type': 'application/json', ...headers });
  res.end(typeof body === 'string' || Buffer.isBuffer(body) ? body : JSON.stringify(body));
}
function notFound(res, code) { send(res, 404, { error: code }, { 'X-Error-Code': code, 'X-Error-Message': `${code}` }); }

// Serves buf with Range support; flaky: the first request is cut after half.
function serveFile(req, res, buf, headers = {}, flakyKey = null) {
  const m = /^bytes=(\d+)-$/.exec(req.headers.range || '');
  let start = 0;
  if (m) {
    start = Number(m[1]);
    if (start >= buf.length) return send(res, 416, '', { 'Content-Range': `bytes */${buf.length}` });
  }
  const body = buf.subarray(start);
  const h = { 'Content-Type': 'application/octet-stream', 'Content-Length': body.length, 'Accept-Ranges': 'bytes', ...headers };
  if (m) h['Content-Range'] = `bytes ${start}-${buf.length - 1}/${buf.length}`;
  res.writeHead(m ? 206 : 200, h);
  if (flakyKey && !cdn[flakyKey].dropped) {
    cdn[flakyKey].dropped = true;
    res.write(body.subarray(0, body.length >> 1), () => setTimeout(() => res.socket.destroy(), 50));
    return;
  }
  res.end(body);
}

function findRev(r, rev) {
  for (const [name, v] of Object.entries(r.revs)) if (name === rev || v.commit === rev) return v;
  return null;
}

function authorized(r, req) { return !r.token || req.headers.authorization === `Bearer ${r.token}`; }

function siblings(r, v) {
  return Object.entries(v.files).map(([p, b]) => {
    if (r.noBlobs) return { rfilename: p }; // as a mirror that ignores ?blobs=true
    const s = { rfilename: p, size: b.length, blobId: gitBlob(b) };
    if (isLfs(p)) s.lfs = { sha256: r.badSha ? sha256(Buffer.from('other')) : sha256(b), size: b.length, pointerSize: 134 };
    return s;
  });
}

const server = createServer((req, res) => {
  const url = new URL(req.url, 'http://x');
  log.push({ method: req.method, url: req.url, range: req.headers.range || null, auth: req.headers.authorization || null, host: req.headers.host });
  const parts = url.pathname.split('/').slice(1).map(decodeURIComponent);
  if (url.pathname === '/__log') return send(res, 200, log);
  // Hugging Face: /api/{models|datasets}/{org}/{name}/revision/{rev}
  if (parts[0] === 'api' && (parts[1] === 'models' || parts[1] === 'datasets') && parts[4] === 'revision') {
    const r = repos[`${parts[1]}/${parts[2]}/${parts[3]}`];
    if (!r) return notFound(res, 'RepoNotFound');
    if (!authorized(r, req)) return send(res, 401, { error: 'gated' }, { 'X-Error-Code': 'GatedRepo' });
    const v = findRev(r, parts.slice(5).join('/'));
    if (!v) return notFound(res, 'RevisionNotFound');
    if (url.searchParams.get('blobs') !== 'true') return send(res, 400, { error: 'expected blobs=true' });
    const listing = JSON.stringify({ id: `${parts[2]}/${parts[3]}`, sha: v.commit, siblings: siblings(r, v) });
    return send(res, 200, r.trailing ? `${listing}{"siblings": []}` : listing);
  }
  // Hugging Face: /[datasets/]{org}/{name}/resolve/{rev}/{path}
  const ds = parts[0] === 'datasets';
  const p = ds ? parts.slice(1) : parts;
  if (p[2] === 'resolve') {
    const r = repos[`${ds ? 'datasets' : 'models'}/${p[0]}/${p[1]}`];
    if (!r) return notFound(res, 'RepoNotFound');
    if (!authorized(r, req)) return send(res, 401, { error: 'gated' }, { 'X-Error-Code': 'GatedRepo' });
    const v = findRev(r, p[3]);
    if (!v) return notFound(res, 'RevisionNotFound');
    const path = p.slice(4).join('/');
    const b = v.files[path];
    if (!b) return notFound(res, 'EntryNotFound');
    const common = { 'X-Repo-Commit': v.commit };
    if (isLfs(path)) {
      const sum = sha256(b);
      cdn[sum] = cdn[sum] || { buf: b, flaky: !!r.flaky };
      return send(res, 302, '', { ...common, 'X-Linked-Etag': `"${sum}"`, 'X-Linked-Size': b.length, Location: `http://localhost:${port}/cdn/${sum}?x=1` });
    }
    return serveFile(req, res, b, { ...common, ETag: `"${gitBlob(b)}"` });
  }
  if (parts[0] === 'cdn') {
    const c = cdn[parts[1]];
    if (!c) return notFound(res, 'NoSuchKey');
    if (req.headers.authorization) return send(res, 400, { error: 'the token was sent to the CDN' });
    return serveFile(req, res, c.buf, {}, c.flaky ? parts[1] : null);
  }
  // ModelScope: /api/v1/{models|datasets}/{org}/{name}/repo[/files|/tree]
  if (parts[0] === 'api' && parts[1] === 'v1' && (parts[2] === 'models' || parts[2] === 'datasets') && parts[5] === 'repo') {
    const r = repos[`${parts[2]}/${parts[3]}/${parts[4]}`];
    if (!r) return send(res, 404, { Code: 10010205001, Message: 'repo not found' });
    if (!authorized(r, req)) return send(res, 401, { Code: 401, Message: 'unauthorized' });
    const v = findRev(r, url.searchParams.get('Revision') || 'master');
    if (!v) return send(res, 404, { Code: 10010205001, Message: 'revision not found' });
    if (parts[6] === 'files' || parts[6] === 'tree') {
      const files = Object.entries(v.files).map(([path, b]) => ({ Name: path.split('/').pop(), Path: path, Type: 'blob', Size: b.length, Sha256: r.badSha && isLfs(path) ? sha256(Buffer.from('other')) : sha256(b) }));
      files.push({ Name: 'sub', Path: 'sub', Type: 'tree', Size: 0 });
      return send(res, 200, { Code: 200, Data: { Files: files } });
    }
    const b = v.files[url.searchParams.get('FilePath')];
    if (!b) return send(res, 404, { Code: 404, Message: 'file not found' });
    return serveFile(req, res, b);
  }
  return send(res, 404, { error: 'no route' });
});
server.listen(0, '127.0.0.1', () => {
  port = server.address().port;
  console.log(`port ${port}`);
});
process.stdin.on('end', () => process.exit(0)); // the test closing our stdin ends us
process.stdin.resume();
