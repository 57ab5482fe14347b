// A saga page stays true: its parts (data-live-part) are drawn again as the saga moves, from one stream per browser
// shared by its tabs (live-worker.js); where a browser has no SharedWorker, from a stream of the page's own.
"use strict";
(function () {
  const root = document.getElementById("saga-live");
  if (!root) return;
  const saga = root.dataset.watchSaga;
  let after = Number(root.dataset.watchAfter);

  function draw(update) {
    if (update.seq <= after) return;
    after = update.seq;
    for (const [part, html] of update.parts) {
      const target = root.querySelector('[data-live-part="' + part + '"]');
      if (target) htmx.swap(target, html, {swapStyle: target.dataset.liveSwap || "innerHTML"});
    }
    document.dispatchEvent(new CustomEvent("saga:updated", {detail: {seq: after}}));
  }

  if (window.SharedWorker) {
    const worker = new SharedWorker(root.dataset.liveWorker || "/static/live-worker.js", {name: "saga-live"});
    worker.port.onmessage = function (e) { draw(e.data); };
    worker.port.start();
    const hello = function () { worker.port.postMessage({hello: true, saga: saga, after: after}); };
    hello();
    setInterval(hello, 15000);
    window.addEventListener("pagehide", function () { worker.port.postMessage({bye: true}); });
    return;
  }
  let source = null;
  function open() {
    const query = new URLSearchParams({watch: "1", saga: saga, after: String(after)});
    source = new EventSource("/live?" + query.toString());
    source.addEventListener("update", function (e) { draw(JSON.parse(e.data)); });
    source.onerror = function () { source.close(); setTimeout(open, 1000); };
  }
  open();
})();
