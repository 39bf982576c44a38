// biasviz explorer, part 4 of 5: the current view as a PNG or an SVG file, made in the page (no network).
// Every visible canvas of the view is placed where it is on screen; every visible label is text (SVG <text>).

function viewRoot() {
  return state.focus === null ? $("grid") : $("focus");
}

function visible(el) {
  const r = el.getBoundingClientRect();
  return r.width > 0 && r.height > 0 && !el.closest("[hidden]");
}

// What the view shows: its canvases and text labels, in pixels from the view's top left (below a title line).
function viewParts() {
  const root = viewRoot();
  const box = root.getBoundingClientRect();
  const head = 48;
  const pad = 12; // a white margin all round
  const canvases = Array.from(root.querySelectorAll("canvas")).filter(visible).map((cv) => {
    const r = cv.getBoundingClientRect();
    return { canvas: cv, x: r.left - box.left + pad, y: r.top - box.top + head, w: r.width, h: r.height };
  });
  const labels = Array.from(root.querySelectorAll("figcaption, .cbar span, #focus-title, .fplot-label"))
    .filter(visible).map((el) => {
      const r = el.getBoundingClientRect();
      const style = getComputedStyle(el);
      const centred = style.textAlign === "center";
      return { text: el.textContent, x: (centred ? r.left + r.width / 2 : r.left) - box.left + pad,
        y: r.top - box.top + head + r.height * 0.78, size: parseFloat(style.fontSize), centred,
        bold: Number(style.fontWeight) >= 600 };
    });
  labels.unshift({ text: document.querySelector("header h1").textContent, x: pad, y: 24, size: 15, bold: true },
    { text: $("where").textContent, x: pad, y: 42, size: 12 });
  return { width: Math.ceil(box.width) + 2 * pad, height: Math.ceil(box.height) + head + pad, canvases, labels };
}

function fileName(ext) {
  const step = STEPS ? `_step${STEPS[state.step]}` : "";
  const view = state.focus === null ? "heads" : `head${state.focus}`;
  return `biasviz_${state.source}_layer${state.layer}_${state.kind}_sample-${state.sample}${step}_${view}.${ext}`;
}

async function exportPNG() {
  const parts = viewParts();
  const out = document.createElement("canvas");
  out.width = parts.width;
  out.height = parts.height;
  const ctx = out.getContext("2d");
  ctx.fillStyle = "#fff";
  ctx.fillRect(0, 0, out.width, out.height);
  ctx.imageSmoothingEnabled = false; // cells stay sharp, as on screen
  for (const p of parts.canvases) ctx.drawImage(p.canvas, p.x, p.y, p.w, p.h);
  ctx.fillStyle = "#1d1d1f";
  for (const l of parts.labels) {
    ctx.font = `${l.bold ? "bold " : ""}${l.size}px system-ui, sans-serif`;
    ctx.textAlign = l.centred ? "center" : "left";
    ctx.fillText(l.text, l.x, l.y);
  }
  return new Promise((resolve) => out.toBlob(resolve, "image/png"));
}

function exportSVG() {
  const parts = viewParts();
  // SVG's namespace name (an identifier, never fetched), spelled so that the page holds no address at all
  const NS = ["http", "//www.w3.org/2000/svg"].join(":");
  const svg = document.createElementNS(NS, "svg");
  const attrs = (el, values) => { for (const [k, v] of Object.entries(values)) el.setAttribute(k, String(v)); return el; };
  attrs(svg, { xmlns: NS, width: parts.width, height: parts.height, viewBox: `0 0 ${parts.width} ${parts.height}` });
  svg.appendChild(attrs(document.createElementNS(NS, "rect"), { width: "100%", height: "100%", fill: "#fff" }));
  for (const p of parts.canvases) {
    svg.appendChild(attrs(document.createElementNS(NS, "image"), { x: p.x, y: p.y, width: p.w, height: p.h,
      href: p.canvas.toDataURL("image/png"), preserveAspectRatio: "none", style: "image-rendering: pixelated" }));
  }
  for (const l of parts.labels) {
    const text = attrs(document.createElementNS(NS, "text"), { x: l.x, y: l.y, "font-size": l.size,
      "font-family": "system-ui, sans-serif", "text-anchor": l.centred ? "middle" : "start",
      "font-weight": l.bold ? "bold" : "normal", fill: "#1d1d1f" });
    text.textContent = l.text; // text, never markup, whatever the label holds
    svg.appendChild(text);
  }
  const xml = new XMLSerializer().serializeToString(svg);
  return new Blob([`<?xml version="1.0" encoding="UTF-8"?>\n${xml}\n`], { type: "image/svg+xml" });
}

async function exportView(format) {
  return format === "svg" ? exportSVG() : exportPNG();
}

async function download(format) {
  const blob = await exportView(format);
  const a = document.createElement("a");
  a.href = URL.createObjectURL(blob);
  a.download = fileName(format);
  document.body.appendChild(a);
  a.click();
  a.remove();
  setTimeout(() => URL.revokeObjectURL(a.href), 1000);
}
