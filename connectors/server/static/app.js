"use strict";
// The isotrope search page: talks to the JSON API of the server that serves it (no other network).
const $ = (id) => document.getElementById(id);
let token = sessionStorage.getItem("isotrope-token") || "";

function headers() {
  const h = { "Content-Type": "application/json" };
  if (token) h["Authorization"] = "Bearer " + token;
  return h;
}

async function api(path, body) {
  const response = await fetch(path, body === undefined ? { headers: headers() }
    : { method: "POST", headers: headers(), body: JSON.stringify(body) });
  let payload = null;
  try { payload = await response.json(); } catch (e) { payload = null; }
  if (response.status === 401) { $("token-form").hidden = false; }
  if (!response.ok) {
    const detail = payload && payload.detail ? payload.detail : response.statusText;
    throw new Error(typeof detail === "string" ? detail : JSON.stringify(detail));
  }
  return payload;
}

function escapeHtml(text) {
  return text.replace(/[&<>"']/g, (c) => ({ "&": "&amp;", "<": "&lt;", ">": "&gt;", '"': "&quot;", "'": "&#39;" }[c]));
}

// words too common to be worth marking
const STOPWORDS = new Set(("a an and are as at be by did do does for from had has have how i in is it its of on or "
  + "that the this to was were what when where which who why will with").split(" "));

function highlight(text, query) {
  const terms = [...new Set(query.toLowerCase().match(/[\p{L}\p{N}]{2,}/gu) || [])]
    .filter((t) => !STOPWORDS.has(t))
    .sort((a, b) => b.length - a.length).map((t) => t.replace(/[.*+?^${}()|[\]\\]/g, "\\$&"));
  const safe = escapeHtml(text);
  if (!terms.length) return safe;
  const whole = new RegExp("(?<![\\p{L}\\p{N}])(" + terms.join("|") + ")(?![\\p{L}\\p{N}])", "giu");
  return safe.replace(whole, "<mark>$1</mark>");
}

function showError(message) {
  $("error").textContent = message;
  $("error").hidden = !message;
}

function render(hits, query) {
  const list = $("results");
  list.replaceChildren();
  hits.forEach((hit, rank) => {
    const item = document.createElement("li");
    item.className = "card";
    const line = hit.metadata && hit.metadata.line != null ? ":" + hit.metadata.line : "";
    item.innerHTML = '<div class="head"><span class="rank">' + (rank + 1) + '.</span>'
      + '<span class="score">' + hit.score.toFixed(3) + '</span>'
      + '<span class="source">' + escapeHtml((hit.source || "") + line) + '</span>'
      + '<span class="id" title="chunk id">' + escapeHtml(hit.id) + '</span></div>'
      + '<p class="text">' + highlight(hit.text || "", query) + '</p>';
    list.appendChild(item);
  });
}

async function search() {
  const query = $("query").value.trim();
  if (!query) return;
  const body = { query, k: parseInt($("k").value, 10) || 10 };
  if ($("mode").value) body.mode = $("mode").value;  // "": the store's calibrated default
  const where = $("where").value.trim();
  if (where) body.where = where;
  const groupBy = $("group_by").value.trim();
  if (groupBy) body.group_by = groupBy;
  const started = performance.now();
  try {
    const result = await api("/search", body);
    showError("");
    render(result.hits, query);
    $("status").textContent = result.hits.length + " hits in " + Math.round(performance.now() - started) + " ms";
  } catch (error) {
    $("results").replaceChildren();
    $("status").textContent = "";
    showError(error.message);
  }
}

async function loadInfo() {
  try {
    const info = await api("/info");
    $("token-form").hidden = true;
    const fingerprint = (info.fingerprint || "").slice(0, 12);
    $("info").textContent = info.store + " · " + info.chunks + " chunks · " + info.model + " · shape "
      + info.shape + " · " + fingerprint;
    const modes = (info.server && info.server.modes) || ["dense"];
    const chosen = info.default_search || { mode: "dense" };
    const label = "default: " + chosen.mode + (chosen.alpha != null ? " " + chosen.alpha : "");
    $("mode").replaceChildren(new Option(label, ""), ...modes.map((m) => new Option(m, m)));
  } catch (error) {
    $("info").textContent = "store info unavailable: " + error.message;
  }
}

$("search-form").addEventListener("submit", (event) => { event.preventDefault(); search(); });
$("k").addEventListener("change", () => { if ($("query").value.trim()) search(); });
$("mode").addEventListener("change", () => { if ($("query").value.trim()) search(); });
$("token-form").addEventListener("submit", (event) => {
  event.preventDefault();
  token = $("token").value;
  sessionStorage.setItem("isotrope-token", token);
  loadInfo();
});
$("report-link").addEventListener("click", async (event) => {
  if (!token) return; // no key: the plain link works
  event.preventDefault();
  const response = await fetch("/report", { headers: headers() });
  if (!response.ok) { showError("report: HTTP " + response.status); return; }
  window.open(URL.createObjectURL(await response.blob()), "_blank");
});
loadInfo();
