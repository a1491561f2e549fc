  // 40-grid.js: the heads grid: layout, drawing, the metric legend, hover and click.
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
          ctx.fillStyle = scaleCss(t);  // dark = high, as the pattern's weights
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
    for (var i = 0; i <= 10; i++) stops.push(scaleCss(i / 10) + " " + (i * 10) + "%");
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

