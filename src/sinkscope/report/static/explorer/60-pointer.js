  // 60-pointer.js: the pointer: hit tests, the tooltip, pan, zoom and keys on the pattern.
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

