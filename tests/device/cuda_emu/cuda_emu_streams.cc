// cuda_emu's streams (cuda_emu_int.h): a worker thread each, running its
// queue in order; the legacy stream's implicit waits; events; captures into
// graphs and their launches.
#include <pthread.h>
#include <string.h>

#include <algorithm>
#include <new>
#include <thread>

#include "cuda_emu_int.h"

using namespace cuda_emu_rt;

namespace cuda_emu_rt {

std::mutex &events_mutex() {
  static auto *m = new std::mutex;
  return *m;
}
std::condition_variable &events_cv() {
  static auto *cv = new std::condition_variable;
  return *cv;
}

} // namespace cuda_emu_rt

namespace {

struct Streams {
  std::mutex m;
  std::set<CUstream_st *> all;
  unsigned long long next_id = 1;
  CUstream_st *legacy[8] = {}; // each device's legacy default stream
  std::set<CUgraph_st *> captures; // going on
  uint64_t generation = 0; // bumped in a forked child: the parent's workers are gone
};
Streams &streams() {
  static auto *s = new Streams;
  return *s;
}
thread_local CUstream_st *per_thread = NULL;
thread_local uint64_t per_thread_generation = 0;
thread_local cudaStreamCaptureMode thread_capture_mode = cudaStreamCaptureModeGlobal;

void run_op(Op &op);

void worker(CUstream_st *s) {
  std::unique_lock<std::mutex> l(s->m);
  for (;;) {
    s->cv.wait(l, [&] { return !s->q.empty() || s->dying; });
    if (s->q.empty()) break; // dying, drained
    Op op = std::move(s->q.front());
    s->q.pop_front();
    s->busy = true;
    l.unlock();
    run_op(op);
    l.lock();
    s->busy = false;
    s->done++;
    s->cv.notify_all();
  }
  l.unlock();
  // left allocated: a caller may still hold it from streams().all (sync_all)
  std::lock_guard<std::mutex> g(streams().m);
  streams().all.erase(s);
}

CUstream_st *stream_new(unsigned flags, int priority) {
  ctx_need();
  auto *s = new CUstream_st;
  s->flags = flags;
  s->priority = priority;
  s->device = current_device;
  {
    std::lock_guard<std::mutex> g(streams().m);
    s->id = streams().next_id++;
    streams().all.insert(s);
  }
  std::thread(worker, s).detach();
  return s;
}

// In a forked child the parent's stream workers are gone and any lock may
// have been held at the fork: start over (what was there is left, unfreed).
void fork_child() {
  const uint64_t gen = streams().generation + 1;
  new (&streams()) Streams();
  streams().generation = gen;
  new (&events_mutex()) std::mutex();
  new (&events_cv()) std::condition_variable();
  new (&memory().m) std::mutex();
  new (&kernels_mutex()) std::mutex();
  new (&loaded_mutex()) std::mutex();
}
const int fork_child_registered = pthread_atfork(NULL, NULL, fork_child);


} // namespace

CUstream_st *cuda_emu_rt::resolve(cudaStream_t stream) {
  Streams &ss = streams();
  if (stream == cudaStreamPerThread) {
    if (per_thread == NULL || per_thread_generation != ss.generation) {
      per_thread = stream_new(0, 0);
      per_thread_generation = ss.generation;
    }
    return per_thread;
  }
  if (stream == NULL || stream == cudaStreamLegacy) {
    std::lock_guard<std::mutex> g(ss.m);
    CUstream_st *&legacy = ss.legacy[current_device];
    if (legacy == NULL) {
      auto *s = new CUstream_st;
      s->id = 0;
      s->device = current_device;
      s->legacy = true;
      ss.all.insert(s);
      legacy = s;
      std::thread(worker, s).detach();
    }
    return legacy;
  }
  return stream;
}

void cuda_emu_rt::stream_sync(CUstream_st *s) {
  std::unique_lock<std::mutex> l(s->m);
  s->cv.wait(l, [&] { return s->q.empty() && !s->busy; });
}

void cuda_emu_rt::sync_all() {
  std::vector<CUstream_st *> all;
  {
    std::lock_guard<std::mutex> g(streams().m);
    all.assign(streams().all.begin(), streams().all.end());
  }
  for (auto *s : all) stream_sync(s);
}

namespace {

bool blocking(const CUstream_st *s) {
  return !s->legacy && (s->flags & cudaStreamNonBlocking) == 0;
}

// An OP_AFTER on what t has queued but not run yet; false when nothing is
// pending there or t is capturing.
bool after_pending(CUstream_st *t, Op *out) {
  std::lock_guard<std::mutex> g(t->m);
  if (t->capture != NULL || t->queued == t->done) return false;
  out->kind = OP_AFTER;
  out->after = t;
  out->seq = t->queued;
  return true;
}

// What an operation on s waits for first, as a device's legacy default
// stream orders itself: on the legacy stream, the work queued before it on
// every blocking stream of its device (not created cudaStreamNonBlocking);
// on a blocking stream, the work queued before it on its device's legacy
// stream.
std::vector<Op> implicit_waits(CUstream_st *s) {
  std::vector<Op> waits;
  std::vector<CUstream_st *> others;
  {
    std::lock_guard<std::mutex> g(streams().m);
    if (s->legacy) {
      for (CUstream_st *t : streams().all)
        if (t->device == s->device && blocking(t)) others.push_back(t);
    } else if (blocking(s) && streams().legacy[s->device] != NULL) {
      others.push_back(streams().legacy[s->device]);
    }
  }
  for (CUstream_st *t : others) { // never freed (worker): safe outside the lock
    Op w;
    if (after_pending(t, &w)) waits.push_back(std::move(w));
  }
  return waits;
}

} // namespace

cudaError_t cuda_emu_rt::enqueue(cudaStream_t stream, Op op, uint64_t *pos) {
  ctx_need();
  CUstream_st *s = resolve(stream);
  std::vector<Op> waits = implicit_waits(s); // dropped under a capture
  std::lock_guard<std::mutex> g(s->m);
  if (pos != NULL) *pos = 0;
  if (s->dying) return fail(cudaErrorInvalidResourceHandle);
  if (s->capture != NULL) {
    s->capture->ops.push_back(std::move(op));
    return cudaSuccess;
  }
  for (Op &w : waits) {
    s->q.push_back(std::move(w));
    s->queued++;
  }
  s->q.push_back(std::move(op));
  s->queued++;
  if (pos != NULL) *pos = s->queued;
  s->cv.notify_all();
  return cudaSuccess;
}

void cuda_emu_rt::stream_wait_for(CUstream_st *s, uint64_t pos) {
  std::unique_lock<std::mutex> l(s->m);
  s->cv.wait(l, [&] { return s->done >= pos; });
}


namespace {

void run_op(Op &op) {
  switch (op.kind) {
  case OP_KERNEL: run_kernel(op); break;
  case OP_COPY: memmove(op.dst, op.src, op.n); break;
  case OP_SET: memset(op.dst, op.value, op.n); break;
  case OP_RECORD: {
    std::lock_guard<std::mutex> g(events_mutex());
    op.event->pending.erase(op.seq);
    if (op.seq > op.event->reached) {
      op.event->reached = op.seq;
      op.event->reached_ns = cuda_emu_clock_ns();
    }
    events_cv().notify_all();
    break;
  }
  case OP_WAIT: {
    std::unique_lock<std::mutex> l(events_mutex());
    // the record it saw, whatever records came after it on other streams
    events_cv().wait(l, [&] { return op.event->pending.count(op.seq) == 0; });
    break;
  }
  case OP_HOST: op.host(op.data); break;
  case OP_FREE: region_free(op.dst, REGION_DEVICE); break;
  case OP_AFTER: {
    std::unique_lock<std::mutex> l(op.after->m);
    op.after->cv.wait(l, [&] { return op.after->done >= op.seq; });
    break;
  }
  }
}


} // namespace

extern "C" {


cudaError_t cudaStreamCreateWithPriority(cudaStream_t *s, unsigned int flags, int priority) {
  if (s == NULL) return fail(cudaErrorInvalidValue);
  *s = stream_new(flags, priority);
  return cudaSuccess;
}
cudaError_t cudaStreamCreateWithFlags(cudaStream_t *s, unsigned int flags) {
  return cudaStreamCreateWithPriority(s, flags, 0);
}
cudaError_t cudaStreamCreate(cudaStream_t *s) { return cudaStreamCreateWithPriority(s, 0, 0); }
cudaError_t cudaStreamDestroy(cudaStream_t stream) {
  if (stream == NULL || stream == cudaStreamLegacy || stream == cudaStreamPerThread)
    return fail(cudaErrorInvalidResourceHandle);
  std::lock_guard<std::mutex> g(stream->m);
  stream->dying = true; // its worker drains the queue and ends
  stream->cv.notify_all();
  return cudaSuccess;
}
cudaError_t cudaStreamSynchronize(cudaStream_t stream) {
  CUstream_st *s = resolve(stream);
  {
    std::lock_guard<std::mutex> g(s->m);
    if (s->capture != NULL) return fail(cudaErrorStreamCaptureUnsupported);
  }
  stream_sync(s);
  return cudaSuccess;
}
cudaError_t cudaStreamQuery(cudaStream_t stream) {
  CUstream_st *s = resolve(stream);
  std::lock_guard<std::mutex> g(s->m);
  if (s->capture != NULL) return fail(cudaErrorStreamCaptureUnsupported);
  return s->q.empty() && !s->busy ? cudaSuccess : cudaErrorNotReady;
}
cudaError_t cudaStreamGetId(cudaStream_t stream, unsigned long long *id) {
  if (id == NULL) return fail(cudaErrorInvalidValue);
  *id = resolve(stream)->id;
  return cudaSuccess;
}
cudaError_t cudaStreamGetDevice(cudaStream_t stream, int *dev) {
  (void)stream;
  if (dev == NULL) return fail(cudaErrorInvalidValue);
  *dev = 0;
  return cudaSuccess;
}
cudaError_t cudaStreamGetPriority(cudaStream_t stream, int *priority) {
  if (priority == NULL) return fail(cudaErrorInvalidValue);
  *priority = resolve(stream)->priority;
  return cudaSuccess;
}
cudaError_t cudaDeviceGetStreamPriorityRange(int *least, int *greatest) {
  if (least != NULL) *least = 0;
  if (greatest != NULL) *greatest = -5;
  return cudaSuccess;
}
cudaError_t cudaLaunchHostFunc(cudaStream_t stream, cudaHostFn_t fn, void *data) {
  if (fn == NULL) return fail(cudaErrorInvalidValue);
  Op op;
  op.kind = OP_HOST;
  op.host = fn;
  op.data = data;
  return enqueue(stream, std::move(op));
}

// --- events

cudaError_t cudaEventCreateWithFlags(cudaEvent_t *e, unsigned int flags) {
  ctx_need();
  if (e == NULL) return fail(cudaErrorInvalidValue);
  *e = new CUevent_st;
  (*e)->flags = flags;
  return cudaSuccess;
}
// Milliseconds between two completed records, as the host's clock saw their
// streams reach them.
cudaError_t cudaEventElapsedTime(float *ms, cudaEvent_t start, cudaEvent_t end) {
  if (ms == NULL) return fail(cudaErrorInvalidValue);
  if (start == NULL || end == NULL) return fail(cudaErrorInvalidResourceHandle);
  std::lock_guard<std::mutex> g(events_mutex());
  for (CUevent_st *e : {start, end}) {
    if ((e->flags & cudaEventDisableTiming) != 0 || e->recorded == 0)
      return fail(cudaErrorInvalidResourceHandle);
    if (e->reached != e->recorded) return fail(cudaErrorNotReady);
  }
  *ms = (float)(((double)end->reached_ns - (double)start->reached_ns) / 1e6);
  return cudaSuccess;
}
cudaError_t cudaEventCreate(cudaEvent_t *e) { return cudaEventCreateWithFlags(e, 0); }
cudaError_t cudaEventDestroy(cudaEvent_t e) {
  // kept: an operation still queued may name it (CUDA frees it once done)
  return e == NULL ? fail(cudaErrorInvalidResourceHandle) : cudaSuccess;
}
cudaError_t cudaEventRecord(cudaEvent_t e, cudaStream_t stream) {
  if (e == NULL) return fail(cudaErrorInvalidResourceHandle);
  CUstream_st *s = resolve(stream);
  CUgraph_st *capture;
  {
    std::lock_guard<std::mutex> g(s->m);
    capture = s->capture;
  }
  if (capture != NULL) { // an edge of the graph: capture order keeps it
    std::lock_guard<std::mutex> ge(events_mutex()); // (never with a stream's lock held)
    e->captured_in = capture;
    return cudaSuccess;
  }
  Op op;
  op.kind = OP_RECORD;
  op.event = e;
  {
    std::lock_guard<std::mutex> g(events_mutex());
    e->captured_in = NULL;
    op.seq = ++e->recorded;
    e->pending.insert(op.seq);
  }
  return enqueue(s, std::move(op));
}
cudaError_t cudaStreamWaitEvent(cudaStream_t stream, cudaEvent_t e, unsigned int flags) {
  (void)flags;
  if (e == NULL) return fail(cudaErrorInvalidResourceHandle);
  CUstream_st *s = resolve(stream);
  Op op;
  op.kind = OP_WAIT;
  op.event = e;
  {
    std::lock_guard<std::mutex> g(events_mutex());
    if (e->captured_in != NULL) { // joins that capture, if it goes on
      bool live;
      {
        std::lock_guard<std::mutex> gl(streams().m);
        live = streams().captures.count(e->captured_in) != 0;
      }
      if (live) {
        std::lock_guard<std::mutex> gs(s->m);
        s->capture = e->captured_in;
      }
      return cudaSuccess; // an ended capture's record is no wait
    }
    op.seq = e->recorded;
  }
  if (op.seq == 0) return cudaSuccess;
  return enqueue(s, std::move(op));
}
cudaError_t cudaEventQuery(cudaEvent_t e) {
  if (e == NULL) return fail(cudaErrorInvalidResourceHandle);
  std::lock_guard<std::mutex> g(events_mutex());
  return e->pending.count(e->recorded) == 0 ? cudaSuccess : cudaErrorNotReady;
}
cudaError_t cudaEventSynchronize(cudaEvent_t e) {
  if (e == NULL) return fail(cudaErrorInvalidResourceHandle);
  std::unique_lock<std::mutex> l(events_mutex());
  const uint64_t seq = e->recorded;
  events_cv().wait(l, [&] { return e->pending.count(seq) == 0; });
  return cudaSuccess;
}

// --- capture and graphs

cudaError_t cudaStreamBeginCapture(cudaStream_t stream, enum cudaStreamCaptureMode mode) {
  if (stream == NULL || stream == cudaStreamLegacy) return fail(cudaErrorStreamCaptureUnsupported);
  CUstream_st *s = resolve(stream);
  std::lock_guard<std::mutex> g(s->m);
  if (s->capture != NULL) return fail(cudaErrorIllegalState);
  s->capture = new CUgraph_st;
  s->capture_mode = mode;
  std::lock_guard<std::mutex> gl(streams().m);
  streams().captures.insert(s->capture);
  return cudaSuccess;
}
cudaError_t cudaStreamEndCapture(cudaStream_t stream, cudaGraph_t *graph) {
  if (graph == NULL) return fail(cudaErrorInvalidValue);
  CUstream_st *s = resolve(stream);
  CUgraph_st *g;
  {
    std::lock_guard<std::mutex> l(s->m);
    g = s->capture;
    if (g == NULL) return fail(cudaErrorIllegalState);
  }
  std::vector<CUstream_st *> all; // this stream and those that joined its capture
  {
    std::lock_guard<std::mutex> l(streams().m);
    all.assign(streams().all.begin(), streams().all.end());
    streams().captures.erase(g);
  }
  if (std::find(all.begin(), all.end(), s) == all.end()) all.push_back(s);
  for (auto *o : all) {
    std::lock_guard<std::mutex> l(o->m);
    if (o->capture == g) o->capture = NULL;
  }
  *graph = g;
  return cudaSuccess;
}
cudaError_t cudaStreamIsCapturing(cudaStream_t stream, enum cudaStreamCaptureStatus *status) {
  if (status == NULL) return fail(cudaErrorInvalidValue);
  CUstream_st *s = resolve(stream);
  std::lock_guard<std::mutex> g(s->m);
  *status = s->capture != NULL ? cudaStreamCaptureStatusActive : cudaStreamCaptureStatusNone;
  return cudaSuccess;
}
cudaError_t cudaThreadExchangeStreamCaptureMode(enum cudaStreamCaptureMode *mode) {
  if (mode == NULL) return fail(cudaErrorInvalidValue);
  std::swap(*mode, thread_capture_mode);
  return cudaSuccess;
}
cudaError_t cudaGraphInstantiate(cudaGraphExec_t *exec, cudaGraph_t graph, unsigned long long flags) {
  (void)flags;
  if (exec == NULL || graph == NULL) return fail(cudaErrorInvalidValue);
  *exec = new CUgraphExec_st{graph->ops};
  return cudaSuccess;
}
cudaError_t cudaGraphLaunch(cudaGraphExec_t exec, cudaStream_t stream) {
  if (exec == NULL) return fail(cudaErrorInvalidResourceHandle);
  for (const Op &op : exec->ops) {
    cudaError_t e = enqueue(stream, op);
    if (e != cudaSuccess) return e;
  }
  return cudaSuccess;
}
cudaError_t cudaGraphExecDestroy(cudaGraphExec_t exec) {
  delete exec; // its operations were copied into the queues they went to
  return cudaSuccess;
}
cudaError_t cudaGraphDestroy(cudaGraph_t graph) {
  delete graph;
  return cudaSuccess;
}

} // extern "C"
