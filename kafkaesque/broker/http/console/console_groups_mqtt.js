// The console's consumer-group and MQTT screens (docs/console.md), with console.js's helpers
// (el, put, show, getJson, every, fail, fmt, shown). Loaded after console.js.
// /api/groups/{g}: REST's group with each partition's lag in time; /api/mqtt: devices,
// mapping, retained messages, ended sessions; /api/mqtt/devices/{id}: a device's partitions.
"use strict";

// A duration in milliseconds, as people read it ("0 s", "4.2 s", "3 min 5 s", "2 h 10 min").
function duration(ms) {
  if (ms === null || ms === undefined) return "—";
  const s = ms / 1000;
  if (s < 60) return `${s < 10 && s > 0 ? s.toFixed(1) : Math.round(s)} s`;
  if (s < 3600) return `${Math.floor(s / 60)} min ${Math.round(s % 60)} s`;
  if (s < 86400) return `${Math.floor(s / 3600)} h ${Math.round((s % 3600) / 60)} min`;
  return `${Math.floor(s / 86400)} d ${Math.round((s % 86400) / 3600)} h`;
}
const when = (ms) => (ms ? new Date(ms).toISOString().replace("T", " ").replace(/\.\d+Z$/, "Z") : "—");

// -- consumer groups --------------------------------------------------------------------------

function groupsScreen() {
  const table = el("table", { "data-testid": "groups" });
  show(el("h1", { text: "Consumer groups" }), table);
  every(3, async () => {
    try {
      const groups = (await getJson("/api/rest/consumer-groups")).body;
      put(table, el("tr", {}, ["Group", "State", "Topics (members)"].map((l) => el("th", { text: l }))),
        groups.map((g) => el("tr", { "data-testid": `group-${g.group_id}` },
          el("td", {}, el("a", { href: `#/group/${encodeURIComponent(g.group_id)}`, text: g.group_id })),
          el("td", { text: g.state }),
          el("td", { text: g.topics.map((t) => `${t.topic} (${t.members})`).join(", ") }))));
    } catch (e) { fail("groups", e); }
  });
}

function lagTable(topic, partitions) {
  return el("table", {}, el("tr", {}, ["Partition", "Owner", "Committed", "End", "Lag", "Lag in time"].map((l) => el("th", { text: l }))),
    partitions.map((p) => el("tr", { "data-testid": `lag-${topic}-${p.partition}` },
      el("td", { text: p.partition }), el("td", { text: p.owner ?? "—" }),
      el("td", { class: "num", "data-testid": "committed", text: fmt(p.committed_offset) }),
      el("td", { class: "num", "data-testid": "end-offset", text: fmt(p.end_offset) }),
      el("td", { class: "num", "data-testid": "lag", text: fmt(p.lag) }),
      el("td", { class: "num", "data-testid": "lag-time", "data-ms": p.lag_ms ?? "",
        title: p.oldest_unconsumed_ms ? `oldest unconsumed record: ${when(p.oldest_unconsumed_ms)}` : null,
        text: duration(p.lag_ms) }))));
}

function groupScreen(group) {
  const enc = encodeURIComponent(group);
  const body = el("div", { "data-testid": "group" });
  const preview = el("div", { "data-testid": "reset-preview" });
  const topicPick = el("select", {});
  const toPick = el("select", { "data-testid": "reset-to" }, ["earliest", "latest"].map((t) => el("option", { value: t, text: t })));
  const reset = async (dryRun) => {
    try {
      const answer = (await getJson(`/api/rest/consumer-groups/${enc}/reset`, {
        method: "POST", headers: { "Content-Type": "application/json" },
        body: JSON.stringify({ topic: topicPick.value, to: toPick.value, dry_run: dryRun }) })).body;
      put(preview, el("pre", { text: JSON.stringify(answer, null, 2) }));
    } catch (e) { put(preview, el("p", { class: "error", text: `refused: ${e.message}` })); }
  };
  show(el("h1", { text: `Group ${group}` }), body, el("h2", { text: "Reset offsets" }),
    el("form", { onsubmit: (e) => { e.preventDefault(); reset(true); } },
      el("label", {}, "Topic", topicPick), el("label", {}, "To", toPick),
      el("button", { type: "submit", "data-testid": "reset-preview-button", text: "Preview" }),
      el("button", { type: "button", onclick: () => confirm(`Reset ${group}?`) && reset(false), text: "Reset" }),
      el("button", { type: "button", onclick: async () => {
        if (!confirm(`Delete group ${group}?`)) return;
        try { await fetch(`/api/rest/consumer-groups/${enc}`, { method: "DELETE" }); location.hash = "#/groups"; } catch (e) { fail(group, e); }
      }, text: "Delete group" })), preview);
  every(3, async () => {
    try {
      const g = (await getJson(`/api/groups/${enc}`)).body;
      if (topicPick.options.length !== g.topics.length) {
        put(topicPick, ...g.topics.map((t) => el("option", { value: t.topic, text: t.topic })));
      }
      put(body, el("p", { text: `State: ${g.state}. Lag in time: how old the oldest record not consumed yet is (the one at the committed offset).` }),
        g.topics.map((t) => [
          el("h2", { text: `${t.topic}: ${t.state}` }),
          el("p", { text: `Members: ${t.members.map((m) => `${m.member_id} [${m.partitions.join(", ")}]`).join("; ") || "none"}` }),
          lagTable(t.topic, t.partitions)]));
    } catch (e) { fail(group, e); }
  });
}

// -- MQTT -------------------------------------------------------------------------------------

function mqttScreen() {
  const box = el("div", { "data-testid": "mqtt" });
  show(el("h1", { text: "MQTT" }), box);
  const deviceLink = (id) => el("a", { href: `#/device/${encodeURIComponent(id)}`, text: id });
  const more = (shown, count, what) => (count > shown ? el("p", { class: "notice", text: `…and ${count - shown} more ${what}.` }) : null);
  every(3, async () => {
    try {
      const m = (await getJson("/api/mqtt")).body;
      if (!m.enabled) { put(box, el("p", { text: "This broker has no MQTT listener (--mqtt-listen)." })); return; }
      const topicLink = (t) => el("a", { href: `#/topic/${encodeURIComponent(t)}`, text: t });
      put(box,
        el("p", { text: `${m.connected} devices connected to this broker; ${m.retained_count} retained messages; ` +
          `${m.sessions_count} persistent sessions waiting for their device; ` +
          `${fmt(m.stats.messages_in ?? 0)} messages in, ${fmt(m.stats.messages_out)} out.` }),
        el("form", { onsubmit: (e) => { e.preventDefault(); location.hash = `#/device/${encodeURIComponent(e.target.elements.device.value)}`; } },
          el("label", {}, "Device (client id)", el("input", { name: "device", "data-testid": "device-pick", size: 24 })),
          el("button", { type: "submit", text: "Show" })),
        el("h2", { text: "Connected devices" }),
        el("table", { "data-testid": "devices" },
          el("tr", {}, ["Client id", "Address", "User", "Subscriptions", "Queued bytes", "Dropped"].map((l) => el("th", { text: l }))),
          m.devices.map((d) => el("tr", { "data-testid": `device-${d.client_id}` },
            el("td", {}, deviceLink(d.client_id)), el("td", { text: d.address }), el("td", { text: d.username ?? "—" }),
            el("td", { "data-testid": "subscriptions", text: d.subscriptions.join(", ") || "none" }),
            el("td", { class: "num", text: fmt(d.queued_bytes) }), el("td", { class: "num", text: fmt(d.dropped) })))),
        more(m.devices.length, m.connected, "devices"),
        el("h2", { text: "Persistent sessions of disconnected devices" }),
        el("table", { "data-testid": "sessions" },
          el("tr", {}, ["Client id", "Left at", "Expires", "Queued (at most)", "Subscriptions"].map((l) => el("th", { text: l }))),
          m.sessions.map((s) => el("tr", { "data-testid": `session-${s.client_id}` },
            el("td", {}, deviceLink(s.client_id)), el("td", { text: when(s.ended_ms) }),
            el("td", { text: s.expiry_s === null ? "never" : `after ${duration(s.expiry_s * 1000)}` }),
            el("td", { class: "num", "data-testid": "queued", text: fmt(s.queued) }),
            el("td", { "data-testid": "subscriptions", text: s.subscriptions.join(", ") || "none" })))),
        more(m.sessions.length, m.sessions_count, "sessions"),
        el("h2", { text: "Retained messages" }),
        el("table", { "data-testid": "retained" },
          el("tr", {}, ["MQTT topic", "Size (bytes)", "QoS", "Published at"].map((l) => el("th", { text: l }))),
          m.retained.map((r) => el("tr", { "data-testid": `retained-${r.topic}` },
            el("td", { text: r.topic }), el("td", { class: "num", "data-testid": "size", text: fmt(r.size) }),
            el("td", { class: "num", "data-testid": "qos", text: r.qos }), el("td", { text: when(r.at_ms) })))),
        more(m.retained.length, m.retained_count, "retained messages"),
        el("h2", { text: "Topic mapping (MQTT topic filter → log topic)" }),
        el("table", { "data-testid": "mapping" },
          el("tr", {}, ["Filter", "Log topic", "Key"].map((l) => el("th", { text: l }))),
          m.mapping.map((r) => el("tr", {}, el("td", { text: r.filter }), el("td", {}, topicLink(r.log_topic)),
            el("td", { text: r.key_level === null ? "none" : r.key_level === -1 ? "the MQTT topic" : `level ${r.key_level}` }))),
          el("tr", {}, el("td", { text: "# (anything else)" }), el("td", {}, topicLink(m.default_log_topic)), el("td", { text: "the MQTT topic" }))));
    } catch (e) { fail("MQTT", e); }
  });
}

// -- a device: from its MQTT topics to its log partitions ---------------------------------------

function deviceScreen(clientId) {
  const box = el("div", { "data-testid": "device" });
  show(el("h1", { text: `Device ${clientId}` }), box);
  every(3, async () => {
    try {
      const d = (await getJson(`/api/mqtt/devices/${encodeURIComponent(clientId)}`)).body;
      const state = d.connected ? `connected here from ${d.address}` :
        d.session_ended_ms ? `disconnected since ${when(d.session_ended_ms)} (its session is kept)` : "not connected here";
      put(box,
        el("p", { "data-testid": "device-state", text: `${state}; subscriptions: ${d.subscriptions.join(", ") || "none"}.` }),
        d.routes.length ? null : el("p", { text: "It has published nothing through this broker (open the console of the broker it is connected to)." }),
        d.routes.map((r, i) => el("section", { class: "route", "data-testid": `route-${i}` },
          el("h2", {}, `${r.mqtt_topic} → `, el("a", { href: `#/topic/${encodeURIComponent(r.log_topic)}`, "data-testid": "log-topic", text: r.log_topic }),
            " partition ", el("span", { "data-testid": "partition", text: r.partition })),
          r.error ? el("p", { class: "error", text: `refused: ${r.error}` }) : null,
          el("p", { text: `Key ${r.key === null ? "none (the partition follows the client id)" : JSON.stringify(r.key)}; leader broker ${r.leader ?? "none"}; end offset ${fmt(r.end_offset)}.` }),
          el("h3", { text: "Latest value" }),
          r.latest ? el("div", {}, el("p", { text: `offset ${r.latest.offset} (${r.latest.by})` }),
            el("pre", { "data-testid": "latest-value", text: shown(r.latest.value) })) :
            el("p", { "data-testid": "latest-value", text: "none found" }),
          el("h3", { text: "Consumer groups reading this partition" }),
          r.groups.length ? el("table", { "data-testid": "readers" },
            el("tr", {}, ["Group", "Owner", "Committed", "Lag", "Lag in time"].map((l) => el("th", { text: l }))),
            r.groups.map((g) => el("tr", { "data-testid": `reader-${g.group_id}` },
              el("td", {}, el("a", { href: `#/group/${encodeURIComponent(g.group_id)}`, text: g.group_id })),
              el("td", { text: g.owner ?? "—" }), el("td", { class: "num", text: fmt(g.committed_offset) }),
              el("td", { class: "num", "data-testid": "lag", text: fmt(g.lag) }),
              el("td", { class: "num", "data-testid": "lag-time", text: duration(g.lag_ms) })))) :
            el("p", { text: "none" }))));
    } catch (e) { fail(`device ${clientId}`, e); }
  });
}
