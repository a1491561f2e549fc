  // 20-store.js: the data store: blocks decoded on demand, a window's and a head's block.
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

