"""The status page's HTML (served at ``/`` by mconn.ops.status): self-contained, inline CSS
and JavaScript, no external fetches (its Content-Security-Policy forbids them). It
fetches ``status.json`` every second and redraws the peers, their channels and the rate
sparklines (specs/status.md section 1). The line under the heading says where the node
listens, its TLS mode and which per-packet path it runs (``hot_path``). Nodes are named
``moniker (abcd1234)`` (the document's ``name``; the whole id is the title of the cell),
channels by their name and id; the session's message counts have a column each, under
"sent" (accepted, acknowledged by the peer) and "received" (delivered here). Then a
section per reactor that reports a status (``Reactor.status()``: its keys and values,
written as text with ``textContent``, never parsed as HTML).
"""

PAGE = """<!DOCTYPE html>
<html lang="en">
<head>
<meta charset="utf-8">
<meta name="viewport" content="width=device-width, initial-scale=1">
<title>mconn node status</title>
<style>
  body { font: 13px/1.35 system-ui, sans-serif; margin: 1em 1.2em; color: #1d2430; background: #fafbfc; }
  h1 { font-size: 1.3em; margin: 0 0 .2em; }
  h2 { font-size: 1.05em; margin: 1.4em 0 .4em; }
  .id, td.mono { font-family: ui-monospace, monospace; font-size: 12px; }
  .meta { color: #4b5565; }
  .meta span { margin-right: 1.6em; }
  table { border-collapse: collapse; background: #fff; box-shadow: 0 0 0 1px #dde1e7; }
  th, td { padding: .3em .45em; text-align: left; border-bottom: 1px solid #eceef2; white-space: nowrap; }
  th { background: #f0f2f5; font-weight: 600; font-size: 12.5px; }
  td.n { text-align: right; font-variant-numeric: tabular-nums; }
  tr.channel td { background: #fbfcfd; font-size: 12.5px; }
  tr.channel td:first-child { padding-left: 2.2em; color: #4b5565; }
  .state { padding: .05em .5em; border-radius: .7em; font-size: 12px; font-weight: 600; }
  .connected { background: #d7f5df; color: #146c2e; }
  .suspended, .connecting { background: #fff1c2; color: #7a5600; }
  .closed { background: #f8d7da; color: #8a1c25; }
  .dir { color: #4b5565; font-size: 11.5px; display: block; }
  svg.spark { display: block; margin-left: auto; }
  svg.spark .send { stroke: #2463eb; } svg.spark .receive { stroke: #d9480f; }
  #error { color: #8a1c25; }
  .legend i { display: inline-block; width: .9em; height: .2em; vertical-align: middle; margin: 0 .3em 0 .8em; }
  h1 .id { color: #4b5565; font-weight: 400; margin-left: .5em; }
  th.group { text-align: center; border-bottom: 1px solid #dde1e7; }
  .channel-name { font-weight: 600; color: #1d2430; }
</style>
</head>
<body>
<h1>mconn node <span id="node-name">&hellip;</span> <span class="id" id="node-id"></span></h1>
<div class="meta" id="meta"></div>
<div class="meta">Prometheus metrics: <a href="metrics">/metrics</a></div>
<div id="error"></div>
<h2>Peers <span class="meta legend"><i style="background:#2463eb"></i>sent
  <i style="background:#d9480f"></i>received, bytes/s over the last minute</span></h2>
<table id="peers"><thead><tr>
  <th rowspan="2">peer / channel</th><th rowspan="2">state</th><th rowspan="2">address</th>
  <th rowspan="2">transport</th><th rowspan="2">uptime</th><th rowspan="2">resumes</th>
  <th rowspan="2" title="last ping round trip">RTT</th><th rowspan="2">queue</th>
  <th rowspan="2">send rate</th><th rowspan="2">receive rate</th>
  <th class="group" colspan="2" title="messages of this session">sent</th><th class="group" title="messages of this session">received</th>
  <th rowspan="2" title="accepted and not yet confirmed delivered by the peer">unconfirmed</th>
</tr><tr>
  <th title="messages this session accepted for sending to the peer">accepted</th>
  <th title="of those, confirmed delivered by the peer">acknowledged</th>
  <th title="messages of this session from the peer delivered to this node's reactor">delivered</th>
</tr></thead><tbody></tbody></table>
<h2>Node counters</h2>
<table id="counters"><thead><tr><th>node</th><th>resume rejections</th><th>grace expiries</th>
  <th>duplicates refused</th><th>duplicates replaced</th><th>simultaneous dials</th></tr></thead>
  <tbody></tbody></table>
<h2>Refused connections</h2>
<table id="refusals"><thead><tr><th>reason</th><th>count</th></tr></thead><tbody></tbody></table>
<div id="reactors"></div>
<script>
"use strict";
const SVG = "http://www.w3.org/2000/svg";
function el(tag, text, cls) {
  const e = document.createElement(tag);
  if (text !== undefined && text !== null) e.textContent = String(text);
  if (cls) e.className = cls;
  return e;
}
function row(cells, cls) {
  const tr = el("tr", null, cls);
  for (const c of cells) tr.appendChild(c instanceof Node ? c : el("td", c));
  return tr;
}
function num(v) { return el("td", v, "n"); }
function rate(v) {
  if (v < 1024) return v.toFixed(0) + " B/s";
  if (v < 1048576) return (v / 1024).toFixed(1) + " KiB/s";
  return (v / 1048576).toFixed(2) + " MiB/s";
}
function duration(s) {
  s = Math.floor(s);
  if (s < 60) return s + "s";
  if (s < 3600) return Math.floor(s / 60) + "m" + String(s % 60).padStart(2, "0") + "s";
  if (s < 86400) return Math.floor(s / 3600) + "h" + String(Math.floor(s % 3600 / 60)).padStart(2, "0") + "m";
  return Math.floor(s / 86400) + "d" + String(Math.floor(s % 86400 / 3600)).padStart(2, "0") + "h";
}
function spark(values, cls, top, slots) {
  const w = 76, h = 22, svg = document.createElementNS(SVG, "svg");
  svg.setAttribute("class", "spark"); svg.setAttribute("width", w); svg.setAttribute("height", h);
  const line = document.createElementNS(SVG, "polyline");
  const n = Math.max(slots, values.length, 2) - 1, first = n + 1 - values.length;
  line.setAttribute("points", values.map((v, i) =>
    ((first + i) * w / n).toFixed(1) + "," + (h - 1 - (top > 0 ? v / top : 0) * (h - 2)).toFixed(1)).join(" "));
  line.setAttribute("class", cls); line.setAttribute("fill", "none"); line.setAttribute("stroke-width", "1.5");
  svg.appendChild(line);
  return svg;
}
let SLOTS = 60;
function rates(o) {
  const send = el("td", rate(o.send_rate), "n"), receive = el("td", rate(o.receive_rate), "n");
  send.appendChild(spark(o.send_history, "send", Math.max(1, ...o.send_history), SLOTS));
  receive.appendChild(spark(o.receive_history, "receive", Math.max(1, ...o.receive_history), SLOTS));
  return [send, receive];
}
function channelName(c) {
  const id = "0x" + c.channel_id.toString(16).padStart(2, "0");
  const cell = el("td");
  if (c.name) cell.append(el("span", c.name, "channel-name"), " (" + id + ")");
  else cell.append("channel " + id);
  cell.append(", priority " + c.priority);
  return cell;
}
function nodeCell(id, name) {
  const cell = el("td", name || id, "mono");
  cell.title = id;
  return cell;
}
function render(doc) {
  document.getElementById("node-name").textContent = doc.name || doc.node_id;
  document.getElementById("node-id").textContent = doc.node_id;
  SLOTS = doc.sample_slots;
  const meta = document.getElementById("meta");
  meta.replaceChildren(el("span", "listening on " + (doc.listen_addresses.join(", ") || "nothing")),
    el("span", "TLS: " + (doc.tls || "off")),
    el("span", "hot path: " + doc.hot_path + (doc.hot_path_why ? " (" + doc.hot_path_why + ")" : ""), "hot-path"),
    el("span", "ws frames: " + doc.ws_frames + (doc.ws_frames_why ? " (" + doc.ws_frames_why + ")" : ""), "ws-frames"),
    el("span", doc.peers.length + " peers"),
    el("span", "updated " + new Date(doc.time * 1000).toLocaleTimeString()));
  const body = document.querySelector("#peers tbody");
  const rows = [];
  for (const p of doc.peers) {
    const tr = row([nodeCell(p.node_id, p.name), el("td"), el("td", p.remote_address, "mono"),
      el("td", p.transport || "-"), num(duration(p.uptime)), num(p.resumes),
      num(p.round_trip === null ? "-" : (p.round_trip * 1000).toFixed(1) + " ms"), num(""),
      ...rates(p), num(""), num(""), num(""), num("")], "peer");
    tr.dataset.peer = p.node_id;
    tr.children[1].append(el("span", p.state, "state " + p.state), el("span", " " + p.direction, "dir"));
    rows.push(tr);
    for (const c of p.channels) {
      rows.push(row([channelName(c),
        "", "", "", "", "", "", num(c.queue_depth + (c.waiting_sends ? " +" + c.waiting_sends + " waiting" : "")),
        ...rates(c), num(c.accepted), num(c.acked), num(c.delivered), num(c.unconfirmed)], "channel"));
    }
  }
  if (!rows.length) rows.push(row([el("td", "no peers")]));
  body.replaceChildren(...rows);
  const names = Object.fromEntries(doc.peers.map(p => [p.node_id, p.name]));
  const counters = doc.node_counters.map(c =>
    row([nodeCell(c.node_id, names[c.node_id]), num(c.resume_rejections), num(c.grace_expiries),
      num(c.duplicates_refused), num(c.duplicates_replaced), num(c.simultaneous_dials)]));
  document.querySelector("#counters tbody").replaceChildren(...(counters.length ? counters : [row(["none"])]));
  const refusals = Object.entries(doc.refusals).map(([reason, count]) => row([reason, num(count)]));
  document.querySelector("#refusals tbody").replaceChildren(...(refusals.length ? refusals : [row(["none"])]));
  const sections = (doc.reactors || []).map(r => {
    const section = el("section", null, "reactor");
    section.dataset.reactor = r.name;
    section.appendChild(el("h2", "Reactor " + r.name));
    const body = el("tbody");
    for (const [key, value] of Object.entries(r.status)) {
      body.appendChild(row([el("td", key, "mono"), el("td", value === null ? "null" : String(value))]));
    }
    const table = el("table");
    table.appendChild(body);
    section.appendChild(table);
    return section;
  });
  document.getElementById("reactors").replaceChildren(...sections);
}
async function refresh() {
  try {
    const response = await fetch("status.json", {cache: "no-store"});
    if (!response.ok) throw new Error("HTTP " + response.status);
    render(await response.json());
    document.getElementById("error").textContent = "";
  } catch (e) {
    document.getElementById("error").textContent = "cannot update: " + e.message;
  } finally {
    setTimeout(refresh, 1000);
  }
}
refresh();
</script>
</body>
</html>
"""
