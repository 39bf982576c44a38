// biasviz explorer, part 5 of 5: what is selected, the grid, the enlarged head, the read-out and the controls.

const state = {
  source: "A",
  step: DATA.opening, // index into a sweep's steps (the last, as every reader opens it), or null
  layer: DATA.layers[DATA.layers.length - 1],
  kind: DATA.kinds[0],
  sample: DATA.sources[0].samples[0],
  shared: false,
  log: false, // logarithmic colour scale for attention weights, as 'biasviz plot --log'
  zoomScale: true, // a zoomed region's colours span the values it shows
  focus: null, // head shown enlarged (1-based), or null for the grid
  region: null, // [i0, i1, j0, j1] zoomed region of the enlarged head
};
let drawn = 0;

// -- what is selected ----------------------------------------------------------------------------
function sourcesShown() {
  return state.source === "AB" ? ["A", "B"] : [state.source];
}
function sourceName(label) {
  return DATA.sources.find((s) => s.label === label).name;
}
function setKey(source) {
  return `${source}|${state.layer}|${state.kind}|${state.sample}${STEPS ? `|${state.step}` : ""}`;
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
  const centred = [a, b].find((s) => s[3] === "centred");
  if (centred) return centredScale(Math.min(a[0], b[0]), Math.max(a[1], b[1]), centred[2]);
  return [Math.min(a[0], b[0]), Math.max(a[1], b[1]), ...a.slice(2)];
}

// The levels a head can be drawn from, finest first: [{f}], the page's own for A and B; A - B pairs them.
function levelsOf(source, head) {
  if (source !== "D") return DATA.sets[setKey(source)].heads[head - 1].levels;
  const [a, b] = ["A", "B"].map((s) => levelsOf(s, head));
  const finest = { f: Math.min(a[0].f, b[0].f), pair: [0, 0] };
  const coarsest = { f: a[a.length - 1].f, pair: [a.length - 1, b.length - 1] };
  return finest.pair[0] === coarsest.pair[0] && finest.pair[1] === coarsest.pair[1] ? [finest] : [finest, coarsest];
}

const cache = new Map();
let cached = 0;
function level(source, head, index) {
  const key = `${setKey(source)}#${head}#${index}`;
  let entry = cache.get(key);
  if (!entry) {
    if (source === "D") {
      const [ka, kb] = levelsOf("D", head)[index].pair;
      entry = Promise.all([level("A", head, ka), level("B", head, kb)]).then(([a, b]) => differenceLevel(a, b));
    } else {
      entry = decodeLevel(DATA.sets[setKey(source)].heads[head - 1].levels[index]).then((lv) => {
        cached += lv.bytes;
        for (const [k, v] of cache) {
          if (cached <= CACHE_LIMIT || k === key) break;
          cache.delete(k);
          v.then((old) => { cached -= old.bytes; });
        }
        return lv;
      });
    }
  } else {
    cache.delete(key); // most recently used last
  }
  cache.set(key, entry);
  return entry;
}

// The level to draw a region with: the coarsest whose blocks are no larger than a pixel, else the finest.
function levelFor(levels, positionsPerPixel) {
  let pick = 0;
  levels.forEach((lv, k) => { if (lv.f <= Math.max(1, positionsPerPixel)) pick = k; });
  return pick;
}

// -- the grid ------------------------------------------------------------------------------------
// The grid's level: from the overview towards finer ones until a cell is no larger than a pixel, reading
// at most twice the canvas's pixels a side (so that opening the page decodes little).
function gridLevel(levels, pixels) {
  let pick = levels.length - 1;
  for (let k = levels.length - 1; k >= 0; k--) {
    if (Math.ceil(T / levels[k].f) > 2 * pixels) break;
    pick = k;
    if (levels[k].f <= T / pixels) break;
  }
  return pick;
}

function gridCanvases(head) {
  return Array.from(document.querySelectorAll(`#grid canvas[data-head="${head}"]`));
}

async function drawGrid() {
  const shown = sourcesShown();
  const jobs = [];
  $("grid").classList.toggle("pairs", shown.length > 1);
  for (let head = 1; head <= H; head++) {
    const panel = document.querySelector(`#grid .panel[data-panel="${head}"]`);
    let canvases = gridCanvases(head);
    while (canvases.length < shown.length) {
      panel.querySelector(".canvases").appendChild(canvases[0].cloneNode(false));
      canvases = gridCanvases(head);
    }
    canvases.forEach((cv, k) => {
      cv.hidden = k >= shown.length;
      if (k >= shown.length) return;
      const source = shown[k];
      cv.dataset.source = source;
      const pick = gridLevel(levelsOf(source, head), cv.width);
      jobs.push(level(source, head, pick).then((lv) => paint(cv, lv, scaleOf(source, head), [0, T, 0, T])));
    });
    const names = shown.map(sourceName);
    panel.querySelector("figcaption").textContent = `Head ${head}${state.source === "A" && DATA.sources.length === 1 ? "" : ` · ${names.join(" | ")}`}`;
  }
  refreshBars(); // once every panel holds its canvases: the ramps' widths are final (a scroll bar included)
  await Promise.all(jobs);
}

// -- the enlarged head ---------------------------------------------------------------------------
function focusPlots(count) {
  const box = $("focus-canvases");
  let plots = Array.from(box.querySelectorAll(".fplot"));
  while (plots.length < count) {
    box.insertBefore(plots[0].cloneNode(true), $("focus-cbar"));
    plots = Array.from(box.querySelectorAll(".fplot"));
  }
  plots.forEach((p, k) => { p.hidden = k >= count; });
  return plots.slice(0, count);
}

// Pixels a side for the enlarged matrix: as large as the window allows below the controls, at most its canvas.
function focusSide(count, canvasSide) {
  const free = $("focus").clientWidth - 110 - count * 90;
  const tall = window.innerHeight - $("top").offsetHeight - 150;
  return Math.max(200, Math.floor(Math.min(Math.max(canvasSide, 600), free / count, tall))); // cells stay sharp
}

async function drawFocus() {
  const head = state.focus;
  const region = state.region || [0, T, 0, T];
  const shown = sourcesShown();
  const plots = focusPlots(shown.length);
  const side = focusSide(shown.length, plots[0].querySelector("canvas").width);
  const picked = await Promise.all(shown.map((source) => {
    const pick = levelFor(levelsOf(source, head), (region[1] - region[0]) / plots[0].querySelector("canvas").width);
    return level(source, head, pick);
  }));
  let scale = scaleOf(shown[0], head);
  const zoomed = state.region !== null && state.zoomScale;
  if (zoomed) {
    const ranges = picked.map((lv) => regionRange(lv, region));
    scale = scaleOver(scale, { lo: Math.min(...ranges.map((r) => r.lo)), hi: Math.max(...ranges.map((r) => r.hi)),
      positive: Math.min(...ranges.map((r) => r.positive)) });
  }
  plots.forEach((plot, k) => {
    const source = shown[k];
    const [cv, xaxis, yaxis] = plot.querySelectorAll("canvas");
    cv.dataset.source = source;
    cv.dataset.head = String(head);
    cv.style.width = `${side}px`;
    cv.style.height = `${side}px`;
    paint(cv, picked[k], scale, region);
    cv.dataset.cell = String(picked[k].f); // positions one drawn cell spans (1: each cell as it is)
    const token = tokenText(source, 0) === null ? null : (p) => tokenString(source, p);
    drawAxes(xaxis, yaxis, region, side, token);
    plot.querySelector(".fplot-label").textContent = source === "D"
      ? `A - B = ${DATA.sources[0].path} minus ${DATA.sources[1].path}` : `${sourceName(source)}: ${DATA.sources.find((s) => s.label === source).path}`;
    plot.querySelector(".fplot-label").textContent += blockNote(picked[k], region, cv.width);
  });
  const title = zoomed ? "zoomed region" : "whole head";
  const ends = shown[0] === "D" ? differenceEnds(scale) : null;
  drawFocusBar($("focus-cbar"), scale, side, title, ends);
  const profiles = shown.map((s) => profileOf(s, head));
  const room = $("focus").clientWidth - $("focus-wrap").offsetWidth - 24;
  const pcv = $("profile");
  [pcv.width, pcv.height] = room >= 420 ? [room, Math.min(320, side)] : [Math.min(1000, $("focus").clientWidth), 250];
  drawProfile(pcv, profiles, shown.map(sourceName), head);
  const measures = shown.map((s) => measuresOf(s, head));
  const mcv = $("measures");
  mcv.hidden = !measures.some((m) => m);
  if (!mcv.hidden) {
    [mcv.width, mcv.height] = [Math.min(1000, $("focus").clientWidth), 240]; // its own row: two panels side by side
    drawMeasures(mcv, measures, shown.map(sourceName), head);
  }
  const [i0, i1, j0, j1] = region;
  $("focus-title").textContent = `Head ${head}: queries ${i0}-${i1 - 1}, keys ${j0}-${j1 - 1}`;
}

// What the ends of a difference's colour bar say, from the value at each: which file is larger there. Where
// A - B keeps one sign, the other end is not "B larger" (or "A larger"): it is where they are equal, or unlabelled.
function differenceEnds(scale) {
  if (scale[3] === "zero") return ["A = B", ""]; // every value 0: the bar's 1 is room, not a value
  const [lo, hi] = scale;
  const said = (v) => (v > 0 ? "A larger" : v < 0 ? "B larger" : "A = B");
  if (lo < 0 && hi > 0) return [said(lo), said(hi)];
  if (lo >= 0) return [lo === 0 ? said(0) : "", said(hi)];
  return [said(lo), hi === 0 ? said(0) : ""];
}

// A head's band and context mass (docs/position-measures.md), where its file holds them: means and SEs as Float32Arrays.
function measuresOf(source, head) {
  const m = DATA.sets[setKey(source)].heads[head - 1].measures;
  if (!m) return null;
  const arrays = (x) => ({ mean: new Float32Array(base64Bytes(x.mean).buffer),
    se: x.se ? new Float32Array(base64Bytes(x.se).buffer) : null });
  return { bins: m.bins, band: arrays(m.band), context: arrays(m.context) };
}

function profileOf(source, head) {
  const p = DATA.sets[setKey(source)].heads[head - 1].profile;
  return { d0: p.d0, mean: new Float32Array(base64Bytes(p.mean).buffer), std: new Float32Array(base64Bytes(p.std).buffer) };
}

// How the page names a layer: "layer 3", or a traced model's "attention call 3 (its module)" (page data, as text).
function layerName(layer) {
  return (DATA.layer_names && DATA.layer_names[String(layer)]) || `layer ${layer}`;
}

// Whether a layer's call attends causally: its own rule where the file's calls differ (an encoder-decoder's).
function layerCausal(layer) {
  const own = DATA.layer_causal && DATA.layer_causal[String(layer)];
  return own === undefined ? DATA.causal : own;
}

// What the page shows, in words, above the controls: file, step, layer, sample and kind.
function describeView() {
  const path = (label) => DATA.sources.find((s) => s.label === label).path;
  const shown = state.source === "AB" ? "A | B side by side" : state.source === "D"
    ? `A - B = ${path("A")} minus ${path("B")}` : `${state.source}: ${path(state.source)}`;
  const step = STEPS ? ` · step ${STEPS[state.step]} (checkpoint ${state.step} of ${STEPS.length}, from 0)` : "";
  const sample = SUMMARY ? "mean over samples" : state.sample === "mean" ? "mean over samples" : `sample ${state.sample}`;
  const kind = KIND_NAMES[state.kind] || state.kind;
  $("where").textContent = `${shown}${step} · ${layerName(state.layer)} · ${sample} · ${kind}`;
}

async function draw() {
  $("log").closest("label").hidden = !DATA.sets[setKey(sourcesShown()[0])].scale.log_head;
  $("grid").hidden = state.focus !== null;
  $("focus").hidden = state.focus === null;
  describeView();
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

// The token at a position of the sample shown: [id, its text or undefined], or null when there is none.
function tokenAt(source, pos) {
  const tokens = DATA.tokens[source === "D" ? "A" : source];
  if (!tokens || !tokens.ids || state.sample === "mean" || source === "D") return null;
  if (!tokens.array) tokens.array = new Int32Array(base64Bytes(tokens.ids).buffer);
  const id = tokens.array[Number(state.sample) * T + pos];
  return [id, tokens.strings[String(id)]];
}
function tokenText(source, pos) {
  const t = tokenAt(source, pos);
  if (t === null) return null;
  return t[1] === undefined ? `id ${t[0]}` : `${JSON.stringify(t[1])} (id ${t[0]})`;
}
function tokenString(source, pos) {
  const t = tokenAt(source, pos);
  return t === null ? null : t[1] === undefined ? `#${t[0]}` : t[1];
}

// A summary's block: its first and last query and key, and the cells j <= i its mean is taken over.
function blockOf(i, j) {
  const q0 = Math.floor(i / B) * B;
  const k0 = Math.floor(j / B) * B;
  const q1 = Math.min(q0 + B, T) - 1;
  const k1 = Math.min(k0 + B, T) - 1;
  let cells = 0;
  const causal = layerCausal(state.layer);
  for (let q = q0; q <= q1; q++) cells += causal ? Math.max(0, Math.min(q, k1) - k0 + 1) : k1 - k0 + 1;
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
  const name = sourceName(source);
  let where = `${name} · head ${head} · query i = ${i} · key j = ${j} · d = i - j = ${i - j}`;
  let over = "";
  if (B > 1) {
    const b = blockOf(i, j);
    where = `${name} · head ${head} · block of queries ${b.q0}-${b.q1}, keys ${b.k0}-${b.k1}`;
    over = ` · mean over its ${b.cells} causal cells`;
  }
  if (SUMMARY && !SUMMARY.bias_only) over += `${over ? " and" : " · mean over"} ${SUMMARY.samples} samples`;
  const lv = await level(source, head, 0); // the finest level embedded
  if (ticket !== pending) return;
  const v = valueAt(lv, i, j);
  let value;
  if (Number.isNaN(v)) value = layerCausal(state.layer) && j > i ? "masked (key after query)" : "no value";
  else if (lv.what) value = `value ${fmt4(v)} (${lv.what})${over}`;
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

function refreshSamples() {
  // side by side, only the samples both files hold (those of the difference)
  const src = DATA.sources.find((s) => s.label === (state.source === "AB" ? "D" : state.source));
  const options = src.samples.map((s) => [s, s === "mean" ? "mean over samples" : `sample ${s}`]);
  if (!options.some(([v]) => v === state.sample)) state.sample = options[0][0];
  fill($("sample"), options, state.sample);
}

function openHead(head) {
  state.focus = head;
  state.region = null;
  $("focus-head").value = String(head);
  draw().then(() => window.scrollTo(0, 0)); // the enlarged head opens at its top, below the controls
}

function setup() {
  const sources = DATA.sources.map((s) => [s.label, s.label === "D" ? "A - B (difference)" : `${s.label}: ${s.path}`]);
  if (DATA.sources.length > 1) sources.push(["AB", "A | B side by side"]);
  fill($("source"), sources, state.source);
  $("source").closest("label").hidden = DATA.sources.length === 1;
  if (STEPS) fill($("step"), STEPS.map((s, k) => [k, `step ${s}`]), state.step);
  $("step").closest("label").hidden = !STEPS;
  fill($("layer"), DATA.layers.map((l) => [l, layerName(l)]), state.layer);
  fill($("kind"), DATA.kinds.map((k) => [k, KIND_NAMES[k] || k]), state.kind);
  fill($("focus-head"), Array.from({ length: H }, (_, k) => [k + 1, `head ${k + 1}`]), 1);
  refreshSamples();
  $("sample").closest("label").hidden = Boolean(SUMMARY); // a summary holds the mean over samples only
  $("zoom-scale").checked = state.zoomScale;
  const on = (id, fn) => $(id).addEventListener("change", () => { fn($(id)); draw(); });
  on("source", (el) => { state.source = el.value; refreshSamples(); });
  on("step", (el) => { state.step = Number(el.value); });
  on("layer", (el) => { state.layer = Number(el.value); });
  on("kind", (el) => { state.kind = el.value; });
  on("sample", (el) => { state.sample = el.value; });
  on("shared", (el) => { state.shared = el.checked; });
  on("log", (el) => { state.log = el.checked; });
  on("zoom-scale", (el) => { state.zoomScale = el.checked; });
  on("focus-head", (el) => { state.focus = Number(el.value); state.region = null; });
  $("focus-close").addEventListener("click", () => { state.focus = null; state.region = null; draw(); });
  $("zoom-reset").addEventListener("click", () => { state.region = null; draw(); });
  $("export-png").addEventListener("click", () => download("png"));
  $("export-svg").addEventListener("click", () => download("svg"));
  $("grid").addEventListener("click", (ev) => {
    if (ev.target instanceof HTMLCanvasElement && ev.target.dataset.head) openHead(Number(ev.target.dataset.head));
  });
  document.addEventListener("mousemove", (ev) => {
    if (ev.target instanceof HTMLCanvasElement && ev.target.dataset.head) readout(ev.target, ev);
    else $("marker").style.display = "none";
  });
  document.addEventListener("scroll", () => { $("marker").style.display = "none"; });
  window.addEventListener("resize", () => { if (state.focus !== null) draw(); else refreshBars(); });
  setupZoom();
}

// Drag a rectangle on the enlarged head to zoom into it (at full resolution when the page holds it).
function setupZoom() {
  const box = $("focus-canvases");
  const band = $("zoom-band");
  let start = null;
  box.addEventListener("mousedown", (ev) => {
    if (!(ev.target instanceof HTMLCanvasElement) || !ev.target.dataset.head) return;
    ev.preventDefault();
    start = { canvas: ev.target, x: ev.clientX, y: ev.clientY, cell: cellAt(ev.target, ev) };
  });
  document.addEventListener("mousemove", (ev) => {
    if (!start) return;
    const r = $("focus-wrap").getBoundingClientRect();
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
  const steps = STEPS ? ` · ${STEPS.length} checkpoints (steps ${STEPS[0]} to ${STEPS[STEPS.length - 1]})` : "";
  $("meta").textContent = `${s.join(" · ")} · ${H} heads · ${T} positions${steps}${what}`;
}

window.biasviz = { format: fmt4, exportView, scaleOver, drawProfile, state }; // for scripts driving the page (and its tests)
describe();
setup();
draw().catch((err) => {
  $("readout").textContent = `Error: ${err}`;
  throw err;
});
