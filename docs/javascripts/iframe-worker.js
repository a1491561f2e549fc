/* A local stand-in for the iframe-worker shim (squidfunk/iframe-worker) that Material's offline
 * plugin would otherwise load from unpkg.com (the plugin skips its own when a polyfill named
 * "iframe-worker" is listed in mkdocs.yml's extra.polyfills).
 *
 * Opened from file://, a browser refuses `new Worker(url)`, so the search worker never starts.
 * Here, on file:// only, Worker becomes IFrameWorker: the worker script runs in a hidden iframe
 * of the page's own origin, whose postMessage hands the worker's answers back to the page and
 * to which the page's messages are dispatched as "message" events. Material's search worker
 * recognises the set-up ("IFrameWorker" in parent) and reads the index that the offline plugin
 * inlines as search/search_index.js. Served over http(s), nothing changes.
 */
(function () {
  "use strict";
  if (location.protocol !== "file:" || typeof window.IFrameWorker !== "undefined") return;

  class IFrameWorker extends EventTarget {
    constructor(url) {
      super();
      this.onmessage = null;
      this.onerror = null;
      this._queue = [];
      this._ready = false;
      this._iframe = document.createElement("iframe");
      this._iframe.setAttribute("aria-hidden", "true");
      this._iframe.tabIndex = -1;
      this._iframe.style.display = "none";
      const start = () => this._start(new URL(url, location.href).href);
      if (document.body) start();
      else document.addEventListener("DOMContentLoaded", start, { once: true });
    }

    _start(src) {
      document.body.appendChild(this._iframe);
      const scope = this._iframe.contentWindow;
      const worker = this;
      // what the worker posts arrives at the page as a "message" event of this object
      scope.postMessage = function (data) {
        const event = new MessageEvent("message", { data: data });
        worker.dispatchEvent(event);
        if (typeof worker.onmessage === "function") worker.onmessage(event);
      };
      const doc = scope.document;
      doc.open();
      doc.close();
      const script = doc.createElement("script");
      script.src = src;
      script.onload = () => {
        this._ready = true;
        this._queue.splice(0).forEach((data) => this.postMessage(data));
      };
      script.onerror = () => {
        const event = new ErrorEvent("error", { message: "could not load " + src });
        this.dispatchEvent(event);
        if (typeof this.onerror === "function") this.onerror(event);
      };
      doc.head.appendChild(script);
    }

    postMessage(data) {
      if (!this._ready) {
        this._queue.push(data);
        return;
      }
      const scope = this._iframe.contentWindow;
      scope.dispatchEvent(new scope.MessageEvent("message", { data: data }));
    }

    terminate() {
      this._ready = false;
      this._iframe.remove();
    }
  }

  window.IFrameWorker = IFrameWorker;
  window.Worker = IFrameWorker;
})();
