/* funnel web widget: a chat panel for one funnel, no dependencies.
 *
 *   <script src="https://chat.example.com/widget.js" data-funnel="puramur" async></script>
 *
 * Optional attributes: data-api (service URL; default: where this script comes from),
 * data-title, data-subtitle, data-greeting (a first bubble shown locally),
 * data-placeholder, data-color (accent, any CSS colour), data-open="true", data-lang
 * (uk, ru, en or pl: the widget's own words; default: the page's <html lang>).
 * The service issues the session: the widget keeps the signed token it gets
 * in localStorage and sends it as a bearer token; it never names a session.
 * window.FunnelWidget.open() / .close() let the page drive it.
 */
(function () {
  "use strict";
  var script = document.currentScript || document.querySelector("script[data-funnel]");
  if (!script || window.FunnelWidget) return;
  var attr = function (name, fallback) {
    var v = script.getAttribute("data-" + name);
    return v === null || v === "" ? fallback : v;
  };
  var funnel = attr("funnel", "");
  if (!funnel) { console.error("funnel widget: data-funnel is missing"); return; }
  var api = attr("api", new URL(script.src, location.href).origin).replace(/\/+$/, "");
  var base = api + "/v1/funnels/" + encodeURIComponent(funnel);
  var storeKey = "funnel-widget:" + api + ":" + funnel;
  // The widget's own words, in the languages the engine's texts ship in (docs/language.md):
  // the script's data-lang, else the page's <html lang>, else the browser's; English
  // for any other. Read when a text is shown, so a page that changes its language is
  // followed. What the page sets (data-title, ...) is the page's own.
  var WORDS = {
    en: { title: "Chat with us", subtitle: "Online \u00b7 replies in seconds",
          placeholder: "Type a message\u2026", open: "Open chat: ", close: "Close chat",
          message: "Message", send: "Send",
          offline: "Can't connect right now. Please try again in a moment.",
          busy: "We're a little busy. Please send that again in {s} s.",
          busySoon: "We're a little busy. Please send that again shortly.",
          long: "That message is too long. Please split it.",
          failed: "Sorry, that didn't go through. Please try again.",
          lost: "Connection lost. Please try again." },
    uk: { title: "Напишіть нам", subtitle: "Онлайн \u00b7 відповідаємо за секунди",
          placeholder: "Напишіть повідомлення\u2026", open: "Відкрити чат: ",
          close: "Закрити чат", message: "Повідомлення", send: "Надіслати",
          offline: "Зараз не вдається з'єднатися. Спробуйте ще раз за мить.",
          busy: "Зараз трохи завантажено. Надішліть це ще раз за {s} с.",
          busySoon: "Зараз трохи завантажено. Надішліть це ще раз трохи згодом.",
          long: "Повідомлення задовге. Будь ласка, розділіть його.",
          failed: "Вибачте, не вдалося надіслати. Спробуйте ще раз.",
          lost: "З'єднання втрачено. Спробуйте ще раз." },
    ru: { title: "Напишите нам", subtitle: "Онлайн \u00b7 отвечаем за секунды",
          placeholder: "Напишите сообщение\u2026", open: "Открыть чат: ",
          close: "Закрыть чат", message: "Сообщение", send: "Отправить",
          offline: "Сейчас не удаётся подключиться. Попробуйте ещё раз через минуту.",
          busy: "Сейчас мы немного загружены. Отправьте это ещё раз через {s} с.",
          busySoon: "Сейчас мы немного загружены. Отправьте это ещё раз чуть позже.",
          long: "Сообщение слишком длинное. Пожалуйста, разделите его.",
          failed: "Извините, не удалось отправить. Попробуйте ещё раз.",
          lost: "Соединение потеряно. Попробуйте ещё раз." },
    pl: { title: "Napisz do nas", subtitle: "Online \u00b7 odpowiadamy w kilka sekund",
          placeholder: "Napisz wiadomość\u2026", open: "Otwórz czat: ",
          close: "Zamknij czat", message: "Wiadomość", send: "Wyślij",
          offline: "Nie można teraz nawiązać połączenia. Spróbuj ponownie za chwilę.",
          busy: "Mamy teraz dużo pracy. Wyślij to ponownie za {s} s.",
          busySoon: "Mamy teraz dużo pracy. Wyślij to ponownie za moment.",
          long: "Ta wiadomość jest za długa. Podziel ją, proszę.",
          failed: "Przepraszamy, nie udało się wysłać. Spróbuj ponownie.",
          lost: "Utracono połączenie. Spróbuj ponownie." }
  };
  function say(key) {
    var lang = (attr("lang", "") || document.documentElement.lang || navigator.language || "en")
      .slice(0, 2).toLowerCase();
    return (WORDS[lang] || WORDS.en)[key];
  }
  var title = attr("title", say("title"));

  if (!document.querySelector("link[data-funnel-widget]")) {
    var link = document.createElement("link");
    link.rel = "stylesheet";
    link.href = api + "/widget.css";
    link.setAttribute("data-funnel-widget", "");
    document.head.appendChild(link);
  }

  function el(tag, cls, text) {
    var node = document.createElement(tag);
    if (cls) node.className = cls;
    if (text !== undefined) node.textContent = text;
    return node;
  }
  var ICON_CHAT = '<svg viewBox="0 0 24 24" aria-hidden="true"><path d="M4 5.5A2.5 2.5 0 0 1 6.5 3h11A2.5 2.5 0 0 1 20 5.5v8a2.5 2.5 0 0 1-2.5 2.5H10l-4.2 3.6c-.5.4-1.3.1-1.3-.6V16h0A2.5 2.5 0 0 1 4 13.5z"/></svg>';
  var ICON_CLOSE = '<svg viewBox="0 0 24 24" aria-hidden="true"><path d="M6.4 5 12 10.6 17.6 5 19 6.4 13.4 12l5.6 5.6-1.4 1.4-5.6-5.6L6.4 19 5 17.6 10.6 12 5 6.4z"/></svg>';
  var ICON_SEND = '<svg viewBox="0 0 24 24" aria-hidden="true"><path d="M3.4 20.6 21 12 3.4 3.4 3.4 10l12.6 2-12.6 2z"/></svg>';

  var root = el("div", "fw-root");
  var accent = attr("color", "");
  if (accent) root.style.setProperty("--fw-accent", accent);
  var launcher = el("button", "fw-launcher");
  launcher.type = "button";
  launcher.setAttribute("aria-label", say("open") + title);
  launcher.innerHTML = ICON_CHAT;
  var panel = el("div", "fw-panel");
  panel.setAttribute("role", "dialog");
  panel.setAttribute("aria-label", title);
  panel.hidden = true;
  var header = el("div", "fw-header");
  var avatar = el("div", "fw-avatar", title.trim().charAt(0).toUpperCase() || "?");
  var heading = el("div", "fw-heading");
  heading.appendChild(el("div", "fw-title", title));
  heading.appendChild(el("div", "fw-subtitle", attr("subtitle", say("subtitle"))));
  var close = el("button", "fw-close", "\u00d7");
  close.type = "button";
  close.setAttribute("aria-label", say("close"));
  header.appendChild(avatar); header.appendChild(heading); header.appendChild(close);
  var log = el("div", "fw-log");
  log.setAttribute("role", "log");
  log.setAttribute("aria-live", "polite");
  var form = el("form", "fw-form");
  var input = el("textarea", "fw-input");
  input.rows = 1;
  input.maxLength = 8000;
  input.placeholder = attr("placeholder", say("placeholder"));
  input.setAttribute("aria-label", say("message"));
  var send = el("button", "fw-send");
  send.type = "submit";
  send.setAttribute("aria-label", say("send"));
  send.innerHTML = ICON_SEND;
  form.appendChild(input); form.appendChild(send);
  panel.appendChild(header); panel.appendChild(log); panel.appendChild(form);
  root.appendChild(panel); root.appendChild(launcher);

  function bubble(role, text) {
    var row = el("div", "fw-row fw-" + role);
    row.appendChild(el("div", "fw-bubble", text));
    log.appendChild(row);
    log.scrollTop = log.scrollHeight;
    return row;
  }
  function notice(text) {
    var row = el("div", "fw-notice", text);
    log.appendChild(row);
    log.scrollTop = log.scrollHeight;
  }
  var typing = el("div", "fw-row fw-bot fw-typing");
  typing.innerHTML = '<div class="fw-bubble"><span></span><span></span><span></span></div>';

  function stored() { try { return localStorage.getItem(storeKey); } catch (e) { return null; } }
  function keep(token) { try { localStorage.setItem(storeKey, token); } catch (e) { /* private mode */ } }
  var token = stored();

  function session() {  // renew the stored token, or get a new session
    var headers = token ? { Authorization: "Bearer " + token } : {};
    return fetch(base + "/widget/session", { method: "POST", headers: headers })
      .then(function (r) { if (!r.ok) throw r; return r.json(); })
      .then(function (body) { token = body.token; keep(token); return token; });
  }
  function call(method, path, body, retried, accept) {
    var init = { method: method, headers: { Authorization: "Bearer " + token } };
    if (accept) init.headers.Accept = accept;
    if (body !== undefined) {
      init.headers["Content-Type"] = "application/json";
      init.body = JSON.stringify(body);
    }
    return fetch(base + path, init).then(function (r) {
      if (r.status === 401 && !retried) {
        token = null;
        return session().then(function () { return call(method, path, body, true, accept); });
      }
      return r;
    });
  }

  var ready = null;
  function start() {
    if (!ready) {
      ready = session().then(function () { return call("GET", "/widget/messages"); })
        .then(function (r) { return r.ok ? r.json() : { messages: [] }; })
        .then(function (body) {
          var greeting = attr("greeting", "");
          if (!body.messages.length && greeting) bubble("bot", greeting);
          body.messages.forEach(function (m) {
            bubble(m.role === "user" ? "user" : "bot", m.content);
          });
        })
        .catch(function () { ready = null; notice(say("offline")); });
    }
    return ready;
  }

  function open() {
    panel.hidden = false;
    root.classList.add("fw-open");
    launcher.setAttribute("aria-expanded", "true");
    launcher.innerHTML = ICON_CLOSE;
    start();
    setTimeout(function () { input.focus(); }, 50);
  }
  function shut() {
    panel.hidden = true;
    root.classList.remove("fw-open");
    launcher.setAttribute("aria-expanded", "false");
    launcher.innerHTML = ICON_CHAT;
  }
  var busy = false;
  // A key per message, reused when the same text is sent again after a failure: the
  // service then answers the first delivery instead of running a second turn.
  var unsent = null;
  function newKey() {
    if (window.crypto && crypto.randomUUID) return crypto.randomUUID();
    return "w" + Date.now().toString(36) + Math.random().toString(36).slice(2, 12);
  }
  function submit() {
    var text = input.value.trim();
    if (!text || busy) return;
    var key = unsent && unsent.text === text ? unsent.key : newKey();
    unsent = { text: text, key: key };
    busy = true;
    send.disabled = true;
    input.value = "";
    grow();
    bubble("user", text);
    log.appendChild(typing);
    log.scrollTop = log.scrollHeight;
    (ready || start()).then(function () {
      if (!token) throw new Error("no session");
      return call("POST", "/widget/messages", { text: text, client_message_id: key }, false,
                  canStream ? "text/event-stream" : undefined);
    }).then(function (r) {
      if (r.ok) {
        var kind = r.headers.get("Content-Type") || "";
        // The key is kept until the turn arrived: sent again, it is answered, not rerun.
        if (kind.indexOf("text/event-stream") === 0 && r.body) {
          return streamed(r).then(function () { unsent = null; });
        }
        unsent = null;
        // A manager holds the session: no bubble unless the funnel has a holding reply.
        return r.json().then(function (body) { if (body.reply) bubble("bot", body.reply); });
      }
      var wait = r.headers.get("Retry-After");
      if (r.status === 429 || r.status === 503) {
        notice(wait && /^[0-9]{1,5}$/.test(wait) ? say("busy").replace("{s}", wait) : say("busySoon"));
      } else if (r.status === 413) {
        notice(say("long"));
      } else {
        notice(say("failed"));
      }
      if (!input.value) input.value = text;
    }).catch(function () {
      notice(say("lost"));
      if (!input.value) input.value = text;
    }).then(function () {
      if (typing.parentNode) typing.parentNode.removeChild(typing);
      busy = false;
      send.disabled = false;
      grow();
    });
  }
  // The reply as it is written (Server-Sent Events: delta, replace, then the turn); the
  // turn's reply is the one kept. Without a readable body, the turn event alone.
  function streamed(r) {
    var row = null, shown = "", turn = null, buffer = "";
    function show(text) {
      shown = text;
      if (!row) {
        if (typing.parentNode) typing.parentNode.removeChild(typing);
        row = bubble("bot", "");
        row.setAttribute("data-testid", "fw-streaming");
      }
      row.firstChild.textContent = shown;
      log.scrollTop = log.scrollHeight;
    }
    function handle(block) {
      var event = "message", data = "";
      block.split("\n").forEach(function (line) {
        if (line.indexOf("event: ") === 0) event = line.slice(7);
        else if (line.indexOf("data: ") === 0) data += line.slice(6);
      });
      if (!data) return;
      var body = JSON.parse(data);
      if (event === "delta") show(shown + body.text);
      else if (event === "replace") show(body.text);
      else if (event === "turn") turn = body;
      else if (event === "error") throw new Error(body.message || "stream error");
    }
    var reader = r.body.getReader(), decoder = new TextDecoder();
    function pump() {
      return reader.read().then(function (part) {
        buffer += decoder.decode(part.value || new Uint8Array(), { stream: !part.done });
        var at;
        while ((at = buffer.indexOf("\n\n")) >= 0) {
          handle(buffer.slice(0, at));
          buffer = buffer.slice(at + 2);
        }
        if (!part.done) return pump();
        if (!turn) throw new Error("the stream ended before the turn");
        show(turn.reply);
        row.removeAttribute("data-testid");
      });
    }
    return pump();
  }
  var canStream = !!(window.ReadableStream && window.TextDecoder);

  function grow() {
    input.style.height = "auto";
    input.style.height = Math.min(input.scrollHeight + 2, 120) + "px";
    input.style.overflowY = input.scrollHeight + 2 > 120 ? "auto" : "hidden";
  }

  launcher.addEventListener("click", function () { panel.hidden ? open() : shut(); });
  close.addEventListener("click", shut);
  form.addEventListener("submit", function (e) { e.preventDefault(); submit(); });
  input.addEventListener("input", grow);
  input.addEventListener("keydown", function (e) {
    if (e.key === "Enter" && !e.shiftKey && !e.isComposing) { e.preventDefault(); submit(); }
  });
  document.addEventListener("keydown", function (e) {
    if (e.key === "Escape" && !panel.hidden) shut();
  });

  function mount() {
    document.body.appendChild(root);
    if (attr("open", "") === "true") open();
  }
  if (document.body) mount(); else document.addEventListener("DOMContentLoaded", mount);
  window.FunnelWidget = { open: open, close: shut };
})();
