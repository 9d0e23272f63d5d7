// Funnel Studio: the Simulate tab (`funnel simulate` with the funnel's personas against a
// chosen model, in a temporary schema; one run at a time; progress polled; cancellable).
"use strict";
(function () {
  const $ = id => document.getElementById(id);
  const {el, api, message} = window.StudioDom;
  const short = p => p.split("/").slice(-2).join("/");
  const pct = r => (r.rate * 100).toFixed(0) + "%";

  const personas = el("select", {id: "simulate-personas", "data-testid": "simulate-personas"});
  const model = el("select", {id: "simulate-model", "data-testid": "simulate-model"});
  const other = el("input", {id: "simulate-model-name", "data-testid": "simulate-model-name", placeholder: "gpt-4o-mini or scripted:PATH", hidden: true, size: 28});
  const n = el("input", {id: "simulate-n", "data-testid": "simulate-n", type: "number", min: 1, max: 1000, value: 8, size: 4});
  const seed = el("input", {id: "simulate-seed", "data-testid": "simulate-seed", type: "number", min: 0, value: 1, size: 4});
  const run = el("button", {type: "button", "data-testid": "simulate-run", text: "Simulate"});
  const cancel = el("button", {type: "button", "data-testid": "simulate-cancel", text: "Cancel", disabled: true});
  const bar = el("progress", {max: 1, value: 0});
  const progress = el("div", {"data-testid": "simulate-progress", class: "progress"}, bar, el("span", {id: "simulate-progress-text"}));
  const note = el("div", {"data-testid": "simulate-note", class: "mute"});
  const table = el("div", {"data-testid": "simulate-table", class: "sim-table"});
  const convs = el("details", {class: "sim-convs"}, el("summary", {text: "conversations"}), el("div", {id: "simulate-convs"}));
  const main = el("main", {id: "simulate-main", class: "tool"}, el("section", {},
    el("div", {class: "toolbar"}, el("label", {}, "personas ", personas), el("label", {}, "model ", model), other,
      el("label", {}, "conversations ", n), el("label", {}, "seed ", seed), run, cancel),
    el("div", {class: "mute", text: "Simulated customers talk to the funnel in a temporary schema that is dropped afterwards: no session of the studio or of a customer is written, and nothing is sent."}),
    progress, note, table, convs));
  let timer = null;

  function cell(r) {
    return el("td", {title: r.k + " of " + r.n + ", 95% interval " + (r.low * 100).toFixed(0) + "–" + (r.high * 100).toFixed(0) + "%"}, pct(r),
      el("small", {class: "mute", text: " (" + r.k + "/" + r.n + ")"}));
  }
  function draw(r) {
    if (!r) { progress.hidden = true; return; }
    progress.hidden = false;
    bar.max = r.n; bar.value = r.done;
    const words = {running: "running", cancelling: "cancelling", done: "done", cancelled: "cancelled", failed: "failed"};
    $("simulate-progress-text").textContent = " " + r.done + " of " + r.n + " conversations · " + words[r.state] + " · " + r.seconds.toFixed(1) + " s";
    progress.dataset.state = r.state;
    note.textContent = r.error ? r.error : r.state === "cancelled" ? "cancelled: the figures are of the conversations finished before" : "";
    note.className = r.error ? "no" : "mute";
    const busy = r.state === "running" || r.state === "cancelling";
    run.disabled = busy; cancel.disabled = !busy || r.state === "cancelling";
    if (!r.table.length) { table.replaceChildren(); $("simulate-convs").replaceChildren(); return; }
    const head = el("tr", {}, el("th", {text: "persona"}), el("th", {text: "conversations"}), el("th", {text: "turns (avg)"}),
      el("th", {text: "hand-off"}), ...r.stages.map(s => el("th", {text: "reach " + s})));
    const rows = r.table.map(row => el("tr", {"data-group": row.group, class: row.group === "all" ? "all" : null},
      el("td", {text: row.group}), el("td", {text: String(row.conversations)}), el("td", {text: row.turns.toFixed(1)}),
      cell(row.handoff_rate), ...r.stages.map(s => cell(row.reach[s]))));
    table.replaceChildren(el("table", {class: "sessions"}, el("thead", {}, head), el("tbody", {}, ...rows)));
    $("simulate-convs").replaceChildren(el("table", {class: "sessions"}, el("tbody", {}, ...r.conversations.map(c =>
      el("tr", {}, el("td", {text: c.persona}), el("td", {text: c.stage}), el("td", {text: c.turns + " turn(s)"}),
        el("td", {text: c.handoff ? "handed off" : ""}), el("td", {class: "mute", text: c.ended}))))));
  }
  async function poll() {
    clearTimeout(timer);
    const res = await api("simulate");
    if (!res.ok) { note.textContent = message(res); return; }
    draw(res.data.run);
    if (res.data.run && (res.data.run.state === "running" || res.data.run.state === "cancelling")) timer = setTimeout(poll, 300);
  }
  async function options() {
    const res = await api("simulate/options?funnel=" + encodeURIComponent($("funnel").value));
    if (!res.ok) { note.textContent = message(res); return; }
    const d = res.data;
    personas.replaceChildren(...d.personas.map(p => el("option", {value: p, text: short(p)})));
    if (!d.personas.length) personas.append(el("option", {value: "", text: "none: put a personas.yaml beside the funnel"}));
    model.replaceChildren(...d.scripts.map(s => el("option", {value: s, text: "scripted: " + short(s)})),
      el("option", {value: "", text: "the funnel's model (" + d.model + ")"}), el("option", {value: "other", text: "another model…"}));
    other.hidden = true;
  }
  async function start() {
    if (!personas.value) { note.textContent = "no personas file in the funnel's folder: put a personas.yaml beside the funnel (docs/evidence.md)"; note.className = "no"; return; }
    const chosen = model.value === "other" ? other.value.trim() : model.value;
    const res = await api("simulate", {funnel: $("funnel").value, personas: personas.value, model: chosen,
      n: parseInt(n.value, 10) || 8, seed: parseInt(seed.value, 10) || 0});
    if (!res.ok) { note.textContent = message(res); note.className = "no"; return; }
    draw(res.data); poll();
  }

  window.FunnelStudioTab("tab-simulate", "Simulate", "tab-simulate", main);
  main.addEventListener("shown", () => { options(); poll(); });
  $("funnel").addEventListener("change", () => { if (!main.hidden) options(); });
  model.addEventListener("change", () => { other.hidden = model.value !== "other"; });
  run.addEventListener("click", start);
  cancel.addEventListener("click", async () => { const res = await api("simulate/cancel", {funnel: $("funnel").value}); if (res.ok) draw(res.data.run); poll(); });
  progress.hidden = true;
})();
