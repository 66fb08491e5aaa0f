// The parking console's page. Every text that comes from the broker (bodies, headers, errors,
// ids) reaches the page through textContent or an attribute, never as HTML.
'use strict';

(() => {
  const $ = (id) => document.getElementById(id);
  const TOKEN_KEY = 'retryloop-console-token';

  const ui = {
    token: '',
    identity: null,      // {name, role} of the token, from /api/whoami
    server: null,        // the last /api/state
    scanId: null,        // the scan whose messages are listed
    messages: [],
    selected: new Set(), // message ids
    detail: null,        // the message shown in the detail panel
    wanted: null,        // {id, position} of the message last opened
    detailRequest: 0,
    errorLine: null,     // the "error is" condition of the filter form
    busy: false,         // a dialog or an action is under way
    service: null,       // the service shown; null: the console's first
    services: [],        // the console's services, from /api/services
  };

  // The API calls about one service carry its name.
  const PER_SERVICE = /^\/api\/(state|messages|message|scan|replay|purge|count|edit|note|stop)\b/;

  // ---- helpers -------------------------------------------------------------------------------

  function el(tag, props, ...children) {
    const node = document.createElement(tag);
    for (const [key, value] of Object.entries(props || {})) {
      if (value === null || value === undefined) continue;
      if (key === 'class') node.className = value;
      else if (key === 'text') node.textContent = value;
      else if (key === 'onclick') node.addEventListener('click', value);
      else if (key.startsWith('data-') || key === 'title') node.setAttribute(key, value);
      else node[key] = value;
    }
    for (const child of children) {
      if (child !== null && child !== undefined) node.append(child);
    }
    return node;
  }

  function clear(node) {
    while (node.firstChild) node.removeChild(node.firstChild);
  }

  function two(n) {
    return String(n).padStart(2, '0');
  }

  function timeText(seconds) {
    if (seconds === null || seconds === undefined) return '–';
    const d = new Date(seconds * 1000);
    return `${d.getFullYear()}-${two(d.getMonth() + 1)}-${two(d.getDate())} ` +
        `${two(d.getHours())}:${two(d.getMinutes())}:${two(d.getSeconds())}`;
  }

  function ageText(seconds) {
    if (seconds < 60) return `${seconds}s`;
    if (seconds < 3600) return `${Math.floor(seconds / 60)}m`;
    if (seconds < 86400) return `${Math.floor(seconds / 3600)}h${Math.floor(seconds % 3600 / 60)}m`;
    return `${Math.floor(seconds / 86400)}d${Math.floor(seconds % 86400 / 3600)}h`;
  }

  function plural(n, word) {
    return `${n} ${word}${n === 1 ? '' : 's'}`;
  }

  function sizeText(bytes) {
    if (bytes < 1024) return `${bytes} B`;
    if (bytes < 1024 * 1024) return `${(bytes / 1024).toFixed(1)} KiB`;
    return `${(bytes / 1024 / 1024).toFixed(1)} MiB`;
  }

  function notice(text, kind) {
    const box = $('notice');
    box.textContent = text || '';
    box.className = kind || '';
    box.hidden = !text;
  }

  // ---- the API -------------------------------------------------------------------------------

  function readToken() {
    const match = /(?:^#|&)token=([^&]*)/.exec(location.hash);
    if (match) {
      try {
        ui.token = decodeURIComponent(match[1]);
      } catch (e) {
        ui.token = match[1];
      }
      sessionStorage.setItem(TOKEN_KEY, ui.token);
      // The token leaves the address bar (and the history), not the tab.
      history.replaceState(null, '', location.pathname + location.search);
    } else {
      ui.token = sessionStorage.getItem(TOKEN_KEY) || '';
    }
  }

  function askForToken(reason) {
    $('token-panel').hidden = false;
    $('token-reason').textContent = reason || '';
  }

  async function api(method, path, body) {
    if (ui.service !== null && PER_SERVICE.test(path)) {
      path += `${path.includes('?') ? '&' : '?'}service=${encodeURIComponent(ui.service)}`;
    }
    const options = {method, headers: {'X-Retryloop-Token': ui.token}, cache: 'no-store'};
    if (body !== undefined) {
      options.headers['Content-Type'] = 'application/json';
      options.body = JSON.stringify(body);
    }
    const response = await fetch(path, options);
    let data;
    try {
      data = await response.json();
    } catch (e) {
      data = {error: `HTTP ${response.status}`};
    }
    if (response.status === 403 && /token/.test(data.error || '')) askForToken(data.error);
    if (!response.ok) {
      const error = new Error(data.error || `HTTP ${response.status}`);
      error.status = response.status;
      throw error;
    }
    return data;
  }

  // ---- filters -------------------------------------------------------------------------------

  function secondsOf(input) {
    if (!input.value) return undefined;
    const time = new Date(input.value).getTime();
    return Number.isNaN(time) ? undefined : Math.floor(time / 1000);
  }

  function formFilter() {
    const filter = {};
    const from = secondsOf($('f-from'));
    const until = secondsOf($('f-until'));
    if (from !== undefined) filter.parked_from = from;
    if (until !== undefined) filter.parked_until = until;
    if ($('f-reason').value) filter.reasons = [$('f-reason').value];
    if ($('f-error').value.trim()) filter.error_contains = $('f-error').value.trim();
    if ($('f-id').value.trim()) filter.message_ids = [$('f-id').value.trim()];
    if ($('f-key').value.trim()) filter.routing_key = $('f-key').value.trim();
    if (ui.errorLine !== null) filter.error_first_line = ui.errorLine;
    return filter;
  }

  function filterText(filter) {
    const parts = [];
    if (filter.reasons) parts.push(`reason ${filter.reasons.join(' or ')}`);
    if (filter.error_first_line !== undefined) parts.push(`error “${filter.error_first_line}”`);
    if (filter.error_cause !== undefined) parts.push(`cause “${filter.error_cause}”`);
    if (filter.error_contains) parts.push(`error containing “${filter.error_contains}”`);
    if (filter.message_ids) {
      parts.push(filter.message_ids.length === 1 ? `id ${filter.message_ids[0]}`
                                                 : plural(filter.message_ids.length, 'chosen id'));
    }
    if (filter.routing_key !== undefined) parts.push(`routing key ${filter.routing_key}`);
    if (filter.parked_from !== undefined) parts.push(`parked from ${timeText(filter.parked_from)}`);
    if (filter.parked_until !== undefined) {
      parts.push(`${filter.parked_from !== undefined ? '' : 'parked '}until ${timeText(filter.parked_until)}`);
    }
    if (filter.older_than) parts.push(`parked more than ${filter.older_than} ago`);
    return parts.join(', ');
  }

  function setErrorLine(line) {
    ui.errorLine = line;
    $('f-line').textContent = line === null ? '' : line;
    $('f-line-chip').hidden = line === null;
  }

  async function scan(filter) {
    try {
      await api('POST', '/api/scan', {filter});
      notice('');
      schedulePoll(100);
    } catch (e) {
      notice(`Cannot scan: ${e.message}`, 'error');
    }
  }

  // The filter of the counts on screen: every action works on what is shown.
  function shownFilter() {
    return (ui.server && ui.server.scan && ui.server.scan.filter) || {};
  }

  // ---- rendering -----------------------------------------------------------------------------

  // The shared breaker in a few words, and what the badge looks like: closed is fine; open,
  // paused and resuming are not.
  function breakerText(b, migrating) {
    const shown = breakerState(b);
    if (migrating) {
      // topology migrate is making the service's queues again; the instances follow it.
      shown.text += ' · migrating';
      shown.title += `; migration ${migrating.id} at step ${migrating.next_step + 1}` +
          (migrating.holding ? `, the instances consuming ${migrating.holding}` : '');
    }
    return shown;
  }

  function breakerState(b) {
    if (!b) return {text: 'breaker –', title: 'not shared yet: no instance has declared it', cls: ''};
    let text = `breaker ${b.state}`;
    let title = `${b.instances} instance${b.instances === 1 ? '' : 's'} connected`;
    if (b.signal) {
      const age = Math.max(0, Math.floor((Date.now() - b.signal.at_ms) / 1000));
      text += ` ${ageText(age)}`;
      title += `; last signal ${b.signal.kind} from ${b.signal.sender} at ` +
          `${timeText(Math.floor(b.signal.at_ms / 1000))}${b.signal.reason ? `: ${b.signal.reason}` : ''}`;
    }
    return {text, title, cls: b.state === 'closed' ? 'ok' : 'bad'};
  }

  function renderHeader(s) {
    $('service').textContent = s.service;
    $('broker').textContent = `${s.broker} · ${s.queue_type} · queue ${s.parking_queue}`;
    $('input-queue').textContent = s.input_queue;
    $('depth').textContent = s.depth === null ? '–' : String(s.depth);
    $('input-depth').textContent = s.input_depth === null ? '–' : String(s.input_depth);
    const badge = $('connection');
    badge.textContent = s.connected ? 'connected' : 'reconnecting';
    badge.className = `badge ${s.connected ? 'ok' : 'bad'}`;
    badge.title = s.connection_error || '';
    const breaker = breakerText(s.breaker, s.migrating);
    const shown = $('breaker');
    shown.textContent = breaker.text;
    shown.title = s.breaker || s.migrating ? breaker.title : (s.breaker_error || breaker.title);
    shown.className = `badge ${breaker.cls}`;
  }

  function renderScanLine(s) {
    const scanInfo = $('scan-info');
    const progress = $('scan-progress');
    if (!s.scan) {
      scanInfo.textContent = s.scan_error ? `The scan failed: ${s.scan_error}` : 'Reading the parking queue…';
    } else {
      const sc = s.scan;
      const seconds = (sc.duration_ms / 1000).toFixed(sc.duration_ms < 10000 ? 2 : 0);
      let text = `Counts from ${timeText(sc.finished_at)}: read ${sc.scanned} in ${seconds} s`;
      const filter = filterText(sc.filter || {});
      if (filter) text += `; filter: ${filter}`;
      if (s.depth !== null && s.depth !== sc.depth) {
        text += `. The depth changed since (${sc.depth} → ${s.depth}): `;
        if (s.rescan_after_ms > 0) {
          const wait = Math.max(s.rescan_after_ms, 10 * sc.duration_ms);
          text += `counted again after ${timeText(sc.finished_at + Math.ceil(wait / 1000))}, ` +
              'or press Rescan';
        } else {
          text += 'press Rescan to count again';
        }
      }
      if (s.scan_error) text += `. The last scan failed: ${s.scan_error}`;
      scanInfo.textContent = text + '.';
    }
    if (s.scanning && s.scanning.state === 'running') {
      const p = s.scanning.progress;
      progress.textContent = `scanning… ${p.scanned}/${p.total}`;
    } else if (s.scanning) {
      progress.textContent = 'scan queued…';
    } else {
      progress.textContent = '';
    }
  }

  function groupActions(filter, description, count) {
    return el('td', {class: 'actions'},
      el('button', {type: 'button', class: 'show', text: 'Show', title: 'Filter the list to these',
                    onclick: () => showGroup(filter)}),
      el('button', {type: 'button', class: 'replay needs-operator', text: 'Replay…',
                    onclick: () => act('replay', filter, description, count)}),
      el('button', {type: 'button', class: 'purge danger needs-admin', text: 'Purge…',
                    onclick: () => act('purge', filter, description, count)}));
  }

  let groupsShown;  // the scan whose groups the tables show

  function renderGroups(s) {
    // Rebuilt only for a new scan, so that a button is never replaced under the pointer.
    const scanId = s.scan ? s.scan.id : null;
    if (scanId === groupsShown) return;
    groupsShown = scanId;
    const reasons = $('reason-groups').tBodies[0];
    const errors = $('error-groups').tBodies[0];
    const causes = $('cause-groups').tBodies[0];
    clear(reasons);
    clear(errors);
    clear(causes);
    $('more-groups').textContent = '';
    if (!s.scan) return;
    const base = s.scan.filter || {};
    for (const group of s.scan.by_reason) {
      const filter = Object.assign({}, base, {reasons: [group.reason]});
      const description = `${plural(group.count, 'message')} with reason “${group.reason}”`;
      reasons.append(el('tr', {'data-reason': group.reason},
        el('td', {class: 'key', text: group.reason}),
        el('td', {class: 'num count', text: String(group.count)}),
        groupActions(filter, description, group.count)));
    }
    for (const group of s.scan.by_cause || []) {
      const filter = Object.assign({}, base, {error_cause: group.cause});
      const description = `${plural(group.count, 'message')} whose error is of cause “${group.cause}”`;
      const text = el('td', {class: 'key error-text'}, el('div', {text: group.cause}));
      if (group.distinct > 1) {
        text.append(el('div', {class: 'muted', text: `e.g. ${group.example}`}));
      }
      text.append(el('div', {class: 'note'}));
      const actions = groupActions(filter, description, group.count);
      actions.append(el('button', {type: 'button', class: 'note-edit needs-operator', text: 'Note…',
                                   onclick: () => editNote(group.cause)}));
      causes.append(el('tr', {'data-cause': group.cause}, text,
        el('td', {class: 'num distinct', text: String(group.distinct)}),
        el('td', {class: 'num count', text: String(group.count)}),
        actions));
    }
    for (const group of s.scan.by_error) {
      const filter = Object.assign({}, base, {error_first_line: group.error});
      const description = `${plural(group.count, 'message')} whose error is “${group.error}”`;
      errors.append(el('tr', {'data-error': group.error},
        el('td', {class: 'key error-text', text: group.error}),
        el('td', {class: 'num count', text: String(group.count)}),
        groupActions(filter, description, group.count)));
    }
    if (s.scan.more_error_groups > 0) {
      $('more-groups').textContent =
          `${plural(s.scan.more_error_groups, 'more error')} not shown: narrow the filter.`;
    }
    if (s.scan.by_reason.length === 0) {
      reasons.append(el('tr', {}, el('td', {colSpan: 3, class: 'muted', text: 'Nothing parked.'})));
    }
  }

  // The newest note on each cause, from the audit trail; refreshed with every state.
  function renderNotes(s) {
    for (const row of document.querySelectorAll('#cause-groups tbody tr[data-cause]')) {
      const note = (s.notes || {})[row.dataset.cause];
      const box = row.querySelector('.note');
      box.textContent = note && note.note
          ? `note: ${note.note} (${note.who}${note.verified ? '' : ', unverified'}, ${timeText(Math.floor(note.at_ms / 1000))})` : '';
    }
  }

  function renderServices() {
    const many = ui.services.length > 1;
    $('services').hidden = !many;
    const select = $('service-switch');
    select.hidden = !many;
    if (!many) return;
    const shown = ui.service || ui.services[0].service;
    if (select.options.length !== ui.services.length) {
      clear(select);
      for (const s of ui.services) select.append(el('option', {value: s.service, text: s.service}));
    }
    select.value = shown;
    const body = $('service-summary').tBodies[0];
    clear(body);
    for (const s of ui.services) {
      const reasons = s.by_reason === null ? 'not counted yet'
          : Object.entries(s.by_reason).map(([reason, n]) => `${reason} ${n}`).join(', ') || 'nothing parked';
      const breaker = breakerText(s.breaker, s.migrating);
      body.append(el('tr', {'data-service': s.service, class: s.service === shown ? 'shown' : ''},
        el('td', {class: 'key', text: s.service}),
        el('td', {class: 'breaker', title: breaker.title},
           el('span', {class: `badge ${breaker.cls}`, text: breaker.text.replace(/^breaker /, '')})),
        el('td', {class: 'num instances', text: s.breaker ? String(s.breaker.instances) : '–'}),
        el('td', {class: 'num depth', text: s.depth === null ? '–' : String(s.depth)}),
        el('td', {class: 'reasons', text: reasons}),
        el('td', {}, el('button', {type: 'button', class: 'open', text: 'Open',
                                   onclick: () => switchService(s.service)}))));
    }
  }

  function switchService(name) {
    if (name === (ui.service || (ui.services[0] && ui.services[0].service))) return;
    ui.service = name;
    ui.scanId = null;
    ui.messages = [];
    ui.selected.clear();
    groupsShown = undefined;
    closeDetail();
    renderMessages();
    renderServices();
    schedulePoll(0);
  }

  function auditWhat(r) {
    if (r.action === 'note') return `note on “${r.group}”: ${r.note || '(cleared)'}`;
    if (r.action === 'edit') {
      return `message ${r.message_id}` + (r.new_message_id ? ` → ${r.new_message_id}` : '');
    }
    // An audit names the ids an action took, not only how many.
    const filter = Object.assign({}, r.filter || {});
    const ids = filter.message_ids;
    delete filter.message_ids;
    // A long list or text is recorded as its count and digest.
    const digest = (v) => v && typeof v === 'object' && !Array.isArray(v) && 'sha256' in v;
    const digests = [];
    for (const [field, value] of Object.entries(filter)) {
      if (!digest(value)) continue;
      digests.push(`${field}: ${value.count} (sha256 ${value.sha256.slice(0, 12)}…)`);
      delete filter[field];
    }
    let text = filterText(filter);
    if (digest(ids)) {
      text = `${plural(ids.count, 'id')} (sha256 ${ids.sha256.slice(0, 12)}…)` + (text ? `; ${text}` : '');
    } else if (ids) {
      const more = ids.length > 10 ? ` and ${ids.length - 10} more` : '';
      text = `ids ${ids.slice(0, 10).join(', ')}${more}` + (text ? `; ${text}` : '');
    }
    text = [text, ...digests].filter(Boolean).join('; ');
    return text || 'every parked message';
  }

  async function loadAudit() {
    const data = await api('GET', '/api/audit?limit=100');
    const skipped = data.skipped > 0
        ? `; ${plural(data.skipped, 'record')} of the stream skipped, unreadable: ${data.skipped_last}` : '';
    $('audit-where').textContent = data.kept_on
        ? `(kept in the broker's stream ${data.kept_on}${data.error ? `; ${data.error}` : ''}${skipped}` +
          `${data.signed ? '' : '; not signed: start the console with --audit-key'})`
        : '(kept in this console\'s memory only: declare "audit" in the topology file to keep it)';
    const body = $('audit-table').tBodies[0];
    clear(body);
    for (const r of data.records) {
      body.append(el('tr', {'data-action': r.action, 'data-state': r.state, 'data-id': r.id},
        el('td', {class: 'time', text: timeText(Math.floor(r.at_ms / 1000))}),
        el('td', {class: 'who', title: r.verified ? '' : 'no valid signature of the audit key: anyone who may publish to the stream could have written it'},
           r.who, r.verified ? null : ' ', r.verified ? null : el('span', {class: 'badge bad', text: 'unverified'})),
        el('td', {text: r.service}),
        el('td', {class: 'action', text: r.action}),
        el('td', {class: 'what', text: auditWhat(r)}),
        el('td', {class: 'num asked', text: r.asked === null ? '–' : String(r.asked)}),
        el('td', {class: 'num done', text: r.done === null ? '–' : String(r.done)}),
        el('td', {class: 'state', text: r.state + (r.error ? `: ${r.error}` : '')})));
    }
    if (data.records.length === 0) {
      body.append(el('tr', {}, el('td', {colSpan: 8, class: 'muted', text: 'Nothing recorded yet.'})));
    }
  }

  async function editNote(cause) {
    if (ui.busy) return;
    const current = ((ui.server && ui.server.notes) || {})[cause];
    const input = $('confirm-input');
    input.hidden = false;
    input.value = current ? current.note : '';
    try {
      ui.busy = true;
      if (!await confirmDialog(`Note on “${cause}”`, 'Everyone who opens the console sees it; the ' +
                               'audit trail keeps who wrote it. An empty note clears it.', 'Save')) return;
      await api('POST', '/api/note', {group: cause, text: input.value});
      notice('');
      schedulePoll(300);
    } catch (e) {
      notice(`The note was refused: ${e.message}`, 'error');
    } finally {
      input.hidden = true;
      ui.busy = false;
    }
  }

  function jobText(job, s) {
    const p = job.progress;
    const what = filterText(job.filter || {}) || 'every parked message';
    if (job.state === 'queued') return `${job.kind} of ${what}: waiting for the scan to end…`;
    if (job.state === 'running') {
      const verb = {replay: 'moved', purge: 'deleted', count: 'matching'}[job.kind];
      return `${job.kind} of ${what}: read ${p.scanned} of ${p.total}, ${p.moved} ${verb}` +
          (job.kind === 'replay' ? `, ${p.failed} failed` : '') +
          (job.stop_requested ? ' (stopping…)' : '');
    }
    let text;
    if (job.kind === 'edit') {
      text = job.outcome === 'unknown'
          ? `Edit of message ${job.message_id}: the copy may have been sent as ${job.new_message_id}`
          : job.state === 'failed' ? `Edit of message ${job.message_id}`
          : `Edited message ${job.message_id} sent to queue ${job.target} as ${job.new_message_id}` +
            (job.kept_original ? '; the original stays parked' : '; the original left parking');
    } else if (job.kind === 'replay') {
      text = `Replay of ${what}: moved ${plural(p.moved, 'message')} to queue ${job.target}; ` +
          `${p.skipped} stayed in parking; ${p.failed} failed`;
    } else if (job.kind === 'purge') {
      text = `Purge of ${what}: deleted ${plural(p.moved, 'message')}; ${p.skipped} stayed`;
    } else {
      text = `Count of ${what}: ${plural(p.moved, 'message')} match`;
    }
    if (job.interrupted) text += ' (stopped)';
    if (job.state === 'failed') text += `. It failed: ${job.error}`;
    return text + '.';
  }

  function renderJob(s) {
    const box = $('job');
    const job = s.job;
    if (!job || job.kind === 'count' && job.state === 'done') {
      box.hidden = true;
      return;
    }
    box.hidden = false;
    box.className = job.state;
    box.dataset.state = job.state;
    box.dataset.kind = job.kind;
    box.dataset.id = String(job.id);
    $('job-text').textContent = jobText(job, s);
    const bar = $('job-progress');
    bar.hidden = job.state !== 'running';
    bar.max = Math.max(job.progress.total, 1);
    bar.value = job.progress.scanned;
    $('job-stop').hidden = !(job.state === 'running' && job.kind === 'replay') || job.stop_requested;
  }

  function renderBulk(s) {
    const busy = !s.connected || (s.job && (s.job.state === 'running' || s.job.state === 'queued'));
    const matched = s.scan ? s.scan.matched : 0;
    $('matched-info').textContent = s.scan
        ? `${plural(matched, 'message')} match${matched === 1 ? 'es' : ''} (of ${s.scan.scanned} read)`
        : '';
    $('replay-matching').disabled = busy || !s.scan || matched === 0;
    $('purge-matching').disabled = busy || !s.scan || matched === 0;
    $('replay-selected').disabled = busy || ui.selected.size === 0;
    $('purge-selected').disabled = busy || ui.selected.size === 0;
    $('replay-selected').textContent = `Replay ${ui.selected.size} selected…`;
    $('purge-selected').textContent = `Purge ${ui.selected.size} selected…`;
    for (const button of document.querySelectorAll('#groups button.replay, #groups button.purge')) {
      button.disabled = busy;
    }
  }

  function renderMessages() {
    const body = $('messages').tBodies[0];
    clear(body);
    const now = ui.server ? ui.server.now : Math.floor(Date.now() / 1000);
    const ids = new Set(ui.messages.map((m) => m.message_id).filter((id) => id));
    for (const id of [...ui.selected]) {
      if (!ids.has(id)) ui.selected.delete(id);
    }
    for (const m of ui.messages) {
      const box = el('input', {type: 'checkbox', disabled: !m.message_id,
                               checked: ui.selected.has(m.message_id),
                               title: m.message_id ? 'Select' : 'No message id: act on it through a group'});
      box.addEventListener('click', (event) => {
        event.stopPropagation();
        if (box.checked) ui.selected.add(m.message_id); else ui.selected.delete(m.message_id);
        if (ui.server) renderBulk(ui.server);
      });
      const age = m.parked_at !== null && m.parked_at <= now ? `${ageText(now - m.parked_at)} ago` : '';
      const row = el('tr', {'data-index': String(m.index), 'data-id': m.message_id, class: 'message'},
        el('td', {}, box),
        el('td', {class: 'num', text: String(m.position + 1)}),
        el('td', {class: 'id', text: m.message_id || '(none)'}),
        el('td', {class: 'time'}, timeText(m.parked_at), el('span', {class: 'muted', text: age})),
        el('td', {text: m.reason || '(none)'}),
        el('td', {class: 'num', text: m.attempts === null ? '–' : String(m.attempts)}),
        el('td', {class: 'error-text', text: m.error || '–'}),
        el('td', {text: m.routing_key || '–'}),
        el('td', {class: 'num', text: sizeText(m.size)}),
        el('td', {class: 'preview', text: m.preview === null ? '(binary)' : m.preview}));
      row.addEventListener('click', () => openDetail(m.index));
      body.append(row);
    }
    const s = ui.server;
    let note = '';
    if (s && s.scan) {
      if (s.scan.matched > ui.messages.length) {
        note = `Showing the first ${ui.messages.length} of ${s.scan.matched} matching messages: ` +
            'narrow the filter to see others. Actions on a group or on all matching take them all.';
      } else if (ui.messages.length === 0) {
        note = 'No parked message matches.';
      }
    }
    $('list-note').textContent = note;
    $('select-all').checked = ui.messages.length > 0 &&
        ui.messages.every((m) => !m.message_id || ui.selected.has(m.message_id));
  }

  function render(s) {
    ui.server = s;
    renderHeader(s);
    renderScanLine(s);
    renderGroups(s);
    renderNotes(s);
    renderJob(s);
    renderBulk(s);
  }

  async function loadMessages() {
    const service = ui.service;
    const data = await api('GET', '/api/messages');
    // Switched meanwhile: the answer lists another service's scan, whose id may be the one the
    // new service's scan will have.
    if (ui.service !== service) return;
    ui.scanId = data.scan;
    ui.messages = data.messages;
    renderMessages();
    if (ui.server) renderBulk(ui.server);
    if (ui.detail && ui.detail.scan !== ui.scanId) reopenDetail();
  }

  // ---- the detail panel ----------------------------------------------------------------------

  function valueText(value) {
    if (value !== null && typeof value === 'object') return JSON.stringify(value, null, 1);
    return String(value);
  }

  function fillTable(table, entries) {
    const body = table.tBodies[0];
    clear(body);
    for (const [key, value] of entries) {
      body.append(el('tr', {'data-key': key},
        el('th', {text: key}), el('td', {}, el('pre', {text: valueText(value)}))));
    }
    if (entries.length === 0) body.append(el('tr', {}, el('td', {class: 'muted', text: 'none'})));
  }

  // The message's retryloop-history as a timeline, oldest first.
  function fillHistory(history) {
    const list = $('detail-history');
    clear(list);
    const entries = history ? history.entries : [];
    for (const entry of entries) {
      const what = [];
      if (entry.attempt) {
        what.push(entry.outcome === 'replayed' || entry.outcome === 'edited'
          ? `after ${plural(entry.attempt, 'attempt')}` : `attempt ${entry.attempt}`);
      }
      if (entry.via) what.push(`via ${entry.via}`);
      if (entry.reason) what.push(entry.reason);
      if (entry.delay_ms !== undefined) what.push(`waits ${entry.delay_ms} ms`);
      if (entry.by) what.push(`by ${entry.by}`);
      else if (entry.consumer) what.push(`on ${entry.consumer}`);
      list.append(el('li', {class: `event ${entry.outcome}`, 'data-outcome': entry.outcome},
        el('span', {class: 'when', text: entry.at || 'time not recorded'}),
        el('strong', {class: 'outcome', text: entry.outcome}),
        el('span', {class: 'what', text: what.join(', ')}),
        entry.error ? el('code', {class: 'error', text: entry.error}) : null));
    }
    const notes = [];
    if (history && history.older) notes.push(`${plural(history.older, 'older event')} not kept`);
    if (history && history.malformed) notes.push(`not readable: ${history.malformed}`);
    if (entries.length === 0) notes.push('none recorded');
    $('detail-history-note').textContent = notes.length ? `(${notes.join('; ')})` : '';
  }

  // The message the user last opened, found again in a new list by its id and place.
  function findWanted() {
    const wanted = ui.wanted;
    if (!wanted) return undefined;
    return ui.messages.find((m) => m.message_id === wanted.id && m.position === wanted.position) ||
        ui.messages.find((m) => wanted.id && m.message_id === wanted.id);
  }

  async function openDetail(index, again) {
    const listed = ui.messages.find((m) => m.index === index);
    if (!again && listed) ui.wanted = {id: listed.message_id, position: listed.position};
    const request = ++ui.detailRequest;  // only the latest request fills the panel
    try {
      const m = await api('GET', `/api/message?scan=${ui.scanId}&index=${index}`);
      if (request !== ui.detailRequest) return;
      ui.detail = m;
      $('detail').hidden = false;
      $('detail').dataset.index = String(index);
      $('detail-id').textContent = m.message_id || '(no message id)';
      const properties = Object.entries(m.properties);
      properties.unshift(['parked at', m.parked_at || '–'], ['reason', m.reason || '(none)'],
                         ['attempts', m.attempts === null ? '–' : m.attempts],
                         ['position in queue', m.position + 1], ['replays', m.replays]);
      fillHistory(m.history);
      fillTable($('detail-properties'), properties);
      fillTable($('detail-headers'), Object.entries(m.headers).map(([key, value]) =>
        [key, m.header_times[key] ? `${value} (${m.header_times[key]})` : value]));
      $('detail-body').textContent = m.body_pretty !== undefined ? m.body_pretty : m.body;
      const notes = [sizeText(m.body_size)];
      if (m.body_pretty !== undefined) notes.push('JSON, indented');
      if (m.body_encoding === 'base64') notes.push('not UTF-8: shown as base64');
      if (m.body_truncated) notes.push('cut to the first MiB');
      $('detail-body-note').textContent = `(${notes.join('; ')})`;
      $('detail-replay').disabled = !m.message_id;
      $('detail-edit').disabled = !m.message_id;
      $('detail-purge').disabled = !m.message_id;
    } catch (e) {
      if (request !== ui.detailRequest) return;
      if (e.status === 410 && !again) {
        // Counted again since the list was shown: find the message in the new list.
        await loadMessages();
        const found = findWanted();
        if (found) return openDetail(found.index, true);
      }
      notice(`Cannot open the message: ${e.message}`, 'error');
    }
  }

  // The headers of a parked message that an edit may change as text; the others go on as they
  // are, with their AMQP types.
  function editableHeaders(m) {
    const out = {};
    for (const key of m.editable_headers) out[key] = m.headers[key];
    return out;
  }

  function keptNote(type) {
    return type === 'byte array' ? 'binary, kept as is' : `${type}, kept as is`;
  }

  function bodyEditable(m) {
    return m.body_encoding !== 'base64' && !m.body_truncated;
  }

  function openEditor() {
    const m = ui.detail;
    if (!m) return;
    const editable = bodyEditable(m);
    $('edit-body').value = editable ? m.body : '';
    $('edit-body').disabled = !editable;
    $('edit-body-note').textContent = editable ? ''
        : `(${m.body_truncated ? 'cut to the first MiB' : 'not UTF-8'}: kept as is)`;
    $('edit-headers').value = JSON.stringify(editableHeaders(m), null, 1);
    const kept = $('edit-kept').tBodies[0];
    clear(kept);
    for (const key of m.kept_headers) {
      const value = m.header_times[key] ? `${m.headers[key]} (${m.header_times[key]})` : m.headers[key];
      kept.append(el('tr', {'data-key': key}, el('th', {text: key}),
        el('td', {}, el('pre', {text: valueText(value)})),
        el('td', {class: 'muted', text: keptNote(m.header_types[key])})));
    }
    $('edit-kept-section').hidden = m.kept_headers.length === 0;
    $('edit-keep').checked = false;
    $('edit-form').hidden = false;
    (editable ? $('edit-body') : $('edit-headers')).focus();
  }

  // What the operator changed: the request carries only that, and the console keeps the rest.
  function editChanges(m, edited) {
    const before = editableHeaders(m);
    const changes = {set_headers: {}, remove_headers: []};
    for (const [key, value] of Object.entries(edited)) {
      if (!(key in before) || JSON.stringify(before[key]) !== JSON.stringify(value)) {
        changes.set_headers[key] = value;
      }
    }
    for (const key of Object.keys(before)) {
      if (!(key in edited)) changes.remove_headers.push(key);
    }
    if (bodyEditable(m) && $('edit-body').value !== m.body) changes.body = $('edit-body').value;
    return changes;
  }

  async function sendEdit() {
    const m = ui.detail;
    if (!m || ui.busy) return;
    let edited;
    try {
      edited = JSON.parse($('edit-headers').value || '{}');
      if (edited === null || typeof edited !== 'object' || Array.isArray(edited)) throw new Error('not an object');
    } catch (e) {
      notice(`The headers are not a JSON object: ${e.message}`, 'error');
      return;
    }
    const keep = $('edit-keep').checked;
    ui.busy = true;
    let accepted = false;
    try {
      const s = ui.server;
      if (!await confirmDialog(`Send the edited message ${m.message_id} to queue ${s.input_queue}?`,
          'It goes as a new message with a new id and a header naming this one. ' +
          (keep ? 'The original stays parked.' : 'The original leaves parking once the broker has confirmed the copy.'),
          'Send')) return;
      const started = await api('POST', '/api/edit',
                                Object.assign({message_id: m.message_id, parked_at: m.parked_at_seconds,
                                               keep_original: keep}, editChanges(m, edited)));
      accepted = true;
      const job = await waitForJob(started.job);
      if (job.state === 'failed') {
        if (job.outcome === 'unknown') {
          notice(`The edit's outcome is not known: ${job.error}`, 'error');
          return;
        }
        throw new Error(job.error);
      }
      $('edit-form').hidden = true;
      const kept = job.kept_not_editable || [];
      notice(`Sent as ${job.new_message_id}.` +
             (kept.length ? ` Kept as they were, not editable here: ${kept.join(', ')}.` : ''));
    } catch (e) {
      if (accepted) {
        notice(`The edit was accepted, but its outcome is not known (${e.message}): the copy may ` +
               'have been sent. Look at the audit trail and the input queue before editing again.', 'error');
      } else {
        notice(`The edit was not sent: ${e.message}`, 'error');
      }
    } finally {
      ui.busy = false;
    }
  }

  function reopenDetail() {
    const found = findWanted();
    if (found) openDetail(found.index, true); else closeDetail();
  }

  function closeDetail() {
    $('edit-form').hidden = true;
    ui.detail = null;
    ui.wanted = null;
    ++ui.detailRequest;
    $('detail').hidden = true;
  }

  // ---- actions -------------------------------------------------------------------------------

  function confirmDialog(text, detail, okText) {
    return new Promise((resolve) => {
      $('confirm-text').textContent = text;
      $('confirm-detail').textContent = detail;
      $('confirm-ok').textContent = okText;
      $('confirm').hidden = false;
      $('confirm-ok').focus();
      const finish = (answer) => {
        $('confirm').hidden = true;
        $('confirm-ok').onclick = null;
        $('confirm-cancel').onclick = null;
        resolve(answer);
      };
      $('confirm-ok').onclick = () => finish(true);
      $('confirm-cancel').onclick = () => finish(false);
    });
  }

  async function act(kind, filter, description, count) {
    if (ui.busy) return;
    ui.busy = true;
    try {
      const s = ui.server;
      const verb = kind === 'replay' ? 'Replay' : 'Purge';
      const counted = 'The number is from the last count; the action takes whatever matches ' +
          'when it runs.';
      const detail = kind === 'replay'
          ? `Each one is copied to queue ${s.input_queue} and leaves parking only once the broker ` +
            `has confirmed its copy. ${counted}`
          : `They are deleted for good. ${counted}`;
      if (!await confirmDialog(`${verb} ${description}?`, detail, verb)) return;
      await api('POST', `/api/${kind}`, {filter, asked: count});
      notice('');
      schedulePoll(100);
    } catch (e) {
      notice(`${kind} refused: ${e.message}`, 'error');
    } finally {
      ui.busy = false;
    }
  }

  async function waitForJob(id) {
    for (;;) {
      const s = await api('GET', '/api/state');
      render(s);
      if (s.job && s.job.id > id) throw new Error('another action replaced it');
      if (s.job && s.job.id === id && (s.job.state === 'done' || s.job.state === 'failed')) {
        return s.job;
      }
      await new Promise((resolve) => setTimeout(resolve, 300));
    }
  }

  // Counts what `filter` takes now, then asks to act on it. The action gets the filter as the
  // console counted it, an "older than" fixed as a time, so it takes what was counted.
  // `describe(n)` says what the n messages are; `none` is the notice when there are none.
  async function countThenAct(kind, filter, what, describe, none) {
    if (ui.busy) return;
    ui.busy = true;
    let counted;
    try {
      notice(`Counting ${what}…`);
      const started = await api('POST', '/api/count', {filter});
      counted = await waitForJob(started.job);
      notice('');
      if (counted.state === 'failed') throw new Error(counted.error);
      if (counted.interrupted) throw new Error('the count was stopped');
    } catch (e) {
      notice(`Cannot count: ${e.message}`, 'error');
      return;
    } finally {
      ui.busy = false;
    }
    const n = counted.progress.moved;
    if (n === 0) {
      notice(none);
      return;
    }
    await act(kind, counted.filter, describe(n), n);
  }

  function purgeOlderThan(duration) {
    countThenAct('purge', {older_than: duration}, `the messages parked more than ${duration} ago`,
                 (n) => `${plural(n, 'message')} parked more than ${duration} ago`,
                 `No message was parked more than ${duration} ago.`);
  }

  // A selection is sent as message ids, which duplicates share: the confirmation says how many
  // messages carry the ids, not only how many rows were ticked.
  function actOnIds(kind, ids) {
    const chosen = ids.length === 1 ? `the message with id ${ids[0]}`
                                    : `the ${plural(ids.length, 'selected message')}`;
    const idText = ids.length === 1 ? `id ${ids[0]}` : `the ${plural(ids.length, 'selected id')}`;
    countThenAct(kind, selectionFilter(ids), 'the messages with the selected ids', (n) =>
      n === ids.length ? chosen
                       : `the ${plural(n, 'message')} with ${idText} (messages are chosen by ` +
                         `id, and ${n > ids.length ? 'some share one' : 'some are gone'})`,
      'No parked message has the selected ids any more.');
  }

  function selectionFilter(ids) {
    return Object.assign({}, shownFilter(), {message_ids: ids});
  }

  // ---- polling -------------------------------------------------------------------------------

  let pollTimer = null;
  let polling = false;

  function schedulePoll(delay) {
    if (pollTimer !== null) clearTimeout(pollTimer);
    pollTimer = setTimeout(poll, delay);
  }

  async function poll() {
    pollTimer = null;
    if (polling) return;
    polling = true;
    let fast = false;
    try {
      const s = await api('GET', '/api/state');
      $('token-panel').hidden = true;
      if (!ui.identity) {
        // What the token may do: the page hides the buttons of what its role may not.
        ui.identity = await api('GET', '/api/whoami');
        document.body.dataset.role = ui.identity.role;
        $('identity').textContent = `${ui.identity.name} (${ui.identity.role})`;
      }
      const current = s.service === (ui.service || s.service);  // not switched meanwhile
      if (current) render(s);
      if (current && s.scan && s.scan.id !== ui.scanId) await loadMessages();
      ui.services = (await api('GET', '/api/services')).services;
      renderServices();
      await loadAudit();
      fast = Boolean(s.scanning) || Boolean(s.job && (s.job.state === 'running' || s.job.state === 'queued'));
      if ($('notice').className === 'offline') notice('');
    } catch (e) {
      if (e.status !== 403) notice(`The console does not answer: ${e.message}`, 'offline');
    } finally {
      polling = false;
    }
    // Depths are looked up at most every 2 s by the console; counts are read again only when
    // the depth changed (see the scan line), so a fast poll costs the broker nothing.
    if (pollTimer === null) schedulePoll(fast ? 500 : 2000);
  }

  // ---- wiring --------------------------------------------------------------------------------

  function wire() {
    $('token-form').addEventListener('submit', (event) => {
      event.preventDefault();
      ui.token = $('token-input').value.trim();
      ui.identity = null;
      sessionStorage.setItem(TOKEN_KEY, ui.token);
      $('token-input').value = '';
      schedulePoll(0);
    });
    $('filter-form').addEventListener('submit', (event) => {
      event.preventDefault();
      scan(formFilter());
    });
    $('clear').addEventListener('click', () => {
      $('filter-form').reset();
      setErrorLine(null);
      scan({});
    });
    $('f-line-clear').addEventListener('click', () => {
      setErrorLine(null);
      scan(formFilter());
    });
    $('rescan').addEventListener('click', () => scan(shownFilter()));
    for (const kind of ['replay', 'purge']) {
      $(`${kind}-matching`).addEventListener('click', () => {
        const matched = ui.server.scan.matched;
        const filter = shownFilter();
        const what = filterText(filter);
        act(kind, filter, `${what ? 'the' : 'all'} ${plural(matched, 'message')}` +
            (what ? ` that match (${what})` : ' in parking'), matched);
      });
      $(`${kind}-selected`).addEventListener('click', () => actOnIds(kind, [...ui.selected]));
      $(`detail-${kind}`).addEventListener('click', () => actOnIds(kind, [ui.detail.message_id]));
    }
    $('older-form').addEventListener('submit', (event) => {
      event.preventDefault();
      const duration = $('older-than').value.trim();
      if (duration) purgeOlderThan(duration);
    });
    $('select-all').addEventListener('change', () => {
      for (const m of ui.messages) {
        if (!m.message_id) continue;
        if ($('select-all').checked) ui.selected.add(m.message_id); else ui.selected.delete(m.message_id);
      }
      renderMessages();
      if (ui.server) renderBulk(ui.server);
    });
    $('job-stop').addEventListener('click', async () => {
      try {
        await api('POST', '/api/stop', {});
        schedulePoll(100);
      } catch (e) {
        notice(`Cannot stop: ${e.message}`, 'error');
      }
    });
    $('detail-close').addEventListener('click', closeDetail);
    $('detail-edit').addEventListener('click', openEditor);
    $('edit-cancel').addEventListener('click', () => { $('edit-form').hidden = true; });
    $('edit-form').addEventListener('submit', (event) => {
      event.preventDefault();
      sendEdit();
    });
    $('service-switch').addEventListener('change', () => switchService($('service-switch').value));
    document.addEventListener('keydown', (event) => {
      if (event.key !== 'Escape') return;
      if (!$('confirm').hidden) $('confirm-cancel').click(); else if (!$('detail').hidden) closeDetail();
    });
  }

  function showGroup(filter) {
    if (filter.reasons) $('f-reason').value = filter.reasons[0];
    if (filter.error_first_line !== undefined) setErrorLine(filter.error_first_line);
    scan(filter);
  }

  readToken();
  wire();
  if (!ui.token) askForToken('');
  poll();
})();
