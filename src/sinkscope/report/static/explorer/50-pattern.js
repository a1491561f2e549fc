  // 50-pattern.js: the pattern view: the viewport and zoom, heatmap, phantom column, value-norm strip, axes, overlay.
  P._updatePatternLegend = function () {
    var box = this.patternLegend;
    box.textContent = "";
    var line = el("div", "sx-legend-line");
    var bar = el("div", "sx-legend-bar sx-legend-ticked");
    var stops = [];
    for (var i = 0; i <= 10; i++) stops.push(scaleCss(i / 10) + " " + (i * 10) + "%");
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

