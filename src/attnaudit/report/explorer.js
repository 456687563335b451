/* attnaudit report explorer: plain DOM, no library, no network.
   Data comes from the JSON data block #explorer-data; every string from it is
   put into the page with textContent / createTextNode, never parsed as HTML. */
(function () {
  "use strict";
  var source = document.getElementById("explorer-data");
  var root = document.getElementById("xp-root");
  if (!source || !root) return;
  var DATA = JSON.parse(source.textContent);
  var SVG = "http://www.w3.org/2000/svg";
  var HEAD_COLOURS = ["#1f77b4", "#d62728", "#2ca02c", "#9467bd", "#ff7f0e", "#17becf",
    "#8c564b", "#e377c2", "#7f7f7f", "#bcbd22", "#393b79", "#637939"];
  var ROW = 18;
  var state = { pos: 0, layer: 0, head: 0, view: "head", methods: [], shown: [], token: 0 };
  var cache = {};

  function el(tag, props, children) {
    var node = document.createElement(tag);
    Object.keys(props || {}).forEach(function (key) {
      if (key === "text") node.textContent = props[key];
      else if (key === "cls") node.className = props[key];
      else if (key === "on") Object.keys(props.on).forEach(function (ev) { node.addEventListener(ev, props.on[ev]); });
      else node.setAttribute(key, props[key]);
    });
    (children || []).forEach(function (child) {
      if (child !== null && child !== undefined) node.appendChild(typeof child === "string" ? document.createTextNode(child) : child);
    });
    return node;
  }
  function svg(tag, attrs) {
    var node = document.createElementNS(SVG, tag);
    Object.keys(attrs).forEach(function (key) { node.setAttribute(key, attrs[key]); });
    return node;
  }
  function clear(node) { while (node.firstChild) node.removeChild(node.firstChild); }
  function fmt(value) {
    if (value === null || value === undefined) return "n/a";
    if (typeof value === "boolean") return value ? "yes" : "no";
    if (typeof value === "number") return Number.isInteger(value) ? String(value) : String(Number(value.toPrecision(3)));
    return String(value);
  }

  /* attention: base64 -> inflate (zlib) -> uint8 codes, weight = code * scale / 255 */
  function attention(inst) {
    if (cache[inst.index]) return cache[inst.index];
    var binary = atob(inst.attention);
    var bytes = new Uint8Array(binary.length);
    for (var i = 0; i < binary.length; i++) bytes[i] = binary.charCodeAt(i);
    var stream = new Blob([bytes]).stream().pipeThrough(new DecompressionStream("deflate"));
    cache[inst.index] = new Response(stream).arrayBuffer().then(function (buffer) {
      var codes = new Uint8Array(buffer), offset = 0;
      return inst.layers.map(function (layer) {
        var size = layer.heads * layer.q * layer.k;
        var view = codes.subarray(offset, offset + size);
        offset += size;
        return view;
      });
    });
    return cache[inst.index];
  }

  /* ---------------------------------------------------------------- instance list */
  var controls = {};
  function buildSide() {
    controls.search = el("input", { id: "xp-search", type: "search", placeholder: "search the text", "aria-label": "search" });
    controls.correct = el("select", { id: "xp-correct", "aria-label": "correct or wrong" }, [
      el("option", { value: "all", text: "correct and wrong" }), el("option", { value: "right", text: "correct only" }),
      el("option", { value: "wrong", text: "wrong only" })]);
    var golds = [];
    DATA.instances.forEach(function (inst) { if (inst.gold !== null && golds.indexOf(inst.gold) < 0) golds.push(inst.gold); });
    controls.label = el("select", { id: "xp-label", "aria-label": "gold label" },
      [el("option", { value: "", text: "every label" })].concat(golds.sort().map(function (g) { return el("option", { value: g, text: "gold: " + g }); })));
    var sorts = [el("option", { value: "", text: "order: as tested" })];
    DATA.tests.forEach(function (test) {
      test.effects.forEach(function (effect) {
        sorts.push(el("option", { value: test.name + "\u0000" + effect.column + "\u0000" + effect.order,
          text: "sort: " + test.name + " \u2013 " + effect.about }));
      });
    });
    controls.sort = el("select", { id: "xp-sort", "aria-label": "sort by" }, sorts);
    controls.count = el("div", { cls: "xp-count" });
    controls.list = el("ol", { id: "xp-list", cls: "xp-list" });
    [controls.search, controls.correct, controls.label, controls.sort].forEach(function (c) {
      c.addEventListener(c === controls.search ? "input" : "change", renderList);
    });
    return el("div", { cls: "xp-side" }, [controls.search, controls.correct, controls.label, controls.sort, controls.count, controls.list]);
  }
  function sortKey() {
    var parts = controls.sort.value.split("\u0000");
    return parts.length === 3 ? { test: parts[0], column: parts[1], order: parts[2] } : null;
  }
  function effectValue(inst, key) {
    var row = inst.tests[key.test];
    var value = row ? row[key.column] : null;
    if (typeof value === "boolean") value = value ? 1 : 0;
    return typeof value === "number" ? value : null;
  }
  function renderList() {
    var query = controls.search.value.trim().toLowerCase();
    var key = sortKey();
    var shown = DATA.instances.map(function (inst, pos) { return pos; }).filter(function (pos) {
      var inst = DATA.instances[pos];
      if (query && inst.text.toLowerCase().indexOf(query) < 0) return false;
      if (controls.correct.value === "right" && inst.correct !== true) return false;
      if (controls.correct.value === "wrong" && inst.correct !== false) return false;
      return !(controls.label.value && inst.gold !== controls.label.value);
    });
    if (key) {
      shown.sort(function (a, b) {
        var x = effectValue(DATA.instances[a], key), y = effectValue(DATA.instances[b], key);
        if (x === null || y === null) return (x === null) - (y === null) || a - b;
        return (key.order === "asc" ? x - y : y - x) || a - b;
      });
    }
    state.shown = shown;
    controls.count.textContent = shown.length + " of " + DATA.instances.length + " instances";
    clear(controls.list);
    shown.forEach(function (pos) {
      var inst = DATA.instances[pos];
      var mark = inst.correct === null ? "" : inst.correct ? "\u2713 " : "\u2717 ";
      var head = "#" + inst.index + " " + mark + (inst.gold === null ? "" : inst.gold) + (inst.pred ? " \u2192 " + inst.pred : "");
      var extra = key ? " \u00b7 " + fmt(effectValue(inst, key)) : "";
      var button = el("button", { type: "button", "data-pos": String(pos), cls: pos === state.pos ? "sel" : "",
        on: { click: function () { select(pos); } } }, [el("b", { text: head + extra }), el("span", { text: inst.text })]);
      controls.list.appendChild(el("li", {}, [button]));
    });
  }
  function select(pos) {
    state.pos = pos;
    state.token = 0;
    var inst = DATA.instances[pos];
    if (state.layer >= inst.layers.length) state.layer = 0;
    renderList();
    renderInstance();
  }

  /* ---------------------------------------------------------------- explanations */
  var main = {};
  function renderHeader(inst) {
    clear(main.header);
    var bits = ["#" + inst.index];
    if (inst.gold !== null) bits.push("gold: " + inst.gold);
    if (inst.pred) bits.push("predicted: " + inst.pred + (inst.p !== undefined ? " (p = " + fmt(inst.p) + ")" : ""));
    if (inst.correct !== null) bits.push(inst.correct ? "correct" : "wrong");
    main.header.appendChild(el("div", { id: "xp-title", cls: "xp-title", text: bits.join(" \u00b7 ") }));
    main.header.appendChild(el("div", { cls: "xp-text", text: inst.text }));
  }
  function renderMethods(inst) {
    clear(main.chips);
    DATA.methods.forEach(function (method) {
      var on = state.methods.indexOf(method.name) >= 0;
      main.chips.appendChild(el("button", { type: "button", cls: "xp-chip", "data-method": method.name, title: method.about,
        "aria-pressed": on ? "true" : "false", text: method.name,
        on: { click: function () {
          var at = state.methods.indexOf(method.name);
          if (at >= 0) state.methods.splice(at, 1); else state.methods.push(method.name);
          renderMethods(DATA.instances[state.pos]);
        } } }));
    });
    clear(main.heat);
    var rationale = inst.rationale || [];
    state.methods.forEach(function (name) {
      var scores = inst.scores[name];
      if (!scores) return;
      var peak = 0;
      scores.forEach(function (v) { peak = Math.max(peak, Math.abs(v)); });
      var faith = inst.faithfulness[name];
      var label = [el("span", { text: name })];
      if (faith) label.push(el("small", { text: "comp " + fmt(faith.comp) + " \u00b7 suff " + fmt(faith.suff),
        title: "per-instance comprehensiveness / sufficiency (AOPC, " + faith.mode + "), faithfulness test" }));
      var cell = el("td", {});
      inst.items.forEach(function (item, i) {
        var span = el("span", { cls: rationale.indexOf(i) >= 0 ? "tok rat" : "tok", title: fmt(scores[i]), text: item });
        if (inst.roles && inst.roles[i] === "template") {  // a chat template's own token: greyed
          span.style.background = "#eee"; span.style.color = "#999";
        } else {
          span.style.background = "rgba(230,97,1," + (peak > 0 ? Math.abs(scores[i]) / peak : 0).toFixed(3) + ")";
        }
        cell.appendChild(span);
      });
      main.heat.appendChild(el("tr", { "data-method": name }, [el("th", {}, label), cell]));
    });
    if (!state.methods.length || !DATA.methods.length) {
      main.heat.appendChild(el("tr", {}, [el("td", { cls: "muted", text: DATA.methods.length ? "pick a method above" :
        "no explanation applies to this model (no decision per instance)" })]));
    }
  }

  /* ---------------------------------------------------------------- attention */
  function renderAttentionControls(inst) {
    clear(main.layer);
    inst.layers.forEach(function (layer, i) {
      main.layer.appendChild(el("option", { value: String(i), text: "layer " + i + " \u00b7 " + layer.name + (layer.kind === "cross" ? " (cross)" : "") }));
    });
    main.layer.value = String(state.layer);
    var layer = inst.layers[state.layer];
    clear(main.head);
    if (!layer) return;
    if (state.head >= layer.heads) state.head = 0;
    main.head.appendChild(el("option", { value: "-1", text: "all heads" }));
    for (var h = 0; h < layer.heads; h++) main.head.appendChild(el("option", { value: String(h), text: "head " + h }));
    main.head.value = String(state.head);
    main.viewHead.setAttribute("aria-pressed", state.view === "head" ? "true" : "false");
    main.viewModel.setAttribute("aria-pressed", state.view === "model" ? "true" : "false");
  }
  function weight(codes, layer, h, qi, ki) {
    return codes[(h * layer.q + qi) * layer.k + ki] / 255;
  }
  function headView(inst, layers) {
    var layer = inst.layers[state.layer], codes = layers[state.layer];
    var keys = inst.tokens.length === layer.k ? inst.tokens : inst.items.length === layer.k ? inst.items
      : Array.from({ length: layer.k }, function (_, i) { return "k" + i; });
    var queries = layer.queries || keys;
    var rows = Math.max(keys.length, queries.length), height = rows * ROW + 10;
    var qTop = (rows - queries.length) * ROW / 2, kTop = (rows - keys.length) * ROW / 2;
    var picture = svg("svg", { width: "480", height: String(height), viewBox: "0 0 480 " + height, id: "xp-headview",
      "data-layer": String(state.layer), "data-head": String(state.head), role: "img" });
    var heads = state.head < 0 ? Array.from({ length: layer.heads }, function (_, h) { return h; }) : [state.head];
    var lines = svg("g", {});
    picture.appendChild(lines);
    var drawn = 0;
    heads.forEach(function (h) {
      for (var qi = 0; qi < layer.q; qi++) {
        for (var ki = 0; ki < layer.k; ki++) {
          var w = weight(codes, layer, h, qi, ki);
          if (w < 0.02) continue;
          var y1 = qTop + qi * ROW + ROW / 2 + 5, y2 = kTop + ki * ROW + ROW / 2 + 5;
          var line = svg("line", { x1: "160", y1: String(y1), x2: "320", y2: String(y2), stroke: HEAD_COLOURS[h % HEAD_COLOURS.length],
            "stroke-width": "2", "stroke-opacity": w.toFixed(3), "data-q": String(qi), "data-k": String(ki) });
          lines.appendChild(line);
          drawn++;
        }
      }
    });
    picture.setAttribute("data-lines", String(drawn));
    function focus(side, index) {
      Array.prototype.forEach.call(lines.childNodes, function (line) {
        line.style.display = index === null || line.getAttribute(side) === String(index) ? "" : "none";
      });
      Array.prototype.forEach.call(picture.querySelectorAll("text"), function (t) {
        t.classList.toggle("xp-focus", index !== null && t.getAttribute(side) === String(index));
      });
      picture.setAttribute("data-focus", index === null ? "" : side + index);
    }
    function label(text, x, y, anchor, side, index) {
      var node = svg("text", { x: String(x), y: String(y), "text-anchor": anchor, "dominant-baseline": "middle", "class": "xp-tok" });
      node.setAttribute(side, String(index));
      node.textContent = text;
      node.addEventListener("mouseenter", function () { focus(side, index); });
      node.addEventListener("mouseleave", function () { focus(side, null); });
      picture.appendChild(node);
    }
    queries.forEach(function (t, i) { label(t, 154, qTop + i * ROW + ROW / 2 + 5, "end", "data-q", i); });
    keys.forEach(function (t, i) { label(t, 326, kTop + i * ROW + ROW / 2 + 5, "start", "data-k", i); });
    var about = (layer.kind === "cross" ? "cross-attention: decoder positions (left) attend to encoder tokens (right). "
      : layer.causal ? "causal: each token (left) attends only to itself and earlier tokens (right). "
      : "each token (left) attends to the tokens on the right. ")
      + "Opacity: weight \u00f7 the layer's largest weight (" + fmt(layer.scale) + "); colour: head; hover a token to focus it.";
    return el("div", {}, [el("p", { cls: "xp-note", text: about }), legend(heads), picture]);
  }
  function legend(heads) {
    return el("div", { cls: "xp-legend" }, heads.map(function (h) {
      var swatch = el("span", { cls: "xp-swatch" });
      swatch.style.background = HEAD_COLOURS[h % HEAD_COLOURS.length];
      return el("span", {}, [swatch, "head " + h]);
    }));
  }
  function modelView(inst, layers) {
    var grid = el("div", { id: "xp-modelview", cls: "xp-grid" });
    inst.layers.forEach(function (layer, l) {
      var row = el("div", { cls: "xp-grid-row" }, [el("span", { cls: "xp-grid-label", text: "L" + l + (layer.kind === "cross" ? " \u00d7" : "") })]);
      for (var h = 0; h < layer.heads; h++) {
        var canvas = el("canvas", { width: String(layer.k), height: String(layer.q), title: "layer " + l + ", head " + h + ": click to open",
          "data-layer": String(l), "data-head": String(h), cls: l === state.layer && h === state.head ? "sel" : "" });
        paint(canvas, layers[l], layer, h);
        canvas.addEventListener("click", (function (ll, hh) {
          return function () { state.layer = ll; state.head = hh; state.view = "head"; renderAttention(); };
        })(l, h));
        row.appendChild(canvas);
      }
      grid.appendChild(row);
    });
    return el("div", {}, [el("p", { cls: "xp-note", text: "Every layer (rows) \u00d7 head (columns): query tokens down, key tokens across; darker = more weight. Click one to open it in the head view." }), grid]);
  }
  function paint(canvas, codes, layer, h) {
    var ctx = canvas.getContext("2d");
    var image = ctx.createImageData(layer.k, layer.q);
    for (var qi = 0; qi < layer.q; qi++) {
      for (var ki = 0; ki < layer.k; ki++) {
        var w = weight(codes, layer, h, qi, ki), at = (qi * layer.k + ki) * 4;
        image.data[at] = Math.round(255 - 224 * w);
        image.data[at + 1] = Math.round(255 - 170 * w);
        image.data[at + 2] = Math.round(255 - 75 * w);
        image.data[at + 3] = 255;
      }
    }
    ctx.putImageData(image, 0, 0);
  }
  var drawing = 0;
  function renderAttention() {
    var inst = DATA.instances[state.pos];
    renderAttentionControls(inst);
    var ticket = ++drawing;
    if (!inst.layers.length) {
      clear(main.att);
      main.att.appendChild(el("p", { cls: "muted", text: "no traced attention layer has this instance's tokens as keys" }));
      return Promise.resolve();
    }
    return attention(inst).then(function (layers) {
      if (ticket !== drawing) return;
      clear(main.att);
      main.att.setAttribute("data-view", state.view);
      main.att.appendChild(state.view === "head" ? headView(inst, layers) : modelView(inst, layers));
    });
  }

  /* ---------------------------------------------------------------- tests */
  /* attention distributions a test recorded for this instance (original vs adversarial), as token rows */
  function distributions(inst, found) {
    if (!found) return null;
    var table = el("table", { cls: "heat xp-dist" });
    Object.keys(found).forEach(function (name) {
      var values = found[name], peak = 0;
      var labels = values.length === inst.tokens.length ? inst.tokens : values.length === inst.items.length ? inst.items
        : values.map(function (_, i) { return "#" + i; });
      values.forEach(function (v) { peak = Math.max(peak, v); });
      var cell = el("td", {});
      values.forEach(function (v, i) {
        var span = el("span", { cls: "tok", title: fmt(v), text: labels[i] });
        span.style.background = "rgba(11,87,208," + (peak > 0 ? v / peak : 0).toFixed(3) + ")";
        cell.appendChild(span);
      });
      table.appendChild(el("tr", { "data-distribution": name }, [el("th", { text: name + " attention" }), cell]));
    });
    return table;
  }
  function columns(row) {
    return el("table", {}, Object.keys(row).map(function (k) {
      return el("tr", {}, [el("th", { text: k }), el("td", { text: fmt(row[k]) })]);
    }));
  }
  function renderTests(inst) {
    clear(main.tests);
    var body = el("tbody", {}), others = [];
    DATA.tests.forEach(function (test) {
      var row = inst.tests[test.name];
      if (!row) return;
      var shown = test.effects.filter(function (e) { return e.column in row; });
      if (!shown.length) {
        others.push(el("details", { "data-test": test.name, title: test.description }, [el("summary", { text: test.name }), columns(row)]));
        return;
      }
      var effects = el("ul", { cls: "xp-effects" }, shown.map(function (e) {
        return el("li", {}, [el("b", { text: fmt(row[e.column]) }), " " + e.about]);
      }));
      var details = el("details", {}, [el("summary", { text: "all columns" }), columns(row)]);
      body.appendChild(el("tr", { "data-test": test.name }, [el("th", { title: test.description, text: test.name }),
        el("td", {}, [effects, distributions(inst, (inst.distributions || {})[test.name]), details])]));
    });
    if (others.length) body.appendChild(el("tr", {}, [el("th", { text: "other tests" }), el("td", { cls: "xp-others" }, others)]));
    if (!body.childNodes.length) body.appendChild(el("tr", {}, [el("td", { cls: "muted", text: "no test recorded per-instance results" })]));
    main.tests.appendChild(body);
  }

  function renderInstance() {
    var inst = DATA.instances[state.pos];
    renderHeader(inst);
    renderMethods(inst);
    renderTests(inst);
    return renderAttention();
  }

  function buildMain() {
    main.header = el("div", { id: "xp-header" });
    main.chips = el("div", { id: "xp-methods", cls: "xp-chips" });
    main.heat = el("table", { id: "xp-heat", cls: "heat" });
    main.layer = el("select", { id: "xp-layer", "aria-label": "layer" });
    main.head = el("select", { id: "xp-headsel", "aria-label": "head" });
    main.viewHead = el("button", { type: "button", id: "xp-view-head", cls: "xp-chip", text: "head view" });
    main.viewModel = el("button", { type: "button", id: "xp-view-model", cls: "xp-chip", text: "model view" });
    main.att = el("div", { id: "xp-att", cls: "xp-att" });
    main.tests = el("table", { id: "xp-tests", cls: "xp-tests" });
    main.layer.addEventListener("change", function () { state.layer = Number(main.layer.value); renderAttention(); });
    main.head.addEventListener("change", function () { state.head = Number(main.head.value); renderAttention(); });
    main.viewHead.addEventListener("click", function () { state.view = "head"; renderAttention(); });
    main.viewModel.addEventListener("click", function () { state.view = "model"; renderAttention(); });
    return el("div", { cls: "xp-main" }, [main.header,
      el("h3", { text: "Explanations (each row scaled to its own largest |score|; underlined: rationale)" }), main.chips, main.heat,
      el("h3", { text: "Attention" }), el("div", { cls: "xp-controls" }, [main.layer, main.head, main.viewHead, main.viewModel]), main.att,
      el("h3", { text: "What the tests did to this instance" }), main.tests]);
  }

  state.methods = DATA.methods.slice(0, 3).map(function (m) { return m.name; });
  root.appendChild(buildSide());
  root.appendChild(buildMain());
  var initial = 0;
  DATA.instances.forEach(function (inst, pos) { if (inst.index === DATA.initial) initial = pos; });
  state.pos = initial;
  renderList();
  renderInstance().then(function () { root.setAttribute("data-ready", "1"); });
})();
