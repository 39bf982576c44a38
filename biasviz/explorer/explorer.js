// biasviz explorer: draws the heads embedded in this page (see biasviz/explore/encode.py for the packing).
"use strict";
(() => {
  window.biasvizStartMs = performance.now();
  const DATA = JSON.parse(document.getElementById("biasviz-data").textContent);
  window.biasvizParsedMs = performance.now();
  const T = DATA.seq_len;
  const H = DATA.n_heads;
  const SUMMARY = DATA.summary; // a summary file: block means over samples ({block, samples}), or null
  const B = SUMMARY ? SUMMARY.block : 1;
  const NAN_CODE = 0xffff;
  const CACHE_LIMIT = 512 * 1024 * 1024; // bytes of decoded detail kept; the oldest go first
  const $ = (id) => document.getElementById(id);

  const state = {
    source: "A",
    layer: DATA.layers[DATA.layers.length - 1],
    kind: DATA.kinds[0],
    sample: DATA.sources[0].samples[0],
    shared: false,
    log: false, // logarithmic colour scale for attention weights, as 'biasviz plot --log'
    focus: null, // head shown enlarged (1-based), or null for the grid
    region: null, // [i0, i1, j0, j1] zoomed region of the enlarged head
  };
  let drawn = 0;

  // -- decoding ------------------------------------------------------------------------------------
  function base64Bytes(text) {
    const bin = atob(text);
    const out = new Uint8Array(bin.length);
    for (let k = 0; k < bin.length; k++) out[k] = bin.charCodeAt(k);
    return out;
  }

  async function inflate(bytes) {
    const stream = new Blob([bytes]).stream().pipeThrough(new DecompressionStream("deflate"));
    return new Uint8Array(await new Response(stream).arrayBuffer());
  }

  function unshuffle(bytes, width) {
    const n = bytes.length / width;
    const out = new Uint8Array(bytes.length);
    for (let b = 0; b < width; b++) {
      const off = b * n;
      for (let k = 0; k < n; k++) out[k * width + b] = bytes[off + k];
    }
    return out;
  }

  function undoDiagonal(ints, n) {
    // each cell was stored minus the cell at (i - 1, j - 1); typed arrays wrap exactly as numpy did
    for (let i = 1; i < n; i++) {
      const row = i * n;
      const prev = row - n - 1;
      for (let j = 1; j < n; j++) ints[row + j] = ints[row + j] + ints[prev + j];
    }
  }

  async function decodeLevel(spec) {
    const width = spec.enc === "f32" ? 4 : 2;
    const bytes = unshuffle(await inflate(base64Bytes(spec.data)), width);
    const n = spec.n;
    const ints = width === 4 ? new Uint32Array(bytes.buffer) : new Uint16Array(bytes.buffer);
    let index = (k) => k;
    if (spec.toeplitz) {
      // the first column (n cells) then the first row from its second cell: cell (i, j) is one of them
      index = (k) => { const d = Math.floor(k / n) - (k % n); return d >= 0 ? d : n - 1 - d; };
    } else {
      undoDiagonal(ints, n);
    }
    if (spec.enc === "f32") {
      const values = new Float32Array(ints.buffer);
      return { n, f: spec.f, exact: true, bytes: bytes.length, at: (k) => values[index(k)] };
    }
    const lo = spec.lo;
    const step = spec.step;
    const at = (k) => { const c = ints[index(k)]; return c === NAN_CODE ? NaN : lo + c * step; };
    return { n, f: spec.f, exact: false, step, bytes: bytes.length, at };
  }

  const cache = new Map();
  let cached = 0;
  function level(setKey, head, index) {
    const key = `${setKey}#${head}#${index}`;
    let entry = cache.get(key);
    if (!entry) {
      const spec = DATA.sets[setKey].heads[head - 1].levels[index];
      entry = decodeLevel(spec).then((lv) => {
        cached += lv.bytes;
        for (const [k, v] of cache) {
          if (cached <= CACHE_LIMIT || k === key) break;
          cache.delete(k);
          v.then((old) => { cached -= old.bytes; });
        }
        return lv;
      });
    } else {
      cache.delete(key); // most recently used last
    }
    cache.set(key, entry);
    return entry;
  }

  function tableBytes(name) {
    return base64Bytes(DATA.cmaps[name]);
  }
  const LUTS = Object.fromEntries(Object.keys(DATA.cmaps).map((name) => [name, tableBytes(name)]));

  // -- numbers -------------------------------------------------------------------------------------
  // Python's format(v, ".4g"), ties to even included, so the page shows what numpy/h5py users print.
  function fmt4(v) {
    if (Number.isNaN(v)) return "nan";
    if (!Number.isFinite(v)) return v > 0 ? "inf" : "-inf";
    if (v === 0) return Object.is(v, -0) ? "-0" : "0";
    const full = Math.abs(v).toExponential(19);
    let exp = parseInt(full.slice(full.indexOf("e") + 1), 10);
    const digits = full[0] + full.slice(2, full.indexOf("e"));
    let head = parseInt(digits.slice(0, 4), 10);
    const rest = digits.slice(4);
    const half = "5".padEnd(rest.length, "0");
    if (rest > half || (rest === half && head % 2 === 1)) head += 1;
    if (head === 10000) { head = 1000; exp += 1; }
    const sign = v < 0 ? "-" : "";
    const trim = (s) => (s.includes(".") ? s.replace(/0+$/, "").replace(/\.$/, "") : s);
    if (exp >= -4 && exp < 4) {
      const decimals = 3 - exp;
      if (decimals === 0) return sign + String(head);
      const s = String(head).padStart(decimals + 1, "0");
      return sign + trim(`${s.slice(0, s.length - decimals)}.${s.slice(s.length - decimals)}`);
    }
    const m = String(head);
    const e = `${exp < 0 ? "-" : "+"}${String(Math.abs(exp)).padStart(2, "0")}`;
    return `${sign}${trim(`${m[0]}.${m.slice(1)}`)}e${e}`;
  }

  // -- what is selected ----------------------------------------------------------------------------
  function sourcesShown() {
    return state.source === "AB" ? ["A", "B"] : [state.source];
  }
  function setKey(source) {
    return `${source}|${state.layer}|${state.kind}|${state.sample}`;
  }
  function ownScale(source, head) {
    const sc = DATA.sets[setKey(source)].scale;
    const log = state.log && sc.log_head;
    if (state.shared) return log ? sc.log_shared : sc.shared;
    return (log ? sc.log_head : sc.head)[head - 1];
  }
  // Side by side, A and B share each head's scale, so that equal colours mean equal values.
  function scaleOf(source, head) {
    if (state.source !== "AB") return ownScale(source, head);
    const [a, b] = [ownScale("A", head), ownScale("B", head)];
    const diverging = [a, b].find((s) => s[2] === DATA.diverging);
    if (diverging) {
      const bound = Math.max(Math.abs(a[0]), Math.abs(a[1]), Math.abs(b[0]), Math.abs(b[1]));
      return [-bound, bound, diverging[2]];
    }
    return [Math.min(a[0], b[0]), Math.max(a[1], b[1]), ...a.slice(2)];
  }
  function levelsOf(source, head) {
    return DATA.sets[setKey(source)].heads[head - 1].levels;
  }

  // The level to draw a region with: the coarsest whose blocks are no larger than a pixel, else the finest.
  function levelFor(levels, positionsPerPixel) {
    let pick = 0;
    levels.forEach((lv, k) => { if (lv.f <= Math.max(1, positionsPerPixel)) pick = k; });
    return pick;
  }

  // -- drawing -------------------------------------------------------------------------------------
  // value -> [0, 1] as matplotlib's Normalize (or LogNorm, clipped) does; the colour table does the rest
  function normaliser(scale) {
    const [lo, hi] = scale;
    if (scale[3] === "log") {
      const a = Math.log(lo);
      const span = Math.log(hi) - a || 1;
      return (v) => (Math.log(Math.min(Math.max(v, lo), hi)) - a) / span;
    }
    const span = hi - lo || 1;
    return (v) => (v - lo) / span;
  }

  function paint(canvas, lv, scale, region) {
    const [i0, i1, j0, j1] = region;
    const w = canvas.width;
    const h = canvas.height;
    const ctx = canvas.getContext("2d");
    const img = ctx.createImageData(w, h);
    const px = img.data;
    const lut = LUTS[scale[2]];
    const norm = normaliser(scale);
    const cols = new Int32Array(w);
    for (let x = 0; x < w; x++) cols[x] = Math.floor((j0 + Math.floor(((x + 0.5) * (j1 - j0)) / w)) / lv.f);
    for (let y = 0; y < h; y++) {
      const row = Math.floor((i0 + Math.floor(((y + 0.5) * (i1 - i0)) / h)) / lv.f) * lv.n;
      for (let x = 0; x < w; x++) {
        const v = lv.at(row + cols[x]);
        const o = (y * w + x) * 4;
        if (Number.isNaN(v)) continue; // masked: transparent, as in the figures
        const c = Math.min(255, Math.max(0, Math.floor(norm(v) * 256))) * 3;
        px[o] = lut[c];
        px[o + 1] = lut[c + 1];
        px[o + 2] = lut[c + 2];
        px[o + 3] = 255;
      }
    }
    ctx.putImageData(img, 0, 0);
  }

  function colourBar(bar, scale) {
    const ramp = bar.querySelector("canvas");
    const ctx = ramp.getContext("2d");
    const img = ctx.createImageData(256, 1);
    const lut = LUTS[scale[2]];
    for (let k = 0; k < 256; k++) {
      img.data.set([lut[3 * k], lut[3 * k + 1], lut[3 * k + 2], 255], 4 * k);
    }
    ctx.putImageData(img, 0, 0);
    bar.querySelector(".lo").textContent = fmt4(scale[0]);
    bar.querySelector(".hi").textContent = fmt4(scale[1]);
  }

  function gridCanvases(head) {
    return Array.from(document.querySelectorAll(`#grid canvas[data-head="${head}"]`));
  }

  async function drawGrid() {
    const shown = sourcesShown();
    const jobs = [];
    for (let head = 1; head <= H; head++) {
      const panel = document.querySelector(`#grid .panel[data-panel="${head}"]`);
      let canvases = gridCanvases(head);
      while (canvases.length < shown.length) {
        const extra = canvases[0].cloneNode(false);
        panel.querySelector(".canvases").appendChild(extra);
        canvases = gridCanvases(head);
      }
      canvases.forEach((cv, k) => {
        cv.hidden = k >= shown.length;
        if (k >= shown.length) return;
        const source = shown[k];
        cv.dataset.source = source;
        const levels = levelsOf(source, head);
        const last = levels.length - 1;
        jobs.push(level(setKey(source), head, last).then((lv) => paint(cv, lv, scaleOf(source, head), [0, T, 0, T])));
      });
      const names = shown.map((s) => DATA.sources.find((x) => x.label === s).name);
      panel.querySelector("figcaption").textContent = `Head ${head}${shown.length > 1 ? ` (${names.join(" | ")})` : ""}`;
      colourBar(panel.querySelector(".cbar"), scaleOf(shown[0], head));
    }
    await Promise.all(jobs);
  }

  async function drawFocus() {
    const head = state.focus;
    const region = state.region || [0, T, 0, T];
    const box = $("focus-canvases");
    const shown = sourcesShown();
    while (box.children.length < shown.length) box.appendChild(box.children[0].cloneNode(false));
    const jobs = [];
    Array.from(box.children).forEach((cv, k) => {
      cv.hidden = k >= shown.length;
      if (k >= shown.length) return;
      const source = shown[k];
      cv.dataset.source = source;
      cv.dataset.head = String(head);
      const levels = levelsOf(source, head);
      const pick = levelFor(levels, (region[1] - region[0]) / cv.width);
      jobs.push(level(setKey(source), head, pick).then((lv) => paint(cv, lv, scaleOf(source, head), region)));
    });
    drawProfile(head, shown);
    const [i0, i1, j0, j1] = region;
    $("focus-title").textContent = `Head ${head}: queries ${i0}-${i1 - 1}, keys ${j0}-${j1 - 1}`;
    await Promise.all(jobs);
  }

  function profileOf(source, head) {
    const p = DATA.sets[setKey(source)].heads[head - 1].profile;
    return { d0: p.d0, mean: new Float32Array(base64Bytes(p.mean).buffer), std: new Float32Array(base64Bytes(p.std).buffer) };
  }

  function drawProfile(head, shown) {
    const cv = $("profile");
    const ctx = cv.getContext("2d");
    const w = cv.width;
    const h = cv.height;
    const pad = 34;
    ctx.clearRect(0, 0, w, h);
    const profiles = shown.map((s) => profileOf(s, head));
    let lo = Infinity;
    let hi = -Infinity;
    for (const p of profiles) {
      p.mean.forEach((m, k) => {
        if (Number.isNaN(m)) return;
        lo = Math.min(lo, m - p.std[k]);
        hi = Math.max(hi, m + p.std[k]);
      });
    }
    if (!(hi > lo)) { lo -= 0.5; hi += 0.5; }
    const n = profiles[0].mean.length;
    const X = (k) => pad + ((w - pad - 8) * k) / Math.max(n - 1, 1);
    const Y = (v) => h - pad + ((h - 2 * pad + 20) * (lo - v)) / (hi - lo);
    const colours = ["31,119,180", "255,127,14"];
    profiles.forEach((p, s) => {
      ctx.fillStyle = `rgba(${colours[s]},0.25)`;
      ctx.beginPath();
      for (let k = 0; k < n; k++) ctx.lineTo(X(k), Y(p.mean[k] + p.std[k]));
      for (let k = n - 1; k >= 0; k--) ctx.lineTo(X(k), Y(p.mean[k] - p.std[k]));
      ctx.fill();
      ctx.strokeStyle = `rgb(${colours[s]})`;
      ctx.beginPath();
      for (let k = 0; k < n; k++) ctx.lineTo(X(k), Y(p.mean[k]));
      ctx.stroke();
    });
    ctx.fillStyle = "#222";
    ctx.font = "11px sans-serif";
    const d0 = profiles[0].d0;
    ctx.fillText(fmt4(hi), 2, 20);
    ctx.fillText(fmt4(lo), 2, h - pad);
    ctx.fillText(`d = ${d0}`, pad, h - 8);
    ctx.fillText(`d = ${d0 + n - 1}`, w - 60, h - 8);
    const over = SUMMARY && !SUMMARY.bias_only ? "samples and cells" : "cells";
    ctx.fillText(`distance profile of head ${head}: mean ± std over ${over} with i - j = d`, pad + 40, 12);
  }

  async function draw() {
    $("log").closest("label").hidden = !DATA.sets[setKey(sourcesShown()[0])].scale.log_head;
    $("grid").hidden = state.focus !== null;
    $("focus").hidden = state.focus === null;
    if (state.focus === null) await drawGrid();
    else await drawFocus();
    drawn += 1;
    if (drawn === 1) window.biasvizReadyMs = performance.now(); // time to open, from navigation start
    document.body.dataset.drawn = String(drawn);
    document.body.dataset.ready = "1";
  }

  // -- read-out ------------------------------------------------------------------------------------
  // Where the drawn matrix is on screen: the canvas's content box (inside its border).
  function drawnBox(canvas) {
    const r = canvas.getBoundingClientRect();
    return { left: r.left + canvas.clientLeft, top: r.top + canvas.clientTop,
      width: canvas.clientWidth, height: canvas.clientHeight };
  }

  function regionOf(canvas) {
    return canvas.closest("#focus") ? state.region || [0, T, 0, T] : [0, T, 0, T];
  }

  function cellAt(canvas, event) {
    const r = drawnBox(canvas);
    const [i0, i1, j0, j1] = regionOf(canvas);
    const fy = Math.min(Math.max((event.clientY - r.top) / r.height, 0), 0.999999);
    const fx = Math.min(Math.max((event.clientX - r.left) / r.width, 0), 0.999999);
    return [i0 + Math.floor(fy * (i1 - i0)), j0 + Math.floor(fx * (j1 - j0))];
  }

  function tokenText(source, pos) {
    const tokens = DATA.tokens[source === "D" ? "A" : source];
    if (!tokens || !tokens.ids || state.sample === "mean" || source === "D") return null;
    if (!tokens.array) tokens.array = new Int32Array(base64Bytes(tokens.ids).buffer);
    const id = tokens.array[Number(state.sample) * T + pos];
    const text = tokens.strings[String(id)];
    return text === undefined ? `id ${id}` : `${JSON.stringify(text)} (id ${id})`;
  }

  // A summary's block: its first and last query and key, and the cells j <= i its mean is taken over.
  function blockOf(i, j) {
    const q0 = Math.floor(i / B) * B;
    const k0 = Math.floor(j / B) * B;
    const q1 = Math.min(q0 + B, T) - 1;
    const k1 = Math.min(k0 + B, T) - 1;
    let cells = 0;
    for (let q = q0; q <= q1; q++) cells += DATA.causal ? Math.max(0, Math.min(q, k1) - k0 + 1) : k1 - k0 + 1;
    return { q0, q1, k0, k1, cells };
  }

  // Outline the hovered cell, or a summary's block (at least a few pixels, so that it shows in the grid too).
  function mark(canvas, i, j) {
    const r = drawnBox(canvas);
    const [i0, i1, j0, j1] = regionOf(canvas);
    const size = B > 1 ? B : 1;
    const [ci, cj] = B > 1 ? [Math.floor(i / B) * B + (B - 1) / 2, Math.floor(j / B) * B + (B - 1) / 2] : [i, j];
    const w = Math.max((size * r.width) / (j1 - j0), 5);
    const h = Math.max((size * r.height) / (i1 - i0), 5);
    const x = r.left + ((cj - j0 + 0.5) * r.width) / (j1 - j0);
    const y = r.top + ((ci - i0 + 0.5) * r.height) / (i1 - i0);
    Object.assign($("marker").style, { display: "block", left: `${x - w / 2}px`, top: `${y - h / 2}px`,
      width: `${w}px`, height: `${h}px` });
  }

  let pending = 0;
  async function readout(canvas, event) {
    const head = Number(canvas.dataset.head);
    const source = canvas.dataset.source || "A";
    const [i, j] = cellAt(canvas, event);
    mark(canvas, i, j);
    const ticket = ++pending;
    const name = DATA.sources.find((s) => s.label === source).name;
    let where = `${name} · head ${head} · query i = ${i} · key j = ${j} · d = i - j = ${i - j}`;
    let over = "";
    if (B > 1) {
      const b = blockOf(i, j);
      where = `${name} · head ${head} · block of queries ${b.q0}-${b.q1}, keys ${b.k0}-${b.k1}`;
      over = ` · mean over its ${b.cells} causal cells`;
    }
    if (SUMMARY && !SUMMARY.bias_only) over += `${over ? " and" : " · mean over"} ${SUMMARY.samples} samples`;
    const lv = await level(setKey(source), head, 0); // the finest level embedded
    if (ticket !== pending) return;
    const v = lv.at(Math.floor(i / lv.f) * lv.n + Math.floor(j / lv.f));
    let value;
    if (Number.isNaN(v)) value = DATA.causal && j > i ? "masked (key after query)" : "no value";
    else if (lv.exact) value = `value ${fmt4(v)} (exact)${over}`;
    else if (lv.f === B) value = `value ${fmt4(v)} (16-bit, ± ${fmt4(lv.step / 2)})${over}`;
    else value = `value ${fmt4(v)} (mean of a ${lv.f}x${lv.f} block, 16-bit)`;
    const ti = tokenText(source, i);
    const tj = tokenText(source, j);
    const tokens = ti === null ? "" : ` · tokens: query ${ti}, key ${tj}`;
    const out = $("readout");
    out.textContent = `${where} · ${value}${tokens}`;
    out.dataset.query = String(i);
    out.dataset.key = String(j);
    out.dataset.head = String(head);
  }

  // -- controls ------------------------------------------------------------------------------------
  function fill(select, options, value) {
    select.replaceChildren(...options.map(([v, label]) => new Option(label, v, false, String(v) === String(value))));
  }

  function sampleOptions() {
    // side by side, only the samples both files hold (those of the difference)
    const src = DATA.sources.find((s) => s.label === (state.source === "AB" ? "D" : state.source));
    return src.samples.map((s) => [s, s === "mean" ? "mean over samples" : `sample ${s}`]);
  }

  function refreshSamples() {
    const options = sampleOptions();
    if (!options.some(([v]) => v === state.sample)) state.sample = options[0][0];
    fill($("sample"), options, state.sample);
  }

  function setup() {
    const sources = DATA.sources.map((s) => [s.label, s.label === "D" ? "A - B (difference)" : `${s.label}: ${s.path}`]);
    if (DATA.sources.length > 1) sources.push(["AB", "A | B side by side"]);
    fill($("source"), sources, state.source);
    $("source").closest("label").hidden = DATA.sources.length === 1;
    fill($("layer"), DATA.layers.map((l) => [l, `layer ${l}`]), state.layer);
    fill($("kind"), DATA.kinds.map((k) => [k, k === "bias" ? "bias" : "attention weights"]), state.kind);
    fill($("focus-head"), Array.from({ length: H }, (_, k) => [k + 1, `head ${k + 1}`]), 1);
    refreshSamples();
    $("sample").closest("label").hidden = Boolean(SUMMARY); // a summary holds the mean over samples only
    const on = (id, fn) => $(id).addEventListener("change", () => { fn($(id)); draw(); });
    on("source", (el) => { state.source = el.value; refreshSamples(); });
    on("layer", (el) => { state.layer = Number(el.value); });
    on("kind", (el) => { state.kind = el.value; });
    on("sample", (el) => { state.sample = el.value; });
    on("shared", (el) => { state.shared = el.checked; });
    on("log", (el) => { state.log = el.checked; });
    on("focus-head", (el) => { state.focus = Number(el.value); state.region = null; });
    $("focus-close").addEventListener("click", () => { state.focus = null; state.region = null; draw(); });
    $("zoom-reset").addEventListener("click", () => { state.region = null; draw(); });
    $("grid").addEventListener("click", (ev) => {
      if (!(ev.target instanceof HTMLCanvasElement) || !ev.target.dataset.head) return;
      state.focus = Number(ev.target.dataset.head);
      state.region = null;
      $("focus-head").value = String(state.focus);
      draw();
    });
    document.addEventListener("mousemove", (ev) => {
      if (ev.target instanceof HTMLCanvasElement && ev.target.dataset.head) readout(ev.target, ev);
      else $("marker").style.display = "none";
    });
    document.addEventListener("scroll", () => { $("marker").style.display = "none"; });
    setupZoom();
  }

  // Drag a rectangle on the enlarged head to zoom into it (at full resolution when the page holds it).
  function setupZoom() {
    const box = $("focus-canvases");
    const band = $("zoom-band");
    let start = null;
    box.addEventListener("mousedown", (ev) => {
      if (!(ev.target instanceof HTMLCanvasElement)) return;
      ev.preventDefault();
      start = { canvas: ev.target, x: ev.clientX, y: ev.clientY, cell: cellAt(ev.target, ev) };
    });
    document.addEventListener("mousemove", (ev) => {
      if (!start) return;
      const r = box.getBoundingClientRect();
      Object.assign(band.style, {
        display: "block",
        left: `${Math.min(start.x, ev.clientX) - r.left}px`, top: `${Math.min(start.y, ev.clientY) - r.top}px`,
        width: `${Math.abs(ev.clientX - start.x)}px`, height: `${Math.abs(ev.clientY - start.y)}px`,
      });
    });
    document.addEventListener("mouseup", (ev) => {
      if (!start) return;
      band.style.display = "none";
      const [ia, ja] = start.cell;
      const [ib, jb] = cellAt(start.canvas, ev);
      start = null;
      const side = Math.max(Math.abs(ib - ia), Math.abs(jb - ja)) + 1;
      if (side < 2) return;
      // a square region keeps cells square; it stays inside the matrix
      const i0 = Math.max(0, Math.min(Math.min(ia, ib), T - side));
      const j0 = Math.max(0, Math.min(Math.min(ja, jb), T - side));
      state.region = [i0, i0 + side, j0, j0 + side];
      draw();
    });
  }

  function describe() {
    const s = DATA.sources.filter((x) => x.label !== "D").map((x) => `${x.label}: ${x.path} (${x.scheme})`);
    let what = "";
    if (SUMMARY) {
      const blocks = B > 1 ? `, in blocks of ${B} x ${B} positions` : "";
      what = SUMMARY.bias_only ? ` · summary of the scheme's formula${blocks}` : ` · summary: mean over ${SUMMARY.samples} samples${blocks}`;
    }
    $("meta").textContent = `${s.join(" · ")} · ${H} heads · ${T} positions${what}`;
  }

  window.biasviz = { format: fmt4 }; // for scripts driving the page (and its tests)
  describe();
  setup();
  draw().catch((err) => {
    $("readout").textContent = `Error: ${err}`;
    throw err;
  });
})();
