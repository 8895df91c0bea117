// The console's who-hears-whom matrix (overview) and the topic screen's tools: messages by
// time, a bounded key/value search, export as JSON lines and the latest value of a key
// (docs/console.md). Loaded after console.js, whose helpers (el, put, getJson, shown, fmt) it
// uses; console.js calls renderHeard, electionText and topicTools.
"use strict";

// -- overview: who hears whom -----------------------------------------------------------------

// A matrix of the brokers: row A, column B says whether A hears B now (its Raft pings), as the
// console's broker sees it (its own pings) or as A last told it (A's PeerView, each second).
function renderHeard(box, o) {
  const ids = o.brokers.map((b) => b.id);
  const cell = (row, col) => {
    if (row.id === col) return el("td", { class: "num", text: "—" });
    const heard = (row.hears || {})[String(col)];
    const [text, cls, title] = heard === true ? ["✓", "up", "hears"]
      : heard === false ? ["✗", "down", "does not hear"] : ["?", "down", "unknown: no recent word from it"];
    return el("td", { class: `num ${cls}`, "data-testid": `heard-${row.id}-${col}`, "data-heard": String(heard ?? "unknown"),
      title: `broker ${row.id} ${title} broker ${col}`, text });
  };
  box.append(el("h2", { text: "Who hears whom (row hears column)" }),
    el("table", { "data-testid": "heard", class: "matrix" },
      el("tr", {}, el("th", { text: "broker" }), ids.map((id) => el("th", { class: "num", text: id }))),
      o.brokers.map((row) => el("tr", { "data-testid": `heard-row-${row.id}` },
        el("th", { class: row.up ? "" : "down", text: row.id }), ids.map((col) => cell(row, col))))));
}

// -- a topic: the last election of a partition --------------------------------------------------

function electionText(e) {
  if (!e) return "—";
  const at = new Date(e.at_ms).toISOString().replace("T", " ").replace(/\.\d+Z$/, " UTC");
  return `term ${e.term}: broker ${e.leader}, ${e.cause}, ${at}`;
}

// -- a topic: by time, search, export, latest ---------------------------------------------------

// ctx: the topic screen's messages table, partition picker, offset input and load(newest).
function topicTools(topic, ctx) {
  const enc = encodeURIComponent(topic);
  const partition = () => ctx.partitionPick.value || 0;

  // Messages by time: the first offset at or after it (DESCRIBE time=, the time index).
  const when = el("input", { type: "datetime-local", step: "0.001", "data-testid": "message-time" });
  const timeNote = el("span", { "data-testid": "time-result" });
  const byTime = async () => {
    const ms = new Date(when.value).getTime();
    if (!Number.isFinite(ms) || ms < 0) { timeNote.textContent = "give a date and time"; return; }
    try {
      const body = (await getJson(`/api/topics/${enc}/offsets?time=${ms}`)).body;
      const row = body.partitions.find((p) => String(p.partition) === String(partition()));
      if (!row) throw new Error(`no partition ${partition()}`);
      timeNote.dataset.timeMs = String(ms);
      timeNote.dataset.offset = String(row.offset);
      timeNote.textContent = row.offset === row.end_offset
        ? `no record at or after ${new Date(ms).toISOString()}: the end, offset ${fmt(row.offset)}`
        : `first record at or after ${new Date(ms).toISOString()}: offset ${fmt(row.offset)}`;
      ctx.offsetInput.value = row.offset;
      await ctx.load(false);
    } catch (e) { timeNote.textContent = `refused: ${e.message}`; }
  };

  // Export the shown range as JSON lines, through the same read path (FETCH).
  const exportLink = el("a", { href: "#", download: "", "data-testid": "export", text: "Export the shown records (JSON lines)" });
  exportLink.addEventListener("click", (e) => {
    const offsets = [...ctx.messages.querySelectorAll("tr[data-testid^='message-']")]
      .map((r) => Number(r.dataset.testid.slice("message-".length)));
    if (!offsets.length) { e.preventDefault(); return; }
    const first = Math.min(...offsets), last = Math.max(...offsets);
    exportLink.href = `/api/topics/${enc}/partitions/${partition()}/export?offset=${first}&end=${last + 1}`;
  });

  // Search a bounded range: at most 10,000 records scanned from the offset given above.
  const q = el("input", { placeholder: "text", "data-testid": "search-q" });
  const where = el("select", { "data-testid": "search-in" },
    [["value", "value contains"], ["key", "key contains"], ["exact-key", "key is"]].map(([v, t]) => el("option", { value: v, text: t })));
  const summary = el("p", { "data-testid": "search-summary" });
  const found = el("table", { "data-testid": "search-results" });
  const search = async () => {
    const from = Number(ctx.offsetInput.value) || 0;
    try {
      const r = (await getJson(`/api/topics/${enc}/partitions/${partition()}/search?offset=${from}` +
        `&in=${where.value}&q=${encodeURIComponent(q.value)}`)).body;
      summary.textContent = `${fmt(r.found)} found in ${fmt(r.scanned)} records scanned (offsets ${fmt(r.from)} to ` +
        `${fmt(r.next_offset - 1)}, at most ${fmt(r.limit)})` + (r.end_reached ? "; the end of the partition." : `; search on from ${fmt(r.next_offset)}.`) +
        (r.found > r.matches.length ? ` The first ${r.matches.length} are shown.` : "");
      put(found, el("tr", {}, ["Offset", "Timestamp", "Key", "Value"].map((l) => el("th", { text: l }))),
        r.matches.map((m) => el("tr", { "data-testid": `found-${m.offset}` },
          el("td", { class: "num", text: m.offset }),
          el("td", { text: m.timestamp ? new Date(m.timestamp).toISOString() : "—" }),
          el("td", {}, el("pre", { "data-testid": "key", text: shown(m.key) })),
          el("td", {}, el("pre", { "data-testid": "value", text: shown(m.value) })))));
    } catch (e) { summary.textContent = `refused: ${e.message}`; put(found); }
  };

  // The latest value of a key (REST's GET /topics/{t}/latest/{key}: LATEST, compacted topics).
  const key = el("input", { placeholder: "key", "data-testid": "latest-key" });
  const latestNote = el("div", { "data-testid": "latest-result" });
  const latest = async () => {
    try {
      const r = (await getJson(`/api/rest/topics/${enc}/latest/${encodeURIComponent(key.value)}`,
        { headers: { Accept: "application/vnd.kafka.binary.v2+json" } })).body;
      put(latestNote, el("p", { text: `partition ${r.partition}, offset ${fmt(r.offset)}:` }),
        el("pre", { "data-testid": "value", text: shown(r.value) }));
    } catch (e) { put(latestNote, el("p", { class: e.status === 404 ? "notice" : "error", text: e.message })); }
  };

  const form = (submit, ...children) => el("form", { onsubmit: (e) => { e.preventDefault(); submit(); } }, ...children);
  ctx.messages.after(el("div", { "data-testid": "topic-tools" },
    form(byTime, el("label", {}, "From a time (your time zone)", when),
      el("button", { type: "submit", "data-testid": "read-time", text: "Read from time" }), timeNote),
    el("p", {}, exportLink),
    el("h2", { text: "Search (from the offset above, at most 10,000 records)" }),
    form(search, el("label", {}, "Look for", q), el("label", {}, "In", where),
      el("button", { type: "submit", "data-testid": "search", text: "Search" })),
    summary, found,
    el("h2", { text: "Latest value of a key (compacted topics)" }),
    form(latest, el("label", {}, "Key", key), el("button", { type: "submit", "data-testid": "latest", text: "Latest" })),
    latestNote));
}
