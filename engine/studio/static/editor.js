// Funnel Studio's editor tab: the funnel's files in CodeMirror 5 (vendored, MIT), checked as
// they are typed by the studio's validator, completion and hover from the funnel's JSON Schema,
// safe saves, the migration an edit needs, a new funnel, a model key kept in memory.
"use strict";
(function () {
  const $ = id => document.getElementById(id);
  const {el, api, message} = window.StudioDom;
  const E = {cm: null, files: {}, current: null, funnel: null, schemas: {}, migration: null};

  const q = o => Object.entries(o).map(([k, v]) => encodeURIComponent(k) + "=" + encodeURIComponent(v)).join("&");
  function say(text, warn) { const s = $("ed-state"); s.textContent = text || ""; s.className = "ed-state" + (warn ? " warn" : ""); }

  // -- the page's parts -----------------------------------------------------------------
  function build() {
    const box = $("editor");
    const field = (label, input) => el("label", {}, el("span", {text: label + " "}), input);
    box.append(
      el("section", {class: "ed-main"},
        el("div", {id: "ed-tabs", class: "ed-tabs", role: "tablist"}),
        el("div", {class: "ed-bar"},
          el("button", {id: "ed-save", type: "button", "data-testid": "editor-save", text: "Save"}),
          el("span", {id: "ed-state", class: "ed-state", "data-testid": "editor-state"}),
          el("span", {class: "hint", text: "Ctrl-Space completes, Ctrl-S saves; hover a key for its meaning"})),
        el("div", {id: "ed-conflict", class: "ed-conflict", "data-testid": "editor-conflict", hidden: true}),
        el("div", {id: "migrate-box", class: "migrate-box", "data-testid": "migrate-panel", hidden: true}),
        el("div", {id: "ed-cm", class: "ed-cm"}),
        el("div", {id: "ed-hover", class: "ed-hover", "data-testid": "editor-hover", hidden: true}),
        el("ul", {id: "ed-diags", class: "ed-diags", "data-testid": "editor-diagnostics"})),
      el("aside", {class: "ed-side"},
        el("h3", {text: "New funnel"}),
        el("form", {id: "new-funnel", "data-testid": "new-funnel", class: "ed-form", onsubmit: "return false"},
          field("name", el("input", {id: "nf-name", "data-testid": "new-funnel-name", placeholder: "pet-shop", required: true})),
          field("language", el("input", {id: "nf-language", "data-testid": "new-funnel-language", value: "en", size: 3})),
          field("currency", el("input", {id: "nf-currency", "data-testid": "new-funnel-currency", value: "USD", size: 4})),
          field("template", (() => { const s = el("select", {id: "nf-template", "data-testid": "new-funnel-template"});
            for (const t of ["minimal", "minimal+catalog", "puramur", "b2b_demo"]) s.append(el("option", {value: t, text: t}));
            return s; })()),
          el("button", {id: "nf-create", type: "button", "data-testid": "new-funnel-create", text: "Create"}),
          el("div", {id: "nf-out", class: "hint", "data-testid": "new-funnel-result"})),
        el("h3", {text: "Model and key"}),
        el("form", {id: "model-key", "data-testid": "model-key", class: "ed-form", onsubmit: "return false"},
          field("model", el("input", {id: "mk-model", "data-testid": "model-key-model", placeholder: "gpt-4o-mini"})),
          field("key", el("input", {id: "mk-key", "data-testid": "model-key-key", type: "password", autocomplete: "off", placeholder: "sk-…"})),
          el("button", {id: "mk-set", type: "button", "data-testid": "model-key-set", text: "Use"}),
          el("div", {id: "mk-out", class: "hint", "data-testid": "model-key-masked"}),
          el("p", {class: "hint", text: "The key stays in the studio's memory only: never written to disk or logs, gone when it stops."}))));
    E.cm = CodeMirror($("ed-cm"), {
      lineNumbers: true, gutters: ["CodeMirror-lint-markers"], indentUnit: 2, tabSize: 2,
      extraKeys: {"Ctrl-Space": "autocomplete", "Ctrl-S": () => save(false), Tab: cm => cm.execCommand("insertSoftTab")},
      hintOptions: {hint: schemaHint, completeSingle: false},
      lint: {getAnnotations: lint, delay: 300}});
    E.cm.on("change", () => { const f = E.files[E.current]; if (f) markDirty(f); });
    E.cm.getWrapperElement().addEventListener("mousemove", hover);
    E.cm.getWrapperElement().addEventListener("mouseleave", () => { $("ed-hover").hidden = true; });
    $("ed-save").addEventListener("click", () => save(false));
    $("nf-create").addEventListener("click", newFunnel);
    $("nf-name").addEventListener("keydown", e => { if (e.key === "Enter") { e.preventDefault(); newFunnel(); } });
    $("mk-set").addEventListener("click", setKey);
    api("editor/model-key").then(res => { if (res.ok) $("mk-out").textContent = Object.entries(res.data.keys).map(([m, v]) => m + ": " + v).join(", "); });
  }

  // -- files ----------------------------------------------------------------------------
  function markDirty(f) {
    f.dirty = f.doc.getValue() !== f.saved;
    const t = document.querySelector(`[data-testid="editor-file-tab"][data-file="${CSS.escape(f.id)}"]`);
    if (t) t.classList.toggle("dirty", f.dirty);
  }
  async function loadFiles() {
    const funnel = $("funnel").value;
    if (!funnel) { say("No funnel yet: New funnel, on the right, makes one"); $("nf-name").focus(); return; }
    if (funnel === E.funnel) return;
    const res = await api("editor/files?" + q({funnel}));
    if (!res.ok) return say(message(res), true);
    E.funnel = funnel; E.files = {}; E.current = null;
    if ($("ed-state").textContent.startsWith("No funnel yet")) say("");  // one is open now
    $("ed-tabs").replaceChildren(...res.data.files.map(f => {
      const b = el("button", {type: "button", class: "ed-tab", role: "tab", "data-testid": "editor-file-tab", "data-file": f.id, "data-kind": f.kind, title: f.kind, text: f.id});
      b.addEventListener("click", () => open(f));
      return b;
    }));
    if (res.data.files.length) await open(res.data.files[0]);
    await showMigration(true);  // a table behind its funnel (saved, never migrated)
  }
  async function open(f) {
    if (!E.files[f.id]) {
      const res = await api("editor/file?" + q({funnel: E.funnel, file: f.id}));
      if (!res.ok) return say(message(res), true);
      const mode = res.data.mode === "text" ? null : res.data.mode;
      E.files[f.id] = {id: f.id, kind: f.kind, mode, hash: res.data.hash, saved: res.data.text, dirty: false,
        doc: CodeMirror.Doc(res.data.text, mode), diagnostics: []};
    }
    E.current = f.id;
    E.cm.swapDoc(E.files[f.id].doc);
    document.querySelectorAll(".ed-tab").forEach(t => t.classList.toggle("on", t.dataset.file === f.id));
    E.cm.performLint();
    E.cm.refresh();
  }

  // -- diagnostics ------------------------------------------------------------------------
  function drawDiagnostics(list, note) {
    const ul = $("ed-diags");
    ul.replaceChildren();
    if (note) ul.append(el("li", {class: "hint", text: note}));
    for (const d of list) {
      const where = (d.tab || d.file) + ":" + d.line + ":" + d.col;
      const li = el("li", {class: "ed-diag " + d.severity, "data-testid": "editor-diagnostic", "data-code": d.code, "data-file": d.tab || d.file,
        "data-line": String(d.line), "data-col": String(d.col), "data-source": d.fromSave ? "save" : "typed"},
        d.fromSave ? el("span", {class: "hint", text: "last save: "}) : null,
        el("code", {class: "where", text: where}), el("strong", {text: " " + d.code + " "}), el("span", {class: "problem", text: d.problem || d.message}),
        d.suggestion ? el("div", {class: "suggestion", text: "→ " + d.suggestion}) : null);
      li.addEventListener("click", () => jump(d));
      ul.append(li);
    }
  }
  async function jump(d) {
    if (d.tab && d.tab !== E.current) {
      const t = document.querySelector(`[data-testid="editor-file-tab"][data-file="${CSS.escape(d.tab)}"]`);
      if (t) await open({id: d.tab, kind: t.dataset.kind});
    }
    E.cm.setCursor({line: Math.max(0, d.line - 1), ch: Math.max(0, d.col - 1)}); E.cm.focus();
  }
  function annotations(list) {
    return list.filter(d => d.tab === E.current).map(d => {
      const line = Math.max(0, d.line - 1), ch = Math.max(0, d.col - 1);
      const text = E.cm.getLine(line) || "";
      const end = Math.max(ch + 1, (text.slice(ch).match(/^[^\s:,}\]]*/) || [""])[0].length + ch);
      return {from: CodeMirror.Pos(line, ch), to: CodeMirror.Pos(line, end), severity: d.severity === "error" ? "error" : "warning",
        message: d.code + " " + d.message};
    });
  }
  async function lint(text) {
    const id = E.current;
    if (!id || !E.funnel) return [];
    const started = performance.now();
    const res = await api("editor/lint", {funnel: E.funnel, file: id, text});
    if (id !== E.current) return [];
    if (!res.ok) { say(message(res), true); return []; }
    const dt = Math.round(performance.now() - started);
    $("ed-diags").dataset.ms = String(dt);
    // The whole validator ran on the funnel file as typed; another file was checked for its
    // own syntax only, so the last save's problems found in it (or in other files) stay
    // listed, marked, until the next save.
    const whole = E.files[id].kind === "funnel";
    const saved = (E.lastSave || []).filter(d => !(whole && d.tab === id)).map(d => Object.assign({}, d, {fromSave: true}));
    const all = res.data.diagnostics.concat(saved);
    drawDiagnostics(all, all.length ? null : "no problems in " + id + " (checked in " + dt + " ms)");
    return annotations(all);
  }

  // -- saving -------------------------------------------------------------------------------
  async function save(overwrite) {
    const f = E.files[E.current];
    if (!f) return;
    const text = f.doc.getValue();
    say("saving…");
    const res = await api("editor/save", {funnel: E.funnel, file: f.id, text, base: overwrite ? overwrite : f.hash});
    if (res.status === 409) return conflict(f, res.data.conflict);
    if (!res.ok) return say(message(res), true);
    $("ed-conflict").hidden = true;
    f.hash = res.data.hash; f.saved = text; markDirty(f);
    const st = res.data.status;
    E.lastSave = st.diagnostics || [];
    E.cm.performLint();  // this file as typed, with the save's problems (or none left)
    const errors = (st.diagnostics || []).filter(d => d.severity === "error");
    if (errors.length && st.broken) {
      say("saved; it has problems, so it cannot run yet (no good version of it)", true);
    } else if (errors.length) {
      say("saved; it has problems, so the last good version keeps running", true);
    } else if (st.problem) {
      say("saved; the running funnel needs a migration first", true);
      await showMigration();
    } else {
      say("saved and reloaded: version " + st.version);
      $("migrate-box").hidden = true;
    }
    if (res.data.funnel && res.data.funnel !== E.funnel) {  // a broken funnel, fixed, runs under its file's name
      const pick = $("funnel"), o = [...pick.options].find(o => o.value === E.funnel);
      if (o) { o.value = res.data.funnel; o.textContent = res.data.funnel; }
      pick.value = res.data.funnel; pick.dispatchEvent(new Event("change"));
    }
  }
  function conflict(f, c) {
    const box = $("ed-conflict");
    box.hidden = false;
    const reload = el("button", {type: "button", "data-testid": "editor-conflict-reload", text: "Take the file on disk (drop my edit)"});
    const keep = el("button", {type: "button", "data-testid": "editor-conflict-overwrite", text: "Overwrite it with mine"});
    reload.addEventListener("click", () => { f.doc.setValue(c.text); f.saved = c.text; f.hash = c.hash; markDirty(f); box.hidden = true; say("took the file on disk"); });
    keep.addEventListener("click", () => save(c.hash));
    box.replaceChildren(el("strong", {text: "Not saved: " + c.file + " changed on disk since you opened it. The other change:"}),
      el("pre", {"data-testid": "editor-conflict-diff", text: c.diff || c.text}), reload, keep);
    say("not saved: the file changed on disk", true);
  }

  // -- migration ------------------------------------------------------------------------------
  async function showMigration(quiet) {
    const res = await api("editor/migration?" + q({funnel: E.funnel}));
    const box = $("migrate-box");
    if (res.ok && res.data.blocked && !quiet) { box.hidden = false; box.replaceChildren(el("div", {class: "warn", text: res.data.blocked})); return; }
    if (!res.ok) { box.hidden = false; box.replaceChildren(el("div", {class: "warn", text: message(res)})); return; }
    if (!res.data.needed) { box.hidden = true; return; }
    const run = el("button", {type: "button", "data-testid": "migrate", text: "Run the migration"});
    run.addEventListener("click", migrate);
    box.hidden = false;
    box.replaceChildren(el("strong", {text: "The edit needs its table " + res.data.table + " changed. The migration will run:"}),
      el("pre", {"data-testid": "migrate-ddl", text: res.data.ddl.join("\n")}),
      el("div", {class: "hint", text: res.data.changes.join("; ")}), run);
  }
  async function migrate() {
    say("migrating…");
    const res = await api("editor/migrate", {funnel: E.funnel});
    if (!res.ok) return say(message(res), true);
    $("migrate-box").hidden = true;
    say("migrated (" + res.data.changes.join(", ") + ") and reloaded: version " + res.data.status.version);
    if (res.data.funnel !== E.funnel) {  // a funnel held for its migration runs now
      const pick = $("funnel"), o = [...pick.options].find(o => o.value === E.funnel);
      if (o) { o.value = res.data.funnel; o.textContent = res.data.funnel; }
      pick.value = res.data.funnel; pick.dispatchEvent(new Event("change"));
    }
    $("editor").dataset.migrated = res.data.changes.join(",");
  }

  // -- completion and hover from the JSON Schema -------------------------------------------------
  async function schema() {
    const kind = E.files[E.current] && E.files[E.current].kind === "scenario" ? "scenario" : "funnel";
    if (!E.schemas[kind]) { const res = await api("editor/schema?" + q({kind})); if (res.ok) E.schemas[kind] = res.data; }
    return E.schemas[kind];
  }
  function deref(root, node) {
    const own = node && node.description;  // a property's own words win over its $ref's
    for (let i = 0; node && node.$ref && i < 20; i++) {
      node = node.$ref.replace(/^#\//, "").split("/").reduce((n, k) => n && n[k], root);
    }
    if (own && node && node.description !== own) node = Object.assign({}, node, {description: own});
    if (node && !node.properties && (node.anyOf || node.oneOf || node.allOf)) {
      for (const alt of node.anyOf || node.oneOf || node.allOf) { const d = deref(root, alt); if (d && (d.properties || d.items || d.enum)) return d; }
    }
    return node;
  }
  function child(root, node, key) {
    node = deref(root, node);
    if (!node) return null;
    if (key === "[]") return deref(root, node.items);
    if (node.properties && node.properties[key]) return deref(root, node.properties[key]);
    if (node.patternProperties) for (const [p, s] of Object.entries(node.patternProperties)) if (new RegExp(p).test(key)) return deref(root, s);
    if (node.additionalProperties && typeof node.additionalProperties === "object") return deref(root, node.additionalProperties);
    return null;
  }
  // The YAML keys from the document's root to the line (indentation, `- ` items), block style.
  function pathTo(doc, lineNo, indent) {
    const path = [];
    for (let l = lineNo - 1; l >= 0 && indent > 0; l--) {
      const t = doc.getLine(l);
      const i = t.search(/\S/);
      if (i < 0 || t.trim().startsWith("#") || i >= indent) continue;
      const rest = t.slice(i);
      const item = rest.match(/^-\s+/);
      const body = item ? rest.slice(item[0].length) : rest;
      const key = body.match(/^([^\s:#'"{}\[\]]+)\s*:/);
      if (item) {
        if (key && i + item[0].length < indent && !body.match(/:\s*\S/)) path.unshift(key[1]);
        path.unshift("[]");
      } else if (key) path.unshift(key[1]);
      indent = i;
    }
    return path;
  }
  function nodeAt(root, path) { let n = root; for (const k of path) { n = child(root, n, k); if (!n) return null; } return deref(root, n); }
  async function schemaHint(cm) {
    const root = await schema();
    const cur = cm.getCursor(), line = cm.getLine(cur.line), before = line.slice(0, cur.ch);
    const keyPos = before.match(/^(\s*)(-\s+)?([\w.-]*)$/);
    const valuePos = before.match(/^(\s*)(-\s+)?([\w.-]+)\s*:\s*([\w.-]*)$/);
    if (!root || (!keyPos && !valuePos)) return null;
    const m = keyPos || valuePos;
    const indent = m[1].length + (m[2] ? m[2].length : 0);
    const path = pathTo(cm.getDoc(), cur.line, indent);
    if (m[2]) path.push("[]");
    const node = nodeAt(root, path);
    if (!node) return null;
    let list = [], word = "";
    if (keyPos) {
      word = keyPos[3];
      list = Object.entries(node.properties || {}).filter(([k]) => k.startsWith(word))
        .map(([k, s]) => ({text: k + ": ", displayText: k, title: (deref(root, s) || {}).description || ""}));
    } else {
      word = valuePos[4];
      const s = child(root, node, valuePos[3]) || {};
      const values = s.enum || (s.type === "boolean" ? [true, false] : []);
      list = values.map(String).filter(v => v.startsWith(word)).map(v => ({text: v, displayText: v}));
    }
    if (!list.length) return null;
    return {list, from: CodeMirror.Pos(cur.line, cur.ch - word.length), to: cur};
  }
  let hoverAt = null;
  async function hover(ev) {
    const pos = E.cm.coordsChar({left: ev.clientX, top: ev.clientY}, "window");
    const key = `${pos.line}:${pos.ch}`;
    if (key === hoverAt) return;
    hoverAt = key;
    const line = E.cm.getLine(pos.line) || "";
    const m = line.match(/^(\s*)(-\s+)?([^\s:#'"{}\[\]]+)\s*:/);
    const box = $("ed-hover");
    const start = m ? m[1].length + (m[2] ? m[2].length : 0) : 0;
    if (!m || pos.ch < start || pos.ch > start + m[3].length) { box.hidden = true; return; }
    const root = await schema();
    if (!root) return;
    const path = pathTo(E.cm.getDoc(), pos.line, start);
    if (m[2]) path.push("[]");
    const s = child(root, nodeAt(root, path), m[3]);
    if (!s || !(s.description || s.type || s.enum)) { box.hidden = true; return; }
    box.replaceChildren(el("code", {text: [...path, m[3]].join(".").replace(/\.\[\]/g, "[]")}),
      el("span", {class: "hint", text: " " + (s.type ? [].concat(s.type).join(" | ") : s.enum ? "one of " + s.enum.join(", ") : "")}),
      s.description ? el("div", {text: s.description}) : null);
    box.style.left = (ev.clientX + 12) + "px"; box.style.top = (ev.clientY + 14) + "px";
    box.hidden = false;
  }

  // -- a new funnel, a model key ---------------------------------------------------------------
  async function newFunnel() {
    const out = $("nf-out");
    out.textContent = "creating…";
    const res = await api("editor/new", {name: $("nf-name").value.trim(), language: $("nf-language").value.trim(),
      currency: $("nf-currency").value.trim().toUpperCase(), template: $("nf-template").value});
    if (!res.ok) { out.textContent = message(res); out.className = "hint warn"; return; }
    out.className = "hint";
    out.textContent = "created " + res.data.path + " (" + res.data.files.length + " files) and opened it";
    $("nf-name").value = "";  // made: the form is ready for another one
    const pick = $("funnel");
    if (![...pick.options].some(o => o.value === res.data.funnel)) pick.append(el("option", {value: res.data.funnel, text: res.data.funnel}));
    pick.value = res.data.funnel;
    pick.dispatchEvent(new Event("change"));  // the playground and this tab open it
  }
  async function setKey() {
    const model = $("mk-model").value.trim(), key = $("mk-key").value;
    const res = await api("editor/model-key", {model, key: key || null});
    $("mk-key").value = "";  // the key leaves the page once it is sent
    if (!res.ok) { $("mk-out").textContent = message(res); return; }
    const k = res.data.keys;
    $("mk-out").textContent = Object.entries(k).map(([m, v]) => m + ": " + v).join(", ") || "no key given";
    $("model").value = "other"; $("model").dispatchEvent(new Event("change"));
    $("model-name").value = model;
  }

  // -- the tab ----------------------------------------------------------------------------------
  // CodeMirror (half a megabyte) is loaded when the tab is first opened: the playground's page
  // stays as light as it was. The files are the studio's own (static/vendor/codemirror).
  const VENDOR = ["codemirror.css", "show-hint.css", "lint.css", "codemirror.js", "yaml.js",
    "jinja2.js", "markdown.js", "show-hint.js", "lint.js"];
  let loading = null;
  function vendor() {
    loading = loading || VENDOR.reduce((ready, name) => ready.then(() => new Promise((done, fail) => {
      const url = "static/vendor/codemirror/" + name;
      const tag = name.endsWith(".css") ? el("link", {rel: "stylesheet", href: url}) : el("script", {src: url});
      tag.addEventListener("load", done);
      tag.addEventListener("error", () => fail(new Error("could not load " + url)));
      document.head.append(tag);
    })), Promise.resolve()).then(build);
    return loading;
  }
  async function show(on) {
    $("editor").hidden = !on;
    $("tab-editor").classList.toggle("on", on);
    if (!on) return;
    $("play").hidden = true; $("sessions").hidden = true;
    $("tab-play").classList.remove("on"); $("tab-sessions").classList.remove("on");
    try { await vendor(); } catch (e) { $("editor").textContent = String(e); return; }
    await loadFiles();
    E.cm.refresh();
  }
  window.addEventListener("DOMContentLoaded", () => {
    $("tab-editor").addEventListener("click", () => show(true));
    $("tab-play").addEventListener("click", () => show(false));
    $("tab-sessions").addEventListener("click", () => show(false));
    $("funnel").addEventListener("change", () => { if (!$("editor").hidden && E.cm) loadFiles(); });
  });
})();
