// Funnel Studio's page: plain JavaScript, no framework, no network but the studio itself.
"use strict";
(function () {
  const $ = id => document.getElementById(id);
  const {el, api} = window.StudioDom;
  const S = {funnels: {}, funnel: null, session: null, view: null, generation: {}, offset: 0,
    total: 0, branchEdit: null, listOffset: 0, form: null, drill: {}};
  // The report's filters (its numbers link to the list with these in the address).
  const DRILL = {started: "started in the last", reached: "reached", stopped: "went no further than",
    bought: "bought", fell_back: "a turn fell back in the last", fallback_stage: "fell back in"};

  const show = v => typeof v === "string" ? v : JSON.stringify(v);
  // What the page did, for the page's other scripts (desk.js): "studio:rendered" (a session's
  // panels), "studio:transcript" (a page of turns drawn), "studio:tab", "studio:turn" (a turn's li).
  const emit = (name, detail) => document.dispatchEvent(new CustomEvent("studio:" + name, {detail}));
  function newId() {
    const a = new Uint8Array(4); crypto.getRandomValues(a);
    return "studio-" + [...a].map(b => b.toString(16).padStart(2, "0")).join("");
  }
  function notice(text, warn) {
    const n = $("notice");
    n.hidden = !text; n.textContent = text || ""; n.className = "notice" + (warn ? " warn" : "");
  }
  function failed(res) { notice((res.data && res.data.error && res.data.error.message) || ("failed: " + res.status), true); }
  const q = o => Object.entries(o).filter(([, v]) => v !== "" && v !== null && v !== undefined)
    .map(([k, v]) => encodeURIComponent(k) + "=" + encodeURIComponent(v)).join("&");

  // -- panels -------------------------------------------------------------------------
  function drawGraph(view) {
    const f = S.funnels[S.funnel];
    const box = $("graph");
    if (box.dataset.svgFor !== f.svgKey) { box.innerHTML = f.svg; box.dataset.svgFor = f.svgKey; }  // server-escaped SVG
    box.querySelectorAll(".node").forEach(n => n.classList.remove("current", "visited"));
    box.querySelectorAll(".edge").forEach(e => e.classList.remove("held", "not-held"));
    for (const s of view.history || []) { const n = box.querySelector(`.node[data-stage="${CSS.escape(s)}"]`); if (n) n.classList.add("visited"); }
    const cur = box.querySelector(`.node[data-stage="${CSS.escape(view.stage)}"]`);
    if (cur) cur.classList.add("current");
    box.dataset.current = view.stage;
    for (const step of (view.why && view.why.steps) || []) {
      for (const t of step.transitions || []) {
        const from = t.global ? "*" : step.stage;
        box.querySelectorAll(`.edge[data-from="${CSS.escape(from)}"][data-to="${CSS.escape(t.to)}"]`).forEach(e => {
          if ((e.dataset.when || "") === (t.when || "")) e.classList.add(t.held ? "held" : "not-held");
        });
      }
    }
  }
  function drawCompleteness(c) {
    const box = $("completeness"); box.replaceChildren();
    if (!c) { box.append(el("p", {class: "hint", text: "this funnel scores no completeness"})); return; }
    box.append(el("div", {}, el("span", {class: "score", "data-testid": "completeness-score", text: String(c.score ?? 0)}),
      el("span", {text: " / " + c.max + "  " + c.field})));
    const ul = el("ul", {class: "rules"});
    for (const r of c.rules) ul.append(el("li", {class: r.held ? "held" : "not-held"},
      el("span", {}, el("span", {text: r.held ? "✓ " : "✗ "}), el("code", {text: r.when})),
      el("span", {text: (r.held ? "+" : "") + r.points})));
    box.append(ul);
  }
  function drawWhy(why, result) {
    const box = $("why"); box.replaceChildren();
    if (result) box.append(el("p", {"data-testid": "turn-summary", text: result.stage_before + " → " + result.stage_after +
      (result.transitions.length ? " (" + result.transitions.map(t => t.from + "->" + t.to).join(", ") + ")" : " (stayed)")}));
    for (const step of why.steps || []) {
      box.append(el("div", {class: "hint", text: "exits of " + step.stage + (step.fired ? " — fired: " + step.fired : "")}));
      for (const t of step.transitions || []) {
        const vals = Object.entries(t.values || {}).map(([k, v]) => k + " = " + show(v) +
          (t.derived && t.derived[k] ? " (" + t.derived[k] + ")" : "")).join(", ");
        box.append(el("div", {class: "exit " + (t.held ? "held" : "not-held"), "data-testid": "why-exit"},
          el("span", {text: (t.global ? "any stage" : step.stage) + " → " + t.to + ": "}),
          el("code", {text: t.when || "always"}),
          el("span", {class: t.held ? "yes" : "no", text: t.held === null ? " error" : t.held ? " held" : " not held"}),
          vals ? el("div", {class: "values", text: vals}) : null,
          t.error ? el("div", {class: "no", text: t.error}) : null));
      }
      if (step.iterations) box.append(el("div", {class: "hint", text: "turn " + step.iterations.count + " of at most " +
        step.iterations.limit + " in " + step.stage + (step.iterations.to ? ", then → " + step.iterations.to : "")}));
    }
    if (!(why.steps || []).length) box.append(el("p", {class: "hint", text: "no turn yet: send a message"}));
    if (why.returning) box.append(el("p", {class: "warn", text: "idle return: the customer came back after the idle gap"}));
    const claims = why.claims || [];
    if (claims.length) {
      box.append(el("div", {class: "hint", text: "reply claims refused (not sent to the customer)"}));
      for (const c of claims) box.append(el("div", {class: "exit not-held", "data-testid": "why-claim"},
        el("span", {class: "no", text: (c.attempt ? "repair: " : "") + c.kind +
          (c.name && c.name !== c.kind ? " (" + c.name + ")" : "") + ": "}),
        el("code", {text: c.text}),
        el("div", {class: "values", text: c.expected})));
    }
    for (const n of why.notices || []) box.append(el("p", {class: "hint", text: "notice: " + n}));
    const caps = Object.entries(why.caps || {});
    if (caps.length) box.append(el("p", {class: "hint", text: "iteration caps: " + caps.map(([s, c]) =>
      s + " ≤ " + c.limit + (c.to ? " → " + c.to : "") + (c.offer ? " (offer " + c.offer + ")" : "")).join("; ")}));
  }
  function drawState(state, changed) {
    const box = $("state"); box.replaceChildren();
    const t = el("table");
    const skip = new Set(["session_id"]);
    for (const [k, v] of Object.entries(state || {})) {
      if (skip.has(k)) continue;
      t.append(el("tr", {class: changed.includes(k) ? "changed" : null, "data-field": k},
        el("td", {}, el("code", {text: k})), el("td", {text: show(v)})));
    }
    if (changed.length) box.append(el("p", {"data-testid": "state-changed", text: "changed: " + changed.join(", ")}));
    box.append(t);
  }
  function drawPrompt(view) {
    const box = $("prompt"); box.replaceChildren();
    for (const call of view.prompt || []) {
      const d = el("details", {}, el("summary", {text: (call.attempt ? "repair call" : "call") + " · " + call.stage + " · ~" + call.tokens + " tokens"}));
      for (const m of call.messages) d.append(el("div", {}, el("strong", {text: m.role}), el("span", {class: "hint", text: " ~" + m.tokens + " tokens"}),
        m.breakpoint ? el("span", {class: "bp", text: " ◆ cache breakpoint (the next turn repeats up to here)"}) : null,
        el("pre", {text: m.content})));
      const cut = call.trimmed || [];  // what the prompt budget cut (engine.turn.budget.trimmed)
      box.append(d, el("div", {class: "trimmed hint", "data-testid": "prompt-trimmed"},
        el("span", {text: cut.length ? "the budget trimmed: " : "the budget trimmed nothing"}),
        ...(cut.length ? [el("ul", {}, ...cut.map(t => el("li", {text: t})))] : [])));
    }
    const r = view.record;
    if (r) {
      const facts = [["model", r.model], ["turn ms", r.turn_ms], ["model ms", r.llm_ms], ["prompt tokens", r.prompt_tokens],
        ["completion tokens", r.completion_tokens], ["cached", r.cached_prompt_tokens], ["cost", r.cost ?? "unknown"],
        ["validation failures", r.validation_failures], ["repaired", r.repaired], ["fallback", r.fallback]];
      box.append(el("div", {class: "hint", text: facts.map(([k, v]) => k + ": " + show(v)).join(" · ")}));
      (r.raw_output || []).forEach((o, i) => box.append(el("div", {}, el("strong", {text: i ? "repair output" : "raw output"}), el("pre", {text: o}))));
      if (r.error) box.append(el("div", {class: "errors", "data-testid": "turn-error", text: r.error}));
    }
    if (!box.childNodes.length) box.append(el("p", {class: "hint", text: "the prompt appears after a turn played here"}));
  }
  function drawForm(view) {
    const human = $("model").value === "human";
    $("form-box").hidden = !human && !S.branchEdit;
    $("form-stage").textContent = view.form ? "— stage " + view.stage : "";
    const key = S.funnel + "/" + view.stage + "/" + (S.funnels[S.funnel].svgKey);
    if ($("form").dataset.key === key) return;
    $("form").dataset.key = key;
    $("form").replaceChildren();
    S.form = null;
    if (view.form) { S.form = ModelForm.build(view.form); $("form").append(S.form.el); }
  }
  // What a playground turn did not send (a hand-off alert, an approval request): the
  // studio's engine queues none of it (engine.turn.playground).
  function drawWouldSend(items) {
    const box = $("would"); box.replaceChildren();
    box.hidden = !items.length;
    if (!items.length) return;
    box.append(el("div", {class: "hint", text: "nothing was sent: this is the playground"}));
    for (const w of items) box.append(el("div", {class: "would-item", "data-kind": w.kind, text: w.text}));
  }
  // Whose session this is: a customer's is only read (typing branches it), a playground
  // one may say where it was branched from.
  function drawOrigin(view) {
    const b = $("branch");
    if (view.real) {
      b.hidden = false; b.className = "branch real";
      b.textContent = "A customer's session (" + view.session + "): read only to the chat (the manager's desk acts on it). What you type goes to a new " +
        "playground session branched from it; this session, its messages and its alerts stay as they are.";
    } else if (view.origin && view.origin.branched_from) {
      b.hidden = false; b.className = "branch";
      b.textContent = "A playground session, branched from " + view.origin.branched_from + " after turn " + view.origin.turn;
    } else { b.hidden = true; b.className = "branch"; }
  }
  function render(view) {
    S.view = view;
    $("session").textContent = S.session;
    drawWouldSend(view.would_send || []);
    drawGraph(view); drawCompleteness(view.completeness); drawWhy(view.why, view.result);
    drawState(view.state, view.changed || []); drawPrompt(view); drawForm(view);
    emit("rendered", {funnel: S.funnel, session: S.session, view, funnels: S.funnels});
  }

  // -- the transcript ---------------------------------------------------------------
  function recordText(t) {
    const exits = (t.explain || []).map(s => (s.transitions || []).map(x => s.stage + " -> " + x.to + ": " +
      (x.when || "always") + " = " + x.held + " " + JSON.stringify(x.values || {})).join("\n")).join("\n");
    const refused = t.refused && t.refused.length ? "  refused: " + JSON.stringify(t.refused) : "";
    return "explanation:\n" + (exits || "—") + "\n\nraw output:\n" + (t.raw_output || []).join("\n---\n") +
      (t.error ? "\n\nerror: " + t.error : "") + "\n\nactions: " + JSON.stringify(t.actions) + refused +
      "\nturn " + t.turn_ms + " ms, model " + t.llm_ms + " ms, tokens " + t.prompt_tokens + "+" +
      t.completion_tokens + ", cost " + (t.cost ?? "unknown");
  }
  function turnItem(t) {
    const li = el("li", {class: "turn", "data-turn": String(t.number)});
    // A follow-up (docs/follow-ups.md): the bot wrote to a customer who had gone quiet.
    li.append(el("div", {class: "bubble customer", text: t.follow_up ? "(no reply: a follow-up was due " + t.follow_up.due + ")" : (t.customer || "—")}));
    li.append(el("div", {class: "bubble bot" + (t.fallback ? " fallback" : ""), "data-follow-up": t.follow_up ? "true" : null, text: t.reply || "—"}));
    const rw = el("button", {type: "button", "data-testid": "rewind", "data-turn": String(t.number), title: "a new session from the state after this turn", text: "↶ from here"});
    rw.addEventListener("click", () => rewind(t.number));
    const ed = el("button", {type: "button", "data-testid": "branch-edit", "data-turn": String(t.number), text: "✎ change the answer"});
    ed.addEventListener("click", () => editAt(t));
    const det = el("details", {class: "transcript"}, el("summary", {text: "record"}), el("pre", {text: recordText(t)}));
    li.append(el("div", {class: "meta"}, el("span", {text: "#" + t.number + " " + t.stage_before + " → " + t.stage_after +
      (t.follow_up ? " · follow-up " + t.follow_up.step : "") + (t.fallback ? " · fallback" : "") + (t.validation_failures ? " · " + t.validation_failures + " invalid" : "")}), rw, ed, det));
    emit("turn", {turn: t, li});
    return li;
  }
  async function loadTranscript(latest) {
    const first = await api("transcript?" + q({funnel: S.funnel, session: S.session, offset: 0, limit: 1}));
    if (!first.ok) return failed(first);
    S.total = first.data.total;
    S.offset = latest ? Math.max(0, S.total - 50) : S.offset;
    const page = await api("transcript?" + q({funnel: S.funnel, session: S.session, offset: S.offset, limit: 50}));
    if (!page.ok) return failed(page);
    $("log").replaceChildren(...page.data.turns.map(turnItem));
    $("earlier").hidden = S.offset === 0;
    $("log").scrollTop = $("log").scrollHeight;
    emit("transcript", {funnel: S.funnel, session: S.session, offset: S.offset});
  }
  async function earlier() {
    const off = Math.max(0, S.offset - 50);
    const page = await api("transcript?" + q({funnel: S.funnel, session: S.session, offset: off, limit: S.offset - off}));
    if (!page.ok) return failed(page);
    $("log").prepend(...page.data.turns.map(turnItem));
    S.offset = off; $("earlier").hidden = S.offset === 0;
    emit("transcript", {funnel: S.funnel, session: S.session, offset: S.offset, earlier: true});
  }
  function leaveEdit() {
    // "Change the answer" belongs to the session it was started on: another session
    // starts without it (its JSON, its message, its notice).
    if (S.branchEdit) notice("");
    S.branchEdit = null; $("replay-box").hidden = true; $("replay-after").checked = false;
    $("raw").value = ""; $("raw-box").open = false; $("input").value = ""; $("form-errors").hidden = true;
  }
  async function openSession(id, latest = true) {
    S.session = id; leaveEdit(); $("branch").hidden = true;
    $("log").replaceChildren();
    const res = await api("session?" + q({funnel: S.funnel, session: id}));
    if (!res.ok) return failed(res);
    render(res.data);
    drawOrigin(res.data);
    await loadTranscript(latest);
  }

  // -- playing ------------------------------------------------------------------------
  function answer() {
    const raw = $("raw").value.trim();
    if (raw) { try { return JSON.parse(raw); } catch (e) { return raw; } }  // a raw string is a model output too
    return S.form ? S.form.collect() : {};
  }
  async function send(withAnswer) {
    const text = $("input").value.trim();
    const human = $("model").value === "human";
    $("form-errors").hidden = true;
    if (S.branchEdit) return branchWith();
    if (!text) { notice("type the customer's message first", true); $("input").focus(); return; }
    const body = {funnel: S.funnel, session: S.session, text, model: human ? "human" : ($("model-name").value.trim() || null)};
    if (human || withAnswer) { body.answer = answer(); body.force = $("force").checked; }
    $("send").disabled = $("submit").disabled = true;
    try {
      const res = await api("turn", body);
      if (res.ok && res.data.rejected) {
        const e = $("form-errors"); e.hidden = false;
        e.replaceChildren(el("div", {text: "The engine refuses this answer, as it would a model's:"}),
          el("ul", {}, ...(res.data.plain || []).map(p => el("li", {"data-testid": "refusal-plain", text: p}))),
          el("details", {}, el("summary", {text: "what the repair call would tell a model"}), el("pre", {text: res.data.repair})));
        return;
      }
      if (!res.ok) return failed(res);
      notice(res.data.result && res.data.result.fallback ? "this turn ended in the stage's fallback: " + (res.data.result.error || "") : "", true);
      $("input").value = ""; $("raw").value = "";
      $("form").dataset.key = "";  // a fresh form for the next answer
      if (res.data.branched_from) {  // typed on a customer's session: the turn went to a branch
        S.session = res.data.session;
        render(res.data);
        await loadTranscript(true);
        const b = $("branch"); b.hidden = false; b.className = "branch real";
        b.textContent = "Typed on a customer's session: the turn went to a new playground session " +
          res.data.session + ", branched from " + res.data.branched_from.session + " after turn " +
          res.data.branched_from.turn + "; " + res.data.branched_from.session + " is untouched." +
          (res.data.diverged && res.data.diverged.length ? " On the funnel as it is now, turns went elsewhere: " +
            res.data.diverged.map(d => "#" + d.turn + " " + d.recorded + "→" + d.now).join(", ") : "");
        return;
      }
      render(res.data);
      drawOrigin(res.data);
      await loadTranscript(true);
    } finally { $("send").disabled = $("submit").disabled = false; }
  }
  async function rewind(n) {
    const res = await api("rewind", {funnel: S.funnel, session: S.session, turn: n});
    if (!res.ok) return failed(res);
    branched(res.data);
  }
  async function branched(view) {
    S.session = view.session; S.branchEdit = null; $("replay-box").hidden = true;
    render(view);
    await loadTranscript(true);
    const b = $("branch"); b.hidden = false; b.className = "branch";
    b.textContent = "branched from " + view.branched_from.session + " after turn " + view.branched_from.turn +
      (view.diverged && view.diverged.length ? "; on the funnel as it is now, turns went elsewhere: " +
        view.diverged.map(d => "#" + d.turn + " " + d.recorded + "→" + d.now).join(", ") : "");
  }
  async function editAt(t) {
    S.branchEdit = {turn: t.number, text: t.customer};
    $("form-box").hidden = false; $("replay-box").hidden = false;
    $("input").value = t.customer || "";
    const raw = (t.raw_output || [])[0] || "";
    let given = null;
    try { given = JSON.parse(raw); } catch (e) { given = null; }
    // The same form as "I am the model", of the stage the turn was answered in, filled with
    // its answer; an answer that is not a JSON object only the JSON box can hold.
    const res = given && typeof given === "object" && !Array.isArray(given) ?
      await api("form?" + q({funnel: S.funnel, stage: t.stage_before})) : null;
    if (res && res.ok && res.data.form) {
      S.form = ModelForm.build(res.data.form, given);
      $("form").dataset.key = "edit:" + t.number;  // the next session's render builds its own
      $("form").replaceChildren(S.form.el);
      $("form-stage").textContent = "— turn " + t.number + ", stage " + t.stage_before;
      $("raw").value = ""; $("raw-box").open = false;
    } else { $("raw-box").open = true; $("raw").value = raw; }
    // The panels describe the session's last turn: stale for a branch from turn N.
    const stale = "changing the answer of turn " + t.number + ": this shows the new branch once you answer";
    for (const id of ["why", "prompt"]) $(id).replaceChildren(el("p", {class: "hint", "data-testid": "stale-cleared", text: stale}));
    drawWouldSend([]); $("scenario-out").hidden = true;
    $("state").querySelectorAll("tr.changed").forEach(r => r.classList.remove("changed"));
    const changed = $("state").querySelector('[data-testid="state-changed"]'); if (changed) changed.remove();
    notice("changing the answer of turn " + t.number + ": edit the answer (or the customer's message) and answer; a new session replays up to it", false);
  }
  async function branchWith() {
    const e = S.branchEdit;
    const res = await api("rewind", {funnel: S.funnel, session: S.session, turn: e.turn, answer: answer(),
      text: $("input").value.trim() || e.text, replay_after: $("replay-after").checked});
    if (!res.ok) return failed(res);
    $("raw").value = ""; $("input").value = "";
    branched(res.data);
  }
  // "Save as scenario" and "Run scenarios": scenarios.js.

  // -- live edits -----------------------------------------------------------------------
  function drawDiagnostics(st) {
    const box = $("diagnostics");
    const problems = (st.diagnostics || []).filter(d => d.severity === "error");
    box.hidden = !problems.length && !st.problem;
    box.replaceChildren();
    box.dataset.broken = st.broken ? "true" : "";
    // A funnel that does not validate has no good version to run (engine/studio/broken.py).
    if (st.broken) box.append(el("div", {}, el("span", {text: S.funnel + " does not validate, so it cannot run yet: fix the funnel in the Editor first (" +
      problems.length + " problem(s)) "}), (() => { const b = el("button", {type: "button", "data-testid": "open-editor", text: "Open the Editor"});
      b.addEventListener("click", () => $("tab-editor").click()); return b; })()));
    else if (problems.length) box.append(el("div", {text: "The last save has problems; the last good version keeps running:"}));
    for (const d of problems) box.append(el("div", {"data-testid": "diagnostic"},
      el("code", {text: d.file + ":" + d.line + ":" + d.col}), el("span", {text: " " + d.code + " " + d.message})));
    if (st.problem) box.append(el("div", {}, el("span", {text: st.problem + " "}),
      (() => { const b = el("button", {type: "button", "data-testid": "restart-session", text: "Start a new session"}); b.addEventListener("click", () => openSession(newId())); return b; })()));
  }
  async function poll() {
    const res = await api("status");
    if (res.ok) {
      for (const [name, st] of Object.entries(res.data)) {
        if (S.generation[name] === st.generation) continue;
        const first = S.generation[name] === undefined;
        S.generation[name] = st.generation;
        if (name !== S.funnel) continue;
        drawDiagnostics(st);
        if (!first && st.ok) {
          await loadFunnels();
          const v = await api("session?" + q({funnel: S.funnel, session: S.session}));
          if (v.ok) render(v.data);
          const n = $("notice"); n.hidden = false; n.className = "notice";
          n.textContent = "reloaded: version " + st.version + " (generation " + st.generation + "); the session goes on with it";
          n.dataset.generation = String(st.generation);
        }
      }
    }
    setTimeout(poll, 400);
  }
  async function loadFunnels() {
    const res = await api("funnels");
    if (!res.ok) return failed(res);
    S.home = res.data.home;
    for (const f of res.data.funnels) { f.svgKey = f.name + ":" + f.status.generation; S.funnels[f.name] = f; }
    const pick = $("funnel");
    if (!pick.options.length) for (const f of res.data.funnels) pick.append(el("option", {value: f.name, text: f.name}));
    for (const o of pick.options) if (S.funnels[o.value]) {  // a broken funnel is marked, until a save fixes it
      o.textContent = o.value + (S.funnels[o.value].broken ? " (broken)" : ""); o.dataset.broken = S.funnels[o.value].broken ? "true" : "";
    }
    S.funnel = S.funnel || (res.data.funnels[0] || {}).name || null;
    const st = $("f-stage"); st.replaceChildren(el("option", {value: "", text: "any"}));
    if (S.funnel) for (const s of S.funnels[S.funnel].stages) st.append(el("option", {value: s, text: s}));
  }

  // -- sessions -------------------------------------------------------------------------
  async function listSessions(more) {
    S.listOffset = more ? S.listOffset + 50 : 0;
    const res = await api("sessions?" + q({funnel: S.funnel, stage: $("f-stage").value, handoff: $("f-handoff").value,
      fallback: $("f-fallback").value, since: $("f-since").value.trim(), variant: $("f-variant").value.trim(),
      q: $("f-q").value.trim(), playground: $("f-playground").checked ? "true" : "",
      offset: S.listOffset, ...S.drill}));
    if (!res.ok) return failed(res);
    const rows = res.data.sessions.map(s => {
      const tr = el("tr", {"data-session": s.session_id, class: s.playground ? "playground" : null},
        el("td", {}, el("code", {text: s.session_id}), s.playground ? el("span", {class: "tag", text: " playground"}) : null), el("td", {text: s.stage}), el("td", {text: String(s.turns)}),
        el("td", {text: s.handed_off ? "yes" : ""}), el("td", {text: String(s.fallbacks || "")}),
        el("td", {text: s.variant || ""}), el("td", {text: String(s.last_message_at).slice(0, 19)}));
      tr.addEventListener("click", () => { tab("play"); openSession(s.session_id); });
      return tr;
    });
    if (more) $("sessions-list").append(...rows); else $("sessions-list").replaceChildren(...rows);
    $("more").hidden = !res.data.more;
  }
  function drill(params) {
    S.drill = {};
    for (const k of Object.keys(DRILL)) if (params.get(k)) S.drill[k] = params.get(k);
    const parts = Object.entries(S.drill).map(([k, v]) => DRILL[k] + (v === "true" ? "" : " " + v));
    if (params.get("stage")) { $("f-stage").value = params.get("stage"); parts.push("now in " + params.get("stage")); }
    if (params.get("playground") === "true") $("f-playground").checked = true;
    $("drill").hidden = !parts.length;
    $("drill-text").textContent = parts.length ? "From the report: sessions that " + parts.join(", ") : "";
  }
  function tab(which) {
    $("play").hidden = which !== "play"; $("sessions").hidden = which === "play";
    $("tab-play").classList.toggle("on", which === "play"); $("tab-sessions").classList.toggle("on", which !== "play");
    if (which !== "play") listSessions(false);
    emit("tab", {tab: which});
  }

  // Nothing to start, save or run before the first funnel exists.
  function headerButtons(on) { for (const id of ["new-session", "save", "run"]) $(id).hidden = !on; }

  async function start() {
    await loadFunnels();
    const params = new URLSearchParams(location.search);
    if (params.get("funnel") && S.funnels[params.get("funnel")]) S.funnel = params.get("funnel");
    $("funnel").value = S.funnel;
    const report = () => { $("open-report").href = "report?" + q({funnel: S.funnel}); };
    report(); $("funnel").addEventListener("change", report);
    drill(params);
    $("drill-clear").addEventListener("click", () => { drill(new URLSearchParams()); $("f-stage").value = ""; listSessions(false); });
    $("funnel").addEventListener("change", async () => {
      if (!S.funnel) { notice(""); headerButtons(true); }  // the first funnel of an empty studio: "no funnel yet" is over
      S.funnel = $("funnel").value; await loadFunnels(); openSession(newId());
    });
    $("model").addEventListener("change", () => { $("model-name").hidden = $("model").value === "human"; if (S.view) drawForm(S.view); });
    $("send").addEventListener("click", () => send(false));
    $("submit").addEventListener("click", () => send(true));
    $("input").addEventListener("keydown", e => { if (e.key === "Enter" && !e.shiftKey) { e.preventDefault(); send(false); } });
    $("new-session").addEventListener("click", () => openSession(newId()));
    $("earlier").addEventListener("click", earlier);
    $("tab-play").addEventListener("click", () => tab("play"));
    $("tab-sessions").addEventListener("click", () => tab("sessions"));
    $("f-go").addEventListener("click", () => listSessions(false));
    $("f-playground").addEventListener("change", () => listSessions(false));
    $("more").addEventListener("click", () => listSessions(true));
    if (!S.funnel) {  // an empty studio (`funnel studio` on a folder with no funnel yet)
      headerButtons(false);
      notice("No funnel yet: make one with New funnel in the Editor tab; it is written into " + S.home);
      $("tab-editor").click();
      poll();
      return;
    }
    await openSession(params.get("session") || newId());
    if (params.get("tab") === "sessions") tab("sessions");
    poll();
  }
  window.StudioPage = {reopen: () => openSession(S.session, true), open: id => openSession(id),
    state: S, api, el, notice, failed, q};
  window.addEventListener("DOMContentLoaded", () => start().catch(e => notice("the page failed to start: " + e, true)));
})();
