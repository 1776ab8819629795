// Drives anytune's web UI in Debian's chromium (headless, through
// playwright-core) the way a person would, and checks what the page shows
// against the server's API answered directly:
//  - a greedy (temperature 0) answer streamed into the page equals the
//    content of a non-streamed /v1/chat/completions request with the same
//    body the page sent; regenerate gives it again;
//  - stop aborts a long generation (the download throttled so that it is
//    still streaming): the text stops growing and is a strict prefix of the
//    whole answer;
//  - Clear while an answer streams: the next request holds only the new
//    turn (the cut answer is not carried into the new conversation);
//  - UTF-8 split across chunks decodes right, and model output is text,
//    never HTML; a stream that ends without [DONE] shows as an error;
//  - the tabs follow the ARIA tabs pattern (arrow keys, aria-selected);
//  - the Train tab refuses a bad field with the server's message, runs a
//    3-step job, and draws one loss point per row of its logging.jsonl;
//  - the token: opened from the URL web-ui printed (?token=...), the page
//    drops the token from the address bar, shows no key box, sends
//    Authorization: Bearer TOKEN on every API request, and still has it
//    after a reload; a page opened without it asks for a key; the API
//    refuses a request without it (401).
// Usage: node tests/js/webui_check.mjs URL?token=TOKEN TMPDIR   (run by tests/test_webui.c)
import { chromium } from 'playwright-core';
import { readFileSync } from 'node:fs';

const [url, tmpdir] = process.argv.slice(2);
const token = new URL(url).searchParams.get('token');
const base = new URL('/', url).toString(); // the page without the token
let failures = 0, checks = 0;
function check(cond, msg) {
  checks++;
  if (!cond) {
    failures++;
    console.error('webui_check: FAIL: ' + msg);
  }
}
const api = (path) => new URL(path, base).toString();
const auth = { Authorization: 'Bearer ' + token };
const sleep = (ms) => new Promise((r) => setTimeout(r, ms));

const browser = await chromium.launch({ executablePath: '/usr/bin/chromium', headless: true, args: ['--no-sandbox'] });
try {
  const page = await browser.newPage();
  const errors = [];
  page.on('pageerror', (e) => errors.push(String(e)));
  page.on('console', (m) => { if (m.type() === 'error') errors.push(m.text()); });
  // every API request the page makes (the routed ones too), to check their key
  const apiRequests = [];
  page.on('request', (r) => {
    const p = new URL(r.url()).pathname;
    if (p.startsWith('/v1/') || p.startsWith('/ui/api/train')) apiRequests.push(r);
  });
  check(token && token.length >= 32, 'the URL carries no token: ' + url);
  await page.goto(url);
  await page.waitForFunction(() => document.querySelectorAll('#model option').length > 0);

  // 0. the token: off the address bar, no key box, kept across a reload
  check(page.url() === base && !page.url().includes(token) && await page.evaluate(() => location.search === ''),
        'the address bar after load: ' + page.url());
  check(await page.isHidden('#key-box'), 'the key box is shown although the URL gave the token');
  await page.reload();
  await page.waitForFunction(() => document.querySelectorAll('#model option').length > 0);
  check(await page.isHidden('#key-box') && page.url() === base, 'after a reload the page lost its key');
  const noKey = await fetch(api('/v1/chat/completions'), {
    method: 'POST', headers: { 'Content-Type': 'application/json' },
    body: JSON.stringify({ messages: [{ role: 'user', content: 'Hi' }], max_tokens: 2 }),
  });
  check(noKey.status === 401, `chat without the token: ${noKey.status}`);
  {
    // another browser session, opened without the token: it has to ask
    const other = await browser.newPage();
    await other.goto(base);
    await other.waitForSelector('#key-box:not([hidden])', { timeout: 10000 });
    check(await other.locator('#model option').count() === 0, 'a page without the token listed the models');
    await other.close();
  }
  console.log('webui_check: the token left the address bar and is sent; without it 401');

  // 1. a greedy answer, streamed, equals the API's whole answer
  await page.fill('#temperature', '0');
  await page.fill('#max_tokens', '60');
  const reqP = page.waitForRequest((r) => r.url().endsWith('/v1/chat/completions') && r.method() === 'POST');
  const respP = page.waitForResponse((r) => r.url().endsWith('/v1/chat/completions'));
  await page.fill('#prompt', 'Who are you?');
  await page.click('#send');
  const sentReq = await reqP;
  const sent = JSON.parse(sentReq.postData());
  check((await sentReq.allHeaders()).authorization === 'Bearer ' + token, 'the chat request carries no token');
  await page.waitForSelector('.msg.assistant[data-state="done"]', { timeout: 60000 });
  const shown = await page.textContent('.msg.assistant .text');
  check(sent.stream === true && sent.temperature === 0 && sent.max_tokens === 60 && sent.top_k === 40 &&
        sent.repetition_penalty === 1 && sent.messages.length === 1 && sent.messages[0].content === 'Who are you?',
        'the request body: ' + JSON.stringify(sent));
  const events = (await (await respP).text()).split('\n\n').filter((e) => e.startsWith('data: '));
  check(events.length >= 4 && events[events.length - 1] === 'data: [DONE]', `streamed in ${events.length} events`);
  const plain = { ...sent, stream: false };
  delete plain.stream_options;
  const whole = async (body) => {
    const r = await fetch(api('/v1/chat/completions'), {
      method: 'POST', headers: { 'Content-Type': 'application/json', ...auth }, body: JSON.stringify(body),
    });
    return (await r.json()).choices[0].message.content;
  };
  const want = await whole(plain);
  check(want.length > 0 && shown === want, `shown ${JSON.stringify(shown)} != API ${JSON.stringify(want)}`);
  console.log(`webui_check: greedy answer (${want.length} characters) equals the API's`);

  // 2. regenerate: the last answer again (greedy: the same), still one assistant turn
  await page.click('#regenerate');
  await page.waitForFunction(() => {
    const m = document.querySelectorAll('.msg.assistant');
    return m.length === 1 && m[0].dataset.state === 'done';
  }, null, { timeout: 60000 });
  check(await page.textContent('.msg.assistant .text') === want, 'regenerate gave another answer');

  // 3. stop: a long answer, its download throttled so it is still arriving
  await page.click('#clear');
  check(await page.locator('.msg').count() === 0, 'clear left messages');
  const cdp = await page.context().newCDPSession(page);
  await cdp.send('Network.enable');
  await cdp.send('Network.emulateNetworkConditions',
    { offline: false, latency: 0, downloadThroughput: 2000, uploadThroughput: -1 });
  await page.fill('#max_tokens', '');
  const longReqP = page.waitForRequest((r) => r.url().endsWith('/v1/chat/completions') && r.method() === 'POST');
  await page.fill('#prompt', 'Tell me a long story about a cat.');
  await page.click('#send');
  const longSent = JSON.parse((await longReqP).postData());
  await page.waitForFunction(() => {
    const t = document.querySelector('.msg.assistant .text');
    return t && t.textContent.length > 0;
  }, null, { timeout: 60000 });
  await page.click('#stop');
  await page.waitForSelector('.msg.assistant[data-state="stopped"]', { timeout: 10000 });
  const cut = await page.textContent('.msg.assistant .text');
  await sleep(400);
  check(await page.textContent('.msg.assistant .text') === cut, 'the text grew after stop');
  check(!(await page.isDisabled('#send')) && await page.isDisabled('#stop'), 'buttons after stop');
  await cdp.send('Network.emulateNetworkConditions', { offline: false, latency: 0, downloadThroughput: -1, uploadThroughput: -1 });
  const full = await whole({ ...longSent, stream: false, stream_options: undefined });
  check(cut.length > 0 && cut.length < full.length && full.startsWith(cut),
        `stopped text ${JSON.stringify(cut)} is not a strict prefix of ${JSON.stringify(full.slice(0, 80))}...`);
  let health;
  for (let i = 0; i < 100; i++) {
    health = await (await fetch(api('/health'))).json();
    if (health.running === 0) break;
    await sleep(50);
  }
  check(health.running === 0, 'a slot is still running after stop');
  console.log(`webui_check: stop kept ${cut.length} of ${full.length} characters`);

  // 3b. Clear while streaming: the cut answer stays out of the next conversation
  await page.click('#clear');
  await cdp.send('Network.emulateNetworkConditions',
    { offline: false, latency: 0, downloadThroughput: 2000, uploadThroughput: -1 });
  await page.fill('#prompt', 'Tell me a long story about a dog.');
  await page.click('#send');
  await page.waitForFunction(() => {
    const t = document.querySelector('.msg.assistant .text');
    return t && t.textContent.length > 0;
  }, null, { timeout: 60000 });
  await page.click('#clear');
  await cdp.send('Network.emulateNetworkConditions', { offline: false, latency: 0, downloadThroughput: -1, uploadThroughput: -1 });
  await page.waitForFunction(() => !document.getElementById('send').disabled, null, { timeout: 10000 });
  await sleep(200);
  check(await page.locator('.msg').count() === 0, 'messages after clear while streaming');
  await page.fill('#max_tokens', '5');
  const afterReqP = page.waitForRequest((r) => r.url().endsWith('/v1/chat/completions') && r.method() === 'POST');
  await page.fill('#prompt', 'Hi');
  await page.click('#send');
  const afterSent = JSON.parse((await afterReqP).postData());
  check(afterSent.messages.length === 1 && afterSent.messages[0].content === 'Hi',
        'after clear while streaming, the request holds ' + JSON.stringify(afterSent.messages));
  await page.waitForSelector('.msg.assistant[data-state="done"]', { timeout: 60000 });

  // 4. UTF-8 split between chunks, byte by byte, through the page's reader
  const utf = await page.evaluate(async () => {
    const want = 'h\u00e9llo \u4e16\u754c \ud83d\ude00 \u201cquoted\u201d';
    const text = 'data: ' + JSON.stringify({ choices: [{ delta: { content: want } }] }) + '\r\n\r\ndata: [DONE]\n\n';
    const bytes = new TextEncoder().encode(text);
    const stream = new ReadableStream({
      start(c) { for (const b of bytes) c.enqueue(new Uint8Array([b])); c.close(); },
    });
    let out = '';
    const done = await AT.readSSE(stream, (d) => { out += JSON.parse(d).choices[0].delta.content; });
    return { ok: out === want && done, out };
  });
  check(utf.ok, 'byte-by-byte UTF-8: ' + utf.out);

  // 5. model output is text: an answer holding markup shows as characters
  const evil = '<img src=x onerror="window.__pwned=1"><b>bold</b> caf\u00e9';
  const chunks = ['{"choices":[{"delta":{"role":"assistant","content":""}}]}',
    JSON.stringify({ choices: [{ delta: { content: evil.slice(0, 20) } }] }),
    JSON.stringify({ choices: [{ delta: { content: evil.slice(20) }, finish_reason: null }] }),
    '{"choices":[{"delta":{},"finish_reason":"stop"}]}'];
  await page.route('**/v1/chat/completions', (route) => route.fulfill({
    status: 200, headers: { 'Content-Type': 'text/event-stream' },
    body: chunks.map((c) => 'data: ' + c + '\n\n').join('') + 'data: [DONE]\n\n',
  }));
  await page.click('#clear');
  await page.fill('#prompt', 'markup?');
  await page.click('#send');
  await page.waitForSelector('.msg.assistant[data-state="done"]');
  check(await page.textContent('.msg.assistant .text') === evil, 'markup answer not shown as text');
  check(await page.locator('#messages img, #messages b').count() === 0, 'model output became HTML');
  check(await page.evaluate(() => window.__pwned === undefined), 'model output ran script');
  await page.unroute('**/v1/chat/completions');

  // 5b. a stream cut before [DONE] (the server gone): an error, the text kept
  await page.route('**/v1/chat/completions', (route) => route.fulfill({
    status: 200, headers: { 'Content-Type': 'text/event-stream' },
    body: 'data: ' + JSON.stringify({ choices: [{ delta: { content: 'half an ans' } }] }) + '\n\n',
  }));
  await page.click('#clear');
  await page.fill('#prompt', 'cut?');
  await page.click('#send');
  await page.waitForSelector('.msg.assistant[data-state="error"]', { timeout: 10000 });
  check(await page.textContent('.msg.assistant .text') === 'half an ans', 'cut answer text');
  check(!(await page.isHidden('#chat-error')) && (await page.textContent('#chat-error')).includes('[DONE]'),
        'cut stream message: ' + await page.textContent('#chat-error'));
  await page.unroute('**/v1/chat/completions');

  // 5c. keyboard: the tabs as ARIA tabs, the message box named
  check(await page.getAttribute('#prompt', 'aria-label') === 'Message', 'the message box has no accessible name');
  await page.waitForSelector('#tab-train:not([hidden])');
  await page.focus('#tab-chat');
  await page.keyboard.press('ArrowRight');
  const tabState = await page.evaluate(() => ({
    focused: document.activeElement && document.activeElement.id,
    train: document.getElementById('tab-train').getAttribute('aria-selected'),
    chat: document.getElementById('tab-chat').getAttribute('aria-selected'),
    panel: !document.getElementById('panel-train').hidden && document.getElementById('panel-chat').hidden,
    tabindex: [document.getElementById('tab-chat').tabIndex, document.getElementById('tab-train').tabIndex],
  }));
  check(tabState.focused === 'tab-train' && tabState.train === 'true' && tabState.chat === 'false' && tabState.panel &&
        tabState.tabindex[0] === -1 && tabState.tabindex[1] === 0, 'ArrowRight on the tabs: ' + JSON.stringify(tabState));
  await page.keyboard.press('ArrowRight'); // wraps around to Chat
  check(await page.evaluate(() => document.activeElement.id) === 'tab-chat' &&
        !(await page.isHidden('#panel-chat')), 'ArrowRight from the last tab does not wrap to Chat');

  // 6. the Train tab
  await page.waitForSelector('#tab-train:not([hidden])');
  await page.click('#tab-train');
  await page.fill('[data-opt="output_dir"]', tmpdir + '/ui');
  await page.fill('[data-opt="max_steps"]', '3');
  await page.fill('[data-opt="lora_rank"]', '2.5');
  await page.click('#train-start');
  await page.waitForSelector('#train-error:not([hidden])');
  const err = await page.textContent('#train-error');
  check(err.includes('400') && err.includes('lora_rank'), 'bad field message: ' + err);
  await page.fill('[data-opt="lora_rank"]', '4');
  await page.click('#train-start');
  await page.waitForFunction(() => {
    const s = document.getElementById('train-state').dataset.state;
    return s && s !== 'running' && s !== 'starting' && s !== 'idle';
  }, null, { timeout: 60000 });
  const state = await page.getAttribute('#train-state', 'data-state');
  const runDir = await page.textContent('#train-run-dir');
  check(state === 'finished', 'train state ' + state + ': ' + await page.textContent('#train-output'));
  check(runDir.startsWith(tmpdir + '/ui/v'), 'run folder ' + runDir);
  const logged = readFileSync(runDir + '/logging.jsonl', 'utf8').trim().split('\n').map((l) => JSON.parse(l));
  const points = await page.$$eval('#loss-chart circle.pt.loss title', (ts) => ts.map((t) => t.textContent));
  const wantPoints = logged.map((r) => `step ${r.step}: loss ${r.loss.toFixed(4)}`);
  check(logged.length === 3 && JSON.stringify(points) === JSON.stringify(wantPoints),
        `loss points ${JSON.stringify(points)} != logging.jsonl ${JSON.stringify(wantPoints)}`);
  check(await page.locator('#loss-chart polyline.loss').count() === 1, 'no loss line');
  console.log(`webui_check: Train tab ran 3 steps into ${runDir}; ${points.length} loss points drawn`);

  // 7. a KTO run from the same form: rlhf_type lists this build's objectives and shows kto's options
  const types = await page.$$eval('#train-rlhf-type option', (os) => os.map((o) => o.value));
  check(['', 'dpo', 'kto', 'rm'].every((t) => types.includes(t)), 'rlhf_type choices ' + JSON.stringify(types));
  check(await page.isHidden('[data-opt="desirable_weight"]'), 'kto options shown for sft');
  await page.selectOption('#train-rlhf-type', 'kto');
  check(await page.isVisible('[data-opt="desirable_weight"]') && await page.isHidden('[data-opt="center_rewards_coefficient"]'),
        'kto shows desirable_weight and hides rm\'s center_rewards_coefficient');
  await page.fill('[data-opt="dataset"]', 'tests/data/kto/kto_en_demo_8.json');
  await page.fill('[data-opt="output_dir"]', tmpdir + '/ui-kto');
  await page.fill('[data-opt="max_steps"]', '2');
  await page.fill('[data-opt="per_device_train_batch_size"]', '2');
  await page.fill('[data-opt="max_length"]', '96');
  await page.fill('[data-opt="desirable_weight"]', '1.5');
  await page.click('#train-start');
  await page.waitForFunction((dir) => document.getElementById('train-run-dir').textContent.startsWith(dir),
                             tmpdir + '/ui-kto/v', { timeout: 60000 });
  await page.waitForFunction(() => {
    const s = document.getElementById('train-state').dataset.state;
    return s && s !== 'running' && s !== 'starting' && s !== 'idle';
  }, null, { timeout: 120000 });
  const ktoState = await page.getAttribute('#train-state', 'data-state');
  const ktoDir = await page.textContent('#train-run-dir');
  check(ktoState === 'finished', 'kto state ' + ktoState + ': ' + await page.textContent('#train-output'));
  const ktoRows = readFileSync(ktoDir + '/logging.jsonl', 'utf8').trim().split('\n').map((l) => JSON.parse(l));
  const ktoArgs = JSON.parse(readFileSync(ktoDir + '/args.json', 'utf8'));
  check(ktoRows.length === 2 && ktoRows.every((r) => typeof r.kl === 'number'), 'kto rows ' + JSON.stringify(ktoRows));
  check(ktoArgs.rlhf_type === 'kto' && ktoArgs.desirable_weight === 1.5, 'kto args ' + JSON.stringify(ktoArgs).slice(0, 300));
  console.log(`webui_check: Train tab ran kto (2 steps, kl logged) into ${ktoDir}`);

  // the one error answer expected: the bad lora_rank (400)
  const unexpected = errors.filter((e) => !e.includes('status of 400'));
  check(unexpected.length === 0, 'page errors: ' + unexpected.join(' | '));
  // the models, chats, train start, status polls: each with the token
  const keyless = [];
  for (const r of apiRequests)
    if ((await r.allHeaders()).authorization !== 'Bearer ' + token) keyless.push(r.method() + ' ' + r.url());
  check(apiRequests.length >= 8 && keyless.length === 0,
        `${keyless.length} of ${apiRequests.length} API requests without the token: ${keyless.slice(0, 5).join(', ')}`);
} finally {
  await browser.close();
}
console.log(`webui_check: ${checks - failures}/${checks} checks passed`);
process.exit(failures ? 1 : 0);
