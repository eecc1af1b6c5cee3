#include "coll_ref.h"

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <cstdio>
#include <cstring>
#include <type_traits>

extern "C" {
#include "collectives/reduce/reduce_ops.h"
}

namespace weft_test {

const char *type_name(weftDataType_t t) {
  static const char *n[] = {"int8",   "uint8",  "int32",  "uint32",   "int64",  "uint64",
                            "half",   "float",  "double", "bfloat16", "f8e4m3", "f8e5m2"};
  return (int)t >= 0 && t < weftNumTypes ? n[t] : "?";
}

const char *op_name(weftRedOp_t op) {
  static const char *n[] = {"sum", "prod", "max", "min", "avg"};
  return (int)op >= 0 && op < weftNumOps ? n[op] : "?";
}

float varied_value(uint64_t seed, int rank, size_t i) {
  Rng rng(seed ^ ((uint64_t)rank << 48) ^ (i * 0x9e3779b97f4a7c15ull));
  const double u = rng.uniform() - 0.5;
  const int e = (int)(rng.next() % 24) - 12;
  return (float)std::ldexp(u, e);
}

bool type_is_float(weftDataType_t t) {
  return t == weftFloat16 || t == weftFloat32 || t == weftFloat64 || t == weftBfloat16 ||
         t == weftFloat8e4m3 || t == weftFloat8e5m2;
}

// unit roundoff of one rounding step
static double type_eps(weftDataType_t t) {
  switch (t) {
    case weftFloat16: return std::ldexp(1, -11);
    case weftBfloat16: return std::ldexp(1, -8);
    case weftFloat8e4m3: return std::ldexp(1, -4);
    case weftFloat8e5m2: return std::ldexp(1, -3);
    case weftFloat32: return std::ldexp(1, -24);
    case weftFloat64: return std::ldexp(1, -53);
    default: return 0;
  }
}

// smallest positive subnormal: the absolute floor of rounding error
static double type_tiny(weftDataType_t t) {
  switch (t) {
    case weftFloat16: return std::ldexp(1, -24);
    case weftBfloat16: return std::ldexp(1, -133);
    case weftFloat8e4m3: return std::ldexp(1, -9);
    case weftFloat8e5m2: return std::ldexp(1, -16);
    case weftFloat32: return std::ldexp(1, -149);
    default: return 0;
  }
}

double value_at(weftDataType_t t, const void *buf, size_t i) {
  const uint8_t *p = (const uint8_t *)buf + i * weftTypeSize(t);
  switch (t) {
#define LOAD(T) { T v; memcpy(&v, p, sizeof v); return (double)v; }
    case weftInt8: LOAD(int8_t)
    case weftUint8: LOAD(uint8_t)
    case weftInt32: LOAD(int32_t)
    case weftUint32: LOAD(uint32_t)
    case weftInt64: LOAD(int64_t)
    case weftUint64: LOAD(uint64_t)
    case weftFloat32: LOAD(float)
    case weftFloat64: LOAD(double)
#undef LOAD
    case weftFloat16: { uint16_t v; memcpy(&v, p, 2); return weft_f16_to_f32(v); }
    case weftBfloat16: { uint16_t v; memcpy(&v, p, 2); return weft_bf16_to_f32(v); }
    case weftFloat8e4m3: return weft_e4m3_to_f32(*p);
    case weftFloat8e5m2: return weft_e5m2_to_f32(*p);
    default: return NAN;
  }
}

static void store_float(weftDataType_t t, void *buf, size_t i, double v) {
  uint8_t *p = (uint8_t *)buf + i * weftTypeSize(t);
  switch (t) {
    case weftFloat32: { float f = (float)v; memcpy(p, &f, 4); break; }
    case weftFloat64: memcpy(p, &v, 8); break;
    case weftFloat16: { uint16_t h = weft_f32_to_f16((float)v); memcpy(p, &h, 2); break; }
    case weftBfloat16: { uint16_t h = weft_f32_to_bf16((float)v); memcpy(p, &h, 2); break; }
    case weftFloat8e4m3: *p = weft_f32_to_e4m3((float)v); break;
    case weftFloat8e5m2: *p = weft_f32_to_e5m2((float)v); break;
    default: break;
  }
}

std::vector<uint8_t> make_input(weftDataType_t t, weftRedOp_t op, size_t count, uint64_t seed,
                                int rank) {
  std::vector<uint8_t> buf(count * weftTypeSize(t));
  Rng rng(seed * 1000003u + (uint64_t)rank * 7919u + (uint64_t)t * 131u + (uint64_t)op);
  if (!type_is_float(t)) {
    for (auto &b : buf) b = (uint8_t)rng.next();  // full range: wrapping is part of the test
    return buf;
  }
  for (size_t i = 0; i < count; i++) {
    double v;
    if (op == weftProd) {
      v = 0.75 + 0.75 * rng.uniform();  // products stay in range for 8 ranks
      if (rng.next() & 1) v = -v;
    } else {
      v = 4.0 * rng.uniform() - 2.0;
    }
    store_float(t, buf.data(), i, v);
  }
  return buf;
}

template <typename T>
static bool check_int(weftRedOp_t op, const std::vector<std::vector<uint8_t>> &inputs,
                      const void *out, size_t count, std::string *why) {
  using U = typename std::make_unsigned<T>::type;
  const int n = (int)inputs.size();
  for (size_t i = 0; i < count; i++) {
    T acc;
    memcpy(&acc, inputs[0].data() + i * sizeof(T), sizeof(T));
    for (int r = 1; r < n; r++) {
      T v;
      memcpy(&v, inputs[r].data() + i * sizeof(T), sizeof(T));
      switch (op) {
        case weftSum: case weftAvg: acc = (T)(U)((U)acc + (U)v); break;
        case weftProd: acc = (T)(U)((U)acc * (U)v); break;
        case weftMax: acc = v > acc ? v : acc; break;
        case weftMin: acc = v < acc ? v : acc; break;
        default: break;
      }
    }
    if (op == weftAvg) acc = (T)(acc / (T)n);
    T got;
    memcpy(&got, (const uint8_t *)out + i * sizeof(T), sizeof(T));
    if (got != acc) {
      char buf[256];
      snprintf(buf, sizeof buf, "element %zu of %zu: got %lld, want %lld", i, count,
               (long long)got, (long long)acc);
      *why = buf;
      return false;
    }
  }
  return true;
}

static bool check_float(weftDataType_t t, weftRedOp_t op,
                        const std::vector<std::vector<uint8_t>> &inputs, const void *out,
                        size_t count, std::string *why) {
  const int n = (int)inputs.size();
  const double eps = type_eps(t), tiny = type_tiny(t);
  for (size_t i = 0; i < count; i++) {
    double acc = value_at(t, inputs[0].data(), i), mag = std::fabs(acc);
    for (int r = 1; r < n; r++) {
      double v = value_at(t, inputs[r].data(), i);
      mag += std::fabs(v);
      switch (op) {
        case weftSum: case weftAvg: acc += v; break;
        case weftProd: acc *= v; break;
        case weftMax: acc = std::fmax(acc, v); break;
        case weftMin: acc = std::fmin(acc, v); break;
        default: break;
      }
    }
    double tol;
    switch (op) {
      case weftSum: tol = (n + 1) * eps * mag; break;
      case weftAvg: acc /= n; tol = (n + 1) * eps * mag / n + eps * std::fabs(acc); break;
      case weftProd: tol = (n + 1) * eps * std::fabs(acc); break;
      default: tol = 0; break;  // max and min pick an input exactly
    }
    tol += n * tiny;
    double got = value_at(t, out, i);
    if (!(std::fabs(got - acc) <= tol)) {
      char buf[256];
      snprintf(buf, sizeof buf, "element %zu of %zu: got %.9g, want %.9g (tolerance %.3g)", i,
               count, got, acc, tol);
      *why = buf;
      return false;
    }
  }
  return true;
}

bool check_reduction(weftDataType_t t, weftRedOp_t op,
                     const std::vector<std::vector<uint8_t>> &inputs, const void *out,
                     size_t count, std::string *why) {
  switch (t) {
    case weftInt8: return check_int<int8_t>(op, inputs, out, count, why);
    case weftUint8: return check_int<uint8_t>(op, inputs, out, count, why);
    case weftInt32: return check_int<int32_t>(op, inputs, out, count, why);
    case weftUint32: return check_int<uint32_t>(op, inputs, out, count, why);
    case weftInt64: return check_int<int64_t>(op, inputs, out, count, why);
    case weftUint64: return check_int<uint64_t>(op, inputs, out, count, why);
    default: return check_float(t, op, inputs, out, count, why);
  }
}

static const size_t kGuard = 64;  // poisoned elements after the output, checked untouched

int check_allreduce(const RankCtx &ctx, weftComm_t comm, weftDataType_t t, weftRedOp_t op,
              size_t count, bool in_place, uint64_t seed) {
  const size_t esize = weftTypeSize(t);
  std::vector<std::vector<uint8_t>> inputs;
  for (int r = 0; r < ctx.nranks; r++) inputs.push_back(make_input(t, op, count, seed, r));
  std::vector<uint8_t> send = inputs[ctx.rank];
  std::vector<uint8_t> recv((count + kGuard) * esize, 0xa5);
  if (in_place && count > 0) memcpy(recv.data(), send.data(), count * esize);
  const void *src = in_place ? recv.data() : send.data();
  weftResult_t res = weftAllReduce(src, recv.data(), count, t, op, comm, nullptr);
  const char *what = in_place ? "in-place" : "out-of-place";
  if (res != weftSuccess)
    return rank_fail(ctx, "%s %s %s count %zu: %s: %s", what, type_name(t), op_name(op), count,
                     weftGetErrorString(res), weftGetLastError(comm));
  std::string why;
  if (!check_reduction(t, op, inputs, recv.data(), count, &why))
    return rank_fail(ctx, "%s %s %s count %zu: %s", what, type_name(t), op_name(op), count,
                     why.c_str());
  for (size_t i = count * esize; i < recv.size(); i++)
    if (recv[i] != 0xa5)
      return rank_fail(ctx, "%s %s %s count %zu: wrote past the end (byte %zu)", what,
                       type_name(t), op_name(op), count, i - count * esize);
  if (!in_place && send != inputs[ctx.rank])
    return rank_fail(ctx, "%s %s count %zu: sendbuff was modified", type_name(t), op_name(op),
                     count);
  return 0;
}

int check_every_collective(const RankCtx &ctx, weftComm_t comm, uint64_t seed) {
  const int n = ctx.nranks, me = ctx.rank;
  for (size_t count : {1, 1009, 100003}) {
    for (weftDataType_t t : {weftFloat32, weftInt64, weftBfloat16}) {
      std::vector<std::vector<uint8_t>> in;
      for (int r = 0; r < n; r++) in.push_back(make_input(t, weftSum, count * n, seed, r));
      const size_t es = weftTypeSize(t), block = count * es;
      std::vector<uint8_t> out(block * n);
      std::string why;
      std::vector<std::vector<uint8_t>> firsts;
      for (int r = 0; r < n; r++) firsts.emplace_back(in[r].begin(), in[r].begin() + block);
      if (weftAllReduce(in[me].data(), out.data(), count, t, weftSum, comm, nullptr) != weftSuccess ||
          !check_reduction(t, weftSum, firsts, out.data(), count, &why))
        return rank_fail(ctx, "allreduce %zu: %s %s", count, weftGetLastError(comm), why.c_str());
      if (weftAllGather(in[me].data(), out.data(), count, t, comm, nullptr) != weftSuccess)
        return rank_fail(ctx, "allgather: %s", weftGetLastError(comm));
      for (int r = 0; r < n; r++)
        if (memcmp(out.data() + r * block, in[r].data(), block) != 0)
          return rank_fail(ctx, "allgather block %d", r);
      std::vector<std::vector<uint8_t>> mine;
      for (int r = 0; r < n; r++)
        mine.emplace_back(in[r].begin() + me * block, in[r].begin() + (me + 1) * block);
      if (weftReduceScatter(in[me].data(), out.data(), count, t, weftSum, comm, nullptr) != weftSuccess ||
          !check_reduction(t, weftSum, mine, out.data(), count, &why))
        return rank_fail(ctx, "reducescatter: %s", why.c_str());
      int root = (int)(count % n);
      if (weftBroadcast(in[me].data(), out.data(), count, t, root, comm, nullptr) != weftSuccess ||
          memcmp(out.data(), in[root].data(), block) != 0)
        return rank_fail(ctx, "broadcast root %d", root);
      if (weftReduce(in[me].data(), out.data(), count, t, weftSum, root, comm, nullptr) != weftSuccess ||
          (me == root && !check_reduction(t, weftSum, firsts, out.data(), count, &why)))
        return rank_fail(ctx, "reduce root %d: %s", root, why.c_str());
      if (weftAlltoAll(in[me].data(), out.data(), count, t, comm, nullptr) != weftSuccess)
        return rank_fail(ctx, "alltoall: %s", weftGetLastError(comm));
      for (int r = 0; r < n; r++)
        if (memcmp(out.data() + r * block, in[r].data() + me * block, block) != 0)
          return rank_fail(ctx, "alltoall block from %d", r);
    }
  }
  return 0;
}

bool group_allreduce_check(weftComm_t *comms, int n, size_t count, uint64_t seed,
                           std::string *why) {
  const size_t nbytes = count * 4, guard = 64;
  std::vector<std::vector<uint8_t>> inputs;
  std::vector<std::vector<uint8_t>> outs(n, std::vector<uint8_t>(nbytes + guard, 0xa5));
  for (int r = 0; r < n; r++) inputs.push_back(make_input(weftFloat32, weftSum, count, seed, r));
  bool ok = weftGroupStart() == weftSuccess;
  for (int r = 0; ok && r < n; r++)
    ok = weftAllReduce(inputs[r].data(), outs[r].data(), count, weftFloat32, weftSum, comms[r],
                       nullptr) == weftSuccess;
  if (weftGroupEnd() != weftSuccess || !ok) {
    *why = std::string("group all-reduce failed: ") + weftGetLastError(nullptr);
    return false;
  }
  for (int r = 0; r < n; r++) {
    std::string what;
    if (!check_reduction(weftFloat32, weftSum, inputs, outs[r].data(), count, &what)) {
      *why = "rank " + std::to_string(r) + ", count " + std::to_string(count) + ": " + what;
      return false;
    }
    for (size_t i = nbytes; i < outs[r].size(); i++)
      if (outs[r][i] != 0xa5) {
        *why = "rank " + std::to_string(r) + " wrote past its output at byte " + std::to_string(i);
        return false;
      }
  }
  return true;
}

namespace {

const uint8_t kPoison = 0x5a;
const size_t kOffset = 200;  // element-aligned for every datatype, not cache-line aligned

// nbytes at kOffset into a poisoned allocation from weftMemAllocHost (mapped
// by peers) or from malloc (reached through the kernel).
struct Buf {
  uint8_t *base = nullptr;
  uint8_t *p = nullptr;
  size_t nbytes, total;
  bool weft;
  Buf(size_t n, bool from_weft)
      : nbytes(n), total(std::max(n + kOffset + 64, kMemSharedMinNbytes)), weft(from_weft) {
    void *b = nullptr;
    if (weft) {
      if (weftMemAllocHost(&b, total) != weftSuccess) b = nullptr;
    } else {
      b = malloc(total);
    }
    base = static_cast<uint8_t *>(b);
    if (base != nullptr) memset(base, kPoison, total);
    p = base + kOffset;
  }
  ~Buf() {
    if (weft) weftMemFree(base);
    else free(base);
  }
  Buf(const Buf &) = delete;
  Buf &operator=(const Buf &) = delete;
  // Whether the bytes around [p, p + nbytes) still hold the poison.
  bool guards_intact() const {
    for (size_t i = 0; i < total; i++)
      if ((i < kOffset || i >= kOffset + nbytes) && base[i] != kPoison) return false;
    return true;
  }
};

}  // namespace

const char *coll_name(Coll c) {
  static const char *const names[] = {"allreduce", "allgather", "reducescatter", "broadcast",
                                      "reduce"};
  return names[c];
}

int check_coll(const RankCtx &ctx, weftComm_t comm, Coll c, weftDataType_t t, weftRedOp_t op,
               size_t count, bool in_place, bool weft_send, bool weft_recv, uint64_t seed,
               int root) {
  const int n = ctx.nranks, me = ctx.rank;
  const size_t esize = weftTypeSize(t), block = count * esize;
  const size_t in_count = c == kReduceScatter ? count * n : count;
  const size_t out_nbytes = c == kAllGather ? n * block : block;
  // the buffers this rank's side of the call names (the others NULL)
  const bool has_in = c != kBroadcast || me == root || in_place;
  const bool has_out = c != kReduce || me == root || in_place;
  std::vector<std::vector<uint8_t>> in;
  for (int r = 0; r < n; r++) in.push_back(make_input(t, op, in_count, seed, r));
  Buf recv(!has_out ? 0 : c == kReduceScatter && in_place ? n * block : out_nbytes, weft_recv);
  Buf send(in_place || !has_in ? 0 : in_count * esize, weft_send);
  FAIL_IF(recv.base == nullptr || send.base == nullptr, "allocation failed");
  // in place: all-gather's input is its block of the output, reduce-scatter's
  // output its block of the input
  uint8_t *src = in_place ? recv.p + (c == kAllGather ? me * block : 0) : has_in ? send.p : nullptr;
  uint8_t *dst = in_place && c == kReduceScatter ? recv.p + me * block : has_out ? recv.p : nullptr;
  if (src != nullptr) memcpy(src, in[me].data(), in[me].size());
  weftResult_t res = weftInternalError;
  switch (c) {
    case kAllReduce: res = weftAllReduce(src, dst, count, t, op, comm, nullptr); break;
    case kAllGather: res = weftAllGather(src, dst, count, t, comm, nullptr); break;
    case kReduceScatter: res = weftReduceScatter(src, dst, count, t, op, comm, nullptr); break;
    case kBroadcast: res = weftBroadcast(src, dst, count, t, root, comm, nullptr); break;
    case kReduce: res = weftReduce(src, dst, count, t, op, root, comm, nullptr); break;
  }
  const char *where = in_place ? "in place" : "out of place";
  FAIL_IF(res != weftSuccess, "%s: %s", coll_name(c), weftGetLastError(comm));
  std::string why;
  if (c == kAllGather) {
    for (int r = 0; r < n; r++)
      FAIL_IF(memcmp(dst + r * block, in[r].data(), block) != 0,
              "allgather %s count %zu %s: block of rank %d differs", type_name(t), count, where,
              r);
  } else if (c == kBroadcast) {
    FAIL_IF(memcmp(dst, in[root].data(), block) != 0,
            "broadcast %s count %zu %s root %d: the output differs from the root's input",
            type_name(t), count, where, root);
  } else if (c == kReduce && me != root) {
    FAIL_IF(in_place && memcmp(dst, in[me].data(), block) != 0,
            "reduce %s count %zu in place root %d: a non-root's buffer changed", type_name(t),
            count, root);
  } else {
    std::vector<std::vector<uint8_t>> mine;
    const size_t from = c == kReduceScatter ? me * block : 0;
    for (int r = 0; r < n; r++)
      mine.emplace_back(in[r].begin() + from, in[r].begin() + from + block);
    FAIL_IF(!check_reduction(t, op, mine, dst, count, &why), "%s %s %s count %zu %s root %d: %s",
            coll_name(c), type_name(t), op_name(op), count, where, root, why.c_str());
  }
  FAIL_IF(!recv.guards_intact(), "%s %s count %zu %s: wrote outside the output", coll_name(c),
          type_name(t), count, where);
  if (!in_place && has_in) {
    FAIL_IF(memcmp(send.p, in[me].data(), in[me].size()) != 0 || !send.guards_intact(),
            "%s %s count %zu: the input changed", coll_name(c), type_name(t), count);
  }
  return 0;
}

}  // namespace weft_test
