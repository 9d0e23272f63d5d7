// Funnel Studio: fast-forward of follow-ups (docs/follow-ups.md). Shows which follow-up the
// open session would get, and when, if its customer said nothing more. Read-only: the
// studio's sessions never get a real follow-up, and nothing is sent.
"use strict";
(function () {
  const $ = id => document.getElementById(id);

  function line(text, cls) {
    const li = document.createElement("li");
    li.textContent = text;
    if (cls) li.className = cls;
    return li;
  }

  async function fastForward() {
    const box = $("follow-up");
    const funnel = $("funnel").value, session = $("session").textContent;
    box.hidden = false; box.textContent = "…";
    const r = await fetch("api/follow-up?funnel=" + encodeURIComponent(funnel) +
                          "&session=" + encodeURIComponent(session));
    let data = null;
    try { data = await r.json(); } catch (e) { data = {error: {message: "no JSON (" + r.status + ")"}}; }
    box.textContent = "";
    if (!r.ok) { box.append(line((data.error && data.error.message) || "failed", "warn")); return; }
    const title = document.createElement("strong");
    title.textContent = data.steps.length
      ? "If the customer says nothing more after " + data.anchor + " (stage " + data.stage + "):"
      : "Stage " + data.stage + " sends no follow-up.";
    const list = document.createElement("ol");
    list.setAttribute("data-testid", "follow-up-steps");
    for (const s of data.steps) {
      const when = s.sent_at === s.due_at ? s.due_at : s.due_at + " → after quiet hours, " + s.sent_at;
      // A `prompt:` step: the model writes it when due (not asked here); its text, if any, is the fallback.
      const said = s.prompt ? "the model writes it: “" + s.prompt + "”" + (s.text ? "; else “" + s.text + "”" : "; else nothing") : "“" + s.text + "”";
      const what = s.error ? "fails: " + s.error : (s.holds ? said + " (" + s.language + ")" : "skipped: its `when` does not hold now");
      list.append(line("step " + s.step + " at " + when + ": " + what, s.holds ? "" : "warn"));
    }
    box.append(title, list);
  }

  window.addEventListener("DOMContentLoaded", () => {
    const button = $("fast-forward");
    if (button) button.addEventListener("click", () => fastForward().catch(e => { $("follow-up").textContent = String(e); }));
  });
})();
