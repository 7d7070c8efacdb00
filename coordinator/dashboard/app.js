// Tandem dashboard: polls the coordinator's JSON API and redraws. No libraries, no network
// beyond the coordinator itself. Text from the server (job names, reasons) only ever goes into
// textContent; the timeline SVG is parsed, stripped of anything active and then adopted.
'use strict';

const POLL_MS = 2000;
const SVG_NS = 'http://www.w3.org/2000/svg';

const jobMatch = window.location.pathname.match(/^\/jobs\/(job-[0-9]+)$/);
const jobId = jobMatch ? jobMatch[1] : null;

// The selected job's step series, extended by each poll (?after=last step seen).
const series = {step: [], loss: [], tokens_per_second: [], step_seconds: []};
const validation = {step: [], loss: []};
let lastStep = 0;  // step numbers start at 1
let timelineStep = null;
let jobEnded = false;
let refreshes = 0;

function el(tag, attrs, text) {
  const e = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs || {})) e.setAttribute(k, v);
  if (text !== undefined && text !== null) e.textContent = String(text);
  return e;
}

function svgEl(tag, attrs) {
  const e = document.createElementNS(SVG_NS, tag);
  for (const [k, v] of Object.entries(attrs || {})) e.setAttribute(k, String(v));
  return e;
}

function fmt(v, digits) {
  if (v === null || v === undefined || !Number.isFinite(v)) return '-';
  return v.toFixed(digits === undefined ? 3 : digits);
}

function fmtRate(v) {
  if (!Number.isFinite(v)) return '-';
  if (v >= 1e6) return (v / 1e6).toFixed(2) + 'M';
  if (v >= 1e3) return (v / 1e3).toFixed(1) + 'k';
  return v.toFixed(0);
}

function fmtSeconds(s) {
  if (!Number.isFinite(s)) return '-';
  return s < 1 ? (1000 * s).toFixed(1) + ' ms' : s.toFixed(2) + ' s';
}

function fmtBytes(b) {
  if (!Number.isFinite(b)) return '-';
  const units = ['B', 'KiB', 'MiB', 'GiB', 'TiB'];
  let i = 0;
  while (b >= 1024 && i < units.length - 1) {
    b /= 1024;
    i++;
  }
  return (i === 0 ? b.toFixed(0) : b.toFixed(1)) + ' ' + units[i];
}

function fmtPercent(r) { return Number.isFinite(r) ? (100 * r).toFixed(1) + '%' : '-'; }

async function getJson(path) {
  const r = await fetch(path, {cache: 'no-store'});
  if (!r.ok) throw new Error(path + ': ' + r.status + ' ' + (await r.text()).trim());
  return r.json();
}

function stateBadge(state) { return el('span', {class: 'state ' + state}, state); }

function renderJobs(jobs) {
  const body = document.querySelector('#jobs tbody');
  body.replaceChildren();
  document.getElementById('no-jobs').hidden = jobs.length > 0;
  for (const j of jobs.slice().reverse()) {
    const tr = el('tr', {'data-job-id': j.id, class: j.id === jobId ? 'selected' : ''});
    const link = el('a', {href: '/jobs/' + j.id}, j.id);
    const cells = [link, j.name, stateBadge(j.state), j.steps_done + ' / ' + j.total_steps,
                   j.has_loss ? fmt(j.last_loss) : '-', j.has_val_loss ? fmt(j.last_val_loss) : '-',
                   j.schedule, j.stages];
    for (const c of cells) {
      const td = el('td');
      if (c instanceof Node) td.appendChild(c); else td.textContent = String(c);
      tr.appendChild(td);
    }
    body.appendChild(tr);
  }
}

function renderWorkers(workers) {
  const body = document.querySelector('#workers tbody');
  body.replaceChildren();
  let up = 0;
  for (const w of workers) {
    if (w.state !== 'LOST') up++;
    const tr = el('tr', {'data-worker-id': w.id});
    const cells = [w.id, w.address, w.device + ' x' + w.threads, stateBadge(w.state),
                   w.job_id || '-', w.stage >= 0 && w.job_id ? w.stage : '-',
                   fmt(w.heartbeat_age_seconds, 1) + ' s ago', w.version];
    for (const c of cells) {
      const td = el('td');
      if (c instanceof Node) td.appendChild(c); else td.textContent = String(c);
      tr.appendChild(td);
    }
    body.appendChild(tr);
  }
  document.getElementById('summary').textContent = up + ' of ' + workers.length + ' workers up';
}

// A line chart of `lines` ([{xs, ys, cls, dots}]) into the SVG `svg` (viewBox 560 x 240);
// with `fromZero` the y axis starts at 0.
function drawChart(svg, lines, yLabel, fromZero) {
  svg.replaceChildren();
  const W = 560, H = 240, L = 56, R = 12, T = 12, B = 28;
  const xs = lines.flatMap(l => l.xs);
  const ys = lines.flatMap(l => l.ys).filter(Number.isFinite);
  if (xs.length === 0 || ys.length === 0) {
    const t = svgEl('text', {x: W / 2, y: H / 2, 'text-anchor': 'middle'});
    t.textContent = 'no steps yet';
    svg.appendChild(t);
    return;
  }
  let x0 = Math.min(...xs), x1 = Math.max(...xs);
  let y0 = Math.min(...ys), y1 = Math.max(...ys);
  if (x1 === x0) x1 = x0 + 1;
  if (y1 === y0) { y0 -= 0.5; y1 += 0.5; }
  const pad = 0.05 * (y1 - y0);
  y0 = fromZero && y0 >= 0 ? 0 : y0 - pad;
  y1 += pad;
  const px = x => L + (x - x0) / (x1 - x0) * (W - L - R);
  const py = y => T + (1 - (y - y0) / (y1 - y0)) * (H - T - B);
  for (let i = 0; i <= 4; i++) {
    const y = y0 + (y1 - y0) * i / 4;
    svg.appendChild(svgEl('line', {class: 'grid', x1: L, x2: W - R, y1: py(y), y2: py(y)}));
    const t = svgEl('text', {x: L - 6, y: py(y) + 4, 'text-anchor': 'end'});
    t.textContent = yLabel(y);
    svg.appendChild(t);
  }
  svg.appendChild(svgEl('line', {class: 'axis', x1: L, x2: W - R, y1: H - B, y2: H - B}));
  for (const x of [x0, x1]) {
    const t = svgEl('text', {x: px(x), y: H - 8, 'text-anchor': x === x0 ? 'start' : 'end'});
    t.textContent = 'step ' + Math.round(x);
    svg.appendChild(t);
  }
  for (const l of lines) {
    const pts = [];
    for (let i = 0; i < l.xs.length; i++) {
      if (Number.isFinite(l.ys[i])) pts.push(px(l.xs[i]).toFixed(1) + ',' + py(l.ys[i]).toFixed(1));
    }
    svg.appendChild(svgEl('polyline', {class: 'series ' + l.cls, points: pts.join(' '),
                                       'data-points': pts.length}));
    if (l.dots) {
      for (let i = 0; i < l.xs.length; i++) {
        if (Number.isFinite(l.ys[i])) {
          svg.appendChild(svgEl('circle', {class: l.cls, cx: px(l.xs[i]), cy: py(l.ys[i]), r: 3}));
        }
      }
    }
  }
}

function stat(dl, label, value) {
  const d = el('div');
  d.appendChild(el('dt', {}, label));
  d.appendChild(el('dd', {}, value));
  dl.appendChild(d);
}

function renderJob(data) {
  const j = data.job;
  document.getElementById('job').hidden = false;
  document.getElementById('job').setAttribute('data-job-id', j.id);
  document.getElementById('job-title').textContent = j.id + ' ' + j.name;
  const badge = document.getElementById('job-state');
  badge.textContent = j.state;
  badge.className = 'state ' + j.state;
  document.getElementById('job-reason').textContent = j.reason || j.plan || '';
  const done = j.total_steps > 0 ? Math.min(1, j.steps_done / j.total_steps) : 0;
  document.querySelector('#job-progress .bar').style.width = (100 * done).toFixed(1) + '%';

  const last = data.last_step;
  const dl = document.getElementById('job-stats');
  dl.replaceChildren();
  stat(dl, 'step', j.steps_done + ' / ' + j.total_steps);
  stat(dl, 'loss', j.has_loss ? fmt(j.last_loss) : '-');
  stat(dl, 'validation loss', j.has_val_loss ? fmt(j.last_val_loss) : '-');
  stat(dl, 'tokens/s', last ? fmtRate(last.tokens_per_second) : '-');
  stat(dl, 'step time', last ? fmtSeconds(last.step_seconds) : '-');
  if (j.predicted_step_seconds > 0) {
    // The plan's prediction from the profile, against the steady steps' median where the
    // coordinator has checked it (with whose miss a miss is), else against the latest step.
    const check = j.prediction_check;
    stat(dl, 'step time predicted', fmtSeconds(j.predicted_step_seconds) +
         (check ? ' (measured x' + check.ratio.toFixed(2) + ')'
                : last ? ' (latest x' + (last.step_seconds / j.predicted_step_seconds).toFixed(2) + ')'
                       : ''));
    if (check) stat(dl, 'against the prediction', check.summary);
  }
  stat(dl, 'bubble measured', last ? fmtPercent(last.bubble_measured) : '-');
  stat(dl, 'bubble predicted', last ? fmtPercent(last.bubble_predicted) : '-');
  stat(dl, 'bubble ideal', fmtPercent(j.bubble_fraction_ideal));
  if (j.restarts > 0 || j.resizes > 0) {
    stat(dl, 'recovery', j.restarts + ' restart(s), ' + j.resizes + ' resize(s), ' +
         j.steps_redone + ' step(s) redone, ' + j.peer_recoveries + ' from kept state');
  }
  if (j.checkpoint_failures > 0) {
    stat(dl, 'checkpoints not stored', j.checkpoint_failures + '; the latest: ' +
         j.last_checkpoint_failure);
  }
  stat(dl, 'schedule', j.schedule + ', ' + j.stages + ' stages' +
       (j.replicas > 1 ? ' x ' + j.replicas + ' replicas' : '') + ', ' +
       (j.replicas > 1 ? j.replicas + ' x ' : '') + j.micro_batches + ' x ' + j.micro_batch_size);

  const s = data.series;
  for (let i = 0; i < s.step.length; i++) {
    if (s.step[i] <= lastStep) continue;
    for (const k of Object.keys(series)) series[k].push(s[k][i]);
    lastStep = s.step[i];
  }
  for (let i = 0; i < data.validation.step.length; i++) {
    const st = data.validation.step[i];
    if (validation.step.length && st <= validation.step[validation.step.length - 1]) continue;
    validation.step.push(st);
    validation.loss.push(data.validation.loss[i]);
  }
  drawChart(document.getElementById('loss-chart'), [
    {xs: series.step, ys: series.loss, cls: 'loss'},
    {xs: validation.step, ys: validation.loss, cls: 'val-loss', dots: true},
  ], y => y.toFixed(2));
  drawChart(document.getElementById('throughput-chart'),
            [{xs: series.step, ys: series.tokens_per_second, cls: 'throughput'}], fmtRate,
            true);

  const body = document.querySelector('#stages tbody');
  body.replaceChildren();
  for (const st of data.stages) {
    const tr = el('tr', {class: 'stage', 'data-stage': st.stage});
    const util = svgEl('svg', {class: 'util', viewBox: '0 0 100 12', preserveAspectRatio: 'none',
                               width: '100%', height: 12});
    const u = Number.isFinite(st.utilisation) ? Math.max(0, Math.min(1, st.utilisation)) : 0;
    util.appendChild(svgEl('rect', {x: 0, y: 0, width: (100 * u).toFixed(1), height: 12}));
    const utilCell = el('td');
    utilCell.appendChild(util);
    utilCell.appendChild(el('span', {class: 'muted'}, fmtPercent(st.utilisation)));
    // The grid's row: the stage's worker in every replica (one worker without replicas).
    const workers = st.replicas && st.replicas.length > 1
        ? st.replicas.map(w => 'r' + w.replica + ': ' + w.worker_id + ' ' + w.address).join('; ')
        : st.worker_id + ' ' + st.address;
    const cells = [st.stage, workers,
                   st.layer_begin + '..' + (st.layer_end - 1), fmtSeconds(st.busy_seconds),
                   fmtSeconds(st.microbatch_seconds),
                   st.predicted_microbatch_seconds > 0 ? fmtSeconds(st.predicted_microbatch_seconds)
                                                       : '-',
                   fmtBytes(st.peak_bytes)];
    for (const c of cells) tr.appendChild(el('td', {class: 'num'}, c));
    tr.appendChild(utilCell);
    body.appendChild(tr);
  }
  jobEnded = ['SUCCEEDED', 'FAILED', 'CANCELLED'].includes(j.state);
}

// Parses an SVG document and keeps only inert drawing: no scripts, no foreign content, no
// event handlers or links.
function inertSvg(text) {
  const doc = new DOMParser().parseFromString(text, 'image/svg+xml');
  const root = doc.documentElement;
  if (root.nodeName !== 'svg') return null;
  for (const bad of root.querySelectorAll('script, foreignObject, iframe, a, use, image')) {
    bad.remove();
  }
  for (const node of [root, ...root.querySelectorAll('*')]) {
    for (const attr of [...node.attributes]) {
      const name = attr.name.toLowerCase();
      if (name.startsWith('on') || name.includes('href')) node.removeAttribute(attr.name);
    }
  }
  return document.importNode(root, true);
}

async function refreshTimeline() {
  if (lastStep < 0 || timelineStep === lastStep) return;
  const r = await fetch('/api/jobs/' + jobId + '/trace.svg', {cache: 'no-store'});
  if (!r.ok) return;  // no step kept yet
  const svg = inertSvg(await r.text());
  if (!svg) return;
  const box = document.getElementById('timeline');
  box.replaceChildren(svg);
  const step = Number(r.headers.get('X-Tandem-Step'));
  box.setAttribute('data-step', String(step));
  box.setAttribute('data-rows', String(svg.querySelectorAll('g.row').length));
  document.getElementById('timeline-step').textContent = 'step ' + step;
  timelineStep = lastStep;
}

async function refresh() {
  const error = document.getElementById('error');
  try {
    const [jobs, workers] = await Promise.all([getJson('/api/jobs'), getJson('/api/workers')]);
    renderJobs(jobs.jobs);
    renderWorkers(workers.workers);
    if (jobId && !(jobEnded && timelineStep === lastStep)) {
      renderJob(await getJson('/api/jobs/' + jobId + '?after=' + lastStep));
      await refreshTimeline();
    }
    error.hidden = true;
    refreshes++;
    document.body.setAttribute('data-refreshes', String(refreshes));
    document.body.setAttribute('data-last-step', String(lastStep));
    document.getElementById('updated').textContent =
        'updated ' + new Date().toLocaleTimeString();
  } catch (e) {
    error.textContent = String(e.message || e);
    error.hidden = false;
  }
  setTimeout(refresh, POLL_MS);
}

refresh();
