// torch_weft: the flight recorder (weft_flight.h).
#include "weft_flight.h"

#include <ATen/core/Dict.h>
#include <ATen/core/List.h>
#include <ATen/core/ivalue.h>
#include <c10/util/Exception.h>
#include <torch/csrc/jit/serialization/pickle.h>

#include <pthread.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <sstream>
#include <thread>

namespace torch_weft {

// The version of PyTorch's dump format these files follow: the analyzer
// takes a major.minor string, and 2.7 and later read coalesced blocks of
// collectives as this recorder writes them.
static const char *const kFormatVersion = "2.10";

enum { STATE_SCHEDULED, STATE_STARTED, STATE_COMPLETED };

// A slot of the ring, overwritten in place (its vectors keep their room).
struct flight_recorder::entry {
  int64_t id = -1; /* -1: an empty slot */
  std::shared_ptr<flight_group> group;
  flight_op op;
  std::vector<int64_t> in_dims, out_dims; /* per tensor, its number of dimensions */
  std::vector<int64_t> sizes;             /* every tensor's sizes, inputs first */
  std::vector<c10::ScalarType> in_dtypes, out_dtypes;
  int64_t created_ns = 0, started_ns = 0, completed_ns = 0;
  float duration_ms = -1;
  int state = STATE_SCHEDULED;
  bool failed = false;
  std::string thread_id, thread_name;
};

static int64_t wall_ns() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(
             std::chrono::system_clock::now().time_since_epoch())
      .count();
}

// The first of names set in the environment, else nullptr.
static const char *first_env(std::initializer_list<const char *> names, const char **which) {
  for (const char *n : names) {
    const char *v = getenv(n);
    if (v != nullptr && *v != '\0') {
      *which = n;
      return v;
    }
  }
  return nullptr;
}

flight_recorder::flight_recorder() {
  const char *which = nullptr;
  const char *v = first_env({"TORCH_FR_BUFFER_SIZE", "TORCH_NCCL_TRACE_BUFFER_SIZE"}, &which);
  long long n = 2000;
  if (v != nullptr) {
    char *end = nullptr;
    errno = 0;
    n = strtoll(v, &end, 10);
    TORCH_CHECK(errno == 0 && end != v && *end == '\0' && n >= 0 && n <= (1 << 24), "weft: ",
                which, "=", v, " is not a number of flight recorder entries (0 to 16777216)");
  }
  capacity_ = (size_t)n;
  ring_.resize(capacity_);
}

flight_recorder &flight_recorder::get() {
  static flight_recorder *r = new flight_recorder();
  return *r;
}

std::string flight_recorder::prefix() const {
  const char *which = nullptr;
  const char *v =
      first_env({"TORCH_FR_DUMP_TEMP_FILE", "TORCH_NCCL_DEBUG_INFO_TEMP_FILE"}, &which);
  return v != nullptr ? std::string(v) : std::string("/tmp/weft_trace_rank_");
}

std::shared_ptr<flight_group> flight_recorder::add_group(const std::string &name,
                                                         const std::string &desc,
                                                         std::vector<int64_t> ranks,
                                                         int this_rank) {
  auto g = std::make_shared<flight_group>();
  g->name = name;
  g->desc = desc;
  g->ranks = std::move(ranks);
  std::lock_guard<std::mutex> lk(mu_);
  g->pg_id = (int64_t)groups_.size();
  groups_.push_back(g);
  rank_ = this_rank;
  return g;
}

int64_t flight_recorder::record(const std::shared_ptr<flight_group> &g, const flight_op &op,
                                const std::vector<at::Tensor> &inputs,
                                const std::vector<at::Tensor> &outputs) {
  if (capacity_ == 0 || g == nullptr) return -1;
  // the issuing thread, found once per thread (its name is a read of /proc)
  thread_local std::string tid, tname;
  thread_local bool named = false;
  if (!named) {
    std::ostringstream os;
    os << std::this_thread::get_id();
    tid = os.str();
    char buf[32] = "";
    if (pthread_getname_np(pthread_self(), buf, sizeof buf) == 0) tname = buf;
    named = true;
  }
  const int64_t now = wall_ns();
  if (!op.is_p2p) g->last_enqueued = op.collective_seq;
  std::lock_guard<std::mutex> lk(mu_);
  const int64_t id = next_id_++;
  entry &e = ring_[(size_t)id % capacity_];
  e.id = id;
  e.group = g;
  e.op = op;
  // sizes and dtypes only: the entry must not keep the caller's tensors
  e.in_dims.clear();
  e.out_dims.clear();
  e.sizes.clear();
  e.in_dtypes.clear();
  e.out_dtypes.clear();
  for (const auto &t : inputs) {
    e.in_dims.push_back(t.defined() ? t.dim() : 0);
    if (t.defined()) e.sizes.insert(e.sizes.end(), t.sizes().begin(), t.sizes().end());
    e.in_dtypes.push_back(t.defined() ? t.scalar_type() : c10::ScalarType::Undefined);
  }
  for (const auto &t : outputs) {
    e.out_dims.push_back(t.defined() ? t.dim() : 0);
    if (t.defined()) e.sizes.insert(e.sizes.end(), t.sizes().begin(), t.sizes().end());
    e.out_dtypes.push_back(t.defined() ? t.scalar_type() : c10::ScalarType::Undefined);
  }
  e.created_ns = now;
  e.started_ns = e.completed_ns = 0;
  e.duration_ms = -1;
  e.state = STATE_SCHEDULED;
  e.failed = false;
  e.thread_id = tid;
  e.thread_name = tname;
  return id;
}

void flight_recorder::set_state(const std::vector<int64_t> &ids, int state, bool ok,
                                float duration_ms) {
  if (capacity_ == 0 || ids.empty()) return;
  const int64_t now = wall_ns();
  std::lock_guard<std::mutex> lk(mu_);
  for (int64_t id : ids) {
    if (id < 0) continue;
    entry &e = ring_[(size_t)id % capacity_];
    if (e.id != id) continue; /* the ring went past it */
    if (state == STATE_STARTED) {
      if (e.state != STATE_SCHEDULED) continue;
      e.state = STATE_STARTED;
      e.started_ns = now;
      if (!e.op.is_p2p) e.group->last_started = e.op.collective_seq;
      continue;
    }
    if (e.started_ns == 0) e.started_ns = now; /* what ended had started */
    /* one that ended before a look saw it start (a GPU operation between two
     * of the watchdog's looks) started too: pg_status never reads a group's
     * last started collective behind its last completed one */
    if (!e.op.is_p2p && e.op.collective_seq > e.group->last_started)
      e.group->last_started = e.op.collective_seq;
    if (!ok) {
      e.state = STATE_STARTED;
      e.failed = true;
      continue;
    }
    e.state = STATE_COMPLETED;
    e.completed_ns = now;
    e.duration_ms = duration_ms;
    if (!e.op.is_p2p) e.group->last_completed = e.op.collective_seq;
  }
}

void flight_recorder::started(const std::vector<int64_t> &ids) {
  set_state(ids, STATE_STARTED, true, -1);
}

void flight_recorder::completed(const std::vector<int64_t> &ids, bool ok, float duration_ms) {
  set_state(ids, STATE_COMPLETED, ok, duration_ms);
}

static c10::Dict<c10::IValue, c10::IValue> any_dict() {
  return c10::Dict<c10::IValue, c10::IValue>(c10::AnyType::get(), c10::AnyType::get());
}

static c10::List<c10::IValue> any_list() { return c10::List<c10::IValue>(c10::AnyType::get()); }

// The sizes of a list of tensors, read from the entry's flat sizes at *at.
static c10::List<c10::IValue> sizes_list(const std::vector<int64_t> &dims,
                                         const std::vector<int64_t> &sizes, size_t *at) {
  auto l = any_list();
  for (int64_t d : dims) {
    std::vector<int64_t> one(sizes.begin() + (ptrdiff_t)*at, sizes.begin() + (ptrdiff_t)(*at + d));
    *at += (size_t)d;
    l.push_back(c10::IValue(one));
  }
  return l;
}

static c10::List<c10::IValue> dtype_list(const std::vector<c10::ScalarType> &types) {
  auto l = any_list();
  for (auto t : types) l.push_back(c10::IValue(std::string(c10::toString(t))));
  return l;
}

// PyTorch's profiling name: "weft:all_reduce", "weft:send 0->1", "weft:recv 1<-?".
static std::string profiling_name(const flight_op &op) {
  if (strcmp(op.kind, "send") == 0) return c10::str("weft:send ", op.rank, "->", op.peer);
  if (strcmp(op.kind, "recv") == 0)
    return op.peer >= 0 ? c10::str("weft:recv ", op.rank, "<-", op.peer)
                        : c10::str("weft:recv ", op.rank, "<-?");
  return c10::str("weft:", op.kind);
}

std::string flight_recorder::pickled() {
  auto d = any_dict();
  auto pg_config = any_dict(), pg_status = any_dict();
  auto entries = any_list();
  {
    std::lock_guard<std::mutex> lk(mu_);
    for (const auto &g : groups_) {
      std::string ranks = "[";
      for (size_t i = 0; i < g->ranks.size(); i++)
        ranks += (i ? ", " : "") + std::to_string(g->ranks[i]);
      ranks += "]";
      auto info = any_dict();
      info.insert("name", g->name);
      info.insert("desc", g->desc);
      info.insert("ranks", ranks);
      pg_config.insert(g->name, info);
      auto status = any_dict();
      status.insert("last_enqueued_collective", g->last_enqueued.load());
      status.insert("last_started_collective", g->last_started.load());
      status.insert("last_completed_collective", g->last_completed.load());
      pg_status.insert(std::to_string(g->pg_id), status);
    }
    // oldest first: from the slot the next entry takes, once the ring is full
    const int64_t first = next_id_ > (int64_t)capacity_ ? next_id_ - (int64_t)capacity_ : 0;
    for (int64_t id = first; id < next_id_; id++) {
      const entry &e = ring_[(size_t)id % capacity_];
      if (e.id != id) continue;
      auto x = any_dict();
      x.insert("record_id", e.id);
      x.insert("pg_id", e.group->pg_id);
      x.insert("process_group", c10::ivalue::Tuple::create(e.group->name, e.group->desc));
      x.insert("collective_seq_id", e.op.collective_seq);
      x.insert("p2p_seq_id", e.op.p2p_seq);
      x.insert("op_id", e.op.op_id);
      x.insert("profiling_name", profiling_name(e.op));
      x.insert("time_created_ns", e.created_ns);
      if (e.duration_ms >= 0) x.insert("duration_ms", (double)e.duration_ms);
      size_t at = 0;
      x.insert("input_sizes", sizes_list(e.in_dims, e.sizes, &at));
      x.insert("input_dtypes", dtype_list(e.in_dtypes));
      x.insert("output_sizes", sizes_list(e.out_dims, e.sizes, &at));
      x.insert("output_dtypes", dtype_list(e.out_dtypes));
      static const char *const states[] = {"scheduled", "started", "completed"};
      x.insert("state", states[e.state]);
      x.insert("time_discovered_started_ns", e.started_ns);
      x.insert("time_discovered_completed_ns", e.completed_ns);
      // as PyTorch's: the watchdog no longer follows it (done, or failed)
      x.insert("retired", e.state == STATE_COMPLETED || e.failed);
      x.insert("timeout_ms", e.op.timeout_ms);
      x.insert("is_p2p", e.op.is_p2p);
      x.insert("thread_id", e.thread_id);
      x.insert("thread_name", e.thread_name);
      x.insert("frames", any_list());
      entries.push_back(x);
    }
  }
  d.insert("version", kFormatVersion);
  d.insert("comm_lib_version", c10::str("weft"));
  d.insert("pg_config", pg_config);
  d.insert("pg_status", pg_status);
  d.insert("entries", entries);
  std::vector<char> bytes = torch::jit::pickle(c10::IValue(d));
  return std::string(bytes.begin(), bytes.end());
}

std::string flight_recorder::dump(const std::string &prefix_in) {
  TORCH_CHECK(capacity_ > 0, "weft: the flight recorder is off (TORCH_FR_BUFFER_SIZE=0)");
  int rank;
  {
    std::lock_guard<std::mutex> lk(mu_);
    rank = rank_;
  }
  TORCH_CHECK(rank >= 0, "weft: no process group of the weft backend in this process: no ",
              "flight recorder to dump");
  const std::string path = (prefix_in.empty() ? prefix() : prefix_in) + std::to_string(rank);
  const std::string bytes = pickled();
  // written beside its place, then renamed: a reader never sees half a file
  const std::string tmp = c10::str(path, ".tmp.", getpid());
  FILE *f = fopen(tmp.c_str(), "wb");
  TORCH_CHECK(f != nullptr, "weft: flight recorder dump: cannot create ", tmp, ": ",
              strerror(errno));
  const bool written = fwrite(bytes.data(), 1, bytes.size(), f) == bytes.size();
  const int werr = errno;
  if (fclose(f) != 0 || !written) {
    unlink(tmp.c_str());
    TORCH_CHECK(false, "weft: flight recorder dump: writing ", tmp, " failed: ",
                strerror(written ? errno : werr));
  }
  if (rename(tmp.c_str(), path.c_str()) != 0) {
    const int rerr = errno;
    unlink(tmp.c_str());
    TORCH_CHECK(false, "weft: flight recorder dump: cannot rename ", tmp, " to ", path, ": ",
                strerror(rerr));
  }
  return path;
}

void flight_recorder::dump_quietly(const char *why) {
  if (capacity_ == 0) return;
  try {
    const std::string path = dump();
    fprintf(stderr, "[rank %d] weft: flight recorder dumped to %s (%s)\n", rank_, path.c_str(),
            why);
  } catch (const std::exception &e) {
    fprintf(stderr, "[rank %d] weft: flight recorder dump failed (%s): %s\n", rank_, why,
            e.what());
  }
  fflush(stderr);
}

const char *flight_kind(const char *name, bool *inplace) {
  static const struct {
    const char *op, *kind;
    bool inplace;
  } kinds[] = {
      {"broadcast", "broadcast", true},
      {"allreduce", "all_reduce", true},
      {"allreduce_coalesced", "allreduce_coalesced", true},
      {"reduce", "reduce", true},
      {"allgather", "all_gather", false},
      {"allgather_coalesced", "allgather_coalesced", false},
      {"all_gather_into_tensor", "_all_gather_base", false},
      {"allgather_into_tensor_coalesced", "all_gather_into_tensor_coalesced", false},
      {"reduce_scatter", "reduce_scatter", false},
      {"reduce_scatter_tensor", "_reduce_scatter_base", false},
      {"reduce_scatter_tensor_coalesced", "reduce_scatter_tensor_coalesced", false},
      {"all_to_all_single", "all_to_all", false},
      {"all_to_all", "all_to_all", false},
      {"gather", "gather", false},
      {"scatter", "scatter", false},
      {"barrier", "barrier", false},
      {"split", "split", false},
      {"send", "send", true},
      {"recv", "recv", true},
      {"recv_anysource", "recv", true},
  };
  for (const auto &k : kinds)
    if (strcmp(name, k.op) == 0) {
      *inplace = k.inplace;
      return k.kind;
    }
  *inplace = false;
  return nullptr;
}

}  // namespace torch_weft
