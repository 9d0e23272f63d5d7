// The what-if panel (engine/studio/whatif.py, docs/studio.md#what-if): after each clean save,
// what the edit would have done to the customers' sessions of the last days, each changed
// session a link that opens it at its first difference (?session=ID&turn=N).
"use strict";
(function () {
  const $ = id => document.getElementById(id);
  const {el} = window.StudioDom;
  let shown = "";

  function funnel() { return ($("funnel") && $("funnel").value) || new URLSearchParams(location.search).get("funnel") || ""; }
  function link(name, c) {
    return "./?" + new URLSearchParams({funnel: name, session: c.session_id, turn: String(c.turn || 1)}).toString();
  }
  function status(run, settings) {
    if (!run) return "What-if: each clean save replays the customers' sessions of the last " + settings.days +
      " day(s) (at most " + settings.max_sessions + ") on the edit.";
    const v = "What-if of version " + run.version;
    if (run.status === "running") {
      if (run.phase === "replaying") return v + ": replaying " + run.done + " of " + run.total + " sessions…";
      return v + (run.phase === "reading" ? ": reading the sessions…" : ": starting when the saves settle…");
    }
    if (run.status === "cancelled") return v + ": cancelled by the next save.";
    if (run.status === "failed") return v + " failed: " + run.error;
    return v + " (" + run.scope + ", " + (run.seconds || 0).toFixed(1) + " s):";
  }
  function draw(data) {
    const box = $("what-if");
    const run = data.run;
    box.hidden = !run && !data.settings.max_sessions;  // `--what-if-max 0`: no what-if
    box.dataset.status = run ? run.status : "none";
    const kids = [el("div", {"data-testid": "what-if-status", "data-status": run ? run.status : "none", "data-run": run ? String(run.id) : "", class: "what-if-status " + (run ? run.status : ""),
      text: status(run, data.settings)})];
    const before = (data.earlier || [])[0];
    if (before && before.status === "cancelled") kids.push(el("div", {"data-testid": "what-if-cancelled", class: "what-if-note",
      text: "the what-if of the save before (version " + before.version + ") was cancelled by this one"}));
    if (run && run.status === "done") {
      const c = run.counts;
      kids.push(el("div", {"data-testid": "what-if-sentence", "data-changed": String(c.changed), "data-sessions": String(c.sessions),
        class: "what-if-sentence", text: run.sentence.charAt(0).toUpperCase() + run.sentence.slice(1) + "."}));
      kids.push(el("div", {"data-testid": "what-if-needs-model", "data-share": String(run.needs_model.share), class: "what-if-note",
        text: run.needs_model.text + "."}));
      if (c.not_reproduced) kids.push(el("div", {"data-testid": "what-if-not-reproduced", class: "what-if-note warn",
        text: c.not_reproduced + " session(s) do not replay as recorded on the version they ran on, left out: " +
          run.not_reproduced.slice(0, 3).map(n => n.session_id + " (" + n.reason + ")").join("; ")}));
      if (run.changed.length) {
        const list = el("ol", {"data-testid": "what-if-sessions", class: "what-if-sessions"});
        for (const s of run.changed) list.append(el("li", {"data-session": s.session_id},
          el("a", {href: link(data.funnel, s), "data-testid": "what-if-session", "data-turn": String(s.turn || ""), text: s.session_id}),
          el("span", {text: " turn " + (s.turn || "?") + (s.stage ? " in " + s.stage : "") + ": " + s.what +
            (s.status === "needs_model" ? " (needs the model from turn " + s.needs_model_from_turn + ")" : "")})));
        const more = run.counts.changed > run.changed.length ? " (the first " + run.changed.length + ")" : "";
        kids.push(el("details", {open: true}, el("summary", {text: "the changed sessions, each at its first difference" + more}), list));
      }
    }
    box.replaceChildren(...kids);
  }
  async function poll() {
    try {
      const name = funnel();
      // An empty studio has no funnel to ask about until New funnel makes one.
      const r = name ? await fetch("api/whatif?" + new URLSearchParams({funnel: name})) : null;
      if (r && r.ok) {
        const data = await r.json();
        const key = JSON.stringify(data);
        if (key !== shown) { shown = key; draw(data); }
      }
    } catch (e) { /* the studio away: the next look tries again */ }
    setTimeout(poll, 700);
  }
  // Opened from a what-if link: mark the session's first differing turn once it is drawn.
  function markFirst() {
    const n = new URLSearchParams(location.search).get("turn");
    if (!n) return;
    let tries = 0;
    const look = () => {
      const li = document.querySelector('#log li.turn[data-turn="' + CSS.escape(n) + '"]');
      if (li) {
        li.classList.add("what-if-first"); li.setAttribute("data-testid", "what-if-first-difference");
        li.scrollIntoView({block: "center"});
        return;
      }
      if (++tries < 100) setTimeout(look, 100);
    };
    look();
  }
  window.addEventListener("DOMContentLoaded", () => { poll(); markFirst(); });
})();
