  // 90-start.js: start: one Explorer per [data-sinkscope-explorer] element, window.sinkscopeExplorer(s).
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
