// torch_weft: the c10d::Backend over weft (weft_backend.cpp: creation, the
// queue and the worker; weft_collectives.cpp: the operations).
#pragma once

#include <ATen/ATen.h>
#include <torch/csrc/distributed/c10d/Backend.hpp>
#include <torch/csrc/distributed/c10d/Store.hpp>
#include <torch/csrc/distributed/c10d/Work.hpp>

#include <weft.h>

#include "weft_flight.h"
#include "weft_types.h"
#include "weft_work.h"

#include <chrono>
#include <atomic>
#include <condition_variable>
#include <deque>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

namespace torch_weft {

// What an operation reads of a caller's tensor, or of a list of them taken
// one after another as one flat tensor: the tensor itself (a list already so
// in one storage: a view of it), or a contiguous copy (a concatenation) made
// when the operation runs (get() in a step's issue), not when it is queued,
// since an operation queued before may still write the tensors. Copies of a
// run_input share what it made, which lives as long as the step.
struct run_input {
  explicit run_input(at::Tensor t) : src(std::move(t)) {}
  // A list; writes, which the operation writes, may be the list's block own
  // (weft's in place), but anywhere else in its storage it makes a copy.
  run_input(const std::vector<at::Tensor> &list, const at::Tensor &writes, int own);

  at::Tensor src;                /* the tensor, or the list's view; undefined for a list */
  std::vector<at::Tensor> list;  /* a list not lying in one piece, concatenated by get() */
  std::shared_ptr<at::Tensor> made = std::make_shared<at::Tensor>();

  // The input as the operation reads it: contiguous, and flat for a list.
  const at::Tensor &get() const;
  // Writes the input into dst (contiguous, as many elements) in one copy.
  void copy_to(const at::Tensor &dst) const;
  bool defined() const { return src.defined() || !list.empty(); }
  // One tensor of the input, for its dtype and device.
  const at::Tensor &like() const { return list.empty() ? src : list[0]; }
  int64_t numel() const;
};

// Counts of sends on host memory per destination, added to the group's
// store under p2p_announcer::key(dst, src) by a thread of its own, so that
// the sender never waits for the store; for receives from any source.
struct p2p_announcer {
  p2p_announcer(c10::intrusive_ptr<c10d::Store> store, int rank);
  // Adds what is pending, then stops.
  ~p2p_announcer();
  void add(int dst);
  // Forgets what is pending.
  void drop() {
    std::lock_guard<std::mutex> lk(mu_);
    pending_.clear();
  }
  static std::string key(int dst, int src);

 private:
  void loop();
  c10::intrusive_ptr<c10d::Store> store_;
  int rank_;
  std::mutex mu_;
  std::condition_variable cv_;
  std::map<int, int64_t> pending_;
  bool stop_ = false;
  std::thread thread_;
};

class WeftBackend : public c10d::Backend {
 public:
  // channels: the communicator's channels (weftConfig_t's minChannels and
  // maxChannels), or 0 for weft's choice.
  WeftBackend(const c10::intrusive_ptr<c10d::Store> &store, int rank, int size,
              std::chrono::milliseconds timeout, const std::string &name, int channels = 0);

  // A backend over a communicator that split() made; it owns comm. store
  // is the new group's (monitored barriers, receives from any source).
  WeftBackend(weftComm_t comm, int rank, int size, std::chrono::milliseconds timeout,
              const std::string &name, c10::intrusive_ptr<c10d::Store> store);

  ~WeftBackend() override { shutdown(); }

  const std::string getBackendName() const override { return "weft"; }
  c10::intrusive_ptr<Options> getBackendOptions() override {
    return c10::make_intrusive<Options>("weft", timeout());
  }
  bool supportsCoalescing() const override { return true; }
  bool supportsSplitting() const override { return true; }

  // A group of some of this group's ranks, as ncclCommSplit makes one: every
  // rank of this group calls it (split_group), in the order of its other
  // operations; a rank outside `ranks` takes part and gets nullptr. The
  // communicator comes from weftCommSplit over this one: no store traffic,
  // no new rendezvous. The color is the group's smallest rank, which no
  // other group of the same split has; the new rank is the position in
  // `ranks`, as torch numbers the new group.
  c10::intrusive_ptr<c10d::Backend> split(const c10::intrusive_ptr<c10d::Store> &,
                                          const std::vector<int> &ranks,
                                          const c10::intrusive_ptr<Options> &opts) override;

  // the collectives' count, as NCCL's (seqCollective_): TORCH_DISTRIBUTED_DEBUG=DETAIL
  // compares it before each collective, and sends and receives between some
  // ranks must not make the group's ranks differ
  uint64_t getSequenceNumberForGroup() override { return coll_seq_.load(); }
  // The group's timeout for what starts after the call: weft's waits
  // (weftCommSetTimeout) and the deadlines of later operations.
  void setTimeout(std::chrono::milliseconds timeout) override;
  // Every operation is timed (Work.get_duration()); nothing to turn on.
  void enableCollectivesTiming() override {}

  // shrink_group: the remaining ranks (every one but ranks_to_exclude, which
  // may be dead, calls it) make a communicator with weftCommShrink, which
  // waits on no excluded rank. SHRINK_ABORT (flag 1) first revokes this
  // group's communicator, so that what waits in it ends now; otherwise the
  // shrink runs after the operations issued before it.
  bool supportsShrinking() const override { return true; }
  c10::intrusive_ptr<c10d::Backend> shrink(const std::vector<int64_t> &ranks_to_exclude,
                                           int shrink_flags,
                                           const c10::intrusive_ptr<Options> &opts) override;

  // dist._time_estimator(): the operations issued in between are recorded
  // and not run (as a coalescing block's), then weftGroupSimulateEnd gives
  // the tuner's estimate of their time, in microseconds.
  // A torch whose Backend does not declare them (2.11 has none;
  // TORCH_WEFT_TIME_ESTIMATE comes from torch_config.py's reading of its
  // Backend.hpp) gets no estimates: its Backend's own answer stands.
#ifdef TORCH_WEFT_TIME_ESTIMATE
  bool supportsTimeEstimation() const override { return true; }
  void startTimeEstimate() override;
  float endTimeEstimate() override;
#else
  void startTimeEstimate();
  float endTimeEstimate();
#endif

  // The group in the flight recorder (weft_flight.h): torch's name of the
  // group, its description and its members' global ranks (empty: the group
  // is the world, ranks 0 to size-1). Until then its operations are not
  // recorded.
  void flight_join(const std::string &name, const std::string &desc,
                   std::vector<int64_t> global_ranks);

  // --- collectives ---

  c10::intrusive_ptr<c10d::Work> broadcast(std::vector<at::Tensor> &tensors,
                                           const c10d::BroadcastOptions &opts) override;

  c10::intrusive_ptr<c10d::Work> allreduce(std::vector<at::Tensor> &tensors,
                                           const c10d::AllreduceOptions &opts) override;

  c10::intrusive_ptr<c10d::Work> allreduce_coalesced(
      std::vector<at::Tensor> &tensors, const c10d::AllreduceCoalescedOptions &opts) override;

  c10::intrusive_ptr<c10d::Work> reduce(std::vector<at::Tensor> &tensors,
                                        const c10d::ReduceOptions &opts) override;

  c10::intrusive_ptr<c10d::Work> allgather(std::vector<std::vector<at::Tensor>> &outputs,
                                           std::vector<at::Tensor> &inputs,
                                           const c10d::AllgatherOptions &opts) override;

  c10::intrusive_ptr<c10d::Work> allgather_coalesced(
      std::vector<std::vector<at::Tensor>> &outputs, std::vector<at::Tensor> &inputs,
      const c10d::AllgatherOptions &opts) override;

  c10::intrusive_ptr<c10d::Work> _allgather_base(at::Tensor &output, at::Tensor &input,
                                                 const c10d::AllgatherOptions &opts) override;

  c10::intrusive_ptr<c10d::Work> allgather_into_tensor_coalesced(
      std::vector<at::Tensor> &outputs, std::vector<at::Tensor> &inputs,
      const c10d::AllgatherOptions &opts) override;

  c10::intrusive_ptr<c10d::Work> reduce_scatter(std::vector<at::Tensor> &outputs,
                                                std::vector<std::vector<at::Tensor>> &inputs,
                                                const c10d::ReduceScatterOptions &opts) override;

  c10::intrusive_ptr<c10d::Work> _reduce_scatter_base(
      at::Tensor &output, at::Tensor &input, const c10d::ReduceScatterOptions &opts) override;

  c10::intrusive_ptr<c10d::Work> reduce_scatter_tensor_coalesced(
      std::vector<at::Tensor> &outputs, std::vector<at::Tensor> &inputs,
      const c10d::ReduceScatterOptions &opts) override;

  c10::intrusive_ptr<c10d::Work> alltoall_base(at::Tensor &output, at::Tensor &input,
                                               std::vector<int64_t> &output_splits,
                                               std::vector<int64_t> &input_splits,
                                               const c10d::AllToAllOptions &opts) override;

  c10::intrusive_ptr<c10d::Work> alltoall(std::vector<at::Tensor> &outputs,
                                          std::vector<at::Tensor> &inputs,
                                          const c10d::AllToAllOptions &opts) override;

  c10::intrusive_ptr<c10d::Work> gather(std::vector<std::vector<at::Tensor>> &outputs,
                                        std::vector<at::Tensor> &inputs,
                                        const c10d::GatherOptions &opts) override;

  c10::intrusive_ptr<c10d::Work> scatter(std::vector<at::Tensor> &outputs,
                                         std::vector<std::vector<at::Tensor>> &inputs,
                                         const c10d::ScatterOptions &opts) override;

  c10::intrusive_ptr<c10d::Work> send(std::vector<at::Tensor> &tensors, int dst,
                                      int) override;

  c10::intrusive_ptr<c10d::Work> recv(std::vector<at::Tensor> &tensors, int src,
                                      int) override;

  // A receive from whichever rank has sent to this one and not yet been
  // received from (Gloo's recvAnysource), on host memory. weft's receives
  // name their peer, so every send on host memory is also counted in the
  // group's store, off the sending thread (p2p_announcer); the receiver
  // reads the counts and receives from a rank whose count exceeds what it
  // has received from it. Waits up to the group's timeout for a sender.
  c10::intrusive_ptr<c10d::Work> recvAnysource(std::vector<at::Tensor> &tensors,
                                               int tag) override;

  c10::intrusive_ptr<c10d::Work> barrier(const c10d::BarrierOptions &opts) override;

  // Gloo's monitored barrier, through the group's store (not weft, so that
  // a rank stuck in an operation of the group is still reported): ranks
  // other than 0 check in and wait for rank 0's answer; rank 0 waits for
  // each in rank order within the timeout and names the first that did not
  // arrive (every one with wait_all_ranks), then answers them all.
  void monitoredBarrier(const c10d::BarrierOptions &opts, bool wait_all_ranks) override;

  // --- coalescing: everything issued in between runs as one weft group ---

  void startCoalescing() override;

  c10::intrusive_ptr<c10d::Work> endCoalescing() override;

  // The first failure the watchdog saw: TIMEOUT, COMM_ERROR (this rank's
  // operation failed) or REMOTE_ERROR (a peer died or gave up), else SUCCESS.
  c10d::ErrorType getError() override { return (c10d::ErrorType)error_type_.load(); }

  // The group's stream settings (weft_streams.h): read from the
  // environment when it is made; pg_options' high_priority_stream and a
  // split or shrunk group's parent set them before the first operation.
  void set_stream_options(const stream_options &o) { streams_.set_options(o); }
  const stream_options &stream_opts() const { return streams_.options(); }

  // --- life cycle ---

  void shutdown() override { stop_worker(false); }

  void abort() override { stop_worker(true); }

 private:
  // --- argument checks ---

  // A defined, dense tensor on the CPU (or CUDA, where this build has it).
  void check_tensor(const at::Tensor &t, const char *opname) const;

  // The CUDA device of t, or -1 for host memory (and no tensor).
  static int device_of(const at::Tensor &t) {
    return t.defined() && t.device().is_cuda() ? (int)t.get_device() : -1;
  }

  // Every tensor of an operation lies where its first does.
  static void check_device(const at::Tensor &t, int device, const char *opname);

  at::Tensor single(std::vector<at::Tensor> &tensors, const char *opname) const;

  void check_root(int64_t root, const char *opname) const;

  void check_peer(int peer, const char *opname) const;

  // A list of one tensor per rank, each of like's dtype and device (and,
  // when even, of like's number of elements).
  void check_list(const std::vector<at::Tensor> &list, const at::Tensor &like,
                  const char *opname, bool even = true) const;

  // Whether every tensor of list has like's number of elements.
  static bool same_numel(const std::vector<at::Tensor> &list, const at::Tensor &like);

  void split_layout(const at::Tensor &t, const std::vector<int64_t> &splits,
                    const char *which, std::vector<int64_t> *off, std::vector<int64_t> *len);

  // --- steps ---

  // Runs call on a contiguous view of t: t itself, or a staging copy that
  // is copied back afterwards.
  op_step inplace_step(const at::Tensor &t, std::function<weftResult_t(const at::Tensor &)> call);

  op_step allreduce_step(const at::Tensor &t, const ReduceOp &rop, const char *opname);

  // A pre-multiplied sum (PREMUL_SUM): all-reduce (recvcount < 0) or
  // reduce-scatter of `in` into `t`, with weft's pre-multiply op.
  op_step premul_step(const at::Tensor &t, const red_plan &p, const char *opname,
                      int64_t recvcount, const run_input &in = run_input(at::Tensor()));
  // premul_step on a CUDA tensor t whose factor is a tensor on t's device:
  // weft's kernels read the factor there (weftScalarDevice); nothing waits
  // on the host (nor breaks a CUDA graph's capture).
  op_step premul_device_step(const at::Tensor &t, const at::Tensor &factor,
                             at::ScalarType scalar_type, const char *opname, int64_t recvcount,
                             const run_input &in);

  op_step allgather_list_step(const std::vector<at::Tensor> &outs, const at::Tensor &input);

  op_step allgather_base_step(at::Tensor &output, at::Tensor &input);

  op_step reduce_scatter_step(const at::Tensor &out, const run_input &in, const ReduceOp &rop);

  // A sparse COO all-reduce (SUM), as Gloo's: every rank's indices and
  // values are gathered, summed and coalesced into t.
  op_step sparse_allreduce_step(const at::Tensor &t);

  // Counts a send on host memory to dst in the store (p2p_announcer).
  void announce_send(int dst);

  // --- queueing ---

  c10::intrusive_ptr<WeftWork> make_work(c10d::OpType type, const char *title,
                                         std::vector<at::Tensor> outputs) {
    return c10::make_intrusive<WeftWork>(rank_, type, title, std::move(outputs), queue_);
  }

  // Queues an operation for the worker; a blocking one (async_op false)
  // runs on the calling thread instead, once everything queued before it
  // has run: the caller waits for it anyway, and a hand-off to the worker
  // would only add a thread switch to its latency.
  // An operation on CUDA tensors always runs on the caller's thread (its
  // kernels are enqueued on the group's communication stream, after the
  // caller's stream; the call does not wait for them), once the host work
  // queued before it has run. inputs are the
  // caller's tensors it reads (outputs: those it writes); the first of
  // inputs, else of outputs, says where the operation runs.
  c10::intrusive_ptr<c10d::Work> submit(const char *name, c10d::OpType type,
                                        std::vector<op_step> steps,
                                        std::vector<at::Tensor> outputs, bool async_op,
                                        std::vector<at::Tensor> inputs = {}, int peer = -1);

  // Runs t on this thread once the queue is idle, and completes its Works.
  void run_here(task &t);

  // Runs t, which this thread marked busy; then frees the queue for the
  // next task and completes t's Works (the worker: completes them, then
  // frees the queue). nested: t was issued by a callback of the worker's
  // task, which holds the queue.
  void run_busy(task &t, bool nested = false);

  // Completes t's Works: at once for host memory or a failure to enqueue,
  // when the GPU is past the operation for CUDA tensors.
  void complete(task &t, std::exception_ptr err);

  c10::intrusive_ptr<c10d::Work> submit_p2p(const char *name, c10d::OpType type, op_step step,
                                            std::vector<at::Tensor> outputs, int peer);

  // Records an operation that submit() issues in the flight recorder: its
  // entry's id, or -1 (the recorder is off, the group not in it, a time
  // estimate, a kind the analyzer has no name for). peer: a send's or
  // receive's (-1: any source). Inside a coalescing block the operations
  // share the block's sequence numbers. seq: the operation's number.
  // captured: recorded into a CUDA graph being captured, which runs it: it
  // takes its numbers, and no entry.
  int64_t flight_record(const char *name, int peer, uint64_t seq,
                        const std::vector<at::Tensor> &inputs,
                        const std::vector<at::Tensor> &outputs, bool captured);
  // An accepted operation's numbers: its sequence number in the group and
  // its flight recorder entry (-1: none).
  struct numbered {
    uint64_t seq = 0;
    int64_t flight_id = -1;
  };

  void enqueue(task t);

  // --- the watchdog ---

  // A thread per group that looks every 100 ms at the operations issued
  // and not yet done (not those captured into a CUDA graph), each with a
  // deadline of the group's timeout from its issue, and at weft's
  // asynchronous error (weftCommGetAsyncError); it asks about CUDA events in
  // the relaxed capture mode, which leaves another thread's capture valid. On
  // an operation past its deadline, one that failed, or a communicator
  // broken by a peer, it says which (group, rank, operation and sequence
  // number) and handles it as TORCH_WEFT_ASYNC_ERROR_HANDLING says (read at
  // the group's creation), as NCCL's watchdog does TORCH_NCCL_ASYNC_ERROR_HANDLING:
  //   3 (default): revoke the communicator (peers waiting on this rank fail
  //                now), then end the process;
  //   1: revoke and free the communicator (weftCommAbort, once no thread is
  //      in it, as abort() frees it), then end the process;
  //   2: revoke the communicator only: operations fail, the process goes on;
  //   0: nothing but the message, as a warning (and getError()).
  void watch(const c10::intrusive_ptr<WeftWork> &work, const char *name, uint64_t seq);
  void watchdog_loop();
  // One look: drops what is done (keeping the last failure, last_failed_),
  // and returns the first operation past its deadline (TIMEOUT) or the
  // communicator's error (REMOTE_ERROR, COMM_ERROR), with what to say in
  // what; SUCCESS when neither. Both the watchdog's thread and the dump
  // signal's call it.
  c10d::ErrorType watchdog_look(std::string &what);
  // watchdog_look, a throw (a sticky CUDA error) read as a broken group
  c10d::ErrorType watchdog_look_safe(std::string &what);
  std::string last_failed_; /* the last operation seen failing, and why (watch_mu_) */
  // Handles the first failure seen; false when the group is already stopping.
  void watchdog_fire(c10d::ErrorType type, const std::string &what);
  void watchdog_stop();
  // The flight recorder's dump signal, as NCCL's: a rank whose watchdog
  // fires sets kFlightSignal in the group's store (saying which rank and
  // what), and a thread of every member looks for it twice a second, so that
  // a rank in no operation of the group (asleep, or computing) dumps its
  // recorder too, and its watchdog handles the group's failure.
  void flight_signal_loop();
  std::thread flight_signal_;
  std::atomic<bool> fired_{false}; /* the watchdog fired (once) */

  // --- the worker ---

  void worker_loop();

  // Runs a task's steps, in one weft group when there are several; a task
  // on CUDA tensors on the group's communication stream of their device
  // (weft_streams.h), whose end event (t.end) and futures it records there
  // before returning, while the queue is still the task's; a failure once
  // the stream was entered records the end too and orders the caller's
  // stream after it.
  std::exception_ptr run(task &t);

  std::exception_ptr run_steps(task &t);

  // A send or receive on host memory (t.p2p): queued on the group's host
  // stream for them, its Works completed by p2p_ once it is done. Does not
  // wait for the peer.
  std::exception_ptr run_p2p(task &t);

  // Waits until the sends and receives queued on the host stream are done:
  // a task with a send or receive of its own comes after them. Holds p2p_mu_.
  void p2p_drain();
  // Issues t (t.p2p: sends and receives on host memory, a coalescing
  // block's too) on the host stream now, or holds it behind the last holder
  // queued before it (queue_state::held), which issues it once it has run.
  void issue_p2p(task t);
  // Before the backend revokes its communicator: the Works that the revoke
  // cuts short fail (queue_state::revoked).
  void mark_revoked();

  // Issues t's steps (in one weft group when there are several, which is
  // ended even when a step throws) and runs their releases.
  weftResult_t issue_steps(task &t);

  // Throws the DistBackendError for a failed weft call (on pcomm_ when p2p).
  [[noreturn]] void fail(const char *name, weftResult_t res, bool p2p = false);

  // The communicator's settings: the group's timeout and name.
  static weftConfig_t config_of(std::chrono::milliseconds timeout, const std::string &name,
                                int channels = 0);

  void check_init(weftResult_t res, const char *call);

  // Stops the worker: after the queued work (shutdown) or at once, breaking
  // the communicator so that a blocked operation returns (abort).
  void stop_worker(bool abort_comm);

  // the group's timeout: set_timeout changes it while the worker and the
  // watchdog read it
  std::atomic<std::chrono::milliseconds> timeout_;
  std::chrono::milliseconds timeout() const { return timeout_.load(std::memory_order_relaxed); }
  std::string name_;
  c10::intrusive_ptr<c10d::Store> store_; /* the group's: monitored barrier, any-source */
  uint64_t monitored_seq_ = 0;
  std::vector<int64_t> received_;  /* host receives issued per source rank */
  std::unique_ptr<p2p_announcer> announcer_; /* made at the first host send */
  /* sends and receives on host memory: a weft host stream, made at the
   * first, its lane, and whether it has work not yet drained (p2p_mu_) */
  weftStream_t p2p_stream_ = nullptr;
  std::unique_ptr<p2p_lane> p2p_;
  std::shared_ptr<const p2p_op::error_fn> p2p_error_; /* the ops' failure, once done */
  std::shared_ptr<p2p_stream_ref> p2p_ref_ = std::make_shared<p2p_stream_ref>();
  bool p2p_queued_ = false;
  /* the communicators the watchdog and the lane ask for their errors;
   * NULL once freed */
  struct comms_ref {
    std::mutex mu;
    weftComm_t comm = nullptr, pcomm = nullptr;
  };
  std::shared_ptr<comms_ref> comms_ref_ = std::make_shared<comms_ref>();
  weftComm_t comm_ = nullptr;
  /* The sends' and receives' communicator on host memory: comm_ split in
   * two when the group is made, so that they go on while a collective
   * waits in comm_ and collectives while they do (as NCCL's run on
   * communicators of their own, and Gloo's in the background). Issued on
   * it by one thread at a time (p2p_mu_): the host stream's, a caller's
   * (submit_p2p) or the one running a task with such a step. */
  weftComm_t pcomm_ = nullptr;
  /* also guards p2p_stream_, p2p_, p2p_queued_. Taken after queue_->mu; a
   * holder (queue_state::p2p_tasks), running with it, may take queue_->mu,
   * since nothing takes it under queue_->mu while a holder is out */
  std::mutex p2p_mu_;
  void make_pcomm();
  std::shared_ptr<queue_state> queue_;
  /* the CUDA stream of the task this thread runs; NULL on host memory (per
   * thread: a send or receive is issued while the worker runs a collective) */
  static thread_local weftStream_t stream_;
  comm_streams streams_{stream_options::from_env()}; /* CUDA: one per device (weft_streams.h) */
  std::thread worker_;
  std::thread::id worker_id_; /* set once at construction: read by stop_worker on any thread */
  /* whether the calling thread is the worker (in a Work's callback, where
   * not running a task) */
  bool on_worker() const { return std::this_thread::get_id() == worker_id_; }
  std::mutex comm_mu_; /* guards aborted_, inflight_ and stop_worker's state */
  bool aborted_ = false;
  int inflight_ = 0; /* threads between their check of aborted_ and leaving weft */
  bool stopping_ = false; /* stop_worker's first caller has begun, */
  bool stopped_ = false;  /* and is done */
  int revoking_ = 0;      /* later aborts revoking the communicator meanwhile */
  std::condition_variable inflight_cv_; /* inflight_, revoking_, stopped_ */
  /* A thread in weft on this group's communicator, from the check of aborted_
   * (enter_weft, which throws once aborted) to the guard's end: abort() frees
   * the communicator only once no thread is there (stop_worker). */
  struct weft_inside {
    WeftBackend *b;
    ~weft_inside();
  };
  void enter_weft(const char *name);
  std::atomic<uint64_t> seq_{0};
  std::atomic<uint64_t> coll_seq_{0}; /* of them, the collectives (not sends and receives) */
  struct watched {
    c10::intrusive_ptr<WeftWork> work;
    uint64_t seq;
    const char *name; /* a literal */
    std::chrono::steady_clock::time_point deadline;
    std::chrono::milliseconds timeout; /* the group's at issue, which set the deadline */
  };
  std::mutex watch_mu_;
  std::condition_variable watch_cv_;
  std::deque<watched> watched_;
  /* failed operations on a CUDA stream whose Works keep the caller's
   * tensors (stash): kept until the GPU is past them, or the communicators
   * are freed (stop_worker), which waits for their kernels */
  std::deque<c10::intrusive_ptr<WeftWork>> draining_;
  bool watch_stop_ = false;
  std::thread watchdog_;
  std::mutex watch_join_mu_; /* one stop joins it */
  int handling_ = 3;
  std::atomic<int> error_type_{0};
  /* The thread whose coalescing block is open (none: no block). A block
   * gathers that thread's operations alone: a Work's callback on the worker
   * issues its own at once, not into a block the main thread holds open
   * (whose operations run only at its end). One block at a time per group. */
  std::atomic<std::thread::id> block_owner_{};
  bool in_block() const { return block_owner_.load() == std::this_thread::get_id(); }
  /* the numbers an operation takes (seq_, the flight recorder's), for two
   * threads issuing at once (the main one and a callback on the worker) */
  std::mutex number_mu_;
  numbered number(const char *name, int peer, const std::vector<at::Tensor> &inputs,
                 const std::vector<at::Tensor> &outputs, bool captured);
  // Whether a CUDA graph captures the calling thread's current stream of
  // the stream logic's device sdev.
  static bool capture_open(int sdev);
  bool estimating_ = false; /* the open block is a time estimate's (its owner's) */
  uint64_t block_seq_ = 0;   /* the open block's last operation's number */
  int64_t block_coll_seq_ = 0, block_p2p_seq_ = 0; /* and its flight-recorder numbers */
  /* Whether this thread is issuing a time estimate's steps (endTimeEstimate),
   * which weftGroupSimulateEnd drops: a send there is not announced to a
   * receive from any source, a receive not counted. Per thread: the worker
   * may issue real steps meanwhile. */
  static bool &simulating() {
    static thread_local bool on = false;
    return on;
  }
  int channels_ = 0;
  int shrinks_ = 0; /* groups shrunk from this one: their store prefixes */
  task coalesced_{"coalesced", {}, {}};
  std::shared_ptr<flight_group> flight_; /* null: not recorded */
  bool block_coll_ = false, block_p2p_ = false; /* the open block's kinds, recorded */
  c10::intrusive_ptr<WeftWork> coalesced_work_;
};

}  // namespace torch_weft
