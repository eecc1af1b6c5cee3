// torch_weft: communication streams (weft_streams.h), and the recording fake
// of the CUDA layer.
#include "weft_streams.h"
#include "weft_flight.h"

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cctype>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <thread>

namespace torch_weft {

gpu_layer *gpu_real_layer(); /* weft_cuda.cpp: null without CUDA */

// --- settings ---

// A flag in name, else in fallback (NCCL's name of the same setting), else
// def: 1, true, yes, y, on or 0, false, no, n, off (any case), as torch
// reads its own; anything else is refused.
static bool env_flag(const char *name, const char *fallback, bool def) {
  for (const char *n : {name, fallback}) {
    if (n == nullptr) continue;
    const char *v = std::getenv(n);
    if (v == nullptr || *v == '\0') continue;
    std::string low(v);
    for (char &c : low) c = (char)std::tolower((unsigned char)c);
    for (const char *yes : {"1", "true", "yes", "y", "on"})
      if (low == yes) return true;
    for (const char *no : {"0", "false", "no", "n", "off"})
      if (low == no) return false;
    TORCH_CHECK(false, "weft: ", n, "=", v, " is not a flag (1 or 0)");
  }
  return def;
}

stream_options stream_options::from_env() {
  stream_options o;
  o.comm_stream = env_flag("TORCH_WEFT_COMM_STREAM", nullptr, true);
  o.high_priority = env_flag("TORCH_WEFT_HIGH_PRIORITY_STREAM", nullptr, false);
  o.blocking_wait = env_flag("TORCH_WEFT_BLOCKING_WAIT", "TORCH_NCCL_BLOCKING_WAIT", false);
  o.avoid_record_streams =
      env_flag("TORCH_WEFT_AVOID_RECORD_STREAMS", "TORCH_NCCL_AVOID_RECORD_STREAMS", false);
  o.timing = env_flag("TORCH_WEFT_ENABLE_TIMING", "TORCH_NCCL_ENABLE_TIMING", false) ||
             flight_recorder::get().enabled();
  return o;
}

// --- the logic ---

capture_mode_relaxed::~capture_mode_relaxed() {
  try {
    layer_->exchange_capture_mode(was_);
  } catch (...) { /* a sticky CUDA error: the next call of CUDA reports it */
  }
}

gpu_end::~gpu_end() {
  layer_->event_destroy(device_, event_);
  if (start_ != nullptr) layer_->event_destroy(device_, start_);
}

bool gpu_end::done() {
  capture_mode_relaxed relaxed(layer_);
  return layer_->event_query(device_, event_);
}

bool gpu_end::started() {
  if (start_ == nullptr) return false;
  capture_mode_relaxed relaxed(layer_);
  return layer_->event_query(device_, start_);
}

float gpu_end::elapsed_ms() {
  capture_mode_relaxed relaxed(layer_);
  return layer_->event_elapsed_ms(device_, start_, event_);
}

void gpu_end::stream_wait() {
  layer_->stream_wait(device_, layer_->current_stream(device_), event_);
}

void gpu_end::synchronize() {
  capture_mode_relaxed relaxed(layer_);
  layer_->event_synchronize(device_, event_);
}

void *comm_streams::stream_of(gpu_layer *layer, int device) {
  std::lock_guard<std::mutex> lk(mu_);
  auto it = streams_.find({layer, device});
  return it == streams_.end() ? nullptr : it->second;
}

comm_streams::launch comm_streams::begin(gpu_layer *layer, int device) {
  launch l;
  l.layer = layer;
  l.device = device;
  l.caller = layer->current_stream(device);
  l.captured = layer->capturing(device, l.caller);
  if (!opts_.comm_stream) {
    l.stream = l.caller;
  } else {
    {
      std::lock_guard<std::mutex> lk(mu_);
      void *&s = streams_[{layer, device}];
      if (s == nullptr) s = layer->stream_create(device, opts_.high_priority);
      l.stream = s;
    }
    // the operation comes after what the caller's stream holds (in a
    // capture: the communication stream joins it)
    void *ready = layer->event_create(device, false);
    try {
      layer->event_record(device, ready, l.caller);
      layer->stream_wait(device, l.stream, ready);
    } catch (...) {
      layer->event_destroy(device, ready);
      throw;
    }
    layer->event_destroy(device, ready); /* the wait is enqueued: CUDA frees it once passed */
  }
  // the GPU reaches the operation here (a captured one is not timed: its
  // events cannot be asked about)
  if (!l.captured && opts_.timing) {
    void *start = layer->event_create(device, true);
    try {
      layer->event_record(device, start, l.stream);
    } catch (...) {
      layer->event_destroy(device, start);
      throw;
    }
    l.start = start;
  }
  return l;
}

std::shared_ptr<gpu_end> comm_streams::end(launch &l, const std::vector<at::Tensor> &tensors,
                                           bool *stash) {
  gpu_layer *layer = l.layer;
  void *start = l.start;
  l.start = nullptr; /* the gpu_end's, or destroyed here */
  void *ev = nullptr;
  try {
    // on the caller's own stream too: a tensor made on another one and
    // dropped after the call must outlive the operation there as well
    *stash = opts_.avoid_record_streams;
    if (!*stash) layer->hold(l.device, l.stream, tensors);
    ev = layer->event_create(l.device, start != nullptr);
    layer->event_record(l.device, ev, l.stream);
  } catch (...) {
    if (ev != nullptr) layer->event_destroy(l.device, ev);
    if (start != nullptr) layer->event_destroy(l.device, start);
    throw;
  }
  return std::make_shared<gpu_end>(layer, l.device, ev, start, l.captured);
}

// --- the recording fake ---

namespace {

class fake_layer final : public gpu_layer {
 public:
  struct stream {
    std::string name;
    bool high = false;
    int capture = 0;       /* the capture it is in */
    bool origin = false;   /* the stream the capture began on */
    uint64_t pos = 0;      /* work enqueued on it so far */
    int64_t joined = 0;    /* the point of it a captured stream waited for */
    bool stalled = false;
  };
  struct event {
    std::string name;
    uintptr_t stream = 0;
    uint64_t pos = 0;
    int capture = 0;
    bool pending = false;
    bool recorded = false;
    bool timing = false;
    int64_t passed_ns = 0; /* when the fake GPU passed it (steady clock) */
  };
  struct capture {
    std::thread::id thread; /* the one that began it */
    capture_mode mode = capture_global;
    bool invalidated = false;
  };

  void *current_stream(int device) override {
    check_device(device);
    std::lock_guard<std::mutex> lk(mu_);
    return to_handle(current());
  }
  void *stream_create(int device, bool high_priority) override {
    check_device(device);
    std::lock_guard<std::mutex> lk(mu_);
    uintptr_t id = next_++;
    stream &s = streams_[id];
    s.name = "comm" + std::to_string(++comm_count_);
    s.high = high_priority;
    log_.push_back("stream_create " + s.name + (high_priority ? " high" : " normal"));
    return to_handle(id);
  }
  void *event_create(int device, bool timing) override {
    check_device(device);
    std::lock_guard<std::mutex> lk(mu_);
    uintptr_t id = next_++;
    events_[id].name = "ev" + std::to_string(++event_count_);
    events_[id].timing = timing;
    return to_handle(id);
  }
  void event_destroy(int, void *e) override {
    std::lock_guard<std::mutex> lk(mu_);
    auto it = events_.find(of_handle(e));
    if (it == events_.end()) return;
    log_.push_back("destroy " + it->second.name);
    events_.erase(it);
  }
  void event_record(int, void *e, void *s) override {
    std::lock_guard<std::mutex> lk(mu_);
    event &ev = events_.at(of_handle(e));
    stream &st = streams_.at(of_handle(s));
    ev.stream = of_handle(s);
    ev.pos = st.pos;
    ev.capture = st.capture;
    ev.pending = st.stalled;
    ev.recorded = true;
    if (!ev.pending) ev.passed_ns = now_ns();
    log_.push_back("record " + ev.name + " " + st.name);
  }
  void stream_wait(int, void *s, void *e) override {
    std::lock_guard<std::mutex> lk(mu_);
    event &ev = events_.at(of_handle(e));
    stream &st = streams_.at(of_handle(s));
    log_.push_back("wait " + st.name + " " + ev.name);
    if (ev.capture != 0 && captures_.count(ev.capture) != 0) {
      // a stream that waits for a captured event is taken into the capture,
      // to be joined back even if nothing more is enqueued there; one in it
      // that waits for another's latest point joins that one back
      if (st.capture == 0) {
        st.capture = ev.capture;
        st.joined = (int64_t)st.pos - 1;
      }
      stream &from = streams_.at(ev.stream);
      if (st.capture == ev.capture && ev.pos >= from.pos) from.joined = (int64_t)ev.pos;
    }
  }
  bool event_query(int, void *e) override {
    std::lock_guard<std::mutex> lk(mu_);
    event &ev = events_.at(of_handle(e));
    TORCH_CHECK(ev.capture == 0, "weft fake GPU: a query of ", ev.name,
                ", recorded in a capture (CUDA invalidates the capture)");
    check_unsafe_call("query", ev);
    log_.push_back("query " + ev.name + (ev.pending ? " pending" : " done"));
    return !ev.pending;
  }
  void event_synchronize(int, void *e) override {
    std::unique_lock<std::mutex> lk(mu_);
    const uintptr_t id = of_handle(e);
    TORCH_CHECK(events_.at(id).capture == 0, "weft fake GPU: a synchronize of ",
                events_.at(id).name, ", recorded in a capture");
    check_unsafe_call("sync", events_.at(id));
    log_.push_back("sync " + events_.at(id).name);
    cv_.wait(lk, [&] { return !events_.at(id).pending; });
  }
  float event_elapsed_ms(int, void *start, void *end) override {
    std::lock_guard<std::mutex> lk(mu_);
    const event &a = events_.at(of_handle(start)), &b = events_.at(of_handle(end));
    for (const event *ev : {&a, &b}) {
      TORCH_CHECK(ev->timing, "weft fake GPU: ", ev->name, " was made without timing");
      TORCH_CHECK(ev->recorded && ev->capture == 0, "weft fake GPU: ", ev->name,
                  " is not recorded, or recorded in a capture");
      TORCH_CHECK(!ev->pending, "weft fake GPU: ", ev->name, " is pending (cudaErrorNotReady)");
    }
    return (float)(b.passed_ns - a.passed_ns) / 1e6f;
  }
  capture_mode exchange_capture_mode(capture_mode mode) override {
    const capture_mode was = mode_;
    mode_ = mode;
    return was;
  }
  bool capturing(int, void *s) override {
    std::lock_guard<std::mutex> lk(mu_);
    return streams_.at(of_handle(s)).capture != 0;
  }
  void hold(int, void *s, const std::vector<at::Tensor> &tensors) override {
    std::lock_guard<std::mutex> lk(mu_);
    log_.push_back("hold " + streams_.at(of_handle(s)).name + " " +
                   std::to_string(tensors.size()));
  }
  c10::intrusive_ptr<c10::ivalue::Future> future(int, void *s,
                                                 const std::vector<at::Tensor> &outputs) override {
    {
      std::lock_guard<std::mutex> lk(mu_);
      log_.push_back("future " + streams_.at(of_handle(s)).name);
    }
    auto fut = c10::make_intrusive<c10::ivalue::Future>(
        c10::ListType::create(c10::TensorType::get()));
    fut->markCompleted(c10::IValue(outputs));
    return fut;
  }
  void on_stream(int device, void *s, const std::function<void()> &body) override {
    check_device(device);
    uintptr_t was;
    {
      std::lock_guard<std::mutex> lk(mu_);
      was = current();
      current_ = of_handle(s);
    }
    try {
      body();
    } catch (...) {
      current_ = was;
      throw;
    }
    current_ = was;
  }
  void launched(int, void *s, const char *name) override {
    std::lock_guard<std::mutex> lk(mu_);
    stream &st = streams_.at(of_handle(s));
    st.pos++;
    log_.push_back(std::string("run ") + name + " " + st.name);
  }

  // --- test mode ---

  std::vector<std::string> take_log() {
    std::lock_guard<std::mutex> lk(mu_);
    std::vector<std::string> out;
    out.swap(log_);
    return out;
  }
  void set_stream(const std::string &name) {
    std::lock_guard<std::mutex> lk(mu_);
    current_ = by_name(name, true);
  }
  void stall(const std::string &name, bool stalled) {
    std::lock_guard<std::mutex> lk(mu_);
    const uintptr_t id = by_name(name, false);
    TORCH_CHECK(id != 0, "weft fake GPU: no stream ", name);
    streams_.at(id).stalled = stalled;
    if (!stalled) {
      const int64_t now = now_ns();
      for (auto &e : events_)
        if (e.second.stream == id && e.second.pending) {
          e.second.pending = false;
          e.second.passed_ns = now;
        }
    }
    cv_.notify_all();
  }
  void capture_begin(const std::string &mode) {
    std::lock_guard<std::mutex> lk(mu_);
    capture c;
    c.thread = std::this_thread::get_id();
    if (mode == "global")
      c.mode = capture_global;
    else if (mode == "thread_local")
      c.mode = capture_thread_local;
    else if (mode == "relaxed")
      c.mode = capture_relaxed;
    else
      TORCH_CHECK(false, "weft fake GPU: capture mode ", mode, " (global, thread_local, relaxed)");
    stream &s = streams_.at(current());
    TORCH_CHECK(s.capture == 0, "weft fake GPU: ", s.name, " is already capturing");
    s.capture = ++capture_count_;
    s.origin = true;
    s.joined = (int64_t)s.pos;
    captures_[s.capture] = c;
  }
  std::string capture_end() {
    std::lock_guard<std::mutex> lk(mu_);
    stream &o = streams_.at(current());
    TORCH_CHECK(o.origin, "weft fake GPU: ", o.name, " is not capturing");
    const int id = o.capture;
    std::string unjoined;
    for (auto &p : streams_) {
      stream &s = p.second;
      if (s.capture != id) continue;
      if (!s.origin && (int64_t)s.pos > s.joined)
        unjoined += (unjoined.empty() ? "" : " ") + s.name;
      s.capture = 0;
      s.origin = false;
    }
    const bool invalidated = captures_.at(id).invalidated;
    captures_.erase(id);
    TORCH_CHECK(!invalidated, "weft fake GPU: the capture on ", o.name, " was invalidated ",
                "(cudaErrorStreamCaptureInvalidated)");
    return unjoined;
  }

 private:
  static int64_t now_ns() {
    return std::chrono::duration_cast<std::chrono::nanoseconds>(
               std::chrono::steady_clock::now().time_since_epoch())
        .count();
  }
  // A call CUDA deems unsafe during a capture (under mu_): refused, and the
  // captures it conflicts with invalidated, where the calling thread's mode
  // forbids it (gpu_layer::capture_mode).
  void check_unsafe_call(const char *what, const event &ev) {
    if (mode_ == capture_relaxed) return;
    bool refused = false;
    for (auto &p : captures_) {
      capture &c = p.second;
      if (c.mode == capture_relaxed) continue;
      const bool own = c.thread == std::this_thread::get_id();
      if (own || (mode_ == capture_global && c.mode == capture_global)) {
        c.invalidated = true;
        refused = true;
      }
    }
    if (!refused) return;
    log_.push_back(std::string(what) + " " + ev.name + " refused");
    TORCH_CHECK(false, "weft fake GPU: a ", what, " of ", ev.name, " while a graph capture is ",
                "open, in a capture mode that forbids it (cudaErrorStreamCaptureUnsupported; ",
                "the capture is invalidated)");
  }
  static void check_device(int device) {
    TORCH_CHECK(device == 0, "weft fake GPU: device ", device, " (the fake has device 0 only)");
  }
  static void *to_handle(uintptr_t id) { return reinterpret_cast<void *>(id); }
  static uintptr_t of_handle(void *h) { return reinterpret_cast<uintptr_t>(h); }
  // the calling thread's current stream; its first look makes "default"
  uintptr_t current() {
    if (default_ == 0) {
      default_ = next_++;
      streams_[default_].name = "default";
    }
    if (current_ == 0) current_ = default_;
    return current_;
  }
  // the stream named name (made when make is set; 0 when absent)
  uintptr_t by_name(const std::string &name, bool make) {
    if (name == "default") {
      current_ = 0;
      return current();
    }
    for (auto &p : streams_)
      if (p.second.name == name) return p.first;
    if (!make) return 0;
    uintptr_t id = next_++;
    streams_[id].name = name;
    return id;
  }

  std::mutex mu_;
  std::condition_variable cv_;
  std::vector<std::string> log_;
  std::map<uintptr_t, stream> streams_;
  std::map<uintptr_t, event> events_;
  std::map<int, capture> captures_; /* those in progress */
  uintptr_t next_ = 16, default_ = 0;
  static thread_local uintptr_t current_;
  static thread_local capture_mode mode_; /* the thread's, global at first as CUDA's */
  int comm_count_ = 0, event_count_ = 0, capture_count_ = 0;
};

thread_local uintptr_t fake_layer::current_ = 0;
thread_local gpu_layer::capture_mode fake_layer::mode_ = gpu_layer::capture_global;

std::atomic<bool> fake_on{false};

fake_layer &fake() {
  static fake_layer *f = new fake_layer(); /* never freed: Works may outlive exit's order */
  return *f;
}

}  // namespace

bool gpu_fake_on() { return fake_on.load(); }

gpu_layer *gpu_layer_now() { return fake_on.load() ? &fake() : gpu_real_layer(); }

void gpu_fake_enable(bool on) { fake_on = on; }
std::vector<std::string> gpu_fake_log() { return fake().take_log(); }
void gpu_fake_set_stream(const std::string &name) { fake().set_stream(name); }
void gpu_fake_stall(const std::string &name, bool stalled, int release_after_ms) {
  fake().stall(name, stalled);
  if (stalled && release_after_ms > 0)
    std::thread([name, release_after_ms] {
      std::this_thread::sleep_for(std::chrono::milliseconds(release_after_ms));
      fake().stall(name, false);
    }).detach();
}
void gpu_fake_capture_begin(const std::string &mode) { fake().capture_begin(mode); }
std::string gpu_fake_capture_end() { return fake().capture_end(); }

}  // namespace torch_weft
