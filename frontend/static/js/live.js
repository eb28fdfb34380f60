// The browser end of ws/runs/<id>/ (see tracking/consumers.py and docs/dashboard.md).
// Keeps the last event seq it handled and reconnects with it, so the server replays what was missed.

const BACKOFF_MS = [500, 1000, 2000, 4000, 8000];

export class RunStream {
  /**
   * @param {number} runId
   * @param {object} handlers onHello(run, isReconnect), onEvent(event), onMetrics(series), onConnection(bool)
   * @param {number} lastSeq events up to this seq are not wanted (the page has them or skips them)
   */
  constructor(runId, handlers, lastSeq = 0) {
    this.runId = runId;
    this.handlers = handlers;
    this.lastSeq = lastSeq;
    this.attempt = 0;
    this.opened = 0;
    this.closedByUs = false;
    this.ws = null;
  }

  url() {
    const scheme = window.location.protocol === "https:" ? "wss" : "ws";
    return `${scheme}://${window.location.host}/ws/runs/${this.runId}/?last_seq=${this.lastSeq}`;
  }

  connect() {
    this.ws = new WebSocket(this.url());
    this.ws.addEventListener("open", () => {
      this.attempt = 0;
      this.opened += 1;
      this.call("onConnection", true);
    });
    this.ws.addEventListener("message", (ev) => this.dispatch(JSON.parse(ev.data)));
    this.ws.addEventListener("close", () => {
      this.call("onConnection", false);
      if (this.closedByUs) return;
      const delay = BACKOFF_MS[Math.min(this.attempt, BACKOFF_MS.length - 1)];
      this.attempt += 1;
      setTimeout(() => this.connect(), delay);
    });
  }

  close() {
    this.closedByUs = true;
    if (this.ws) this.ws.close();
  }

  dispatch(msg) {
    if (msg.kind === "hello") {
      this.call("onHello", msg.run, this.opened > 1);
    } else if (msg.kind === "event") {
      const seq = msg.event.seq;
      if (seq <= this.lastSeq) return; // a replay of something handled already
      this.lastSeq = seq;
      this.call("onEvent", msg.event);
    } else if (msg.kind === "metrics") {
      this.call("onMetrics", msg.series || {});
    } else if (msg.kind === "alert") { // an alert of the run opened, repeated or resolved
      this.call("onAlert", msg.alert);
    }
  }

  call(name, ...args) {
    const fn = this.handlers[name];
    if (fn) fn(...args);
  }
}
