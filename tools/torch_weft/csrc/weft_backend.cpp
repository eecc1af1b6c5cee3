// torch_weft: a c10d::Backend over the public weft API (include/weft.h).
//
// One communicator per process group. Its unique id travels through the
// c10d Store PyTorch hands the backend (rank 0 sets it, the others get it),
// so a group needs no port of its own. Operations are queued for a worker
// thread of the backend, which runs them with blocking weft calls (NULL
// stream) in issue order; the caller's thread returns at once with a Work
// whose wait(), isCompleted() and getFuture() follow the worker. Operations
// issued together (allreduce_coalesced, start/endCoalescing, a run of
// sends and receives) run as one weft group.
//
// Sends and receives on host memory issued outside a coalescing block go,
// in issue order, to a weft host stream of the group, where those queued
// back to back advance together on the stream's thread: an isend starts at
// once, and isend/irecv pairs that cross between two ranks do not
// deadlock. An operation run on the worker (or a caller's thread) after
// them waits for them first (p2p_drain), so issue order holds.
//
// Failures: weft reports a dead or silent peer (naming its rank) within the
// communicator's timeout, which is the process group's timeout; the Work
// then raises torch.distributed.DistBackendError with weft's text.

#include "weft_backend.h"

#include <torch/csrc/distributed/c10d/PrefixStore.hpp>
#include <torch/csrc/distributed/c10d/ProcessGroup.hpp>
#include <torch/csrc/utils/pybind.h>

#include "weft_alloc.h"
#include "weft_cuda.h"
#include "weft_streams.h"

#include <sys/resource.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>

namespace torch_weft {

// TORCH_WEFT_ASYNC_ERROR_HANDLING: what the watchdog does with a failure
// (weft_backend.h); 3 unless set to 0, 1 or 2.
static int async_error_handling() {
  const char *v = getenv("TORCH_WEFT_ASYNC_ERROR_HANDLING");
  if (v == nullptr || *v == '\0') return 3;
  TORCH_CHECK(strlen(v) == 1 && v[0] >= '0' && v[0] <= '3', "weft: ",
              "TORCH_WEFT_ASYNC_ERROR_HANDLING=", v, " is not one of 0, 1, 2, 3");
  return v[0] - '0';
}

// A group's two communicators (collectives; host sends and receives) are
// revoked together: what waits in either returns, and the peers waiting on
// this rank in either fail now.
static void revoke_both(weftComm_t comm, weftComm_t pcomm) {
  weftCommRevoke(comm, 0);
  weftCommRevoke(pcomm, 0);
}

WeftBackend::WeftBackend(const c10::intrusive_ptr<c10d::Store> &store, int rank, int size,
                         std::chrono::milliseconds timeout, const std::string &name, int channels)
    : Backend(rank, size),
      timeout_(timeout),
      channels_(channels),
      store_(store),
      received_(size, 0),
      queue_(std::make_shared<queue_state>()) {
  // a bad TORCH_WEFT_ASYNC_ERROR_HANDLING raises before anything is made
  // (a thread started before it would end the process: std::terminate)
  handling_ = async_error_handling();
  // the unique id travels through the store: rank 0 makes it, others read it
  weftUniqueId id;
  const std::string key = "weft_unique_id";
  if (rank == 0) {
    check_init(weftGetUniqueId(&id), "weftGetUniqueId");
    std::vector<uint8_t> bytes((uint8_t *)id.internal, (uint8_t *)id.internal + sizeof id.internal);
    store->set(key, bytes);
  } else {
    std::vector<uint8_t> bytes = store->get(key);
    TORCH_CHECK(bytes.size() == sizeof id.internal, "weft: the store holds a unique id of ",
                bytes.size(), " bytes, expected ", sizeof id.internal);
    memcpy(id.internal, bytes.data(), sizeof id.internal);
  }
  // the group's own keys (the flight recorder's dump signal, monitored
  // barriers, receives from any source) under this incarnation's id: torch
  // gives a group made again (a torchrun restart on the same store, or
  // init_process_group after destroy_process_group) the same store prefix,
  // and a signal left by the last one would fail the new one at once
  uint64_t tag = 1469598103934665603ull;
  for (size_t i = 0; i < sizeof id.internal; i++)
    tag = (tag ^ (uint8_t)id.internal[i]) * 1099511628211ull;
  store_ = c10::make_intrusive<c10d::PrefixStore>(c10::str("weft/", std::hex, tag), store);
  name_ = name.empty() ? std::string("torch") : name;
  weftConfig_t config = config_of(timeout, name_, channels);
  check_init(weftCommInitRankConfig(&comm_, size, id, rank, &config), "weftCommInitRank");
  // every rank read the id to join: rank 0 takes it out of the store, so that
  // a group made again on this store (init_process_group after
  // destroy_process_group, which reuses the keys) hands no rank the last id
  if (rank == 0) {
    try {
      store->deleteKey(key);
    } catch (const std::exception &) {
      // a store without deletion: a rank of a group made again may read the
      // last id first, and fails to join it (as with NCCL and Gloo)
    }
  }
  make_pcomm();
  queue_->comm = comm_;
  worker_ = std::thread([this] { worker_loop(); });
  worker_id_ = worker_.get_id();
  watchdog_ = std::thread([this] { watchdog_loop(); });
}

WeftBackend::WeftBackend(weftComm_t comm, int rank, int size, std::chrono::milliseconds timeout,
                         const std::string &name, c10::intrusive_ptr<c10d::Store> store)
    : Backend(rank, size),
      timeout_(timeout),
      name_(name),
      store_(std::move(store)),
      received_(size, 0),
      comm_(comm),
      queue_(std::make_shared<queue_state>()) {
  handling_ = async_error_handling();
  make_pcomm();
  queue_->comm = comm_;
  worker_ = std::thread([this] { worker_loop(); });
  worker_id_ = worker_.get_id();
  watchdog_ = std::thread([this] { watchdog_loop(); });
}

thread_local weftStream_t WeftBackend::stream_ = nullptr;

void WeftBackend::make_pcomm() {
  // every rank of the group makes it (torch makes a group on all of them),
  // over comm_, before anything else runs there; with comm_'s channels,
  // timeout and name
  const weftResult_t res = weftCommSplit(comm_, 0, rank_, &pcomm_, nullptr);
  if (res != weftSuccess) {
    const std::string why = weftGetLastError(comm_);
    weftCommAbort(comm_); /* the peers waiting in the split fail now */
    comm_ = nullptr;
    C10_THROW_ERROR(DistBackendError,
                    c10::str("weft: weftCommSplit (the sends' and receives' communicator) failed ",
                             "on rank ", rank_, " of ", size_, ": ", weftGetErrorString(res), ": ",
                             why));
  }
  std::lock_guard<std::mutex> lk(comms_ref_->mu);
  comms_ref_->comm = comm_;
  comms_ref_->pcomm = pcomm_;
}

c10::intrusive_ptr<c10d::Backend> WeftBackend::split(const c10::intrusive_ptr<c10d::Store> &store,
                                                     const std::vector<int> &ranks,
                                                     const c10::intrusive_ptr<Options> &opts) {
  TORCH_CHECK(!in_block(), "weft: split inside a coalescing block");
  TORCH_CHECK(!ranks.empty(), "weft: split: no ranks");
  for (int r : ranks)
    TORCH_CHECK(r >= 0 && r < size_, "weft: split: rank ", r, " is not a rank of this group of ",
                size_);
  auto me = std::find(ranks.begin(), ranks.end(), rank_);
  const bool member = me != ranks.end();
  const int color = member ? *std::min_element(ranks.begin(), ranks.end()) : WEFT_SPLIT_NOCOLOR;
  const int key = member ? (int)(me - ranks.begin()) : 0;
  const std::chrono::milliseconds timeout = opts ? opts->timeout : this->timeout();
  const std::string name = opts && !opts->group_name.empty() ? opts->group_name : name_;
  weftConfig_t config = config_of(timeout, name, channels_);
  weftComm_t child = nullptr;
  op_step s;
  s.issue = [&]() { return weftCommSplit(comm_, color, key, &child, &config); };
  std::vector<op_step> steps;
  steps.push_back(std::move(s));
  submit("split", c10d::OpType::UNKNOWN, std::move(steps), {}, false)->wait();
  if (!member) return nullptr;
  auto b = c10::make_intrusive<WeftBackend>(child, key, (int)ranks.size(), timeout, name, store);
  b->channels_ = channels_;
  b->set_stream_options(stream_opts());
  if (flight_ != nullptr) {
    std::vector<int64_t> global;
    if (opts && opts->global_ranks_in_group.size() == ranks.size())
      for (uint64_t g : opts->global_ranks_in_group) global.push_back((int64_t)g);
    else
      for (int r : ranks) global.push_back(flight_->ranks[r]);
    b->flight_join(opts && !opts->group_name.empty() ? opts->group_name : name,
                   opts ? opts->group_desc : std::string(), std::move(global));
  }
  return b;
}

void WeftBackend::setTimeout(std::chrono::milliseconds timeout) {
  // as a group's creation takes it: beyond 24 days the communicator's own
  // timeout stays at its longest, and the watchdog's deadline is the whole
  TORCH_CHECK(timeout.count() > 0, "weft: set_timeout: ", timeout.count(),
              " ms is not a timeout (it must be positive)");
  std::lock_guard<std::mutex> lk(comm_mu_);
  TORCH_CHECK(!aborted_ && comm_ != nullptr, "weft: set_timeout on a process group that was ",
              "aborted or shut down");
  const int ms = (int)std::min<long long>(timeout.count(), INT32_MAX);
  for (weftComm_t c : {comm_, pcomm_}) {
    weftResult_t res = weftCommSetTimeout(c, ms);
    TORCH_CHECK(res == weftSuccess, "weft: set_timeout: ", weftGetErrorString(res), ": ",
                weftGetLastError(c));
  }
  timeout_.store(timeout, std::memory_order_relaxed);
}

c10::intrusive_ptr<c10d::Backend> WeftBackend::shrink(const std::vector<int64_t> &ranks_to_exclude,
                                                      int shrink_flags,
                                                      const c10::intrusive_ptr<Options> &opts) {
  TORCH_CHECK(!in_block(), "weft: shrink inside a coalescing block");
  std::vector<int> excluded;
  for (int64_t r : ranks_to_exclude) {
    TORCH_CHECK(r >= 0 && r < size_, "weft: shrink: rank ", r, " is not a rank of this group of ",
                size_);
    TORCH_CHECK(r != rank_, "weft: shrink: rank ", r, " excludes itself (excluded ranks do not ",
                "call shrink_group)");
    excluded.push_back((int)r);
  }
  const std::chrono::milliseconds timeout = opts ? opts->timeout : this->timeout();
  const std::string name = opts && !opts->group_name.empty() ? opts->group_name : name_;
  if (shrink_flags & 1) {
    // SHRINK_ABORT: what waits in this communicator (a dead peer's
    // operation, say) ends now, and the queue drains at once
    mark_revoked(); /* before comm_mu_: the queue's lock is never taken inside it */
    std::lock_guard<std::mutex> lk(comm_mu_);
    if (!aborted_ && comm_ != nullptr) {
      revoke_both(comm_, pcomm_);
    }
  }
  weftConfig_t config = config_of(timeout, name, channels_);
  weftComm_t child = nullptr;
  op_step s;
  s.issue = [&]() {
    return weftCommShrink(comm_, excluded.data(), (int)excluded.size(), &child, &config);
  };
  std::vector<op_step> steps;
  steps.push_back(std::move(s));
  auto work = submit("shrink", c10d::OpType::UNKNOWN, std::move(steps), {}, false);
  work->wait();
  int rank = 0, size = 0;
  weftCommUserRank(child, &rank);
  weftCommCount(child, &size);
  // the new group's keys (monitored barriers, receives from any source)
  // apart from this one's
  auto store = c10::make_intrusive<c10d::PrefixStore>(c10::str("weft_shrunk/", ++shrinks_),
                                                      store_);
  auto b = c10::make_intrusive<WeftBackend>(child, rank, size, timeout, name, store);
  b->channels_ = channels_;
  b->set_stream_options(stream_opts());
  if (flight_ != nullptr) {
    std::vector<int64_t> global;
    for (int r = 0; r < size_; r++)
      if (std::find(excluded.begin(), excluded.end(), r) == excluded.end())
        global.push_back(flight_->ranks[r]);
    if ((int)global.size() == size)
      b->flight_join(opts && !opts->group_name.empty() ? opts->group_name
                                                       : c10::str(flight_->name, ":shrunk", shrinks_),
                     opts && !opts->group_desc.empty() ? opts->group_desc
                                                       : c10::str(flight_->desc, ":shrunk"),
                     std::move(global));
  }
  return b;
}

void WeftBackend::startTimeEstimate() {
  TORCH_CHECK(!in_block(), "weft: a time estimate inside a coalescing block");
  startCoalescing();
  estimating_ = true;
}

float WeftBackend::endTimeEstimate() {
  TORCH_CHECK(in_block() && estimating_, "weft: endTimeEstimate without startTimeEstimate");
  estimating_ = false;
  auto work = coalesced_work_;
  work->set_block_open(false);
  coalesced_work_.reset();
  task t = std::move(coalesced_);
  coalesced_ = task{"coalesced", {}, {}};
  block_owner_.store(std::thread::id()); /* the block's state is left as found */
  TORCH_CHECK(t.device < 0, "weft: time estimates of operations on CUDA tensors are not ",
              "supported (their streams)");
  // recorded as a group that weftGroupSimulateEnd drops: nothing runs, so
  // nothing waits for the queue; the Works of the block complete at once
  float us = 0;
  at::NoGradGuard no_grad; /* as issue_steps */
  weftResult_t res = weftGroupStart();
  std::exception_ptr thrown;
  simulating() = true;
  for (auto &s : t.steps) {
    if (res != weftSuccess) break;
    if (!s.issue) continue;
    try {
      res = s.issue();
    } catch (...) {
      thrown = std::current_exception();
      break;
    }
  }
  simulating() = false;
  weftResult_t end = weftGroupSimulateEnd(&us);
  if (res == weftSuccess) res = end;
  for (auto &s : t.steps)
    if (s.release) s.release();
  for (auto &w : t.works) w->complete(nullptr);
  if (thrown) std::rethrow_exception(thrown);
  if (res != weftSuccess) fail("time estimate", res, t.has_p2p());
  return us;
}

c10::intrusive_ptr<c10d::Work> WeftBackend::submit(const char *name, c10d::OpType type,
                                                   std::vector<op_step> steps,
                                                   std::vector<at::Tensor> outputs, bool async_op,
                                                   std::vector<at::Tensor> inputs, int peer) {
  const int device = !inputs.empty()    ? device_of(inputs[0])
                     : !outputs.empty() ? device_of(outputs[0])
                                        : -1;
  for (const auto &o : outputs) check_device(o, device, name);
  for (const auto &i : inputs) check_device(i, device, name);
  const bool block = in_block();
  TORCH_CHECK(!block || coalesced_.steps.empty() || coalesced_.device == device, "weft: ", name,
              ": a coalesced block mixes host and CUDA tensors (or two GPUs)");
  const int sdev = device >= 0 ? device
                   : (gpu_fake_on() && (!inputs.empty() || !outputs.empty())) ? 0
                                                                               : -1;
  // recorded into a CUDA graph being captured: it runs when the graph does,
  // so neither the flight recorder nor the watchdog follows it (as NCCL's),
  // and nothing here asks CUDA about the operations issued before it
  const bool captured = sdev >= 0 && capture_open(sdev);
  // numbered once accepted, as NCCL's: a call refused on one rank only
  // (tensors on two devices) leaves the group's numbers the peers'
  // (getSequenceNumberForGroup, which TORCH_DISTRIBUTED_DEBUG=DETAIL compares)
  const numbered num = number(name, peer, inputs, outputs, captured);
  std::vector<at::Tensor> tensors;
  if (sdev >= 0) {
    tensors = std::move(inputs);
    tensors.insert(tensors.end(), outputs.begin(), outputs.end());
    for (const auto &s : steps)
      for (const auto &h : s.held)
        if (h.defined()) tensors.push_back(h);
  }
  if (block) {
    block_seq_ = num.seq;
    coalesced_.device = device;
    if (sdev >= 0) coalesced_.sdev = sdev;
    for (auto &s : steps) coalesced_.steps.push_back(std::move(s));
    for (auto &x : tensors) coalesced_.tensors.push_back(std::move(x));
    coalesced_work_->add_flight(num.flight_id);
    return coalesced_work_;
  }
  auto work = make_work(type, name, std::move(outputs));
  work->add_flight(num.flight_id);
  if (!captured) watch(work, name, num.seq);
  task t{name, std::move(steps), {work}, device, sdev, {}, std::move(tensors)};
  if (async_op && sdev < 0) {
    enqueue(std::move(t));
    return work;
  }
  run_here(t);
  return work;
}

void WeftBackend::run_here(task &t) {
  // On the worker, in a Work's callback (a DDP comm hook's .then, which
  // may issue operations and wait for them, as PowerSGD's does): the
  // worker holds the queue from a task's start to its callbacks' end, so
  // the callback's operations run here at once, before those queued
  // behind, in the order the callbacks issue them on every rank (NCCL's
  // order: its futures complete, and run their callbacks, as operations
  // are issued). Queued, they would wait for the worker this callback
  // holds.
  const bool nested = on_worker();
  {
    std::unique_lock<std::mutex> lk(queue_->mu);
    TORCH_CHECK(!queue_->stop, "weft: ", t.name, " on a process group that was shut down");
    if (!nested)
      queue_->cv.wait(lk, [this] {
        return queue_->stop || (queue_->tasks.empty() && !queue_->busy);
      });
    // a shutdown or abort on another thread while this call waited its turn
    TORCH_CHECK(!queue_->stop, "weft: ", t.name, " on a process group that was shut down");
    queue_->busy = true;
    /* as a queued one: later ones go after it (a callback's runs before
     * the holders queued, and holds nothing) */
    if (t.has_p2p() && !nested) queue_->hold(t);
  }
  run_busy(t, nested);
}

void WeftBackend::run_busy(task &t, bool nested) {
  // the worker frees the queue once t's callbacks have run (run_here); a
  // blocking call's thread frees it first, as its Work has no callbacks yet
  const bool worker = !nested && on_worker();
  std::shared_ptr<queue_state> q = queue_; /* the callbacks may drop the backend */
  // on a CUDA stream it starts when the GPU reaches its start event
  if (t.sdev < 0)
    for (auto &w : t.works) w->mark_started();
  std::exception_ptr err;
  try {
    err = run(t);
  } catch (...) { /* the queue is freed, and what t holds released, all the same */
    err = std::current_exception();
  }
  std::vector<task> ready; /* sends and receives held behind t */
  std::vector<std::exception_ptr> errs;
  {
    std::unique_lock<std::mutex> lk(queue_->mu);
    if (!nested && !worker) queue_->busy = false;
    std::unique_lock<std::mutex> plk(p2p_mu_, std::defer_lock);
    if (t.holder != 0) {
      queue_->p2p_tasks--;
      queue_->holders_done = t.holder;
      auto &held = queue_->held;
      while (!held.empty() && held.front().first <= queue_->holders_done) {
        ready.push_back(std::move(held.front().second));
        held.pop_front();
      }
      // on the stream before one issued from now on (issue_p2p takes the
      // queue's lock, then p2p_mu_)
      if (!ready.empty()) plk.lock();
    }
    queue_->cv.notify_all();
    lk.unlock();
    for (auto &h : ready) {
      for (auto &w : h.works) w->mark_started();
      errs.push_back(run_p2p(h));
    }
  }
  // t's Works' callbacks may drop the backend: the released ones' Works
  // (on host memory) are completed without it
  complete(t, err);
  for (size_t i = 0; i < ready.size(); i++)
    for (auto &w : ready[i].works) w->complete(errs[i]);
  if (worker) {
    std::lock_guard<std::mutex> lk(q->mu);
    q->busy = false;
    q->cv.notify_all();
  }
}

void WeftBackend::complete(task &t, std::exception_ptr err) {
  if (t.sdev < 0 || err) {
    for (auto &w : t.works) w->complete(err);
    return;
  }
  std::shared_ptr<queue_state> q = queue_;
  const int rank = rank_, size = size_;
  auto async_error = [q, rank, size]() -> std::exception_ptr {
    std::lock_guard<std::mutex> lk(q->mu);
    weftResult_t res = weftSuccess;
    std::string why = q->aborted ? "the process group was aborted"
                                 : "the process group's communicator was revoked";
    if (!q->aborted && !q->revoked) {
      if (q->comm == nullptr || weftCommGetAsyncError(q->comm, &res) != weftSuccess ||
          res == weftSuccess || res == weftInProgress)
        return nullptr;
      why = c10::str(weftGetErrorString(res), ": ", weftGetLastError(q->comm));
    }
    try {
      C10_THROW_ERROR(DistBackendError, c10::str("weft: an operation on the GPU failed on rank ",
                                                 rank, " of ", size, ": ", why));
    } catch (...) {
      return std::current_exception();
    }
  };
  for (size_t i = 0; i < t.works.size(); i++)
    t.works[i]->complete_on_gpu(t.end, t.futures[i], async_error, timeout(),
                                streams_.options().blocking_wait,
                                t.stash ? t.tensors : std::vector<at::Tensor>());
}

c10::intrusive_ptr<c10d::Work> WeftBackend::submit_p2p(const char *name, c10d::OpType type,
                                                       op_step step,
                                                       std::vector<at::Tensor> outputs, int peer) {
  // weft pairs a rank's send to itself with its receive inside one group
  // (as NCCL does); issued apart, the two would fail on the stream unseen
  const bool block = in_block();
  TORCH_CHECK(block || peer != rank_, "weft: ", name, " with rank ", rank_,
              " itself as the peer: a send to itself pairs only with the receive from "
              "itself in the same batch_isend_irecv (or _coalescing_manager block)");
  // on a GPU a send waits for its receiver in the kernel, not on this
  // thread: it runs as other operations do
  if (block || !step.p2p) /* as the step chose its communicator */
    return submit(name, type, {std::move(step)}, std::move(outputs), true, {}, peer);
  const numbered num = number(name, peer, {}, outputs, false);
  auto work = make_work(type, name, std::move(outputs));
  work->add_flight(num.flight_id);
  watch(work, name, num.seq);
  task t{name, {std::move(step)}, {work}};
  t.p2p = true;
  issue_p2p(std::move(t));
  return work;
}

void WeftBackend::issue_p2p(task t) {
  // on its own communicator, a send or receive does not wait for the
  // collectives queued before it: it is queued on the host stream from
  // here (it does not wait for the peer), unless a task with one, queued
  // before it, is still on the worker's queue (a block of both kinds, a
  // receive from any source): it goes behind that, in issue order. From a
  // Work's callback on the worker, the tasks counted are queued behind the
  // one whose callback it is (run_here): it goes first
  std::unique_lock<std::mutex> lk(queue_->mu);
  TORCH_CHECK(!queue_->stop, "weft: ", t.name, " on a process group that was shut down");
  if (queue_->p2p_tasks == 0 || on_worker()) {
    std::exception_ptr err;
    {
      std::lock_guard<std::mutex> plk(p2p_mu_); /* before a later one can queue */
      lk.unlock();
      for (auto &w : t.works) w->mark_started();
      err = run_p2p(t);
    }
    // a failure to queue it (else the lane completes its Works), outside
    // p2p_mu_: the Works' callbacks may issue more
    complete(t, err);
    return;
  }
  queue_->held.emplace_back(queue_->holders, std::move(t));
}

void WeftBackend::flight_join(const std::string &name, const std::string &desc,
                              std::vector<int64_t> global_ranks) {
  if (global_ranks.empty())
    for (int r = 0; r < size_; r++) global_ranks.push_back(r);
  TORCH_CHECK((int)global_ranks.size() == size_, "weft: process group ", name, " has ", size_,
              " ranks and ", global_ranks.size(), " global ranks");
  flight_recorder &fr = flight_recorder::get();
  if (!fr.enabled()) return;
  const int me = (int)global_ranks[rank_];
  flight_ = fr.add_group(name, desc.empty() ? std::string("undefined") : desc,
                         std::move(global_ranks), me);
  if (store_) flight_signal_ = std::thread([this] { flight_signal_loop(); });
}

static const char *const kFlightSignal = "weft_flight_recorder_dump";
static const char *const kFlightSeen = "weft_flight_recorder_dumped"; /* members that did */

void WeftBackend::flight_signal_loop() {
  auto store = store_;
  for (;;) {
    {
      std::unique_lock<std::mutex> lk(watch_mu_);
      watch_cv_.wait_for(lk, std::chrono::milliseconds(500), [this] { return watch_stop_; });
      if (watch_stop_) return;
    }
    std::string why;
    try {
      if (!store->check({kFlightSignal})) continue;
      std::vector<uint8_t> v = store->get(kFlightSignal);
      why = std::string(v.begin(), v.end());
    } catch (const std::exception &) {
      return; /* the store is gone: its host's process ended */
    }
    // a failure of this rank's own (its operation failed with the peer)
    // names its own operation, whichever thread sees the group fail first
    std::string own;
    const c10d::ErrorType type = watchdog_look_safe(own);
    if (type != c10d::ErrorType::SUCCESS)
      watchdog_fire(type, own);
    else
      watchdog_fire(c10d::ErrorType::REMOTE_ERROR,
                    c10::str("the group failed on another rank (", why, ")"));
    return;
  }
}

WeftBackend::numbered WeftBackend::number(const char *name, int peer,
                                          const std::vector<at::Tensor> &inputs,
                                          const std::vector<at::Tensor> &outputs, bool captured) {
  std::lock_guard<std::mutex> lk(number_mu_);
  numbered n;
  n.seq = ++seq_;
  if (strcmp(name, "send") != 0 && strcmp(name, "recv") != 0 && strcmp(name, "recv_anysource") != 0)
    ++coll_seq_;
  n.flight_id = flight_record(name, peer, n.seq, inputs, outputs, captured);
  return n;
}

bool WeftBackend::capture_open(int sdev) {
  gpu_layer *g = gpu_layer_now();
  return g != nullptr && g->capturing(sdev, g->current_stream(sdev));
}

int64_t WeftBackend::flight_record(const char *name, int peer, uint64_t seq,
                                   const std::vector<at::Tensor> &inputs,
                                   const std::vector<at::Tensor> &outputs, bool captured) {
  const bool block = in_block();
  if (flight_ == nullptr || (block && estimating_)) return -1;
  bool inplace = false;
  const char *kind = flight_kind(name, &inplace);
  if (kind == nullptr) return -1;
  flight_op op;
  op.is_p2p = strcmp(kind, "send") == 0 || strcmp(kind, "recv") == 0;
  // a block takes one number of each kind it holds, at its first of it
  bool &taken = op.is_p2p ? block_p2p_ : block_coll_;
  if (!block || !taken) (op.is_p2p ? flight_->p2p_seq : flight_->collective_seq)++;
  if (block) {
    taken = true;
    block_coll_seq_ = flight_->collective_seq;
    block_p2p_seq_ = flight_->p2p_seq;
  }
  if (captured) return -1; /* numbered, not recorded */
  op.collective_seq = flight_->collective_seq;
  op.p2p_seq = flight_->p2p_seq;
  op.op_id = (int64_t)seq;
  op.timeout_ms = timeout().count();
  op.kind = kind;
  op.rank = rank_;
  op.peer = peer;
  return flight_recorder::get().record(flight_, op, inplace ? outputs : inputs, outputs);
}

void WeftBackend::enqueue(task t) {
  // on a GPU, and from a Work's callback, which the worker runs: at once,
  // there (run_here), before what is queued
  if (t.sdev >= 0 || on_worker()) {
    run_here(t);
    return;
  }
  const char *name = t.name; /* a literal */
  TORCH_CHECK(queue_->push(std::move(t)), "weft: ", name, " on a process group that was shut down");
}

void WeftBackend::worker_loop() {
  // The worker waits on peers (weft's waits spin, then yield) while the
  // training thread computes: at a lower priority it takes a core only
  // when the compute leaves it one. TORCH_WEFT_WORKER_NICE (default 10; 0
  // keeps the caller's priority) sets how much lower.
  const char *nice_env = getenv("TORCH_WEFT_WORKER_NICE");
  int nice_inc = nice_env != nullptr ? atoi(nice_env) : 10;
  if (nice_inc > 0) {
    errno = 0;
    int cur = getpriority(PRIO_PROCESS, (id_t)syscall(SYS_gettid));
    if (errno == 0)
      setpriority(PRIO_PROCESS, (id_t)syscall(SYS_gettid), std::min(cur + nice_inc, 19));
  }
  // the queue is held here: a task's callbacks may stop the group and drop
  // the backend (stop_worker, worker_detached)
  std::shared_ptr<queue_state> q = queue_;
  for (;;) {
    task t;
    {
      std::unique_lock<std::mutex> lk(q->mu);
      q->cv.wait(lk, [&q] { return (q->stop && !q->busy) || (!q->tasks.empty() && !q->busy); });
      if (q->tasks.empty()) return; /* stopped and drained */
      t = std::move(q->tasks.front());
      q->tasks.pop_front();
      q->busy = true;
    }
    run_busy(t);
    std::lock_guard<std::mutex> lk(q->mu);
    if (q->worker_detached) return;
  }
}

std::exception_ptr WeftBackend::run(task &t) {
  // a task with a send or receive of its own (a coalescing block's, a
  // receive from any source) runs on pcomm_ after those on the host stream
  std::unique_lock<std::mutex> plk(p2p_mu_, std::defer_lock);
  if (t.has_p2p()) {
    plk.lock();
    p2p_drain();
  }
  if (t.sdev < 0) return run_steps(t);
  // on the group's communication stream of the device, after the caller's
  // current stream (weft_streams.h); weft's kernels and torch's staging
  // copies go there (on host memory, with the fake layer, the operation
  // runs on the host as ever)
  gpu_layer *g = gpu_layer_now();
  TORCH_CHECK(g != nullptr, "weft: ", t.name, ": this torch_weft was built without CUDA support");
  try {
    t.launch = streams_.begin(g, t.sdev);
  } catch (...) {
    return std::current_exception();
  }
  // From here the communication stream holds the operation's part, even
  // when it fails: staging copies, the kernels of the steps issued before a
  // step threw (weftGroupEnd launches them), the fork of a capture. So its
  // end is recorded, and its tensors held, whatever happens; and here, while
  // the queue is this task's, so that the next operation on the stream
  // comes after the end event and the futures' events.
  std::exception_ptr err;
  try {
    g->on_stream(t.sdev, t.launch.stream, [&]() {
      stream_ = t.device >= 0 ? t.launch.stream : nullptr;
      err = run_steps(t);
      stream_ = nullptr;
      g->launched(t.sdev, t.launch.stream, t.name);
    });
  } catch (...) {
    stream_ = nullptr;
    err = std::current_exception();
  }
  try {
    t.end = streams_.end(t.launch, t.tensors, &t.stash);
    if (err) {
      // its Works fail at once and are not waited for: the caller's stream
      // is ordered after what was enqueued here (which joins a capture's
      // fork back, and orders stashed tensors there)
      t.end->stream_wait();
    } else {
      for (auto &w : t.works) t.futures.push_back(g->future(t.sdev, t.launch.stream, w->result()));
    }
  } catch (...) {
    if (!err) err = std::current_exception();
  }
  return err;
}

weftResult_t WeftBackend::issue_steps(task &t) {
  // the steps write into the caller's tensors (staging copies back, a
  // root's result): outside autograd, as Gloo writes the memory, so that a
  // parameter (a leaf that requires grad) may be reduced or received in place
  at::NoGradGuard no_grad;
  weftResult_t res = weftSuccess;
  std::exception_ptr thrown;
  const bool grouped = t.steps.size() > 1;
  if (grouped) res = weftGroupStart();
  for (auto &s : t.steps) {
    if (res != weftSuccess || thrown) break;
    if (!s.issue) continue;
    try {
      res = s.issue();
    } catch (...) {
      thrown = std::current_exception();
    }
  }
  // a group left open would take in every later call of this thread
  if (grouped) {
    weftResult_t end = weftGroupEnd();
    if (res == weftSuccess) res = end;
  }
  {
    // abort() frees the communicator, the ops made on it with it, once no
    // call is in it: releases hold comm_mu_ (which abort() takes to say it
    // aborts) and are left out after an abort
    std::lock_guard<std::mutex> lk(comm_mu_);
    if (!aborted_)
      for (auto &s : t.steps)
        if (s.release) s.release();
  }
  if (thrown) std::rethrow_exception(thrown);
  return res;
}

void WeftBackend::enter_weft(const char *name) {
  std::lock_guard<std::mutex> lk(comm_mu_);
  TORCH_CHECK(!aborted_, "weft: ", name, ": the process group was aborted");
  inflight_++;
}

WeftBackend::weft_inside::~weft_inside() {
  std::lock_guard<std::mutex> lk(b->comm_mu_);
  if (--b->inflight_ == 0) b->inflight_cv_.notify_all();
}

std::exception_ptr WeftBackend::run_steps(task &t) {
  try {
    enter_weft(t.name);
    weftResult_t res;
    {
      weft_inside left{this};
      res = issue_steps(t);
    }
    if (res != weftSuccess) fail(t.name, res, t.has_p2p());
    at::NoGradGuard no_grad; /* as issue_steps */
    for (auto &s : t.steps)
      if (s.finish) s.finish();
    return nullptr;
  } catch (...) {
    return std::current_exception();
  }
}

std::exception_ptr WeftBackend::run_p2p(task &t) {
  weftEvent_t done = nullptr;
  try {
    enter_weft(t.name);
    weftResult_t res = weftSuccess;
    {
      weft_inside left{this};
      if (p2p_stream_ == nullptr) {
        res = weftStreamCreate(&p2p_stream_);
        if (res != weftSuccess) p2p_stream_ = nullptr;
        p2p_ref_->stream = p2p_stream_; /* no op has it yet */
        if (res == weftSuccess) {
          std::shared_ptr<comms_ref> c = comms_ref_;
          std::shared_ptr<queue_state> q = queue_;
          const int rank = rank_, size = size_;
          p2p_error_ = std::make_shared<const p2p_op::error_fn>(
              [c, q, rank, size]() -> std::exception_ptr {
                std::string why;
                {
                  std::lock_guard<std::mutex> lk(q->mu);
                  if (q->aborted) why = "the process group was aborted";
                  else if (q->revoked) why = "the process group's communicator was revoked";
                }
                if (why.empty()) {
                  std::lock_guard<std::mutex> lk(c->mu);
                  weftResult_t async = weftSuccess;
                  if (c->pcomm == nullptr ||
                      weftCommGetAsyncError(c->pcomm, &async) != weftSuccess ||
                      async == weftSuccess || async == weftInProgress)
                    return nullptr;
                  why = c10::str(weftGetErrorString(async), ": ", weftGetLastError(c->pcomm));
                }
                try {
                  C10_THROW_ERROR(DistBackendError, c10::str("weft: send/recv failed on rank ",
                                                             rank, " of ", size, ": ", why));
                } catch (...) {
                  return std::current_exception();
                }
              });
          p2p_ = std::make_unique<p2p_lane>();
        }
      }
      if (res == weftSuccess) res = weftEventCreate(&done);
      if (res == weftSuccess) {
        stream_ = p2p_stream_;
        try {
          res = issue_steps(t);
        } catch (...) {
          stream_ = nullptr;
          throw;
        }
        stream_ = nullptr;
      }
      if (res == weftSuccess) res = weftEventRecord(done, p2p_stream_);
    }
    if (res != weftSuccess) fail(t.name, res, true);
    p2p_queued_ = true;
    auto op = std::make_shared<p2p_op>(done, p2p_ref_, std::move(t.steps), t.works, p2p_error_);
    done = nullptr; /* the op's */
    for (auto &w : t.works) w->set_p2p(op);
    t.works.clear(); /* the op completes them */
    p2p_->add(std::move(op));
    return nullptr;
  } catch (...) {
    if (done != nullptr) weftEventDestroy(done);
    return std::current_exception();
  }
}

void WeftBackend::mark_revoked() {
  std::lock_guard<std::mutex> lk(queue_->mu);
  queue_->revoked = true;
}

void WeftBackend::p2p_drain() {
  if (!p2p_queued_) return;
  // a failure there is the Works' to report (the lane); what runs next
  // finds the communicator broken
  weftStreamSynchronize(p2p_stream_);
  p2p_queued_ = false;
}

[[noreturn]] void WeftBackend::fail(const char *name, weftResult_t res, bool p2p) {
  std::string detail;
  {
    std::lock_guard<std::mutex> lk(comm_mu_);
    auto broken = [](weftComm_t c) {
      weftResult_t async = weftSuccess;
      return weftCommGetAsyncError(c, &async) == weftSuccess && async != weftSuccess &&
             async != weftInProgress;
    };
    // a block of both kinds: the communicator that broke says why
    weftComm_t c = p2p ? pcomm_ : comm_;
    if (!aborted_ && p2p && !broken(pcomm_) && broken(comm_)) c = comm_;
    detail = aborted_ ? std::string("the process group was aborted")
                      : std::string(weftGetLastError(c));
    if (detail.empty() && !aborted_ && p2p) detail = weftGetLastError(comm_);
  }
  if (detail.empty()) detail = weftGetLastError(nullptr);
  // a peer silent past the group's timeout says so in torch's words, which
  // callers match (" timeout ", as Gloo's " Timed out " and a closed
  // connection's " closed ")
  const std::string when = detail.find("timed out") != std::string::npos
                               ? c10::str(" after the group's timeout (", timeout().count(), " ms)")
                               : std::string();
  C10_THROW_ERROR(DistBackendError,
                  c10::str("weft: ", name, " failed on rank ", rank_, " of ", size_, when, ": ",
                           weftGetErrorString(res), ": ", detail));
}

weftConfig_t WeftBackend::config_of(std::chrono::milliseconds timeout, const std::string &name,
                                     int channels) {
  weftConfig_t config = WEFT_CONFIG_INITIALIZER;
  if (channels > 0) config.minChannels = config.maxChannels = channels;
  long long ms = timeout.count();
  config.timeoutMs = ms <= 0 ? WEFT_CONFIG_UNDEF_INT : (int)std::min<long long>(ms, INT32_MAX);
  config.commName = name.c_str();
  return config;
}

void WeftBackend::check_init(weftResult_t res, const char *call) {
  if (res == weftSuccess) return;
  C10_THROW_ERROR(DistBackendError,
                  c10::str("weft: ", call, " failed on rank ", rank_, " of ", size_, ": ",
                           weftGetErrorString(res), ": ", weftGetLastError(nullptr)));
}

void WeftBackend::watch(const c10::intrusive_ptr<WeftWork> &work, const char *name,
                        uint64_t seq) {
  std::lock_guard<std::mutex> lk(watch_mu_);
  if (watch_stop_) return;
  // done ones at the front go now rather than at the watchdog's next look
  // (their Works hold the caller's tensors)
  while (!watched_.empty() && watched_.front().work->isCompleted() &&
         !watched_.front().work->exception())
    watched_.pop_front();
  const std::chrono::milliseconds t = timeout();
  watched_.push_back(watched{work, seq, name, deadline_after(t), t});
}

c10d::ErrorType WeftBackend::watchdog_look_safe(std::string &what) {
  try {
    return watchdog_look(what);
  } catch (const std::exception &e) {
    // a sticky CUDA error, thrown by an event query: the group is broken
    what = c10::str("checking the group's operations failed: ",
                    std::string(e.what()).substr(0, 400));
    return c10d::ErrorType::COMM_ERROR;
  }
}

c10d::ErrorType WeftBackend::watchdog_look(std::string &what) {
  using clock = std::chrono::steady_clock;
  std::unique_lock<std::mutex> lk(watch_mu_);
  // what is done leaves (a failure is the Work's to raise; the
  // communicator's error, below, is the watchdog's); the first past its
  // deadline is a timeout
  const auto now = clock::now();
  // failed ones whose tensors stay until the GPU is past them
  for (auto it = draining_.begin(); it != draining_.end();) {
    bool passed = false;
    try {
      passed = !(*it)->holds_stash() || (*it)->gpu_passed();
    } catch (const std::exception &) { /* a sticky CUDA error: the memory stays held */
    }
    it = passed ? draining_.erase(it) : std::next(it);
  }
  for (auto it = watched_.begin(); it != watched_.end();) {
    if (it->work->captured()) {
      it = watched_.erase(it);
      continue;
    }
    if (it->work->isCompleted()) {
      if (std::exception_ptr e = it->work->exception()) {
        std::string why;
        try {
          std::rethrow_exception(e);
        } catch (const std::exception &x) {
          why = std::string(x.what()).substr(0, 600);
        } catch (...) {
        }
        last_failed_ = c10::str(it->name, " (sequence number ", it->seq, ") failed: ", why);
        // the GPU may still run it on the tensors its Work keeps (stashed
        // instead of record_stream): they go once it is past it, not with
        // this list's reference to the Work
        if (it->work->holds_stash()) draining_.push_back(it->work);
      }
      it = watched_.erase(it);
      continue;
    }
    if (now > it->deadline) {
      what = c10::str(it->name, " (sequence number ", it->seq, ") timed out: not done ",
                      it->timeout.count(), " ms after it was issued");
      return c10d::ErrorType::TIMEOUT;
    }
    ++it;
  }
  const std::string pending =
      watched_.empty() ? std::string()
                       : c10::str(watched_.front().name, " (sequence number ",
                                  watched_.front().seq, ")");
  const std::string last_failed = last_failed_;
  lk.unlock();
  // a peer that died or gave up, or an operation that failed in weft,
  // breaks the communicator
  std::lock_guard<std::mutex> clk(comms_ref_->mu);
  weftResult_t async = weftSuccess;
  weftComm_t broken = nullptr;
  for (weftComm_t c : {comms_ref_->comm, comms_ref_->pcomm}) {
    if (c == nullptr || weftCommGetAsyncError(c, &async) != weftSuccess ||
        async == weftSuccess || async == weftInProgress)
      continue;
    broken = c;
    break;
  }
  if (broken == nullptr) return c10d::ErrorType::SUCCESS;
  if (!last_failed.empty())
    what = last_failed;
  else
    what = c10::str(pending.empty() ? std::string("the communicator") : pending, " failed: ",
                    weftGetErrorString(async), ": ", weftGetLastError(broken));
  return async == weftRemoteError ? c10d::ErrorType::REMOTE_ERROR : c10d::ErrorType::COMM_ERROR;
}

void WeftBackend::watchdog_loop() {
  for (;;) {
    {
      std::unique_lock<std::mutex> lk(watch_mu_);
      watch_cv_.wait_for(lk, std::chrono::milliseconds(100), [this] { return watch_stop_; });
      if (watch_stop_) return;
    }
    std::string what;
    const c10d::ErrorType type = watchdog_look_safe(what);
    if (type == c10d::ErrorType::SUCCESS || fired_) continue;
    // once; the loop goes on looking, so that what completes later leaves
    // the list (its Work holds the caller's tensors)
    watchdog_fire(type, what);
  }
}

void WeftBackend::watchdog_fire(c10d::ErrorType type, const std::string &what) {
  weftComm_t comm = nullptr, pcomm = nullptr;
  {
    std::lock_guard<std::mutex> lk(comm_mu_);
    if (stopping_ || aborted_) return; /* the group is being shut down or aborted */
    if (fired_.exchange(true)) return; /* the watchdog's thread and the dump signal's */
    error_type_ = (int)type;
    if (handling_ != 0 && comm_ != nullptr) {
      comm = comm_;
      pcomm = pcomm_;
      revoking_++; /* stop_worker frees it only once this revoke is done */
    }
  }
  static const char *const action[] = {
      "the process goes on (TORCH_WEFT_ASYNC_ERROR_HANDLING=0)",
      "aborting the communicator and ending the process (TORCH_WEFT_ASYNC_ERROR_HANDLING=1)",
      "revoking the communicator; the process goes on (TORCH_WEFT_ASYNC_ERROR_HANDLING=2)",
      "revoking the communicator and ending the process (TORCH_WEFT_ASYNC_ERROR_HANDLING=3, "
      "the default)"};
  const std::string msg =
      c10::str("weft watchdog: process group '", name_, "', rank ", rank_, " of ", size_, ": ",
               what, "; ", action[handling_]);
  if (handling_ == 0) {
    TORCH_WARN(msg);
  } else {
    fprintf(stderr, "[rank %d] %s\n", rank_, msg.c_str());
  }
  fflush(stderr);
  // before the revoke: the operations that hang are dumped as they were
  bool signaled = false;
  if (flight_ != nullptr) {
    flight_recorder::get().dump_quietly("the watchdog saw a failure");
    if (store_) {
      try {
        if (what.rfind("the group failed on another rank", 0) != 0) {
          const std::string v = c10::str("rank ", rank_, ": ", what.substr(0, 300));
          store_->set(kFlightSignal, std::vector<uint8_t>(v.begin(), v.end()));
        }
        store_->add(kFlightSeen, 1); /* this rank has dumped */
        signaled = true;
      } catch (const std::exception &) {
        /* the store is gone; the members in an operation fail anyway */
      }
    }
  }
  if (handling_ == 0) return;
  // peers waiting on this rank fail now rather than at their own timeout,
  // and what waits here returns
  if (comm != nullptr) {
    mark_revoked();
    revoke_both(comm, pcomm);
  }
  if (handling_ == 1 || handling_ == 3) {
    // the store may live in this process (rank 0's, with env://): it stays
    // until every member has dumped, or for 2 s (a dead one never does), so
    // that each member's look for the signal finds it
    const auto until = std::chrono::steady_clock::now() + std::chrono::seconds(2);
    try {
      while (signaled && store_->add(kFlightSeen, 0) < size_ &&
             std::chrono::steady_clock::now() < until)
        std::this_thread::sleep_for(std::chrono::milliseconds(50));
    } catch (const std::exception &) {
    }
    // handling 1 frees the communicator, last, fenced as stop_worker frees
    // it: no thread enters it from here (aborted_: refused as after
    // abort()), those in it have left (the revoke ended what they waited
    // for), and nothing asks it for its error after. Where one has not left
    // within 10 s, the process ends with the communicator revoked only.
    if (handling_ == 1 && comm != nullptr) {
      bool left = false;
      {
        std::unique_lock<std::mutex> lk(comm_mu_);
        aborted_ = true;
        left = inflight_cv_.wait_for(lk, std::chrono::seconds(10), [this] { return inflight_ == 0; });
      }
      {
        std::lock_guard<std::mutex> lk(queue_->mu);
        queue_->aborted = true;
        queue_->comm = nullptr;
      }
      {
        std::lock_guard<std::mutex> lk(comms_ref_->mu);
        comms_ref_->comm = comms_ref_->pcomm = nullptr;
      }
      if (left) {
        weftCommAbort(pcomm);
        weftCommAbort(comm);
      }
    }
    fflush(stdout);
    std::_Exit(1);
  }
  std::lock_guard<std::mutex> lk(comm_mu_);
  revoking_--;
  inflight_cv_.notify_all();
}

void WeftBackend::watchdog_stop() {
  {
    std::lock_guard<std::mutex> lk(watch_mu_);
    watch_stop_ = true;
    watched_.clear();
    watch_cv_.notify_all();
  }
  std::lock_guard<std::mutex> lk(watch_join_mu_);
  if (watchdog_.joinable() && watchdog_.get_id() != std::this_thread::get_id()) watchdog_.join();
  if (flight_signal_.joinable() && flight_signal_.get_id() != std::this_thread::get_id())
    flight_signal_.join();
}

void WeftBackend::stop_worker(bool abort_comm) {
  watchdog_stop();
  {
    std::lock_guard<std::mutex> lk(queue_->mu);
    queue_->stop = true;
    queue_->comm = nullptr;
    queue_->aborted = queue_->aborted || abort_comm;
    queue_->cv.notify_all();
  }
  // The first caller (shutdown, abort, the destructor's shutdown) stops the
  // worker and frees the communicator. An abort that comes meanwhile
  // revokes it, so that what the first one waits for ends now, and the
  // first one frees it only after that revoke; every later caller returns
  // once the first one is done.
  //
  // On the worker thread itself (a Work's callback aborts the group, or
  // drops the last reference to it) there is no joining: the worker is
  // detached and returns once its task is done; a later caller there does
  // not wait for the first, which may be joining this very thread.
  weftComm_t comm = nullptr, pcomm = nullptr;
  bool first = false;
  const bool in_worker = on_worker();
  {
    std::lock_guard<std::mutex> lk(comm_mu_);
    if (abort_comm) aborted_ = true;
    comm = comm_;
    pcomm = pcomm_;
    first = !stopping_;
    stopping_ = true;
    if (!first && comm != nullptr && abort_comm) revoking_++;
  }
  if (!first) {
    std::unique_lock<std::mutex> lk(comm_mu_);
    if (comm != nullptr && abort_comm) {
      lk.unlock();
      revoke_both(comm, pcomm);
      lk.lock();
      revoking_--;
      inflight_cv_.notify_all();
    }
    if (!in_worker) inflight_cv_.wait(lk, [this] { return stopped_; });
    return;
  }
  // A thread may have passed its check of aborted_ and not yet be in weft:
  // the revoke ends what runs in the communicator and refuses what comes,
  // keeping it valid until every such thread has left; then it is freed.
  if (comm != nullptr && abort_comm) {
    revoke_both(comm, pcomm);
  }
  std::exception_ptr stopped;
  try {
    C10_THROW_ERROR(DistBackendError,
                    c10::str("weft: the process group was ", abort_comm ? "aborted" : "shut down",
                             " before this operation ran"));
  } catch (...) {
    stopped = std::current_exception();
  }
  if (in_worker) {
    // what is still queued behind the task whose callback stopped the group
    // fails here, as the worker would have failed it
    std::deque<task> left;
    {
      std::lock_guard<std::mutex> lk(queue_->mu);
      queue_->worker_detached = true;
      left.swap(queue_->tasks);
    }
    worker_.detach();
    for (auto &t : left) complete(t, stopped);
  } else if (worker_.joinable()) {
    worker_.join();
  }
  // sends and receives held behind a task that did not run (the worker ran
  // every other one, and issued those held behind it)
  std::deque<std::pair<uint64_t, task>> held;
  {
    std::lock_guard<std::mutex> lk(queue_->mu);
    held.swap(queue_->held);
  }
  for (auto &h : held) complete(h.second, stopped);
  // the sends and receives queued on the stream run (after an abort, or a
  // revoke, they fail at once), then the lane completes their Works
  // (a caller waiting on one may be running the stream's work: that ends first)
  // (a caller queuing one there now does so first: p2p_mu_; later ones find
  // the group stopped)
  {
    std::lock_guard<std::mutex> plk(p2p_mu_);
    if (p2p_stream_ != nullptr) {
      std::unique_lock<std::shared_mutex> lk(p2p_ref_->mu);
      weftStreamDestroy(p2p_stream_);
      p2p_ref_->stream = nullptr;
    }
    p2p_stream_ = nullptr;
    if (p2p_ && p2p_->on_thread()) p2p_.release()->detach();
    p2p_.reset();
  }
  {
    std::lock_guard<std::mutex> lk(comms_ref_->mu);
    comms_ref_->comm = comms_ref_->pcomm = nullptr;
  }
  // the counts of the sends that ran go to the store before the group ends
  // (after an abort they no longer matter)
  if (abort_comm && announcer_) announcer_->drop();
  announcer_.reset();
  bool aborted = false;
  {
    std::unique_lock<std::mutex> lk(comm_mu_);
    inflight_cv_.wait(lk, [this] { return inflight_ == 0 && revoking_ == 0; });
    comm_ = nullptr;
    pcomm_ = nullptr;
    aborted = aborted_;
  }
  for (weftComm_t c : {pcomm, comm}) {
    if (c != nullptr && aborted) {
      weftCommAbort(c);
    } else if (c != nullptr) {
      // wait() on CUDA does not block the host: a failure of the last
      // operations is said here, where nothing else would say it
      weftResult_t async = weftSuccess;
      if (weftCommGetAsyncError(c, &async) == weftSuccess && async != weftSuccess &&
          async != weftInProgress)
        TORCH_WARN("weft: process group shut down after a failed operation on rank ", rank_,
                   " of ", size_, ": ", weftGetErrorString(async), ": ", weftGetLastError(c));
      weftCommFinalize(c);
      weftCommDestroy(c);
    }
  }
  // failed operations' tensors the watchdog kept: destroy and abort have
  // waited for the communicators' kernels
  {
    std::lock_guard<std::mutex> lk(watch_mu_);
    draining_.clear();
  }
  std::lock_guard<std::mutex> lk(comm_mu_);
  stopped_ = true;
  inflight_cv_.notify_all();
}

// The process group of a "weft" group: torch names the group's backend after
// its type, "custom" for every backend registered through
// Backend.register_backend, where DDP's logging data (backend_name) and
// ProcessGroup.name() should say "weft". Otherwise torch's ProcessGroup.
class WeftProcessGroup : public c10d::ProcessGroup {
 public:
  using c10d::ProcessGroup::ProcessGroup;
  const std::string getBackendName() const override { return "weft"; }
};

static c10::intrusive_ptr<c10d::Backend> create_backend(
    const c10::intrusive_ptr<c10d::Store> &store, int rank, int size, double timeout_s,
    const std::string &name, int channels, int high_priority_stream,
    const std::string &group_name,
    const std::string &group_desc, std::vector<int64_t> global_ranks) {
  auto ms = std::chrono::milliseconds((long long)(timeout_s * 1000.0));
  auto b = c10::make_intrusive<WeftBackend>(store, rank, size, ms, name, channels);
  if (high_priority_stream >= 0) {
    stream_options o = b->stream_opts();
    o.high_priority = high_priority_stream != 0;
    b->set_stream_options(o);
  }
  b->flight_join(group_name.empty() ? name : group_name, group_desc, std::move(global_ranks));
  return b;
}

}  // namespace torch_weft

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  py::module_::import("torch.distributed");
  py::class_<torch_weft::WeftBackend, c10d::Backend, c10::intrusive_ptr<torch_weft::WeftBackend>>(
      m, "WeftBackend")
      // torch calls this on the ranks left out of new_group(ranks) when the
      // default group has a bound device (init_process_group(device_id=...)),
      // as NCCL splits its communicator there; the members of a weft group
      // rendezvous through the store, so the others have nothing to do
      .def(
          "perform_nocolor_split", [](torch_weft::WeftBackend &, const at::Device &) {},
          py::arg("device"),
          "Nothing: a weft group is made by its members alone (new_group on a bound device).");
  py::class_<torch_weft::WeftProcessGroup, c10d::ProcessGroup,
             c10::intrusive_ptr<torch_weft::WeftProcessGroup>>(m, "WeftProcessGroup")
      .def(py::init([](const c10::intrusive_ptr<c10d::Store> &store, int rank, int size) {
             return c10::make_intrusive<torch_weft::WeftProcessGroup>(store, rank, size);
           }),
           py::arg("store"), py::arg("rank"), py::arg("size"),
           "A process group whose backend is named \"weft\" (DDP's logging data).");
  m.def("create_backend", &torch_weft::create_backend, py::arg("store"), py::arg("rank"),
        py::arg("size"), py::arg("timeout_s"), py::arg("name") = "", py::arg("channels") = 0,
        py::arg("high_priority_stream") = -1, py::arg("group_name") = "", py::arg("group_desc") = "",
        py::arg("global_ranks") = std::vector<int64_t>(),
        py::call_guard<py::gil_scoped_release>(),
        "Joins this rank to a weft communicator whose unique id travels through store; "
        "group_name, group_desc and global_ranks are what the flight recorder says of it.");
  m.def(
      "flight_recorder_dump",
      [](const std::string &prefix) { return torch_weft::flight_recorder::get().dump(prefix); },
      py::arg("prefix") = "", py::call_guard<py::gil_scoped_release>(),
      "Writes the flight recorder's dump to prefix (else TORCH_FR_DUMP_TEMP_FILE's) plus the "
      "global rank; the path written.");
  m.def(
      "flight_recorder_pickled",
      []() {
        std::string bytes;
        {
          py::gil_scoped_release nogil;
          bytes = torch_weft::flight_recorder::get().pickled();
        }
        return py::bytes(bytes);
      },
      "The flight recorder's dump, pickled.");
  m.def(
      "flight_recorder_prefix", []() { return torch_weft::flight_recorder::get().prefix(); },
      "The prefix of the flight recorder's dump files.");
  m.def(
      "flight_recorder_capacity",
      []() { return torch_weft::flight_recorder::get().capacity(); },
      "How many entries the flight recorder keeps (0: off).");
  m.def("install_allocator", &torch_weft::alloc_install, py::arg("min_bytes"),
        py::arg("cache_bytes"),
        "Makes CPU tensors of min_bytes and more weft's shareable memory (once).");
  m.def("allocator_stats", []() {
    const torch_weft::AllocStats s = torch_weft::alloc_stats();
    py::dict d;
    d["installed"] = s.installed;
    d["min_bytes"] = s.min_bytes;
    d["cache_bytes"] = s.cache_bytes;
    d["live_blocks"] = s.live_blocks;
    d["live_bytes"] = s.live_bytes;
    d["cached_blocks"] = s.cached_blocks;
    d["cached_bytes"] = s.cached_bytes;
    d["reused"] = s.reused;
    d["fresh"] = s.fresh;
    d["declined"] = s.declined;
    return d;
  });
  m.def(
      "allocator_owns",
      [](const at::Tensor &t) {
        return torch_weft::alloc_owns(t.data_ptr(), t.numel() * t.element_size());
      },
      "Whether the tensor's bytes lie in one block of weft's CPU allocator.");
  m.def("allocator_empty_cache", &torch_weft::alloc_empty_cache);
  // the recording fake of the CUDA layer (weft_streams.h), for the test of
  // the stream logic on the host: while on, host tensors count as on device 0
  m.def("_gpu_fake", &torch_weft::gpu_fake_enable, py::arg("on"),
        "Turns the recording fake CUDA layer on or off (a test mode).");
  m.def("_gpu_fake_log", &torch_weft::gpu_fake_log, "The fake's log since the last call.");
  m.def("_gpu_fake_set_stream", &torch_weft::gpu_fake_set_stream, py::arg("name"),
        "Makes the fake's stream name (made if new; \"default\") this thread's current one.");
  m.def("_gpu_fake_stall", &torch_weft::gpu_fake_stall, py::arg("name"), py::arg("stalled"),
        py::arg("release_after_ms") = 0,
        "Holds the events recorded on the fake's stream name pending (released after "
        "release_after_ms when given), or releases them.",
        py::call_guard<py::gil_scoped_release>());
  m.def("_gpu_fake_capture_begin", &torch_weft::gpu_fake_capture_begin,
        py::arg("mode") = "global",
        "Begins a capture on this thread's current fake stream, in a CUDA capture mode "
        "(global, as torch.cuda.graph's default; thread_local; relaxed).");
  m.def("_gpu_fake_capture_end", &torch_weft::gpu_fake_capture_end,
        "Ends the capture: \"\" or the streams not joined back; raises where it was "
        "invalidated.");
  m.def("cuda_built", &torch_weft::cuda_built,
        "Whether this build runs operations on CUDA tensors.");
  m.def("weft_version", []() {
    int v = 0;
    weftGetVersion(&v);
    return v;
  });
}
