// biasviz explorer, part 3 of 5: the focused head's position measures (docs/position-measures.md), under its distance profile.

// One small plot: a line per file with its 95 % interval (mean ± 1.96 SE) shaded, where the file holds the SE.
function measurePanel(ctx, box, series, xs, opts) {
  const [x0, y0, w, h] = box;
  let lo = 0;
  let hi = -Infinity;
  for (const s of series) {
    if (!s) continue;
    s.mean.forEach((m, k) => {
      if (Number.isNaN(m)) return;
      const e = s.se && !Number.isNaN(s.se[k]) ? 1.96 * s.se[k] : 0;
      hi = Math.max(hi, m + e);
    });
  }
  if (opts.reference !== undefined) hi = Math.max(hi, opts.reference);
  if (!(hi > lo)) hi = lo + 1;
  const [xa, xb] = opts.xrange;
  const X = (x) => x0 + (w * (x - xa)) / (xb - xa);
  const Y = (v) => y0 + (h * (hi - v)) / (hi - lo);
  series.forEach((s, f) => {
    if (!s) return;
    const run = (draw) => {
      let open = false;
      s.mean.forEach((m, k) => {
        if (Number.isNaN(m)) { open = false; return; }
        draw(k, open);
        open = true;
      });
    };
    if (s.se) {
      ctx.fillStyle = `rgba(${PROFILE_COLOURS[f]},0.22)`;
      ctx.beginPath();
      const up = [];
      const down = [];
      s.mean.forEach((m, k) => {
        if (Number.isNaN(m) || Number.isNaN(s.se[k])) return;
        up.push([X(xs[k]), Y(m + 1.96 * s.se[k])]);
        down.push([X(xs[k]), Y(Math.max(m - 1.96 * s.se[k], 0))]); // a weight is never below 0
      });
      for (const [x, y] of up) ctx.lineTo(x, y);
      for (const [x, y] of down.reverse()) ctx.lineTo(x, y);
      ctx.fill();
    }
    ctx.strokeStyle = `rgb(${PROFILE_COLOURS[f]})`;
    ctx.lineWidth = 1.5;
    ctx.beginPath();
    run((k, open) => (open ? ctx.lineTo(X(xs[k]), Y(s.mean[k])) : ctx.moveTo(X(xs[k]), Y(s.mean[k]))));
    ctx.stroke();
  });
  ctx.lineWidth = 1;
  ctx.strokeStyle = "#444";
  ctx.fillStyle = "#222";
  if (opts.reference !== undefined) {
    ctx.setLineDash([2, 3]);
    ctx.beginPath();
    ctx.moveTo(x0, Y(opts.reference));
    ctx.lineTo(x0 + w, Y(opts.reference));
    ctx.stroke();
    ctx.setLineDash([]);
  }
  ctx.strokeRect(x0 + 0.5, y0 + 0.5, w - 1, h);
  ctx.font = "11px system-ui, sans-serif";
  ctx.textAlign = "center";
  ctx.textBaseline = "top";
  for (const [x, label] of opts.xticks) {
    ctx.fillRect(X(x), y0 + h, 1, 4);
    ctx.fillText(label, X(x), y0 + h + 6);
  }
  ctx.fillText(opts.xlabel, x0 + w / 2, y0 + h + 22);
  ctx.textAlign = "right";
  ctx.textBaseline = "middle";
  for (const v of niceTicks(lo, hi, 4)) {
    ctx.fillRect(x0 - 4, Y(v), 4, 1);
    ctx.fillText(fmt4(v), x0 - 6, Y(v));
  }
  ctx.textAlign = "left";
  ctx.textBaseline = "alphabetic";
  ctx.fillText(opts.title, x0, y0 - 8);
}

// Band mass (the weight per distance, each bin's weight over its width, on a log axis of distance + 1) and
// context mass (the weight on each tenth of the keys a query sees, earliest first; dotted: uniform).
function drawMeasures(cv, sets, names, head) {
  const ctx = cv.getContext("2d");
  const w = cv.width;
  const h = cv.height;
  ctx.clearRect(0, 0, w, h);
  const first = sets.find((s) => s);
  const top = 44;
  const bottom = 44;
  const gap = 72;
  const left = 64;
  const panel = (w - left - gap - 36) / 2; // room on the right for the last tick's label
  const mid = first.bins.map(([a, b]) => Math.log10((a + b) / 2 + 1));
  const most = Math.log10(first.bins[first.bins.length - 1][1] + 1);
  const decades = [];
  for (let p = 1; p <= 10 ** most + 1e-9; p *= 10) decades.push([Math.log10(p), String(p)]);
  measurePanel(ctx, [left, top, panel, h - top - bottom], sets.map((s) => s && s.band), mid, {
    xrange: [0, Math.max(most, 1)], xticks: decades, xlabel: "distance i - j + 1 (log)",
    title: `Head ${head}: weight per distance, mean over queries`,
  });
  const tenths = Array.from({ length: first.context.mean.length }, (_, k) => (k + 0.5) / first.context.mean.length);
  measurePanel(ctx, [left + panel + gap, top, panel, h - top - bottom], sets.map((s) => s && s.context), tenths, {
    xrange: [0, 1], xticks: [[0, "0 earliest"], [0.5, "0.5"], [1, "1 latest"]], reference: 1 / tenths.length,
    xlabel: "place among the keys a query sees", title: "Weight on each tenth of the keys seen (dotted: even)",
  });
  const banded = sets.some((s) => s && s.band.se);
  ctx.fillStyle = "#222";
  ctx.font = "11px system-ui, sans-serif";
  ctx.textAlign = "left";
  ctx.fillText(banded ? "shaded: 95 % interval of the mean over samples (± 1.96 SE)"
    : "no 95 % band: a standard error needs 3 samples or more", left, 14);
  let lx = w - 12;
  ctx.textAlign = "left";
  for (let s = names.length - 1; s >= 0; s--) {
    if (!sets[s]) continue;
    lx -= ctx.measureText(names[s]).width;
    ctx.fillText(names[s], lx, 14);
    ctx.fillStyle = `rgb(${PROFILE_COLOURS[s]})`;
    ctx.fillRect(lx - 28, 10, 22, 2);
    ctx.fillStyle = "#222";
    lx -= 44;
  }
}
