// Helpers for lsgd:policy plugins in JavaScript (componentize-qjs), for every plugin kind.
//
// describe() helpers build the `plugin-info` record; `resolve` applies the declared defaults and
// checks names and types the way the Rust reference plugins do, and the range checks throw
// their messages word for word, which componentize-qjs turns into configure's `err`. `schedule`
// completes a schedule's exported object (its `momentum`, contract 0.4, defaults to none), and
// `checkSnapshot` reads a stateful plugin's snapshot.

// A schedule's exported object, for any contract version: `learningRate(s)` and, optionally,
// `momentum(s)`. From contract 0.4 the host asks `momentum` right after `learningRate` with the
// same state: a number in [0, 1) sets SGD's momentum (AdamW's beta1) for the step, null keeps
// the configured one, and so does a schedule that defines none. Older contracts never call it.
export const schedule = (impl) => ({ momentum: () => null, ...impl });

// The bytes of a stateful plugin's snapshot (a Uint8Array, or an Array) as a Uint8Array if it
// holds `size` of them; else throws the message `restore` returns (the Rust plugins' words).
export function checkSnapshot(snapshot, size) {
  const bytes = Uint8Array.from(snapshot);
  if (bytes.length !== size) throw `a snapshot of ${bytes.length} bytes, expected ${size}`;
  return bytes;
}

export const floatParam = (name, dflt, doc) => ({
  name, type: { tag: "float" }, default: { tag: "float", val: dflt }, doc,
});
export const integerParam = (name, dflt, doc) => ({
  name, type: { tag: "integer" }, default: { tag: "integer", val: dflt }, doc,
});
export const floatListParam = (name, dflt, doc) => ({
  name, type: { tag: "float-list" }, default: { tag: "float-list", val: dflt }, doc,
});
// A choice whose default is its first word.
export const choiceParam = (name, words, doc) => ({
  name, type: { tag: "choice", val: words }, default: { tag: "text", val: words[0] }, doc,
});

const KINDS = {
  boolean: "a boolean", integer: "an integer", float: "a float", text: "text",
  "float-list": "a list of floats",
};

// The plain values of every declared parameter of `info`, `given` overlaid on the defaults.
export function resolve(info, given) {
  const values = new Map(info.params.map((s) => [s.name, s.default]));
  for (const p of given) {
    const s = info.params.find((s) => s.name === p.name);
    if (!s) {
      const known = info.params.map((s) => s.name).join(", ") || "none";
      throw `unknown parameter '${p.name}' (accepted: ${known})`;
    }
    const want = s.type.tag === "choice" ? "text" : s.type.tag;
    if (p.value.tag !== want) {
      throw `parameter '${p.name}' must be ${KINDS[want]}, got ${KINDS[p.value.tag]}`;
    }
    if (s.type.tag === "choice" && !s.type.val.includes(p.value.val)) {
      throw `parameter '${p.name}' must be one of ${s.type.val.join(", ")}, got '${p.value.val}'`;
    }
    values.set(p.name, p.value);
  }
  const out = {};
  for (const [name, v] of values) {
    if (v == null) throw `missing required parameter '${name}'`;
    out[name] = v.val;
  }
  return out;
}

// `v` as Rust's `{}` prints an f64: shortest round-trip digits, never an exponent.
export function fmt(v) {
  if (Number.isNaN(v)) return "NaN";
  if (!Number.isFinite(v)) return v > 0 ? "inf" : "-inf";
  if (v === 0) return Object.is(v, -0) ? "-0" : "0";
  const [mantissa, exp = "0"] = v.toString().split("e");
  const sign = mantissa.startsWith("-") ? "-" : "";
  const [whole, frac = ""] = mantissa.replace("-", "").split(".");
  let digits = (whole + frac).replace(/^0+/, "");
  const point = whole.length + Number(exp) - ((whole + frac).length - digits.length);
  digits = digits.replace(/0+$/, "");
  if (point <= 0) return `${sign}0.${"0".repeat(-point)}${digits}`;
  if (point >= digits.length) return `${sign}${digits}${"0".repeat(point - digits.length)}`;
  return `${sign}${digits.slice(0, point)}.${digits.slice(point)}`;
}

export function floatAtLeast(p, name, lo) {
  const v = p[name];
  if (!(Number.isFinite(v) && v >= lo)) throw `${name} must be >= ${fmt(lo)}, got ${fmt(v)}`;
  return v;
}

export function u32AtLeast(p, name, lo) {
  const v = p[name];
  if (!(v >= lo && v <= 0xffffffff)) throw `${name} must be in [${lo}, 4294967295], got ${v}`;
  return v;
}

export function milestones(p, name) {
  let prev = 0.0;
  for (const m of p[name]) {
    if (!(Number.isFinite(m) && m >= 0.0)) throw `${name} must all be >= 0, got ${fmt(m)}`;
    if (m < prev) throw `${name} must be ascending, got ${fmt(m)} after ${fmt(prev)}`;
    prev = m;
  }
  return [...p[name]];
}

// How many milestones the fractional epoch `e` has reached (e >= m).
export function passed(ms, e) {
  let n = 0;
  while (n < ms.length && e >= ms[n]) n++;
  return n;
}
