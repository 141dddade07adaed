/* firstfault HTML report: swimlanes and memory charts drawn from the embedded report JSON.
   Text from logs only ever reaches the page through textContent (never innerHTML). */
(function () {
  "use strict";
  var NS = "http://www.w3.org/2000/svg";
  var LABEL = 150, AXIS = 40, LANE_H = 22, BUCKET_PX = 3;
  var PRIO = { first: 10, "rank-first": 9, root: 8, kernel: 7, "cgroup-oom": 7, exit: 6, cascade: 4,
    checkpoint: 3, progress: 2, context: 1, line: 0 };
  var COLOR = { first: "#b42318", "rank-first": "#c4320a", root: "#c4320a", kernel: "#6f42c1",
    "cgroup-oom": "#953800", exit: "#24292f", cascade: "#8c959f", checkpoint: "#0a5bb5",
    progress: "#1a7f37", context: "#8c959f", line: "#afb8c1" };
  var NAMES = { first: "first failure", "rank-first": "a rank's first error", root: "other error", kernel: "kernel / Xid",
    "cgroup-oom": "cgroup OOM (agent)", exit: "process exit (agent)", cascade: "cascade", checkpoint: "checkpoint",
    progress: "progress (step)", context: "context", line: "other line" };
  var PHASE_COLOR = { init: "#8250df", forward: "#1a7f37", backward: "#0a5bb5", "optimizer-step": "#bf3989",
    "param-gather": "#9a6700", "checkpoint-save": "#cf222e", train: "#57606a" };
  var state = { view: null, userView: false, filter: "", bound: false, timer: null };

  function svg(tag, attrs, text) {
    var n = document.createElementNS(NS, tag);
    for (var k in attrs) { if (attrs[k] !== null && attrs[k] !== undefined) n.setAttribute(k, attrs[k]); }
    if (text !== undefined) n.textContent = text;
    return n;
  }
  function html(tag, cls, text) {
    var n = document.createElement(tag);
    if (cls) n.className = cls;
    if (text !== undefined) n.textContent = text;
    return n;
  }
  function pad(n, w) { var s = String(n); while (s.length < w) s = "0" + s; return s; }
  function iso(ms) {
    if (ms === null || ms === undefined) return "?";
    var d = new Date(ms);
    return d.getUTCFullYear() + "-" + pad(d.getUTCMonth() + 1, 2) + "-" + pad(d.getUTCDate(), 2) + " " +
      pad(d.getUTCHours(), 2) + ":" + pad(d.getUTCMinutes(), 2) + ":" + pad(d.getUTCSeconds(), 2) + "." +
      pad(d.getUTCMilliseconds(), 3);
  }
  function dur(ms) {
    if (ms < 1) return (ms * 1000).toFixed(0) + " µs";
    if (ms < 1000) return ms.toFixed(ms < 10 ? 1 : 0) + " ms";
    if (ms < 120000) return (ms / 1000).toFixed(ms < 10000 ? 2 : 1) + " s";
    if (ms < 7200000) return (ms / 60000).toFixed(1) + " min";
    return (ms / 3600000).toFixed(1) + " h";
  }
  function size(b) {
    if (b === null || b === undefined) return "?";
    return b >= 1073741824 ? (b / 1073741824).toFixed(2) + " GiB" : (b / 1048576).toFixed(0) + " MiB";
  }
  function firstLine(t) {
    var lines = String(t || "").replace(/\s+$/, "").split("\n");
    return lines[lines.length - 1];
  }
  function lowerBound(arr, times, t) {
    var lo = 0, hi = arr.length;
    while (lo < hi) { var mid = (lo + hi) >> 1; if (times[arr[mid]] < t) lo = mid + 1; else hi = mid; }
    return lo;
  }

  function Timeline(data, tl) {
    var box = document.getElementById("tl-scroll");
    if (!box) return null;
    var E = tl.events, T = E.t_ms, U = E.unc_ms, lanes = tl.lanes, n = E.lane.length;
    var byLane = lanes.map(function () { return []; });
    var maxUnc = lanes.map(function () { return 0; });
    for (var i = 0; i < n; i++) {
      byLane[E.lane[i]].push(i);
      if ((U[i] || 0) > maxUnc[E.lane[i]]) maxUnc[E.lane[i]] = Math.min(U[i] || 0, 3600000);
    }
    byLane.forEach(function (a) { a.sort(function (x, y) { return T[x] - T[y]; }); });
    var rankLane = {};
    lanes.forEach(function (l, li) { if (l.rank !== null) rankLane[l.rank] = li; });
    var t0 = tl.start_ms, t1 = tl.end_ms;
    (tl.spans || []).forEach(function (s) {
      if (s.start_ms !== null) t0 = Math.min(t0, s.start_ms);
      if (s.end_ms !== null) t1 = Math.max(t1, s.end_ms);
    });
    if (!(t1 > t0)) { t0 -= 500; t1 += 500; }
    var margin = Math.max(1, (t1 - t0) * 0.02);
    var full = [t0 - margin, t1 + margin];
    var ff = tl.first_failure;
    function firstView() {
      // from the last checkpoint save before the failure (at most 30 s back) to the ranks' first errors after it
      if (!ff) return full.slice();
      var a = ff.t_ms - 1000, b = ff.t_ms + 500;
      (tl.spans || []).forEach(function (sp) { if (sp.start_ms < ff.t_ms && sp.start_ms > ff.t_ms - 30000) a = Math.min(a, sp.start_ms); });
      for (var i = 0; i < n; i++) {
        if ((E.kind[i] === "rank-first" || E.kind[i] === "exit") && T[i] > ff.t_ms && T[i] < ff.t_ms + 60000) b = Math.max(b, T[i]);
      }
      var w = Math.max(b - a, 2000, 8 * (ff.unc_ms || 0));
      return [a - 0.08 * w, a + 1.1 * w];
    }
    // a live refresh keeps the view the reader chose; one never touched follows the new data
    var view = state.view && state.userView ? state.view : firstView();
    var shown = [], svgEl = null, buckets = {}, selected = null;
    var phases = (data.memory && data.memory.phases) || [];

    function applyFilter() {
      var f = state.filter.trim().toLowerCase();
      shown = [];
      lanes.forEach(function (l, li) {
        if (!f) { shown.push(li); return; }
        var rank = l.rank === null ? "" : String(l.rank);
        if ((/^\d+$/.test(f) && rank === f) || ("rank " + rank) === f || (l.node || "").toLowerCase().indexOf(f) >= 0 ||
            (l.label || "").toLowerCase().indexOf(f) >= 0) shown.push(li);
      });
    }
    function width() { return Math.max(box.clientWidth, 400); }
    function X(t) { return LABEL + (t - view[0]) / (view[1] - view[0]) * (width() - LABEL - 8); }
    function tAt(x) { return view[0] + (x - LABEL) / (width() - LABEL - 8) * (view[1] - view[0]); }

    function niceStep(span, px) {
      var want = span / Math.max(px / 110, 1), p = Math.pow(10, Math.floor(Math.log10(want)));
      var steps = [1, 2, 5, 10];
      for (var k = 0; k < steps.length; k++) { if (steps[k] * p >= want) return steps[k] * p; }
      return 10 * p;
    }
    function drawAxis(g, H) {
      var W = width(), span = view[1] - view[0], step = niceStep(span, W - LABEL);
      var start = Math.ceil(view[0] / step) * step;
      for (var t = start; t <= view[1]; t += step) {
        var x = X(t);
        g.appendChild(svg("line", { x1: x, x2: x, y1: 12, y2: H, "class": "grid-line" }));
        var label = iso(t);
        label = step >= 1000 ? label.slice(11, 19) : label.slice(11);
        g.appendChild(svg("text", { x: x + 2, y: 10 }, label));
      }
      phases.forEach(function (p) {
        var a = Math.max(X(p.start_ms), LABEL), b = Math.min(X(p.end_ms), W);
        if (b < LABEL || a > W) return;
        var r = svg("rect", { x: a, y: 16, width: Math.max(b - a, 1.5), height: 8, fill: PHASE_COLOR[p.phase] || "#57606a" });
        r.appendChild(svg("title", {}, p.phase + ": " + p.label));
        g.appendChild(r);
        if (b - a > 60) g.appendChild(svg("text", { x: a + 2, y: 35 }, p.phase));
      });
      g.appendChild(svg("text", { x: 4, y: 23, "class": "lane-label" }, "phases"));
    }
    function mark(g, kind, x, y, key, isSel) {
      var c = COLOR[kind] || "#8c959f", m;
      if (kind === "first") {
        g.appendChild(svg("circle", { cx: x, cy: y, r: 8, fill: "none", stroke: c, "stroke-width": 2, "class": "ring" }));
        m = svg("circle", { cx: x, cy: y, r: 5, fill: c });
      } else if (kind === "rank-first") {
        m = svg("path", { d: "M" + x + " " + (y - 6) + "l6 6l-6 6l-6-6z", fill: c });
      } else if (kind === "root") {
        m = svg("path", { d: "M" + x + " " + (y - 5) + "l5 5l-5 5l-5-5z", fill: "#ffffff", stroke: c, "stroke-width": 2 });
      } else if (kind === "kernel" || kind === "cgroup-oom") {
        m = svg("rect", { x: x - 5, y: y - 5, width: 10, height: 10, fill: c });
      } else if (kind === "exit") {
        m = svg("path", { d: "M" + (x - 5) + " " + (y - 5) + "l10 0l-5 10z", fill: c });
      } else if (kind === "checkpoint" || kind === "progress") {
        m = svg("rect", { x: x - 1.5, y: y - 7, width: 3, height: 14, fill: c });
      } else if (kind === "cascade") {
        m = svg("circle", { cx: x, cy: y, r: 4, fill: c });
      } else {
        m = svg("circle", { cx: x, cy: y, r: 2.5, fill: c });
      }
      m.setAttribute("data-k", key);
      m.setAttribute("data-kind", kind);
      m.setAttribute("class", "mk");
      g.appendChild(m);
      if (isSel) g.appendChild(svg("circle", { cx: x, cy: y, r: 10, "class": "sel" }));
    }

    function render() {
      var started = performance.now();
      var W = width(), H = AXIS + shown.length * LANE_H + 4;
      var s = svg("svg", { width: W, height: H, role: "img", "aria-labelledby": "tl-h" });
      var bg = svg("g", {}), fg = svg("g", {}), ax = svg("g", { "class": "axis" });
      s.appendChild(bg); s.appendChild(ax); s.appendChild(fg);
      drawAxis(ax, H);
      (tl.spans || []).forEach(function (sp) {
        var a = Math.max(X(sp.start_ms), LABEL), b = Math.min(X(sp.end_ms === null ? view[1] : sp.end_ms), W);
        if (b < LABEL || a > W) return;
        var fill = sp.verdict === "safe" ? "#1a7f37" : sp.verdict === "unsafe" ? "#cf222e" : "#57606a";
        var r = svg("rect", { x: a, y: AXIS, width: Math.max(b - a, 2), height: H - AXIS, fill: fill, "fill-opacity": 0.1 });
        r.appendChild(svg("title", {}, "checkpoint " + sp.tag + " save: " + sp.verdict));
        bg.appendChild(r);
        bg.appendChild(svg("rect", { x: a, y: AXIS - 4, width: Math.max(b - a, 2), height: 4, fill: fill }));
      });
      if (ff) {
        var fx = X(ff.t_ms), fu = Math.max(X(ff.t_ms + (ff.unc_ms || 0)) - fx, 0);
        if (fu > 1) bg.appendChild(svg("rect", { x: fx - fu, y: AXIS, width: 2 * fu, height: H - AXIS, "class": "ff-band" }));
        bg.appendChild(svg("line", { x1: fx, x2: fx, y1: 12, y2: H, "class": "ff-line" }));
      }
      var top = box.scrollTop, bottom = top + Math.max(box.clientHeight, Math.min(H, 0.62 * window.innerHeight));
      var r0 = Math.max(0, Math.floor((top - AXIS) / LANE_H) - 2), r1 = Math.min(shown.length, Math.ceil((bottom - AXIS) / LANE_H) + 2);
      var rowOf = {};
      buckets = {};
      var links = [];
      for (var r = r0; r < r1; r++) {
        var li = shown[r], lane = lanes[li], y = AXIS + r * LANE_H + LANE_H / 2;
        rowOf[li] = r;
        if (lane.rank === null) bg.appendChild(svg("rect", { x: 0, y: y - LANE_H / 2, width: W, height: LANE_H, "class": "node-lane" }));
        bg.appendChild(svg("line", { x1: 0, x2: W, y1: y + LANE_H / 2, y2: y + LANE_H / 2, "class": "lane-sep" }));
        var lbl = svg("text", { x: 4, y: y + 4, "class": "lane-label" }, lane.label);
        if (lane.rank !== null && lane.node) lbl.appendChild(svg("title", {}, "rank " + lane.rank + " on " + lane.node));
        fg.appendChild(lbl);
        var idx = byLane[li], from = lowerBound(idx, T, view[0] - maxUnc[li]), best = {};
        for (var k = from; k < idx.length; k++) {
          var i = idx[k];
          if (T[i] - (U[i] || 0) > view[1]) break;
          var x = X(T[i]);
          if (x < LABEL - 8) continue;
          var b = Math.floor(x / BUCKET_PX), key = li + ":" + b;
          (buckets[key] = buckets[key] || []).push(i);
          if (best[b] === undefined || PRIO[E.kind[i]] > PRIO[E.kind[best[b]]]) best[b] = i;
        }
        for (var bb in best) {
          var j = best[bb], xx = X(T[j]), u = Math.max(X(T[j] + (U[j] || 0)) - xx, 0);
          if (u > 2 && PRIO[E.kind[j]] >= 2) bg.appendChild(svg("rect", { x: Math.max(xx - u, LABEL), y: y - 3, width: Math.min(2 * u, W), height: 6, "class": "unc" }));
          mark(fg, E.kind[j], Math.max(xx, LABEL), y, li + ":" + bb, selected !== null && buckets[li + ":" + bb].indexOf(selected) >= 0);
          if (E.link[j] !== null && E.link[j] !== undefined) links.push(j);
        }
      }
      links.forEach(function (j) {
        var target = rankLane[E.link[j]], from = rowOf[E.lane[j]];
        if (target === undefined) return;
        var tr = shown.indexOf(target);
        if (tr < 0) return;
        var x = X(T[j]), y0 = AXIS + from * LANE_H + LANE_H / 2, y1 = AXIS + tr * LANE_H + LANE_H / 2;
        var line = svg("line", { x1: x, x2: x, y1: y0, y2: y1, "class": "link" });
        line.setAttribute("data-link", String(E.link[j]));
        fg.appendChild(line);
        fg.appendChild(svg("circle", { cx: x, cy: y1, r: 4, fill: "#ffffff", stroke: COLOR.kernel, "stroke-width": 2,
          "data-link-rank": String(E.link[j]), "class": "ring" }));
      });
      if (svgEl) box.replaceChild(s, svgEl); else box.appendChild(s);
      svgEl = s;
      var rng = document.getElementById("tl-range");
      if (rng) rng.textContent = iso(view[0]) + " – " + iso(view[1]) + " UTC (" + dur(view[1] - view[0]) + ")";
      state.view = view;
      box.setAttribute("data-render-ms", (performance.now() - started).toFixed(1));
      box.setAttribute("data-renders", String(Number(box.getAttribute("data-renders") || 0) + 1));
    }
    var pending = false;
    function schedule() {
      if (pending) return;
      pending = true;
      requestAnimationFrame(function () { pending = false; render(); });
    }
    function zoom(f, at) {
      state.userView = true;
      var c = at === undefined ? (view[0] + view[1]) / 2 : at, w = (view[1] - view[0]) * f;
      w = Math.max(w, 0.01);
      view = [c - (c - view[0]) * f, c - (c - view[0]) * f + w];
      schedule();
    }
    function pan(frac) { state.userView = true; var w = view[1] - view[0]; view = [view[0] + w * frac, view[1] + w * frac]; schedule(); }

    function details(list) {
      var panel = document.getElementById("tl-details");
      if (!panel) return;
      while (panel.childNodes.length > 1) panel.removeChild(panel.lastChild);
      var lines = list.filter(function (i) { return E.kind[i] === "line"; });
      var shownList = list.filter(function (i) { return E.kind[i] !== "line"; }).slice(0, 30).concat(lines.slice(0, 3));
      shownList.forEach(function (i) {
        var d = html("div", "ev");
        var lane = lanes[E.lane[i]];
        var meta = html("p", "meta");
        var bits = [iso(T[i]) + " UTC" + (U[i] ? " ±" + dur(U[i]) : "") + (E.clock[i] ? " (clock: " + E.clock[i] + ")" : ""),
          lane.label + (lane.rank !== null && lane.node ? " on " + lane.node : ""), NAMES[E.kind[i]] || E.kind[i]];
        if (E.sig[i]) bits.push(E.sig[i]);
        if (E.link[i] !== null && E.link[i] !== undefined) bits.push("hit rank " + E.link[i]);
        meta.textContent = bits.join(" · ");
        d.appendChild(meta);
        var origin = html("p", "meta muted", "origin: " + (E.origin[i] || "?"));
        d.appendChild(origin);
        d.appendChild(html("pre", "raw", E.text[i] || ""));
        panel.appendChild(d);
      });
      if (list.length > shownList.length) {
        panel.appendChild(html("p", "muted", (list.length - shownList.length) + " more at this spot: zoom in to tell them apart."));
      }
    }
    function select(i, recentre) {
      selected = i;
      if (recentre) {
        state.userView = true;
        var w = Math.min(view[1] - view[0], Math.max(8 * (U[i] || 0), 4000));
        view = [T[i] - w / 2, T[i] + w / 2];
        var r = shown.indexOf(E.lane[i]);
        if (r < 0) { state.filter = ""; var inp = document.getElementById("tl-filter"); if (inp) inp.value = ""; applyFilter(); r = shown.indexOf(E.lane[i]); }
        box.scrollTop = Math.max(0, AXIS + r * LANE_H - box.clientHeight / 2);
      }
      details([i]);
      render();
    }

    var tip = document.getElementById("tl-tip"), drag = null;
    box.addEventListener("mousemove", function (ev) {
      if (drag) return;
      var k = ev.target.getAttribute && ev.target.getAttribute("data-k");
      if (!k || !buckets[k] || !tip) { if (tip) tip.hidden = true; return; }
      var list = buckets[k], i = list[0];
      list.forEach(function (j) { if (PRIO[E.kind[j]] > PRIO[E.kind[i]]) i = j; });
      tip.textContent = iso(T[i]) + (U[i] ? " ±" + dur(U[i]) : "") + " · " + lanes[E.lane[i]].label + " · " +
        (NAMES[E.kind[i]] || E.kind[i]) + (E.sig[i] ? " · " + E.sig[i] : "") + "\n" + firstLine(E.text[i]).slice(0, 300) +
        (list.length > 1 ? "\n(+" + (list.length - 1) + " more here; click for all)" : "");
      tip.hidden = false;
      tip.style.left = Math.min(ev.clientX + 14, window.innerWidth - 580) + "px";
      tip.style.top = (ev.clientY + 14) + "px";
    });
    box.addEventListener("mouseleave", function () { if (tip) tip.hidden = true; });
    box.addEventListener("pointerdown", function (ev) {
      if (ev.button !== 0) return;
      drag = { x: ev.clientX, view: view.slice(), moved: false };
    });
    state.move = function (ev) {
      if (!drag) return;
      var dx = ev.clientX - drag.x;
      if (Math.abs(dx) > 3) { drag.moved = true; box.classList.add("dragging"); }
      if (!drag.moved) return;
      state.userView = true;
      var per = (drag.view[1] - drag.view[0]) / (width() - LABEL - 8);
      view = [drag.view[0] - dx * per, drag.view[1] - dx * per];
      schedule();
    };
    state.up = function (ev) {
      if (!drag) return;
      var moved = drag.moved;
      drag = null;
      box.classList.remove("dragging");
      if (moved) return;
      var k = ev.target.getAttribute && ev.target.getAttribute("data-k");
      if (k && buckets[k]) {
        var list = buckets[k].slice().sort(function (a, b) { return PRIO[E.kind[b]] - PRIO[E.kind[a]] || T[a] - T[b]; });
        selected = list[0];
        details(list);
        render();
      }
    };
    box.addEventListener("wheel", function (ev) {
      if (!ev.ctrlKey && !ev.altKey) return;
      ev.preventDefault();
      var rect = box.getBoundingClientRect();
      zoom(Math.pow(1.2, ev.deltaY / 100), tAt(ev.clientX - rect.left));
    }, { passive: false });
    box.addEventListener("scroll", schedule);
    box.addEventListener("keydown", function (ev) {
      var k = ev.key;
      if (k === "ArrowLeft") pan(-0.2); else if (k === "ArrowRight") pan(0.2);
      else if (k === "+" || k === "=") zoom(0.5); else if (k === "-" || k === "_") zoom(2);
      else if (k === "0") { state.userView = true; view = full.slice(); schedule(); }
      else if (k === "f") { state.userView = false; view = firstView(); schedule(); }
      else return;
      ev.preventDefault();
    });
    function on(id, f) { var b = document.getElementById(id); if (b) b.addEventListener("click", f); }
    on("tl-first", function () { state.userView = false; view = firstView(); schedule(); });
    on("tl-fit", function () { state.userView = true; view = full.slice(); schedule(); });
    on("tl-in", function () { zoom(0.5); });
    on("tl-out", function () { zoom(2); });
    on("tl-left", function () { pan(-0.25); });
    on("tl-right", function () { pan(0.25); });
    var input = document.getElementById("tl-filter");
    if (input) {
      input.value = state.filter;
      input.addEventListener("input", function () { state.filter = input.value; applyFilter(); schedule(); });
    }
    document.querySelectorAll("button.show[data-i]").forEach(function (b) {
      b.addEventListener("click", function () {
        select(Number(b.getAttribute("data-i")), true);
        box.scrollIntoView({ block: "nearest" });
      });
    });
    var legend = document.getElementById("tl-legend");
    if (legend && !legend.childNodes.length) {
      ["first", "rank-first", "root", "cascade", "kernel", "cgroup-oom", "exit", "checkpoint", "progress", "line"].forEach(function (k) {
        var item = html("span", "item"), s = svg("svg", { width: 22, height: 18, "aria-hidden": "true" });
        mark(s, k, 11, 9, "", false);
        item.appendChild(s);
        item.appendChild(document.createTextNode(NAMES[k]));
        legend.appendChild(item);
      });
    }
    applyFilter();
    render();
    if (!state.bound) {  // once per page; a live refresh hands them the new timeline through state
      state.bound = true;
      window.addEventListener("resize", function () { if (state.redraw) state.redraw(); });
      window.addEventListener("pointermove", function (ev) { if (state.move) state.move(ev); });
      window.addEventListener("pointerup", function (ev) { if (state.up) state.up(ev); });
    }
    state.redraw = schedule;
    return { render: render };
  }

  function Memory(data) {
    var mem = data.memory, sel = document.getElementById("mem-rank"), box = document.getElementById("mem-chart");
    if (!mem || !sel || !box) return;
    var ranks = Object.keys(mem.ranks || {}).filter(function (r) { return Object.keys(mem.ranks[r].series || {}).length; });
    if (!ranks.length) return;
    var failed = data.first_failure && data.first_failure.rank !== null ? String(data.first_failure.rank) : null;
    ranks.forEach(function (r) {
      var o = html("option", null, "rank " + r + (mem.ranks[r].node ? " (" + mem.ranks[r].node + ")" : "") + (r === failed ? " — failed" : ""));
      o.value = r;
      sel.appendChild(o);
    });
    sel.value = ranks.indexOf(failed) >= 0 ? failed : ranks[0];
    var colors = { rss: "#cf222e", cgroup: "#9a6700", gpu: "#6f42c1", allocated: "#0a5bb5", reserved: "#1a7f37", host_used: "#57606a" };
    var ffT = data.timeline && data.timeline.first_failure ? data.timeline.first_failure.t_ms :
      data.first_failure && data.first_failure.occurred_at ? Date.parse(data.first_failure.occurred_at) : null;
    function draw() {
      var series = mem.ranks[sel.value].series, names = Object.keys(series);
      var W = Math.max(box.clientWidth, 400), H = 240, L = 70, R = 10, Tp = 22, B = 30;
      var lo = Infinity, hi = -Infinity, vmax = 0;
      names.forEach(function (n) {
        series[n].samples.forEach(function (p) { lo = Math.min(lo, p[0]); hi = Math.max(hi, p[0]); vmax = Math.max(vmax, p[1]); });
        if (series[n].peak) vmax = Math.max(vmax, series[n].peak);
      });
      // a limit far above every value (a node's whole memory) would flatten the lines: it goes to the legend
      function onChart(sr) { return sr.limit && sr.limit <= 2 * vmax; }
      names.forEach(function (n) { if (onChart(series[n])) vmax = Math.max(vmax, series[n].limit); });
      (mem.phases || []).forEach(function (p) { lo = Math.min(lo, p.start_ms); hi = Math.max(hi, p.end_ms); });
      if (ffT !== null) { lo = Math.min(lo, ffT); hi = Math.max(hi, ffT); }
      if (!(hi > lo)) { lo -= 500; hi += 500; }
      var span = hi - lo; lo -= span * 0.02; hi += span * 0.02;
      vmax = vmax * 1.1 || 1;
      function x(t) { return L + (t - lo) / (hi - lo) * (W - L - R); }
      function y(v) { return Tp + (1 - v / vmax) * (H - Tp - B); }
      var s = svg("svg", { width: W, height: H, role: "img", "aria-label": "Memory of rank " + sel.value + " over time, with phase bands" });
      (mem.phases || []).forEach(function (p) {
        var a = x(p.start_ms), b = x(p.end_ms);
        var r = svg("rect", { x: a, y: Tp, width: Math.max(b - a, 1), height: H - Tp - B, fill: PHASE_COLOR[p.phase] || "#57606a", "fill-opacity": 0.12 });
        r.appendChild(svg("title", {}, p.phase + ": " + p.label));
        s.appendChild(r);
        if (b - a > 50) s.appendChild(svg("text", { x: a + 2, y: Tp + 11 }, p.phase));
      });
      for (var k = 0; k <= 4; k++) {
        var v = vmax * k / 4;
        s.appendChild(svg("line", { x1: L, x2: W - R, y1: y(v), y2: y(v), "class": "grid-line" }));
        s.appendChild(svg("text", { x: 4, y: y(v) + 4 }, size(v)));
      }
      s.appendChild(svg("text", { x: L, y: H - 8 }, iso(lo)));
      s.appendChild(svg("text", { x: W - R - 150, y: H - 8 }, iso(hi)));
      if (ffT !== null) {
        s.appendChild(svg("line", { x1: x(ffT), x2: x(ffT), y1: Tp, y2: H - B, "class": "ff-line" }));
        var nearRight = x(ffT) > W - R - 90;  // the label would run off the chart: it goes left of the line
        s.appendChild(svg("text", { x: nearRight ? x(ffT) - 3 : x(ffT) + 3, y: Tp - 6,
                                    "text-anchor": nearRight ? "end" : null }, "first failure"));
      }
      names.forEach(function (n) {
        var sr = series[n], c = colors[n] || "#24292f";
        var pts = sr.samples.map(function (p) { return x(p[0]).toFixed(1) + "," + y(p[1]).toFixed(1); }).join(" ");
        if (sr.samples.length > 1) s.appendChild(svg("polyline", { points: pts, fill: "none", stroke: c, "stroke-width": 2 }));
        sr.samples.forEach(function (p) {
          var d = svg("circle", { cx: x(p[0]), cy: y(p[1]), r: sr.samples.length > 60 ? 1.5 : 3, fill: c });
          d.appendChild(svg("title", {}, sr.label + ": " + size(p[1]) + " at " + iso(p[0])));
          s.appendChild(d);
        });
        if (onChart(sr)) {
          s.appendChild(svg("line", { x1: L, x2: W - R, y1: y(sr.limit), y2: y(sr.limit), stroke: c, "stroke-dasharray": "6 4" }));
          s.appendChild(svg("text", { x: L + 4, y: y(sr.limit) - 3 }, sr.label + " limit " + size(sr.limit)));
        }
      });
      while (box.firstChild) box.removeChild(box.firstChild);
      box.appendChild(s);
      var legend = html("div", "legend");
      names.forEach(function (n) {
        var sr = series[n], item = html("span", "item"), sw = svg("svg", { width: 18, height: 10, "aria-hidden": "true" });
        sw.appendChild(svg("rect", { x: 0, y: 2, width: 18, height: 6, fill: colors[n] || "#24292f" }));
        item.appendChild(sw);
        item.appendChild(document.createTextNode(sr.label + " (peak " + size(sr.peak) +
          (sr.limit ? ", limit " + size(sr.limit) + (onChart(sr) ? "" : ", off the chart") : "") + ", " + sr.sources.join(", ") + ")"));
        legend.appendChild(item);
      });
      box.appendChild(legend);
    }
    sel.addEventListener("change", draw);
    draw();
  }

  function live() {
    var b = document.body;
    if (b.getAttribute("data-live") !== "1" || b.getAttribute("data-status") !== "running") return;
    clearTimeout(state.timer);
    state.timer = setTimeout(function () {
      fetch(location.pathname + location.search, { credentials: "same-origin", headers: { Accept: "text/html" } })
        .then(function (r) { return r.ok ? r.text() : null; })
        .then(function (text) {
          if (text === null) { live(); return; }
          var doc = new DOMParser().parseFromString(text, "text/html");
          var fresh = doc.getElementById("ff-main"), old = document.getElementById("ff-main");
          if (!fresh || !old) return;
          old.replaceWith(document.importNode(fresh, true));
          b.setAttribute("data-status", doc.body.getAttribute("data-status") || "");
          init();
        })
        .catch(function () { live(); });
    }, 5000);
  }

  function init() {
    var node = document.getElementById("ff-data");
    if (!node) return;
    var data = JSON.parse(node.textContent);
    if (data.timeline && data.timeline.lanes && data.timeline.lanes.length) Timeline(data, data.timeline);
    Memory(data);
    live();
    document.body.setAttribute("data-ready", "1");
  }
  init();
})();
