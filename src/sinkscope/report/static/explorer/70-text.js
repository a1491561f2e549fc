  // 70-text.js: the text view: tokens coloured by a query's weights.
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

