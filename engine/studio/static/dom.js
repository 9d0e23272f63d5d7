// Funnel Studio: what every script of the page builds on (loaded first): an element from a
// tag, attributes and children; the studio's JSON API; a refusal's message.
"use strict";
(function () {
  function el(tag, attrs, ...kids) {
    const e = document.createElement(tag);
    for (const [k, v] of Object.entries(attrs || {})) {
      if (v === undefined || v === null || v === false) continue;
      if (k === "text") e.textContent = v; else e.setAttribute(k, v === true ? "" : v);
    }
    for (const k of kids) if (k !== null && k !== undefined) e.append(k);
    return e;
  }
  // GET `api/PATH`, or POST BODY as JSON: {ok, status, data}; a body that is not JSON is a
  // refusal of its own, never an exception.
  async function api(path, body) {
    const opts = body === undefined ? {} : {method: "POST", headers: {"content-type": "application/json"}, body: JSON.stringify(body)};
    const r = await fetch("api/" + path, opts);
    let data = null;
    try { data = await r.json(); } catch (e) { data = {error: {message: "the studio answered " + r.status + " without JSON"}}; }
    return {ok: r.ok, status: r.status, data};
  }
  const message = res => (res.data && res.data.error && res.data.error.message) || ("failed: " + res.status);
  window.StudioDom = Object.freeze({el, api, message});
})();
