"""The report of a run: PNG plots and one HTML page, written next to the history.

* ``throughput.png``: ok sends per second over time, nemesis windows shaded;
* ``latency.png``: each ok send's latency (invoke to ok) over time, log scale, windows shaded;
* ``unavailability.png``: for each fault, seconds from its start to the next successful write;
* ``index.html``: the verdict, the run's settings, the anomaly table with the proving history
  lines, the fault table, what the nemesis did, and the plots.

Everything is computed from the history and the ``CheckResult``, so a report can be rebuilt from
a saved history alone (``write_report``).
"""

from __future__ import annotations

import html
import os
from collections.abc import Sequence

import matplotlib

matplotlib.use("Agg")  # files only, no display

import matplotlib.pyplot as plt
from matplotlib.axes import Axes

from .checker import CheckResult
from .history import Nemesis, Send, read_history

_NS = 1_000_000_000
# One colour per nemesis kind (twelve kinds): matplotlib's tab10 and two of tab20b, shaded at
# half opacity.
_COLORS = (
    "#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd",
    "#8c564b", "#e377c2", "#7f7f7f", "#bcbd22", "#17becf",
    "#393b79", "#e7ba52",
)  # fmt: skip


def _send_series(history: str) -> tuple[list[float], list[float], float]:
    """(ok times s, latencies s, end time s) of the ok sends."""
    invoked: dict[str, int] = {}
    times: list[float] = []
    lats: list[float] = []
    end = 0.0
    for ev in read_history(history):
        end = max(end, ev.time / _NS)
        op = ev.op
        if not isinstance(op, Send):
            continue
        if ev.type == "invoke":
            invoked[op.value] = ev.time
        elif ev.type == "ok" and op.value in invoked:
            times.append(ev.time / _NS)
            lats.append((ev.time - invoked.pop(op.value)) / _NS)
    return times, lats, end


def _shade(ax: Axes, result: CheckResult, end: float) -> None:
    kinds: dict[str, str] = {}
    for w in result.fault_windows:
        color = kinds.setdefault(w.fault, _COLORS[len(kinds) % len(_COLORS)])
        stop = (w.end_ns / _NS) if w.end_ns is not None else end
        label = w.fault if w.fault not in ax.get_legend_handles_labels()[1] else None
        ax.axvspan(w.start_ns / _NS, stop, color=color, alpha=0.3, label=label, lw=0)


def _plots(run_dir: str, history: str, result: CheckResult) -> list[str]:
    times, lats, end = _send_series(history)
    names = []
    fig, ax = plt.subplots(figsize=(11, 3.5))
    _shade(ax, result, end)
    if times:
        bins = max(1, int(end) + 1)
        ax.hist(times, bins=bins, range=(0, bins), histtype="step", color="black", label="ok/s")
    ax.set_xlabel("time (s)")
    ax.set_ylabel("acknowledged sends / s")
    ax.set_xlim(0, max(end, 1))
    ax.legend(loc="upper right", fontsize="small", ncol=4)
    ax.set_title("throughput (nemesis windows shaded)")
    fig.tight_layout()
    fig.savefig(os.path.join(run_dir, "throughput.png"), dpi=90)
    plt.close(fig)
    names.append("throughput.png")

    fig, ax = plt.subplots(figsize=(11, 3.5))
    _shade(ax, result, end)
    if times:
        ax.scatter(times, lats, s=2, color="black", label="send latency")
        ax.set_yscale("log")
    ax.set_xlabel("time (s)")
    ax.set_ylabel("latency (s)")
    ax.set_xlim(0, max(end, 1))
    ax.legend(loc="upper right", fontsize="small", ncol=4)
    ax.set_title("latency of acknowledged sends (invoke to ok)")
    fig.tight_layout()
    fig.savefig(os.path.join(run_dir, "latency.png"), dpi=90)
    plt.close(fig)
    names.append("latency.png")

    fig, ax = plt.subplots(figsize=(11, 3.5))
    windows = result.fault_windows
    if windows:
        xs = [w.start_ns / _NS for w in windows]
        ys = [w.unavailable_s for w in windows]
        colors = ["black" if w.recovered else "red" for w in windows]
        ax.bar(xs, ys, width=max(end / 200, 0.3), color=colors)
        for w, x, y in zip(windows, xs, ys, strict=True):
            ax.annotate(w.fault, (x, y), fontsize=6, rotation=60, ha="left", va="bottom")
    ax.set_xlabel("fault start (s)")
    ax.set_ylabel("s to next ok write")
    ax.set_xlim(0, max(end, 1))
    ax.set_title("unavailability after each fault (red: never recovered)")
    fig.tight_layout()
    fig.savefig(os.path.join(run_dir, "unavailability.png"), dpi=90)
    plt.close(fig)
    names.append("unavailability.png")
    return names


def write_report(
    run_dir: str,
    history: str,
    result: CheckResult,
    settings: str,
    nemesis_log: Sequence[str] = (),
    *,
    examples: int = 20,
) -> str:
    """Write the PNGs and ``index.html`` into ``run_dir``; returns the HTML's path."""
    images = _plots(run_dir, history, result)
    e = html.escape
    verdict = "VALID" if result.valid else "INVALID"
    color = "#2a7a2a" if result.valid else "#b00020"
    rows = []
    for kind, found in result.anomalies.items():
        allowed = sum(a.allowed for a in found)
        proofs = "".join(f"<li>{e(a.describe())}</li>" for a in found[:examples])
        more = f"<li>... and {len(found) - examples} more</li>" if len(found) > examples else ""
        rows.append(
            f"<tr><td>{e(kind)}</td><td>{len(found)}</td><td>{allowed}</td>"
            f"<td><ul>{proofs}{more}</ul></td></tr>"
        )
    faults = "".join(
        f"<tr><td>{e(w.fault)}</td><td>{e(','.join(w.targets))}</td>"
        f"<td>{w.start_ns / _NS:.2f}</td>"
        f"<td>{'-' if w.end_ns is None else f'{w.end_ns / _NS:.2f}'}</td>"
        f"<td>{w.unavailable_s:.2f}{'' if w.recovered else ' (never)'}</td>"
        f"<td>{e(w.gaps_text())}</td></tr>"
        for w in result.fault_windows
    )
    pause = ", ".join(f"{t}/{p} {g:.2f} s" for (t, p), g in sorted(result.pause_gaps.items()))
    pause_line = (
        f"<p>Pauses (SIGSTOP of a leader), longest stretch with no ok send, per partition: "
        f"{e(pause)}.</p>"
        if pause
        else ""
    )
    log = "".join(f"<li>{e(line)}</li>" for line in nemesis_log)
    imgs = "".join(f'<p><img src="{e(name)}" alt="{e(name)}"></p>' for name in images)
    page = f"""<!doctype html>
<html><head><meta charset="utf-8"><title>jepsen_like run: {verdict}</title>
<style>body{{font-family:sans-serif;margin:2em}} table{{border-collapse:collapse}}
td,th{{border:1px solid #ccc;padding:4px 8px;vertical-align:top;font-size:90%}}
pre{{background:#f4f4f4;padding:8px}}</style></head><body>
<h1 style="color:{color}">{verdict}</h1>
<p>{e(settings)}</p>
<pre>{e(result.result_line())}</pre>
<p>history: <a href="history.jsonl">history.jsonl</a> ({result.ops} operations,
{result.acked} acknowledged sends, {result.info_sends} indeterminate, {result.failed_sends}
failed); broker logs in <code>logs/</code>.</p>
<h2>Anomalies</h2>
<table><tr><th>kind</th><th>count</th><th>allowed</th><th>proofs (history lines)</th></tr>
{"".join(rows)}</table>
<h2>Faults and unavailability</h2>
<p>Unavailability: from a fault's start to the first ok send invoked after it.
Max {result.max_unavailable_s:.2f} s. Per partition: the longest stretch of the fault's window
with no ok send to the partition.</p>
{pause_line}
<table><tr><th>fault</th><th>targets</th><th>start (s)</th><th>stop (s)</th>
<th>unavailable (s)</th><th>longest gap per partition</th></tr>{faults}</table>
<h2>What the nemesis did</h2><ul>{log}</ul>
<h2>Plots</h2>{imgs}
<h2>Terminal summary</h2><pre>{e(result.summary())}</pre>
</body></html>
"""
    path = os.path.join(run_dir, "index.html")
    with open(path, "w", encoding="utf-8") as f:
        f.write(page)
    return path


def nemesis_events(history: str) -> int:
    """How many nemesis events a history holds (for quick sanity checks)."""
    return sum(1 for ev in read_history(history) if isinstance(ev.op, Nemesis))
