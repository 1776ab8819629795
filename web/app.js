// anytune web UI: what the tabs share (the API key, error messages, the
// server's configuration) and the tab switching. Plain script, no framework.
'use strict';

window.AT = (function () {
  // ?token=KEY, in the URL `anytune web-ui` prints: the API key for this
  // tab's session. Taken off the address bar at once, so that it is not left
  // in the tab's history, a bookmark or a copied link.
  const params = new URLSearchParams(location.search);
  if (params.has('token')) {
    const token = params.get('token');
    if (token) sessionStorage.setItem('anytune-api-key', token);
    params.delete('token');
    const rest = params.toString();
    history.replaceState(history.state, '', location.pathname + (rest ? '?' + rest : '') + location.hash);
  }

  const keyInput = document.getElementById('api-key');
  keyInput.value = sessionStorage.getItem('anytune-api-key') || '';
  keyInput.addEventListener('change', () => {
    sessionStorage.setItem('anytune-api-key', keyInput.value);
    document.dispatchEvent(new Event('anytune-key'));
  });

  // Request headers: JSON body, and the key when there is one.
  function headers(json) {
    const h = {};
    if (json) h['Content-Type'] = 'application/json';
    if (keyInput.value) h['Authorization'] = 'Bearer ' + keyInput.value;
    return h;
  }

  // The message of an error answer ({"error": {"message"}}), else its status.
  async function errorText(r) {
    let text = '';
    try { text = await r.text(); } catch (e) { /* the body is lost */ }
    try {
      const j = JSON.parse(text);
      if (j && j.error && j.error.message) return r.status + ': ' + j.error.message;
    } catch (e) { /* not JSON */ }
    return r.status + ' ' + r.statusText + (text ? ': ' + text.slice(0, 300) : '');
  }

  function showKeyBox() { document.getElementById('key-box').hidden = false; }

  // Tabs: one panel visible at a time; the ARIA tabs pattern (the selected
  // tab is the one in the Tab order, arrow keys, Home and End move between tabs).
  const tabs = Array.from(document.querySelectorAll('.tab'));
  function select(t) {
    for (const u of tabs) {
      const on = u === t;
      u.classList.toggle('active', on);
      u.setAttribute('aria-selected', String(on));
      u.tabIndex = on ? 0 : -1;
      document.getElementById(u.dataset.panel).hidden = !on;
    }
  }
  for (const t of tabs) {
    t.addEventListener('click', () => select(t));
    t.addEventListener('keydown', (e) => {
      const shown = tabs.filter((u) => !u.hidden);
      const i = shown.indexOf(t);
      const next = { ArrowRight: i + 1, ArrowLeft: i - 1, Home: 0, End: shown.length - 1 }[e.key];
      if (next === undefined) return;
      e.preventDefault();
      const u = shown[(next + shown.length) % shown.length];
      select(u);
      u.focus();
    });
  }

  // GET /ui/api/config once; the tabs wait on it.
  const config = fetch('/ui/api/config').then((r) => r.json()).catch(() => ({ train: false, auth: false }));
  config.then((c) => {
    // a key from the URL (or typed before) needs no box; a 401 shows it
    if (c.auth && !keyInput.value) showKeyBox();
    document.getElementById('tab-train').hidden = !c.train;
  });

  return { headers, errorText, showKeyBox, config };
})();
