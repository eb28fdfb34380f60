// Run dashboard: status badge and timeline, live charts, event tail, checkpoints (with export to a Hugging
// Face model directory), samples (a multi-turn episode turn by turn), cancel/resume, fork from a
// checkpoint (the curves of the runs this one continues drawn dashed before its own).
// Initial state comes from the page; history from the REST API; everything after from ws/runs/<id>/.
import { api, el, fmtNum, fmtTime, pageData, results } from "./api.js";
import { ChartBoard } from "./charts.js";
import { RunStream } from "./live.js";
import { AlertBanner } from "./run_alerts.js"; // alerts
import { turnRows } from "./sample_turns.js";

const data = pageData("page-data");
const run = data.run;
// Run states by role, from the page (the server's one list, in lifecycle order).
const TERMINAL = new Set(run.terminal_states);
const ACTIVE = new Set(run.active_states);
const CANCELLABLE = new Set(run.cancellable_states);
const SUCCESSFUL = new Set(run.successful_states);
const TAIL_EVENTS = 200; // events replayed into the tail on load (status history comes from REST)
const TAIL_MAX_LINES = 1000;
const HISTORY_MAX_POINTS = 1000;

const $ = (id) => document.getElementById(id);
let state = run.state;
let checkpoints = data.checkpoints || [];
const exportsByStep = {}; // step -> latest export record (state, out, error), from REST (re-read on notices)
let exportsReload = null; // the pending re-read of the exports (one per burst of export notices)
const CAN_WRITE = Boolean($("cancel-btn")); // the page shows write actions to members only
const enteredAt = {}; // state -> ISO time the run entered it

// --- status badge, timeline, buttons --------------------------------------------------------------------

function setState(next, error) {
  state = next;
  const badge = $("run-state");
  badge.textContent = next;
  badge.className = `badge ${next}`;
  if (error) {
    $("run-error").textContent = error;
    $("run-error").hidden = false;
  }
  renderTimeline();
  renderCheckpoints(); // its buttons too (a checkpoint forks once the run has finished)
}

function renderTimeline() {
  // The cancellable states always show; the other active ones (cancelling) once entered.
  const steps = run.active_states.filter((s) => CANCELLABLE.has(s) || enteredAt[s] || state === s);
  steps.push(TERMINAL.has(state) ? state : "finished");
  const current = steps.indexOf(state);
  $("timeline").replaceChildren(...steps.map((s, i) => {
    let cls = "step";
    if (i < current) cls += " done";
    if (i === current) cls += TERMINAL.has(s) && !SUCCESSFUL.has(s) ? " current bad" : " current";
    return el("div", { class: cls, "data-step": s }, s, el("span", { class: "when" }, fmtTime(enteredAt[s]) || "\u00a0"));
  }));
}

function renderButtons() {
  const cancel = $("cancel-btn");
  const resume = $("resume-btn");
  if (!cancel) return;
  cancel.hidden = !CANCELLABLE.has(state);
  resume.hidden = !TERMINAL.has(state);
  const kept = checkpoints.filter((c) => !c.pruned).length;
  resume.disabled = kept === 0;
  resume.title = kept ? "" : "This run has no checkpoint to resume from.";
}

/** A stopped run says what it kept: its latest checkpoint still on disk (what Resume continues from). */
function renderKept() {
  const box = $("run-kept");
  if (!box) return;
  box.hidden = !TERMINAL.has(state) || SUCCESSFUL.has(state);
  const last = checkpoints.filter((c) => !c.pruned).sort((a, b) => b.step - a.step)[0];
  box.textContent = last ? `checkpoint at step ${last.step} kept` : "no checkpoint kept";
}

function showActionError(err) {
  const box = $("action-error");
  const fields = Object.entries(err.fieldErrors || {}).map(([k, v]) => `${k}: ${v.join(" ")}`);
  box.textContent = fields.length ? fields.join("; ") : err.message;
  box.hidden = false;
}

if ($("cancel-btn")) {
  let armed = null;
  $("cancel-btn").addEventListener("click", async () => {
    const btn = $("cancel-btn");
    if (!armed) { // a second click confirms: a stray click must not stop a long run
      btn.textContent = "Click again to cancel";
      armed = setTimeout(() => { armed = null; btn.textContent = "Cancel run"; }, 4000);
      return;
    }
    clearTimeout(armed);
    armed = null;
    btn.textContent = "Cancel run";
    btn.disabled = true;
    try {
      const updated = await api(`/api/runs/${run.id}/cancel`, { method: "POST" });
      setState(updated.state);
    } catch (err) {
      showActionError(err);
    } finally {
      btn.disabled = false;
    }
  });
  $("resume-btn").addEventListener("click", async () => {
    $("resume-btn").disabled = true;
    try {
      const created = await api(`/api/runs/${run.id}/resume`, { method: "POST", body: {} });
      window.location.href = `/runs/${created.id}/`;
    } catch (err) {
      showActionError(err);
      $("resume-btn").disabled = false;
    }
  });
}

// --- event tail -----------------------------------------------------------------------------------------

const tail = $("log-tail");
function appendEvent(ev) {
  const line = el("div", { class: `ev ${ev.kind}`, "data-seq": ev.seq },
    el("span", { class: "seq" }, `#${ev.seq} ${fmtTime(ev.created)}`),
    ev.kind === "log" ? "" : `[${ev.kind}] `, ev.message || JSON.stringify(ev.data));
  const atBottom = tail.scrollTop + tail.clientHeight >= tail.scrollHeight - 4;
  tail.append(line);
  while (tail.childElementCount > TAIL_MAX_LINES) tail.firstElementChild.remove();
  if ($("follow-tail").checked || atBottom) tail.scrollTop = tail.scrollHeight;
}

function handleEvent(ev) {
  appendEvent(ev);
  // an engine alert or a failure opens an alert in the process that stored it, whose live
  // message may not reach this page's server (embedded default): read the open alerts again.
  if (ev.kind === "alert" || (ev.kind === "status" && ev.data && ev.data.to === "failed")) alertBanner.load();
  if (ev.kind === "status" && ev.data && ev.data.to) {
    enteredAt[ev.data.to] = ev.created;
    setState(ev.data.to, ev.data.error);
  } else if (ev.kind === "log" && ev.data && ev.data.source === "export") {
    // A notice that an export changed: its state is read from the platform's table, never the event.
    scheduleExportsReload();
  } else if (ev.kind === "checkpoint" && ev.data && ev.data.path !== undefined) {
    checkpoints = checkpoints.filter((c) => c.step !== ev.data.step);
    checkpoints.push({ step: ev.data.step, path: ev.data.path, size_bytes: ev.data.size_bytes || 0, created: ev.created, pruned: false });
    // the checkpoints this one replaced are gone from disk (trainer.keep_checkpoints)
    const pruned = new Set(Array.isArray(ev.data.pruned) ? ev.data.pruned : []);
    for (const c of checkpoints) if (pruned.has(c.path)) c.pruned = true;
    renderCheckpoints();
  }
}

// --- checkpoints ----------------------------------------------------------------------------------------

function fmtBytes(n) {
  if (!n) return "–";
  const units = ["B", "KiB", "MiB", "GiB", "TiB"];
  let i = 0;
  let v = n;
  while (v >= 1024 && i < units.length - 1) { v /= 1024; i += 1; }
  return `${v.toFixed(i ? 1 : 0)} ${units[i]}`;
}

async function requestExport(step, btn) {
  btn.disabled = true;
  try {
    exportsByStep[step] = await api(`/api/runs/${run.id}/checkpoints/${step}/export`, { method: "POST" });
    renderCheckpoints();
  } catch (err) {
    showActionError(err);
    btn.disabled = false;
  }
}

/** The export cell of a checkpoint row: its state and result, and the action when one is allowed. */
function exportCell(c) {
  if (c.pruned) {
    return el("td", { class: "muted", "data-testid": `export-state-${c.step}`, "data-state": "pruned",
      title: "The engine removed this checkpoint (trainer.keep_checkpoints)" }, "removed by the engine");
  }
  const ex = exportsByStep[c.step];
  const parts = [];
  if (ex && (ex.state === "queued" || ex.state === "running")) {
    parts.push(el("span", { class: "muted" }, `${ex.state}…`));
  } else if (ex && ex.state === "succeeded") {
    parts.push(el("span", { class: "mono", title: "Hugging Face model directory on the run's cluster" }, ex.out));
  } else if (ex && ex.state === "failed") {
    parts.push(el("span", { class: "error-text", title: ex.error || "" }, `failed: ${(ex.error || "").split("\n").pop()}`));
  }
  const idle = !ex || ex.state === "succeeded" || ex.state === "failed";
  if (CAN_WRITE && idle) {
    const btn = el("button", { class: "btn small", type: "button", "data-testid": `export-${c.step}` },
      ex ? "Export again" : "Export");
    btn.addEventListener("click", () => requestExport(c.step, btn));
    parts.push(btn);
  }
  return el("td", { "data-testid": `export-state-${c.step}`, "data-state": ex ? ex.state : "" }, ...parts);
}

function renderCheckpoints() {
  checkpoints.sort((a, b) => b.step - a.step);
  $("checkpoints").replaceChildren(...checkpoints.map((c) => el("tr", {},
    el("td", {}, c.step), el("td", { class: "mono" }, c.path), el("td", { class: "muted" }, fmtBytes(c.size_bytes)),
    exportCell(c), ...(CAN_WRITE ? [forkCell(c)] : []))));
  $("checkpoints-empty").hidden = checkpoints.length > 0;
  renderButtons();
  renderKept();
}

/** One re-read of the exports for a burst of notices (a replayed event tail holds many). */
function scheduleExportsReload() {
  if (exportsReload === null) exportsReload = setTimeout(() => { exportsReload = null; loadExports(); }, 200);
}

async function loadExports() {
  try {
    for (const ex of await api(`/api/runs/${run.id}/exports`)) exportsByStep[ex.step] = ex;
    renderCheckpoints();
  } catch { /* the table still lists the checkpoints; export states are read again on the next notice */ }
}

// --- fork ------------------------------------------------------------------------------------------------
// "Fork from here" on a checkpoint row opens the override editor; the fork is a new run of the experiment
// from that checkpoint with this run's config and the overrides (POST /api/runs/<id>/fork).

let forkStep = null; // the step of the checkpoint the open editor forks from

function forkCell(c) {
  const btn = el("button", { class: "btn small", type: "button", "data-testid": `fork-${c.step}` }, "Fork from here");
  btn.disabled = !TERMINAL.has(state) || c.pruned;
  btn.title = c.pruned ? "The engine removed this checkpoint." : btn.disabled ? "A run can be forked once it has finished." : "";
  btn.addEventListener("click", () => openFork(c.step));
  return el("td", {}, btn);
}

function openFork(step) {
  forkStep = step;
  $("fork-title").textContent = `Fork from step ${step}`;
  $("fork-errors").hidden = true;
  $("fork-panel").hidden = false;
  $("fork-overrides").focus();
}

function showForkErrors(lines) {
  $("fork-errors").replaceChildren(...lines.map((line) => el("li", {}, line)));
  $("fork-errors").hidden = false;
}

/** The checkpoint's id: from the page, else (a checkpoint reported live) from the REST list. */
async function checkpointId(step) {
  const known = checkpoints.find((c) => c.step === step);
  if (known && known.id) return known.id;
  const listed = (await api(`/api/runs/${run.id}/checkpoints`)).find((c) => c.step === step);
  if (!listed) throw new Error(`no checkpoint at step ${step}`);
  return listed.id;
}

if ($("fork-panel")) {
  $("fork-close").addEventListener("click", () => { $("fork-panel").hidden = true; });
  $("fork-panel").addEventListener("submit", async (e) => {
    e.preventDefault();
    let overrides;
    try {
      overrides = jsyaml.load($("fork-overrides").value) ?? {};
    } catch (err) {
      showForkErrors([`the overrides are not valid YAML: ${err.reason || err.message}`]);
      return;
    }
    $("fork-submit").disabled = true;
    try {
      const body = { checkpoint: await checkpointId(forkStep), config_overrides: overrides };
      const created = await api(`/api/runs/${run.id}/fork`, { method: "POST", body });
      window.location.href = `/runs/${created.id}/`;
    } catch (err) {
      const fields = Object.entries(err.fieldErrors || {}).map(([k, v]) => `${k}: ${v.join(" ")}`);
      showForkErrors(fields.length ? fields : [err.message]);
      $("fork-submit").disabled = false;
    }
  });
}

/** The curves this run continues (the runs it was resumed or forked from), each up to the step where
 *  the next one took over; drawn once, dashed (they are finished runs). */
async function loadEarlier() {
  for (const parent of data.lineage || []) {
    try {
      const { keys } = await api(`/api/runs/${parent.id}/metrics/keys`);
      for (let i = 0; i < keys.length; i += 50) {
        const { series } = await api(`/api/runs/${parent.id}/metrics`, { params: {
          keys: keys.slice(i, i + 50).join(","), step_max: parent.up_to_step, max_points: HISTORY_MAX_POINTS } });
        board.setEarlier(series);
      }
    } catch (err) {
      $("metrics-note").textContent = `could not load run #${parent.number}'s metrics: ${err.message}`;
    }
  }
  $("charts").dataset.earlier = "loaded";
}

// --- charts ---------------------------------------------------------------------------------------------

const board = new ChartBoard($("charts"), $("charts-empty"));
let historyReady = false;
let pendingLive = [];

function updateProgress() {
  const step = board.maxStep();
  $("progress-step").textContent = step === null ? "–" : String(step);
}

/** (Re)load every series, downsampled on the server; live points that arrive meanwhile are merged after. */
async function loadHistory() {
  historyReady = false;
  delete $("charts").dataset.history;
  try {
    const { keys } = await api(`/api/runs/${run.id}/metrics/keys`);
    let downsampled = false;
    for (let i = 0; i < keys.length; i += 50) {
      const chunk = keys.slice(i, i + 50);
      const { series } = await api(`/api/runs/${run.id}/metrics`,
        { params: { keys: chunk.join(","), max_points: HISTORY_MAX_POINTS } });
      board.setHistory(series);
      downsampled = downsampled || series.some((s) => s.downsampled);
    }
    $("metrics-note").textContent = downsampled ? `long series shown downsampled (min/max of ${HISTORY_MAX_POINTS / 2} buckets)` : "";
  } catch (err) {
    $("metrics-note").textContent = `could not load metric history: ${err.message}`;
  }
  historyReady = true;
  $("charts").dataset.history = "loaded"; // tests wait on this before they send points that must arrive live
  for (const series of pendingLive) board.append(series);
  pendingLive = [];
  updateProgress();
}

function handleMetrics(series) {
  if (!historyReady) pendingLive.push(series);
  else board.append(series);
  updateProgress();
}

// --- samples --------------------------------------------------------------------------------------------

/** The reward, and under it each component's score (a reward.combine's labels: the sample's reward_parts). */
function rewardCell(s) {
  const total = s.reward === null || s.reward === undefined ? "–" : fmtNum(s.reward);
  // by label: a JSON object's key order is the store's (PostgreSQL's jsonb sorts keys by length)
  const parts = s.reward_parts && typeof s.reward_parts === "object"
    ? Object.entries(s.reward_parts).sort(([a], [b]) => (a < b ? -1 : a > b ? 1 : 0)) : [];
  if (!parts.length) return el("td", {}, total);
  return el("td", {}, total, el("ul", { class: "reward-parts small muted", "data-testid": "reward-parts" },
    parts.map(([label, score]) => el("li", {}, `${label} ${fmtNum(score)}`))));
}

/** The response: as it is, or (a multi-turn episode) its turns in order, the environment's set apart. */
function responseCell(s) {
  const rows = turnRows(s.turns);
  if (!rows.length) return el("td", { class: "text" }, s.response);
  return el("td", { class: "text" }, el("ol", { class: "turns", "data-testid": "turns" },
    rows.map((r) => el("li", { class: r.policy ? "turn policy" : "turn environment", "data-role": r.role },
      el("div", { class: "turn-head small muted" }, `${r.speaker} · ${r.summary}`),
      el("div", { class: "turn-text" }, r.text)))));
}

async function loadSamples() {
  const raw = $("sample-step").value.trim();
  const params = { limit: 24 };
  if (/^\d+$/.test(raw)) params.step = raw;
  try {
    const rows = results(await api(`/api/runs/${run.id}/samples`, { params }));
    $("samples").replaceChildren(...rows.map((s) => el("tr", {},
      el("td", {}, s.step),
      rewardCell(s),
      el("td", { class: "muted" }, s.version_start === null || s.version_start === undefined ? "–" : `v${s.version_start}→v${s.version_end}`),
      el("td", { class: "text" }, s.prompt),
      responseCell(s),
      el("td", { class: "text muted" }, s.answer === null || s.answer === undefined ? "" : s.answer))));
    $("samples-empty").hidden = rows.length > 0;
  } catch (err) {
    $("samples-empty").textContent = `could not load samples: ${err.message}`;
    $("samples-empty").hidden = false;
  }
}
$("samples-refresh").addEventListener("click", loadSamples);
$("sample-step").addEventListener("keydown", (e) => { if (e.key === "Enter") loadSamples(); });
setInterval(() => {
  if (ACTIVE.has(state) && !$("sample-step").value.trim() && !document.hidden) loadSamples();
}, 10000);

// --- start ----------------------------------------------------------------------------------------------

async function loadStatusHistory() {
  if (run.queued_at) enteredAt.queued = run.queued_at;
  if (run.started_at) enteredAt.running = run.started_at;
  if (run.finished_at && TERMINAL.has(run.state)) enteredAt[run.state] = run.finished_at;
  try {
    const page = await api(`/api/runs/${run.id}/events`, { params: { kind: "status", limit: 1000 } });
    for (const ev of page.events) if (ev.data && ev.data.to) enteredAt[ev.data.to] = ev.created;
  } catch { /* the timeline still has the run's own timestamps */ }
  renderTimeline();
}

// --- alerts: the run's open alerts, loaded with the page and kept live ---
const alertBanner = new AlertBanner($("run-alerts"), run.id, Boolean(data.can_write));
alertBanner.load();

setState(state);
renderCheckpoints();
loadEarlier();
loadExports();
loadStatusHistory();
loadSamples();

const stream = new RunStream(run.id, {
  onHello: (info, reconnected) => {
    if (info.state !== state) setState(info.state, info.error);
    loadHistory(); // also after a reconnect: metrics are not replayed by seq, the history query covers the gap
    if (reconnected) alertBanner.load(); // alert messages are not replayed either
  },
  onEvent: handleEvent,
  onMetrics: handleMetrics,
  onAlert: (alert) => alertBanner.apply(alert),
  onConnection: (up) => {
    $("live-dot").classList.toggle("on", up);
    $("live-text").textContent = up ? "live" : "reconnecting…";
  },
}, Math.max(0, run.last_seq - TAIL_EVENTS));
stream.connect();
