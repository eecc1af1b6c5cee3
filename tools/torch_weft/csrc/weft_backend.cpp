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
// Sends and receives issued outside a coalescing block are held until
// something needs them: a wait or completion query on one of them, a
// collective issued after them, or the end of the backend. They then run as
// one weft group, so that isend/irecv pairs that cross between two ranks
// cannot deadlock on the single worker thread.
//
// Failures: weft reports a dead or silent peer (naming its rank) within the
// communicator's timeout, which is the process group's timeout; the Work
// then raises torch.distributed.DistBackendError with weft's text.

#include <ATen/ATen.h>
#include <torch/csrc/utils/pybind.h>
#include <torch/csrc/distributed/c10d/Backend.hpp>
#include <torch/csrc/distributed/c10d/Store.hpp>
#include <torch/csrc/distributed/c10d/Work.hpp>

#include <weft.h>

#include "weft_alloc.h"
#include "weft_cuda.h"

#include <sys/resource.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <condition_variable>
#include <cstring>
#include <deque>
#include <functional>
#include <mutex>
#include <thread>

namespace torch_weft {

using c10d::ReduceOp;

// --- Datatypes and reduction ops -------------------------------------------

// The weft datatype of a tensor for arithmetic, or false when weft has none.
static bool weft_dtype_of(at::ScalarType t, weftDataType_t *out) {
  switch (t) {
    case at::kChar: *out = weftInt8; return true;
    case at::kByte: *out = weftUint8; return true;
    case at::kBool: *out = weftUint8; return true;
    case at::kInt: *out = weftInt32; return true;
    case at::kUInt32: *out = weftUint32; return true;
    case at::kLong: *out = weftInt64; return true;
    case at::kUInt64: *out = weftUint64; return true;
    case at::kHalf: *out = weftFloat16; return true;
    case at::kFloat: *out = weftFloat32; return true;
    case at::kDouble: *out = weftFloat64; return true;
    case at::kBFloat16: *out = weftBfloat16; return true;
    case at::kFloat8_e4m3fn: *out = weftFloat8e4m3; return true;
    case at::kFloat8_e5m2: *out = weftFloat8e5m2; return true;
    default: return false;
  }
}

static bool is_integral(at::ScalarType t) {
  return at::isIntegralType(t, /*includeBool=*/true);
}

// A buffer as weft sees it: pointer, element count and datatype. Operations
// that only move data (broadcast, gathers, all-to-all, send/recv) move any
// dtype as bytes; reductions need the tensor's own arithmetic.
struct flat_buf {
  void *ptr;
  size_t count;
  weftDataType_t dtype;
};

static flat_buf bytes_of(const at::Tensor &t) {
  return {t.data_ptr(), (size_t)t.nbytes(), weftUint8};
}

static flat_buf elems_of(const at::Tensor &t, const char *opname) {
  weftDataType_t dt;
  if (t.is_complex()) {
    // complex sums are sums of the real and imaginary parts
    at::Tensor r = at::view_as_real(t);
    TORCH_CHECK(weft_dtype_of(r.scalar_type(), &dt), "weft: ", opname, ": dtype ",
                t.scalar_type(), " has no weft equivalent");
    return {t.data_ptr(), (size_t)r.numel(), dt};
  }
  TORCH_CHECK(weft_dtype_of(t.scalar_type(), &dt), "weft: ", opname, ": dtype ",
              t.scalar_type(), " is not supported for reductions (weft has int8, uint8, ",
              "int32, uint32, int64, uint64, float16, bfloat16, float32, float64, ",
              "float8_e4m3fn, float8_e5m2)");
  return {t.data_ptr(), (size_t)t.numel(), dt};
}

// How a ReduceOp runs on weft: a native op, a pre-multiplied sum, or an
// all-gather followed by a local bitwise reduction (weft has no bitwise ops).
struct red_plan {
  enum { native, premul, bitwise } kind = native;
  weftRedOp_t op = weftSum;
  ReduceOp::RedOpType bit_op = ReduceOp::BAND;
  double factor = 1.0;
  at::Tensor tensor_factor;
};

static red_plan red_plan_of(const ReduceOp &rop, at::ScalarType t, const char *opname) {
  red_plan p;
  const bool complex = at::isComplexType(t);
  switch (rop.op_) {
    case ReduceOp::SUM: p.op = weftSum; break;
    case ReduceOp::AVG: p.op = weftAvg; break;
    case ReduceOp::PRODUCT: p.op = weftProd; break;
    case ReduceOp::MIN: p.op = weftMin; break;
    case ReduceOp::MAX: p.op = weftMax; break;
    case ReduceOp::PREMUL_SUM: {
      p.kind = red_plan::premul;
      auto *sup = dynamic_cast<c10d::PreMulSumSupplement *>(rop.supplement_.get());
      TORCH_CHECK(sup != nullptr, "weft: ", opname, ": PREMUL_SUM without its factor");
      if (sup->tensor_factor.defined())
        p.tensor_factor = sup->tensor_factor;
      else
        p.factor = sup->double_factor;
      break;
    }
    case ReduceOp::BAND:
    case ReduceOp::BOR:
    case ReduceOp::BXOR:
      TORCH_CHECK(is_integral(t), "weft: ", opname, ": bitwise reductions need an integer ",
                  "or bool tensor, got ", t);
      p.kind = red_plan::bitwise;
      p.bit_op = rop.op_;
      break;
    default:
      TORCH_CHECK(false, "weft: ", opname, ": unknown reduce op ", (int)rop.op_);
  }
  if (complex)
    TORCH_CHECK(p.kind != red_plan::bitwise &&
                    (p.op == weftSum || p.op == weftAvg || p.kind == red_plan::premul),
                "weft: ", opname, ": complex tensors support SUM, AVG and PREMUL_SUM only");
  if (t == at::kBool)
    TORCH_CHECK(p.kind == red_plan::bitwise || p.op == weftMin || p.op == weftMax, "weft: ",
                opname, ": bool tensors support MIN, MAX, BAND, BOR and BXOR only");
  return p;
}

// --- Work ----------------------------------------------------------------

class WeftBackend;
struct queue_state;

class WeftWork : public c10d::Work {
 public:
  WeftWork(int rank, c10d::OpType type, const char *title, std::vector<at::Tensor> outputs,
           std::shared_ptr<queue_state> q, bool held)
      : Work(rank, type, title),
        outputs_(std::move(outputs)),
        future_(c10::make_intrusive<c10::ivalue::Future>(
            c10::ListType::create(c10::TensorType::get()))),
        queue_(std::move(q)),
        held_(held) {}

  bool isCompleted() override;
  bool wait(std::chrono::milliseconds timeout = kNoTimeout) override;
  void synchronize() override {}
  c10::intrusive_ptr<c10::ivalue::Future> getFuture() override;
  std::vector<at::Tensor> result() override { return outputs_; }

  // Called by the worker once the operation has run (exception: its failure).
  void complete(std::exception_ptr exception) {
    finish(exception);
    if (exception)
      future_->setError(exception);
    else
      future_->markCompleted(c10::IValue(outputs_));
  }

  // Called once the operation is enqueued on a CUDA stream: the future is
  // complete for users on the GPU at once (they order themselves after the
  // operation); the Work completes when the GPU passes mark, or fails when
  // async_error reports the communicator's failure, or after timeout.
  void complete_on_gpu(std::shared_ptr<GpuMark> mark, c10::intrusive_ptr<c10::ivalue::Future> fut,
                       std::function<std::exception_ptr()> async_error,
                       std::chrono::milliseconds timeout) {
    future_ = std::move(fut);
    async_error_ = std::move(async_error);
    gpu_timeout_ = timeout;
    gpu_ = std::move(mark);
  }

 private:
  void release_held();
  bool poll_gpu();
  void finish_once(std::exception_ptr exception) {
    if (!finished_.exchange(true)) finish(exception);
  }
  std::vector<at::Tensor> outputs_;
  c10::intrusive_ptr<c10::ivalue::Future> future_;
  std::shared_ptr<queue_state> queue_;
  bool held_; /* a send/recv that may still wait in the held list */
  std::shared_ptr<GpuMark> gpu_; /* set for an operation on a CUDA stream */
  std::function<std::exception_ptr()> async_error_;
  std::chrono::milliseconds gpu_timeout_{0};
  std::atomic<bool> finished_{false};
};

// One weft call (or several that belong together), split in two: issue runs
// inside the weft group when the operation is coalesced with others, finish
// runs after the group (copies out of staging buffers, local reductions).
struct op_step {
  std::function<weftResult_t()> issue;
  std::function<void()> finish;
};

struct task {
  const char *name;
  std::vector<op_step> steps;
  std::vector<c10::intrusive_ptr<WeftWork>> works;
  int device = -1;         /* CUDA device of its tensors; -1: host memory */
  void *stream = nullptr;  /* the CUDA stream it ran on */
};

// The queue between callers and the worker thread, shared with the Work
// objects of held sends and receives so that waiting on one can release them.
struct queue_state {
  std::mutex mu;
  std::condition_variable cv;
  std::deque<task> tasks;
  task held{"send/recv", {}, {}}; /* sends and receives not yet released */
  bool stop = false;
  bool busy = false; /* a task is running, on the worker or on a caller's thread */
  /* for GPU Works asking for the communicator's asynchronous error: NULL once
   * the group shuts down or aborts */
  weftComm_t comm = nullptr;
  bool aborted = false;

  void push(task t) {
    std::lock_guard<std::mutex> lk(mu);
    release_held_locked();
    tasks.push_back(std::move(t));
    cv.notify_all();
  }
  void release_held() {
    std::lock_guard<std::mutex> lk(mu);
    release_held_locked();
    cv.notify_all();
  }
  void release_held_locked() {
    if (held.steps.empty()) return;
    tasks.push_back(std::move(held));
    held = task{"send/recv", {}, {}};
  }
};

void WeftWork::release_held() {
  if (held_) queue_->release_held();
}

// For an operation on a CUDA stream: whether it is done (or failed), and
// the Work finished if so.
bool WeftWork::poll_gpu() {
  if (Work::isCompleted()) return true;
  if (gpu_->done()) {
    finish_once(nullptr);
    return true;
  }
  if (std::exception_ptr e = async_error_()) {
    finish_once(e);
    return true;
  }
  return false;
}

bool WeftWork::isCompleted() {
  release_held();
  if (gpu_) poll_gpu();
  return Work::isCompleted();
}

// On a CUDA stream, waits on the host until the GPU is past the operation
// (so that a failure raises here) and orders the caller's current stream
// after it.
bool WeftWork::wait(std::chrono::milliseconds timeout) {
  release_held();
  if (gpu_) {
    const auto limit = timeout == kNoTimeout ? gpu_timeout_ : timeout;
    const auto start = std::chrono::steady_clock::now();
    while (!poll_gpu()) {
      if (limit.count() > 0 && std::chrono::steady_clock::now() - start > limit) {
        try {
          C10_THROW_ERROR(DistBackendError,
                          c10::str("weft: ", opTypeToString(opType_), " on rank ", rank_,
                                   ": the GPU has not finished it after ", limit.count(), " ms"));
        } catch (...) {
          finish_once(std::current_exception());
        }
        break;
      }
      std::this_thread::sleep_for(std::chrono::microseconds(50));
    }
    if (exception() == nullptr) gpu_->stream_wait();
  }
  return Work::wait(timeout);
}

c10::intrusive_ptr<c10::ivalue::Future> WeftWork::getFuture() {
  release_held();
  return future_;
}

// --- The backend ----------------------------------------------------------

class WeftBackend : public c10d::Backend {
 public:
  WeftBackend(const c10::intrusive_ptr<c10d::Store> &store, int rank, int size,
              std::chrono::milliseconds timeout, const std::string &name)
      : Backend(rank, size), timeout_(timeout), queue_(std::make_shared<queue_state>()) {
    // the unique id travels through the store: rank 0 makes it, others read it
    weftUniqueId id;
    const std::string key = "weft_unique_id";
    if (rank == 0) {
      check_init(weftGetUniqueId(&id), "weftGetUniqueId");
      std::vector<uint8_t> bytes((uint8_t *)id.internal,
                                 (uint8_t *)id.internal + sizeof id.internal);
      store->set(key, bytes);
    } else {
      std::vector<uint8_t> bytes = store->get(key);
      TORCH_CHECK(bytes.size() == sizeof id.internal, "weft: the store holds a unique id of ",
                  bytes.size(), " bytes, expected ", sizeof id.internal);
      memcpy(id.internal, bytes.data(), sizeof id.internal);
    }
    name_ = name.empty() ? std::string("torch") : name;
    weftConfig_t config = config_of(timeout, name_);
    check_init(weftCommInitRankConfig(&comm_, size, id, rank, &config), "weftCommInitRank");
    queue_->comm = comm_;
    worker_ = std::thread([this] { worker_loop(); });
  }

  // A backend over a communicator that split() made; it owns comm.
  WeftBackend(weftComm_t comm, int rank, int size, std::chrono::milliseconds timeout,
              const std::string &name)
      : Backend(rank, size), timeout_(timeout), name_(name), comm_(comm),
        queue_(std::make_shared<queue_state>()) {
    queue_->comm = comm_;
    worker_ = std::thread([this] { worker_loop(); });
  }

  ~WeftBackend() override { shutdown(); }

  const std::string getBackendName() const override { return "weft"; }
  c10::intrusive_ptr<Options> getBackendOptions() override {
    return c10::make_intrusive<Options>("weft", timeout_);
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
                                          const c10::intrusive_ptr<Options> &opts) override {
    TORCH_CHECK(!coalescing_, "weft: split inside a coalescing block");
    TORCH_CHECK(!ranks.empty(), "weft: split: no ranks");
    for (int r : ranks)
      TORCH_CHECK(r >= 0 && r < size_, "weft: split: rank ", r, " is not a rank of this group of ",
                  size_);
    auto me = std::find(ranks.begin(), ranks.end(), rank_);
    const bool member = me != ranks.end();
    const int color = member ? *std::min_element(ranks.begin(), ranks.end()) : WEFT_SPLIT_NOCOLOR;
    const int key = member ? (int)(me - ranks.begin()) : 0;
    const std::chrono::milliseconds timeout = opts ? opts->timeout : timeout_;
    const std::string name = opts && !opts->group_name.empty() ? opts->group_name : name_;
    weftConfig_t config = config_of(timeout, name);
    weftComm_t child = nullptr;
    op_step s;
    s.issue = [&]() { return weftCommSplit(comm_, color, key, &child, &config); };
    std::vector<op_step> steps;
    steps.push_back(std::move(s));
    submit("split", c10d::OpType::UNKNOWN, std::move(steps), {}, false)->wait();
    if (!member) return nullptr;
    return c10::make_intrusive<WeftBackend>(child, key, (int)ranks.size(), timeout, name);
  }

  uint64_t getSequenceNumberForGroup() override { return seq_; }
  void setTimeout(std::chrono::milliseconds timeout) override {
    TORCH_WARN_ONCE("weft: the timeout of a process group is fixed when its communicator ",
                    "is created; keeping ", timeout_.count(), " ms");
  }

  // --- collectives ---

  c10::intrusive_ptr<c10d::Work> broadcast(std::vector<at::Tensor> &tensors,
                                           const c10d::BroadcastOptions &opts) override {
    at::Tensor t = single(tensors, "broadcast");
    check_root(opts.rootRank, "broadcast");
    int root = (int)opts.rootRank;
    op_step s = inplace_step(t, [this, root](const at::Tensor &buf) {
      flat_buf b = bytes_of(buf);
      return weftBroadcast(b.ptr, b.ptr, b.count, b.dtype, root, comm_, stream_);
    });
    return submit("broadcast", c10d::OpType::BROADCAST, {s}, {t}, opts.asyncOp);
  }

  c10::intrusive_ptr<c10d::Work> allreduce(std::vector<at::Tensor> &tensors,
                                           const c10d::AllreduceOptions &opts) override {
    at::Tensor t = single(tensors, "allreduce");
    return submit("allreduce", c10d::OpType::ALLREDUCE,
                  {allreduce_step(t, opts.reduceOp, "allreduce")}, {t}, opts.asyncOp);
  }

  c10::intrusive_ptr<c10d::Work> allreduce_coalesced(
      std::vector<at::Tensor> &tensors, const c10d::AllreduceCoalescedOptions &opts) override {
    std::vector<op_step> steps;
    for (auto &t : tensors) {
      check_cpu(t, "allreduce_coalesced");
      steps.push_back(allreduce_step(t, opts.reduceOp, "allreduce_coalesced"));
    }
    return submit("allreduce_coalesced", c10d::OpType::ALLREDUCE_COALESCED, std::move(steps),
                  tensors, opts.asyncOp);
  }

  c10::intrusive_ptr<c10d::Work> reduce(std::vector<at::Tensor> &tensors,
                                        const c10d::ReduceOptions &opts) override {
    at::Tensor t = single(tensors, "reduce");
    check_root(opts.rootRank, "reduce");
    red_plan p = red_plan_of(opts.reduceOp, t.scalar_type(), "reduce");
    int root = (int)opts.rootRank;
    op_step s;
    if (p.kind == red_plan::native) {
      s = inplace_step(t, [this, root, p](const at::Tensor &buf) {
        flat_buf b = elems_of(buf, "reduce");
        return weftReduce(b.ptr, b.ptr, b.count, b.dtype, p.op, root, comm_, stream_);
      });
    } else {
      // the root's result of the all-reduce is the reduction; others keep theirs
      at::Tensor work = t.clone(at::MemoryFormat::Contiguous);
      s = allreduce_step(work, opts.reduceOp, "reduce");
      auto fin = s.finish;
      bool is_root = rank_ == root;
      s.finish = [fin, t, work, is_root]() {
        if (fin) fin();
        if (is_root) t.copy_(work);
      };
    }
    return submit("reduce", c10d::OpType::REDUCE, {s}, {t}, opts.asyncOp);
  }

  c10::intrusive_ptr<c10d::Work> allgather(std::vector<std::vector<at::Tensor>> &outputs,
                                           std::vector<at::Tensor> &inputs,
                                           const c10d::AllgatherOptions &opts) override {
    at::Tensor in = single(inputs, "allgather");
    TORCH_CHECK(outputs.size() == 1, "weft: allgather takes one list of outputs");
    check_list(outputs[0], in, "allgather");
    return submit("allgather", c10d::OpType::ALLGATHER, {allgather_list_step(outputs[0], in)},
                  outputs[0], opts.asyncOp);
  }

  c10::intrusive_ptr<c10d::Work> allgather_coalesced(
      std::vector<std::vector<at::Tensor>> &outputs, std::vector<at::Tensor> &inputs,
      const c10d::AllgatherOptions &opts) override {
    TORCH_CHECK(outputs.size() == inputs.size(), "weft: allgather_coalesced: ", outputs.size(),
                " output lists for ", inputs.size(), " inputs");
    std::vector<op_step> steps;
    std::vector<at::Tensor> flat_outputs;
    for (size_t i = 0; i < inputs.size(); i++) {
      check_cpu(inputs[i], "allgather_coalesced");
      check_list(outputs[i], inputs[i], "allgather_coalesced");
      steps.push_back(allgather_list_step(outputs[i], inputs[i]));
      for (auto &o : outputs[i]) flat_outputs.push_back(o);
    }
    return submit("allgather_coalesced", c10d::OpType::ALLGATHER_COALESCED, std::move(steps),
                  flat_outputs, opts.asyncOp);
  }

  c10::intrusive_ptr<c10d::Work> _allgather_base(at::Tensor &output, at::Tensor &input,
                                                 const c10d::AllgatherOptions &opts) override {
    return submit("all_gather_into_tensor", c10d::OpType::_ALLGATHER_BASE,
                  {allgather_base_step(output, input)}, {output}, opts.asyncOp);
  }

  c10::intrusive_ptr<c10d::Work> allgather_into_tensor_coalesced(
      std::vector<at::Tensor> &outputs, std::vector<at::Tensor> &inputs,
      const c10d::AllgatherOptions &opts) override {
    TORCH_CHECK(outputs.size() == inputs.size(), "weft: allgather_into_tensor_coalesced: ",
                outputs.size(), " outputs for ", inputs.size(), " inputs");
    std::vector<op_step> steps;
    for (size_t i = 0; i < inputs.size(); i++)
      steps.push_back(allgather_base_step(outputs[i], inputs[i]));
    return submit("allgather_into_tensor_coalesced",
                  c10d::OpType::ALLGATHER_INTO_TENSOR_COALESCED, std::move(steps), outputs, opts.asyncOp);
  }

  c10::intrusive_ptr<c10d::Work> reduce_scatter(std::vector<at::Tensor> &outputs,
                                                std::vector<std::vector<at::Tensor>> &inputs,
                                                const c10d::ReduceScatterOptions &opts) override {
    at::Tensor out = single(outputs, "reduce_scatter");
    TORCH_CHECK(inputs.size() == 1, "weft: reduce_scatter takes one list of inputs");
    check_list(inputs[0], out, "reduce_scatter");
    std::vector<at::Tensor> flat;
    for (auto &t : inputs[0]) flat.push_back(t.reshape({-1}));
    at::Tensor in = at::cat(flat);
    return submit("reduce_scatter", c10d::OpType::REDUCE_SCATTER,
                  {reduce_scatter_step(out, in, opts.reduceOp)}, {out}, opts.asyncOp);
  }

  c10::intrusive_ptr<c10d::Work> _reduce_scatter_base(
      at::Tensor &output, at::Tensor &input, const c10d::ReduceScatterOptions &opts) override {
    check_cpu(output, "reduce_scatter_tensor");
    check_cpu(input, "reduce_scatter_tensor");
    return submit("reduce_scatter_tensor", c10d::OpType::_REDUCE_SCATTER_BASE,
                  {reduce_scatter_step(output, input, opts.reduceOp)}, {output}, opts.asyncOp);
  }

  c10::intrusive_ptr<c10d::Work> reduce_scatter_tensor_coalesced(
      std::vector<at::Tensor> &outputs, std::vector<at::Tensor> &inputs,
      const c10d::ReduceScatterOptions &opts) override {
    TORCH_CHECK(outputs.size() == inputs.size(), "weft: reduce_scatter_tensor_coalesced: ",
                outputs.size(), " outputs for ", inputs.size(), " inputs");
    std::vector<op_step> steps;
    for (size_t i = 0; i < inputs.size(); i++) {
      check_cpu(outputs[i], "reduce_scatter_tensor_coalesced");
      check_cpu(inputs[i], "reduce_scatter_tensor_coalesced");
      steps.push_back(reduce_scatter_step(outputs[i], inputs[i], opts.reduceOp));
    }
    return submit("reduce_scatter_tensor_coalesced",
                  c10d::OpType::REDUCE_SCATTER_TENSOR_COALESCED, std::move(steps), outputs, opts.asyncOp);
  }

  c10::intrusive_ptr<c10d::Work> alltoall_base(at::Tensor &output, at::Tensor &input,
                                               std::vector<int64_t> &output_splits,
                                               std::vector<int64_t> &input_splits,
                                               const c10d::AllToAllOptions &opts) override {
    check_cpu(output, "all_to_all_single");
    check_cpu(input, "all_to_all_single");
    TORCH_CHECK(input.scalar_type() == output.scalar_type(),
                "weft: all_to_all_single: input and output dtypes differ");
    check_device(input, device_of(output), "all_to_all_single");
    std::vector<int64_t> in_off, in_len, out_off, out_len;
    split_layout(input, input_splits, "input", &in_off, &in_len);
    split_layout(output, output_splits, "output", &out_off, &out_len);
    at::Tensor in = input.contiguous();
    bool staged = !output.is_contiguous();
    at::Tensor out = staged ? at::empty_like(output, at::MemoryFormat::Contiguous) : output;
    size_t esize = (size_t)input.element_size();
    op_step s;
    bool even = input_splits.empty() && output_splits.empty();
    s.issue = [this, in, out, in_off, in_len, out_off, out_len, esize, even]() {
      if (even)
        return weftAlltoAll(in.data_ptr(), out.data_ptr(), (size_t)in_len[0] * esize,
                            weftUint8, comm_, stream_);
      // a group of sends and receives; empty blocks are skipped on both sides
      char *src = (char *)in.data_ptr();
      char *dst = (char *)out.data_ptr();
      weftResult_t res = weftGroupStart();
      if (res != weftSuccess) return res;
      for (int p = 0; p < size_ && res == weftSuccess; p++) {
        if (in_len[p] > 0)
          res = weftSend(src + in_off[p] * esize, (size_t)in_len[p] * esize, weftUint8, p,
                         comm_, stream_);
        if (res == weftSuccess && out_len[p] > 0)
          res = weftRecv(dst + out_off[p] * esize, (size_t)out_len[p] * esize, weftUint8, p,
                         comm_, stream_);
      }
      weftResult_t end = weftGroupEnd();
      return res != weftSuccess ? res : end;
    };
    if (staged) s.finish = [output, out]() { output.copy_(out); };
    return submit("all_to_all_single", c10d::OpType::ALLTOALL_BASE, {s}, {output}, opts.asyncOp);
  }

  c10::intrusive_ptr<c10d::Work> alltoall(std::vector<at::Tensor> &outputs,
                                          std::vector<at::Tensor> &inputs,
                                          const c10d::AllToAllOptions &opts) override {
    TORCH_CHECK((int)outputs.size() == size_ && (int)inputs.size() == size_,
                "weft: all_to_all takes ", size_, " inputs and outputs, got ", inputs.size(),
                " and ", outputs.size());
    std::vector<at::Tensor> ins, outs;
    for (int p = 0; p < size_; p++) {
      check_cpu(inputs[p], "all_to_all");
      check_cpu(outputs[p], "all_to_all");
      check_device(inputs[p], device_of(outputs[0]), "all_to_all");
      ins.push_back(inputs[p].contiguous());
      outs.push_back(outputs[p].is_contiguous()
                         ? outputs[p]
                         : at::empty_like(outputs[p], at::MemoryFormat::Contiguous));
    }
    op_step s;
    s.issue = [this, ins, outs]() {
      weftResult_t res = weftGroupStart();
      if (res != weftSuccess) return res;
      for (int p = 0; p < size_ && res == weftSuccess; p++) {
        if (ins[p].nbytes() > 0)
          res = weftSend(ins[p].data_ptr(), ins[p].nbytes(), weftUint8, p, comm_, stream_);
        if (res == weftSuccess && outs[p].nbytes() > 0)
          res = weftRecv(outs[p].data_ptr(), outs[p].nbytes(), weftUint8, p, comm_, stream_);
      }
      weftResult_t end = weftGroupEnd();
      return res != weftSuccess ? res : end;
    };
    std::vector<at::Tensor> user_outs = outputs;
    s.finish = [user_outs, outs]() {
      for (size_t p = 0; p < outs.size(); p++)
        if (!outs[p].is_same(user_outs[p])) user_outs[p].copy_(outs[p]);
    };
    return submit("all_to_all", c10d::OpType::ALLTOALL, {s}, outputs, opts.asyncOp);
  }

  c10::intrusive_ptr<c10d::Work> gather(std::vector<std::vector<at::Tensor>> &outputs,
                                        std::vector<at::Tensor> &inputs,
                                        const c10d::GatherOptions &opts) override {
    at::Tensor in = single(inputs, "gather").contiguous();
    check_root(opts.rootRank, "gather");
    int root = (int)opts.rootRank;
    bool is_root = rank_ == root;
    std::vector<at::Tensor> outs;
    if (is_root) {
      TORCH_CHECK(outputs.size() == 1, "weft: gather takes one list of outputs on the root");
      check_list(outputs[0], in, "gather");
      outs = outputs[0];
    } else {
      TORCH_CHECK(outputs.empty() || outputs[0].empty(),
                  "weft: gather: only the root passes outputs");
    }
    at::Tensor stage = is_root ? at::empty({(int64_t)size_ * in.numel()}, in.options())
                               : at::Tensor();
    op_step s;
    s.issue = [this, in, stage, root]() {
      flat_buf b = bytes_of(in);
      return weftGather(b.ptr, stage.defined() ? stage.data_ptr() : nullptr, b.count, b.dtype,
                        root, comm_, stream_);
    };
    if (is_root)
      s.finish = [outs, stage]() {
        auto parts = stage.chunk((int64_t)outs.size());
        for (size_t r = 0; r < outs.size(); r++) outs[r].copy_(parts[r].view_as(outs[r]));
      };
    return submit("gather", c10d::OpType::GATHER, {s}, outs, opts.asyncOp, in);
  }

  c10::intrusive_ptr<c10d::Work> scatter(std::vector<at::Tensor> &outputs,
                                         std::vector<std::vector<at::Tensor>> &inputs,
                                         const c10d::ScatterOptions &opts) override {
    at::Tensor out = single(outputs, "scatter");
    check_root(opts.rootRank, "scatter");
    int root = (int)opts.rootRank;
    bool is_root = rank_ == root;
    at::Tensor stage;
    if (is_root) {
      TORCH_CHECK(inputs.size() == 1, "weft: scatter takes one list of inputs on the root");
      check_list(inputs[0], out, "scatter");
      std::vector<at::Tensor> flat;
      for (auto &t : inputs[0]) flat.push_back(t.reshape({-1}));
      stage = at::cat(flat);
    } else {
      TORCH_CHECK(inputs.empty() || inputs[0].empty(),
                  "weft: scatter: only the root passes inputs");
    }
    op_step s = inplace_step(out, [this, stage, root](const at::Tensor &buf) {
      flat_buf b = bytes_of(buf);
      return weftScatter(stage.defined() ? stage.data_ptr() : nullptr, b.ptr, b.count, b.dtype,
                         root, comm_, stream_);
    });
    return submit("scatter", c10d::OpType::SCATTER, {s}, {out}, opts.asyncOp);
  }

  c10::intrusive_ptr<c10d::Work> send(std::vector<at::Tensor> &tensors, int dst,
                                      int) override {
    at::Tensor t = single(tensors, "send").contiguous();
    check_peer(dst, "send");
    op_step s;
    s.issue = [this, t, dst]() {
      flat_buf b = bytes_of(t);
      return weftSend(b.ptr, b.count, b.dtype, dst, comm_, stream_);
    };
    return submit_p2p("send", c10d::OpType::SEND, s, {t});
  }

  c10::intrusive_ptr<c10d::Work> recv(std::vector<at::Tensor> &tensors, int src,
                                      int) override {
    at::Tensor t = single(tensors, "recv");
    check_peer(src, "recv");
    op_step s = inplace_step(t, [this, src](const at::Tensor &buf) {
      flat_buf b = bytes_of(buf);
      return weftRecv(b.ptr, b.count, b.dtype, src, comm_, stream_);
    });
    return submit_p2p("recv", c10d::OpType::RECV, s, {t});
  }

  c10::intrusive_ptr<c10d::Work> recvAnysource(std::vector<at::Tensor> &, int) override {
    TORCH_CHECK(false, "weft: receiving from any source is not supported; name the source rank");
  }

  c10::intrusive_ptr<c10d::Work> barrier(const c10d::BarrierOptions &opts) override {
    at::Tensor t = at::zeros({1}, at::kByte);
    op_step s;
    s.issue = [this, t]() {
      return weftAllReduce(t.data_ptr(), t.data_ptr(), 1, weftUint8, weftSum, comm_, stream_);
    };
    return submit("barrier", c10d::OpType::BARRIER, {s}, {}, opts.asyncOp);
  }

  // --- coalescing: everything issued in between runs as one weft group ---

  void startCoalescing() override {
    TORCH_CHECK(!coalescing_, "weft: startCoalescing called twice");
    coalescing_ = true;
    coalesced_ = task{"coalesced", {}, {}};
    coalesced_work_ = make_work(c10d::OpType::COALESCED, "weft:coalesced", {}, false);
    coalesced_.works.push_back(coalesced_work_);
  }

  c10::intrusive_ptr<c10d::Work> endCoalescing() override {
    TORCH_CHECK(coalescing_, "weft: endCoalescing without startCoalescing");
    coalescing_ = false;
    auto work = coalesced_work_;
    coalesced_work_.reset();
    enqueue(std::move(coalesced_));
    coalesced_ = task{"coalesced", {}, {}};
    return work;
  }

  // --- life cycle ---

  void shutdown() override { stop_worker(false); }

  void abort() override { stop_worker(true); }

 private:
  // --- argument checks ---

  void check_cpu(const at::Tensor &t, const char *opname) const {
    TORCH_CHECK(t.defined(), "weft: ", opname, ": undefined tensor");
    TORCH_CHECK(t.device().is_cpu() || (t.device().is_cuda() && cuda_built()), "weft: ", opname,
                ": tensors on ", t.device(), " are not supported by this build of torch_weft (",
                cuda_built() ? "CPU and CUDA" : "CPU", " tensors only)");
    TORCH_CHECK(!t.is_sparse(), "weft: ", opname, ": sparse tensors are not supported");
  }

  // The CUDA device of t, or -1 for host memory (and no tensor).
  static int device_of(const at::Tensor &t) {
    return t.defined() && t.device().is_cuda() ? (int)t.get_device() : -1;
  }

  // Every tensor of an operation lies where its first does.
  static void check_device(const at::Tensor &t, int device, const char *opname) {
    TORCH_CHECK(device_of(t) == device, "weft: ", opname, ": tensors on ", t.device(), " and on ",
                device < 0 ? std::string("cpu") : "cuda:" + std::to_string(device),
                " in one operation");
  }

  at::Tensor single(std::vector<at::Tensor> &tensors, const char *opname) const {
    TORCH_CHECK(tensors.size() == 1, "weft: ", opname, " takes one tensor per rank, got ",
                tensors.size());
    check_cpu(tensors[0], opname);
    return tensors[0];
  }

  void check_root(int64_t root, const char *opname) const {
    TORCH_CHECK(root >= 0 && root < size_, "weft: ", opname, ": root ", root,
                " is not a rank of this group of ", size_);
  }

  void check_peer(int peer, const char *opname) const {
    TORCH_CHECK(peer >= 0 && peer < size_, "weft: ", opname, ": peer ", peer,
                " is not a rank of this group of ", size_);
  }

  void check_list(const std::vector<at::Tensor> &list, const at::Tensor &like,
                  const char *opname) const {
    TORCH_CHECK((int)list.size() == size_, "weft: ", opname, " takes a list of ", size_,
                " tensors, got ", list.size());
    for (auto &t : list) {
      check_cpu(t, opname);
      check_device(t, device_of(like), opname);
      TORCH_CHECK(t.numel() == like.numel() && t.scalar_type() == like.scalar_type(), "weft: ",
                  opname, ": every tensor of the list must have ", like.numel(), " elements of ",
                  like.scalar_type(), ", got ", t.numel(), " of ", t.scalar_type());
    }
  }

  void split_layout(const at::Tensor &t, const std::vector<int64_t> &splits,
                    const char *which, std::vector<int64_t> *off, std::vector<int64_t> *len) {
    int64_t rows = t.dim() == 0 ? 1 : t.size(0);
    int64_t row = rows == 0 ? 0 : t.numel() / rows;
    if (splits.empty()) {
      TORCH_CHECK(rows % size_ == 0, "weft: all_to_all_single: the ", which, " has ", rows,
                  " rows, not a multiple of the group's ", size_, " ranks");
      for (int p = 0; p < size_; p++) {
        off->push_back(p * (rows / size_) * row);
        len->push_back((rows / size_) * row);
      }
      return;
    }
    TORCH_CHECK((int)splits.size() == size_, "weft: all_to_all_single: ", splits.size(), " ",
                which, " splits for ", size_, " ranks");
    int64_t at_row = 0;
    for (int64_t s : splits) {
      TORCH_CHECK(s >= 0, "weft: all_to_all_single: negative ", which, " split ", s);
      off->push_back(at_row * row);
      len->push_back(s * row);
      at_row += s;
    }
    TORCH_CHECK(at_row == rows, "weft: all_to_all_single: the ", which,
                " splits add up to ", at_row, " rows, the tensor has ", rows);
  }

  // --- steps ---

  // Runs call on a contiguous view of t: t itself, or a staging copy that
  // is copied back afterwards.
  op_step inplace_step(const at::Tensor &t, std::function<weftResult_t(const at::Tensor &)> call) {
    op_step s;
    if (t.is_contiguous()) {
      s.issue = [call, t]() { return call(t); };
    } else {
      at::Tensor stage = t.contiguous();
      s.issue = [call, stage]() { return call(stage); };
      s.finish = [t, stage]() { t.copy_(stage); };
    }
    return s;
  }

  op_step allreduce_step(const at::Tensor &t, const ReduceOp &rop, const char *opname) {
    red_plan p = red_plan_of(rop, t.scalar_type(), opname);
    if (p.kind == red_plan::bitwise) {
      // gather every rank's bits, then fold them locally
      at::Tensor in = t.contiguous();
      at::Tensor all = at::empty({(int64_t)size_, in.numel()}, in.options());
      op_step s;
      s.issue = [this, in, all]() {
        flat_buf b = bytes_of(in);
        return weftAllGather(b.ptr, all.data_ptr(), b.count, b.dtype, comm_, stream_);
      };
      auto bit = p.bit_op;
      s.finish = [t, all, bit]() {
        at::Tensor acc = all[0].clone();
        for (int64_t r = 1; r < all.size(0); r++) {
          if (bit == ReduceOp::BAND) acc.bitwise_and_(all[r]);
          else if (bit == ReduceOp::BOR) acc.bitwise_or_(all[r]);
          else acc.bitwise_xor_(all[r]);
        }
        t.copy_(acc.view_as(t));
      };
      return s;
    }
    if (p.kind == red_plan::premul) return premul_step(t, p, opname, -1);
    weftRedOp_t op = p.op;
    return inplace_step(t, [this, op, opname](const at::Tensor &buf) {
      flat_buf b = elems_of(buf, opname);
      return weftAllReduce(b.ptr, b.ptr, b.count, b.dtype, op, comm_, stream_);
    });
  }

  // A pre-multiplied sum (PREMUL_SUM): all-reduce (recvcount < 0) or
  // reduce-scatter of `in` into `t`, with weft's pre-multiply op.
  op_step premul_step(const at::Tensor &t, const red_plan &p, const char *opname,
                      int64_t recvcount, at::Tensor in = at::Tensor()) {
    at::ScalarType st = t.scalar_type();
    at::ScalarType scalar_type = at::isComplexType(st) ? c10::toRealValueType(st) : st;
    at::Tensor scalar = p.tensor_factor.defined()
                            ? p.tensor_factor.to(at::kCPU, scalar_type).reshape({1}).clone()
                            : at::full({1}, p.factor, at::TensorOptions().dtype(scalar_type));
    auto body = [this, scalar, opname, recvcount, in](const at::Tensor &buf) {
      flat_buf b = elems_of(buf, opname);
      weftRedOp_t op;
      weftResult_t res = weftRedOpCreatePreMulSum(&op, scalar.data_ptr(), b.dtype,
                                                  weftScalarHostImmediate, comm_);
      if (res != weftSuccess) return res;
      if (recvcount < 0) {
        res = weftAllReduce(b.ptr, b.ptr, b.count, b.dtype, op, comm_, stream_);
      } else {
        flat_buf src = elems_of(in, opname);
        res = weftReduceScatter(src.ptr, b.ptr, b.count, b.dtype, op, comm_, stream_);
      }
      weftRedOpDestroy(op, comm_);
      return res;
    };
    return inplace_step(t, body);
  }

  op_step allgather_list_step(const std::vector<at::Tensor> &outs, const at::Tensor &input) {
    at::Tensor in = input.contiguous();
    at::Tensor stage = at::empty({(int64_t)size_ * in.numel()}, in.options());
    op_step s;
    s.issue = [this, in, stage]() {
      flat_buf b = bytes_of(in);
      return weftAllGather(b.ptr, stage.data_ptr(), b.count, b.dtype, comm_, stream_);
    };
    s.finish = [outs, stage]() {
      auto parts = stage.chunk((int64_t)outs.size());
      for (size_t r = 0; r < outs.size(); r++) outs[r].copy_(parts[r].view_as(outs[r]));
    };
    return s;
  }

  op_step allgather_base_step(at::Tensor &output, at::Tensor &input) {
    check_cpu(output, "all_gather_into_tensor");
    check_cpu(input, "all_gather_into_tensor");
    TORCH_CHECK(input.scalar_type() == output.scalar_type(),
                "weft: all_gather_into_tensor: input and output dtypes differ");
    check_device(input, device_of(output), "all_gather_into_tensor");
    TORCH_CHECK(output.numel() == input.numel() * size_, "weft: all_gather_into_tensor: ",
                "the output has ", output.numel(), " elements, expected ", size_, " x ",
                input.numel());
    at::Tensor in = input.contiguous();
    return inplace_step(output, [this, in](const at::Tensor &buf) {
      flat_buf b = bytes_of(in);
      return weftAllGather(b.ptr, buf.data_ptr(), b.count, b.dtype, comm_, stream_);
    });
  }

  op_step reduce_scatter_step(const at::Tensor &out, const at::Tensor &input,
                              const ReduceOp &rop) {
    TORCH_CHECK(input.scalar_type() == out.scalar_type(),
                "weft: reduce_scatter: input and output dtypes differ");
    check_device(input, device_of(out), "reduce_scatter");
    TORCH_CHECK(input.numel() == out.numel() * size_, "weft: reduce_scatter: the input has ",
                input.numel(), " elements, expected ", size_, " x ", out.numel());
    red_plan p = red_plan_of(rop, out.scalar_type(), "reduce_scatter");
    at::Tensor in = input.contiguous();
    if (p.kind == red_plan::premul) return premul_step(out, p, "reduce_scatter", 0, in);
    if (p.kind == red_plan::bitwise) {
      // all-reduce a copy bitwise, keep this rank's block
      at::Tensor whole = in.clone();
      op_step s = allreduce_step(whole, rop, "reduce_scatter");
      auto fin = s.finish;
      int64_t n = out.numel(), r = rank_;
      s.finish = [fin, whole, out, n, r]() {
        fin();
        out.copy_(whole.reshape({-1}).narrow(0, r * n, n).view_as(out));
      };
      return s;
    }
    weftRedOp_t op = p.op;
    return inplace_step(out, [this, in, op](const at::Tensor &buf) {
      flat_buf src = elems_of(in, "reduce_scatter");
      flat_buf b = elems_of(buf, "reduce_scatter");
      return weftReduceScatter(src.ptr, b.ptr, b.count, b.dtype, op, comm_, stream_);
    });
  }

  // --- queueing ---

  c10::intrusive_ptr<WeftWork> make_work(c10d::OpType type, const char *title,
                                         std::vector<at::Tensor> outputs, bool held) {
    return c10::make_intrusive<WeftWork>(rank_, type, title, std::move(outputs), queue_, held);
  }

  // Queues an operation for the worker; a blocking one (async_op false)
  // runs on the calling thread instead, once everything queued before it
  // has run: the caller waits for it anyway, and a hand-off to the worker
  // would only add a thread switch to its latency.
  // An operation on CUDA tensors always runs on the caller's thread (its
  // kernels are enqueued on the caller's stream; the call does not wait for
  // them), once the host work queued before it has run.
  c10::intrusive_ptr<c10d::Work> submit(const char *name, c10d::OpType type,
                                        std::vector<op_step> steps,
                                        std::vector<at::Tensor> outputs, bool async_op,
                                        const at::Tensor &on = at::Tensor()) {
    seq_++;
    const int device = device_of(on.defined() ? on : outputs.empty() ? on : outputs[0]);
    for (const auto &o : outputs) check_device(o, device, name);
    if (coalescing_) {
      TORCH_CHECK(coalesced_.steps.empty() || coalesced_.device == device, "weft: ", name,
                  ": a coalesced block mixes host and CUDA tensors (or two GPUs)");
      coalesced_.device = device;
      for (auto &s : steps) coalesced_.steps.push_back(std::move(s));
      return coalesced_work_;
    }
    auto work = make_work(type, name, std::move(outputs), false);
    task t{name, std::move(steps), {work}, device};
    if (async_op && device < 0) {
      enqueue(std::move(t));
      return work;
    }
    run_here(t);
    return work;
  }

  // Runs t on this thread once the queue is idle, and completes its Works.
  void run_here(task &t) {
    {
      std::unique_lock<std::mutex> lk(queue_->mu);
      TORCH_CHECK(!queue_->stop, "weft: ", t.name, " on a process group that was shut down");
      queue_->release_held_locked();
      queue_->cv.wait(lk, [this] { return queue_->tasks.empty() && !queue_->busy; });
      queue_->busy = true;
    }
    std::exception_ptr err = run(t);
    {
      std::lock_guard<std::mutex> lk(queue_->mu);
      queue_->busy = false;
      queue_->cv.notify_all();
    }
    complete(t, err);
  }

  // Completes t's Works: at once for host memory or a failure to enqueue,
  // when the GPU is past the operation for CUDA tensors.
  void complete(task &t, std::exception_ptr err) {
    if (t.device < 0 || err) {
      for (auto &w : t.works) w->complete(err);
      return;
    }
    auto mark = gpu_mark(t.device, t.stream);
    std::shared_ptr<queue_state> q = queue_;
    const int rank = rank_, size = size_;
    auto async_error = [q, rank, size]() -> std::exception_ptr {
      std::lock_guard<std::mutex> lk(q->mu);
      weftResult_t res = weftSuccess;
      std::string why = "the process group was aborted";
      if (!q->aborted) {
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
    for (auto &w : t.works)
      w->complete_on_gpu(mark, gpu_future(t.device, t.stream, w->result()), async_error,
                         timeout_);
  }

  c10::intrusive_ptr<c10d::Work> submit_p2p(const char *name, c10d::OpType type, op_step step,
                                            std::vector<at::Tensor> outputs) {
    // on a GPU a send waits for its receiver in the kernel, not on this
    // thread: nothing to hold
    if (coalescing_ || device_of(outputs[0]) >= 0)
      return submit(name, type, {std::move(step)}, std::move(outputs), true);
    seq_++;
    if (coalescing_) {
      coalesced_.steps.push_back(std::move(step));
      return coalesced_work_;
    }
    auto work = make_work(type, name, std::move(outputs), true);
    std::lock_guard<std::mutex> lk(queue_->mu);
    TORCH_CHECK(!queue_->stop, "weft: ", name, " on a process group that was shut down");
    queue_->held.steps.push_back(std::move(step));
    queue_->held.works.push_back(work);
    return work;
  }

  void enqueue(task t) {
    if (t.device >= 0) {
      run_here(t);
      return;
    }
    {
      std::lock_guard<std::mutex> lk(queue_->mu);
      TORCH_CHECK(!queue_->stop, "weft: ", t.name, " on a process group that was shut down");
    }
    queue_->push(std::move(t));
  }

  // --- the worker ---

  void worker_loop() {
    // The worker waits on peers (weft's waits spin, then yield) while the
    // training thread computes: at a lower priority it takes a core only
    // when the compute leaves it one. TORCH_WEFT_WORKER_NICE (default 10; 0
    // keeps the caller's priority) sets how much lower.
    const char *nice_env = getenv("TORCH_WEFT_WORKER_NICE");
    int nice_inc = nice_env != nullptr ? atoi(nice_env) : 10;
    if (nice_inc > 0) {
      errno = 0;
      int cur = getpriority(PRIO_PROCESS, (id_t)syscall(SYS_gettid));
      if (errno == 0) setpriority(PRIO_PROCESS, (id_t)syscall(SYS_gettid), std::min(cur + nice_inc, 19));
    }
    for (;;) {
      task t;
      {
        std::unique_lock<std::mutex> lk(queue_->mu);
        queue_->cv.wait(lk, [this] {
          return (queue_->stop && !queue_->busy) || (!queue_->tasks.empty() && !queue_->busy);
        });
        if (queue_->tasks.empty()) return; /* stopped and drained */
        t = std::move(queue_->tasks.front());
        queue_->tasks.pop_front();
        queue_->busy = true;
      }
      std::exception_ptr err = run(t);
      {
        std::lock_guard<std::mutex> lk(queue_->mu);
        queue_->busy = false;
        queue_->cv.notify_all();
      }
      complete(t, err);
    }
  }

  // Runs a task's steps, in one weft group when there are several; a task
  // on CUDA tensors on the caller's current stream of their device.
  std::exception_ptr run(task &t) {
    if (t.device < 0) return run_steps(t);
    std::exception_ptr err;
    try {
      on_cuda_stream(t.device, [&](void *stream) {
        t.stream = stream;
        stream_ = stream;
        err = run_steps(t);
        stream_ = nullptr;
      });
    } catch (...) {
      stream_ = nullptr;
      return std::current_exception();
    }
    return err;
  }

  std::exception_ptr run_steps(task &t) {
    try {
      {
        std::lock_guard<std::mutex> lk(comm_mu_);
        TORCH_CHECK(!aborted_, "weft: ", t.name, ": the process group was aborted");
        in_call_ = true;
      }
      weftResult_t res = weftSuccess;
      bool grouped = t.steps.size() > 1;
      if (grouped) res = weftGroupStart();
      for (auto &s : t.steps) {
        if (res != weftSuccess) break;
        if (s.issue) res = s.issue();
      }
      if (grouped) {
        weftResult_t end = weftGroupEnd();
        if (res == weftSuccess) res = end;
      }
      if (res != weftSuccess) fail(t.name, res);
      {
        std::lock_guard<std::mutex> lk(comm_mu_);
        in_call_ = false;
      }
      for (auto &s : t.steps)
        if (s.finish) s.finish();
      return nullptr;
    } catch (...) {
      std::lock_guard<std::mutex> lk(comm_mu_);
      in_call_ = false;
      return std::current_exception();
    }
  }

  // Throws the DistBackendError for a failed weft call.
  [[noreturn]] void fail(const char *name, weftResult_t res) {
    std::string detail;
    {
      std::lock_guard<std::mutex> lk(comm_mu_);
      detail = aborted_ ? std::string("the process group was aborted")
                        : std::string(weftGetLastError(comm_));
      in_call_ = false;
    }
    if (detail.empty()) detail = weftGetLastError(nullptr);
    C10_THROW_ERROR(DistBackendError,
                    c10::str("weft: ", name, " failed on rank ", rank_, " of ", size_, ": ",
                             weftGetErrorString(res), ": ", detail));
  }

  // The communicator's settings: the group's timeout and name.
  static weftConfig_t config_of(std::chrono::milliseconds timeout, const std::string &name) {
    weftConfig_t config = WEFT_CONFIG_INITIALIZER;
    long long ms = timeout.count();
    config.timeoutMs = ms <= 0 ? WEFT_CONFIG_UNDEF_INT : (int)std::min<long long>(ms, INT32_MAX);
    config.commName = name.c_str();
    return config;
  }

  void check_init(weftResult_t res, const char *call) {
    if (res == weftSuccess) return;
    C10_THROW_ERROR(DistBackendError,
                    c10::str("weft: ", call, " failed on rank ", rank_, " of ", size_, ": ",
                             weftGetErrorString(res), ": ", weftGetLastError(nullptr)));
  }

  // Stops the worker: after the queued work (shutdown) or at once, breaking
  // the communicator so that a blocked operation returns (abort).
  void stop_worker(bool abort_comm) {
    {
      std::lock_guard<std::mutex> lk(queue_->mu);
      queue_->release_held_locked();
      queue_->stop = true;
      queue_->comm = nullptr;
      queue_->aborted = queue_->aborted || abort_comm;
      queue_->cv.notify_all();
    }
    if (comm_ != nullptr && abort_comm) {
      std::lock_guard<std::mutex> lk(comm_mu_);
      aborted_ = true;
    }
    if (comm_ != nullptr && abort_comm) {
      weftCommAbort(comm_);
    }
    if (worker_.joinable()) worker_.join();
    if (comm_ != nullptr && !abort_comm) {
      weftCommFinalize(comm_);
      weftCommDestroy(comm_);
    }
    comm_ = nullptr;
  }

  std::chrono::milliseconds timeout_;
  std::string name_;
  weftComm_t comm_ = nullptr;
  std::shared_ptr<queue_state> queue_;
  weftStream_t stream_ = nullptr; /* the CUDA stream of the task running; NULL on host memory */
  std::thread worker_;
  std::mutex comm_mu_; /* guards aborted_ and in_call_ against abort() */
  bool aborted_ = false;
  bool in_call_ = false;
  uint64_t seq_ = 0;
  bool coalescing_ = false;
  task coalesced_{"coalesced", {}, {}};
  c10::intrusive_ptr<WeftWork> coalesced_work_;
};

static c10::intrusive_ptr<c10d::Backend> create_backend(
    const c10::intrusive_ptr<c10d::Store> &store, int rank, int size, double timeout_s,
    const std::string &name) {
  auto ms = std::chrono::milliseconds((long long)(timeout_s * 1000.0));
  return c10::make_intrusive<WeftBackend>(store, rank, size, ms, name);
}

}  // namespace torch_weft

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  py::module_::import("torch.distributed");
  py::class_<torch_weft::WeftBackend, c10d::Backend, c10::intrusive_ptr<torch_weft::WeftBackend>>(
      m, "WeftBackend");
  m.def("create_backend", &torch_weft::create_backend, py::arg("store"), py::arg("rank"),
        py::arg("size"), py::arg("timeout_s"), py::arg("name") = "",
        py::call_guard<py::gil_scoped_release>(),
        "Joins this rank to a weft communicator whose unique id travels through store.");
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
  m.def("allocator_owns", [](const at::Tensor &t) {
    return torch_weft::alloc_owns(t.data_ptr(), t.numel() * t.element_size());
  }, "Whether the tensor's bytes lie in one block of weft's CPU allocator.");
  m.def("allocator_empty_cache", &torch_weft::alloc_empty_cache);
  m.def("cuda_built", &torch_weft::cuda_built,
        "Whether this build runs operations on CUDA tensors.");
  m.def("weft_version", []() {
    int v = 0;
    weftGetVersion(&v);
    return v;
  });
}
