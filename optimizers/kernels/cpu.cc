// XLA:CPU kernels for the fused embedding update, called through the XLA FFI (jax.ffi.ffi_call); the XLA ops
// they replace are their fallback and their reference (optimizers/kernels/__init__.py):
//
//   rr_dedupe:           the sorted, static-size unique of int32 keys in [0, fill] and each key's run index, by
//                        a stable LSD radix sort (XLA:CPU sorts through a comparator it calls per comparison).
//                        Exactly the XLA ops' result.
//   rr_rowwise_adagrad,  an optimizer's gather, rule, gate and in-place scatter over a batch's unique rows in
//   rr_adam:             one pass (optimizers/row_update.py's write_rows on one device), the touched rows
//                        prefetched a few rows ahead, since on a CPU their random reads are latency-bound. The
//                        same arithmetic as the XLA ops, sums taken in another order (float32 rounding apart).
//
// Built on first use by optimizers/kernels/build.py with the headers jaxlib ships (jax.ffi.include_dir()).
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

#include "xla/ffi/api/ffi.h"

namespace ffi = xla::ffi;

namespace {

// keys [n] int32 in [0, fill] -> unique [u]: the distinct keys ascending, then fill; seg [n]: each key's index
// into them (its run in sorted order). Keys outside [0, fill] are refused (the caller maps them to fill).
ffi::Error Dedupe(ffi::Buffer<ffi::S32> keys, ffi::ResultBuffer<ffi::S32> unique, ffi::ResultBuffer<ffi::S32> seg,
                  int64_t fill) {
  const int64_t n = keys.element_count();
  const int64_t u = unique->element_count();
  if (static_cast<int64_t>(seg->element_count()) != n)
    return ffi::Error::InvalidArgument("rr_dedupe: seg must hold one id per key");
  if (fill < 0 || fill > INT32_MAX) return ffi::Error::InvalidArgument("rr_dedupe: fill must be in [0, 2**31)");
  const int32_t* k = keys.typed_data();
  int32_t* out_u = unique->typed_data();
  int32_t* out_s = seg->typed_data();
  std::vector<uint32_t> key(n), key2(n), pos(n), pos2(n);
  for (int64_t i = 0; i < n; ++i) {
    if (k[i] < 0 || k[i] > fill) return ffi::Error::InvalidArgument("rr_dedupe: a key outside [0, fill]");
    key[i] = static_cast<uint32_t>(k[i]);
    pos[i] = static_cast<uint32_t>(i);
  }
  int bits = 0;
  while (bits < 32 && (static_cast<uint64_t>(fill) >> bits) != 0) ++bits;
  constexpr int kDigit = 11;
  constexpr uint32_t kMask = (1u << kDigit) - 1;
  std::vector<uint32_t> count(1u << kDigit);
  for (int shift = 0; shift < bits; shift += kDigit) {  // stable: equal keys keep their token order
    std::fill(count.begin(), count.end(), 0u);
    for (int64_t i = 0; i < n; ++i) ++count[(key[i] >> shift) & kMask];
    uint32_t sum = 0;
    for (uint32_t& c : count) {
      const uint32_t here = c;
      c = sum;
      sum += here;
    }
    for (int64_t i = 0; i < n; ++i) {
      const uint32_t at = count[(key[i] >> shift) & kMask]++;
      key2[at] = key[i];
      pos2[at] = pos[i];
    }
    key.swap(key2);
    pos.swap(pos2);
  }
  int64_t run = -1;
  for (int64_t i = 0; i < n; ++i) {
    if (i == 0 || key[i] != key[i - 1]) {
      ++run;
      if (run < u) out_u[run] = static_cast<int32_t>(key[i]);
    }
    out_s[pos[i]] = static_cast<int32_t>(run);
  }
  for (int64_t r = std::max<int64_t>(run + 1, 0); r < u; ++r) out_u[r] = static_cast<int32_t>(fill);
  return ffi::Error::Success();
}

// The fused write shared by every rule: for each unique row ids[i] (outside [0, rows): padding, skipped) with
// its summed gradient grads[i], the rule computes the new row into a scratch buffer and its new state into its
// own; only when every new value is finite, the norm of grads is finite and the update is pending are they
// written (in place: the outputs alias the table and its state). The touched rows and their state are
// prefetched kAhead rows ahead: on a CPU their random reads are latency-bound.
struct Batch {
  float* table;
  int64_t rows, d, n;
  const int32_t* ids;
  const float* grads;
  float lr;
  int32_t step;
  bool pending;
};

template <class Rule>
void FusedWrite(const Batch& b, Rule& rule, float* norm_out, bool* valid_out, int32_t* written_out) {
  auto owned = [&](int64_t i) { return b.ids[i] >= 0 && b.ids[i] < b.rows; };
  int64_t rows_owned = 0;
  for (int64_t i = 0; i < b.n; ++i) rows_owned += owned(i);
  // Scratch for the owned rows' new values, kept by the thread between calls (no allocation or page faults per
  // step); it grows to the largest batch of distinct rows the thread has updated.
  static thread_local std::vector<float> new_rows;
  if (static_cast<int64_t>(new_rows.size()) < rows_owned * b.d) new_rows.resize(rows_owned * b.d);
  rule.reserve(rows_owned, b.d);
  constexpr int64_t kAhead = 12;
  constexpr int kLanes = 8;
  const int64_t d = b.d, body = d - d % kLanes;
  float sq = 0.0f;
  bool bad = false;
  int64_t p = 0;  // owned rows so far
  for (int64_t i = 0; i < b.n; ++i) {
    if (i + kAhead < b.n && owned(i + kAhead)) {
      const int64_t k = b.ids[i + kAhead];
      const char* p = reinterpret_cast<const char*>(b.table + k * d);
      for (int64_t at = 0; at < d * static_cast<int64_t>(sizeof(float)); at += 64) __builtin_prefetch(p + at);
      rule.prefetch(k, d);
    }
    const float* g = b.grads + i * d;
    float part[kLanes] = {};
    for (int64_t j = 0; j < body; j += kLanes)
      for (int q = 0; q < kLanes; ++q) part[q] += g[j + q] * g[j + q];
    float row_sq = 0.0f;
    for (int q = 0; q < kLanes; ++q) row_sq += part[q];
    for (int64_t j = body; j < d; ++j) row_sq += g[j] * g[j];
    sq += row_sq;
    if (!owned(i)) continue;
    // w * 0 is NaN exactly when w is NaN or infinite: the rule adds its new values' products to probe. New
    // values are kept at the owned row's position p (padding takes no scratch).
    const float probe = rule.compute(p, b.ids[i], b.table + b.ids[i] * d, g, row_sq, new_rows.data() + p * d, b);
    bad |= probe != probe;
    ++p;
  }
  const float norm = std::sqrt(sq);
  const bool valid = std::isfinite(norm) && b.pending && !bad;
  int32_t written = 0;
  if (valid) {
    for (int64_t i = 0; i < b.n; ++i) {
      if (!owned(i)) continue;
      if (i + kAhead < b.n && owned(i + kAhead)) __builtin_prefetch(b.table + b.ids[i + kAhead] * d, 1);
      const int64_t k = b.ids[i];
      std::memcpy(b.table + k * d, new_rows.data() + written * d, sizeof(float) * d);
      rule.write(written, k, b);
      ++written;
    }
  }
  *norm_out = norm;
  *valid_out = valid;
  *written_out = written;
}

// Sums w * 0 over a row's new values into 8 lanes (vectorisable) and returns the total: NaN iff one is not finite.
template <class F>
float Each(int64_t d, F&& f) {
  constexpr int kLanes = 8;
  const int64_t body = d - d % kLanes;
  float probe[kLanes] = {};
  for (int64_t j = 0; j < body; j += kLanes)
    for (int q = 0; q < kLanes; ++q) probe[q] += f(j + q) * 0.0f;
  float total = 0.0f;
  for (int64_t j = body; j < d; ++j) total += f(j) * 0.0f;
  for (int q = 0; q < kLanes; ++q) total += probe[q];
  return total;
}

// Row-wise Adagrad: accum = accum * factor + mean(g**2), row -= lr * (g / (sqrt(accum) + eps) + wd * row),
// factor = 1, decay, or decay**(step - last_step) (lazy); last_step = step.
struct RowwiseAdagradRule {
  float *accum;
  int32_t* last;
  float eps, decay, weight_decay;
  bool lazy;
  std::vector<float>* new_accum;
  void reserve(int64_t n, int64_t) {
    static thread_local std::vector<float> scratch;
    if (static_cast<int64_t>(scratch.size()) < n) scratch.resize(n);
    new_accum = &scratch;
  }
  void prefetch(int64_t k, int64_t) {
    __builtin_prefetch(accum + k);
    __builtin_prefetch(last + k);
  }
  float compute(int64_t at, int64_t k, const float* row, const float* g, float row_sq, float* out, const Batch& b) {
    float factor = 1.0f;
    if (decay != 1.0f) factor = lazy ? std::pow(decay, static_cast<float>(b.step - last[k])) : decay;
    const float a = accum[k] * factor + row_sq / static_cast<float>(b.d);
    const float scale = 1.0f / (std::sqrt(a) + eps);
    (*new_accum)[at] = a;
    return a * 0.0f + Each(b.d, [&](int64_t j) {
      return out[j] = row[j] - b.lr * (g[j] * scale + weight_decay * row[j]);
    });
  }
  void write(int64_t at, int64_t k, const Batch& b) {
    accum[k] = (*new_accum)[at];
    last[k] = b.step;
  }
};

// Adam (lazy, per touched row): mu = b1 mu + (1 - b1) g, nu = b2 nu + (1 - b2) g**2, t = the row's own update
// count (per_row) or the table's step, row -= lr * (mu / (1 - b1**t) / (sqrt(nu / (1 - b2**t)) + eps) + wd * row).
struct AdamRule {
  float *mu, *nu;
  int32_t* count;
  float b1, b2, one_minus_b1, one_minus_b2, eps, weight_decay;  // 1 - b: computed exactly on the host
  bool per_row;
  std::vector<float>*new_mu, *new_nu;
  void reserve(int64_t n, int64_t d) {
    static thread_local std::vector<float> m, v;
    if (static_cast<int64_t>(m.size()) < n * d) m.resize(n * d), v.resize(n * d);
    new_mu = &m;
    new_nu = &v;
  }
  void prefetch(int64_t k, int64_t d) {
    const char* pm = reinterpret_cast<const char*>(mu + k * d);
    const char* pv = reinterpret_cast<const char*>(nu + k * d);
    for (int64_t at = 0; at < d * static_cast<int64_t>(sizeof(float)); at += 64) {
      __builtin_prefetch(pm + at);
      __builtin_prefetch(pv + at);
    }
    __builtin_prefetch(count + k);
  }
  float compute(int64_t at, int64_t k, const float* row, const float* g, float, float* out, const Batch& b) {
    const int64_t d = b.d;
    const float t = per_row ? static_cast<float>(count[k] + 1) : static_cast<float>(b.step);
    const float c1 = 1.0f - std::pow(b1, t), c2 = 1.0f - std::pow(b2, t);
    const float* m0 = mu + k * d;
    const float* v0 = nu + k * d;
    float* m = new_mu->data() + at * d;
    float* v = new_nu->data() + at * d;
    return Each(d, [&](int64_t j) {
      m[j] = b1 * m0[j] + one_minus_b1 * g[j];
      v[j] = b2 * v0[j] + one_minus_b2 * g[j] * g[j];
      out[j] = row[j] - b.lr * ((m[j] / c1) / (std::sqrt(v[j] / c2) + eps) + weight_decay * row[j]);
      return out[j] * 0.0f + m[j] * 0.0f + v[j] * 0.0f;  // no sum that could overflow a finite value
    });
  }
  void write(int64_t at, int64_t k, const Batch& b) {
    const int64_t d = b.d;
    std::memcpy(mu + k * d, new_mu->data() + at * d, sizeof(float) * d);
    std::memcpy(nu + k * d, new_nu->data() + at * d, sizeof(float) * d);
    count[k] += 1;
  }
};

ffi::Error CheckShapes(const char* name, ffi::Buffer<ffi::F32>& table, ffi::Buffer<ffi::S32>& ids,
                       ffi::Buffer<ffi::F32>& grads, ffi::ResultBuffer<ffi::F32>& table_out) {
  if (table.dimensions().size() != 2 || grads.dimensions().size() != 2 ||
      grads.dimensions()[1] != table.dimensions()[1] ||
      grads.dimensions()[0] != static_cast<int64_t>(ids.element_count()))
    return ffi::Error::InvalidArgument(std::string(name) + ": table [rows, d], ids [n] and grads [n, d] expected");
  if (table_out->typed_data() != table.typed_data())
    return ffi::Error::Internal(std::string(name) + ": the outputs must alias the table and its state");
  return ffi::Error::Success();
}

Batch MakeBatch(ffi::ResultBuffer<ffi::F32>& table, ffi::Buffer<ffi::S32>& ids, ffi::Buffer<ffi::F32>& grads,
                ffi::Buffer<ffi::F32>& lr, ffi::Buffer<ffi::S32>& step, ffi::Buffer<ffi::PRED>& pending) {
  return Batch{table->typed_data(), table->dimensions()[0], table->dimensions()[1],
               static_cast<int64_t>(ids.element_count()), ids.typed_data(), grads.typed_data(),
               lr.typed_data()[0], step.typed_data()[0], pending.typed_data()[0]};
}

ffi::Error RowwiseAdagrad(ffi::Buffer<ffi::F32> table, ffi::Buffer<ffi::F32> accum, ffi::Buffer<ffi::S32> last,
                          ffi::Buffer<ffi::S32> ids, ffi::Buffer<ffi::F32> grads, ffi::Buffer<ffi::F32> lr,
                          ffi::Buffer<ffi::S32> step, ffi::Buffer<ffi::PRED> pending, ffi::Buffer<ffi::F32>,
                          ffi::ResultBuffer<ffi::F32> table_out, ffi::ResultBuffer<ffi::F32> accum_out,
                          ffi::ResultBuffer<ffi::S32> last_out, ffi::ResultBuffer<ffi::F32> norm,
                          ffi::ResultBuffer<ffi::PRED> valid, ffi::ResultBuffer<ffi::S32> written,
                          float eps, float decay, float weight_decay, bool lazy) {
  if (auto err = CheckShapes("rr_rowwise_adagrad", table, ids, grads, table_out); err.failure()) return err;
  const int64_t rows = table.dimensions()[0];
  if (static_cast<int64_t>(accum.element_count()) != rows || static_cast<int64_t>(last.element_count()) != rows ||
      accum_out->typed_data() != accum.typed_data() || last_out->typed_data() != last.typed_data())
    return ffi::Error::InvalidArgument("rr_rowwise_adagrad: accum and last_step [rows], aliased, expected");
  Batch b = MakeBatch(table_out, ids, grads, lr, step, pending);
  RowwiseAdagradRule rule{accum_out->typed_data(), last_out->typed_data(), eps, decay, weight_decay, lazy, nullptr};
  FusedWrite(b, rule, norm->typed_data(), valid->typed_data(), written->typed_data());
  return ffi::Error::Success();
}

ffi::Error Adam(ffi::Buffer<ffi::F32> table, ffi::Buffer<ffi::F32> mu, ffi::Buffer<ffi::F32> nu,
                ffi::Buffer<ffi::S32> count, ffi::Buffer<ffi::S32> ids, ffi::Buffer<ffi::F32> grads,
                ffi::Buffer<ffi::F32> lr, ffi::Buffer<ffi::S32> step, ffi::Buffer<ffi::PRED> pending,
                ffi::Buffer<ffi::F32>, ffi::ResultBuffer<ffi::F32> table_out, ffi::ResultBuffer<ffi::F32> mu_out,
                ffi::ResultBuffer<ffi::F32> nu_out, ffi::ResultBuffer<ffi::S32> count_out,
                ffi::ResultBuffer<ffi::F32> norm, ffi::ResultBuffer<ffi::PRED> valid,
                ffi::ResultBuffer<ffi::S32> written, float b1, float b2, float one_minus_b1, float one_minus_b2,
                float eps, float weight_decay, bool per_row) {
  if (auto err = CheckShapes("rr_adam", table, ids, grads, table_out); err.failure()) return err;
  if (mu.element_count() != table.element_count() || nu.element_count() != table.element_count() ||
      static_cast<int64_t>(count.element_count()) != table.dimensions()[0] ||
      mu_out->typed_data() != mu.typed_data() || nu_out->typed_data() != nu.typed_data() ||
      count_out->typed_data() != count.typed_data())
    return ffi::Error::InvalidArgument("rr_adam: mu and nu [rows, d] and count [rows], aliased, expected");
  Batch b = MakeBatch(table_out, ids, grads, lr, step, pending);
  AdamRule rule{mu_out->typed_data(), nu_out->typed_data(), count_out->typed_data(), b1, b2, one_minus_b1,
                one_minus_b2, eps, weight_decay, per_row, nullptr, nullptr};
  FusedWrite(b, rule, norm->typed_data(), valid->typed_data(), written->typed_data());
  return ffi::Error::Success();
}

}  // namespace

XLA_FFI_DEFINE_HANDLER_SYMBOL(RrDedupe, Dedupe,
                              ffi::Ffi::Bind()
                                  .Arg<ffi::Buffer<ffi::S32>>()
                                  .Ret<ffi::Buffer<ffi::S32>>()
                                  .Ret<ffi::Buffer<ffi::S32>>()
                                  .Attr<int64_t>("fill"));

XLA_FFI_DEFINE_HANDLER_SYMBOL(RrRowwiseAdagrad, RowwiseAdagrad,
                              ffi::Ffi::Bind()
                                  .Arg<ffi::Buffer<ffi::F32>>()   // table [rows, d]
                                  .Arg<ffi::Buffer<ffi::F32>>()   // accum [rows]
                                  .Arg<ffi::Buffer<ffi::S32>>()   // last_step [rows]
                                  .Arg<ffi::Buffer<ffi::S32>>()   // ids [n]
                                  .Arg<ffi::Buffer<ffi::F32>>()   // grads [n, d]
                                  .Arg<ffi::Buffer<ffi::F32>>()   // learning rate []
                                  .Arg<ffi::Buffer<ffi::S32>>()   // step []
                                  .Arg<ffi::Buffer<ffi::PRED>>()  // pending []
                                  .Arg<ffi::Buffer<ffi::F32>>()   // gate []: orders the write after the lookups
                                  .Ret<ffi::Buffer<ffi::F32>>()
                                  .Ret<ffi::Buffer<ffi::F32>>()
                                  .Ret<ffi::Buffer<ffi::S32>>()
                                  .Ret<ffi::Buffer<ffi::F32>>()   // norm []
                                  .Ret<ffi::Buffer<ffi::PRED>>()  // valid []
                                  .Ret<ffi::Buffer<ffi::S32>>()   // rows written [1]
                                  .Attr<float>("eps")
                                  .Attr<float>("decay")
                                  .Attr<float>("weight_decay")
                                  .Attr<bool>("lazy"));

XLA_FFI_DEFINE_HANDLER_SYMBOL(RrAdam, Adam,
                              ffi::Ffi::Bind()
                                  .Arg<ffi::Buffer<ffi::F32>>()   // table [rows, d]
                                  .Arg<ffi::Buffer<ffi::F32>>()   // mu [rows, d]
                                  .Arg<ffi::Buffer<ffi::F32>>()   // nu [rows, d]
                                  .Arg<ffi::Buffer<ffi::S32>>()   // count [rows]
                                  .Arg<ffi::Buffer<ffi::S32>>()   // ids [n]
                                  .Arg<ffi::Buffer<ffi::F32>>()   // grads [n, d]
                                  .Arg<ffi::Buffer<ffi::F32>>()   // learning rate []
                                  .Arg<ffi::Buffer<ffi::S32>>()   // step []
                                  .Arg<ffi::Buffer<ffi::PRED>>()  // pending []
                                  .Arg<ffi::Buffer<ffi::F32>>()   // gate []
                                  .Ret<ffi::Buffer<ffi::F32>>()
                                  .Ret<ffi::Buffer<ffi::F32>>()
                                  .Ret<ffi::Buffer<ffi::F32>>()
                                  .Ret<ffi::Buffer<ffi::S32>>()
                                  .Ret<ffi::Buffer<ffi::F32>>()   // norm []
                                  .Ret<ffi::Buffer<ffi::PRED>>()  // valid []
                                  .Ret<ffi::Buffer<ffi::S32>>()   // rows written [1]
                                  .Attr<float>("b1")
                                  .Attr<float>("b2")
                                  .Attr<float>("one_minus_b1")
                                  .Attr<float>("one_minus_b2")
                                  .Attr<float>("eps")
                                  .Attr<float>("weight_decay")
                                  .Attr<bool>("per_row"));
