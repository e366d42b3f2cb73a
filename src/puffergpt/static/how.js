// The How page: the loaded model's live figures from /api/info.
import { api } from "./api.js";
import { $, showError } from "./dom.js";
import { baseName, int, usdPlain } from "./format.js";

function values(info) {
  const c = info.config;
  const r = info.rates;
  return {
    model: baseName(info.model),
    documents: int(info.documents),
    megabytes: info.megabytes + " MB",
    requests_per_token: int(info.requests_per_token),
    round_trips_per_token: int(info.round_trips_per_token),
    layer_trips: int(5 * c.n_layer),
    layers: int(c.n_layer),
    lens_searches: int(c.n_layer + 1),
    width: int(c.n_embd),
    heads: int(c.n_head),
    head_dim: int(c.n_embd / c.n_head),
    keys_per_token: int(c.n_layer * c.n_head),
    vocab: int(c.n_vocab),
    context: int(c.n_ctx),
    metric: String(info.metric).replace(/_/g, " "),
    backend: String(info.backend),
    storage: usdPlain(info.storage_usd_per_month || 0) + " a month",
    layer_requests: int(6 * c.n_layer),
    query_min_gb: r ? String(r.query_min_gb) : "",
    query_per_pb: r ? "$" + r.query_per_pb : "",
    returned_per_gb: r ? "$" + r.returned_per_gb : "",
    write_per_gb: r ? "$" + r.write_per_gb : "",
    write_min_kb: r ? String(r.write_min_kb) : "",
    rates_date: r ? String(r.date) : "",
  };
}

export function initHow() {
  api("GET", "/api/info").then((info) => {
    const v = values(info);
    document.querySelectorAll("[data-live]").forEach((el) => {
      if (v[el.dataset.live] !== undefined) el.textContent = v[el.dataset.live];
    });
    const fig = $("how-figures");
    if (fig) fig.classList.add("loaded");
  }).catch(showError);
}
