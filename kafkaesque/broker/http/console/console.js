// The Kafkaesque web console (docs/console.md): plain JavaScript, no library, no build step.
// Its data comes from this admin port only: /api/* (the broker's shared snapshot) and
// /api/rest/* (the REST API's own handlers, so the principal's ACLs apply). One server-sent-
// events stream per tab (/api/events) carries the overview every second and the timeline.
"use strict";

const state = { overview: null, timer: null, live: null, lastSeq: 0 };
const screen = () => document.getElementById("screen");

function el(tag, attrs, ...children) {
  const node = document.createElement(tag);
  for (const [key, value] of Object.entries(attrs || {})) {
    if (value === null || value === undefined || value === false) continue;
    if (key.startsWith("on")) node.addEventListener(key.slice(2), value);
    else if (key === "text") node.textContent = value;
    else node.setAttribute(key, value === true ? "" : String(value));
  }
  for (const child of children.flat()) {
    if (child === null || child === undefined) continue;
    node.append(child instanceof Node ? child : document.createTextNode(String(child)));
  }
  return node;
}

// replaceChildren, with arrays of children flattened and null children left out.
function put(node, ...children) {
  node.replaceChildren(...children.flat(3).filter((c) => c !== null && c !== undefined));
}

async function getJson(path, options) {
  const response = await fetch(path, options);
  const text = await response.text();
  let body = null;
  try { body = text ? JSON.parse(text) : null; } catch (e) { body = { message: text }; }
  if (!response.ok) {
    const error = new Error((body && body.message) || response.statusText);
    error.status = response.status;
    throw error;
  }
  return { body, headers: response.headers };
}

function show(...nodes) { put(screen(), ...nodes); }
function fail(where, error) {
  const note = document.getElementById("screen-error") || el("p", { id: "screen-error", class: "error", "data-testid": "error" });
  note.textContent = `${where}: ${error.message}`;
  if (!note.isConnected) screen().prepend(note);
}
function every(seconds, fn) {
  clearInterval(state.timer);
  fn();
  state.timer = setInterval(fn, seconds * 1000);
}
const fmt = (n) => (n === null || n === undefined ? "—" : Number(n).toLocaleString("en"));
const rate = (n) => (n < 10 ? n.toFixed(1) : Math.round(n).toLocaleString("en"));

// -- routing ----------------------------------------------------------------------------------

function route() {
  clearInterval(state.timer);
  if (state.live) { state.live.abort(); state.live = null; }
  const hash = decodeURIComponent(location.hash.replace(/^#/, "")) || "/";
  const parts = hash.split("/").filter(Boolean);
  const name = parts[0] || "overview";
  for (const a of document.querySelectorAll("nav a")) {
    a.classList.toggle("active", a.dataset.nav === (name === "topic" ? "topics" : name));
  }
  if (name === "topics") return topicsScreen();
  if (name === "topic" && parts[1]) return topicScreen(parts.slice(1).join("/"));
  if (name === "groups") return groupsScreen();
  if (name === "group" && parts[1]) return groupScreen(parts.slice(1).join("/"));
  if (name === "acls") return aclsScreen();
  if (name === "mqtt") return mqttScreen();
  if (name === "device" && parts[1]) return deviceScreen(parts.slice(1).join("/"));
  if (name === "timeline") return show(el("h1", { text: "Timeline" }),
    el("p", { text: "Elections, leader moves, under-replication, brokers joining and leaving, rebalances and refused logins, as this broker sees them, live in the panel on the right." }));
  return overviewScreen();
}

// -- overview ---------------------------------------------------------------------------------

function overviewScreen() {
  show(el("h1", { text: "Overview" }), el("div", { id: "overview", "data-testid": "overview" }, "waiting for the first snapshot…"));
  if (state.overview) renderOverview(state.overview);
}

function renderOverview(o) {
  const box = document.getElementById("overview");
  if (!box) return;
  const card = (label, value, id, warn) =>
    el("div", { class: warn ? "card warn" : "card", "data-testid": id }, el("b", { text: value }), label);
  const up = o.brokers.filter((b) => b.up).length;
  const brokers = el("table", { "data-testid": "brokers" },
    el("tr", {}, el("th", { text: "Broker" }), el("th", { text: "Address" }), el("th", { text: "State" }), el("th", { text: "Role" })),
    o.brokers.map((b) => el("tr", { "data-testid": `broker-${b.id}` },
      el("td", { text: b.id }), el("td", { text: `${b.host}:${b.port}` }),
      el("td", { class: b.up ? "up" : "down", "data-testid": "broker-state", text: b.up ? "up" : "down" }),
      el("td", { text: [b.id === o.controller ? "controller" : "", b.id === o.broker ? "(this console)" : ""].join(" ").trim() }))));
  const canvas = el("canvas", { width: 600, height: 80, "data-testid": "rates-chart" });
  put(box, 
    el("div", { class: "cards" },
      card("brokers up", `${up} / ${o.brokers.length}`, "brokers-up", up < o.brokers.length),
      card("controller", o.controller === null ? "none" : `broker ${o.controller}`, "controller", o.controller === null),
      card("partitions", fmt(o.partitions), "partitions"),
      card("under-replicated", fmt(o.under_replicated_count), "under-replicated", o.under_replicated_count > 0),
      card("leaderless", fmt(o.leaderless_count), "leaderless", o.leaderless_count > 0),
      card("messages/s", rate(o.messages_per_s), "messages-rate"),
      card("bytes/s (logs here)", rate(o.bytes_per_s), "bytes-rate")),
    brokers,
    el("h2", { text: "Messages per second (last two minutes)" }), canvas,
    o.leaderless.length ? el("p", { class: "error", text: `Leaderless: ${o.leaderless.join(", ")}` }) : null,
    o.under_replicated.length ? el("p", { class: "notice", text: `Under-replicated: ${o.under_replicated.join(", ")}` }) : null);
  drawChart(canvas, o.history);
  renderHeard(box, o); // console_topic.js
}

function drawChart(canvas, history) {
  const ctx = canvas.getContext("2d");
  const w = canvas.width, h = canvas.height;
  ctx.clearRect(0, 0, w, h);
  if (history.length < 2) return;
  const max = Math.max(1, ...history.map((p) => p[1]));
  const t0 = history[0][0], span = Math.max(1, history[history.length - 1][0] - t0);
  ctx.strokeStyle = "#2456a8";
  ctx.lineWidth = 2;
  ctx.beginPath();
  history.forEach(([t, m], i) => {
    const x = ((t - t0) / span) * (w - 4) + 2, y = h - 4 - (m / max) * (h - 16);
    if (i === 0) ctx.moveTo(x, y); else ctx.lineTo(x, y);
  });
  ctx.stroke();
  ctx.fillStyle = "#6b7385";
  ctx.fillText(`max ${rate(max)}/s`, 4, 10);
}

// -- topics -----------------------------------------------------------------------------------

function topicsScreen() {
  let rows = [];
  let sortKey = "name", ascending = true;
  const columns = [["name", "Topic"], ["partitions", "Partitions"], ["replication", "Replicas"],
    ["end_offset", "End offsets (sum)"], ["messages_per_s", "Messages/s"], ["leaderless", "Leaderless"], ["under_replicated", "Under-replicated"],
    ["groups", "Groups"], ["max_lag", "Max lag"]];
  const table = el("table", { "data-testid": "topics" });
  const render = () => {
    const sorted = [...rows].sort((a, b) => (a[sortKey] < b[sortKey] ? -1 : a[sortKey] > b[sortKey] ? 1 : 0) * (ascending ? 1 : -1));
    put(table, 
      el("tr", {}, columns.map(([key, label]) => el("th", {
        class: key === "name" ? "sortable" : "sortable num", "data-sort": key,
        onclick: () => { ascending = sortKey === key ? !ascending : true; sortKey = key; render(); },
        text: label + (sortKey === key ? (ascending ? " ▲" : " ▼") : "") }))),
      sorted.map((t) => el("tr", { "data-testid": `topic-${t.name}` },
        el("td", {}, el("a", { href: `#/topic/${encodeURIComponent(t.name)}`, text: t.name })),
        el("td", { class: "num", text: t.partitions }), el("td", { class: "num", text: t.replication }),
        el("td", { class: "num", "data-testid": "end-offset", text: fmt(t.end_offset) + (t.unknown_ends ? ` (+${t.unknown_ends} unknown)` : "") }),
        el("td", { class: "num", text: rate(t.messages_per_s) }),
        el("td", { class: "num", text: t.leaderless }), el("td", { class: "num", text: t.under_replicated }),
        el("td", { "data-testid": "groups", text: t.groups.join(", ") }),
        el("td", { class: "num", "data-testid": "max-lag", text: t.max_lag === null ? "" : fmt(t.max_lag) }))));
  };
  show(el("h1", { text: "Topics" }), table);
  every(2, async () => {
    try { rows = (await getJson("/api/topics")).body; render(); } catch (e) { fail("topics", e); }
  });
}

// -- a topic ----------------------------------------------------------------------------------

function topicScreen(topic) {
  const enc = encodeURIComponent(topic);
  const parts = el("table", { "data-testid": "partitions" });
  const config = el("p", { "data-testid": "config" });
  const messages = el("table", { "data-testid": "messages" });
  const partitionPick = el("select", { "data-testid": "message-partition" });
  const offsetInput = el("input", { type: "number", min: 0, value: 0, "data-testid": "message-offset", size: 8 });
  const liveBox = el("input", { type: "checkbox", "data-testid": "live" });
  const produceBox = el("div", { "data-testid": "produce-box" });
  let count = 0;

  const refresh = async () => {
    try {
      const [described, raft] = await Promise.all([
        getJson(`/api/rest/topics/${enc}`), getJson(`/api/topics/${enc}`)]);
      const d = described.body, byPartition = new Map(raft.body.partitions.map((p) => [p.partition, p]));
      const c = d.configs;
      config.textContent = `${c.partitions} partitions, replication ${c.replication_factor}` +
        `${c.compact ? ", compacted" : ""}, retention ${c.retention_ms ?? "∞"} ms / ${c.retention_bytes ?? "∞"} bytes` +
        `; Raft state as broker ${raft.body.seen_by} holds it (follower lag where it leads)`;
      put(parts, 
        el("tr", {}, ["Partition", "Leader", "Replicas", "End offset", "Term", "Commit index", "Log end here", "Follower lag", "Last election"]
          .map((label) => el("th", { text: label }))),
        d.partitions.map((p) => {
          const r = byPartition.get(p.partition) || {};
          const lag = r.followers ? Object.entries(r.followers).map(([f, n]) => `${f}: ${n}`).join(", ") : "—";
          return el("tr", { "data-testid": `partition-${p.partition}` },
            el("td", { text: p.partition }),
            el("td", { "data-testid": "leader", text: p.leader ?? "none" }),
            el("td", { text: p.replicas.join(", ") }),
            el("td", { class: "num", "data-testid": "end-offset", text: p.end_offset }),
            el("td", { class: "num", text: fmt(r.term) }), el("td", { class: "num", text: fmt(r.commit_index) }),
            el("td", { class: "num", text: fmt(r.log_end) }), el("td", { text: lag }),
            el("td", { "data-testid": "election", text: electionText(r.election) })); // console_topic.js
        }));
      if (count !== d.partitions.length) {
        count = d.partitions.length;
        put(partitionPick, ...d.partitions.map((p) => el("option", { value: p.partition, text: `partition ${p.partition}` })));
      }
    } catch (e) { fail(topic, e); }
  };

  const read = async (offset, append) => {
    const p = partitionPick.value || 0;
    const { body, headers } = await getJson(
      `/api/rest/topics/${enc}/partitions/${p}/records?offset=${offset}&max_bytes=262144${append ? "&timeout=2000" : ""}`,
      { headers: { Accept: "application/vnd.kafka.binary.v2+json" }, signal: state.live ? state.live.signal : undefined });
    if (!append) put(messages, el("tr", {}, ["Offset", "Timestamp", "Key", "Value", "Headers"].map((l) => el("th", { text: l }))));
    for (const r of body) {
      messages.append(el("tr", { "data-testid": `message-${r.offset}` },
        el("td", { class: "num", text: r.offset }),
        el("td", { text: r.timestamp ? new Date(r.timestamp).toISOString() : "—" }),
        el("td", {}, el("pre", { "data-testid": "key", text: shown(r.key) })),
        el("td", {}, el("pre", { "data-testid": "value", text: shown(r.value) })),
        el("td", {}, el("pre", { text: r.headers.map((h) => `${h.name}: ${shown(h.value)}`).join("\n") }))));
    }
    return Number(headers.get("Kafkaesque-Next-Offset") || offset);
  };

  const load = async (newest) => {
    try {
      let offset = Number(offsetInput.value) || 0;
      if (newest) {
        const d = (await getJson(`/api/rest/topics/${enc}`)).body;
        const p = d.partitions.find((x) => String(x.partition) === String(partitionPick.value || 0));
        offset = Math.max(p ? p.start_offset : 0, (p ? p.end_offset : 0) - 20);
        offsetInput.value = offset;
      }
      return await read(offset, false);
    } catch (e) { fail("messages", e); return null; }
  };

  const tail = async () => {
    if (state.live) state.live.abort();
    if (!liveBox.checked) { state.live = null; return; }
    const controller = new AbortController();
    state.live = controller;
    let next = await load(true);
    while (next !== null && state.live === controller && !controller.signal.aborted) {
      try { next = await read(next, true); } catch (e) {
        if (controller.signal.aborted) return;
        fail("live view", e);
        await new Promise((resolve) => setTimeout(resolve, 2000));
      }
    }
  };
  liveBox.addEventListener("change", tail);

  show(el("h1", { text: `Topic ${topic}` }), config, el("h2", { text: "Partitions" }), parts,
    el("h2", { text: "Messages" }),
    el("form", { onsubmit: (e) => { e.preventDefault(); load(false); } },
      el("label", {}, "Partition", partitionPick), el("label", {}, "From offset", offsetInput),
      el("button", { type: "submit", "data-testid": "read", text: "Read" }),
      el("button", { type: "button", "data-testid": "newest", onclick: () => load(true), text: "Newest" }),
      el("label", {}, "Live", liveBox)),
    messages, produceBox);
  every(2, refresh);
  refresh().then(() => load(true));
  produceForm(topic, produceBox);
  topicTools(topic, { messages, partitionPick, offsetInput, load }); // console_topic.js
}

function shown(b64) {
  if (b64 === null || b64 === undefined) return "null";
  const bytes = Uint8Array.from(atob(b64), (c) => c.charCodeAt(0));
  let text = null;
  try { text = new TextDecoder("utf-8", { fatal: true }).decode(bytes); } catch (e) { text = null; }
  if (text !== null && !/[\u0000-\u0008\u000e-\u001f]/.test(text)) {
    try { return JSON.stringify(JSON.parse(text), null, 2); } catch (e) { return text; }
  }
  return Array.from(bytes, (x) => x.toString(16).padStart(2, "0")).join(" ");
}

async function produceForm(topic, box) {
  let who;
  try { who = (await getJson(`/api/whoami?topic=${encodeURIComponent(topic)}`)).body; } catch (e) { return; }
  if (!who.may_write) {
    put(box, el("p", { class: "notice", text: `Read-only: ${who.principal || "this caller"} may not write to ${topic}.` }));
    return;
  }
  const key = el("input", { placeholder: "key (optional)", "data-testid": "produce-key" });
  const value = el("input", { placeholder: "value", size: 40, "data-testid": "produce-value" });
  const result = el("span", { "data-testid": "produce-result" });
  const toB64 = (s) => btoa(String.fromCharCode(...new TextEncoder().encode(s)));
  put(box, el("h2", { text: "Produce" }), el("form", {
    onsubmit: async (e) => {
      e.preventDefault();
      const record = { value: toB64(value.value) };
      if (key.value) record.key = toB64(key.value);
      try {
        const { body } = await getJson(`/api/rest/topics/${encodeURIComponent(topic)}`, {
          method: "POST", headers: { "Content-Type": "application/vnd.kafka.binary.v2+json" },
          body: JSON.stringify({ records: [record] }) });
        const o = body.offsets[0];
        result.textContent = o.error ? `refused: ${o.error}` : `written to partition ${o.partition} at offset ${o.offset}`;
      } catch (err) { result.textContent = `refused: ${err.message}`; }
    } }, el("label", {}, "Key", key), el("label", {}, "Value", value),
    el("button", { type: "submit", "data-testid": "produce", text: "Produce" }), result));
}

// -- consumer groups and MQTT: console_groups_mqtt.js ------------------------------------------

// -- ACLs -------------------------------------------------------------------------------------

async function aclsScreen() {
  const table = el("table", { "data-testid": "acls" });
  const users = el("p", { "data-testid": "users" });
  show(el("h1", { text: "ACLs and users" }), el("p", { text: "Read-only here: `kafkaesque acl` changes the ACLs, `kafkaesque user` the users." }),
    el("h2", { text: "ACLs" }), table, el("h2", { text: "Users" }), users);
  try {
    const body = (await getJson("/api/rest/acls")).body;
    const rows = Array.isArray(body) ? body : body.acls || [];
    put(table, el("tr", {}, ["Principal", "Permission", "Operation", "Resource", "Name", "Pattern"].map((l) => el("th", { text: l }))),
      rows.map((a) => el("tr", {}, [a.principal, a.permission, a.operation, a.resource_type, a.resource_name, a.pattern_type]
        .map((v) => el("td", { text: v ?? "" })))));
    if (!rows.length) table.after(el("p", { text: "No ACLs: every authenticated principal may do everything." }));
    const u = (await getJson("/api/users")).body;
    users.textContent = u.users === null ? "No users file: this broker is open (loopback only)." : u.users.join(", ") || "none";
  } catch (e) { fail("ACLs", e); }
}

// -- the stream -------------------------------------------------------------------------------

function addEvent(e) {
  state.lastSeq = Math.max(state.lastSeq, e.seq);
  const list = document.getElementById("timeline");
  const at = new Date(e.at * 1000).toLocaleTimeString("en-GB");
  list.prepend(el("li", { "data-testid": `event-${e.kind}`, "data-seq": e.seq },
    el("time", { text: at }), el("span", { class: `kind kind-${e.kind}`, text: e.kind }), " ", e.text));
  while (list.children.length > 300) list.lastChild.remove();
}

function connect() {
  const badge = document.getElementById("stream-state");
  const source = new EventSource(`/api/events?after=${state.lastSeq}`);
  source.addEventListener("open", () => { badge.textContent = "live"; badge.className = "state live"; });
  source.addEventListener("error", () => { badge.textContent = "reconnecting"; badge.className = "state lost"; });
  source.addEventListener("overview", (m) => {
    state.overview = JSON.parse(m.data);
    document.getElementById("seen-by").textContent = `(broker ${state.overview.broker})`;
    renderOverview(state.overview);
  });
  source.addEventListener("timeline", (m) => {
    const e = JSON.parse(m.data);
    if (e.seq > state.lastSeq) addEvent(e);
  });
  source.addEventListener("dropped", (m) => {
    const note = document.getElementById("dropped");
    note.hidden = false;
    note.textContent = `${JSON.parse(m.data).count} events were dropped: this tab fell behind.`;
  });
  source.addEventListener("busy", () => { badge.textContent = "too many tabs"; source.close(); });
}

window.addEventListener("hashchange", route);
window.addEventListener("DOMContentLoaded", () => { route(); connect(); });
