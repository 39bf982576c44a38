// biasviz explorer, part 2 of 5: painting matrices, colour bars, axes and the distance profile.

// value -> [0, 1] as matplotlib's Normalize (or LogNorm, clipped) does; the colour table does the rest
function normaliser(scale) {
  const [lo, hi] = scale;
  if (scale[3] === "centred") { // matplotlib's TwoSlopeNorm at 0: each sign over its own half of the map
    return (v) => (v < 0 ? 0.5 * (v - lo) / -lo : 0.5 + (0.5 * v) / hi);
  }
  if (scale[3] === "log") {
    const a = Math.log(lo);
    const span = Math.log(hi) - a || 1;
    return (v) => (Math.log(Math.min(Math.max(v, lo), hi)) - a) / span;
  }
  const span = hi - lo || 1;
  return (v) => (v - lo) / span;
}

function colourIndex(norm, v) {
  return Math.min(255, Math.max(0, Math.floor(norm(v) * 256)));
}

function paint(canvas, lv, scale, region) {
  const [i0, i1, j0, j1] = region;
  const w = canvas.width;
  const h = canvas.height;
  const ctx = canvas.getContext("2d");
  const img = ctx.createImageData(w, h);
  const px = img.data;
  const lut = LUTS[scale[2]];
  const masked = DATA.masked[scale[2]];
  const norm = normaliser(scale);
  const cols = new Int32Array(w);
  for (let x = 0; x < w; x++) cols[x] = Math.floor((j0 + Math.floor(((x + 0.5) * (j1 - j0)) / w)) / lv.f);
  for (let y = 0; y < h; y++) {
    const row = Math.floor((i0 + Math.floor(((y + 0.5) * (i1 - i0)) / h)) / lv.f) * lv.n;
    for (let x = 0; x < w; x++) {
      const v = lv.at(row + cols[x]);
      const o = (y * w + x) * 4;
      px[o + 3] = 255;
      if (Number.isNaN(v)) { // masked: the neutral colour no value maps to, as in the figures
        px.set(masked, o);
        continue;
      }
      const c = colourIndex(norm, v) * 3;
      px[o] = lut[c];
      px[o + 1] = lut[c + 1];
      px[o + 2] = lut[c + 2];
    }
  }
  ctx.putImageData(img, 0, 0);
}

// The finite extremes of a level over a region (at most ~1M cells read), for colours that span a zoom.
function regionRange(lv, region) {
  const [i0, i1, j0, j1] = region;
  const stride = Math.max(lv.f, Math.ceil(Math.sqrt(((i1 - i0) * (j1 - j0)) / 1e6)));
  let lo = Infinity;
  let hi = -Infinity;
  let positive = Infinity;
  for (let i = i0; i < i1; i += stride) {
    for (let j = j0; j < j1; j += stride) {
      const v = valueAt(lv, i, j);
      if (!Number.isFinite(v)) continue;
      if (v < lo) lo = v;
      if (v > hi) hi = v;
      if (v > 0 && v < positive) positive = v;
    }
  }
  return { lo, hi, positive };
}

// A scale of the same kind as ``base`` (diverging, log or linear) spanning ``r``.
function scaleOver(base, r) {
  if (!(r.hi >= r.lo)) return base;
  if (base[3] === "centred") return centredScale(r.lo, r.hi, base[2]);
  if (base[3] === "log") {
    const floor = Math.max(r.positive, r.hi * 1e-4);
    return r.hi > 0 ? [Math.min(floor, r.hi), r.hi, base[2], "log"] : base;
  }
  // one value throughout (an all-zero corner of the weights): no range of its own, so the whole head's scale
  return r.hi > r.lo ? [r.lo, r.hi, base[2]] : base;
}

// A bar's top value, "≥ " before it where values lie above it (a weights scale ending at the 99.5th percentile,
// where biasviz plot draws an arrow): the end of the colours, not the data's largest value.
function topText(scale) {
  return (scale[4] === "over" ? "\u2265\u2009" : "") + fmt4(scale[1]);
}

// A diverging scale centred at 0 with the data's own ends (each sign over its half), as biasviz plot draws:
// symmetric (+-the larger magnitude) where the smaller side is under a twentieth of the range (NOISE_SHARE).
function centredScale(lo, hi, cmap) {
  const [a, b] = [Math.min(lo, -1e-30), Math.max(hi, 1e-30)];
  if (Math.min(-a, b) < 0.05 * (b - a)) return [-Math.max(-a, b), Math.max(-a, b), cmap, "centred"];
  return [a, b, cmap, "centred"];
}

// A grid head's colour bar: the data's two limits above the ramp's ends, and below it round values (0 among
// them when the scale crosses it) at their places on the ramp, as many as fit without touching (barTicks).
const BAR_H = 8; // pixels of colours; tick marks hang below them
const MARK_H = 3;
function colourBar(bar, scale) {
  bar.querySelector(".lo").textContent = fmt4(scale[0]);
  bar.querySelector(".hi").textContent = topText(scale);
  const ramp = bar.querySelector("canvas.ramp");
  const width = Math.round(ramp.clientWidth) || 256; // one canvas pixel per screen pixel, so marks stay sharp
  ramp.width = width;
  ramp.height = BAR_H + MARK_H;
  const ctx = ramp.getContext("2d");
  const lut = LUTS[scale[2]];
  for (let x = 0; x < width; x++) {
    const k = Math.min(255, Math.floor(((x + 0.5) * 256) / width)) * 3;
    ctx.fillStyle = `rgb(${lut[k]},${lut[k + 1]},${lut[k + 2]})`;
    ctx.fillRect(x, 0, 1, BAR_H);
  }
  ctx.strokeStyle = "#bbb";
  ctx.strokeRect(0.5, 0.5, width - 1, BAR_H - 1);
  const row = bar.querySelector(".ticks");
  ctx.font = getComputedStyle(row).font;
  const ticks = barTicks(scale, width, (t) => ctx.measureText(t).width);
  ctx.fillStyle = "#444";
  row.replaceChildren(...ticks.map((t) => {
    ctx.fillRect(Math.min(Math.floor(t.x), width - 1), BAR_H, 1, MARK_H);
    const label = document.createElement("span");
    label.textContent = t.text;
    label.style.left = `${(100 * t.at) / width}%`;
    return label;
  }));
  bar.dataset.ticks = ticks.map((t) => t.text).join(" "); // what the bar marks (for scripts and tests)
}

// Round values for a colour bar ``width`` pixels wide: multiples of 1, 2 or 5 times a power of ten (decades
// on a log scale, every k-th when they crowd), at most ``MOST_TICKS`` of them: the most whose labels keep
// ``GAP`` pixels apart, less those whose labels would pass the ramp's ends by more than ``SLACK`` pixels (each
// sits by the limit printed above it). 0 is among them when the scale crosses it (a multiple of every step).
// Each tick: its value, text (fmt4), mark ``x`` and label centre ``at``, in pixels from the left.
const GAP = 6;
const SLACK = 4; // less than half the grid's gap between panels: labels of neighbours never meet
const MOST_TICKS = 5;
function barTicks(scale, width, measure) {
  const [lo, hi] = scale;
  const frac = normaliser(scale);
  const crosses = lo < 0 && hi > 0;
  const limits = [fmt4(lo), fmt4(hi)]; // printed above the ramp's ends already: not again below them
  const place = (vs) => vs.filter((v) => !limits.includes(fmt4(v))).map((v) => {
    const x = frac(v) * width;
    const text = fmt4(v);
    return { value: v, text, x, at: x, w: measure(text) };
  });
  const inside = (t) => t.x - t.w / 2 >= -SLACK && t.x + t.w / 2 <= width + SLACK;
  const apart = (ts) => ts.every((t, k) => k === 0 || t.x - ts[k - 1].x >= (t.w + ts[k - 1].w) / 2 + GAP);
  let sets = [];
  if (scale[3] === "log") {
    const decades = logTicks(lo, hi).filter((v) => v >= lo && v <= hi);
    sets = [1, 2, 3, 5, 10].map((k) => decades.filter((_, n) => (decades.length - 1 - n) % k === 0));
  } else if (hi > lo) {
    const top = Math.floor(Math.log10(hi - lo));
    for (let e = top - 2; e <= top; e++) for (const m of [1, 2, 5]) sets.push(multiples(lo, hi, m * 10 ** e));
  }
  const zero = (ts) => !crosses || ts.some((t) => t.value === 0);
  const placed = sets.map((vs) => place(vs).filter((t) => inside(t) || (crosses && t.value === 0)))
    .filter((ts) => ts.length > 0 && ts.length <= MOST_TICKS && apart(ts) && zero(ts));
  const best = placed.reduce((a, b) => (b.length > a.length ? b : a), []);
  if (best.length && best.every(inside)) return best;
  // no round value fits where it belongs: 0 where the scale crosses it, else the round value nearest the
  // middle, its label moved inside the ramp's ends (its mark stays where the value is)
  const mid = (lo + hi) / 2;
  const near = sets.flat().reduce((a, v) => (Math.abs(v - mid) < Math.abs(a - mid) ? v : a), Infinity);
  const ts = place([crosses ? 0 : Number.isFinite(near) ? near : lo]);
  ts.forEach((t) => { t.at = Math.min(Math.max(t.x, t.w / 2 - SLACK), width + SLACK - t.w / 2); });
  return ts;
}

// The multiples of ``step`` in [lo, hi] (0 exactly 0, never -0).
function multiples(lo, hi, step) {
  const out = [];
  for (let k = Math.ceil(lo / step) - 1; k * step <= hi; k++) if (k * step >= lo) out.push(k === 0 ? 0 : k * step);
  return out;
}

// The grid's colour bars, drawn for the ramps' widths on screen (again when the window changes size).
function refreshBars() {
  const shown = sourcesShown();
  for (let head = 1; head <= H; head++) {
    colourBar(document.querySelector(`#grid .panel[data-panel="${head}"] .cbar`), scaleOf(shown[0], head));
  }
}

// What an enlarged head drawn from block means larger than a pixel says: its blocks are not the data's cells.
function blockNote(lv, region, pixels) {
  if (lv.f <= B || lv.f <= (region[1] - region[0]) / pixels) return "";
  return ` · drawn as ${lv.f} × ${lv.f} block means: the page holds no finer data for this view (explore --max-mb)`;
}

// About ``count`` round values (1, 2 or 5 times a power of ten apart) in [lo, hi].
function niceTicks(lo, hi, count) {
  const span = hi - lo;
  if (!(span > 0)) return [lo];
  const raw = span / count;
  const mag = 10 ** Math.floor(Math.log10(raw));
  const step = [1, 2, 5, 10].map((m) => m * mag).find((s) => s >= raw);
  const out = [];
  for (let v = Math.ceil(lo / step) * step; v <= hi + step * 1e-9; v += step) out.push(Math.abs(v) < step * 1e-9 ? 0 : v);
  return out;
}

function logTicks(lo, hi) {
  const out = [];
  for (let e = Math.ceil(Math.log10(lo)); e <= Math.floor(Math.log10(hi)); e++) out.push(10 ** e);
  return out.length ? out : [lo, hi];
}

function prepare(cv, width, height) {
  if (cv.width !== width) cv.width = width;
  if (cv.height !== height) cv.height = height;
  cv.style.width = `${width}px`;
  cv.style.height = `${height}px`;
  const ctx = cv.getContext("2d");
  ctx.clearRect(0, 0, width, height);
  ctx.fillStyle = "#222";
  ctx.strokeStyle = "#444";
  ctx.font = "11px system-ui, sans-serif";
  return ctx;
}

function shortText(text) {
  const s = JSON.stringify(text).slice(1, -1);
  return s.length > 9 ? `${s.slice(0, 8)}…` : s;
}

// Positions along an axis: round ticks, or every position's token once a cell is wide enough to read it.
function axisLabels(lo, hi, side, token) {
  const span = hi - lo;
  if (token && side / span >= 13) {
    return Array.from({ length: span }, (_, k) => [lo + k, shortText(token(lo + k) ?? "")]);
  }
  return niceTicks(lo, hi - 1, Math.max(2, Math.floor(side / 70))).map((p) => [p, String(p)]);
}

// Key positions under the matrix (x) and query positions left of it (y), ticks at cell centres. The axis
// canvases reach AXIS_PAD pixels past the matrix's ends (CSS margins), so that end labels are not cut.
const AXIS_PAD = 10;
function drawAxes(xcv, ycv, region, side, token) {
  const [i0, i1, j0, j1] = region;
  const x = prepare(xcv, side + 4 * AXIS_PAD, 64);
  x.translate(AXIS_PAD, 0);
  const xs = axisLabels(j0, j1, side, token);
  const tokens = xs.some(([p, s]) => s !== String(p));
  xcv.dataset.labels = tokens ? "tokens" : "positions"; // what the axes show (for scripts and tests)
  for (const [p, s] of xs) {
    const at = ((p - j0 + 0.5) * side) / (j1 - j0);
    x.fillRect(at, 0, 1, 4);
    x.save();
    x.translate(at, 6);
    if (tokens) x.rotate(Math.PI / 3);
    x.textAlign = tokens ? "left" : "center";
    x.textBaseline = tokens ? "middle" : "top";
    x.fillText(s, tokens ? 2 : 0, 0);
    x.restore();
  }
  x.textAlign = "right";
  x.fillText(tokens ? "key j (tokens)" : "key j", side, tokens ? 58 : 34);
  const y = prepare(ycv, 74, side + 2 * AXIS_PAD);
  y.translate(0, AXIS_PAD);
  y.textAlign = "right";
  y.textBaseline = "middle";
  for (const [p, s] of axisLabels(i0, i1, side, token)) {
    const at = ((p - i0 + 0.5) * side) / (i1 - i0);
    y.fillRect(70, at, 4, 1);
    y.fillText(s, 67, at);
  }
  y.save();
  y.translate(9, side / 2);
  y.rotate(-Math.PI / 2);
  y.textAlign = "center";
  y.fillText(tokens ? "query i (tokens)" : "query i", 0, 0);
  y.restore();
}

// The enlarged head's colour bar: the ramp, the values at its two ends (above its top, below its foot, in the
// page's one format, as the grid's bars print theirs), ticks at round values between them, and, for a
// difference, what the ends mean. A tick whose label would reach an end's label keeps its mark, not its text.
const END_GAP = 16; // pixels from a ramp end to the baseline of the value printed beyond it
function drawFocusBar(cv, scale, side, title, ends) {
  const ctx = prepare(cv, 96, side);
  const top = ends ? 52 : 36;
  const bottom = side - (ends ? 40 : 24);
  const lut = LUTS[scale[2]];
  for (let y = top; y < bottom; y++) {
    const k = Math.min(255, Math.floor(((bottom - y) / (bottom - top)) * 256)) * 3;
    ctx.fillStyle = `rgb(${lut[k]},${lut[k + 1]},${lut[k + 2]})`;
    ctx.fillRect(4, y, 16, 1);
  }
  ctx.strokeRect(4.5, top - 0.5, 16, bottom - top + 1);
  const [lo, hi] = scale;
  const log = scale[3] === "log";
  const frac = normaliser(scale);
  const limits = [fmt4(lo), scale[3] === "zero" ? "every value 0" : topText(scale)]; // all 0: the bar's 1 is room
  ctx.fillStyle = "#222";
  ctx.textBaseline = "middle";
  const ticks = log ? logTicks(lo, hi) : niceTicks(lo, hi, Math.max(2, Math.floor(side / 80)));
  for (const v of ticks) {
    const y = bottom - frac(v) * (bottom - top);
    ctx.fillRect(20, y, 4, 1);
    if (y >= top + 5 && y <= bottom - 5) ctx.fillText(fmt4(v), 27, y); // clear of the ends' values
  }
  ctx.textBaseline = "alphabetic";
  ctx.fillText(title, 2, 12);
  ctx.fillText(limits[1], 2, top - 6);
  ctx.fillText(limits[0], 2, bottom + END_GAP);
  if (ends) { // what the two ends mean (a difference: which file is larger)
    ctx.fillText(ends[1], 2, 28);
    ctx.fillText(ends[0], 2, side - 6);
  }
  cv.dataset.limits = limits.join("|"); // bottom|top, as drawn
  cv.dataset.ends = ends ? ends.join("|") : ""; // bottom|top, as drawn: for a reader of the page (and its tests)
}

const PROFILE_COLOURS = ["31,119,180", "255,127,14"];

// Mean ± standard deviation at each distance d = i - j, with axes and a legend naming each file.
function drawProfile(cv, profiles, names, head) {
  const w = cv.width;
  const h = cv.height;
  const ctx = cv.getContext("2d");
  ctx.clearRect(0, 0, w, h);
  const left = 64;
  const right = 12;
  const top = 42;
  const bottom = 40;
  // attention weights are never below 0: their band stops there (a spread is not a value the weights take)
  const floor = state.kind === "weights" ? 0 : -Infinity;
  const below = (p, k) => Math.max(p.mean[k] - p.std[k], floor);
  let lo = Infinity;
  let hi = -Infinity;
  for (const p of profiles) {
    p.mean.forEach((m, k) => {
      if (Number.isNaN(m)) return;
      lo = Math.min(lo, below(p, k));
      hi = Math.max(hi, m + p.std[k]);
    });
  }
  if (!(hi > lo)) { lo -= 0.5; hi += 0.5; }
  const n = profiles[0].mean.length;
  const d0 = profiles[0].d0;
  const X = (d) => left + ((w - left - right) * (d - d0)) / Math.max(n - 1, 1);
  const Y = (v) => top + ((h - top - bottom) * (hi - v)) / (hi - lo);
  profiles.forEach((p, s) => {
    ctx.fillStyle = `rgba(${PROFILE_COLOURS[s]},0.22)`;
    ctx.beginPath();
    for (let k = 0; k < n; k++) ctx.lineTo(X(d0 + k), Y(p.mean[k] + p.std[k]));
    for (let k = n - 1; k >= 0; k--) ctx.lineTo(X(d0 + k), Y(below(p, k)));
    ctx.fill();
    ctx.strokeStyle = `rgb(${PROFILE_COLOURS[s]})`;
    ctx.lineWidth = 1.5;
    ctx.beginPath();
    for (let k = 0; k < n; k++) ctx.lineTo(X(d0 + k), Y(p.mean[k]));
    ctx.stroke();
  });
  ctx.lineWidth = 1;
  ctx.strokeStyle = "#444";
  ctx.fillStyle = "#222";
  ctx.font = "11px system-ui, sans-serif";
  ctx.strokeRect(left + 0.5, top + 0.5, w - left - right - 1, h - top - bottom);
  ctx.textAlign = "center";
  ctx.textBaseline = "top";
  for (const d of niceTicks(d0, d0 + n - 1, Math.max(2, Math.floor((w - left) / 80)))) {
    ctx.fillRect(X(d), h - bottom, 1, 4);
    ctx.fillText(String(d), X(d), h - bottom + 6);
  }
  ctx.fillText("distance d = i - j (query minus key)", left + (w - left - right) / 2, h - 14);
  ctx.textAlign = "right";
  ctx.textBaseline = "middle";
  for (const v of niceTicks(lo, hi, 4)) {
    ctx.fillRect(left - 4, Y(v), 4, 1);
    ctx.fillText(fmt4(v), left - 6, Y(v));
  }
  ctx.save();
  ctx.translate(12, top + (h - top - bottom) / 2);
  ctx.rotate(-Math.PI / 2);
  ctx.textAlign = "center";
  ctx.fillText(KIND_AXIS[state.kind] || state.kind, 0, 0);
  ctx.restore();
  const over = SUMMARY && !SUMMARY.bias_only ? "samples and cells" : "cells";
  ctx.textAlign = "left";
  ctx.textBaseline = "alphabetic";
  ctx.fillText(`Distance profile of head ${head}: mean ± std over the ${over} with i - j = d`, left, 14);
  // the legend, on its own row above the plot, right-aligned: one entry per file
  let lx = w - right;
  for (let s = names.length - 1; s >= 0; s--) {
    const label = `${names[s]}: mean ± std`;
    lx -= ctx.measureText(label).width;
    ctx.fillText(label, lx, top - 8);
    ctx.fillStyle = `rgba(${PROFILE_COLOURS[s]},0.35)`;
    ctx.fillRect(lx - 28, top - 17, 22, 10);
    ctx.fillStyle = `rgb(${PROFILE_COLOURS[s]})`;
    ctx.fillRect(lx - 28, top - 13, 22, 2);
    ctx.fillStyle = "#222";
    lx -= 44;
  }
}
