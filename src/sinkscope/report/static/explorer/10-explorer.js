  // 10-explorer.js: the Explorer: its state, its DOM shell, the canvases and the global bindings.
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

