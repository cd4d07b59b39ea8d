// XLA:CPU kernels for the fused embedding update, called through the XLA FFI (jax.ffi.ffi_call); the XLA ops
// they replace are their fallback and their reference (optimizers/kernels/__init__.py):
//
//   rr_dedupe:           the sorted, static-size unique of int32 keys in [0, fill] and each key's run index, by
//                        a stable LSD radix sort (XLA:CPU sorts through a comparator it calls per comparison).
//                        Exactly the XLA ops' result.
//   rr_rowwise_adagrad:  row-wise Adagrad's gather, rule, gate and in-place scatter over a batch's unique rows
//                        in one pass (optimizers/row_update.py's write_rows on one device): the touched rows are
//                        prefetched a few rows ahead, since on a CPU their random reads are latency-bound.
//                        The same arithmetic as the XLA ops, summed in another order (float32 rounding apart).
//
// Built on first use by optimizers/kernels/build.py with the headers jaxlib ships (jax.ffi.include_dir()).
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
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
  if (static_cast<int64_t>(seg->element_count()) != n) return ffi::Error::InvalidArgument("rr_dedupe: seg must hold one id per key");
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

// Row-wise Adagrad over the unique rows ids[i] (outside [0, rows): padding, skipped) with their summed gradients
// grads[i]: accum = accum * factor + mean(g**2), row -= lr * (g / (sqrt(accum) + eps) + weight_decay * row),
// factor = 1, decay, or decay**(step - last_step) (lazy). Every new row and accumulator is computed first; only
// when all are finite, the norm of grads is finite and the update is pending are they written (in place: the
// outputs alias the table and its state), with last_step = step. Returns the norm, whether it wrote, and how
// many rows it wrote.
ffi::Error RowwiseAdagrad(ffi::Buffer<ffi::F32> table, ffi::Buffer<ffi::F32> accum, ffi::Buffer<ffi::S32> last,
                          ffi::Buffer<ffi::S32> ids, ffi::Buffer<ffi::F32> grads, ffi::Buffer<ffi::F32> lr_in,
                          ffi::Buffer<ffi::S32> step_in, ffi::Buffer<ffi::PRED> pending_in, ffi::Buffer<ffi::F32>,
                          ffi::ResultBuffer<ffi::F32> table_out, ffi::ResultBuffer<ffi::F32> accum_out,
                          ffi::ResultBuffer<ffi::S32> last_out, ffi::ResultBuffer<ffi::F32> norm_out,
                          ffi::ResultBuffer<ffi::PRED> valid_out, ffi::ResultBuffer<ffi::S32> written_out,
                          float eps, float decay, bool lazy, float weight_decay) {
  if (table.dimensions().size() != 2 || grads.dimensions().size() != 2 ||
      grads.dimensions()[1] != table.dimensions()[1] || grads.dimensions()[0] != static_cast<int64_t>(ids.element_count()) ||
      static_cast<int64_t>(accum.element_count()) != table.dimensions()[0] ||
      static_cast<int64_t>(last.element_count()) != table.dimensions()[0])
    return ffi::Error::InvalidArgument("rr_rowwise_adagrad: table [rows, d], accum and last_step [rows], "
                                       "ids [n] and grads [n, d] expected");
  const int64_t rows = table.dimensions()[0], d = table.dimensions()[1];
  const int64_t n = static_cast<int64_t>(ids.element_count());
  float* t = table_out->typed_data();
  float* acc = accum_out->typed_data();
  int32_t* lst = last_out->typed_data();
  if (t != table.typed_data() || acc != accum.typed_data() || lst != last.typed_data())
    return ffi::Error::Internal("rr_rowwise_adagrad: the outputs must alias the table and its state");
  const int32_t* ix = ids.typed_data();
  const float* g = grads.typed_data();
  const float lr = lr_in.typed_data()[0];
  const int32_t step = step_in.typed_data()[0];
  const bool pending = pending_in.typed_data()[0];
  static thread_local std::vector<float> new_rows, new_acc;  // reused: no allocation or page faults per step
  if (static_cast<int64_t>(new_rows.size()) < n * d) new_rows.resize(n * d);
  if (static_cast<int64_t>(new_acc.size()) < n) new_acc.resize(n);
  constexpr int64_t kAhead = 12;  // rows prefetched ahead of the one being computed
  constexpr int kLanes = 8;
  const int64_t body = d - d % kLanes;
  auto owned = [&](int64_t i) { return ix[i] >= 0 && ix[i] < rows; };
  float sq = 0.0f;
  bool bad = false;
  for (int64_t i = 0; i < n; ++i) {
    if (i + kAhead < n && owned(i + kAhead)) {
      const int64_t k = ix[i + kAhead];
      const char* p = reinterpret_cast<const char*>(t + k * d);
      for (int64_t b = 0; b < d * static_cast<int64_t>(sizeof(float)); b += 64) __builtin_prefetch(p + b);
      __builtin_prefetch(acc + k);
      __builtin_prefetch(lst + k);
    }
    const float* gi = g + i * d;
    float part[kLanes] = {};
    for (int64_t j = 0; j < body; j += kLanes)
      for (int q = 0; q < kLanes; ++q) part[q] += gi[j + q] * gi[j + q];
    float row_sq = 0.0f;
    for (int q = 0; q < kLanes; ++q) row_sq += part[q];
    for (int64_t j = body; j < d; ++j) row_sq += gi[j] * gi[j];
    sq += row_sq;
    if (!owned(i)) continue;
    const int64_t k = ix[i];
    float factor = 1.0f;
    if (decay != 1.0f) factor = lazy ? std::pow(decay, static_cast<float>(step - lst[k])) : decay;
    const float a = acc[k] * factor + row_sq / static_cast<float>(d);
    const float scale = 1.0f / (std::sqrt(a) + eps);
    const float* row = t + k * d;
    float* out = new_rows.data() + i * d;
    float probe[kLanes] = {};  // w * 0 is NaN exactly when w is NaN or infinite
    for (int64_t j = 0; j < body; j += kLanes)
      for (int q = 0; q < kLanes; ++q) {
        const float w = row[j + q] - lr * (gi[j + q] * scale + weight_decay * row[j + q]);
        out[j + q] = w;
        probe[q] += w * 0.0f;
      }
    float check = a * 0.0f;
    for (int64_t j = body; j < d; ++j) {
      out[j] = row[j] - lr * (gi[j] * scale + weight_decay * row[j]);
      check += out[j] * 0.0f;
    }
    for (int q = 0; q < kLanes; ++q) check += probe[q];
    new_acc[i] = a;
    bad |= check != check;
  }
  const float norm = std::sqrt(sq);
  const bool valid = std::isfinite(norm) && pending && !bad;
  int32_t written = 0;
  if (valid) {
    for (int64_t i = 0; i < n; ++i) {
      if (!owned(i)) continue;
      if (i + kAhead < n && owned(i + kAhead)) __builtin_prefetch(t + static_cast<int64_t>(ix[i + kAhead]) * d, 1);
      const int64_t k = ix[i];
      std::memcpy(t + k * d, new_rows.data() + i * d, sizeof(float) * d);
      acc[k] = new_acc[i];
      lst[k] = step;
      ++written;
    }
  }
  norm_out->typed_data()[0] = norm;
  valid_out->typed_data()[0] = valid;
  written_out->typed_data()[0] = written;
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
                                  .Attr<bool>("lazy")
                                  .Attr<float>("weight_decay"));
