// The device side of ZeRO (zero/zero_device.h). Everywhere: arguments are
// checked before any CUDA call (bad types, NULL buffers), and a build
// without CUDA refuses with a message. On a GPU: every kernel against the
// host's arithmetic on random data of odd sizes, bit for bit but for NaN
// payloads (the norm's sum of squares, summed in another order, within
// 1e-12 relative). Outputs start poisoned, so a kernel that never ran fails.
// Everywhere: the step's contract on a host table whose write-back is
// queued as a kernel is (done only once something waits), 1-3 ranks as
// threads; a failed weftZeroFinalize refused a second time, nothing leaked.
#include <gtest/gtest.h>

#include <float.h>
#include <math.h>
#include <stdint.h>
#include <string.h>

#include <string>
#include <thread>
#include <vector>

#include "weft_zero.h"
#include "zero/zero_device.h"
extern "C" {
#include "zero/zero_internal.h"  // zero_load, zero_store: the host's conversions
}
#if ZERO_TEST_CUDA
#include <cuda_runtime_api.h>
#endif

namespace {

std::string last_error() { return weftZeroLastError(); }

// Element i of a buffer of type t is a NaN.
bool is_nan_at(const void *buf, weftDataType_t t, size_t i) {
  if (t == weftFloat32) return isnan(((const float *)buf)[i]);
  uint16_t h = ((const uint16_t *)buf)[i];
  return t == weftBfloat16 ? (h & 0x7fff) > 0x7f80 : (h & 0x7fff) > 0x7c00;
}

// n elements of type t equal bit for bit, NaNs aside: arithmetic on a NaN
// gives the GPU's canonical NaN (0x7fffffff), the host's keeps the
// operand's payload (0x7fc00000), and either is the same NaN to the step.
// The first difference, or n.
size_t first_difference(const void *got, const void *want, weftDataType_t t, size_t n) {
  size_t ts = t == weftFloat32 ? 4 : 2;
  for (size_t i = 0; i < n; i++) {
    if (memcmp((const char *)got + i * ts, (const char *)want + i * ts, ts) == 0) continue;
    if (!is_nan_at(got, t, i) || !is_nan_at(want, t, i)) return i;
  }
  return n;
}

// The comparison itself: payloads of NaNs aside, every bit counts.
TEST(ZeroDeviceCompare, NanPayloadsAsideEveryBitCounts) {
  const uint32_t f[] = {0x3f800000u, 0x7fc00000u, 0xffc00001u};
  uint32_t g[] = {0x3f800000u, 0x7fffffffu, 0x7fc00000u};
  EXPECT_EQ(first_difference(g, f, weftFloat32, 3), 3u);
  g[0] = 0x3f800001u;  // one ulp
  EXPECT_EQ(first_difference(g, f, weftFloat32, 3), 0u);
  g[0] = 0x7f800000u;  // infinity is no NaN
  EXPECT_EQ(first_difference(g, f, weftFloat32, 3), 0u);
  const uint16_t h[] = {0x3c00, 0x7fc1, 0x7fc0};  // NaNs in fp16 and bf16 alike
  uint16_t k[] = {0x3c00, 0x7fff, 0x7fff};
  EXPECT_EQ(first_difference(k, h, weftFloat16, 3), 3u);
  EXPECT_EQ(first_difference(k, h, weftBfloat16, 3), 3u);
  k[1] = 0x7e00;  // fp16's NaN, a number in bf16
  EXPECT_EQ(first_difference(k, h, weftFloat16, 3), 3u);
  EXPECT_EQ(first_difference(k, h, weftBfloat16, 3), 1u);
  k[1] = 0x7fff;
  k[0] = 0x3c01;
  EXPECT_EQ(first_difference(k, h, weftFloat16, 3), 0u);
  EXPECT_EQ(first_difference(k, h, weftBfloat16, 3), 0u);
  k[0] = 0x3c00;
  k[2] = 0x7c00;  // fp16 infinity against a NaN
  EXPECT_EQ(first_difference(k, h, weftFloat16, 3), 2u);
  k[2] = 0x7f80;  // bf16 infinity against a NaN
  EXPECT_EQ(first_difference(k, h, weftBfloat16, 3), 2u);
}

// Every entry of the four tables is set: a NULL one would be called on the
// first step that reaches it (on a GPU only, for the device table); but
// copy_async, which only the device's has (the host's copy at once).
TEST(ZeroOpsTables, EveryEntryIsSet) {
  for (const struct zero_ops *o :
       {&zero_ops_host, &zero_ops_host_staged, &zero_ops_device, &zero_ops_pinned}) {
    SCOPED_TRACE(o->name);
    const void *entries[] = {
        (const void *)o->alloc,        (const void *)o->free,         (const void *)o->zero,
        (const void *)o->copy,         (const void *)o->sync,         (const void *)o->event_create,
        (const void *)o->event_destroy, (const void *)o->event_record, (const void *)o->event_sync,
        (const void *)o->event_done,   (const void *)o->stream_wait,  (const void *)o->quiesce,
        (const void *)o->stream_create, (const void *)o->stream_destroy,
        (const void *)o->load_scaled,  (const void *)o->to_float,     (const void *)o->store,
        (const void *)o->add,          (const void *)o->scale,        (const void *)o->adamw,
        (const void *)o->sgd};
    // the table is the name, the device flag and these pointers, nothing else
    EXPECT_LE(sizeof(struct zero_ops),
              sizeof(const char *) + sizeof(void *) + sizeof entries + sizeof(void *));
    for (size_t i = 0; i < sizeof entries / sizeof entries[0]; i++)
      EXPECT_NE(entries[i], nullptr) << "entry " << i;
    EXPECT_EQ(o->copy_async != nullptr, o == &zero_ops_device);
  }
  EXPECT_EQ(zero_ops_pinned.device, 0);
  EXPECT_EQ(zero_ops_host.device, 0);
  EXPECT_EQ(zero_ops_host_staged.device, 1);
  EXPECT_EQ(zero_ops_device.device, 1);
}

// A host table whose write-back of parameters (store) is queued, as a kernel
// is on a CUDA stream: it happens once something waits for its stream (a
// sync, an event recorded after it, the device), never by itself. Events
// wrap weft's and remember how many stores of their stream they follow.
struct QueuedStore {
  const float *src;
  weftDataType_t type;
  void *dst;
  size_t count;
  weftStream_t stream;
  bool done;
};
struct QueuedEvent {
  weftEvent_t real;
  weftStream_t stream;
  size_t upto;  // stores queued before the record
};
// per rank: each runs in a thread of its own
thread_local std::vector<QueuedStore> q_stores;
thread_local bool q_null_waited = true;  // nothing queued on the NULL stream since its sync
thread_local bool q_step_left_null = false;  // the last step returned with work queued there

void q_run(weftStream_t stream, size_t upto) {
  for (size_t i = 0; i < upto && i < q_stores.size(); i++) {
    QueuedStore &w = q_stores[i];
    if (w.done || w.stream != stream) continue;
    for (size_t k = 0; k < w.count; k++) zero_store(w.dst, w.type, k, w.src[k]);
    w.done = true;
  }
}
void q_run_all(weftStream_t stream) { q_run(stream, q_stores.size()); }

struct zero_ops queued_ops() {
  struct zero_ops o = zero_ops_host;
  o.name = "queued";
  o.device = 1;
  o.stream_waits = 1;
  o.store = [](const float *src, weftDataType_t type, void *dst, size_t count, weftStream_t s) {
    q_stores.push_back({src, type, dst, count, s, false});
    if (s == nullptr) q_null_waited = false;
    return weftSuccess;
  };
  o.sync = [](weftStream_t s, weftComm_t comm, const char *what) {
    q_run_all(s);
    if (s == nullptr) q_null_waited = true;
    return zero_ops_host.sync(s, comm, what);
  };
  o.event_create = [](weftEvent_t *out) {
    auto *e = new QueuedEvent{nullptr, nullptr, 0};
    *out = (weftEvent_t)e;
    return zero_ops_host.event_create(&e->real);
  };
  o.event_destroy = [](weftEvent_t ev) {
    auto *e = (QueuedEvent *)ev;
    if (e != nullptr) zero_ops_host.event_destroy(e->real);
    delete e;
  };
  o.event_record = [](weftEvent_t ev, weftStream_t s) {
    auto *e = (QueuedEvent *)ev;
    *e = {e->real, s, q_stores.size()};
    if (s == nullptr) q_null_waited = false;
    return zero_ops_host.event_record(e->real, s);
  };
  o.event_sync = [](weftEvent_t ev) {
    auto *e = (QueuedEvent *)ev;
    q_run(e->stream, e->upto);
    return zero_ops_host.event_sync(e->real);
  };
  o.event_done = [](weftEvent_t ev) {
    auto *e = (QueuedEvent *)ev;
    for (size_t i = 0; i < e->upto; i++)
      if (q_stores[i].stream == e->stream && !q_stores[i].done) return 0;
    return zero_ops_host.event_done(e->real);
  };
  o.stream_wait = [](weftStream_t s, weftEvent_t ev) {  // waits early: allowed
    auto *e = (QueuedEvent *)ev;
    q_run(e->stream, e->upto);
    return zero_ops_host.stream_wait(s, e->real);
  };
  o.quiesce = []() {
    for (QueuedStore &w : q_stores) q_run_all(w.stream);
    return weftSuccess;
  };
  return o;
}

// One rank's communicator, in this process.
weftComm_t comm_of_one() {
  weftUniqueId id;
  weftComm_t comm = nullptr;
  if (weftGetUniqueId(&id) != weftSuccess || weftCommInitRank(&comm, 1, id, 0) != weftSuccess)
    return nullptr;
  return comm;
}

// Three layers of odd sizes; 3 steps with gradients that depend on the step.
const size_t kLayerSizes[] = {7, 130, 33};

weftZero_t contract_model(weftComm_t comm, int stage, const struct zero_ops *ops,
                          std::vector<int> *ids) {
  weftZeroConfig_t cfg;
  weftZeroConfigDefaults(&cfg);
  cfg.stage = stage;
  cfg.paramType = weftBfloat16;
  weftZero_t z = nullptr;
  if (weftZeroCreate(&z, comm, &cfg) != weftSuccess) return nullptr;
  if (ops != nullptr) z->ops = ops;
  for (int l = 0; l < 3; l++) {
    std::vector<float> init(kLayerSizes[l]);
    for (size_t i = 0; i < init.size(); i++) init[i] = 0.01f * (float)i - 0.3f * (float)l;
    int id;
    if (weftZeroAddParam(z, l, init.size(), init.data(), &id) != weftSuccess) return nullptr;
    ids->push_back(id);
  }
  return weftZeroFinalize(z) == weftSuccess ? z : nullptr;
}

// A step, then the parameters as a trainer reads them: stages 0-2 through
// weftZeroParam, stage 3 gathered on gather_stream after waiting for the
// gather's event (as cudaEventSynchronize). Appends them to out.
weftResult_t contract_step(weftZero_t z, const std::vector<int> &ids, int step,
                           weftStream_t stream, weftStream_t gather_stream,
                           std::vector<uint16_t> *out) {
  for (int l = 2; l >= 0; l--) {
    void *g;
    std::vector<float> grad(kLayerSizes[l]);
    for (size_t i = 0; i < grad.size(); i++) grad[i] = sinf((float)(step * 131 + l * 17 + (int)i));
    if (weftZeroGrad(z, ids[l], &g) != weftSuccess ||
        weftZeroAccumulate(g, weftBfloat16, grad.data(), grad.size()) != weftSuccess ||
        weftZeroGradReady(z, l, stream) != weftSuccess)
      return weftInternalError;
  }
  weftResult_t res = weftZeroStep(z, stream, nullptr);
  q_step_left_null = !q_null_waited;
  for (int l = 0; l < 3 && res == weftSuccess; l++) {
    void *p = nullptr;
    weftEvent_t ev;
    if (z->cfg.stage == 3) {
      res = weftZeroGather(z, l, gather_stream, &ev);
      if (res == weftSuccess) res = z->ops->event_sync(ev);
    }
    if (res == weftSuccess) res = weftZeroParam(z, ids[l], &p);
    if (res != weftSuccess) break;
    out->insert(out->end(), (uint16_t *)p, (uint16_t *)p + kLayerSizes[l]);
    if (z->cfg.stage == 3) res = weftZeroRelease(z, l);
  }
  return res;
}

// weftZeroStep's contract where the write-back is queued (a device's
// kernel): with the NULL stream nothing is left queued on return; on a
// stream, each layer's event follows its write-back, so that weftZeroParam
// (stages 0-2) and a stage 3 gather on another stream see the new values.
// Every stage reads what a host context reads, bit for bit (stages 1-2 with
// the write-back done at once: their all-gather, weft's own, reads it).
void contract_rank(int nranks, int rank, weftUniqueId id) {
  weftComm_t comm;
  ASSERT_EQ(weftCommInitRank(&comm, nranks, id, rank), weftSuccess) << weftGetLastError(nullptr);
  weftStream_t s1, s2;
  ASSERT_EQ(weftStreamCreate(&s1), weftSuccess);
  ASSERT_EQ(weftStreamCreate(&s2), weftSuccess);
  for (int stage = 0; stage < 4; stage++) {
    for (bool on_stream : {false, true}) {
      SCOPED_TRACE("rank " + std::to_string(rank) + " of " + std::to_string(nranks) + ", stage " +
                   std::to_string(stage) + (on_stream ? ", a stream" : ", NULL"));
      struct zero_ops ops = queued_ops();
      if (stage == 1 || stage == 2) ops.store = zero_ops_host.store;
      weftStream_t st = on_stream ? s1 : nullptr, gs = on_stream ? s2 : nullptr;
      std::vector<int> ids_h, ids_q;
      std::vector<uint16_t> want, got;
      weftZero_t h = contract_model(comm, stage, nullptr, &ids_h);
      ASSERT_NE(h, nullptr) << last_error();
      for (int step = 0; step < 3; step++)
        ASSERT_EQ(contract_step(h, ids_h, step, st, gs, &want), weftSuccess) << last_error();
      ASSERT_EQ(weftZeroDestroy(h), weftSuccess);
      q_stores.clear();
      weftZero_t q = contract_model(comm, stage, &ops, &ids_q);
      ASSERT_NE(q, nullptr) << last_error();
      for (int step = 0; step < 3; step++) {
        ASSERT_EQ(contract_step(q, ids_q, step, st, gs, &got), weftSuccess) << last_error();
        EXPECT_FALSE(q_step_left_null) << "step " << step << " left work queued";
      }
      EXPECT_TRUE(got == want) << "parameters read before their write-back";
      EXPECT_EQ(weftZeroDestroy(q), weftSuccess) << last_error();
    }
  }
  weftStreamDestroy(s1);
  weftStreamDestroy(s2);
  weftCommDestroy(comm);
}

TEST(ZeroStepContract, QueuedWriteBackIsWaitedForOrFollowedByEvents) {
  for (int n : {1, 2, 3}) {
    weftUniqueId id;
    ASSERT_EQ(weftGetUniqueId(&id), weftSuccess);
    std::vector<std::thread> ranks;
    for (int r = 0; r < n; r++) ranks.emplace_back(contract_rank, n, r, id);
    for (std::thread &t : ranks) t.join();
  }
}

// A table that counts what it creates and frees, and fails its third
// allocation once.
int c_live_events = 0, c_live_bufs = 0, c_allocs = 0;
struct zero_ops counting_ops() {
  struct zero_ops o = zero_ops_host;
  o.alloc = [](void **p, size_t n) {
    if (++c_allocs == 3) return zero_fail(weftSystemError, "out of memory (a test)");
    weftResult_t res = zero_ops_host.alloc(p, n);
    c_live_bufs += res == weftSuccess;
    return res;
  };
  o.free = [](void *p) {
    c_live_bufs -= p != nullptr;
    zero_ops_host.free(p);
  };
  o.event_create = [](weftEvent_t *e) {
    weftResult_t res = zero_ops_host.event_create(e);
    c_live_events += res == weftSuccess;
    return res;
  };
  o.event_destroy = [](weftEvent_t e) {
    c_live_events -= e != nullptr;
    zero_ops_host.event_destroy(e);
  };
  return o;
}

// A failed weftZeroFinalize cannot be called again (it made events and
// buffers over the first call's): the second is refused saying so, and so
// is a parameter added then; destroy frees what the first made, at every
// stage.
TEST(ZeroFinalize, AfterAFailureIsRefusedAndDestroyFreesAll) {
  weftComm_t comm = comm_of_one();
  ASSERT_NE(comm, nullptr) << weftGetLastError(nullptr);
  for (int stage = 0; stage < 4; stage++) {
    SCOPED_TRACE("stage " + std::to_string(stage));
    static struct zero_ops ops = counting_ops();
    c_live_events = c_live_bufs = c_allocs = 0;
    weftZeroConfig_t cfg;
    weftZeroConfigDefaults(&cfg);
    cfg.stage = stage;
    weftZero_t z;
    ASSERT_EQ(weftZeroCreate(&z, comm, &cfg), weftSuccess);
    z->ops = &ops;
    float init[5] = {1, 2, 3, 4, 5};
    int id;
    ASSERT_EQ(weftZeroAddParam(z, 0, 5, init, &id), weftSuccess);
    ASSERT_EQ(weftZeroAddParam(z, 1, 3, init, &id), weftSuccess);
    EXPECT_EQ(weftZeroFinalize(z), weftSystemError);
    EXPECT_GT(c_live_events, 0);
    EXPECT_EQ(weftZeroFinalize(z), weftInvalidUsage);
    EXPECT_NE(last_error().find("an earlier weftZeroFinalize failed"), std::string::npos)
        << last_error();
    EXPECT_EQ(weftZeroAddParam(z, 1, 3, init, &id), weftInvalidUsage);
    EXPECT_NE(last_error().find("an earlier weftZeroFinalize failed"), std::string::npos)
        << last_error();
    EXPECT_EQ(weftZeroDestroy(z), weftSuccess) << last_error();
    EXPECT_EQ(c_live_events, 0) << "events left";
    EXPECT_EQ(c_live_bufs, 0) << "buffers left";
  }
  weftCommDestroy(comm);
}

#if ZERO_TEST_CUDA

TEST(ZeroDeviceArgs, BadTypeAndNullAreRefusedBeforeAnyLaunch) {
  float f[4] = {0};
  EXPECT_EQ(zero_dev_store(f, weftInt32, f, 4, nullptr), weftInvalidArgument);
  EXPECT_NE(last_error().find("not fp32, bf16 or fp16"), std::string::npos) << last_error();
  EXPECT_EQ(zero_dev_accumulate(nullptr, weftBfloat16, f, 4, nullptr), weftInvalidArgument);
  EXPECT_NE(last_error().find("NULL buffer with 4 elements"), std::string::npos) << last_error();
  EXPECT_EQ(zero_dev_add(nullptr, f, weftBfloat16, 4, nullptr), weftInvalidArgument);
  EXPECT_NE(last_error().find("NULL buffer with 4 elements"), std::string::npos) << last_error();
  EXPECT_EQ(zero_dev_add(f, f, weftInt8, 4, nullptr), weftInvalidArgument);
  EXPECT_NE(last_error().find("not fp32, bf16 or fp16"), std::string::npos) << last_error();
  EXPECT_EQ(zero_dev_adamw(f, f, f, f, 4, nullptr, nullptr), weftInvalidArgument);
  EXPECT_EQ(zero_dev_load_scaled(f, weftFloat32, f, 4, 1.0, nullptr, nullptr),
            weftInvalidArgument);
  // nothing to do: no launch, no device needed
  EXPECT_EQ(zero_dev_sgd(nullptr, nullptr, nullptr, 0, 0.9f, 0.1f, 0.0f, nullptr), weftSuccess);
}

uint64_t rng_next(uint64_t *s) {
  uint64_t z = (*s += 0x9e3779b97f4a7c15ull);
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return z ^ (z >> 31);
}

// Random floats of ordinary size, with one NaN, one infinity and a
// subnormal planted where the count allows.
std::vector<float> random_floats(size_t n, uint64_t seed) {
  std::vector<float> v(n);
  for (size_t i = 0; i < n; i++) v[i] = (float)((rng_next(&seed) >> 40) * 0x1p-24) - 0.5f;
  if (n > 3) {
    v[n / 3] = NAN;
    v[n / 2] = INFINITY;
    v[n - 1] = 1e-40f;
  }
  return v;
}

// A device copy of a host vector, freed at the end of the scope.
struct Dev {
  void *p = nullptr;
  size_t nbytes;
  // poisoned (all bits set: NaN in every type) until a kernel writes it
  explicit Dev(size_t n) : nbytes(n) {
    EXPECT_EQ(cudaMalloc(&p, n ? n : 1), cudaSuccess);
    EXPECT_EQ(cudaMemset(p, 0xff, n ? n : 1), cudaSuccess);
  }
  template <typename T>
  explicit Dev(const std::vector<T> &h) : Dev(h.size() * sizeof(T)) {
    EXPECT_EQ(cudaMemcpy(p, h.data(), nbytes, cudaMemcpyHostToDevice), cudaSuccess);
  }
  ~Dev() { cudaFree(p); }
  template <typename T>
  std::vector<T> get(size_t n) {
    std::vector<T> h(n);
    EXPECT_EQ(cudaDeviceSynchronize(), cudaSuccess);
    EXPECT_EQ(cudaMemcpy(h.data(), p, n * sizeof(T), cudaMemcpyDeviceToHost), cudaSuccess);
    return h;
  }
  float *f() { return (float *)p; }
};


class ZeroDeviceKernels : public testing::TestWithParam<size_t> {
 protected:
  void SetUp() override {
    if (!zero_dev_available()) GTEST_SKIP() << "no CUDA device";
  }
};

const weftDataType_t kTypes[] = {weftFloat32, weftBfloat16, weftFloat16};
size_t type_size(weftDataType_t t) { return t == weftFloat32 ? 4 : 2; }

// fp32 -> type, then accumulating more fp32 into it, as the host's zero_store.
TEST_P(ZeroDeviceKernels, StoreAndAccumulateMatchTheHost) {
  size_t n = GetParam();
  std::vector<float> a = random_floats(n, 1), b = random_floats(n, 2);
  for (weftDataType_t t : kTypes) {
    std::vector<char> want(n * type_size(t));
    for (size_t i = 0; i < n; i++) zero_store(want.data(), t, i, a[i]);
    for (size_t i = 0; i < n; i++) zero_store(want.data(), t, i, zero_load(want.data(), t, i) + b[i]);
    Dev da(a), db(b), dst(n * type_size(t));
    ASSERT_EQ(zero_dev_store(da.f(), t, dst.p, n, nullptr), weftSuccess) << last_error();
    ASSERT_EQ(zero_dev_accumulate(dst.p, t, db.f(), n, nullptr), weftSuccess) << last_error();
    std::vector<char> got = dst.get<char>(want.size());
    EXPECT_EQ(first_difference(got.data(), want.data(), t, n), n) << "type " << t;
  }
}

// dst += src in each type (the micro-steps' sum of reduceEveryMicroStep),
// against the host's conversions.
TEST_P(ZeroDeviceKernels, AddMatchesTheHost) {
  size_t n = GetParam();
  std::vector<float> a = random_floats(n, 3), b = random_floats(n, 4);
  for (weftDataType_t t : kTypes) {
    std::vector<char> want(n * type_size(t));
    for (size_t i = 0; i < n; i++) zero_store(want.data(), t, i, a[i]);
    Dev da(a), db(b), dst(n * type_size(t)), src(n * type_size(t));
    ASSERT_EQ(zero_dev_store(da.f(), t, dst.p, n, nullptr), weftSuccess) << last_error();
    ASSERT_EQ(zero_dev_store(db.f(), t, src.p, n, nullptr), weftSuccess) << last_error();
    for (size_t i = 0; i < n; i++) {
      std::vector<char> one(type_size(t));
      zero_store(one.data(), t, 0, b[i]);
      zero_store(want.data(), t, i, zero_load(want.data(), t, i) + zero_load(one.data(), t, 0));
    }
    ASSERT_EQ(zero_dev_add(dst.p, src.p, t, n, nullptr), weftSuccess) << last_error();
    std::vector<char> got = dst.get<char>(want.size());
    EXPECT_EQ(first_difference(got.data(), want.data(), t, n), n) << "type " << t;
  }
}

// One load of a of each type, against the host's loop.
void load_scaled_check(size_t n, const std::vector<float> &a, double want_nonfinite) {
  const double scale = 1.0 / (3.0 * 7.0);
  for (weftDataType_t t : kTypes) {
    std::vector<char> src(n * type_size(t));
    for (size_t i = 0; i < n; i++) zero_store(src.data(), t, i, a[i]);
    std::vector<float> want(n);
    double nonfinite = 0, sumsq = 0;
    for (size_t i = 0; i < n; i++) {
      want[i] = (float)(zero_load(src.data(), t, i) * scale);
      nonfinite += !isfinite(want[i]);
      sumsq += (double)want[i] * want[i];
    }
    std::vector<double> stats0 = {5.0, 0.25};  // accumulated into, not reset
    Dev dsrc(src), dst(n * sizeof(float)), dstats(stats0);
    ASSERT_EQ(zero_dev_load_scaled(dsrc.p, t, dst.f(), n, scale, (double *)dstats.p, nullptr),
              weftSuccess) << last_error();
    std::vector<float> got = dst.get<float>(n);
    std::vector<double> stats = dstats.get<double>(2);
    EXPECT_EQ(first_difference(got.data(), want.data(), weftFloat32, n), n) << "type " << t;
    EXPECT_EQ(nonfinite, want_nonfinite) << "type " << t;
    EXPECT_EQ(stats[0], 5.0 + nonfinite);
    if (want_nonfinite == 0) {
      ASSERT_TRUE(isfinite(sumsq));
      // the host adds in order, the device in a tree: apart by at most n
      // roundings of the sum (one missing term is ~1/n of it)
      EXPECT_NEAR(stats[1], 0.25 + sumsq, (double)n * DBL_EPSILON * (0.25 + sumsq))
          << "type " << t;
    } else {
      EXPECT_FALSE(isfinite(stats[1])) << "type " << t;
    }
  }
}

// Loading reduced gradients of each type with the step's scale, and the
// non-finite count and sum of squares the global norm is made of: on data
// with a NaN and an infinity planted (the count; the sum is not finite),
// and on finite data, where the sum must be the host's.
TEST_P(ZeroDeviceKernels, LoadScaledMatchesTheHostStep) {
  size_t n = GetParam();
  std::vector<float> a = random_floats(n, 3), finite = a;
  for (float &v : finite)
    if (!isfinite(v)) v = 0.375f;
  load_scaled_check(n, a, n > 3 ? 2 : 0);
  load_scaled_check(n, finite, 0);
}

// A launch returns its own status and leaves an error the caller has
// pending in place (an invalid device asked for, not yet read): clearing it
// before the launch, as cudaGetLastError did, lost it.
TEST_P(ZeroDeviceKernels, LaunchLeavesTheCallersPendingError) {
  const size_t n = GetParam();
  std::vector<float> h = random_floats(n, 11);
  Dev g(h);
  ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  int count = 0;
  ASSERT_EQ(cudaGetDeviceCount(&count), cudaSuccess);
  ASSERT_EQ(cudaSetDevice(count + 5), cudaErrorInvalidDevice);
  EXPECT_EQ(zero_dev_scale(g.f(), n, 2.0f, nullptr), weftSuccess) << last_error();
  EXPECT_EQ(cudaGetLastError(), cudaErrorInvalidDevice);
  std::vector<float> got = g.get<float>(n);
  for (size_t i = 0; i < n; i++) h[i] *= 2.0f;
  EXPECT_EQ(first_difference(got.data(), h.data(), weftFloat32, n), n);
}

// Three AdamW updates and three SGD updates (with a clip between), as the
// host's zero_update applies them.
TEST_P(ZeroDeviceKernels, OptimizerUpdatesMatchTheHost) {
  size_t n = GetParam();
  std::vector<float> p = random_floats(n, 4), g = random_floats(n, 5);
  for (size_t i = 0; i < n; i++)  // finite gradients: a step with NaN would be skipped
    if (!isfinite(g[i])) g[i] = 0.125f;
  std::vector<float> m(n, 0.0f), v(n, 0.0f);
  Dev dp(p), dm(m), dv(v), dg(g);
  for (int t = 1; t <= 3; t++) {
    struct zero_adamw_coef c = {0.9f, 0.999f, (float)(1e-3 / (1 - pow(0.9, t))), 1e-5f,
                                (float)(1 / sqrt(1 - pow(0.999, t))), 1e-8f};
    for (size_t i = 0; i < n; i++) zero_adamw_elem(&p[i], &m[i], &v[i], g[i], &c);
    ASSERT_EQ(zero_dev_adamw(dp.f(), dm.f(), dv.f(), dg.f(), n, &c, nullptr), weftSuccess)
        << last_error();
  }
  for (int t = 1; t <= 3; t++) {
    for (size_t i = 0; i < n; i++) g[i] *= 0.5f;
    for (size_t i = 0; i < n; i++) zero_sgd_elem(&p[i], &m[i], g[i], 0.9f, 0.01f, 1e-4f);
    ASSERT_EQ(zero_dev_scale(dg.f(), n, 0.5f, nullptr), weftSuccess) << last_error();
    ASSERT_EQ(zero_dev_sgd(dp.f(), dm.f(), dg.f(), n, 0.9f, 0.01f, 1e-4f, nullptr), weftSuccess)
        << last_error();
  }
  // p has a NaN and an infinity planted (which AdamW's decay makes a NaN)
  EXPECT_EQ(first_difference(dp.get<float>(n).data(), p.data(), weftFloat32, n), n);
  EXPECT_EQ(first_difference(dm.get<float>(n).data(), m.data(), weftFloat32, n), n);
  EXPECT_EQ(first_difference(dv.get<float>(n).data(), v.data(), weftFloat32, n), n);
}

// one element, one block, several blocks, and more than the grid covers at once
INSTANTIATE_TEST_SUITE_P(Sizes, ZeroDeviceKernels,
                         testing::Values(1, 1000, 70001, (size_t(1) << 20) + 3, 4096 * 256 * 2 + 5));

#else

TEST(ZeroDeviceArgs, BuildWithoutCudaRefusesSaying) {
  float f[4] = {0};
  EXPECT_EQ(zero_dev_available(), 0);
  EXPECT_EQ(zero_dev_store(f, weftFloat32, f, 4, nullptr), weftInvalidUsage);
  EXPECT_NE(last_error().find("built without CUDA"), std::string::npos) << last_error();
  EXPECT_EQ(zero_dev_sgd(f, f, f, 4, 0.9f, 0.1f, 0.0f, nullptr), weftInvalidUsage);
}

#endif

}  // namespace
