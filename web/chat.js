// The Chat tab: a conversation with POST /v1/chat/completions, streamed.
// Model output is only ever set as textContent (never parsed as HTML).
'use strict';

(function () {
  const $ = (id) => document.getElementById(id);
  const messagesEl = $('messages');
  const history = []; // [{role, content}] without the system prompt; a user turn with images has a content list
  const attached = []; // data: URLs of the images for the next message
  let controller = null; // the AbortController of the answer in progress
  let conversation = 0; // bumped by Clear: an answer ending later is not part of the new conversation

  // Reads a server-sent-events body (a ReadableStream of bytes) and calls
  // onData with the text of each "data:" event; returns true at [DONE],
  // false when the stream ends before it (the answer is cut off). TextDecoder
  // with stream: true keeps the bytes of a character that is split between
  // two chunks until the rest arrives. When onData throws, the stream is
  // cancelled (the connection closes, so the server stops generating).
  async function readSSE(body, onData) {
    const reader = body.getReader();
    const decoder = new TextDecoder('utf-8');
    let buf = '';
    try {
      for (;;) {
        const { value, done } = await reader.read();
        buf += done ? decoder.decode() : decoder.decode(value, { stream: true });
        let m;
        while ((m = /\r?\n\r?\n/.exec(buf)) !== null) {
          const event = buf.slice(0, m.index);
          buf = buf.slice(m.index + m[0].length);
          const data = event.split(/\r?\n/)
            .filter((l) => l.startsWith('data:'))
            .map((l) => l.slice(5).replace(/^ /, ''))
            .join('\n');
          if (!data) continue;
          if (data === '[DONE]') return true;
          onData(data);
        }
        if (done) return false;
      }
    } catch (e) {
      reader.cancel().catch(() => {});
      throw e;
    }
  }

  function addMessage(role, text, images) {
    const div = document.createElement('div');
    div.className = 'msg ' + role;
    div.dataset.role = role;
    const label = document.createElement('div');
    label.className = 'who';
    label.textContent = role;
    const body = document.createElement('div');
    body.className = 'text';
    body.textContent = text;
    const meta = document.createElement('div');
    meta.className = 'meta';
    const pics = document.createElement('div');
    pics.className = 'images';
    for (const url of images || []) pics.append(thumb(url, 'attached image'));
    div.append(label, pics, body, meta);
    messagesEl.append(div);
    messagesEl.scrollTop = messagesEl.scrollHeight;
    return { div, body, meta };
  }

  // An <img> of a data: URL the page made itself from a file (FileReader), never markup.
  function thumb(url, alt) {
    const img = document.createElement('img');
    img.className = 'thumb';
    img.alt = alt;
    img.src = url;
    return img;
  }

  // The attachments row: one thumbnail per image; clicking one removes it.
  function showAttached() {
    const row = $('attachments');
    row.replaceChildren();
    attached.forEach((url, i) => {
      const b = document.createElement('button');
      b.type = 'button';
      b.title = 'remove this image';
      b.setAttribute('aria-label', 'remove image ' + (i + 1));
      b.append(thumb(url, 'image ' + (i + 1)));
      b.addEventListener('click', () => { attached.splice(i, 1); showAttached(); });
      row.append(b);
    });
  }

  function readAsDataURL(file) {
    return new Promise((resolve, reject) => {
      const r = new FileReader();
      r.onload = () => resolve(r.result);
      r.onerror = () => reject(r.error || new Error('cannot read ' + file.name));
      r.readAsDataURL(file);
    });
  }

  function showError(text) {
    const e = $('chat-error');
    e.textContent = text || '';
    e.hidden = !text;
  }

  function setBusy(busy) {
    $('send').disabled = busy;
    $('stop').disabled = !busy;
    $('regenerate').disabled = busy || !history.some((m) => m.role === 'user');
  }

  // The request: the sampling fields the server accepts, from the controls.
  function requestBody() {
    const messages = [];
    const system = $('system').value;
    if (system.trim()) messages.push({ role: 'system', content: system });
    messages.push(...history);
    const body = { messages, stream: true, stream_options: { include_usage: true } };
    const model = $('model').value;
    if (model) body.model = model;
    for (const f of ['temperature', 'top_p', 'top_k', 'max_tokens', 'repetition_penalty', 'seed']) {
      const v = $(f).value.trim();
      if (v !== '') body[f] = Number(v);
    }
    return body;
  }

  // Streams the answer to the conversation so far (it ends with a user turn).
  async function generate() {
    showError('');
    const out = addMessage('assistant', '');
    out.div.dataset.state = 'streaming';
    out.div.setAttribute('aria-busy', 'true'); // screen readers read the answer once, when whole
    const myConversation = conversation;
    controller = new AbortController();
    setBusy(true);
    let text = '', finish = '', usage = null, state = 'done';
    const t0 = performance.now();
    try {
      const r = await fetch('/v1/chat/completions', {
        method: 'POST', headers: AT.headers(true), body: JSON.stringify(requestBody()), signal: controller.signal,
      });
      if (r.status === 401) AT.showKeyBox();
      if (!r.ok) throw new Error(await AT.errorText(r));
      const complete = await readSSE(r.body, (data) => {
        const j = JSON.parse(data);
        if (j.error) throw new Error(j.error.message || 'generation failed');
        const c = j.choices && j.choices[0];
        if (c && c.delta && typeof c.delta.content === 'string' && c.delta.content) {
          text += c.delta.content;
          out.body.textContent = text;
          messagesEl.scrollTop = messagesEl.scrollHeight;
        }
        if (c && c.finish_reason) finish = c.finish_reason;
        if (j.usage) usage = j.usage;
      });
      if (!complete) throw new Error('the connection closed before the answer was complete (no [DONE])');
    } catch (e) {
      if (e.name === 'AbortError') {
        state = 'stopped';
      } else {
        state = 'error';
        if (myConversation === conversation) showError(String(e.message || e));
      }
    } finally {
      controller = null;
    }
    if (myConversation !== conversation) return; // cleared meanwhile: its message and turns are gone
    const secs = (performance.now() - t0) / 1000;
    let meta = state === 'stopped' ? 'stopped' : state === 'error' ? 'error' : finish || 'done';
    if (usage) meta += ' \u00b7 ' + usage.completion_tokens + ' tokens, ' +
      (usage.completion_tokens / Math.max(secs, 1e-3)).toFixed(1) + ' tokens/s';
    out.meta.textContent = meta;
    out.div.dataset.state = state;
    out.div.removeAttribute('aria-busy');
    if (state !== 'error' || text) history.push({ role: 'assistant', content: text });
    else out.div.remove();
    setBusy(false);
  }

  // A message with images goes as an OpenAI content list: the images
  // (image_url parts with data: URLs), then the text.
  function send() {
    const text = $('prompt').value;
    if ((!text.trim() && !attached.length) || controller) return;
    $('prompt').value = '';
    const images = attached.splice(0);
    showAttached();
    const content = images.length
      ? [...images.map((url) => ({ type: 'image_url', image_url: { url } })), { type: 'text', text }]
      : text;
    history.push({ role: 'user', content });
    addMessage('user', text, images);
    generate();
  }

  $('attach').addEventListener('click', () => $('attach-file').click());
  $('attach-file').addEventListener('change', async (e) => {
    const files = Array.from(e.target.files || []);
    e.target.value = ''; // the same file can be chosen again
    try {
      for (const f of files) {
        if (!/^image\/(png|jpeg|webp)$/.test(f.type)) throw new Error(f.name + ': only PNG, JPEG and WebP images are read');
        attached.push(await readAsDataURL(f));
      }
      showError('');
    } catch (err) {
      showError(String(err.message || err));
    }
    showAttached();
  });

  $('chat-form').addEventListener('submit', (e) => { e.preventDefault(); send(); });
  $('prompt').addEventListener('keydown', (e) => {
    if (e.key === 'Enter' && !e.shiftKey && !e.isComposing) { e.preventDefault(); send(); }
  });
  // Stop: the server notices the closed connection and frees the slot.
  $('stop').addEventListener('click', () => { if (controller) controller.abort(); });
  $('regenerate').addEventListener('click', () => {
    if (controller) return;
    if (history.length && history[history.length - 1].role === 'assistant') {
      history.pop();
      const last = messagesEl.querySelector('.msg.assistant:last-child');
      if (last) last.remove();
    }
    if (history.length && history[history.length - 1].role === 'user') generate();
  });
  $('clear').addEventListener('click', () => {
    if (controller) controller.abort();
    conversation++;
    history.length = 0;
    attached.length = 0;
    showAttached();
    messagesEl.replaceChildren();
    showError('');
    setBusy(false);
  });

  // The models: the base first, then each adapter by name. The one selected
  // at first is the server's default_model (what a request naming none gets);
  // when it has none (adapters loaded, no --default_model) the user chooses:
  // the request then names no model and the server's refusal lists them.
  async function loadModels() {
    const sel = $('model');
    try {
      const r = await fetch('/v1/models', { headers: AT.headers(false) });
      if (r.status === 401) {
        AT.showKeyBox();
        showError('This server wants an API key: type it at the top.');
        return;
      }
      if (!r.ok) throw new Error(await AT.errorText(r));
      const j = await r.json();
      const keep = sel.value;
      sel.replaceChildren();
      if (!j.default_model) {
        const o = document.createElement('option');
        o.value = '';
        o.textContent = '(choose a model)';
        sel.append(o);
      }
      for (const m of j.data || []) {
        const o = document.createElement('option');
        o.value = m.id;
        o.textContent = m.parent ? m.id + ' (adapter of ' + m.parent + ')' : m.id;
        sel.append(o);
      }
      const listed = (v) => v && Array.from(sel.options).some((o) => o.value === v);
      sel.value = listed(keep) ? keep : listed(j.default_model) ? j.default_model : '';
      showError('');
    } catch (e) {
      showError('cannot list the models: ' + (e.message || e));
    }
  }
  document.addEventListener('anytune-key', loadModels);
  loadModels();
  setBusy(false);

  AT.readSSE = readSSE; // for the page's tests
})();
