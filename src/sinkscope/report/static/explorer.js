/* sinkscope attention explorer (heads overview, a head's pattern, the text view).
 *
 * A plain script, no dependencies and nothing fetched: it is inlined into the report page after
 * the explorer sections. Every element with a data-sinkscope-explorer attribute holds its data as
 * JSON in a child <script type="application/json" class="sx-data">; this script builds the UI in
 * that element. The data contract and the block layout are described in
 * src/sinkscope/report/explorer.py and src/sinkscope/store/explorer_format.py.
 *
 * Page API: window.sinkscopeExplorer (the first explorer), window.sinkscopeExplorers (all), each
 * with ready, weight(), phantom(), open(), cellCenter(), headCenter(), setZoom(), resetZoom().
 */
(function () {
  "use strict";

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

  // the 256 colours a weight can take: index 0 = nothing stored, 1..255 = t from 0 to 1. Weights
  // run from light (small) to dark (large) so that the lightness grows monotonically from the white
  // of an unstored cell; the heads grid keeps viridis the way round the report's figures draw it.
  var PAL32 = new Uint32Array(256);
  var PAL_CSS = new Array(256);
  var PAL_TEXT = new Array(256);
  (function () {
    PAL32[0] = WHITE32;
    PAL_CSS[0] = "";
    PAL_TEXT[0] = "";
    for (var i = 1; i < 256; i++) {
      var t = (i - 1) / 254;
      var j = Math.round((1 - t) * 255) * 3;        // weights: viridis reversed (light = small)
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

  /* ----------------------------------------------------------------- the explorer */

  function Explorer(root, number) {
    this.root = root;
    this.number = number;
    this.data = null;
    this.error = null;
    this.firstPaintAt = null;   // performance.now() when a pattern was first painted
    this.lastDrawMs = null;     // how long the last pattern redraw took
    this.drawCount = 0;
    var self = this;
    try {
      var node = root.querySelector("script.sx-data, .sx-data");
      if (!node) throw new Error("no .sx-data element");
      this.data = JSON.parse(node.textContent);
      this._setup();
    } catch (err) {
      this.error = String(err && err.message ? err.message : err);
      var box = el("div", "sx-root");
      box.appendChild(el("div", "sx-error", "The attention explorer could not read its data: " + this.error));
      root.appendChild(box);
      this.ready = Promise.resolve({ blocks: 0, decoded: 0, failed: 0, error: this.error });
      return;
    }
    this.ready = this._startDecoding().then(function () {
      var failed = self.blockList.filter(function (b) { return b.failed; }).length;
      return { blocks: self.blockList.length, decoded: self.blockList.length - failed, failed: failed };
    });
  }

  var P = Explorer.prototype;

  P._setup = function () {
    var d = this.data;
    this.L = d.n_layers | 0;
    this.H = d.n_heads | 0;
    this.scale = +d.weight_scale || 1 / 65535;
    this.threshold = +d.threshold || 0;
    this.hasPhantom = !!d.has_phantom;
    this.hasVnorm = !!d.has_value_norms;
    this.metrics = Array.isArray(d.metrics) ? d.metrics : [];
    this.windows = Array.isArray(d.windows) ? d.windows : [];
    this.heads = Array.isArray(d.heads) ? d.heads : [];
    this.metricPos = 0;
    this.scaleMode = "log";

    this.winPos = new Map();
    for (var i = 0; i < this.windows.length; i++) {
      if (!this.winPos.has(this.windows[i].index)) this.winPos.set(this.windows[i].index, i);
    }
    this.headPos = new Map();
    for (var h = 0; h < this.heads.length; h++) {
      var key = this.heads[h].layer * 100000 + this.heads[h].head;
      if (!this.headPos.has(key)) this.headPos.set(key, h);
    }
    this.blockMap = new Map();
    this.blockList = [];
    var blocks = Array.isArray(d.blocks) ? d.blocks : [];
    for (var b = 0; b < blocks.length; b++) {
      var bl = blocks[b];
      if (!(bl.window >= 0 && bl.window < this.windows.length && bl.head >= 0 && bl.head < this.heads.length)) continue;
      var id = bl.window * this.heads.length + bl.head;
      if (this.blockMap.has(id)) continue;
      var rec = { wi: bl.window, hi: bl.head, n: bl.n, text: bl.data, T: this.windows[bl.window].tokens.length,
                  promise: null, dec: null, failed: false };
      this.blockMap.set(id, rec);
      this.blockList.push(rec);
      bl.data = null;     // the record holds the text until it is decoded
    }
    this._buildLuts();

    this.cur = null;          // {wi, hi, blk, layer, head} of the pattern shown
    this.sel = null;          // {layer, head} selected in the grid (stored or not)
    this.selWindow = this.windows.length ? this.windows[0].index : 0;
    this.view = { s: 1, ox: 0, oy: 0 };
    this.hover = null;        // {kind: "cell"|"phantom"|"vnorm", q, k}
    this.textQuery = null;    // query hovered in the text view
    this.gridHover = null;
    this.drawPending = false;
    this.drawWaiters = [];
    this.openSeq = 0;
    this.centers = [];

    this._buildDom();
    this._layoutGrid();
    this._drawGrid();
    this._updateMetricLegend();
    this._updatePatternLegend();
    this._bindGlobal();
  };

  // code -> colour index (0 = nothing, 1..255) for the log and linear scales
  P._buildLuts = function () {
    var lo = this.threshold > 0 ? this.threshold : this.scale;
    if (!(lo < 1)) lo = this.scale;
    this.logLo = lo;
    var logLo = Math.log(lo), span = -logLo;
    var lg = new Uint8Array(65536), ln = new Uint8Array(65536);
    for (var c = 1; c < 65536; c++) {
      var w = c * this.scale;
      var t = (Math.log(w) - logLo) / span;
      lg[c] = 1 + Math.round(clamp(t, 0, 1) * 254);
      ln[c] = 1 + Math.round(clamp(w, 0, 1) * 254);
    }
    this.lutLog = lg;
    this.lutLin = ln;
    this.lut = lg;
  };

  // colour index of a weight given as a number (phantom mass)
  P._colorIndex = function (w) {
    if (!(w > 0)) return 0;
    var t = this.scaleMode === "log" ? (Math.log(w) - Math.log(this.logLo)) / -Math.log(this.logLo) : w;
    return 1 + Math.round(clamp(t, 0, 1) * 254);
  };

  /* ----------------------------------------------------------------- DOM */

  P._buildDom = function () {
    var self = this, d = this.data;
    var root = this.root;
    root.classList.add("sx-explorer");
    var box = this.box = el("div", "sx-root");

    var head = el("div", "sx-header");
    head.appendChild(el("span", "sx-title", "Attention explorer"));
    if (d.label) head.appendChild(el("span", "sx-label", String(d.label)));
    head.appendChild(el("span", "sx-sub", this.L + " layers × " + this.H + " heads · " + this.heads.length +
      " head" + (this.heads.length === 1 ? "" : "s") + " stored on " + this.windows.length + " window" +
      (this.windows.length === 1 ? "" : "s")));
    box.appendChild(head);

    // heads overview
    var top = el("div", "sx-row sx-top");
    var gridBox = this.gridBox = el("div", "sx-gridbox");
    this.gridCanvas = el("canvas", "sx-grid");
    this.gridCanvas.setAttribute("aria-label", "layer by head grid; click a head to open its pattern");
    gridBox.appendChild(this.gridCanvas);
    this.gridTip = el("div", "sx-gridtip");
    top.appendChild(gridBox);

    var side = el("div", "sx-side");
    var mrow = el("label", "sx-field");
    mrow.appendChild(el("span", "sx-field-name", "Colour heads by"));
    var msel = this.metricSelect = el("select", "sx-metric");
    this.metrics.forEach(function (m, i) {
      var o = el("option", null, m.label || m.name);
      o.value = String(m.name !== undefined && m.name !== null ? m.name : i);
      o.title = String(m.name);
      msel.appendChild(o);
    });
    if (!this.metrics.length) { msel.appendChild(el("option", null, "(no metric)")); msel.disabled = true; }
    mrow.appendChild(msel);
    side.appendChild(mrow);
    this.metricLegend = el("div", "sx-legend sx-metric-legend");
    side.appendChild(this.metricLegend);
    this.headInfo = el("div", "sx-headinfo");
    side.appendChild(this.headInfo);
    var chipsTitle = el("div", "sx-field-name", "Stored heads (click to open)");
    side.appendChild(chipsTitle);
    var chips = this.chips = el("div", "sx-chips");
    this.chipEls = [];
    this.heads.forEach(function (hd, i) {
      var c = el("button", "sx-chip", "L" + hd.layer + " H" + hd.head);
      c.type = "button";
      c.title = "layer " + hd.layer + ", head " + hd.head + " (" + hd.chosen + ")";
      c.setAttribute("data-chosen", String(hd.chosen));
      c.addEventListener("click", function () { self._userOpen(hd.layer, hd.head); });
      chips.appendChild(c);
      self.chipEls[i] = c;
    });
    side.appendChild(chips);
    top.appendChild(side);
    box.appendChild(top);

    // pattern controls
    var bar = el("div", "sx-controls");
    this.headTitle = el("span", "sx-headtitle", "");
    bar.appendChild(this.headTitle);
    if (this.windows.length > 1) {
      var wsel = this.windowSelect = el("select", "sx-window");
      wsel.setAttribute("aria-label", "window");
      this.windows.forEach(function (w) {
        var o = el("option", null, "window " + w.index);
        o.value = String(w.index);
        wsel.appendChild(o);
      });
      bar.appendChild(wsel);
      this.windowLength = el("span", "sx-windowlen", "");
      bar.appendChild(this.windowLength);
    } else if (this.windows.length === 1) {
      bar.appendChild(el("span", "sx-windowname", "window " + this.windows[0].index + " · " +
        this.windows[0].tokens.length + " tokens"));
    }
    var ssel = this.scaleSelect = el("select", "sx-scale");
    ssel.setAttribute("aria-label", "colour scale");
    var slab = el("label", "sx-field-inline");
    slab.appendChild(el("span", "sx-muted", "colour"));
    slab.appendChild(ssel);
    [["log", "log"], ["linear", "linear"]].forEach(function (p) {
      var o = el("option", null, p[1]);
      o.value = p[0];
      ssel.appendChild(o);
    });
    bar.appendChild(slab);
    var zoom = el("span", "sx-zoom");
    this.zoomOut = el("button", "sx-btn sx-zoom-out", "−");
    this.zoomIn = el("button", "sx-btn sx-zoom-in", "+");
    this.zoomReset = el("button", "sx-btn sx-zoom-reset", "reset");
    [this.zoomOut, this.zoomIn, this.zoomReset].forEach(function (b) { b.type = "button"; zoom.appendChild(b); });
    this.zoomOut.title = "zoom out";
    this.zoomIn.title = "zoom in (or use the mouse wheel; drag to pan)";
    this.zoomReset.title = "show the whole window";
    this.zoomLabel = el("span", "sx-zoomlabel", "");
    zoom.appendChild(this.zoomLabel);
    bar.appendChild(zoom);
    this.patternLegend = el("div", "sx-legend sx-pattern-legend");
    bar.appendChild(this.patternLegend);
    box.appendChild(bar);

    this.message = el("div", "sx-message");
    this.message.hidden = true;
    box.appendChild(this.message);

    // the pattern and the text view
    var main = this.main = el("div", "sx-row sx-main");
    var pbox = this.patternBox = el("div", "sx-patternbox");
    this.cssW = LM + HM + (this.hasPhantom ? PGAP + PW : 0) + RM;
    this.cssH = TM + HM + (this.hasVnorm ? VGAP + VH : 0) + BM;
    this.canvas = el("canvas", "sx-pattern");
    this.canvas.setAttribute("aria-label", "attention pattern: queries as rows, keys as columns");
    this.overlay = el("canvas", "sx-overlay");
    this.overlay.setAttribute("aria-hidden", "true");
    pbox.appendChild(this.canvas);
    pbox.appendChild(this.overlay);
    main.appendChild(pbox);

    var tbox = this.textBox = el("div", "sx-textbox");
    this.textStatus = el("div", "sx-textstatus", "Hover a token: the tokens before it are coloured by its attention to them.");
    this.text = el("div", "sx-text");
    this.text.style.maxHeight = this.cssH - 40 + "px";
    tbox.appendChild(this.textStatus);
    tbox.appendChild(this.text);
    main.appendChild(tbox);
    box.appendChild(main);

    if (Array.isArray(d.notes) && d.notes.length) {
      var ul = el("ul", "sx-notes");
      d.notes.forEach(function (n) { ul.appendChild(el("li", null, String(n))); });
      box.appendChild(ul);
    }
    if (typeof DecompressionStream === "undefined") {
      box.appendChild(el("div", "sx-error", "This browser cannot decompress the stored patterns " +
        "(it lacks DecompressionStream); open the report in a current Chrome, Firefox or Safari."));
    }
    root.appendChild(box);
    root.appendChild(this.gridTip);

    if (!sharedTip) {
      sharedTip = el("div", "sx-tooltip");
      sharedTip.setAttribute("role", "tooltip");
      root.appendChild(sharedTip);
    }

    this.ctx = this.canvas.getContext("2d");
    this.octx = this.overlay.getContext("2d");
    this._sizeCanvases();
    this._bindPattern();
    this._bindGrid();
    this._bindText();

    msel.addEventListener("change", function () {
      self.metricPos = Math.max(0, msel.selectedIndex);
      self._drawGrid();
      self._updateMetricLegend();
      self._updateHeadInfo();
    });
    ssel.addEventListener("change", function () { self.setScale(ssel.value); });
    if (this.windowSelect) {
      this.windowSelect.addEventListener("change", function () {
        var w = Number(self.windowSelect.value);
        self.selWindow = w;
        if (self.sel) self._userOpen(self.sel.layer, self.sel.head);
      });
    }
    this.zoomIn.addEventListener("click", function () { self._zoomAt(1.6, HM / 2, HM / 2); });
    this.zoomOut.addEventListener("click", function () { self._zoomAt(1 / 1.6, HM / 2, HM / 2); });
    this.zoomReset.addEventListener("click", function () { self.resetZoom(); });
  };

  P._sizeCanvases = function () {
    var dpr = window.devicePixelRatio || 1;
    this.dpr = dpr;
    var pairs = [[this.canvas, this.cssW, this.cssH], [this.overlay, this.cssW, this.cssH]];
    pairs.forEach(function (p) {
      p[0].width = Math.round(p[1] * dpr);
      p[0].height = Math.round(p[2] * dpr);
      p[0].style.width = p[1] + "px";
      p[0].style.height = p[2] + "px";
    });
    // the heatmap's device pixels
    this.hmX = Math.round(LM * dpr);
    this.hmY = Math.round(TM * dpr);
    this.hmW = Math.round(HM * dpr);
    this.hmScale = this.hmW / HM;     // device px per CSS px inside the heatmap
    this.img = this.ctx.createImageData(this.hmW, this.hmW);
    this.pix = new Uint32Array(this.img.data.buffer);
    this.idx = new Uint8Array(this.hmW * this.hmW);
    this.phW = Math.max(1, Math.round(PW * dpr));
    this.phImg = this.ctx.createImageData(this.phW, this.hmW);
    this.phPix = new Uint32Array(this.phImg.data.buffer);
    this.labelCache = new Map();
  };

  P._bindGlobal = function () {
    var self = this, timer = null;
    window.addEventListener("resize", function () {
      if (timer) clearTimeout(timer);
      timer = setTimeout(function () {
        timer = null;
        var dprChanged = (window.devicePixelRatio || 1) !== self.dpr;
        if (dprChanged) { self._sizeCanvases(); if (self.cur) self._requestDraw(); }
        self._layoutGrid();
        self._drawGrid();
      }, 150);
    });
  };

  /* ----------------------------------------------------------------- decoding */

  P._ensure = function (blk) {
    var self = this;
    if (blk.promise) return blk.promise;
    blk.promise = Promise.resolve().then(function () {
      if (typeof DecompressionStream === "undefined") throw new Error("DecompressionStream is not available");
      return inflate(b64ToBytes(blk.text));
    }).then(function (buf) {
      var T = blk.T, off = 0;
      if (buf.byteLength < 12 * T + 4) throw new Error("block too short");
      var indptr = new Int32Array(buf, 0, T + 1); off += 4 * (T + 1);
      var vnorm = new Float32Array(buf, off, T); off += 4 * T;
      var phantom = new Float32Array(buf, off, T); off += 4 * T;
      var N = indptr[T];
      if (indptr[0] !== 0 || N < 0 || buf.byteLength !== off + 6 * N) throw new Error("block size does not match its row index");
      var keys = new Uint32Array(buf, off, N); off += 4 * N;
      var codes = new Uint16Array(buf, off, N);
      var vmax = 0, pmax = 0;
      for (var i = 0; i < T; i++) {
        if (vnorm[i] > vmax) vmax = vnorm[i];
        if (phantom[i] > pmax) pmax = phantom[i];
      }
      blk.dec = { T: T, N: N, indptr: indptr, vnorm: vnorm, phantom: phantom, keys: keys, codes: codes,
                  vmax: vmax, pmax: pmax };
      blk.text = null;   // the base64 text is no longer needed
    }).catch(function (err) {
      blk.failed = true;
      blk.error = String(err && err.message ? err.message : err);
    });
    return blk.promise;
  };

  P._startDecoding = function () {
    var self = this;
    var first = this._openInitial();
    return first.then(function () {
      var chain = Promise.resolve();
      self.blockList.forEach(function (b) { chain = chain.then(function () { return self._ensure(b); }); });
      return chain;
    });
  };

  P._openInitial = function () {
    if (!this.heads.length || !this.windows.length) {
      this._showMessage(this.heads.length ? "No window is stored for this run." :
        "No head's pattern is stored for this run; choose heads with --explore-heads.");
      this._setPatternVisible(false);
      return Promise.resolve(false);
    }
    var h0 = this.heads[0], w0 = this.windows[0].index;
    if (!this.blockMap.has(0 * this.heads.length + 0)) {
      // the contract's first view is heads[0] on windows[0]; where that pattern was left out,
      // open the first pattern the page holds instead
      var b = this.blockList[0];
      if (b) { h0 = this.heads[b.hi]; w0 = this.windows[b.wi].index; }
    }
    return this.open(h0.layer, h0.head, w0);
  };

  P._block = function (layer, head, window) {
    var wi = this._windowPos(window);
    var hi = this.headPos.get(layer * 100000 + head);
    if (wi < 0 || hi === undefined) return null;
    return this.blockMap.get(wi * this.heads.length + hi) || null;
  };

  P._windowPos = function (window) {
    if (window === undefined || window === null) {
      if (this.winPos.has(0)) return this.winPos.get(0);
      return this.windows.length ? 0 : -1;
    }
    var p = this.winPos.get(Number(window));
    return p === undefined ? -1 : p;
  };

  /* ----------------------------------------------------------------- page API */

  P.weight = function (layer, head, query, key, window) {
    if (!this.blockMap) return null;
    var blk = this._block(layer, head, window);
    if (!blk || !blk.dec) return null;
    var d = blk.dec;
    if (!Number.isInteger(query) || !Number.isInteger(key) || query < 0 || query >= d.T || key < 0 || key >= d.T) return null;
    if (key > query) return 0;
    var lo = d.indptr[query], hi = d.indptr[query + 1];
    var i = lowerBound(d.keys, lo, hi, key);
    return (i < hi && d.keys[i] === key) ? d.codes[i] * this.scale : 0;
  };

  P.phantom = function (layer, head, query, window) {
    if (!this.blockMap) return null;
    var blk = this._block(layer, head, window);
    if (!blk || !blk.dec) return null;
    if (!Number.isInteger(query) || query < 0 || query >= blk.dec.T) return null;
    return this.hasPhantom ? blk.dec.phantom[query] : 0;
  };

  P.valueNorm = function (layer, head, key, window) {
    if (!this.blockMap) return null;
    var blk = this._block(layer, head, window);
    if (!blk || !blk.dec || !this.hasVnorm) return null;
    if (!Number.isInteger(key) || key < 0 || key >= blk.dec.T) return null;
    return blk.dec.vnorm[key];
  };

  P.open = function (layer, head, window) {
    var self = this;
    if (!this.blockMap) return Promise.resolve(false);
    layer = Number(layer); head = Number(head);
    var wi = this._windowPos(window);
    if (wi >= 0) this.selWindow = this.windows[wi].index;
    this.sel = { layer: layer, head: head };
    var seq = ++this.openSeq;
    this._drawGrid();
    this._updateHeadInfo();
    this._updateTitle();
    this._syncControls();
    var hi = this.headPos.get(layer * 100000 + head);
    if (!(layer >= 0 && layer < this.L && head >= 0 && head < this.H)) {
      this._showMessage("There is no layer " + layer + ", head " + head + " in this model.");
      this._setPatternVisible(false);
      return Promise.resolve(false);
    }
    if (hi === undefined) {
      this._showMessage("Layer " + layer + ", head " + head +
        ": this head's pattern is not stored; choose it with --explore-heads");
      this._setPatternVisible(false);
      return Promise.resolve(false);
    }
    if (wi < 0) {
      this._showMessage("Window " + window + " is not stored on this page.");
      this._setPatternVisible(false);
      return Promise.resolve(false);
    }
    var blk = this.blockMap.get(wi * this.heads.length + hi);
    if (!blk) {
      var other = this.windows.filter(function (w, i) { return self.blockMap.has(i * self.heads.length + hi); })
        .map(function (w) { return w.index; });
      this._showMessage("Layer " + layer + ", head " + head + " on window " + this.windows[wi].index +
        " was left out to keep the page small" + (other.length ? " (stored on window " + other.join(", ") + ")." : "."));
      this._setPatternVisible(false);
      return Promise.resolve(false);
    }
    if (!blk.dec && !blk.failed) this._showMessage("Decoding layer " + layer + ", head " + head + "…", true);
    return this._ensure(blk).then(function () {
      if (seq !== self.openSeq) return false;
      if (!blk.dec) {
        self._showMessage("Layer " + layer + ", head " + head + ": the stored pattern could not be read (" +
          blk.error + ").");
        self._setPatternVisible(false);
        return false;
      }
      var windowChanged = !self.cur || self.cur.wi !== wi;
      self.cur = { wi: wi, hi: hi, blk: blk, layer: layer, head: head };
      self._showMessage(null);
      self._setPatternVisible(true);
      if (windowChanged) {
        self._fitView();
        self._buildText();
      } else if (self.textQuery !== null) {
        self._textHighlight(self.textQuery);
      }
      self.hover = null;
      self._hideTip();
      self._updateTitle();
      self._syncControls();
      return self._requestDraw().then(function () {
        if (self.firstPaintAt === null) self.firstPaintAt = performance.now();
        return seq === self.openSeq;
      });
    });
  };

  P.cellCenter = function (query, key) {
    if (!this.cur || this.patternHidden) return null;
    var T = this.cur.blk.T, v = this.view;
    var rect = this.canvas.getBoundingClientRect();
    var fx = rect.width / this.cssW, fy = rect.height / this.cssH;
    if (!(query >= 0 && query < T)) return null;
    var y = TM + (query + 0.5 - v.oy) * v.s;
    if (y < TM || y >= TM + HM) return null;
    var x;
    if (key === "phantom") {
      if (!this.hasPhantom) return null;
      x = LM + HM + PGAP + PW / 2;
    } else {
      if (!(key >= 0 && key < T)) return null;
      x = LM + (key + 0.5 - v.ox) * v.s;
      if (x < LM || x >= LM + HM) return null;
    }
    var out = { x: rect.left + x * fx, y: rect.top + y * fy };
    if (scrollToPoint(out)) {
      rect = this.canvas.getBoundingClientRect();
      out = { x: rect.left + x * fx, y: rect.top + y * fy };
    }
    // remembered so that a pointer sent to this point reads as this cell even where cells are
    // smaller than a pixel (see _hitTest)
    this.centers.push({ x: out.x - rect.left, y: out.y - rect.top, q: query, k: key, s: v.s, ox: v.ox, oy: v.oy });
    if (this.centers.length > 256) this.centers.splice(0, this.centers.length - 256);
    return out;
  };

  P.headCenter = function (layer, head) {
    if (!this.grid || !(layer >= 0 && layer < this.L && head >= 0 && head < this.H)) return null;
    var g = this.grid, rect = this.gridCanvas.getBoundingClientRect();
    var fx = rect.width / g.w, fy = rect.height / g.h;
    var x = g.x0 + (head + 0.5) * g.cw, y = g.y0 + (layer + 0.5) * g.ch;
    var out = { x: rect.left + x * fx, y: rect.top + y * fy };
    if (scrollToPoint(out)) {
      rect = this.gridCanvas.getBoundingClientRect();
      out = { x: rect.left + x * fx, y: rect.top + y * fy };
    }
    return out;
  };

  // factor: zoom relative to the whole window (1 = whole window); centred on (query, key)
  P.setZoom = function (factor, query, key) {
    if (!this.cur) return Promise.resolve(false);
    var T = this.cur.blk.T, v = this.view;
    var fit = HM / T;
    var cq = query === undefined || query === null ? v.oy + HM / v.s / 2 : query + 0.5;
    var ck = key === undefined || key === null ? v.ox + HM / v.s / 2 : key + 0.5;
    v.s = clamp(fit * (+factor || 1), fit, Math.max(MAX_CELL, fit));
    v.ox = ck - HM / v.s / 2;
    v.oy = cq - HM / v.s / 2;
    this._clampView();
    return this._requestDraw().then(function () { return true; });
  };

  P.resetZoom = function () {
    if (!this.cur) return Promise.resolve(false);
    this._fitView();
    return this._requestDraw().then(function () { return true; });
  };

  P.setScale = function (mode) {
    this.scaleMode = mode === "linear" ? "linear" : "log";
    this.lut = this.scaleMode === "log" ? this.lutLog : this.lutLin;
    if (this.scaleSelect && this.scaleSelect.value !== this.scaleMode) this.scaleSelect.value = this.scaleMode;
    this._updatePatternLegend();
    if (this.textQuery !== null) this._textHighlight(this.textQuery);
    return this.cur ? this._requestDraw() : Promise.resolve();
  };

  // the pattern last opened and how it is shown: layer, head, window (tokens.npy index), zoom
  // (1 = the whole window), query0/key0 (the token at the view's top-left, fractional), tokens
  // (how many tokens the view spans), scale ("log" or "linear"), shown (false while a message
  // stands in for the pattern)
  P.state = function () {
    if (!this.cur) return null;
    var v = this.view, T = this.cur.blk.T;
    return { layer: this.cur.layer, head: this.cur.head, window: this.windows[this.cur.wi].index,
             zoom: v.s / (HM / T), query0: v.oy, key0: v.ox, tokens: HM / v.s, scale: this.scaleMode,
             shown: !this.patternHidden };
  };

  P.redraw = function () { return this._requestDraw(); };

  /* ----------------------------------------------------------------- UI state */

  P._userOpen = function (layer, head) {
    this.open(layer, head, this.selWindow);
  };

  P._showMessage = function (text, transient) {
    if (!text) { this.message.hidden = true; this.message.textContent = ""; return; }
    this.message.textContent = text;
    this.message.hidden = false;
    this.message.classList.toggle("sx-transient", !!transient);
  };

  P._setPatternVisible = function (on) {
    this.patternHidden = !on;
    this.main.hidden = !on;
    this.box.classList.toggle("sx-nopattern", !on);
    if (!on) { this.hover = null; this._hideTip(); }
  };

  P._syncControls = function () {
    if (this.windowSelect && String(this.selWindow) !== this.windowSelect.value) {
      this.windowSelect.value = String(this.selWindow);
    }
    if (this.windowLength) {
      var wp = this.winPos.get(this.selWindow);
      this.windowLength.textContent = wp === undefined ? "" : this.windows[wp].tokens.length + " tokens";
    }
    var self = this;
    this.chipEls.forEach(function (c, i) {
      var h = self.heads[i];
      c.classList.toggle("sx-active", !!self.sel && h.layer === self.sel.layer && h.head === self.sel.head);
    });
  };

  P._updateTitle = function () {
    var sel = this.sel;
    this.headTitle.textContent = "";
    if (!sel) return;
    this.headTitle.appendChild(el("strong", null, "Layer " + sel.layer + ", head " + sel.head));
    var hi = this.headPos.get(sel.layer * 100000 + sel.head);
    var chosen = hi === undefined ? "not stored" : this.heads[hi].chosen;
    if (chosen) this.headTitle.appendChild(el("span", "sx-badge", String(chosen)));
  };

  P._updateHeadInfo = function () {
    var info = this.headInfo;
    info.textContent = "";
    if (!this.sel) return;
    var l = this.sel.layer, h = this.sel.head;
    var hi = this.headPos.get(l * 100000 + h);
    var t = el("div", "sx-headinfo-title");
    t.appendChild(el("strong", null, "Layer " + l + ", head " + h));
    t.appendChild(el("span", "sx-muted", hi === undefined ? " · pattern not stored" :
      " · stored (" + this.heads[hi].chosen + ")"));
    info.appendChild(t);
    if (!this.metrics.length) return;
    var table = el("table", "sx-metrics");
    var self = this;
    this.metrics.forEach(function (m, i) {
      var row = m.values && m.values[l] ? m.values[l][h] : null;
      var tr = el("tr", i === self.metricPos ? "sx-current" : null);
      tr.appendChild(el("td", null, m.label || m.name));
      tr.appendChild(el("td", "sx-num", fmtMetric(row)));
      table.appendChild(tr);
    });
    info.appendChild(table);
  };

  /* ----------------------------------------------------------------- heads grid */

  P._layoutGrid = function () {
    var avail = Math.max(320, Math.min(this.root.clientWidth || 1100, 1180));
    var gl = 46, gt = 30;
    var cw = clamp(Math.floor((avail - gl - 360) / Math.max(1, this.H)), 8, 30);
    var ch = clamp(Math.min(cw, Math.floor(560 / Math.max(1, this.L))), 6, 30);
    var w = gl + cw * this.H + 6, h = gt + ch * this.L + 4;
    this.grid = { x0: gl, y0: gt, cw: cw, ch: ch, w: w, h: h };
    var dpr = window.devicePixelRatio || 1;
    this.gridCanvas.width = Math.round(w * dpr);
    this.gridCanvas.height = Math.round(h * dpr);
    this.gridCanvas.style.width = w + "px";
    this.gridCanvas.style.height = h + "px";
    this.gridDpr = dpr;
  };

  P._metricRange = function () {
    var m = this.metrics[this.metricPos];
    var lo = Infinity, hi = -Infinity;
    if (m && Array.isArray(m.values)) {
      for (var l = 0; l < m.values.length; l++) {
        var row = m.values[l] || [];
        for (var h = 0; h < row.length; h++) {
          var v = row[h];
          if (typeof v === "number" && isFinite(v)) { if (v < lo) lo = v; if (v > hi) hi = v; }
        }
      }
    }
    return lo <= hi ? [lo, hi] : null;
  };

  P._drawGrid = function () {
    var g = this.grid, ctx = this.gridCanvas.getContext("2d"), dpr = this.gridDpr;
    if (!g) return;
    ctx.setTransform(dpr, 0, 0, dpr, 0, 0);
    ctx.clearRect(0, 0, g.w, g.h);
    var m = this.metrics[this.metricPos];
    var range = this._metricRange();
    var gap = g.cw >= 10 && g.ch >= 10 ? 1 : 0;
    for (var l = 0; l < this.L; l++) {
      var row = m && m.values ? (m.values[l] || []) : [];
      for (var h = 0; h < this.H; h++) {
        var v = row[h];
        if (typeof v === "number" && isFinite(v) && range) {
          var t = range[1] > range[0] ? (v - range[0]) / (range[1] - range[0]) : 0.5;
          ctx.fillStyle = lutCss(t);
        } else {
          ctx.fillStyle = NULL_CSS;
        }
        ctx.fillRect(g.x0 + h * g.cw, g.y0 + l * g.ch, g.cw - gap, g.ch - gap);
      }
    }
    // stored heads: a white dot with a dark ring
    var r = Math.max(2.6, Math.min(g.cw, g.ch) * 0.17);
    for (var i = 0; i < this.heads.length; i++) {
      var hd = this.heads[i];
      if (!(hd.layer >= 0 && hd.layer < this.L && hd.head >= 0 && hd.head < this.H)) continue;
      var cx = g.x0 + (hd.head + 0.5) * g.cw - gap / 2, cy = g.y0 + (hd.layer + 0.5) * g.ch - gap / 2;
      ctx.beginPath();
      ctx.arc(cx, cy, r, 0, 2 * Math.PI);
      ctx.fillStyle = "#fff";
      ctx.fill();
      ctx.lineWidth = 1;
      ctx.strokeStyle = "#222";
      ctx.stroke();
    }
    if (this.gridHover) {
      ctx.lineWidth = 1;
      ctx.strokeStyle = "rgba(0,0,0,.55)";
      ctx.strokeRect(g.x0 + this.gridHover.head * g.cw + 0.5, g.y0 + this.gridHover.layer * g.ch + 0.5,
        g.cw - gap - 1, g.ch - gap - 1);
    }
    if (this.sel && this.sel.layer >= 0 && this.sel.layer < this.L && this.sel.head >= 0 && this.sel.head < this.H) {
      ctx.lineWidth = 2;
      ctx.strokeStyle = "#000";
      ctx.strokeRect(g.x0 + this.sel.head * g.cw - 1, g.y0 + this.sel.layer * g.ch - 1, g.cw - gap + 2, g.ch - gap + 2);
      ctx.lineWidth = 1;
      ctx.strokeStyle = "#fff";
      ctx.strokeRect(g.x0 + this.sel.head * g.cw + 0.5, g.y0 + this.sel.layer * g.ch + 0.5, g.cw - gap - 1, g.ch - gap - 1);
    }
    // axes
    ctx.fillStyle = "#444";
    ctx.font = "10px " + FONT_SANS;
    ctx.textBaseline = "middle";
    ctx.textAlign = "right";
    var ls = niceStep(13 / g.ch);
    for (l = 0; l < this.L; l += ls) ctx.fillText(String(l), g.x0 - 5, g.y0 + (l + 0.5) * g.ch);
    ctx.textAlign = "center";
    var hs = niceStep(18 / g.cw);
    for (h = 0; h < this.H; h += hs) ctx.fillText(String(h), g.x0 + (h + 0.5) * g.cw - gap / 2, g.y0 - 7);
    ctx.fillStyle = "#222";
    ctx.font = "11px " + FONT_SANS;
    ctx.textAlign = "left";
    ctx.fillText("head →", g.x0, 8);
    ctx.save();
    ctx.translate(9, g.y0);
    ctx.rotate(Math.PI / 2);
    ctx.textAlign = "left";
    ctx.fillText("layer →", 0, 0);
    ctx.restore();
  };

  P._updateMetricLegend = function () {
    var box = this.metricLegend;
    box.textContent = "";
    var range = this._metricRange();
    var bar = el("div", "sx-legend-bar");
    var stops = [];
    for (var i = 0; i <= 10; i++) stops.push(lutCss(i / 10) + " " + (i * 10) + "%");
    bar.style.background = "linear-gradient(to right, " + stops.join(", ") + ")";
    var lo = el("span", "sx-legend-min", range ? fmtMetric(range[0]) : "—");
    var hi = el("span", "sx-legend-max", range ? fmtMetric(range[1]) : "—");
    var line = el("div", "sx-legend-line");
    line.appendChild(lo);
    line.appendChild(bar);
    line.appendChild(hi);
    box.appendChild(line);
    var key = el("div", "sx-legend-keys");
    var sw = el("span", "sx-swatch");
    sw.style.background = NULL_CSS;
    key.appendChild(sw);
    key.appendChild(el("span", null, "no value"));
    key.appendChild(el("span", "sx-dot"));
    key.appendChild(el("span", null, "pattern stored"));
    box.appendChild(key);
  };

  P._gridCellAt = function (ev) {
    var g = this.grid, rect = this.gridCanvas.getBoundingClientRect();
    var x = (ev.clientX - rect.left) * g.w / rect.width, y = (ev.clientY - rect.top) * g.h / rect.height;
    var h = Math.floor((x - g.x0) / g.cw), l = Math.floor((y - g.y0) / g.ch);
    if (h < 0 || h >= this.H || l < 0 || l >= this.L) return null;
    return { layer: l, head: h };
  };

  P._bindGrid = function () {
    var self = this, c = this.gridCanvas;
    c.addEventListener("mousemove", function (ev) {
      var cell = self._gridCellAt(ev);
      var changed = !cell !== !self.gridHover || (cell && (cell.layer !== self.gridHover.layer || cell.head !== self.gridHover.head));
      self.gridHover = cell;
      if (changed) self._drawGrid();
      if (!cell) { self.gridTip.classList.remove("sx-on"); c.style.cursor = ""; return; }
      c.style.cursor = "pointer";
      var m = self.metrics[self.metricPos];
      var v = m && m.values && m.values[cell.layer] ? m.values[cell.layer][cell.head] : null;
      var hi = self.headPos.get(cell.layer * 100000 + cell.head);
      var tip = self.gridTip;
      tip.textContent = "";
      tip.appendChild(el("div", "sx-tt-title", "Layer " + cell.layer + ", head " + cell.head));
      if (m) tip.appendChild(el("div", null, (m.label || m.name) + ": " + fmtMetric(v)));
      tip.appendChild(el("div", "sx-muted", hi === undefined ? "pattern not stored" :
        "pattern stored (" + self.heads[hi].chosen + ") · click to open"));
      self._placeTip(tip, ev);
      tip.classList.add("sx-on");
    });
    c.addEventListener("mouseleave", function () {
      self.gridHover = null;
      self.gridTip.classList.remove("sx-on");
      self._drawGrid();
    });
    c.addEventListener("click", function (ev) {
      var cell = self._gridCellAt(ev);
      if (cell) self._userOpen(cell.layer, cell.head);
    });
  };

  /* ----------------------------------------------------------------- pattern legend */

  P._updatePatternLegend = function () {
    var box = this.patternLegend;
    box.textContent = "";
    var line = el("div", "sx-legend-line");
    var bar = el("div", "sx-legend-bar sx-legend-ticked");
    var stops = [];
    for (var i = 0; i <= 10; i++) stops.push(lutCss(1 - i / 10) + " " + (i * 10) + "%");
    bar.style.background = "linear-gradient(to right, " + stops.join(", ") + ")";
    var ticks;
    if (this.scaleMode === "log") {
      var lo = this.logLo, span = -Math.log10(lo);
      ticks = [];
      var first = Math.ceil(Math.log10(lo) - 1e-9);
      for (var e = first; e <= 0; e++) ticks.push([(e - Math.log10(lo)) / span, e === 0 ? "1" : Math.pow(10, e).toPrecision(1)]);
      if (ticks.length && ticks[0][0] > 0.08) ticks.unshift([0, Number(lo.toPrecision(2)).toString()]);
    } else {
      ticks = [[0, "0"], [0.25, "0.25"], [0.5, "0.5"], [0.75, "0.75"], [1, "1"]];
    }
    ticks.forEach(function (t) {
      var s = el("span", "sx-tick" + (t[0] < 0.02 ? " sx-tick-first" : t[0] > 0.98 ? " sx-tick-last" : ""), t[1]);
      s.style.left = (t[0] * 100).toFixed(2) + "%";
      bar.appendChild(s);
    });
    line.appendChild(el("span", "sx-legend-name", "weight"));
    line.appendChild(bar);
    box.appendChild(line);
    var keys = el("div", "sx-legend-keys");
    var s1 = el("span", "sx-swatch sx-swatch-white");
    keys.appendChild(s1);
    keys.appendChild(el("span", null, this.threshold > 0 ? "< " + this.threshold + " (not stored)" : "0"));
    var s2 = el("span", "sx-swatch");
    s2.style.background = MASK_CSS;
    keys.appendChild(s2);
    keys.appendChild(el("span", null, "key after query"));
    box.appendChild(keys);
  };

  /* ----------------------------------------------------------------- pattern view */

  P._fitView = function () {
    var T = this.cur ? this.cur.blk.T : 1;
    this.view = { s: HM / Math.max(1, T), ox: 0, oy: 0 };
  };

  P._clampView = function () {
    var v = this.view, T = this.cur ? this.cur.blk.T : 1;
    var fit = HM / Math.max(1, T);
    v.s = clamp(v.s, fit, Math.max(MAX_CELL, fit));
    var span = HM / v.s;
    v.ox = clamp(v.ox, 0, Math.max(0, T - span));
    v.oy = clamp(v.oy, 0, Math.max(0, T - span));
    if (Math.abs(v.s - fit) < 1e-12) { v.ox = 0; v.oy = 0; }
  };

  // zoom by factor keeping the token under (cx, cy) (CSS px inside the heatmap) in place
  P._zoomAt = function (factor, cx, cy) {
    if (!this.cur) return;
    var v = this.view;
    var tx = v.ox + cx / v.s, ty = v.oy + cy / v.s;
    var T = this.cur.blk.T, fit = HM / T;
    v.s = clamp(v.s * factor, fit, Math.max(MAX_CELL, fit));
    v.ox = tx - cx / v.s;
    v.oy = ty - cy / v.s;
    this._clampView();
    this._requestDraw();
  };

  P._requestDraw = function () {
    var self = this;
    var p = new Promise(function (resolve) { self.drawWaiters.push(resolve); });
    if (!this.drawPending) {
      this.drawPending = true;
      requestAnimationFrame(function () {
        self.drawPending = false;
        var waiters = self.drawWaiters;
        self.drawWaiters = [];
        try { self._draw(); } finally { waiters.forEach(function (r) { r(); }); }
      });
    }
    return p;
  };

  P._draw = function () {
    if (!this.cur) return;
    var t0 = performance.now();
    var ctx = this.ctx, dpr = this.dpr;
    ctx.setTransform(1, 0, 0, 1, 0, 0);
    ctx.clearRect(0, 0, this.canvas.width, this.canvas.height);
    this._renderHeatmap();
    ctx.putImageData(this.img, this.hmX, this.hmY);
    if (this.hasPhantom) this._renderPhantom();
    if (this.hasVnorm) this._renderVnorm();
    ctx.setTransform(dpr, 0, 0, dpr, 0, 0);
    this._drawFrameAndLabels();
    this._drawOverlay();
    var v = this.view, T = this.cur.blk.T;
    var z = v.s / (HM / T);
    if (z < 1.005) {
      this.zoomLabel.textContent = "whole window";
    } else {
      var span = HM / v.s;
      this.zoomLabel.textContent = "×" + (z < 10 ? z.toFixed(1) : String(Math.round(z))) + " · keys " +
        Math.floor(v.ox) + "–" + (Math.min(T, Math.ceil(v.ox + span)) - 1) + ", queries " +
        Math.floor(v.oy) + "–" + (Math.min(T, Math.ceil(v.oy + span)) - 1);
    }
    this.drawCount++;
    this.lastDrawMs = performance.now() - t0;
  };

  P._renderHeatmap = function () {
    var d = this.cur.blk.dec, T = d.T;
    var W = this.hmW, v = this.view;
    var sd = v.s * this.hmScale;          // device px per token
    var ox = v.ox, oy = v.oy;
    var idx = this.idx, pix = this.pix, lut = this.lut, pal = PAL32;
    var keys = d.keys, codes = d.codes, indptr = d.indptr;
    idx.fill(0);
    var q0 = Math.max(0, Math.floor(oy)), q1 = Math.min(T, Math.ceil(oy + W / sd) + 1);
    var k0 = Math.max(0, Math.floor(ox)), k1 = Math.min(T, Math.ceil(ox + W / sd) + 1);
    var q, i, k, ci, x0, x1, y0, y1, x, y, row;
    if (sd < 1) {
      // several tokens per pixel: each entry lands on one pixel; keep the largest weight
      for (q = q0; q < q1; q++) {
        y = Math.floor((q + 0.5 - oy) * sd);
        if (y < 0) continue;
        if (y >= W) break;
        row = y * W;
        var end = indptr[q + 1];
        for (i = lowerBound(keys, indptr[q], end, k0); i < end; i++) {
          k = keys[i];
          if (k >= k1) break;
          x = Math.floor((k + 0.5 - ox) * sd);
          if (x < 0 || x >= W) continue;
          ci = lut[codes[i]];
          if (ci > idx[row + x]) idx[row + x] = ci;
        }
      }
    } else {
      // each token is a rectangle of whole pixels
      for (q = q0; q < q1; q++) {
        y0 = Math.round((q - oy) * sd); y1 = Math.round((q + 1 - oy) * sd);
        if (y1 <= 0) continue;
        if (y0 >= W) break;
        if (y0 < 0) y0 = 0;
        if (y1 > W) y1 = W;
        var e2 = indptr[q + 1];
        for (i = lowerBound(keys, indptr[q], e2, k0); i < e2; i++) {
          k = keys[i];
          if (k >= k1) break;
          ci = lut[codes[i]];
          if (!ci) continue;
          x0 = Math.round((k - ox) * sd); x1 = Math.round((k + 1 - ox) * sd);
          if (x0 < 0) x0 = 0;
          if (x1 > W) x1 = W;
          for (y = y0; y < y1; y++) {
            row = y * W;
            for (x = x0; x < x1; x++) idx[row + x] = ci;
          }
        }
      }
    }
    // colour, with the causal mask (keys after every query of the pixel row) light grey
    for (y = 0; y < W; y++) {
      var xb, qlast;
      if (sd < 1) {
        qlast = Math.ceil((y + 1) / sd + oy - 0.5) - 1;
        if (qlast > T - 1) qlast = T - 1;
        xb = Math.floor((qlast + 0.5 - ox) * sd) + 1;
      } else {
        qlast = Math.floor(oy + (y + 0.5) / sd);
        if (qlast > T - 1) qlast = T - 1;
        xb = Math.round((qlast + 1 - ox) * sd);
      }
      if (xb < 0) xb = 0;
      if (xb > W) xb = W;
      row = y * W;
      for (x = 0; x < W; x++) {
        ci = idx[row + x];
        pix[row + x] = ci ? pal[ci] : (x >= xb ? MASK32 : WHITE32);
      }
    }
  };

  P._renderPhantom = function () {
    var d = this.cur.blk.dec, T = d.T, W = this.hmW, v = this.view;
    var sd = v.s * this.hmScale, ph = d.phantom, pw = this.phW, pix = this.phPix;
    var best = this._phBest || (this._phBest = new Float32Array(W));
    if (best.length !== W) best = this._phBest = new Float32Array(W);
    best.fill(-1);
    var q0 = Math.max(0, Math.floor(v.oy)), q1 = Math.min(T, Math.ceil(v.oy + W / sd) + 1);
    for (var q = q0; q < q1; q++) {
      var y0, y1;
      if (sd < 1) { y0 = Math.floor((q + 0.5 - v.oy) * sd); y1 = y0 + 1; }
      else { y0 = Math.round((q - v.oy) * sd); y1 = Math.round((q + 1 - v.oy) * sd); }
      if (y0 < 0) y0 = 0;
      if (y1 > W) y1 = W;
      for (var y = y0; y < y1; y++) if (ph[q] > best[y]) best[y] = ph[q];
    }
    for (var yy = 0; yy < W; yy++) {
      var c = best[yy] < 0 ? WHITE32 : PAL32[this._colorIndex(best[yy])];
      var r = yy * pw;
      for (var x = 0; x < pw; x++) pix[r + x] = c;
    }
    this.ctx.putImageData(this.phImg, Math.round((LM + HM + PGAP) * this.dpr), this.hmY);
  };

  P._renderVnorm = function () {
    var d = this.cur.blk.dec, T = d.T, W = this.hmW, v = this.view, ctx = this.ctx;
    var sd = v.s * this.hmScale, vn = d.vnorm, vmax = d.vmax || 1;
    var top = Math.round((TM + HM + VGAP) * this.dpr), hpx = Math.round(VH * this.dpr);
    ctx.fillStyle = "#f6f6f4";
    ctx.fillRect(this.hmX, top, W, hpx);
    ctx.fillStyle = "#6b6b8a";
    var k0 = Math.max(0, Math.floor(v.ox)), k1 = Math.min(T, Math.ceil(v.ox + W / sd) + 1);
    if (sd < 1) {
      var best = this._vnBest || (this._vnBest = new Float32Array(W));
      if (best.length !== W) best = this._vnBest = new Float32Array(W);
      best.fill(0);
      for (var k = k0; k < k1; k++) {
        var x = Math.floor((k + 0.5 - v.ox) * sd);
        if (x >= 0 && x < W && vn[k] > best[x]) best[x] = vn[k];
      }
      for (var xx = 0; xx < W; xx++) {
        var hh = Math.round(best[xx] / vmax * hpx);
        if (hh > 0) ctx.fillRect(this.hmX + xx, top + hpx - hh, 1, hh);
      }
    } else {
      var gap = sd >= 4 ? 1 : 0;
      for (var kk = k0; kk < k1; kk++) {
        var x0 = Math.round((kk - v.ox) * sd), x1 = Math.round((kk + 1 - v.ox) * sd) - gap;
        if (x0 < 0) x0 = 0;
        if (x1 > W) x1 = W;
        var h2 = Math.round(vn[kk] / vmax * hpx);
        if (x1 > x0 && h2 > 0) ctx.fillRect(this.hmX + x0, top + hpx - h2, x1 - x0, h2);
      }
    }
  };

  P._fitText = function (ctx, text, maxW, font) {
    var key = font + "|" + maxW + "|" + text;
    var hit = this.labelCache.get(key);
    if (hit !== undefined) return hit;
    var s = text;
    if (ctx.measureText(s).width > maxW) {
      var lo = 0, hi = s.length;
      while (lo < hi) {
        var mid = (lo + hi + 1) >> 1;
        if (ctx.measureText(s.slice(0, mid) + "…").width <= maxW) lo = mid; else hi = mid - 1;
      }
      s = s.slice(0, lo) + "…";
    }
    if (this.labelCache.size > 20000) this.labelCache.clear();
    this.labelCache.set(key, s);
    return s;
  };

  P._drawFrameAndLabels = function () {
    var ctx = this.ctx, v = this.view, d = this.cur.blk.dec, T = d.T;
    var toks = this.windows[this.cur.wi].tokens;
    var s = v.s;
    var q0 = Math.max(0, Math.floor(v.oy)), q1 = Math.min(T, Math.ceil(v.oy + HM / s));
    var k0 = Math.max(0, Math.floor(v.ox)), k1 = Math.min(T, Math.ceil(v.ox + HM / s));
    ctx.strokeStyle = "#a8a8a8";
    ctx.lineWidth = 1;
    ctx.strokeRect(LM - 1.5, TM - 1.5, HM + 3, HM + 3);     // 1px clear of the cells: key 0 stays visible
    ctx.fillStyle = "#333";
    ctx.textBaseline = "middle";
    var q, k, y, x, font, size;
    // query labels (rows)
    ctx.save();
    ctx.beginPath();
    ctx.rect(0, TM - 8, LM, HM + 16);
    ctx.clip();
    if (s >= LABEL_MIN) {
      size = Math.min(12, Math.floor(s * 0.85));
      font = size + "px " + FONT_MONO;
      ctx.font = font;
      ctx.textAlign = "right";
      for (q = q0; q < q1; q++) {
        y = TM + (q + 0.5 - v.oy) * s;
        ctx.fillText(this._fitText(ctx, tokenLabel(toks[q]), LM - 10, font), LM - 5, y);
      }
    } else {
      ctx.font = "10px " + FONT_SANS;
      ctx.textAlign = "right";
      var qs = niceStep(16 / s);
      ctx.beginPath();
      for (q = Math.ceil(q0 / qs) * qs; q < q1; q += qs) {
        y = Math.round(TM + (q + 0.5 - v.oy) * s) + 0.5;
        ctx.moveTo(LM - 4, y); ctx.lineTo(LM - 1, y);
        ctx.fillText(String(q), LM - 6, y);
      }
      ctx.stroke();
    }
    ctx.restore();
    // key labels (columns)
    ctx.save();
    ctx.beginPath();
    ctx.rect(LM - 16, 0, HM + 32, TM);
    ctx.clip();
    if (s >= LABEL_MIN) {
      size = Math.min(12, Math.floor(s * 0.85));
      font = size + "px " + FONT_MONO;
      ctx.font = font;
      ctx.textAlign = "left";
      for (k = k0; k < k1; k++) {
        x = LM + (k + 0.5 - v.ox) * s;
        ctx.save();
        ctx.translate(x, TM - 5);
        ctx.rotate(-Math.PI / 2);
        ctx.fillText(this._fitText(ctx, tokenLabel(toks[k]), TM - 22, font), 0, 0);
        ctx.restore();
      }
    } else {
      ctx.font = "10px " + FONT_SANS;
      ctx.textAlign = "center";
      var ks = niceStep(34 / s);
      ctx.beginPath();
      for (k = Math.ceil(k0 / ks) * ks; k < k1; k += ks) {
        x = Math.round(LM + (k + 0.5 - v.ox) * s) + 0.5;
        ctx.moveTo(x, TM - 4); ctx.lineTo(x, TM - 1);
        ctx.fillText(String(k), x, TM - 11);
      }
      ctx.stroke();
    }
    ctx.restore();
    // axis names in the corner
    ctx.fillStyle = "#555";
    ctx.font = "italic 11px " + FONT_SANS;
    ctx.textAlign = "left";
    ctx.fillText("key →", 4, TM - 26);
    ctx.fillText("query ↓", 4, TM - 11);
    // phantom column
    if (this.hasPhantom) {
      var px = LM + HM + PGAP;
      ctx.strokeStyle = "#a8a8a8";
      ctx.strokeRect(px - 1.5, TM - 1.5, PW + 3, HM + 3);
      ctx.save();
      ctx.translate(px + PW / 2, TM - 5);
      ctx.rotate(-Math.PI / 2);
      ctx.fillStyle = "#333";
      ctx.font = "italic 11px " + FONT_SANS;
      ctx.textAlign = "left";
      ctx.fillText("phantom", 0, 0);
      ctx.restore();
    }
    // value-norm strip
    if (this.hasVnorm) {
      var top = TM + HM + VGAP;
      ctx.strokeStyle = "#c4c4c4";
      ctx.strokeRect(LM - 0.5, top - 0.5, HM + 1, VH + 1);
      ctx.fillStyle = "#444";
      ctx.font = "11px " + FONT_SANS;
      ctx.textAlign = "right";
      ctx.fillText("‖v‖ of key", LM - 6, top + 7);
      ctx.fillStyle = "#777";
      ctx.font = "10px " + FONT_SANS;
      ctx.fillText("max " + fmtMetric(d.vmax), LM - 6, top + VH - 6);
    }
  };

  P._drawOverlay = function () {
    var ctx = this.octx, dpr = this.dpr;
    ctx.setTransform(1, 0, 0, 1, 0, 0);
    ctx.clearRect(0, 0, this.overlay.width, this.overlay.height);
    if (!this.cur) return;
    ctx.setTransform(dpr, 0, 0, dpr, 0, 0);
    var v = this.view, s = v.s, h = this.hover;
    if (this.textQuery !== null && this.textQuery !== undefined && this.textSource === "text") {
      var yq = TM + (this.textQuery - v.oy) * s;
      if (yq + s > TM && yq < TM + HM) {
        ctx.fillStyle = "rgba(230, 80, 30, 0.16)";
        var y0 = Math.max(TM, yq), y1 = Math.min(TM + HM, yq + Math.max(s, 1));
        ctx.fillRect(LM, y0, HM, Math.max(1, y1 - y0));
        ctx.fillStyle = "#e0501e";
        ctx.beginPath();
        var ym = Math.min(Math.max(yq + s / 2, TM), TM + HM);
        ctx.moveTo(LM - 1, ym); ctx.lineTo(LM - 7, ym - 4); ctx.lineTo(LM - 7, ym + 4);
        ctx.closePath();
        ctx.fill();
      }
    }
    if (!h) return;
    ctx.strokeStyle = "#e0501e";
    ctx.lineWidth = 1.5;
    var cy = TM + (h.q - v.oy) * s, cx;
    if (h.kind === "cell") {
      cx = LM + (h.k - v.ox) * s;
      if (s >= 4) {
        ctx.strokeRect(cx - 0.75, cy - 0.75, s + 1.5, s + 1.5);
      } else {
        // crosshair ticks on the axes
        ctx.beginPath();
        ctx.moveTo(LM - 6, cy + s / 2); ctx.lineTo(LM, cy + s / 2);
        ctx.moveTo(cx + s / 2, TM - 6); ctx.lineTo(cx + s / 2, TM);
        ctx.stroke();
        ctx.strokeRect(cx + s / 2 - 3, cy + s / 2 - 3, 6, 6);
      }
    } else if (h.kind === "phantom") {
      var px = LM + HM + PGAP;
      ctx.strokeRect(px - 0.75, cy - 0.75, PW + 1.5, Math.max(s, 1) + 1.5);
    } else if (h.kind === "vnorm") {
      cx = LM + (h.k - v.ox) * s;
      ctx.strokeRect(cx - 0.75, TM + HM + VGAP - 0.75, Math.max(s, 1) + 1.5, VH + 1.5);
    }
  };

  /* ----------------------------------------------------------------- pattern interaction */

  // where a pointer event falls: {kind, q, k} or null
  P._hitTest = function (ev) {
    if (!this.cur) return null;
    var rect = this.canvas.getBoundingClientRect();
    var x = (ev.clientX - rect.left) * this.cssW / rect.width;
    var y = (ev.clientY - rect.top) * this.cssH / rect.height;
    var v = this.view, T = this.cur.blk.T;
    // a point that cellCenter() handed out (for the view shown) reads as that cell
    var lc = null, dist = 0.5;
    for (var i = this.centers.length - 1; i >= 0; i--) {
      var c = this.centers[i];
      if (c.s !== v.s || c.ox !== v.ox || c.oy !== v.oy) continue;
      var dd = Math.max(Math.abs(ev.clientX - rect.left - c.x), Math.abs(ev.clientY - rect.top - c.y));
      if (dd < dist) { dist = dd; lc = c; }
    }
    if (lc) return { kind: lc.k === "phantom" ? "phantom" : "cell", q: lc.q, k: lc.k };
    var q = Math.floor(v.oy + (y - TM) / v.s);
    if (x >= LM && x < LM + HM && y >= TM && y < TM + HM) {
      var k = Math.floor(v.ox + (x - LM) / v.s);
      if (!(q >= 0 && q < T && k >= 0 && k < T)) return null;
      var sd = v.s * this.hmScale;
      if (sd < 1) {
        // several tokens per device pixel: the pixel shows the largest weight among them, and so
        // does the tooltip
        var best = this._pixelMax(Math.floor((x - LM) * this.hmScale), Math.floor((y - TM) * this.hmScale));
        if (best) return { kind: "cell", q: best.q, k: best.k };
      }
      return { kind: "cell", q: q, k: k };
    }
    if (this.hasPhantom && x >= LM + HM + PGAP - 1 && x < LM + HM + PGAP + PW + 1 && y >= TM && y < TM + HM) {
      if (q >= 0 && q < T) return { kind: "phantom", q: q, k: "phantom" };
    }
    if (this.hasVnorm && x >= LM && x < LM + HM && y >= TM + HM + VGAP && y < TM + HM + VGAP + VH) {
      var kk = Math.floor(v.ox + (x - LM) / v.s);
      if (kk >= 0 && kk < T) return { kind: "vnorm", q: null, k: kk };
    }
    return null;
  };

  // the stored entry with the largest weight among those drawn into heatmap device pixel (px, py)
  P._pixelMax = function (px, py) {
    var d = this.cur.blk.dec, v = this.view, sd = v.s * this.hmScale, T = d.T;
    // rows q with floor((q + 0.5 - oy) * sd) == py, keys likewise
    var qa = Math.max(0, Math.ceil(py / sd + v.oy - 0.5)), qb = Math.min(T - 1, Math.ceil((py + 1) / sd + v.oy - 0.5) - 1);
    var ka = Math.max(0, Math.ceil(px / sd + v.ox - 0.5)), kb = Math.min(T - 1, Math.ceil((px + 1) / sd + v.ox - 0.5) - 1);
    var bestCode = 0, bq = -1, bk = -1;
    for (var q = qa; q <= qb; q++) {
      var end = d.indptr[q + 1];
      for (var i = lowerBound(d.keys, d.indptr[q], end, ka); i < end && d.keys[i] <= kb; i++) {
        if (d.codes[i] > bestCode) { bestCode = d.codes[i]; bq = q; bk = d.keys[i]; }
      }
    }
    return bq < 0 ? null : { q: bq, k: bk };
  };

  P._placeTip = function (tip, ev) {
    var host = tip.parentNode;
    if (!host) return;
    var hr = host.getBoundingClientRect();
    var x = ev.clientX - hr.left + 14, y = ev.clientY - hr.top + 16;
    var w = tip.offsetWidth || 220, h = tip.offsetHeight || 60;
    if (ev.clientX + 14 + w > document.documentElement.clientWidth - 4) x = ev.clientX - hr.left - w - 12;
    if (ev.clientY + 16 + h > document.documentElement.clientHeight - 4) y = ev.clientY - hr.top - h - 12;
    tip.style.left = Math.round(x) + "px";
    tip.style.top = Math.round(y) + "px";
  };

  P._hideTip = function () {
    if (sharedTip && sharedTip.parentNode === this.root) sharedTip.classList.remove("sx-on");
  };

  P._showTip = function (hit, ev) {
    var tip = sharedTip, c = this.cur;
    if (tip.parentNode !== this.root) this.root.appendChild(tip);
    var toks = this.windows[c.wi].tokens;
    var winIndex = this.windows[c.wi].index;
    tip.textContent = "";
    tip.setAttribute("data-explorer", String(this.number));
    tip.setAttribute("data-layer", String(c.layer));
    tip.setAttribute("data-head", String(c.head));
    tip.setAttribute("data-window", String(winIndex));
    var w;
    tip.appendChild(el("div", "sx-tt-title", "Layer " + c.layer + ", head " + c.head + " · window " + winIndex));
    if (hit.kind === "cell" || hit.kind === "phantom") {
      tip.setAttribute("data-query", String(hit.q));
      tip.appendChild(this._tipLine("query", hit.q + " " + quoted(toks[hit.q])));
    }
    if (hit.kind === "cell") {
      w = this.weight(c.layer, c.head, hit.q, hit.k, winIndex);
      tip.setAttribute("data-key", String(hit.k));
      tip.setAttribute("data-weight", String(w));
      tip.removeAttribute("data-value-norm");
      tip.appendChild(this._tipLine("key", hit.k + " " + quoted(toks[hit.k])));
      var text;
      if (hit.k > hit.q) text = "0 (key after the query: masked)";
      else if (w === 0) text = this.threshold > 0 ? "< " + this.threshold + " (not stored)" : "0";
      else text = fmtWeight(w);
      tip.appendChild(this._tipLine("weight", text, "sx-tt-w"));
    } else if (hit.kind === "phantom") {
      w = this.phantom(c.layer, c.head, hit.q, winIndex);
      tip.setAttribute("data-key", "phantom");
      tip.setAttribute("data-weight", String(w));
      tip.removeAttribute("data-value-norm");
      tip.appendChild(this._tipLine("phantom mass", fmtWeight(w), "sx-tt-w"));
    } else if (hit.kind === "vnorm") {
      var vn = c.blk.dec.vnorm[hit.k];
      tip.setAttribute("data-query", "");
      tip.setAttribute("data-key", String(hit.k));
      tip.setAttribute("data-weight", "");
      tip.setAttribute("data-value-norm", String(vn));
      tip.appendChild(this._tipLine("key", hit.k + " " + quoted(toks[hit.k])));
      tip.appendChild(this._tipLine("‖v‖", fmtMetric(vn) + " (max " + fmtMetric(c.blk.dec.vmax) + ")", "sx-tt-w"));
    }
    tip.classList.add("sx-on");
    this._placeTip(tip, ev);
  };

  P._tipLine = function (name, value, cls) {
    var line = el("div", cls || null);
    line.appendChild(el("span", "sx-tt-k", name + " "));
    line.appendChild(el("span", "sx-tt-v", value));
    return line;
  };

  P._bindPattern = function () {
    var self = this, c = this.canvas;
    var drag = null;
    function onMove(ev) {
      if (!self.cur) return;
      if (drag) {
        var v = self.view;
        var f = self.cssW / c.getBoundingClientRect().width;
        if (Math.abs(ev.clientX - drag.x) + Math.abs(ev.clientY - drag.y) > 2) drag.moved = true;
        v.ox = drag.ox - (ev.clientX - drag.x) * f / v.s;
        v.oy = drag.oy - (ev.clientY - drag.y) * f / v.s;
        self._clampView();
        self._requestDraw();
        return;
      }
      var hit = self._hitTest(ev);
      var same = hit && self.hover && hit.kind === self.hover.kind && hit.q === self.hover.q && hit.k === self.hover.k;
      if (!hit) {
        if (self.textSource === "pattern" && self.textQuery !== null) self._textHighlight(null, "pattern");
        if (self.hover) { self.hover = null; self._drawOverlay(); }
        self._hideTip();
        c.style.cursor = "";
        return;
      }
      c.style.cursor = hit.kind === "cell" ? (self.view.s > HM / self.cur.blk.T + 1e-9 ? "grab" : "crosshair") : "default";
      self.hover = hit;
      if (!same) {
        self._showTip(hit, ev);
        if (hit.kind === "vnorm") {
          if (self.textSource === "pattern") self._textHighlight(null, "pattern");
        } else {
          self._textHighlight(hit.q, "pattern", hit.kind === "cell" && hit.k <= hit.q ? hit.k : null);
        }
        self._drawOverlay();
      } else {
        self._placeTip(sharedTip, ev);
      }
    }
    c.addEventListener("pointermove", onMove);
    c.addEventListener("pointerleave", function () {
      if (drag) return;
      if (self.textSource === "pattern" && self.textQuery !== null) self._textHighlight(null, "pattern");
      self.hover = null;
      self._hideTip();
      self._drawOverlay();
    });
    c.addEventListener("pointerdown", function (ev) {
      if (ev.button !== 0 || !self.cur) return;
      var hit = self._hitTest(ev);
      if (!hit || hit.kind !== "cell") return;
      drag = { x: ev.clientX, y: ev.clientY, ox: self.view.ox, oy: self.view.oy, moved: false, id: ev.pointerId };
      try { c.setPointerCapture(ev.pointerId); } catch (e) { /* not capturable */ }
      self.hover = null;
      self._hideTip();
      self._drawOverlay();
      c.style.cursor = "grabbing";
      ev.preventDefault();
    });
    function endDrag(ev) {
      if (!drag) return;
      try { c.releasePointerCapture(drag.id); } catch (e) { /* released already */ }
      drag = null;
      c.style.cursor = "";
      onMove(ev);
    }
    c.addEventListener("pointerup", endDrag);
    c.addEventListener("pointercancel", endDrag);
    c.addEventListener("wheel", function (ev) {
      if (!self.cur) return;
      var rect = c.getBoundingClientRect();
      var x = (ev.clientX - rect.left) * self.cssW / rect.width - LM;
      var y = (ev.clientY - rect.top) * self.cssH / rect.height - TM;
      if (x < 0 || x >= HM || y < 0 || y >= HM) return;
      var dy = ev.deltaY * (ev.deltaMode === 1 ? 16 : ev.deltaMode === 2 ? 400 : 1);
      if (!dy) return;
      var fit = HM / self.cur.blk.T;
      // at the whole window a zoom out scrolls the page instead
      if (dy > 0 && self.view.s <= fit * 1.0000001) return;
      if (dy < 0 && self.view.s >= Math.max(MAX_CELL, fit) * 0.9999999) { ev.preventDefault(); return; }
      ev.preventDefault();
      self._zoomAt(Math.exp(-clamp(dy, -300, 300) * 0.0022), x, y);
      self.hover = null;
      self._hideTip();
    }, { passive: false });
    c.addEventListener("dblclick", function (ev) {
      var hit = self._hitTest(ev);
      if (hit && hit.kind === "cell") self.setZoom(self.view.s / (HM / self.cur.blk.T) * 2, hit.q, hit.k);
    });
  };

  /* ----------------------------------------------------------------- text view */

  P._buildText = function () {
    var toks = this.windows[this.cur.wi].tokens;
    var frag = document.createDocumentFragment();
    var spans = new Array(toks.length);
    for (var i = 0; i < toks.length; i++) {
      var t = toks[i] === null || toks[i] === undefined ? "" : String(toks[i]);
      var sp = document.createElement("span");
      sp.className = "sx-token";
      sp.setAttribute("data-i", String(i));
      var nl = /\r?\n/.test(t);
      var shown = t.length === 0 ? "∅" : t.replace(/\r?\n/g, "↵").replace(/\t/g, "⇥")
        .replace(/[\u0000-\u0008\u000b\u000c\u000e-\u001f\u007f\r]/g, "�");
      if (t.length === 0) sp.classList.add("sx-token-empty");
      sp.textContent = shown;
      frag.appendChild(sp);
      if (nl) frag.appendChild(document.createElement("br"));
      spans[i] = sp;
    }
    this.text.textContent = "";
    this.text.appendChild(frag);
    this.tokSpans = spans;
    this.lit = [];
    this.textQuery = null;
    this.textStatus.textContent = "Hover a token: the tokens before it are coloured by its attention to them.";
  };

  // colour the text view by query q's weights; source "text" (a token hovered) or "pattern" (a
  // heatmap cell hovered: key k is marked too)
  P._textHighlight = function (q, source, k) {
    var spans = this.tokSpans, i;
    if (!spans) return;
    for (i = 0; i < this.lit.length; i++) {
      var sp = spans[this.lit[i]];
      sp.style.backgroundColor = "";
      sp.style.color = "";
      sp.classList.remove("sx-token-q", "sx-token-k");
    }
    this.lit = [];
    this.textQuery = q;
    this.textSource = source || this.textSource || "text";
    if (q === null || q === undefined || !this.cur || !spans[q]) {
      this.textQuery = null;
      this.textStatus.textContent = "Hover a token: the tokens before it are coloured by its attention to them.";
      this._drawOverlay();
      return;
    }
    var d = this.cur.blk.dec, lut = this.lut;
    var best = [];
    for (i = d.indptr[q]; i < d.indptr[q + 1]; i++) {
      var k = d.keys[i], ci = lut[d.codes[i]];
      if (ci && spans[k]) {
        spans[k].style.backgroundColor = PAL_CSS[ci];
        spans[k].style.color = PAL_TEXT[ci];
        this.lit.push(k);
      }
      best.push(i);
    }
    spans[q].classList.add("sx-token-q");
    this.lit.push(q);
    if (source === "pattern") {
      // keep the query in sight inside the text box (the page itself does not scroll)
      var box = this.text, top = spans[q].offsetTop;
      if (top < box.scrollTop || top > box.scrollTop + box.clientHeight - 24) {
        box.scrollTop = Math.max(0, top - box.clientHeight / 2);
      }
    }
    if (typeof k === "number" && spans[k] && k !== q) { spans[k].classList.add("sx-token-k"); this.lit.push(k); }
    best.sort(function (a, b) { return d.codes[b] - d.codes[a]; });
    var toks = this.windows[this.cur.wi].tokens, scale = this.scale;
    var st = this.textStatus;
    st.textContent = "";
    st.appendChild(el("strong", null, "query " + q + " " + quoted(toks[q])));
    var parts = best.slice(0, 3).map(function (i2) {
      return d.keys[i2] + " " + quoted(toks[d.keys[i2]]) + " " + fmtWeight(d.codes[i2] * scale);
    });
    st.appendChild(el("span", null, parts.length ? " · top keys: " + parts.join(", ") : " · no stored weight"));
    if (this.hasPhantom) st.appendChild(el("span", null, " · phantom " + fmtWeight(d.phantom[q])));
    this._drawOverlay();
  };

  P._bindText = function () {
    var self = this;
    this.text.addEventListener("mouseover", function (ev) {
      var t = ev.target && ev.target.closest ? ev.target.closest(".sx-token") : null;
      if (!t || !self.cur) return;
      var i = parseInt(t.getAttribute("data-i"), 10);
      if (i !== self.textQuery || self.textSource !== "text") self._textHighlight(i, "text");
    });
    this.text.addEventListener("mouseleave", function () {
      self._textHighlight(null, "text");
    });
  };

  /* ----------------------------------------------------------------- start */

  function init() {
    var nodes = document.querySelectorAll("[data-sinkscope-explorer]");
    var all = window.sinkscopeExplorers;
    if (!Array.isArray(all)) all = window.sinkscopeExplorers = [];
    for (var i = 0; i < nodes.length; i++) {
      var node = nodes[i];
      if (node.sinkscopeExplorer) continue;          // built already (the script may be inlined twice)
      var ex = new Explorer(node, all.length);
      node.sinkscopeExplorer = ex;
      all.push(ex);
    }
    if (all.length && !window.sinkscopeExplorer) window.sinkscopeExplorer = all[0];
  }

  if (document.readyState === "loading") document.addEventListener("DOMContentLoaded", init);
  else init();
})();
