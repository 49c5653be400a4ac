/* int8 in C: symmetric absmax quantisation to signed bytes with one binary32 scale per chunk,
 * the same payload, arithmetic and messages as plugins/lsgd-codec/src/int8.rs (and wire.rs), so
 * that `lsgd-host compare codec-int8 codec-int8-c` finds identical payload bytes and
 * bit-identical reconstructions.
 *
 * Payload of a bucket of n floats in chunks of `chunk`: ceil(n / chunk) scales as little-endian
 * binary32, then n signed bytes q; the last chunk may be short. Per chunk, with max = max|x|:
 *   - a NaN or an infinity in the chunk: scale NaN (0x7fc00000), every q 0 (decodes to NaN);
 *   - else scale = max / 127 and inv = 1 / scale; if inv is not finite (max is 0, or below
 *     about 2^-121): scale 0, every q 0 (decodes to 0);
 *   - else q = x * inv rounded half to even (|x * inv| < 127.5, so q fits an i8).
 * decode: x = (float)q * scale.
 *
 * The hot loops use wasm SIMD through clang's target attribute, so the kit's build flags need no
 * -msimd128; the vector lanes do exactly the scalar operations of the tails. */
#include <wasm_simd128.h>

#include "lsgd_kit.h"

#define SIMD __attribute__((target("simd128")))

/* Elements sharing one scale; set by configure. */
static uint32_t chunk = 1024;

void exports_lsgd_policy_plugin_describe(exports_lsgd_policy_plugin_plugin_info_t *ret) {
  lsgd_spec_t specs[] = {
      lsgd_spec_integer("chunk", 1024, "elements sharing one scale (>= 1)"),
  };
  lsgd_info(ret, "int8", "1.0.0",
            "8-bit absmax quantisation: one f32 scale per chunk, one i8 per element, all-gathered",
            specs, 1);
}

bool exports_lsgd_policy_plugin_configure(exports_lsgd_policy_plugin_list_param_t *params,
                                          lsgd_string_t *err) {
  exports_lsgd_policy_plugin_plugin_info_t info;
  exports_lsgd_policy_plugin_describe(&info);
  lsgd_params_t p;
  uint32_t c;
  /* integer_in(p, "chunk", 1, u32::MAX): "chunk must be in [1, 4294967295], got 0". */
  bool ok = lsgd_resolve(&info, params, &p, err) && lsgd_u32_at_least(&p, "chunk", 1, &c, err);
  if (ok) chunk = c;
  exports_lsgd_policy_plugin_plugin_info_free(&info);
  exports_lsgd_policy_plugin_list_param_free(params);
  return ok;
}

void exports_lsgd_policy_codec_properties(exports_lsgd_policy_codec_codec_properties_t *ret) {
  ret->combine.tag = EXPORTS_LSGD_POLICY_CODEC_COMBINE_GATHER;
  ret->rounds = 1;
}

/* ---- the per-element rules ------------------------------------------------------------------ */

static uint32_t bits_of(float x) {
  uint32_t b;
  memcpy(&b, &x, 4);
  return b;
}

static float float_of(uint32_t b) {
  float x;
  memcpy(&x, &b, 4);
  return x;
}

/* 1.5 * 2^23: adding it rounds |v| < 2^22 to an integer k, ties to even (the binary32 rounding
 * mode), and leaves k in the low mantissa bits; the same as rintf(v) in the default rounding
 * mode, and the exact operations of the Rust reference. */
#define MAGIC 12582912.0f
#define MAGIC_BITS 0x4b400000u

/* q = x * inv rounded half to even, as an i8 byte. */
static uint8_t quantise_one(float x, float inv) {
  return (uint8_t)(bits_of(x * inv + MAGIC) - MAGIC_BITS);
}

static float dequantise_one(uint8_t q, float scale) { return (float)(int8_t)q * scale; }

/* |x| as the integer its bit pattern is: these order like the values, every NaN above +inf. */
static int32_t abs_bits(float x) { return (int32_t)(bits_of(x) & 0x7fffffffu); }

/* ---- the hot loops: 16 elements (one i8x16 of payload) per iteration, then a scalar tail ---- */

/* The largest abs_bits over xs[0..n) (0 when n is 0). */
SIMD static int32_t max_abs_bits(const float *xs, size_t n) {
  const v128_t mask = wasm_i32x4_splat(0x7fffffff);
  v128_t m0 = wasm_i32x4_splat(0), m1 = m0, m2 = m0, m3 = m0;
  size_t i = 0;
  for (; n - i >= 16; i += 16) {
    m0 = wasm_i32x4_max(m0, wasm_v128_and(wasm_v128_load(xs + i), mask));
    m1 = wasm_i32x4_max(m1, wasm_v128_and(wasm_v128_load(xs + i + 4), mask));
    m2 = wasm_i32x4_max(m2, wasm_v128_and(wasm_v128_load(xs + i + 8), mask));
    m3 = wasm_i32x4_max(m3, wasm_v128_and(wasm_v128_load(xs + i + 12), mask));
  }
  v128_t v = wasm_i32x4_max(wasm_i32x4_max(m0, m1), wasm_i32x4_max(m2, m3));
  int32_t m = wasm_i32x4_extract_lane(v, 0);
  int32_t lanes[3] = {wasm_i32x4_extract_lane(v, 1), wasm_i32x4_extract_lane(v, 2),
                      wasm_i32x4_extract_lane(v, 3)};
  for (int k = 0; k < 3; k++)
    if (lanes[k] > m) m = lanes[k];
  for (; i < n; i++)
    if (abs_bits(xs[i]) > m) m = abs_bits(xs[i]);
  return m;
}

/* q[i] = quantise_one(xs[i], inv) for i < n. */
SIMD static void quantise(const float *xs, size_t n, float inv, uint8_t *q) {
  const v128_t vinv = wasm_f32x4_splat(inv), magic = wasm_f32x4_splat(MAGIC);
  const v128_t magic_bits = wasm_i32x4_splat((int32_t)MAGIC_BITS);
  size_t i = 0;
  for (; n - i >= 16; i += 16) {
    v128_t k[4];
    for (int j = 0; j < 4; j++)
      k[j] = wasm_i32x4_sub(
          wasm_f32x4_add(wasm_f32x4_mul(wasm_v128_load(xs + i + 4 * j), vinv), magic),
          magic_bits);
    /* k is within [-127, 127], so the saturating narrows are exact. */
    wasm_v128_store(q + i, wasm_i8x16_narrow_i16x8(wasm_i16x8_narrow_i32x4(k[0], k[1]),
                                                   wasm_i16x8_narrow_i32x4(k[2], k[3])));
  }
  for (; i < n; i++) q[i] = quantise_one(xs[i], inv);
}

/* out[i] = dequantise_one(q[i], scale) for i < n. */
SIMD static void dequantise(const uint8_t *q, size_t n, float scale, float *out) {
  const v128_t vs = wasm_f32x4_splat(scale);
  size_t i = 0;
  for (; n - i >= 16; i += 16) {
    v128_t v = wasm_v128_load(q + i);
    v128_t lo = wasm_i16x8_extend_low_i8x16(v), hi = wasm_i16x8_extend_high_i8x16(v);
    v128_t parts[4] = {wasm_i32x4_extend_low_i16x8(lo), wasm_i32x4_extend_high_i16x8(lo),
                       wasm_i32x4_extend_low_i16x8(hi), wasm_i32x4_extend_high_i16x8(hi)};
    for (int j = 0; j < 4; j++)
      wasm_v128_store(out + i + 4 * j, wasm_f32x4_mul(wasm_f32x4_convert_i32x4(parts[j]), vs));
  }
  for (; i < n; i++) out[i] = dequantise_one(q[i], scale);
}

/* ---- encode and decode ---------------------------------------------------------------------- */

/* A buffer for a result list (freed by the bindings' post-return); NULL for an empty one. Out
 * of memory traps, as a Rust guest's allocation failure does. */
static void *alloc(size_t bytes) {
  if (bytes == 0) return NULL;
  void *p = malloc(bytes);
  if (!p) abort();
  return p;
}

/* Every argument is the callee's to free. */
static void free_args(exports_lsgd_policy_codec_bucket_meta_t *meta, lsgd_list_list_u8_t *lists) {
  exports_lsgd_policy_codec_bucket_meta_free(meta);
  lsgd_list_list_u8_free(lists);
}

static bool encode(const exports_lsgd_policy_codec_bucket_meta_t *meta, const lsgd_list_f32_t *data,
                   lsgd_list_u8_t *ret, lsgd_string_t *err) {
  if (data->len != meta->len)
    return lsgd_fail(err, "encode got %zu floats for a bucket of %u", data->len, meta->len);
  size_t n = data->len, c = chunk;
  *ret = (lsgd_list_u8_t){NULL, 0};
  if (n == 0) return true;
  size_t chunks = n / c + (n % c != 0);
  /* n floats are in memory, so 4 * chunks + n <= 5n bytes fits the 32-bit size_t. */
  ret->len = 4 * chunks + n;
  ret->ptr = alloc(ret->len);
  uint8_t *scales = ret->ptr, *values = ret->ptr + 4 * chunks;
  const float *x = data->ptr;
  for (size_t left = n; left > 0;) {
    size_t len = left < c ? left : c;
    float max = float_of((uint32_t)max_abs_bits(x, len));
    float scale = 0.0f;
    bool quantised = false;
    if (!isfinite(max)) {
      scale = float_of(0x7fc00000u); /* f32::NAN */
    } else {
      float s = max / 127.0f;
      float inv = 1.0f / s;
      if (isfinite(inv)) {
        scale = s;
        quantise(x, len, inv, values);
        quantised = true;
      }
    }
    if (!quantised) memset(values, 0, len);
    uint32_t b = bits_of(scale);
    for (int k = 0; k < 4; k++) scales[k] = (uint8_t)(b >> (8 * k));
    scales += 4;
    values += len;
    x += len;
    left -= len;
  }
  return true;
}

bool exports_lsgd_policy_codec_encode(exports_lsgd_policy_codec_bucket_meta_t *meta,
                                      lsgd_list_f32_t *data, lsgd_list_list_u8_t *agreed,
                                      lsgd_list_u8_t *ret, lsgd_string_t *err) {
  bool ok = encode(meta, data, ret, err);
  lsgd_list_f32_free(data);
  free_args(meta, agreed);
  return ok;
}

/* The checks of lsgd_codec's expect_rounds, scale_bytes and wire::Reader, in their order and
 * with their messages. Sizes are those of the wasm32 Rust guest, whose usize is 32 bits: the
 * scale header overflows when ceil(n / chunk) * 4 exceeds 2^32 - 1. */
static bool decode(const exports_lsgd_policy_codec_bucket_meta_t *meta,
                   const lsgd_list_list_u8_t *payloads, lsgd_list_f32_t *ret, lsgd_string_t *err) {
  if (payloads->len != 1)
    return lsgd_fail(err, "decode needs 1 payload(s), one per round, but got %zu", payloads->len);
  const lsgd_list_u8_t *p = &payloads->ptr[0];
  uint64_t n = meta->len, c = chunk, have = p->len;
  uint64_t scale_bytes = (n / c + (n % c != 0)) * 4;
  if (scale_bytes > UINT32_MAX)
    return lsgd_fail(err, "malformed payload: %llu elements need too many scales",
                     (unsigned long long)n);
  if (scale_bytes > have)
    return lsgd_fail(err,
                     "malformed payload: the scales needs %llu bytes at offset 0, but the payload "
                     "has %llu",
                     (unsigned long long)scale_bytes, (unsigned long long)have);
  if (scale_bytes + n > have)
    return lsgd_fail(err,
                     "malformed payload: the values needs %llu bytes at offset %llu, but the "
                     "payload has %llu",
                     (unsigned long long)n, (unsigned long long)scale_bytes,
                     (unsigned long long)have);
  if (scale_bytes + n < have)
    return lsgd_fail(err, "malformed payload: %llu trailing bytes after offset %llu",
                     (unsigned long long)(have - scale_bytes - n),
                     (unsigned long long)(scale_bytes + n));
  *ret = (lsgd_list_f32_t){NULL, 0};
  if (n == 0) return true;
  /* n <= the payload's length; a Rust Vec of more than isize::MAX bytes is a capacity-overflow
   * trap, and so is this (no payload that long fits the instance's memory anyway). */
  if (n > (uint64_t)PTRDIFF_MAX / sizeof(float)) abort();
  ret->len = (size_t)n;
  ret->ptr = alloc(ret->len * sizeof(float));
  const uint8_t *scales = p->ptr, *values = p->ptr + scale_bytes;
  float *out = ret->ptr;
  for (size_t left = (size_t)n; left > 0;) {
    size_t len = left < c ? left : (size_t)c;
    uint32_t b = (uint32_t)scales[0] | (uint32_t)scales[1] << 8 | (uint32_t)scales[2] << 16 |
                 (uint32_t)scales[3] << 24;
    dequantise(values, len, float_of(b), out);
    scales += 4;
    values += len;
    out += len;
    left -= len;
  }
  return true;
}

bool exports_lsgd_policy_codec_decode(exports_lsgd_policy_codec_bucket_meta_t *meta,
                                      lsgd_list_list_u8_t *payloads, lsgd_list_f32_t *ret,
                                      lsgd_string_t *err) {
  bool ok = decode(meta, payloads, ret, err);
  free_args(meta, payloads);
  return ok;
}
