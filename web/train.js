// The Train tab (anytune web-ui): a form of `anytune sft` (or, with an
// rlhf_type, `anytune rlhf`) options posted to
// /ui/api/train, the job's status polled while it runs, and the loss curve
// drawn as inline SVG from the rows of its logging.jsonl.
'use strict';

(function () {
  const $ = (id) => document.getElementById(id);
  const SVG = 'http://www.w3.org/2000/svg';
  let rows = [];        // logging.jsonl rows of the current job
  let seen = 0;         // rows asked for so far (?since=)
  let timer = null;
  let lastPid = null;

  function showError(text) {
    const e = $('train-error');
    e.textContent = text || '';
    e.hidden = !text;
  }

  // The form as JSON: empty fields are left out (the trainer's defaults);
  // numbers go as numbers, and the server checks every value.
  function formBody() {
    const body = {};
    for (const el of document.querySelectorAll('#train-form [data-opt]')) {
      const v = el.value.trim();
      if (v === '' || (el.dataset.rlhf !== undefined && el.closest('label').hidden)) continue;
      body[el.dataset.opt] = el.dataset.type === 'number' ? Number(v) : v;
    }
    return body;
  }

  function el(name, attrs, text) {
    const e = document.createElementNS(SVG, name);
    for (const k in attrs) e.setAttribute(k, attrs[k]);
    if (text !== undefined) e.textContent = text;
    return e;
  }

  function fmt(v) {
    return Math.abs(v) >= 100 || v === 0 ? v.toFixed(0) : v.toPrecision(3);
  }

  // The loss (and eval loss, when logged) against the step.
  function drawChart() {
    const box = $('loss-chart');
    const W = 640, H = 260, L = 56, R = 16, T = 16, B = 36;
    const train = rows.filter((r) => r && typeof r.loss === 'number' && typeof r.step === 'number');
    const evals = rows.filter((r) => r && typeof r.eval_loss === 'number' && typeof r.step === 'number');
    const svg = el('svg', { viewBox: `0 0 ${W} ${H}`, width: W, height: H, role: 'img' });
    svg.append(el('title', {}, 'training loss by step'));
    if (!train.length && !evals.length) {
      svg.append(el('text', { x: W / 2, y: H / 2, 'text-anchor': 'middle', class: 'empty' }, 'no logged steps yet'));
      box.replaceChildren(svg);
      return;
    }
    const all = train.map((r) => r.loss).concat(evals.map((r) => r.eval_loss));
    const steps = train.map((r) => r.step).concat(evals.map((r) => r.step));
    let y0 = Math.min(...all), y1 = Math.max(...all);
    if (y1 - y0 < 1e-9) { y0 -= 0.5; y1 += 0.5; }
    let x0 = Math.min(...steps), x1 = Math.max(...steps);
    if (x1 === x0) { x0 -= 1; x1 += 1; }
    const X = (s) => L + (s - x0) / (x1 - x0) * (W - L - R);
    const Y = (v) => T + (y1 - v) / (y1 - y0) * (H - T - B);
    // axes with their extreme values
    svg.append(el('line', { x1: L, y1: H - B, x2: W - R, y2: H - B, class: 'axis' }));
    svg.append(el('line', { x1: L, y1: T, x2: L, y2: H - B, class: 'axis' }));
    for (const v of [y0, (y0 + y1) / 2, y1]) {
      svg.append(el('line', { x1: L, y1: Y(v), x2: W - R, y2: Y(v), class: 'grid' }));
      svg.append(el('text', { x: L - 6, y: Y(v) + 4, 'text-anchor': 'end', class: 'tick' }, fmt(v)));
    }
    for (const s of [x0, x1]) {
      svg.append(el('text', { x: X(s), y: H - B + 16, 'text-anchor': 'middle', class: 'tick' }, String(Math.round(s))));
    }
    svg.append(el('text', { x: (L + W - R) / 2, y: H - 4, 'text-anchor': 'middle', class: 'tick' }, 'step'));
    const series = [[train, 'loss', 'loss'], [evals, 'eval_loss', 'eval']];
    for (const [pts, key, cls] of series) {
      if (!pts.length) continue;
      svg.append(el('polyline', { points: pts.map((r) => X(r.step) + ',' + Y(r[key])).join(' '), class: 'line ' + cls }));
      for (const r of pts) {
        const c = el('circle', { cx: X(r.step), cy: Y(r[key]), r: 3, class: 'pt ' + cls });
        c.append(el('title', {}, `step ${r.step}: ${key} ${r[key].toFixed(4)}`));
        svg.append(c);
      }
    }
    box.replaceChildren(svg);
  }

  function show(st) {
    $('train-state').textContent = st.state + (st.exit_code !== null && st.exit_code !== undefined && st.state !== 'running'
      ? ' (exit ' + st.exit_code + ')' : st.signal ? ' (signal ' + st.signal + ')' : '');
    $('train-state').dataset.state = st.state;
    $('train-pid').textContent = st.pid === null ? '-' : String(st.pid);
    $('train-run-dir').textContent = st.run_dir || '-';
    $('train-output').textContent = (st.output || []).join('\n') + (st.error ? '\n' + st.error : '');
    const last = rows.length ? rows[rows.length - 1] : null;
    $('train-step').textContent = last && typeof last.step === 'number' ? String(last.step) : '-';
    $('train-loss').textContent = last && typeof last.loss === 'number' ? last.loss.toFixed(4) : '-';
    const running = st.state === 'running' || st.state === 'starting';
    $('train-start').disabled = running;
    $('train-stop').disabled = !running;
  }

  // Polls may overlap (the timer, start, stop): each answer places its rows
  // at the index it asked from, so an overlap never draws a row twice.
  async function poll() {
    try {
      const since = seen;
      const r = await fetch('/ui/api/train/status?since=' + since, { headers: AT.headers(false) });
      if (r.status === 401) AT.showKeyBox();
      if (!r.ok) throw new Error(await AT.errorText(r));
      const st = await r.json();
      if (st.pid !== lastPid) {
        // another job: its rows from the first one
        lastPid = st.pid;
        rows = [];
      }
      if (rows.length < since) { seen = 0; return poll(); }
      if (Array.isArray(st.log)) rows = rows.slice(0, since).concat(st.log);
      if (typeof st.log_total === 'number') seen = st.log_total;
      show(st);
      drawChart();
      const running = st.state === 'running' || st.state === 'starting';
      if (running && !timer) timer = setInterval(poll, 1000);
      if (!running && timer) { clearInterval(timer); timer = null; }
    } catch (e) {
      showError('status: ' + (e.message || e));
    }
  }

  async function start() {
    showError('');
    $('train-start').disabled = true;
    try {
      const r = await fetch('/ui/api/train', { method: 'POST', headers: AT.headers(true), body: JSON.stringify(formBody()) });
      if (r.status === 401) AT.showKeyBox();
      if (!r.ok) throw new Error(await AT.errorText(r));
      rows = []; seen = 0; lastPid = null;
    } catch (e) {
      showError(String(e.message || e));
    }
    await poll();
  }

  async function stop() {
    showError('');
    try {
      const r = await fetch('/ui/api/train/stop', { method: 'POST', headers: AT.headers(true), body: '{}' });
      if (!r.ok) throw new Error(await AT.errorText(r));
    } catch (e) {
      showError(String(e.message || e));
    }
    await poll();
  }

  // rlhf_type: the options of the chosen objective (data-for), none for sft
  function showObjective() {
    const t = $('train-rlhf-type').value;
    $('train-rlhf').hidden = !t;
    for (const l of document.querySelectorAll('#train-rlhf [data-for]')) {
      l.hidden = !t || !l.dataset.for.split(' ').includes(t);
    }
  }

  AT.config.then((c) => {
    if (!c.train) return;
    // the objectives this build trains (the server's table: grpo appears when it has it)
    for (const t of c.rlhf_types || []) {
      const o = document.createElement('option');
      o.value = t;
      o.textContent = t;
      $('train-rlhf-type').append(o);
    }
    $('train-rlhf-type').addEventListener('change', showObjective);
    showObjective();
    const d = c.defaults || {};
    for (const k of Object.keys(d)) {
      const input = document.querySelector(`#train-form [data-opt="${k}"]`);
      if (input && !input.value) input.value = d[k];
    }
    $('train-form').addEventListener('submit', (e) => { e.preventDefault(); start(); });
    $('train-stop').addEventListener('click', stop);
    drawChart();
    poll(); // a job started earlier (another tab, a reload) shows up
  });
})();
