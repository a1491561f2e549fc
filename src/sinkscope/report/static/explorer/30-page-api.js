  // 30-page-api.js: the page API (weight, phantom, valueNorm, open, cellCenter, headCenter, zoom, scale, state) and the controls.
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

