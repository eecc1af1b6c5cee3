// torch_weft: which CUDA stream an operation runs on and who waits for whom,
// as ProcessGroupNCCL does it, over a thin interface to CUDA (gpu_layer):
// the real one over c10::cuda and the CUDA runtime (weft_cuda.cpp, built
// with TORCH_WEFT_CUDA), and a recording fake (weft_streams.cpp) that runs
// the same logic on the host, where a test reads which stream and event
// each operation and each wait used, in order.
//
// An operation on CUDA tensors runs on the group's communication stream of
// the tensors' device (one per device and group, made at the first
// operation there, high priority when the group asks):
//   1. an event is recorded on the caller's current stream and the
//      communication stream waits for it: the operation comes after what
//      produced its inputs;
//   2. weft's kernels are enqueued on the communication stream, which is the
//      current stream meanwhile, so that torch's copies in and out of
//      staging buffers go there too;
//   3. an end event is recorded there; the caller's tensors are recorded on
//      that stream (record_stream), or stashed in the Work until it is done
//      (avoid_record_streams);
//   4. Work.wait() and synchronize() make the caller's current stream wait
//      for the end event; is_completed() queries it; a blocking wait also
//      waits on the host.
// A start event, recorded on the communication stream right before step 2,
// times the operation on the GPU (Work.get_duration(), the flight
// recorder's "started" state).
// While a CUDA graph captures the caller's stream, step 1 forks the
// communication stream into the capture and the wait of step 4 joins it
// back (the graph holds the operation; nothing asks the host about it, and
// it has no start event). Events of operations issued before the capture
// are asked about under the relaxed capture mode (capture_mode_relaxed):
// in CUDA's default mode a query from any thread would invalidate it.
#pragma once

#include <ATen/ATen.h>
#include <ATen/core/ivalue.h>

#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

namespace torch_weft {

// What the stream logic asks of CUDA. Streams and events are opaque
// handles (cudaStream_t, cudaEvent_t in the real layer).
class gpu_layer {
 public:
  virtual ~gpu_layer() = default;
  // How a thread's calls that CUDA deems unsafe during a graph capture
  // (an event query, a synchronize) meet the captures in progress
  // (cudaStreamCaptureMode, same values): global, CUDA's default, refuses
  // them, and invalidates the capture, while this thread captures or any
  // thread captures in global mode; thread_local only while this thread
  // captures; relaxed never (an event recorded in a capture still cannot
  // be asked about).
  enum capture_mode { capture_global = 0, capture_thread_local = 1, capture_relaxed = 2 };
  // The calling thread's current stream of device.
  virtual void *current_stream(int device) = 0;
  // A stream for a group's communication on device.
  virtual void *stream_create(int device, bool high_priority) = 0;
  // timing: the event can be an end of event_elapsed_ms (costs a timestamp).
  virtual void *event_create(int device, bool timing) = 0;
  virtual void event_destroy(int device, void *event) = 0;
  virtual void event_record(int device, void *event, void *stream) = 0;
  // stream waits (on the GPU) until the GPU has passed event.
  virtual void stream_wait(int device, void *stream, void *event) = 0;
  // Whether the GPU has passed event; never asked of a captured one.
  virtual bool event_query(int device, void *event) = 0;
  // Waits on the host until the GPU has passed event.
  virtual void event_synchronize(int device, void *event) = 0;
  // Milliseconds between two timing events the GPU has passed.
  virtual float event_elapsed_ms(int device, void *start, void *end) = 0;
  // Sets the calling thread's capture mode; returns the one it had
  // (cudaThreadExchangeStreamCaptureMode).
  virtual capture_mode exchange_capture_mode(capture_mode mode) = 0;
  // Whether a graph is capturing stream.
  virtual bool capturing(int device, void *stream) = 0;
  // Keeps the allocator from giving the tensors' memory to other work
  // before stream is past its current point (record_stream).
  virtual void hold(int device, void *stream, const std::vector<at::Tensor> &tensors) = 0;
  // A completed future of outputs whose users on device order themselves
  // after stream's current point (a CUDA-aware future).
  virtual c10::intrusive_ptr<c10::ivalue::Future> future(
      int device, void *stream, const std::vector<at::Tensor> &outputs) = 0;
  // Runs body with device current on this thread and stream its current
  // stream: torch's work in an operation (staging copies in and out) goes
  // to the stream its weft kernels go to.
  virtual void on_stream(int device, void *stream, const std::function<void()> &body) = 0;
  // Says that an operation named name was enqueued on stream (the fake
  // records it; the real layer does nothing).
  virtual void launched(int device, void *stream, const char *name) {}
};

// The layer the backend uses now: the fake while a test has turned it on
// (host tensors then count as on device 0), else the real one where this
// build has CUDA, else null.
gpu_layer *gpu_layer_now();
bool gpu_fake_on();

// A group's stream settings, read when the group is made:
//   TORCH_WEFT_COMM_STREAM=0: operations run on the caller's current stream
//     (no events; the step time of the GPU check's benchmark "compute stream");
//   TORCH_WEFT_HIGH_PRIORITY_STREAM=1 (or Options(high_priority_stream=True)):
//     the communication streams are of high priority;
//   TORCH_WEFT_BLOCKING_WAIT=1, else TORCH_NCCL_BLOCKING_WAIT=1: wait() also
//     waits on the host (and raises a failure there, or after the timeout);
//   TORCH_WEFT_AVOID_RECORD_STREAMS=1, else TORCH_NCCL_AVOID_RECORD_STREAMS=1:
//     the caller's tensors are stashed in the Work until it is done (or
//     waited for) instead of record_stream;
//   timing, as NCCL's: TORCH_WEFT_ENABLE_TIMING=1, else
//     TORCH_NCCL_ENABLE_TIMING=1, or the flight recorder on (its default):
//     a start event before each operation (its duration, and its start in
//     the flight recorder); without it the end event takes no timing.
struct stream_options {
  bool comm_stream = true;
  bool high_priority = false;
  bool blocking_wait = false;
  bool avoid_record_streams = false;
  bool timing = true;
  static stream_options from_env();
};

// While it lives, the calling thread's capture mode is relaxed (put back
// after): its queries of events that no capture holds leave a capture in
// progress, on this thread or another, valid.
class capture_mode_relaxed {
 public:
  explicit capture_mode_relaxed(gpu_layer *layer)
      : layer_(layer), was_(layer->exchange_capture_mode(gpu_layer::capture_relaxed)) {}
  ~capture_mode_relaxed();
  capture_mode_relaxed(const capture_mode_relaxed &) = delete;
  capture_mode_relaxed &operator=(const capture_mode_relaxed &) = delete;

 private:
  gpu_layer *layer_;
  gpu_layer::capture_mode was_;
};

// The end of an operation on a stream: the point the caller's stream waits
// for, and the start event recorded before it (none when captured).
// Destroys its events when dropped. Every query runs in the relaxed
// capture mode.
class gpu_end {
 public:
  gpu_end(gpu_layer *layer, int device, void *event, void *start, bool captured)
      : layer_(layer), device_(device), event_(event), start_(start), captured_(captured) {}
  ~gpu_end();
  gpu_end(const gpu_end &) = delete;
  gpu_end &operator=(const gpu_end &) = delete;
  // Whether the GPU has passed it (not to be asked when captured).
  bool done();
  // Whether the GPU has reached the operation (passed its start event);
  // false without one.
  bool started();
  // Whether it has a start event (get_duration()).
  bool timed() const { return start_ != nullptr; }
  // Milliseconds from the start event to the end, both passed.
  float elapsed_ms();
  // Recorded while a graph captured the caller's stream: the GPU passes it
  // when the graph runs.
  bool captured() const { return captured_; }
  // The caller's current stream of the device waits for it (a captured
  // one: the communication stream joins the capture back).
  void stream_wait();
  // Waits on the host until the GPU has passed it.
  void synchronize();

 private:
  gpu_layer *layer_;
  int device_;
  void *event_;
  void *start_;
  bool captured_;
};

// A group's communication streams, one per device.
class comm_streams {
 public:
  explicit comm_streams(stream_options opts) : opts_(opts) {}
  const stream_options &options() const { return opts_; }
  // Before the first operation (Options(high_priority_stream=...), a split
  // group taking its parent's).
  void set_options(const stream_options &opts) { opts_ = opts; }

  // The stream of device made so far; null before the first operation there.
  void *stream_of(gpu_layer *layer, int device);

  struct launch {
    gpu_layer *layer = nullptr;
    int device = -1;
    void *stream = nullptr; /* where the operation runs */
    void *caller = nullptr; /* the caller's current stream */
    bool captured = false;  /* a graph captures the caller's stream */
    void *start = nullptr;  /* its start event, until end() takes it */
  };
  // Step 1: the stream for an operation on device, ordered after the
  // caller's current stream, and the operation's start event recorded
  // there (unless captured). Each launch begun is to be ended (end()),
  // whatever happens to the operation.
  launch begin(gpu_layer *layer, int device);
  // Step 3: the end event of the operation begun as l, which takes l's
  // start event; the tensors are recorded on its stream, unless stash is
  // set, which says that the Work must keep them until it is done.
  std::shared_ptr<gpu_end> end(launch &l, const std::vector<at::Tensor> &tensors, bool *stash);

 private:
  stream_options opts_;
  std::mutex mu_;
  std::map<std::pair<gpu_layer *, int>, void *> streams_; /* per layer and device */
};

// The fake's test mode (torch_weft._C._gpu_fake_*): device 0 only; its
// streams are named ("default", those a test makes current, "comm<N>" for
// those the groups make) as are its events ("ev<N>"), and each call of the
// logic is a line of its log: "stream_create comm1 high|normal",
// "record ev3 default", "wait comm1 ev3", "destroy ev3", "run allreduce
// comm1", "hold comm1 2", "future comm1", "query ev4 done|pending",
// "sync ev4". A stalled stream's events stay pending until it is released;
// an event's time (event_elapsed_ms) is when the fake GPU passed it: its
// record, or its stream's release. A capture (begin/end) on the caller's
// current stream, in a capture mode as CUDA's (global by default, as
// torch.cuda.graph's), takes in the streams that wait for its events; its
// end says which of them were not joined back (as CUDA fails
// cudaStreamEndCapture). A query or synchronize of a captured event throws;
// so does one that the calling thread's capture mode (exchange_capture_mode)
// forbids while a capture is open ("query ev4 refused"), which also
// invalidates the capture, and the capture's end then throws, as
// cudaStreamEndCapture fails with cudaErrorStreamCaptureInvalidated.
void gpu_fake_enable(bool on);
std::vector<std::string> gpu_fake_log(); /* and clears it */
void gpu_fake_set_stream(const std::string &name);
// release_after_ms > 0 with stalled: released that long after, from a
// thread of the fake (the caller meanwhile blocked in a wait, say).
void gpu_fake_stall(const std::string &name, bool stalled, int release_after_ms = 0);
// mode: "global", "thread_local" or "relaxed"
void gpu_fake_capture_begin(const std::string &mode = "global");
std::string gpu_fake_capture_end(); /* "" or what was left unjoined */

}  // namespace torch_weft
