// torch_weft: what the backend does through the group's c10d Store rather
// than weft (weft_backend.h): Gloo's monitored barrier, and receives from any
// source, whose senders weft cannot be asked for.
#include "weft_backend.h"

#include <c10/util/StringUtil.h>

#include <algorithm>

namespace torch_weft {

namespace {

[[noreturn]] void throw_backend_error(const std::string &what) {
  C10_THROW_ERROR(DistBackendError, what);
}

}  // namespace

// --- receives from any source ----------------------------------------------

p2p_announcer::p2p_announcer(c10::intrusive_ptr<c10d::Store> store, int rank)
    : store_(std::move(store)), rank_(rank), thread_([this] { loop(); }) {}

p2p_announcer::~p2p_announcer() {
  {
    std::lock_guard<std::mutex> lk(mu_);
    stop_ = true;
    cv_.notify_all();
  }
  thread_.join();
}

std::string p2p_announcer::key(int dst, int src) {
  return c10::str("weft_p2p/", dst, "/", src);
}

void p2p_announcer::add(int dst) {
  std::lock_guard<std::mutex> lk(mu_);
  pending_[dst]++;
  cv_.notify_all();
}

void p2p_announcer::loop() {
  for (;;) {
    std::map<int, int64_t> batch;
    {
      std::unique_lock<std::mutex> lk(mu_);
      cv_.wait(lk, [this] { return stop_ || !pending_.empty(); });
      if (pending_.empty()) return; /* stopped, nothing left */
      batch.swap(pending_);
    }
    for (const auto &[dst, count] : batch) {
      try {
        store_->add(key(dst, rank_), count);
      } catch (const std::exception &e) {
        // the store is gone (the job ends): a receive from any source
        // waiting for this count fails on its own timeout
        TORCH_WARN_ONCE("weft: could not count a send in the store: ", e.what());
      }
    }
  }
}

void WeftBackend::announce_send(int dst) {
  if (!store_) return;
  if (!announcer_) announcer_ = std::make_unique<p2p_announcer>(store_, rank_);
  announcer_->add(dst);
}

c10::intrusive_ptr<c10d::Work> WeftBackend::recvAnysource(std::vector<at::Tensor> &tensors,
                                                          int) {
  at::Tensor t = single(tensors, "recv from any source");
  TORCH_CHECK(device_of(t) < 0,
              "weft: receiving from any source takes host tensors (name the source rank of a "
              "receive on a GPU)");
  TORCH_CHECK(!in_block(), "weft: receiving from any source inside a coalescing block");
  TORCH_CHECK(store_, "weft: receiving from any source needs the group's store");
  auto source = std::make_shared<std::atomic<int>>(-1);
  const bool own = !gpu_fake_on(); /* as send's */
  op_step s = inplace_step(t, [this, source, own](const at::Tensor &buf) {
    // the senders' counts against what this rank has received from each;
    // every receive issued before this one has been issued (in order)
    const auto deadline = deadline_after(timeout());
    auto pause = std::chrono::microseconds(50);
    int from = -1;
    for (int turn = 0; from < 0; turn++) {
      for (int i = 1; i < size_ && from < 0; i++) {
        const int p = (rank_ + i) % size_;
        if (store_->add(p2p_announcer::key(rank_, p), 0) > received_[p]) from = p;
      }
      if (from >= 0) break;
      {
        // an abort, or the backend's revoke, ends the wait for a sender
        std::lock_guard<std::mutex> lk(queue_->mu);
        if (queue_->aborted || queue_->revoked)
          throw_backend_error(c10::str("weft: recv from any source on rank ", rank_, " of ",
                                       size_, ": the process group was ",
                                       queue_->aborted ? "aborted" : "revoked",
                                       " while it waited for a sender"));
      }
      if (std::chrono::steady_clock::now() >= deadline)
        throw_backend_error(c10::str("weft: recv from any source on rank ", rank_, " of ",
                                     size_, ": no rank sent to it within the timeout of ",
                                     timeout().count(), " ms"));
      std::this_thread::sleep_for(pause);
      pause = std::min(pause * 2, std::chrono::microseconds(20000));
    }
    received_[from]++;
    *source = from;
    flat_buf b = bytes_of(buf);
    return weftRecv(b.ptr, b.count, b.dtype, from, own ? pcomm_ : comm_, stream_);
  });
  s.p2p = own;
  // a task of its own, after the sends and receives held before it: it
  // waits for a sender, which must not hold up a group of other operations
  const numbered num = number("recv_anysource", -1, {}, {t}, false);
  auto work = make_work(c10d::OpType::RECVANYSOURCE, "recv_anysource", {t});
  work->add_flight(num.flight_id);
  work->set_source(source);
  watch(work, "recv_anysource", num.seq);
  enqueue(task{"recv from any source", {std::move(s)}, {work}, -1, -1, {}, {}});
  return work;
}

// --- monitored barrier --------------------------------------------------------

void WeftBackend::monitoredBarrier(const c10d::BarrierOptions &opts, bool wait_all_ranks) {
  TORCH_CHECK(store_, "weft: monitoredBarrier needs the group's store");
  const std::chrono::milliseconds timeout =
      opts.timeout == c10d::kUnsetTimeout ? this->timeout() : opts.timeout;
  const uint64_t n = ++monitored_seq_;
  const std::string base = c10::str("weft_monitored_barrier/", n, "/");
  const std::string answer_key = base + "answer";
  const std::string ok = "ok";
  if (rank_ != 0) {
    // only rank 0 enforces the timeout (as Gloo's): the others wait for its
    // answer within the group's timeout
    std::string what;
    try {
      store_->set(base + std::to_string(rank_), std::vector<uint8_t>{1});
      store_->wait({answer_key}, this->timeout());
      std::vector<uint8_t> answer = store_->get(answer_key);
      if (std::string(answer.begin(), answer.end()) == ok) return;
      what = c10::str("rank 0 reported: ", std::string(answer.begin(), answer.end()));
    } catch (const std::exception &e) {
      what = e.what();
    }
    throw_backend_error(c10::str(
        "Rank ", rank_, " successfully reached monitoredBarrier, but received errors while ",
        "waiting for send/recv from rank 0. Please check rank 0 logs for faulty rank.\n",
        " Original exception: \n", what));
  }
  const auto start = std::chrono::steady_clock::now();
  auto fail = [&](const std::string &error) {
    try {
      store_->set(answer_key, std::vector<uint8_t>(error.begin(), error.end()));
    } catch (const std::exception &) {
      // the others then fail on their own timeout
    }
    throw_backend_error(error);
  };
  std::vector<int> passed, failed;
  for (int r = 1; r < size_; r++) {
    // with wait_all_ranks every rank gets the whole timeout, else what is
    // left of it
    auto left = timeout;
    if (!wait_all_ranks) {
      left = timeout - std::chrono::duration_cast<std::chrono::milliseconds>(
                           std::chrono::steady_clock::now() - start);
      if (left.count() <= 0)
        fail(c10::str("[Rank 0]: Rank 0 timed out in monitoredBarrier after ", timeout.count(),
                      " ms\n",
                      passed.empty() ? std::string("No ranks successfully processed in "
                                                   "monitoredBarrier.")
                                     : c10::str("Successfully processed ranks: ",
                                                c10::Join(", ", passed))));
    }
    try {
      store_->wait({base + std::to_string(r)}, left);
      passed.push_back(r);
    } catch (const std::exception &e) {
      if (!wait_all_ranks)
        fail(c10::str("[Rank 0]: Rank ", r, " failed to pass monitoredBarrier in ",
                      timeout.count(), " ms\n Original exception: \n", e.what()));
      failed.push_back(r);
    }
  }
  if (!failed.empty())
    fail(c10::str("[Rank 0]: Ranks ", c10::Join(", ", failed),
                  " failed to pass monitoredBarrier in ", timeout.count(), " ms"));
  store_->set(answer_key, std::vector<uint8_t>(ok.begin(), ok.end()));
  // every rank has passed the barrier before this one: its keys can go
  try {
    for (int r = 1; r < size_; r++) store_->deleteKey(base + std::to_string(r));
    if (n > 1) store_->deleteKey(c10::str("weft_monitored_barrier/", n - 1, "/answer"));
  } catch (const std::exception &) {
    // a store without deleteKey keeps them
  }
}

}  // namespace torch_weft
