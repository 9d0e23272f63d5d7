// "I am the model": a form built from the stage's output schema (JSON Schema), generic:
// strings, enums, numbers with bounds, booleans, arrays, nested objects, actions (oneOf)
// with their arguments. Each input carries data-testid="field-<json path>". The form only
// collects: the engine validates the answer exactly as it validates a model's output.
"use strict";
(function () {
  function el(tag, attrs, ...kids) {
    const e = document.createElement(tag);
    for (const [k, v] of Object.entries(attrs || {})) {
      if (v === undefined || v === null) continue;
      if (k === "text") e.textContent = v; else e.setAttribute(k, v);
    }
    for (const k of kids) if (k) e.append(k);
    return e;
  }
  function hint(node) {
    const bits = [];
    if (node.type) bits.push(Array.isArray(node.type) ? node.type.join("|") : node.type);
    if (node.minimum !== undefined) bits.push("≥ " + node.minimum);
    if (node.maximum !== undefined) bits.push("≤ " + node.maximum);
    if (node.minLength !== undefined) bits.push("min " + node.minLength + " chars");
    if (node.maxLength !== undefined) bits.push("max " + node.maxLength + " chars");
    if (node.maxItems !== undefined) bits.push("max " + node.maxItems + " items");
    if (node.pattern) bits.push("/" + node.pattern + "/");
    return bits.join(", ");
  }
  function row(label, input, node, required) {
    return el("label", {class: "field"},
      el("span", {class: "name", text: label + (required ? " *" : "")}), input,
      el("span", {class: "hint", text: hint(node) + (node.description ? " — " + node.description : "")}));
  }
  function variants(node) { return node.oneOf || node.anyOf || null; }
  function typeOf(node) { return Array.isArray(node.type) ? node.type.find(t => t !== "null") : node.type; }

  // Each render returns {el, get}: get() is undefined when the field is left empty.
  // ``init``: the value to start from (change-answer fills the form with a turn's answer).
  function render(node, path, labels, required, init) {
    node = node || {};
    const name = path.length ? String(path[path.length - 1]) : "answer";
    const id = "field-" + path.join(".");
    if (node.const !== undefined) {
      return {el: el("div", {class: "field const"}, el("span", {class: "name", text: name}),
        el("code", {"data-testid": id, text: JSON.stringify(node.const)})), get: () => node.const};
    }
    if (Array.isArray(node.enum)) {
      const s = el("select", {"data-testid": id}, el("option", {value: "", text: "— not set —"}));
      for (const v of node.enum) s.append(el("option", {value: JSON.stringify(v), text: labels[v] || String(v)}));
      if (init !== undefined && node.enum.some(v => JSON.stringify(v) === JSON.stringify(init))) s.value = JSON.stringify(init);
      return {el: row(name, s, node, required), get: () => s.value === "" ? undefined : JSON.parse(s.value)};
    }
    const t = typeOf(node);
    if (t === "object" || node.properties) {
      const box = el("fieldset", {class: "object", "data-path": path.join(".")},
        path.length ? el("legend", {text: name}) : null);
      const req = new Set(node.required || []);
      const kids = [];
      for (const [k, sub] of Object.entries(node.properties || {})) {
        const r = render(sub, path.concat([k]), labels, req.has(k), init && typeof init === "object" ? init[k] : undefined);
        kids.push([k, r]);
        box.append(r.el);
      }
      return {el: box, get: () => {
        const out = {};
        for (const [k, r] of kids) { const v = r.get(); if (v !== undefined) out[k] = v; }
        return Object.keys(out).length ? out : undefined;
      }};
    }
    if (t === "array") {
      const items = node.items || {};
      if (Array.isArray(items.enum)) {
        const s = el("select", {"data-testid": id, multiple: "multiple", size: String(Math.min(items.enum.length, 6))});
        for (const v of items.enum) s.append(el("option", {value: JSON.stringify(v), text: labels[v] || String(v),
          selected: Array.isArray(init) && init.some(x => JSON.stringify(x) === JSON.stringify(v)) ? "selected" : undefined}));
        return {el: row(name, s, node, required), get: () => {
          const v = [...s.selectedOptions].map(o => JSON.parse(o.value));
          return v.length ? v : undefined;
        }};
      }
      const alts = variants(items);
      if (alts || typeOf(items) === "object") {
        return listEditor(alts || [items], path, labels, node, init);
      }
      const i = el("input", {type: "text", "data-testid": id, placeholder: "comma-separated"});
      if (Array.isArray(init)) i.value = init.join(", ");
      const num = ["number", "integer"].includes(typeOf(items));
      return {el: row(name, i, node, required), get: () => {
        const v = i.value.split(",").map(x => x.trim()).filter(Boolean);
        return v.length ? v.map(x => num && x !== "" && !isNaN(Number(x)) ? Number(x) : x) : undefined;
      }};
    }
    if (t === "number" || t === "integer") {
      const i = el("input", {type: "number", "data-testid": id, step: t === "integer" ? "1" : "any",
        min: node.minimum, max: node.maximum});
      if (typeof init === "number") i.value = String(init);
      return {el: row(name, i, node, required), get: () => {
        if (i.value === "") return undefined;
        const v = Number(i.value);
        return isNaN(v) ? i.value : v;
      }};
    }
    if (t === "boolean") {
      const s = el("select", {"data-testid": id}, el("option", {value: "", text: "— not set —"}),
        el("option", {value: "true", text: "true"}), el("option", {value: "false", text: "false"}));
      if (typeof init === "boolean") s.value = String(init);
      return {el: row(name, s, node, required), get: () => s.value === "" ? undefined : s.value === "true"};
    }
    const long = path.join(".") === "reply" || (node.maxLength || 0) > 200;
    const i = long ? el("textarea", {"data-testid": id, rows: "3"}) : el("input", {type: "text", "data-testid": id});
    if (typeof init === "string") i.value = init;
    return {el: row(name, i, node, required), get: () => i.value === "" ? undefined : i.value};
  }

  // Arrays of objects (the actions): one "+ type" button per variant, items removable.
  function listEditor(alts, path, labels, node, init) {
    const box = el("fieldset", {class: "list", "data-path": path.join(".")},
      el("legend", {text: String(path[path.length - 1]) + (node.maxItems ? " (max " + node.maxItems + ")" : "")}));
    const items = el("div", {class: "items"});
    const bar = el("div", {class: "add"});
    const live = [];
    function relabel() {
      // Paths follow positions: rebuild each item's test ids after a removal.
      live.forEach((it, n) => it.el.querySelectorAll("[data-testid^='field-']").forEach(x => {
        const parts = x.getAttribute("data-testid").slice(6).split(".");
        parts[path.length] = String(n);
        x.setAttribute("data-testid", "field-" + parts.join("."));
      }));
    }
    const adders = {};
    alts.forEach((alt, k) => {
      const label = (alt.properties && alt.properties.type && alt.properties.type.const) || alt.title || ("item " + (k + 1));
      const b = el("button", {type: "button", "data-testid": "add-" + path.join(".") + "-" + label, text: "+ " + label});
      const add = value => {
        const r = render(alt, path.concat([String(live.length)]), labels, false, value);
        const rm = el("button", {type: "button", class: "remove", text: "×", title: "remove"});
        const wrap = el("div", {class: "item"}, rm, r.el);
        const entry = {el: wrap, get: r.get};
        rm.addEventListener("click", () => { live.splice(live.indexOf(entry), 1); wrap.remove(); relabel(); });
        live.push(entry);
        items.append(wrap);
      };
      adders[label] = add;
      b.addEventListener("click", () => add(undefined));
      bar.append(b);
    });
    // A given list: each item under the variant its `type` names (or the only one).
    for (const value of Array.isArray(init) ? init : []) {
      const add = adders[value && value.type] || (alts.length === 1 ? Object.values(adders)[0] : null);
      if (add) add(value);
    }
    box.append(bar, items);
    return {el: box, get: () => { const v = live.map(x => x.get()).filter(x => x !== undefined); return v.length ? v : undefined; }};
  }

  window.ModelForm = {
    build(schema, initial) {
      const labels = schema["x-labels"] || {};
      const r = render(schema, [], labels, false, initial);
      return {el: r.el, collect: () => r.get() || {}};
    },
  };
})();
