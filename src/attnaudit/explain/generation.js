/* attnaudit generated-sequence view (generation.html): plain DOM, no library, no network.
   Data comes from the JSON data block #generation-data; every string from it is put into the
   page with textContent / createTextNode, never parsed as HTML. */
(function () {
  "use strict";
  var source = document.getElementById("generation-data");
  var root = document.getElementById("gv-root");
  if (!source || !root) return;
  var DATA = JSON.parse(source.textContent);
  var METHODS = Object.keys(DATA.scores);
  var state = { step: 0, pinned: 0, method: METHODS.length ? METHODS[0] : null, words: false };
  var spans = { source: [], target: [] };
  var view = {};

  function el(tag, props, children) {
    var node = document.createElement(tag);
    Object.keys(props || {}).forEach(function (key) {
      if (key === "text") node.textContent = props[key];
      else if (key === "cls") node.className = props[key];
      else node.setAttribute(key, props[key]);
    });
    (children || []).forEach(function (child) {
      if (child !== null && child !== undefined) node.appendChild(typeof child === "string" ? document.createTextNode(child) : child);
    });
    return node;
  }
  function clear(node) { while (node.firstChild) node.removeChild(node.firstChild); }
  function fmt(value) {
    if (value === null || value === undefined) return "n/a";
    if (typeof value === "boolean") return value ? "yes" : "no";
    if (typeof value === "number") return Number.isInteger(value) ? String(value) : String(Number(value.toPrecision(4)));
    return String(value);
  }
  function quoted(text) { return JSON.stringify(String(text)); }
  /* a token as shown in the sequence: newlines and tabs as arrows, an empty token as the empty-set sign */
  function visible(text) { return text === "" ? "\u2205" : String(text).replace(/\n/g, "\u21b5").replace(/\t/g, "\u21e5"); }

  function tokenRow(tokens, side) {
    var row = el("div", { id: "gv-" + side, cls: "gv-row" });
    tokens.forEach(function (text, i) {
      var node;
      if (side === "target") {
        node = el("button", { type: "button", cls: "tok gv-step", "data-step": String(i), text: visible(text) });
        node.addEventListener("mouseenter", function () { state.step = i; render(); });
        node.addEventListener("mouseleave", function () { state.step = state.pinned; render(); });
        node.addEventListener("click", function () { state.pinned = i; state.step = i; render(); });
      } else {
        node = el("span", { cls: "tok", "data-position": String(i), text: visible(text) });
      }
      spans[side].push(node);
      row.appendChild(node);
    });
    return row;
  }

  function build() {
    var controls = el("div", { cls: "gv-controls" });
    view.method = el("select", { id: "gv-method", "aria-label": "method" }, METHODS.map(function (m) {
      return el("option", { value: m, text: m, title: DATA.about[m] || "" });
    }));
    view.method.addEventListener("change", function () { state.method = view.method.value; render(); });
    controls.appendChild(el("label", {}, ["method ", view.method]));
    if (DATA.words) {
      view.unit = el("select", { id: "gv-unit", "aria-label": "tokens or words" }, [
        el("option", { value: "tokens", text: "each token's own score" }),
        el("option", { value: "words", text: "its word's score (" + DATA.words.how + ")" })]);
      view.unit.addEventListener("change", function () { state.words = view.unit.value === "words"; render(); });
      controls.appendChild(el("label", {}, ["shade by ", view.unit]));
    }
    root.appendChild(controls);
    var first = DATA.kind === "encoder-decoder" ? "source" : "prompt";
    root.appendChild(el("table", { cls: "heat gv-seq" }, [el("tbody", {}, [
      el("tr", {}, [el("th", { text: first }), el("td", {}, [tokenRow(DATA.source, "source")])]),
      el("tr", {}, [el("th", { text: "generated" }), el("td", {}, [tokenRow(DATA.target, "target")])])])]));
    view.note = el("p", { id: "gv-note", cls: "gv-note" });
    view.details = el("tbody", {});
    view.top = el("ol", { id: "gv-top" });
    root.appendChild(view.note);
    root.appendChild(el("div", { cls: "gv-panels" }, [
      el("div", {}, [el("h3", { text: "The step" }), el("table", { id: "gv-step" }, [view.details])]),
      el("div", {}, [el("h3", { text: "Largest magnitudes" }), view.top])]));
  }

  /* the spans showing item `item` (a source token, a segment's tokens, or an earlier generated token of a decoder) */
  function spansOf(item) {
    var n = DATA.source.length;
    return (item.positions || [item.position]).map(function (p) { return p < n ? spans.source[p] : spans.target[p - n]; });
  }

  function shadeItems(t, items, scores) {
    var peak = 0;
    scores.forEach(function (v) { if (v !== null) peak = Math.max(peak, Math.abs(v)); });
    spans.source.concat(spans.target).forEach(function (node) {
      node.style.background = "";
      node.removeAttribute("data-score");
      node.classList.remove("gv-item");
      node.title = node.classList.contains("gv-step") ? "step " + node.getAttribute("data-step") + ": click to keep" : "not read at this step";
    });
    items.forEach(function (item, i) {
      var v = scores[i];
      spansOf(item).forEach(function (node) {
        if (!node) return;
        var colour = v !== null && v < 0 ? "11,87,208" : "230,97,1";
        node.style.background = "rgba(" + colour + "," + (v !== null && peak > 0 ? Math.abs(v) / peak : 0).toFixed(3) + ")";
        node.setAttribute("data-score", String(v));
        node.classList.add("gv-item");
        var what = state.words ? "word " + quoted(DATA.words.text[t][i]) + " (" + DATA.words.how + ")" : quoted(item.token);
        node.title = what + ": " + fmt(v);
      });
    });
    return peak;
  }

  function renderStep(t, items, scores) {
    clear(view.details);
    var record = DATA.steps[t] || {};
    Object.keys(record).forEach(function (key) {
      view.details.appendChild(el("tr", {}, [el("th", { text: key }), el("td", { text: key === "token" || key === "top" || key === "contrast" ? quoted(record[key]) : fmt(record[key]) })]));
    });
    clear(view.top);
    var seen = {};  /* word scores: each word once */
    var order = items.map(function (_, i) { return i; }).filter(function (i) {
      var key = items[i].side + " " + (state.words ? items[i].word : i), fresh = scores[i] !== null && !seen[key];
      seen[key] = true;
      return fresh;
    });
    order.sort(function (a, b) { return Math.abs(scores[b]) - Math.abs(scores[a]); });
    order.slice(0, 5).forEach(function (i) {
      var what = state.words ? DATA.words.text[t][i] : items[i].token;
      view.top.appendChild(el("li", {}, [el("code", { text: quoted(what) }), " " + fmt(scores[i]) + " (" + items[i].side + ")"]));
    });
  }

  function render() {
    var t = state.step, items = DATA.items[t] || [];
    var scores = state.method === null ? [] : (state.words ? DATA.words.scores : DATA.scores)[state.method][t];
    var peak = shadeItems(t, items, scores);
    spans.target.forEach(function (node, j) {
      node.classList.toggle("gv-now", j === t);
      node.classList.toggle("gv-pinned", j === state.pinned);
      node.classList.toggle("gv-later", j > t);
    });
    root.setAttribute("data-step", String(t));
    root.setAttribute("data-method", state.method === null ? "" : state.method);
    view.note.textContent = state.method === null ? "No method applies to this model (see the skipped methods below)."
      : "Step " + t + " explains " + quoted(DATA.target[t]) + " with " + state.method + (state.words ? " (word scores, " + DATA.words.how + ")" : "")
        + "; shading scaled to this step's largest magnitude, " + fmt(peak) + ".";
    renderStep(t, items, scores);
  }

  build();
  render();
  root.setAttribute("data-ready", "1");
})();
