  // 00-util.js: constants, colours (the viridis LUT), DOM and number helpers, base64 and inflate, the shared tooltip.

  /* ----------------------------------------------------------------- constants and colours */

  var HM = 640;          // heatmap side, CSS px
  var LM = 116;          // left margin: query labels
  var TM = 86;           // top margin: key labels
  var PGAP = 6;          // gap before the phantom column
  var PW = 16;           // phantom column width
  var VGAP = 6;          // gap above the value-norm strip
  var VH = 26;           // value-norm strip height
  var RM = 10;           // right margin
  var BM = 8;            // bottom margin
  var MAX_CELL = 48;     // most CSS px per token when zoomed in
  var LABEL_MIN = 9;     // cells at least this tall/wide get token text, else index ticks
  var FONT_MONO = 'ui-monospace, SFMono-Regular, Menlo, Consolas, "Liberation Mono", monospace';
  var FONT_SANS = '-apple-system, "Segoe UI", Helvetica, Arial, sans-serif';

  // viridis at 0, 0.1, ..., 1 (matplotlib), interpolated to 256 entries
  var VIRIDIS = ["440154", "482475", "414487", "355f8d", "2a788e", "21918c",
                 "22a884", "44bf70", "7ad151", "bddf26", "fde725"];

  function buildLut(stops, n) {
    var rgb = stops.map(function (h) {
      return [parseInt(h.slice(0, 2), 16), parseInt(h.slice(2, 4), 16), parseInt(h.slice(4, 6), 16)];
    });
    var out = new Uint8Array(n * 3);
    for (var i = 0; i < n; i++) {
      var t = i / (n - 1) * (rgb.length - 1);
      var j = Math.min(Math.floor(t), rgb.length - 2);
      var f = t - j;
      for (var c = 0; c < 3; c++) out[i * 3 + c] = Math.round(rgb[j][c] * (1 - f) + rgb[j + 1][c] * f);
    }
    return out;
  }

  var LUT = buildLut(VIRIDIS, 256);                 // t in [0, 1] -> rgb
  var WHITE32 = packRgb(255, 255, 255);
  var MASK32 = packRgb(241, 241, 239);              // key after query (causal mask)
  var MASK_CSS = "#f1f1ef";
  var NULL_CSS = "#d9d9d9";                         // no metric value

  function packRgb(r, g, b) {
    // ImageData bytes are r, g, b, a in memory; a Uint32 view reads them in platform byte order
    if (new Uint8Array(new Uint32Array([1]).buffer)[0] === 1) return ((255 << 24) | (b << 16) | (g << 8) | r) >>> 0;
    return ((r << 24) | (g << 16) | (b << 8) | 255) >>> 0;
  }

  function lutCss(t) {
    var i = Math.max(0, Math.min(255, Math.round(t * 255))) * 3;
    return "rgb(" + LUT[i] + "," + LUT[i + 1] + "," + LUT[i + 2] + ")";
  }

  // The explorer's one colour scale, t in [0, 1] from low to high: viridis reversed, light = low and
  // dark = high, in the heads grid, the pattern, the text view and both legends alike (and the
  // report's heatmaps, viridis_r). Dark = high because a pattern is mostly near-zero weights: they
  // stay light, next to the white of an unstored cell.
  function scaleCss(t) { return lutCss(1 - t); }

  // the 256 colours a weight can take: index 0 = nothing stored, 1..255 = t from 0 to 1, on the
  // scale of scaleCss (light = small, dark = large).
  var PAL32 = new Uint32Array(256);
  var PAL_CSS = new Array(256);
  var PAL_TEXT = new Array(256);
  (function () {
    PAL32[0] = WHITE32;
    PAL_CSS[0] = "";
    PAL_TEXT[0] = "";
    for (var i = 1; i < 256; i++) {
      var t = (i - 1) / 254;
      var j = Math.round((1 - t) * 255) * 3;        // scaleCss(t): viridis reversed (light = small)
      var r = LUT[j], g = LUT[j + 1], b = LUT[j + 2];
      PAL32[i] = packRgb(r, g, b);
      PAL_CSS[i] = "rgb(" + r + "," + g + "," + b + ")";
      PAL_TEXT[i] = (0.2126 * r + 0.7152 * g + 0.0722 * b) < 140 ? "#fff" : "#111";
    }
  })();

  /* ----------------------------------------------------------------- small helpers */

  function el(tag, cls, text) {
    var e = document.createElement(tag);
    if (cls) e.className = cls;
    if (text !== undefined && text !== null) e.textContent = text;
    return e;
  }

  function clamp(v, lo, hi) { return v < lo ? lo : (v > hi ? hi : v); }

  function fmtWeight(w) {
    if (w === 0) return "0";
    return Number(w.toPrecision(4)).toString();
  }

  function fmtMetric(v) {
    if (v === null || v === undefined || typeof v !== "number" || !isFinite(v)) return "—";
    var a = Math.abs(v);
    if (a !== 0 && (a < 1e-3 || a >= 1e5)) return v.toExponential(2);
    return Number(v.toPrecision(3)).toString();
  }

  // how a token reads in labels and tooltips: whitespace made visible
  function tokenLabel(s) {
    if (s === undefined || s === null) return "";
    s = String(s);
    if (s.length === 0) return "∅";
    if (/^ +$/.test(s)) return s.replace(/ /g, "␣");
    return s.replace(/\r\n|\n/g, "↵").replace(/\r/g, "␍").replace(/\t/g, "⇥")
            .replace(/[\u0000-\u0008\u000b\u000c\u000e-\u001f\u007f]/g, "�");
  }

  function quoted(s) { return "“" + tokenLabel(s) + "”"; }

  function niceStep(minTokens) {
    var steps = [1, 2, 5];
    for (var p = 1; ; p *= 10) {
      for (var i = 0; i < steps.length; i++) if (steps[i] * p >= minTokens) return steps[i] * p;
      if (p > 1e9) return p;
    }
  }

  function b64ToBytes(s) {
    if (typeof Uint8Array.fromBase64 === "function") {
      try { return Uint8Array.fromBase64(s); } catch (e) { /* fall through to atob */ }
    }
    var bin = atob(s);
    var n = bin.length;
    var out = new Uint8Array(n);
    for (var i = 0; i < n; i++) out[i] = bin.charCodeAt(i);
    return out;
  }

  function inflate(bytes) {
    var stream = new Blob([bytes]).stream().pipeThrough(new DecompressionStream("deflate"));
    return new Response(stream).arrayBuffer();
  }

  // first index in keys[lo, hi) whose value is >= k
  function lowerBound(keys, lo, hi, k) {
    while (lo < hi) {
      var mid = (lo + hi) >>> 1;
      if (keys[mid] < k) lo = mid + 1; else hi = mid;
    }
    return lo;
  }

  function nextFrame() {
    return new Promise(function (resolve) { requestAnimationFrame(function () { resolve(); }); });
  }

  // scroll the page (only if needed) so that a client point is inside the viewport; true if it scrolled
  function scrollToPoint(p) {
    var vw = document.documentElement.clientWidth || window.innerWidth;
    var vh = document.documentElement.clientHeight || window.innerHeight;
    var dx = 0, dy = 0;
    if (p.y < 8 || p.y > vh - 8) dy = p.y - vh / 2;
    if (p.x < 8 || p.x > vw - 8) dx = p.x - vw / 2;
    if (!dx && !dy) return false;
    var sx = window.scrollX, sy = window.scrollY;
    window.scrollBy(dx, dy);
    return window.scrollX !== sx || window.scrollY !== sy;
  }

  // one tooltip shared by every explorer on the page (moved into the section being hovered), so
  // that ".sx-tooltip" names exactly one element
  var sharedTip = null;

