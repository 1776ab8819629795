// Drives the chat page's image attach button in Debian's chromium (headless,
// through playwright-core) against `anytune serve` of a vision-language model:
//  - a PNG chosen with the file picker shows as a thumbnail, and the next
//    message goes as an OpenAI content list: an image_url part holding the
//    file as a data: URL (its bytes, base64), then the text part;
//  - the greedy answer the page shows equals the API's whole answer to the
//    same body, and equals `want` (the answer anytune infer gave for the file);
//  - the thumbnail row empties once the message is sent; the user message shows
//    the image; a non-image file is refused with a message.
// Usage: node tests/js/vlm_chat_check.mjs URL IMAGE.png WANT_FILE MAX_TOKENS   (run by tests/test_vlm_serve.c)
import { chromium } from 'playwright-core';
import { readFileSync } from 'node:fs';

const [url, image, wantFile, maxTokens] = process.argv.slice(2);
const want = readFileSync(wantFile, 'utf8');
let failures = 0;
function check(cond, msg) {
  if (!cond) {
    failures++;
    console.error('vlm_chat_check: FAIL: ' + msg);
  }
}
const browser = await chromium.launch({ executablePath: '/usr/bin/chromium', headless: true, args: ['--no-sandbox'] });
try {
  const page = await browser.newPage();
  const errors = [];
  page.on('pageerror', (e) => errors.push(String(e)));
  await page.goto(url);
  await page.waitForFunction(() => document.querySelectorAll('#model option').length > 0);
  await page.fill('#temperature', '0');
  await page.fill('#max_tokens', maxTokens);

  // a file that is not an image is refused
  await page.setInputFiles('#attach-file', { name: 'notes.txt', mimeType: 'text/plain', buffer: Buffer.from('hi') });
  await page.waitForSelector('#chat-error:not([hidden])');
  check(/only PNG, JPEG and WebP/.test(await page.textContent('#chat-error')), 'a text file was not refused');
  check(await page.locator('#attachments img').count() === 0, 'a text file became an attachment');

  // the attach button opens the file picker; the image shows as a thumbnail
  const chooserP = page.waitForEvent('filechooser');
  await page.click('#attach');
  await (await chooserP).setFiles(image);
  await page.waitForSelector('#attachments img');
  check(await page.locator('#attachments img').count() === 1, 'one thumbnail after attaching one image');

  const reqP = page.waitForRequest((r) => r.url().endsWith('/v1/chat/completions') && r.method() === 'POST');
  await page.fill('#prompt', 'What is in the picture?');
  await page.click('#send');
  const sent = JSON.parse((await reqP).postData());
  await page.waitForSelector('.msg.assistant[data-state="done"]', { timeout: 120000 });
  const shown = await page.textContent('.msg.assistant .text');
  const parts = sent.messages[0].content;
  const dataUrl = 'data:image/png;base64,' + readFileSync(image).toString('base64');
  check(Array.isArray(parts) && parts.length === 2 && parts[0].type === 'image_url' &&
        parts[0].image_url.url === dataUrl && parts[1].type === 'text' && parts[1].text === 'What is in the picture?',
        'the message sent: ' + JSON.stringify(sent.messages).slice(0, 300));
  check(await page.locator('#attachments img').count() === 0, 'the attachments were not cleared after sending');
  check(await page.locator('.msg.user img').count() === 1, 'the user message does not show its image');
  const plain = { ...sent, stream: false };
  delete plain.stream_options;
  const r = await fetch(new URL('/v1/chat/completions', url), {
    method: 'POST', headers: { 'Content-Type': 'application/json' }, body: JSON.stringify(plain),
  });
  const api = (await r.json()).choices[0].message.content;
  check(shown === api, `shown ${JSON.stringify(shown)} != API ${JSON.stringify(api)}`);
  check(shown === want, `shown ${JSON.stringify(shown)} != infer's ${JSON.stringify(want)}`);
  check(errors.length === 0, 'page errors: ' + errors.join('; '));
  console.log(`vlm_chat_check: the attached image went as a data: URL; the answer equals infer's (${want.length} characters)`);
} finally {
  await browser.close();
}
process.exit(failures ? 1 : 0);
