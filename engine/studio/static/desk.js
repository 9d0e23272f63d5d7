// Funnel Studio: a conversation as a manager sees it (docs/studio.md#manager).
// - the open session, funnel and tab in the address (a reload or a shared link opens them);
// - the transcript's manager messages, held customer messages, take-over / release /
//   approval marks (GET api/desk), the hand-off and each action on the turn that made them;
// - on a customer's session: take over, send as the manager, release (POST api/takeover,
//   api/manager-message, api/release: the manager API's own functions, on the real session);
// - the funnel's own words: its name and description, each stage's description, and the
//   stage prompt as the model would read it (GET api/stage-prompt) beside "I am the model".
"use strict";
(function () {
  const $ = id => document.getElementById(id);
  const P = () => window.StudioPage;
  const D = {view: null, desk: null, funnels: {}};
  const MARKS = {
    takeover: it => "⇄ " + (it.manager || "a manager") + " took the session over" + at(it),
    release: it => "↩ " + (it.manager || "a manager") + " handed the session back to the bot" + at(it) +
      ((it.detail && it.detail.updated && it.detail.updated.length) ? "; changed " + it.detail.updated.join(", ") : ""),
    approval: it => "⏸ a move waits for a manager's approval" + move(it),
    approved: it => "✓ " + (it.manager || "a manager") + " approved the move" + move(it),
    rejected: it => "✗ " + (it.manager || "a manager") + " rejected the move" + move(it) +
      (it.detail && it.detail.note ? ": " + it.detail.note : ""),
    timeout: it => "⌛ nobody decided in time" + move(it) + ": " + ((it.detail && it.detail.on_timeout) || "the approval timed out"),
  };
  function at(it) { return it.detail && it.detail.stage ? " (stage " + it.detail.stage + ")" : ""; }
  function move(it) {
    const d = it.detail || {};
    return d.from || d.to ? " " + (d.from || "?") + " → " + (d.to || "?") : "";
  }
  function el(tag, attrs, ...kids) { return P().el(tag, attrs, ...kids); }

  // -- the address ------------------------------------------------------------------------
  // Another session is a new entry (Back returns to the one before); the rest replaces it.
  function address(changes) {
    const url = new URL(location.href);
    const before = url.searchParams.get("session");
    for (const [k, v] of Object.entries(changes)) { if (v) url.searchParams.set(k, v); else url.searchParams.delete(k); }
    if (url.href === location.href) return;
    const push = before && changes.session && changes.session !== before;
    history[push ? "pushState" : "replaceState"](null, "", url.pathname + url.search);
  }
  window.addEventListener("popstate", () => {
    const params = new URLSearchParams(location.search);
    const s = P().state;
    if (params.get("session") && params.get("session") !== s.session) P().open(params.get("session"));
    const tab = params.get("tab") === "sessions" ? "sessions" : "play";
    if ($("sessions").hidden === (tab === "sessions")) $(tab === "sessions" ? "tab-sessions" : "tab-play").click();
  });

  // -- the funnel's words -----------------------------------------------------------------
  function words(funnel) {
    const f = D.funnels[funnel] || {};
    document.title = funnel + " — Funnel Studio";
    let d = $("funnel-description");
    if (!d) {
      d = el("span", {id: "funnel-description", class: "funnel-description", "data-testid": "funnel-description"});
      $("funnel").closest("label").after(d);
    }
    d.textContent = f.description || "";
    $("input").placeholder = "What the customer writes to " + funnel;
  }
  async function stagePrompt(s) {
    let box = $("stage-prompt");
    if (!box) {
      box = el("details", {id: "stage-prompt", class: "stage-prompt", "data-testid": "stage-prompt"},
        el("summary", {text: "the stage prompt, as the model would read it"}), el("div", {id: "stage-prompt-body"}));
      $("form-errors").before(el("p", {id: "stage-description", class: "hint", "data-testid": "stage-description"}), box);
    }
    if ($("form-box").hidden || (P().state.branchEdit)) return;
    const res = await P().api("stage-prompt?" + P().q({funnel: s.funnel, session: s.session}));
    if (!res.ok || s.session !== P().state.session) return;
    $("stage-description").textContent = res.data.stage + ": " + (res.data.description || "");
    $("stage-prompt-body").replaceChildren(...res.data.messages.map(m =>
      el("div", {class: "prompt-message"}, el("strong", {text: m.role}), el("pre", {text: m.content}))));
  }

  // -- the transcript's marks -------------------------------------------------------------
  function item(it) {
    if (it.kind === "mark") {
      const approval = !["takeover", "release"].includes(it.event);
      const text = (MARKS[it.event] || (x => x.event))(it);
      return el("li", {class: "desk-item mark " + it.event, "data-testid": approval ? "approval-mark" : "takeover-mark",
        "data-event": it.event, title: it.created_at, text});
    }
    if (it.role === "manager") {
      return el("li", {class: "desk-item", "data-testid": "manager-message"},
        el("div", {class: "bubble manager"}, el("strong", {text: (it.manager || "manager") + " (manager): "}), el("span", {text: it.content})));
    }
    const customer = it.role === "user";
    return el("li", {class: "desk-item", "data-testid": "held-message", title: it.created_at},
      el("div", {class: "bubble " + (customer ? "customer held" : "bot held"), text: it.content}),
      el("div", {class: "meta", text: customer ? "held: a manager or an approval had the session, no model was asked" : "the holding reply"}));
  }
  function place(data, scroll) {
    const log = $("log");
    log.querySelectorAll(".desk-item, .turn-handoff").forEach(x => x.remove());
    const turns = [...log.querySelectorAll("li.turn")];
    const first = turns.length ? Number(turns[0].dataset.turn) : 1;
    const last = {};
    for (const it of data.items) {
      const n = Number(it.after_turn);
      const anchor = n === 0 ? null : log.querySelector(`li.turn[data-turn="${n}"]`);
      if ((n === 0 && first !== 1) || (n > 0 && !anchor)) continue;  // on another page of turns
      const li = item(it);
      const after = last[n] || anchor;
      if (after) after.after(li); else log.prepend(li);
      last[n] = li;
    }
    const handed = data.handoff_turn && log.querySelector(`li.turn[data-turn="${data.handoff_turn}"] .turn-marks`);
    if (handed) handed.prepend(el("span", {class: "chip turn-handoff", "data-testid": "turn-handoff",
      text: "⚑ hand-off" + (D.view && D.view.playground ? " (the manager would be notified)" : ": the manager was notified here")}));
    if (scroll) log.scrollTop = log.scrollHeight;  // the newest, manager's messages included
  }
  function turnMarks(t, li) {
    const box = el("div", {class: "turn-marks"});
    for (const a of t.actions || []) box.append(el("span", {class: "chip", "data-testid": "turn-action", "data-action": a, text: "▸ " + a}));
    for (const r of t.refused || []) box.append(el("span", {class: "chip no", "data-testid": "turn-action-refused",
      "data-action": r.type, text: "✗ " + r.type + (r.reason ? ": " + r.reason : "")}));
    li.append(box);
  }

  // -- the manager's desk (a customer's session) ----------------------------------------------
  function bar() {
    let b = $("desk");
    if (b) return b;
    const stage = el("select", {id: "release-stage", "data-testid": "release-stage"}, el("option", {value: "", text: "where it is"}));
    b = el("div", {id: "desk", class: "desk", "data-testid": "manager-desk", hidden: true},
      el("div", {id: "desk-control", "data-testid": "desk-control"}),
      el("div", {class: "row"},
        el("label", {}, "manager ", el("input", {id: "manager-name", "data-testid": "manager-name", size: "14"})),
        el("button", {id: "takeover", type: "button", "data-testid": "takeover", text: "Take over"})),
      el("div", {class: "row"},
        el("textarea", {id: "manager-text", "data-testid": "manager-text", rows: "2", placeholder: "A message to the customer, as the manager"}),
        el("button", {id: "manager-send", type: "button", "data-testid": "manager-send", text: "Send as the manager"})),
      el("div", {class: "row"}, el("label", {}, "back at stage ", stage),
        el("input", {id: "release-updates", "data-testid": "release-updates", placeholder: "field updates as JSON (optional)", size: "28"}),
        el("button", {id: "release", type: "button", "data-testid": "release", text: "Hand back to the bot"})),
      el("div", {id: "desk-approval", class: "row", hidden: true},
        el("button", {id: "approve", type: "button", "data-testid": "approve", text: "Approve the move"}),
        el("input", {id: "reject-note", "data-testid": "reject-note", placeholder: "why not (reaches the next prompt)", size: "28"}),
        el("button", {id: "reject", type: "button", "data-testid": "reject", text: "Reject"})),
      el("div", {id: "desk-result", class: "hint", "data-testid": "desk-result"}));
    $("branch").after(b);
    $("manager-name").value = localStorage.getItem("funnel-studio-manager") || "";
    $("manager-name").addEventListener("change", () => localStorage.setItem("funnel-studio-manager", $("manager-name").value.trim()));
    $("takeover").addEventListener("click", () => act("takeover", {}));
    $("approve").addEventListener("click", () => act("approve", {}));
    $("reject").addEventListener("click", () => {
      const note = $("reject-note").value.trim();
      act("reject", note ? {note} : {}).then(ok => { if (ok) $("reject-note").value = ""; });
    });
    $("manager-send").addEventListener("click", () => {
      const text = $("manager-text").value.trim();
      if (!text) { $("manager-text").focus(); return; }
      act("manager-message", {text}).then(ok => { if (ok) $("manager-text").value = ""; });
    });
    $("release").addEventListener("click", () => {
      const body = {};
      if ($("release-stage").value) body.stage = $("release-stage").value;
      const raw = $("release-updates").value.trim();
      if (raw) { try { body.updates = JSON.parse(raw); } catch (e) { $("desk-result").textContent = "the updates are not JSON: " + e.message; return; } }
      act("release", body).then(ok => { if (ok) $("release-updates").value = ""; });
    });
    return b;
  }
  function drawBar(data) {
    const b = bar();
    const real = !!(D.view && D.view.real);
    b.hidden = !real;
    if (!real) return;
    const c = data.control || {};
    const since = c.since ? " since " + String(c.since).slice(11, 16) : "";
    $("desk-control").textContent = !data.may_manage ? "Read only: this key may not act as a manager (it needs the manage scope)." :
      c.control === "manager" ? (c.manager || "a manager") + " has this session" + since + ": the bot answers nothing; what you send reaches the customer." :
      c.control === "approval" ? "A move waits for a manager's approval" + (c.approval ? " (" + c.approval.stage + " → " + c.approval.to + ")" : "") + "; taking over ends it." :
      "The bot answers this customer. Take over to answer them yourself (the bot stops until you hand back); " +
      "what you type in the chat below only tries the bot, on a playground branch.";
    b.dataset.control = c.control || "bot";
    if (!$("manager-name").value && data.manager) $("manager-name").placeholder = data.manager;
    const held = c.control === "manager";
    $("takeover").disabled = !data.may_manage;
    $("takeover").textContent = held ? "Take over (from " + (c.manager || "the manager") + ")" : "Take over";
    $("manager-send").disabled = $("release").disabled = !data.may_manage || !held;
    $("desk-approval").hidden = c.control !== "approval";
    $("approve").disabled = $("reject").disabled = !data.may_manage;
    const stages = (D.funnels[P().state.funnel] || {}).stages || [];
    const pick = $("release-stage");
    if (pick.options.length !== stages.length + 1) {
      pick.replaceChildren(el("option", {value: "", text: "where it is"}), ...stages.map(s => el("option", {value: s, text: s})));
    }
  }
  async function refresh(scroll = true) {
    const s = P().state;
    const res = await P().api("desk?" + P().q({funnel: s.funnel, session: s.session}));
    if (!res.ok || s.session !== P().state.session) return;
    D.desk = res.data;
    place(res.data, scroll);
    drawBar(res.data);
  }
  async function act(path, extra) {
    const s = P().state;
    const name = $("manager-name").value.trim();
    const body = {funnel: s.funnel, session: s.session, ...extra};
    if (name) body.manager = name;
    $("desk-result").textContent = "";
    const res = await P().api(path, body);
    if (!res.ok) {
      $("desk-result").textContent = (res.data && res.data.error && res.data.error.message) || ("failed: " + res.status);
      $("desk-result").className = "hint no";
      return false;
    }
    $("desk-result").className = "hint yes";
    $("desk-result").textContent = path === "takeover" ? "taken over by " + res.data.manager :
      path === "release" ? "back to the bot at " + res.data.stage + (res.data.updated.length ? "; changed " + res.data.updated.join(", ") : "") :
      path === "approve" || path === "reject" ? res.data.decision + " by " + res.data.manager :
      "sent by " + res.data.manager + (res.data.delivery === "telegram" ? " (queued for Telegram)" : " (in the session's messages)");
    if (["release", "approve", "reject"].includes(path)) await P().reopen(); else await refresh();
    return true;
  }

  document.addEventListener("studio:rendered", e => {
    const {funnel, session, view, funnels} = e.detail;
    D.view = view; D.funnels = funnels;
    address({funnel, session});
    words(funnel);
    stagePrompt({funnel, session});
    if ($("desk")) $("desk").hidden = !view.real;
  });
  // "Earlier turns" keeps the reader where they were; a new page of the latest goes down.
  document.addEventListener("studio:transcript", e => { refresh(e.detail.offset === P().state.offset && !e.detail.earlier); });
  document.addEventListener("studio:turn", e => turnMarks(e.detail.turn, e.detail.li));
  window.addEventListener("DOMContentLoaded", () => $("model").addEventListener("change", () => {
    const s = P().state;
    if (s.session) stagePrompt({funnel: s.funnel, session: s.session});
  }));
  document.addEventListener("studio:tab", e => address({tab: e.detail.tab === "play" ? "" : e.detail.tab}));
})();
