// biasviz explorer, part 1 of 5: the page's data, its decoding (see encode.py for the packing) and numbers.
// The four parts run in order inside one function scope (explorer.html); explorer.js starts the page.
window.biasvizStartMs = performance.now();
const DATA = JSON.parse(document.getElementById("biasviz-data").textContent);
window.biasvizParsedMs = performance.now();
const T = DATA.seq_len;
const H = DATA.n_heads;
const SUMMARY = DATA.summary; // a summary file: block means over samples ({block, samples}), or null
const B = SUMMARY ? SUMMARY.block : 1;
const STEPS = DATA.steps; // a sweep's training steps (one page set per checkpoint), or null
const NAN_CODE = 0xffff;
const CACHE_LIMIT = 512 * 1024 * 1024; // bytes of decoded detail kept; the oldest go first
const $ = (id) => document.getElementById(id);

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

// The value of a decoded level at position (i, j): the cell (or block) that holds it.
function valueAt(lv, i, j) {
  return lv.at(Math.floor(i / lv.f) * lv.n + Math.floor(j / lv.f));
}

// What a level's numbers are worth, in words.
function precisionOf(lv) {
  if (lv.exact) return "exact";
  if (lv.f === B) return `16-bit, ± ${fmt4(lv.step / 2)}`;
  return `mean of a ${lv.f}x${lv.f} block, 16-bit`;
}

// A - B from A's and B's levels: each cell is A's cell minus B's (exact minus exact is float32 arithmetic,
// as numpy subtracts the stored float32 values). Its cells are the finer of the two levels' cells.
function differenceLevel(a, b) {
  const f = Math.min(a.f, b.f);
  const n = Math.ceil(T / f);
  const exact = a.exact && b.exact;
  const at = (k) => {
    const i = Math.floor(k / n) * f;
    const j = (k % n) * f;
    const d = valueAt(a, i, j) - valueAt(b, i, j);
    return exact ? Math.fround(d) : d;
  };
  const what = exact ? "exact" : `A ${precisionOf(a)}, B ${precisionOf(b)}`;
  return { n, f, exact, bytes: 0, at, what, step: (a.step || 0) + (b.step || 0) };
}

// Python's format(v, ".4g"), ties to even included, so the page shows what numpy/h5py users print; except
// that a negative zero (ALiBi's diagonal, -m * 0) reads "0", as on the figures: no "-0" anywhere.
function fmt4(v) {
  if (Number.isNaN(v)) return "nan";
  if (!Number.isFinite(v)) return v > 0 ? "inf" : "-inf";
  if (v === 0) return "0";
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

const LUTS = Object.fromEntries(Object.keys(DATA.cmaps).map((name) => [name, base64Bytes(DATA.cmaps[name])]));

// What each kind is called: in the controls and caption, and (short) on the profile's value axis.
const KIND_NAMES = { bias: "bias", weights: "attention weights", scores: "scores (softmax input)",
  positional: "positional logits P" };
const KIND_AXIS = { bias: "bias", weights: "weight", scores: "score", positional: "P" };
