// One stream per browser for every saga page of this console open in it (a SharedWorker): a browser holds six
// connections per host, so a stream per tab would lock the console at the seventh. Each page says which saga it
// shows and the last seq it shows; the worker holds one EventSource to /live naming every page, opened again when
// a page comes or goes (each page's seq kept, so nothing is missed or sent twice), and hands each update to the
// page it is for. A page that stops saying hello (closed without goodbye) is dropped after a while.
"use strict";
const pages = new Map(); // watch number -> {port, saga, after, seen}
let next = 1, source = null, reopening = null;
const SILENT_MS = 45000, RETRY_MS = 1000;

function reopen() {
  clearTimeout(reopening); reopening = null;
  if (source) { source.close(); source = null; }
  if (pages.size === 0) return;
  const query = new URLSearchParams();
  for (const [watch, page] of pages) {
    query.append("watch", String(watch)); query.append("saga", page.saga); query.append("after", String(page.after));
  }
  source = new EventSource("/live?" + query.toString());
  source.addEventListener("update", function (e) {
    const update = JSON.parse(e.data), page = pages.get(Number(update.watch));
    if (!page) return;
    page.after = update.seq;
    page.port.postMessage(update);
  });
  // The browser would reconnect with the seqs of when it opened: open it again with each page's own.
  source.onerror = function () { source.close(); source = null; reopening = setTimeout(reopen, RETRY_MS); };
}

onconnect = function (connected) {
  const port = connected.ports[0];
  let watch = null;
  port.onmessage = function (e) {
    const said = e.data;
    if (said.hello && watch === null) {
      watch = next++;
      pages.set(watch, {port: port, saga: said.saga, after: said.after, seen: Date.now()});
      reopen();
    } else if (said.hello) {
      pages.get(watch).seen = Date.now();
    } else if (said.bye && watch !== null) {
      pages.delete(watch); watch = null; reopen();
    }
  };
  port.start();
};

setInterval(function () {
  let gone = false;
  for (const [watch, page] of pages) {
    if (Date.now() - page.seen > SILENT_MS) { pages.delete(watch); gone = true; }
  }
  if (gone) reopen();
}, SILENT_MS / 3);
