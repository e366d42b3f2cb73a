// Numbers as a learner reads them, and probabilities from stored logits.

const nf = new Intl.NumberFormat("en-US");
export const int = (n) => nf.format(n);

export function pct(p) {
  if (p >= 0.9995) return "100%";
  if (p >= 0.1) return (p * 100).toFixed(1) + "%";
  if (p >= 0.0001) return (p * 100).toFixed(2) + "%";
  if (p > 0) return "<0.01%";
  return "0%";
}

export function ms(x) {
  if (x >= 1000) return (x / 1000).toFixed(2) + " s";
  if (x >= 100) return x.toFixed(0) + " ms";
  if (x >= 10) return x.toFixed(1) + " ms";
  return x.toFixed(2) + " ms";
}

export function bytes(n) {
  if (n >= 1e9) return (n / 1e9).toFixed(2) + " GB";
  if (n >= 1e6) return (n / 1e6).toFixed(1) + " MB";
  if (n >= 1e3) return (n / 1e3).toFixed(1) + " kB";
  return n + " B";
}

export function usd(x) {
  if (!x) return "$0";
  if (x >= 1) return "$" + x.toFixed(2);
  if (x >= 0.01) return "$" + x.toFixed(4);
  return "$" + x.toPrecision(3).replace(/\.?0+e/, "e");
}

// Small dollar amounts without exponents: $0.0000248
export function usdPlain(x) {
  if (!x) return "$0";
  if (x >= 0.01) return "$" + x.toFixed(4);
  const digits = Math.min(12, Math.max(2, 2 - Math.floor(Math.log10(x))));
  return "$" + x.toFixed(digits);
}

// Millionths of a dollar, 3 significant digits: a request costs a few of them.
export function micro(x) {
  const u = x * 1e6;
  if (!u) return "0";
  if (u >= 1000) return nf.format(Math.round(u));
  return String(Number(u.toPrecision(3)));
}

export const logit = (x) => x.toFixed(4);
export const baseName = (s) => String(s).split(/[\\/]/).filter(Boolean).pop() || String(s);
export const plural = (n, one, many = one + "s") => `${int(n)} ${n === 1 ? one : many}`;

// Probabilities at temperature T from the stored logits, as the server computes them:
// softmax(logit / T) over the candidates; T = 0 puts all the mass on the best.
export function probsAt(logits, T) {
  const n = logits.length;
  const p = new Array(n).fill(0);
  if (!n) return p;
  if (T === 0) {
    let best = 0;
    for (let i = 1; i < n; i++) if (logits[i] > logits[best]) best = i;
    p[best] = 1;
    return p;
  }
  // subtract the best logit before dividing, so a tiny T gives 0s, never NaN
  let mx = -Infinity;
  for (const l of logits) mx = Math.max(mx, l);
  let sum = 0;
  for (let i = 0; i < n; i++) { p[i] = Math.exp((logits[i] - mx) / T); sum += p[i]; }
  for (let i = 0; i < n; i++) p[i] /= sum;
  return p;
}

// A log's round trips as the server counts them (session.Request.round_trips): a request
// split over several store calls is that many; a concurrent one (a decode step's key
// write, run beside the searches) none. For views whose JSON carries no count of its own.
export const roundTrips = (log) => (log || []).reduce((n, r) => n + (r.concurrent ? 0 : (r.parts || 1)), 0);
