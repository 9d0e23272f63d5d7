// Funnel Studio: the Scenarios tab (run all of the funnel's scenarios, accept a failing one
// after its diff) and "Save as scenario" (a chosen name; asks before overwriting).
"use strict";
(function () {
  const $ = id => document.getElementById(id);
  const {el, api, message} = window.StudioDom;
  function button(testid, text, onclick, cls) {
    const b = el("button", {type: "button", "data-testid": testid, text, class: cls});
    b.addEventListener("click", onclick);
    return b;
  }
  const funnel = () => $("funnel").value;
  const session = () => $("session").textContent;

  // -- a tab of its own (hides the others' panels; theirs hide it) -----------------------
  function addTab(id, label, testid, main) {
    const nav = document.querySelector("header nav");
    const t = el("button", {id, class: "tab", type: "button", "data-testid": testid, text: label});
    nav.insertBefore(t, $("open-report"));
    main.hidden = true;
    document.body.insertBefore(main, document.querySelector("body > script"));
    t.addEventListener("click", () => {
      for (const m of document.querySelectorAll("body > main")) m.hidden = m !== main;
      for (const b of document.querySelectorAll("header nav .tab")) b.classList.toggle("on", b === t);
      main.dispatchEvent(new Event("shown"));
    });
    nav.addEventListener("click", e => {
      const other = e.target.closest(".tab");
      if (other && other !== t) { main.hidden = true; t.classList.remove("on"); }
    });
    return t;
  }
  window.FunnelStudioTab = addTab;  // simulate.js uses it too

  // -- the Scenarios tab ---------------------------------------------------------------
  const list = el("div", {id: "scenario-list", "data-testid": "scenario-list", class: "scenario-list"});
  const diffBox = el("div", {id: "scenario-diff-box", class: "scenario-diff", hidden: true});
  const status = el("span", {id: "scenario-status", "data-testid": "scenario-status", class: "mute"});
  const main = el("main", {id: "scenarios-main", class: "tool"},
    el("section", {},
      el("div", {class: "toolbar"}, button("run-all-scenarios", "Run all scenarios", runAll), status),
      diffBox, list));
  const tabButton = addTab("tab-scenarios", "Scenarios", "tab-scenarios", main);

  function failureRow(f) {
    const where = f.turn ? "turn " + f.turn + (f.customer ? " (customer: “" + f.customer + "”)" : "") : "the scenario";
    return el("div", {class: "failure", "data-testid": "scenario-failure", "data-turn": f.turn || ""},
      el("div", {class: "where", text: where + ", line " + f.line}),
      f.expectation ? el("div", {}, el("span", {class: "mute", text: "expected "}),
        el("code", {"data-testid": "scenario-expectation", text: f.expectation})) : null,
      el("div", {class: "got", text: f.message}));
  }
  function item(r) {
    const failing = !r.passed;
    return el("div", {class: "scenario " + (r.passed ? "yes" : "no"), "data-testid": "scenario-item",
      "data-name": r.name, "data-passed": String(r.passed)},
      el("div", {class: "head"},
        el("strong", {text: (r.passed ? "PASS " : r.errored ? "ERROR " : "FAIL ") + r.name}),
        el("span", {class: "mute", text: " " + r.file.split("/").pop() + " · " + r.turns + " turn(s)"}),
        failing && !r.errored ? button("accept-scenario", "Accept the new result…", () => preview(r)) : null),
      ...r.failures.map(failureRow));
  }
  async function runAll() {
    diffBox.hidden = true;
    status.textContent = "running the funnel's scenarios…";
    list.replaceChildren();
    const res = await api("scenarios/run", {funnel: funnel()});
    if (!res.ok) { status.textContent = message(res); return; }
    const rs = res.data.results;
    const failed = rs.filter(r => !r.passed).length;
    status.textContent = rs.length ? rs.length + " scenario(s) in " + res.data.folder + ": " + (rs.length - failed) + " passed, " + failed + " failed"
      : "no scenario in " + res.data.folder + " yet: Save as scenario writes there";
    status.dataset.folder = res.data.folder;
    list.replaceChildren(...rs.map(item));
  }
  function diffView(text) {
    const pre = el("pre", {"data-testid": "scenario-diff", class: "diff"});
    for (const line of text.replace(/\n$/, "").split("\n")) {
      const cls = line.startsWith("+") && !line.startsWith("+++") ? "add" : line.startsWith("-") && !line.startsWith("---") ? "del" : null;
      pre.append(el("span", {class: cls, text: line + "\n"}));
    }
    return pre;
  }
  async function preview(r) {
    diffBox.hidden = false;
    diffBox.replaceChildren(el("div", {text: "re-recording " + r.name + " from what the engine does now…"}));
    const res = await api("scenarios/accept", {funnel: funnel(), file: r.file});
    if (!res.ok) { diffBox.replaceChildren(el("div", {class: "no", text: message(res)})); return; }
    const d = res.data;
    diffBox.replaceChildren(
      el("div", {text: "Accepting " + r.name + " writes what the engine does now as its expected result (" + d.changes.length + " expectation(s)):"}),
      diffView(d.diff || "(no change)"),
      el("div", {class: "toolbar"},
        button("accept-confirm", "Accept and write " + r.file.split("/").pop(), () => acceptIt(r, d.digest)),
        button("accept-cancel", "Cancel", () => { diffBox.hidden = true; })));
    diffBox.scrollIntoView({block: "nearest"});
  }
  async function acceptIt(r, digest) {
    const res = await api("scenarios/accept", {funnel: funnel(), file: r.file, confirm: digest});
    if (!res.ok) { diffBox.replaceChildren(el("div", {class: "no", text: message(res)})); return; }
    diffBox.hidden = true;
    const now = res.data.result;
    const old = [...list.children].find(e => e.dataset.name === r.name);
    if (old) old.replaceWith(item(now)); else list.append(item(now));
    status.textContent = "accepted " + r.name + " (" + res.data.file + "): it " + (now.passed ? "passes" : "still fails") + " now";
  }

  // -- Save as scenario: a name, and a question before overwriting ----------------------
  const nameBox = el("input", {id: "scenario-name", "data-testid": "scenario-name", size: 28, spellcheck: "false"});
  const asked = el("div", {id: "scenario-ask", "data-testid": "scenario-overwrite-ask", class: "ask", hidden: true});
  const saveBox = el("div", {id: "scenario-save", "data-testid": "scenario-save", class: "scenario-save", hidden: true},
    el("label", {}, "scenario name ", nameBox),
    button("scenario-save-confirm", "Save", () => save(false)),
    button("scenario-save-cancel", "Cancel", () => { saveBox.hidden = true; }), asked);
  function out(text) { const o = $("scenario-out"); o.hidden = false; o.textContent = text; }
  async function save(overwrite) {
    asked.hidden = true;
    const res = await api("scenario", {funnel: funnel(), session: session(), name: nameBox.value.trim(), overwrite});
    if (res.status === 409) {
      asked.hidden = false;
      asked.replaceChildren(el("span", {text: message(res) + " "}),
        button("scenario-overwrite", "Overwrite it", () => save(true)),
        button("scenario-rename", "Choose another name", () => { asked.hidden = true; nameBox.select(); }));
      return;
    }
    if (!res.ok) { out(message(res)); return; }
    saveBox.hidden = true;
    out((res.data.overwritten ? "overwrote " : "saved ") + res.data.turns + " turn(s) to " + res.data.file);
  }
  function askName() {
    saveBox.hidden = false; asked.hidden = true;
    if (!nameBox.value || nameBox.dataset.session !== session()) nameBox.value = session();
    nameBox.dataset.session = session();
    nameBox.focus(); nameBox.select();
  }

  window.addEventListener("DOMContentLoaded", () => {
    $("scenario-out").before(saveBox);
    $("save").addEventListener("click", askName);
    nameBox.addEventListener("keydown", e => { if (e.key === "Enter") { e.preventDefault(); save(false); } });
    $("run").addEventListener("click", () => { tabButton.click(); runAll(); });
  });
})();
