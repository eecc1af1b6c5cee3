// torch_weft: the flight recorder, the last operations of every "weft"
// process group of this process, dumped in the format of PyTorch's flight
// recorder (ProcessGroupNCCL's dump), which PyTorch's analyzer reads
// (`torchfrtrace DIR`, python -m torch.distributed.flight_recorder.fr_trace).
//
// One recorder per process, as PyTorch's: a ring of TORCH_FR_BUFFER_SIZE
// entries (TORCH_NCCL_TRACE_BUFFER_SIZE as the older name; 2000 by default;
// 0 turns it off) shared by the process's groups, each entry naming its group.
// A dump is one file per rank, <prefix><global rank>, the prefix from
// TORCH_FR_DUMP_TEMP_FILE (TORCH_NCCL_DEBUG_INFO_TEMP_FILE), else
// /tmp/weft_trace_rank_; a pickled dict: version, pg_config (per group its
// name, description and global ranks), pg_status (per group the last
// collective enqueued, started and completed) and entries, oldest first.
//
// An entry's state is "scheduled" from its issue, "started" once it runs (on
// a CUDA stream: once a look finds its start event passed) and "completed"
// once it is done; one that failed stays "started" (it never completed). An
// operation captured into a CUDA graph, which runs it when replayed, takes
// its sequence numbers and no entry, as in NCCL's recorder. collective_seq_id counts the group's collectives (a coalescing
// block once), p2p_seq_id its sends and receives, and op_id every operation:
// it is the sequence number the watchdog's messages give.
#pragma once

#include <ATen/ATen.h>

#include <atomic>
#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

namespace torch_weft {

// What a dump says of one process group.
struct flight_group {
  std::string name;           /* torch's name of the group ("0", "1", ...) */
  std::string desc;           /* its description ("default_pg", "undefined", ...) */
  std::vector<int64_t> ranks; /* its members' global ranks, in group rank order */
  int64_t pg_id = 0;          /* the group's number among this process's groups */
  std::atomic<int64_t> last_enqueued{-1}, last_started{-1}, last_completed{-1};
  /* the counters of the group's operations, used by the thread that issues them */
  int64_t collective_seq = 0, p2p_seq = 0;
};

// What an operation records of itself (beside its tensors' sizes and dtypes).
struct flight_op {
  const char *kind = nullptr; /* PyTorch's name (flight_kind), a literal */
  int rank = 0, peer = -1;    /* a send's or receive's, in the group (-1: any source) */
  int64_t collective_seq = 0, p2p_seq = 0, op_id = 0;
  bool is_p2p = false;
  int64_t timeout_ms = 0;
};

class flight_recorder {
 public:
  // The process's recorder (never freed: the watchdog dumps from a thread
  // that may outlive everything else).
  static flight_recorder &get();

  bool enabled() const { return capacity_ > 0; }
  size_t capacity() const { return capacity_; }

  // A group of this process; this_rank is this process's global rank, the
  // number in the dump's file name.
  std::shared_ptr<flight_group> add_group(const std::string &name, const std::string &desc,
                                          std::vector<int64_t> ranks, int this_rank);

  // Records op (state scheduled); its id, or -1 when the recorder is off.
  int64_t record(const std::shared_ptr<flight_group> &g, const flight_op &op,
                 const std::vector<at::Tensor> &inputs, const std::vector<at::Tensor> &outputs);
  // The operations of ids start to run, or are done (ok: completed; else
  // they failed and stay started). Entries the ring has dropped are skipped.
  void started(const std::vector<int64_t> &ids);
  void completed(const std::vector<int64_t> &ids, bool ok, float duration_ms);

  // The dump as pickled bytes.
  std::string pickled();
  // Writes the dump to prefix (or the configured prefix when empty) plus
  // this process's global rank, through a temporary file renamed into
  // place; the path written. Throws on an I/O error.
  std::string dump(const std::string &prefix = std::string());
  // dump() for the watchdog: reports the path or the failure on stderr,
  // never throws.
  void dump_quietly(const char *why);

  // The prefix of the dump's files.
  std::string prefix() const;

 private:
  flight_recorder();
  struct entry;
  void set_state(const std::vector<int64_t> &ids, int state, bool ok, float duration_ms);
  size_t capacity_ = 0;
  std::mutex mu_;
  std::vector<entry> ring_;
  int64_t next_id_ = 0;
  int rank_ = -1;
  std::vector<std::shared_ptr<flight_group>> groups_;
};

// weft's name of an operation (submit()'s) as PyTorch's analyzer knows it,
// and whether its inputs are its outputs (an in-place collective); nullptr
// for one the analyzer has no name for (not recorded).
const char *flight_kind(const char *name, bool *inplace);

}  // namespace torch_weft
