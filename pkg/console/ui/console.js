// ratelimitd ops console. Vanilla JavaScript, no framework, no build step.
//
// Everything shown comes from requests or rule files, and descriptor
// values are chosen by whoever sends traffic: it is only ever put in the
// page as text (textContent, text nodes, input values), never parsed as
// markup. The server's Content-Security-Policy forbids inline scripts
// besides.
'use strict';

(() => {
  const POLL_MS = 1000;
  const $ = (id) => document.getElementById(id);

  // el builds an element: el('td', {className: 'num'}, 'text', child...).
  // Strings become text nodes; props are set as properties (className,
  // title, type, dataset entries via data: {...}), never as HTML.
  function el(tag, props, ...children) {
    const e = document.createElement(tag);
    for (const [k, v] of Object.entries(props || {})) {
      if (k === 'data') Object.assign(e.dataset, v);
      else if (k === 'onclick') e.addEventListener('click', v);
      else e[k] = v;
    }
    for (const c of children) {
      if (c === null || c === undefined || c === false) continue;
      e.append(typeof c === 'string' || typeof c === 'number' ? document.createTextNode(String(c)) : c);
    }
    return e;
  }

  const num = (n) => Math.round(n).toLocaleString('en-US');
  const rate = (n) => (n >= 100 ? Math.round(n).toLocaleString('en-US') : n >= 10 ? n.toFixed(1) : n.toFixed(2));
  // dur turns a protojson duration ("41.918309s") into words: "41.9 s".
  const dur = (d) => {
    const s = parseFloat(d);
    if (!d || Number.isNaN(s)) return '–';
    if (s === 0) return 'now';
    if (s < 1) return `${Math.max(1, Math.round(s * 1000))} ms`;
    if (s < 60) return `${s.toFixed(1)} s`;
    if (s < 3600) return `${Math.floor(s / 60)} min ${Math.round(s % 60)} s`;
    if (s < 86400) return `${Math.floor(s / 3600)} h ${Math.round((s % 3600) / 60)} min`;
    return `${Math.floor(s / 86400)} d ${Math.round((s % 86400) / 3600)} h`;
  };
  const ms = (n) => (n === 0 ? '–' : n < 1 ? `≤ ${n.toFixed(3)} ms` : `≤ ${n.toFixed(0)} ms`);

  // entryChip shows one descriptor entry, key and value as text.
  function entryChip(e) {
    return el('span', {className: 'entry'},
      el('span', {className: 'key'}, e.key), '=',
      el('span', {className: 'value'}, e.value === '' ? '""' : e.value));
  }

  function notice(text, isError) {
    const n = $('notice');
    n.textContent = text;
    n.className = isError ? 'notice error' : 'notice';
    n.hidden = false;
    clearTimeout(notice.timer);
    notice.timer = setTimeout(() => { n.hidden = true; }, 8000);
  }

  async function getJSON(url) {
    const r = await fetch(url, {cache: 'no-store', headers: {Accept: 'application/json'}});
    if (!r.ok) throw new Error(`${url}: HTTP ${r.status}`);
    return r.json();
  }

  // postJSON posts body and resolves to {ok, status, body}; body is the
  // answer's JSON, or {error} when it is not JSON.
  async function postJSON(url, body) {
    const r = await fetch(url, {
      method: 'POST', cache: 'no-store',
      headers: {'Content-Type': 'application/json', Accept: 'application/json'},
      body: JSON.stringify(body),
    });
    let out;
    try { out = await r.json(); } catch (e) { out = {error: `HTTP ${r.status}`}; }
    return {ok: r.ok, status: r.status, body: out};
  }

  // ---- state: header, backend, traffic, top keys -------------------------

  let state = null;
  let rulesHash = null;
  let lastTop = '';
  let lastTraffic = '';

  function renderMeta(s) {
    const m = $('meta');
    const src = s.rules.source || {};
    const parts = [];
    if (s.replica) parts.push(['replica ', el('b', {}, s.replica)]);
    if (s.version) parts.push([s.version]);
    parts.push([el('b', {}, num(s.rules.count)), ` rules in ${num(s.rules.domains)} domains`]);
    if (src.kind === 'xds') {
      parts.push([`from xDS ${src.server} version `, el('b', {}, src.version || '(none)'),
        src.connected ? '' : ' (disconnected)', src.error ? ' · last update rejected' : '']);
    } else if (src.kind === 'file') {
      parts.push(['from ', el('code', {}, src.path)]);
    }
    parts.push(['hash ', el('code', {title: s.rules.hash}, s.rules.hash.slice(0, 12))]);
    if (src.loadedAt) parts.push([`loaded ${new Date(src.loadedAt).toLocaleTimeString('en-GB')}`]);
    const nodes = [];
    parts.forEach((p, i) => { if (i) nodes.push(' · '); nodes.push(...p.filter((x) => x !== '')); });
    m.replaceChildren(...nodes);
  }

  function badge(text, kind) { return el('span', {className: `badge ${kind || ''}`}, text); }

  function renderBackend(s) {
    const b = s.backend;
    const rows = [];
    const add = (k, ...v) => rows.push(el('dt', {}, k), el('dd', {}, ...v));
    if (b.kind === 'redis' && b.redis) {
      const r = b.redis;
      add('backend', badge('redis'), ` ${r.mode} `, el('code', {}, r.url),
        r.master ? ` master ${r.master}` : '', r.mode === 'cluster' ? ` · hash tag ${r.hashTag}` : '');
      add('redis', `prefix `, el('code', {}, r.prefix), ` · ${r.lua} · ${r.clock} clock · ${r.keyFormat} keys`);
    } else {
      add('backend', badge(b.kind || 'unknown'), b.memory
        ? ` ${num(b.memory.keys)} keys of ${num(b.memory.maxKeys)} · ${num(b.memory.evictions)} evicted`
        : '');
    }
    if (b.circuit) {
      const c = b.circuit;
      const kind = c.state === 'closed' ? 'good' : c.state === 'open' ? 'bad' : 'warn';
      add('circuit', badge(c.state, kind),
        ` ${num(c.opens)} opens · ${num(c.errors)} errors (${num(c.timeouts)} timeouts) · ${num(c.rejected)} rejected while open`);
    }
    const calls = b.calls;
    const errKind = calls.errorsPerSecond > 0 ? 'bad' : 'good';
    add('calls', `${rate(calls.perSecond)}/s · `, badge(`${rate(calls.errorsPerSecond)} errors/s`, errKind),
      ` · ${num(calls.total)} in all`);
    add('latency', `p50 ${ms(calls.p50Ms)} · p99 ${ms(calls.p99Ms)} · max ${ms(calls.maxMs)}`);
    const fm = b.failureModes || {};
    const degraded = Object.entries(fm).filter(([, n]) => n > 0).map(([m, n]) => `${m} ${num(n)}`);
    add('failure mode', el('code', {}, b.failureMode || 'open'),
      degraded.length ? ` · decided by failure mode: ${degraded.join(', ')}` : ' · no decision by failure mode');
    if (b.localCache) {
      add('local cache', `${num(b.localCache.keys)} keys · ${num(b.localCache.hits)} hits · ${num(b.localCache.misses)} misses`);
    }
    if (b.leases) {
      const l = b.leases;
      add('leases', `${num(l.keys)} keys · ${num(l.held)} hits held · ${num(l.local)} decided locally · ${num(l.backend)} at the backend`,
        l.stranded ? badge(`${num(l.stranded)} stranded`, 'warn') : '');
    }
    if (b.region) {
      const r = b.region;
      const peers = r.peers.map((p) => el('span', {className: 'peer'},
        badge(p.name, p.cutOff ? 'bad' : 'good'), ` ${p.addr} heard ${p.unheard === 'never' ? 'never' : p.unheard + ' ago'} `));
      add('region', el('b', {}, r.name), ` · ${num(r.keys)} global keys · ${num(r.pushes)} pushes (${num(r.pushFailures)} failed) · ${num(r.received)} received`);
      if (peers.length) add('peers', ...peers);
    }
    $('backend').replaceChildren(...rows);
  }

  function ruleLabel(t) { return t.rule || `${t.domain}: limit overrides`; }

  // breakable shows a rule ID that may wrap after each dot.
  function breakable(id) {
    const c = el('code', {className: 'rule-name', title: id});
    id.split('.').forEach((part, i) => {
      if (i) c.append('.', el('wbr'));
      c.append(part);
    });
    return c;
  }

  function renderTraffic(s) {
    const t = s.traffic;
    $('traffic-window').textContent = t.rateSeconds > 0
      ? `per second over the last ${t.rateSeconds.toFixed(0)} s · descriptors decided, this replica`
      : 'rates from the next update';
    const key = JSON.stringify(t);
    if (key === lastTraffic) return;
    lastTraffic = key;
    $('traffic-empty').hidden = t.rules.length > 0;
    const rows = t.rules.map((r) => {
      const rt = r.rate || {ok: 0, near: 0, over: 0, shadow: 0, unlimited: 0};
      const total = r.total.ok + r.total.near + r.total.over + r.total.shadow + r.total.unlimited;
      const sum = rt.ok + rt.near + rt.over + rt.shadow + rt.unlimited;
      const bar = el('div', {className: 'bar', title: 'ok · near · over · shadow · unlimited, per second'});
      if (sum > 0) {
        for (const k of ['ok', 'near', 'over', 'shadow', 'unlimited']) {
          if (rt[k] > 0) {
            const seg = el('span', {className: k});
            seg.style.width = `${(100 * rt[k] / sum).toFixed(2)}%`; // CSSOM, allowed by the CSP
            bar.append(seg);
          }
        }
      }
      const cell = (cls, text) => el('td', {className: `num ${cls}`}, text);
      return el('tr', {data: {rule: r.rule, domain: r.domain}},
        el('td', {}, breakable(ruleLabel(r)), r.loaded ? '' : el('span', {className: 'muted'}, ' (no longer loaded)')),
        cell('ok', r.rate ? rate(rt.ok + rt.unlimited) : '…'),
        cell('near', r.rate ? rate(rt.near) : '…'),
        cell(`over${rt.over > 0 ? ' hot' : ''}`, r.rate ? rate(rt.over) : '…'),
        cell('shadow', r.rate ? rate(rt.shadow) : '…'),
        cell('total', num(total)),
        cell('refused', num(r.total.over)),
        el('td', {}, bar));
    });
    $('traffic').tBodies[0].replaceChildren(...rows);
  }

  function renderTop(s) {
    const t = s.topKeys;
    $('top-window').textContent = `refused most over the last ${t.windowSeconds.toFixed(0)} s · this replica`;
    let note = '';
    if (t.refused > 0 && t.maxError === 0) {
      note = `${num(t.refused)} refusals in the window, counted exactly (fewer distinct descriptors than the sketch's ${t.counters} counters per 10 s).`;
    } else if (t.refused > 0) {
      note = `${num(t.refused)} refusals in the window. Counts come from a Space-Saving sketch of ${t.counters} counters per 10 s: ` +
        `each is at most ${num(t.maxError)} too high (never more than 1/${t.counters} of the refusals), ` +
        `and a descriptor refused more than that is never missed.`;
    }
    $('top-note').textContent = note;
    const key = JSON.stringify([t.keys, s.resetEnabled]);
    // Rows are rebuilt when the counts change: not under the pointer, where
    // a rebuild would swallow a click on its buttons.
    if (key === lastTop || $('top').matches(':hover')) return;
    lastTop = key;
    $('top-empty').hidden = t.keys.length > 0;
    const rows = t.keys.map((k) => {
      const desc = el('td', {className: 'desc'}, ...k.entries.map(entryChip), k.cut ? el('span', {className: 'cut', title: 'cut: too long to keep whole'}, '…') : '');
      const actions = el('p', {className: 'buttons'},
        el('button', {type: 'button', className: 'small explain', onclick: () => explainKey(k)}, 'explain'));
      if (s.resetEnabled && k.rule && !k.cut) {
        actions.append(el('button', {type: 'button', className: 'small reset', onclick: () => confirmReset(k.domain, k.entries, k.rule)}, 'reset'));
      }
      const count = el('td', {className: 'num count'}, num(k.count));
      if (k.err > 0) count.title = `between ${num(k.count - k.err)} and ${num(k.count)}`;
      return el('tr', {},
        el('td', {className: 'domain'}, k.domain),
        desc,
        el('td', {}, k.rule ? breakable(k.rule) : el('span', {className: 'muted'}, '(own limit)')),
        count,
        el('td', {}, actions));
    });
    $('top').tBodies[0].replaceChildren(...rows);
  }

  async function poll() {
    const st = $('status');
    try {
      const s = await getJSON('api/state');
      state = s;
      renderMeta(s);
      renderBackend(s);
      renderTraffic(s);
      renderTop(s);
      if (s.rules.hash !== rulesHash) await loadRules();
      st.className = 'status live';
      st.textContent = `live · ${new Date(s.now).toLocaleTimeString('en-GB')}`;
      st.dataset.polls = String(Number(st.dataset.polls || 0) + 1);
    } catch (e) {
      st.className = 'status down';
      st.textContent = `disconnected: ${e.message}`;
    } finally {
      setTimeout(poll, POLL_MS);
    }
  }

  // ---- rules ----------------------------------------------------------

  function pathText(path) {
    return path.map((p) => (p.value === undefined || p.value === '' ? `${p.key}=*` : `${p.key}=${p.value}`)).join(' / ');
  }

  async function loadRules() {
    const list = await getJSON('api/rules');
    rulesHash = list.hash;
    const rows = list.rules.map((r) => {
      const algos = [...new Set(r.limits.map((l) => l.algorithm))].join(', ');
      let limit = r.limits.map((l) => l.text + (l.burst ? ` (burst ${l.burst})` : '') +
        (l.consistency === 'leased' ? ', leased' : '') + (l.scope === 'global' ? ', global' : '')).join(' and ');
      if (r.unlimited) limit = 'unlimited';
      if (r.concurrency) limit = limit ? `${limit}; ${r.concurrency}` : r.concurrency;
      let source = `${r.file}:${r.line}`;
      if (list.source && list.source.kind === 'xds') source = `xDS ${r.file}:${r.line} (version ${list.source.version})`;
      const tr = el('tr', {data: {rule: r.id}},
        el('td', {className: 'domain'}, r.domain),
        el('td', {}, el('code', {title: r.id}, pathText(r.path)), r.name ? el('span', {className: 'muted'}, ` ${r.name}`) : ''),
        el('td', {}, algos || '–'),
        el('td', {}, limit),
        el('td', {}, r.shadow ? badge('shadow', 'shadow') : ''),
        el('td', {className: 'mono'}, source));
      tr.dataset.search = [r.domain, r.id, r.name, pathText(r.path), algos, limit, source, r.shadow ? 'shadow' : ''].join(' ').toLowerCase();
      return tr;
    });
    $('rules').tBodies[0].replaceChildren(...rows);
    filterRules();
  }

  function filterRules() {
    const words = $('rules-filter').value.toLowerCase().split(/\s+/).filter(Boolean);
    const rows = [...$('rules').tBodies[0].rows];
    let shown = 0;
    for (const tr of rows) {
      tr.hidden = !words.every((w) => tr.dataset.search.includes(w));
      if (!tr.hidden) shown++;
    }
    $('rules-count').textContent = words.length ? `${shown} of ${rows.length}` : `${rows.length}`;
  }

  // ---- explain ----------------------------------------------------------

  function entryRow(key, value) {
    const row = el('div', {className: 'row'},
      el('input', {className: 'key', placeholder: 'key', value: key || '', ariaLabel: 'entry key'}),
      el('input', {className: 'value', placeholder: 'value', value: value || '', ariaLabel: 'entry value'}));
    row.append(el('button', {type: 'button', className: 'small', title: 'remove this entry', onclick: () => {
      if (row.parentElement.querySelectorAll('.row').length > 1) row.remove();
    }}, '−'));
    return row;
  }

  function descriptorBox(entries) {
    const rows = el('div', {className: 'rows'});
    for (const e of entries && entries.length ? entries : [{key: '', value: ''}]) rows.append(entryRow(e.key, e.value));
    const box = el('div', {className: 'descriptor'},
      el('div', {className: 'head'}, el('span', {}, 'descriptor'),
        el('span', {},
          el('button', {type: 'button', className: 'small', onclick: () => rows.append(entryRow())}, '+ entry'), ' ',
          el('button', {type: 'button', className: 'small', title: 'remove this descriptor', onclick: () => {
            if ($('descriptors').children.length > 1) box.remove();
          }}, '−'))),
      rows);
    return box;
  }

  function readForm() {
    const domain = $('explain-domain').value.trim();
    const descriptors = [...$('descriptors').children].map((box) => ({
      entries: [...box.querySelectorAll('.row')].map((row) => ({
        key: row.querySelector('input.key').value,
        value: row.querySelector('input.value').value,
      })).filter((e) => e.key !== ''),
    }));
    return {domain, descriptors};
  }

  function explainKey(k) {
    $('explain-domain').value = k.domain;
    $('descriptors').replaceChildren(descriptorBox(k.entries));
    $('explain-section').scrollIntoView({behavior: 'smooth', block: 'start'});
    explain();
  }

  async function explain() {
    const out = $('explain-out');
    const req = readForm();
    out.replaceChildren(el('p', {className: 'muted'}, 'explaining…'));
    let ex;
    let peek;
    try {
      // POST /explain is the service's own endpoint, beside /json.
      [ex, peek] = await Promise.all([postJSON('../explain', req), postJSON('api/peek', req)]);
    } catch (e) {
      out.replaceChildren(el('p', {className: 'error'}, `explain failed: ${e.message}`));
      return;
    }
    if (!ex.ok) {
      out.replaceChildren(el('p', {className: 'error'}, `explain: ${ex.body.error || 'HTTP ' + ex.status}`));
      return;
    }
    const e = ex.body;
    const nodes = [];
    if (!e.domainKnown) nodes.push(el('p', {className: 'error'}, `domain "${e.domain}" is not defined by any rule file`));
    else nodes.push(el('p', {className: 'muted'}, `domain ${e.domain} from ${e.domainFile} · failure mode ${e.failureMode} (${e.failureModeFrom})`));
    e.descriptors.forEach((d, i) => {
      const p = peek.ok && peek.body.results ? peek.body.results[i] : null;
      nodes.push(explainResult(d, i, p, peek.ok ? null : peek.body.error, e.domain));
    });
    out.replaceChildren(...nodes);
  }

  function resultKind(r) {
    return {matched: 'good', no_match: '', override: 'warn', replaced: 'warn', unlimited: '', concurrency: 'warn'}[r] || '';
  }

  function explainResult(d, i, p, peekError, domain) {
    const rows = [];
    const add = (k, ...v) => rows.push(el('dt', {}, k), el('dd', {}, ...v));
    if (d.rule) {
      add('rule', el('code', {className: 'rule-id'}, d.rule.id), d.rule.name ? ` named ${d.rule.name}` : '',
        ' at ', el('code', {className: 'rule-file'}, `${d.rule.file}:${d.rule.line}`));
      if (d.rule.limits) {
        add('limit', d.rule.limits.map((l) => `${l.requestsPerUnit} per ${l.unitMultiplier > 1 ? l.unitMultiplier + ' ' : ''}${l.unit.toLowerCase()} (${l.algorithm})`).join(' and '));
      }
    }
    if (d.override) add('own limit', `${d.override.requestsPerUnit} per ${d.override.unit.toLowerCase()}`);
    if (p && (d.result === 'matched' || d.result === 'override')) {
      const over = p.outcome === 'OUTCOME_OVER_LIMIT';
      add('now', badge(over ? 'over the limit' : 'within the limit', over ? (p.shadow ? 'shadow' : 'bad') : 'good'),
        p.shadow && over ? ' (shadow mode: counted, never refused)' : '');
      // A peek answers as if the next request's hits were taken: what
      // remains now is that plus those hits, unless they are refused.
      const remaining = Number(p.remaining) + (over ? 0 : d.hits);
      add('remaining', el('span', {className: 'remaining'}, String(remaining)), ` now · ${over ? 'the next request is refused' : `${Number(p.remaining)} after the next request`}`);
      add('resets in', el('span', {className: 'reset-after', title: p.resetAfter || ''}, dur(p.resetAfter)),
        p.retryAfter && over ? ` · retry after ${dur(p.retryAfter)}` : '', p.retryNever ? ' · no wait ever admits it' : '');
    } else if (peekError) {
      add('now', el('span', {className: 'error'}, `peek: ${peekError}`));
    }
    if (d.keys && d.keys.length) add('counter keys', ...d.keys.map((k) => el('code', {className: 'entry'}, k)));
    const h = el('h3', {},
      el('span', {}, `descriptor ${i + 1}`), ...d.entries.map(entryChip),
      badge(d.result.replace('_', ' '), resultKind(d.result)), d.shadow ? badge('shadow', 'shadow') : '');
    const box = el('div', {className: 'result', data: {result: d.result}}, h, el('dl', {}, ...rows),
      el('ul', {className: 'why'}, ...d.why.map((w) => el('li', {}, w))));
    if (state && state.resetEnabled && d.result === 'matched') {
      box.append(el('p', {className: 'buttons'}, el('button', {type: 'button', className: 'danger small reset',
        onclick: () => confirmReset(domain, d.entries, d.rule.id)}, 'reset counters…')));
    }
    return box;
  }

  // ---- reset ------------------------------------------------------------

  let pendingReset = null;

  function confirmReset(domain, entries, rule) {
    pendingReset = {domain, descriptors: [{entries: entries.map((e) => ({key: e.key, value: e.value}))}]};
    const text = $('confirm-text');
    text.replaceChildren(`Reset every counter of rule `, el('code', {}, rule), ` for `,
      ...entries.map(entryChip), ` in domain `, el('code', {}, domain),
      `? The descriptor's next requests pass as if it had sent none. Other replicas on the same Redis share the counters; `,
      `on the memory backend only this replica's are cleared.`);
    $('confirm').showModal();
  }

  async function doReset() {
    const req = pendingReset;
    pendingReset = null;
    $('confirm').close();
    if (!req) return;
    const r = await postJSON('api/reset', req);
    if (r.ok) notice(`Reset ${r.body.counters} counter(s) of rule ${r.body.rule}.`);
    else notice(`Reset failed: ${r.body.error || 'HTTP ' + r.status}`, true);
  }

  // ---- start --------------------------------------------------------------

  document.addEventListener('DOMContentLoaded', () => {
    $('descriptors').append(descriptorBox());
    $('add-descriptor').addEventListener('click', () => $('descriptors').append(descriptorBox()));
    $('explain-form').addEventListener('submit', (ev) => { ev.preventDefault(); explain(); });
    $('rules-filter').addEventListener('input', filterRules);
    $('confirm-yes').addEventListener('click', doReset);
    $('confirm-no').addEventListener('click', () => { pendingReset = null; $('confirm').close(); });
    poll();
  });
})();
