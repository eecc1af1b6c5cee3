// torch_weft: the backend's operations (weft_backend.h): each checks its
// tensors, builds the weft calls as steps and submits them.
#include "weft_backend.h"

#include "weft_cuda.h"

#include <optional>

namespace torch_weft {

namespace {

// The list as one flat tensor without a copy: a view of their storage when
// they are contiguous and lie one after another in it; else undefined.
at::Tensor adjacent_view(const std::vector<at::Tensor> &list) {
  const at::Tensor &first = list[0];
  int64_t total = 0;
  for (const auto &t : list) {
    if (!t.is_contiguous() || t.scalar_type() != first.scalar_type() ||
        t.storage().unsafeGetStorageImpl() != first.storage().unsafeGetStorageImpl() ||
        t.storage_offset() != first.storage_offset() + total)
      return at::Tensor();
    total += t.numel();
  }
  return at::empty({0}, first.options()).set_(first.storage(), first.storage_offset(), {total}, {1});
}

std::vector<at::Tensor> flat_parts(const std::vector<at::Tensor> &list) {
  std::vector<at::Tensor> parts;
  for (const auto &t : list) parts.push_back(t.reshape({-1}));
  return parts;
}

}  // namespace

run_input::run_input(const std::vector<at::Tensor> &l, const at::Tensor &writes, int own) {
  if (!l.empty()) src = adjacent_view(l);
  const bool shared = src.defined() && writes.defined() &&
                      writes.storage().unsafeGetStorageImpl() == src.storage().unsafeGetStorageImpl();
  if (shared && !(writes.is_contiguous() && writes.data_ptr() == l[own].data_ptr() &&
                  writes.numel() == l[own].numel()))
    src = at::Tensor();
  if (!src.defined()) list = l;
}

const at::Tensor &run_input::get() const {
  if (!made->defined()) *made = list.empty() ? src.contiguous() : at::cat(flat_parts(list));
  return *made;
}

void run_input::copy_to(const at::Tensor &dst) const {
  if (list.empty()) {
    dst.view(src.sizes()).copy_(src);
    return;
  }
  at::Tensor flat = dst.view({-1});
  at::cat_out(flat, flat_parts(list));
}

int64_t run_input::numel() const {
  int64_t n = src.defined() ? src.numel() : 0;
  for (const auto &t : list) n += t.numel();
  return n;
}

c10::intrusive_ptr<c10d::Work> WeftBackend::broadcast(std::vector<at::Tensor> &tensors,
                                                      const c10d::BroadcastOptions &opts) {
  at::Tensor t = single(tensors, "broadcast");
  check_root(opts.rootRank, "broadcast");
  int root = (int)opts.rootRank;
  op_step s = inplace_step(t, [this, root](const at::Tensor &buf) {
    flat_buf b = bytes_of(buf);
    return weftBroadcast(b.ptr, b.ptr, b.count, b.dtype, root, comm_, stream_);
  });
  return submit("broadcast", c10d::OpType::BROADCAST, {s}, {t}, opts.asyncOp);
}

c10::intrusive_ptr<c10d::Work> WeftBackend::allreduce(std::vector<at::Tensor> &tensors,
                                                      const c10d::AllreduceOptions &opts) {
  if (tensors.size() == 1 && tensors[0].defined() && tensors[0].is_sparse()) {
    at::Tensor t = tensors[0];
    TORCH_CHECK(t.device().is_cpu(), "weft: allreduce: sparse tensors on the host only");
    TORCH_CHECK(opts.reduceOp == c10d::ReduceOp::SUM,
                "weft: allreduce: sparse tensors take SUM only");
    TORCH_CHECK(!in_block(), "weft: allreduce of a sparse tensor inside a coalescing block");
    return submit("allreduce", c10d::OpType::ALLREDUCE, {sparse_allreduce_step(t)}, {t},
                  opts.asyncOp);
  }
  at::Tensor t = single(tensors, "allreduce");
  return submit("allreduce", c10d::OpType::ALLREDUCE,
                {allreduce_step(t, opts.reduceOp, "allreduce")}, {t}, opts.asyncOp);
}

c10::intrusive_ptr<c10d::Work> WeftBackend::allreduce_coalesced(
    std::vector<at::Tensor> &tensors, const c10d::AllreduceCoalescedOptions &opts) {
  std::vector<op_step> steps;
  for (auto &t : tensors) {
    check_tensor(t, "allreduce_coalesced");
    steps.push_back(allreduce_step(t, opts.reduceOp, "allreduce_coalesced"));
  }
  return submit("allreduce_coalesced", c10d::OpType::ALLREDUCE_COALESCED, std::move(steps), tensors,
                opts.asyncOp);
}

c10::intrusive_ptr<c10d::Work> WeftBackend::reduce(std::vector<at::Tensor> &tensors,
                                                   const c10d::ReduceOptions &opts) {
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
    // the root's result of the all-reduce is the reduction; others keep
    // theirs. t is read when the operation runs
    at::Tensor work = at::empty_like(t, at::MemoryFormat::Contiguous);
    s = allreduce_step(work, opts.reduceOp, "reduce");
    s.held.push_back(work);
    s.issue = [issue = s.issue, work, t]() {
      work.copy_(t);
      return issue ? issue() : weftSuccess; /* one rank's pre-multiply: none */
    };
    auto fin = s.finish;
    bool is_root = rank_ == root;
    s.finish = [fin, t, work, is_root]() {
      if (fin) fin();
      if (is_root) t.copy_(work);
    };
  }
  return submit("reduce", c10d::OpType::REDUCE, {s}, {t}, opts.asyncOp);
}

c10::intrusive_ptr<c10d::Work> WeftBackend::allgather(std::vector<std::vector<at::Tensor>> &outputs,
                                                      std::vector<at::Tensor> &inputs,
                                                      const c10d::AllgatherOptions &opts) {
  at::Tensor in = single(inputs, "allgather");
  TORCH_CHECK(outputs.size() == 1, "weft: allgather takes one list of outputs");
  if (!same_numel(outputs[0], in)) {
    // tensors of several sizes (NCCL's allgather_v): a broadcast from each rank
    check_list(outputs[0], in, "allgather", false);
    TORCH_CHECK(outputs[0][rank_].numel() == in.numel(), "weft: allgather: the input has ",
                in.numel(), " elements and this rank's output ", outputs[0][rank_].numel());
    std::vector<op_step> steps;
    run_input src{in};
    for (int r = 0; r < size_; r++) {
      const bool mine = r == rank_;
      steps.push_back(inplace_step(outputs[0][r], [this, src, r, mine](const at::Tensor &buf) {
        flat_buf b = bytes_of(buf);
        return weftBroadcast(mine ? src.get().data_ptr() : nullptr, b.ptr, b.count, b.dtype, r,
                             comm_, stream_);
      }));
    }
    return submit("allgather", c10d::OpType::ALLGATHER, std::move(steps), outputs[0],
                  opts.asyncOp, {in});
  }
  check_list(outputs[0], in, "allgather");
  return submit("allgather", c10d::OpType::ALLGATHER, {allgather_list_step(outputs[0], in)},
                outputs[0], opts.asyncOp, {in});
}

c10::intrusive_ptr<c10d::Work> WeftBackend::allgather_coalesced(
    std::vector<std::vector<at::Tensor>> &outputs, std::vector<at::Tensor> &inputs,
    const c10d::AllgatherOptions &opts) {
  // as Gloo's: one list per rank, each with one tensor per input
  TORCH_CHECK((int)outputs.size() == size_, "weft: allgather_coalesced takes ", size_,
              " output lists (one per rank), got ", outputs.size());
  for (int r = 0; r < size_; r++)
    TORCH_CHECK(outputs[r].size() == inputs.size(), "weft: allgather_coalesced: output list ",
                r, " has ", outputs[r].size(), " tensors for ", inputs.size(), " inputs");
  std::vector<op_step> steps;
  std::vector<at::Tensor> flat_outputs;
  for (size_t i = 0; i < inputs.size(); i++) {
    check_tensor(inputs[i], "allgather_coalesced");
    std::vector<at::Tensor> per_rank;
    for (int r = 0; r < size_; r++) per_rank.push_back(outputs[r][i]);
    check_list(per_rank, inputs[i], "allgather_coalesced");
    steps.push_back(allgather_list_step(per_rank, inputs[i]));
  }
  for (auto &list : outputs)
    for (auto &o : list) flat_outputs.push_back(o);
  return submit("allgather_coalesced", c10d::OpType::ALLGATHER_COALESCED, std::move(steps),
                flat_outputs, opts.asyncOp, inputs);
}

c10::intrusive_ptr<c10d::Work> WeftBackend::_allgather_base(at::Tensor &output, at::Tensor &input,
                                                            const c10d::AllgatherOptions &opts) {
  return submit("all_gather_into_tensor", c10d::OpType::_ALLGATHER_BASE,
                {allgather_base_step(output, input)}, {output}, opts.asyncOp, {input});
}

c10::intrusive_ptr<c10d::Work> WeftBackend::allgather_into_tensor_coalesced(
    std::vector<at::Tensor> &outputs, std::vector<at::Tensor> &inputs,
    const c10d::AllgatherOptions &opts) {
  TORCH_CHECK(outputs.size() == inputs.size(),
              "weft: allgather_into_tensor_coalesced: ", outputs.size(), " outputs for ",
              inputs.size(), " inputs");
  std::vector<op_step> steps;
  for (size_t i = 0; i < inputs.size(); i++)
    steps.push_back(allgather_base_step(outputs[i], inputs[i]));
  return submit("allgather_into_tensor_coalesced",
                coalesced_op_types<c10d::OpType>::allgather_into_tensor,
                std::move(steps), outputs, opts.asyncOp, inputs);
}

c10::intrusive_ptr<c10d::Work> WeftBackend::reduce_scatter(
    std::vector<at::Tensor> &outputs, std::vector<std::vector<at::Tensor>> &inputs,
    const c10d::ReduceScatterOptions &opts) {
  at::Tensor out = single(outputs, "reduce_scatter");
  TORCH_CHECK(inputs.size() == 1, "weft: reduce_scatter takes one list of inputs");
  if (!same_numel(inputs[0], out)) {
    // tensors of several sizes (NCCL's reduce_scatter_v): a reduce to each rank
    check_list(inputs[0], out, "reduce_scatter", false);
    TORCH_CHECK(inputs[0][rank_].numel() == out.numel(), "weft: reduce_scatter: the output has ",
                out.numel(), " elements and this rank's input ", inputs[0][rank_].numel());
    red_plan p = red_plan_of(opts.reduceOp, out.scalar_type(), "reduce_scatter");
    TORCH_CHECK(p.kind == red_plan::native, "weft: reduce_scatter of tensors of several sizes ",
                "takes SUM, AVG, PRODUCT, MIN or MAX");
    std::vector<op_step> steps;
    for (int r = 0; r < size_; r++) {
      run_input src{inputs[0][r]};
      const weftRedOp_t op = p.op;
      if (r == rank_) {
        steps.push_back(inplace_step(out, [this, src, r, op](const at::Tensor &buf) {
          flat_buf in = elems_of(src.get(), "reduce_scatter");
          flat_buf b = elems_of(buf, "reduce_scatter");
          return weftReduce(in.ptr, b.ptr, b.count, b.dtype, op, r, comm_, stream_);
        }));
        continue;
      }
      op_step s;
      s.issue = [this, src, r, op]() {
        flat_buf in = elems_of(src.get(), "reduce_scatter");
        return weftReduce(in.ptr, nullptr, in.count, in.dtype, op, r, comm_, stream_);
      };
      steps.push_back(std::move(s));
    }
    return submit("reduce_scatter", c10d::OpType::REDUCE_SCATTER, std::move(steps), {out},
                  opts.asyncOp, inputs[0]);
  }
  check_list(inputs[0], out, "reduce_scatter");
  return submit("reduce_scatter", c10d::OpType::REDUCE_SCATTER,
                {reduce_scatter_step(out, run_input(inputs[0], out, rank_), opts.reduceOp)}, {out},
                opts.asyncOp, inputs[0]);
}

c10::intrusive_ptr<c10d::Work> WeftBackend::_reduce_scatter_base(
    at::Tensor &output, at::Tensor &input, const c10d::ReduceScatterOptions &opts) {
  check_tensor(output, "reduce_scatter_tensor");
  check_tensor(input, "reduce_scatter_tensor");
  return submit("reduce_scatter_tensor", c10d::OpType::_REDUCE_SCATTER_BASE,
                {reduce_scatter_step(output, run_input(input), opts.reduceOp)}, {output},
                opts.asyncOp, {input});
}

c10::intrusive_ptr<c10d::Work> WeftBackend::reduce_scatter_tensor_coalesced(
    std::vector<at::Tensor> &outputs, std::vector<at::Tensor> &inputs,
    const c10d::ReduceScatterOptions &opts) {
  TORCH_CHECK(outputs.size() == inputs.size(),
              "weft: reduce_scatter_tensor_coalesced: ", outputs.size(), " outputs for ",
              inputs.size(), " inputs");
  std::vector<op_step> steps;
  for (size_t i = 0; i < inputs.size(); i++) {
    check_tensor(outputs[i], "reduce_scatter_tensor_coalesced");
    check_tensor(inputs[i], "reduce_scatter_tensor_coalesced");
    steps.push_back(reduce_scatter_step(outputs[i], run_input(inputs[i]), opts.reduceOp));
  }
  return submit("reduce_scatter_tensor_coalesced",
                coalesced_op_types<c10d::OpType>::reduce_scatter_tensor,
                std::move(steps), outputs, opts.asyncOp, inputs);
}

c10::intrusive_ptr<c10d::Work> WeftBackend::alltoall_base(at::Tensor &output, at::Tensor &input,
                                                          std::vector<int64_t> &output_splits,
                                                          std::vector<int64_t> &input_splits,
                                                          const c10d::AllToAllOptions &opts) {
  check_tensor(output, "all_to_all_single");
  check_tensor(input, "all_to_all_single");
  TORCH_CHECK(input.scalar_type() == output.scalar_type(),
              "weft: all_to_all_single: input and output dtypes differ");
  check_device(input, device_of(output), "all_to_all_single");
  // without splits every rank's block is the same size on both sides: the
  // output holds exactly what the input sends (a smaller one would be
  // written past its end)
  TORCH_CHECK(!input_splits.empty() || !output_splits.empty() ||
                  input.numel() == output.numel(),
              "weft: all_to_all_single without splits: the input has ", input.numel(),
              " elements and the output ", output.numel(), "; they must be equal");
  std::vector<int64_t> in_off, in_len, out_off, out_len;
  split_layout(input, input_splits, "input", &in_off, &in_len);
  split_layout(output, output_splits, "output", &out_off, &out_len);
  run_input in{input};
  bool staged = !output.is_contiguous();
  at::Tensor out = staged ? at::empty_like(output, at::MemoryFormat::Contiguous) : output;
  size_t esize = (size_t)input.element_size();
  op_step s;
  bool even = input_splits.empty() && output_splits.empty();
  s.issue = [this, in, out, in_off, in_len, out_off, out_len, esize, even]() {
    if (even)
      return weftAlltoAll(in.get().data_ptr(), out.data_ptr(), (size_t)in_len[0] * esize,
                          weftUint8, comm_, stream_);
    // a group of sends and receives; empty blocks are skipped on both sides
    char *src = (char *)in.get().data_ptr();
    char *dst = (char *)out.data_ptr();
    weftResult_t res = weftGroupStart();
    if (res != weftSuccess) return res;
    for (int p = 0; p < size_ && res == weftSuccess; p++) {
      if (in_len[p] > 0)
        res = weftSend(src + in_off[p] * esize, (size_t)in_len[p] * esize, weftUint8, p, comm_,
                       stream_);
      if (res == weftSuccess && out_len[p] > 0)
        res = weftRecv(dst + out_off[p] * esize, (size_t)out_len[p] * esize, weftUint8, p, comm_,
                       stream_);
    }
    weftResult_t end = weftGroupEnd();
    return res != weftSuccess ? res : end;
  };
  if (staged) {
    s.finish = [output, out]() { output.copy_(out); };
    s.held.push_back(out);
  }
  return submit("all_to_all_single", c10d::OpType::ALLTOALL_BASE, {s}, {output}, opts.asyncOp,
                {input});
}

c10::intrusive_ptr<c10d::Work> WeftBackend::alltoall(std::vector<at::Tensor> &outputs,
                                                     std::vector<at::Tensor> &inputs,
                                                     const c10d::AllToAllOptions &opts) {
  TORCH_CHECK((int)outputs.size() == size_ && (int)inputs.size() == size_,
              "weft: all_to_all takes ", size_, " inputs and outputs, got ", inputs.size(), " and ",
              outputs.size());
  std::vector<run_input> ins;
  std::vector<at::Tensor> outs;
  for (int p = 0; p < size_; p++) {
    check_tensor(inputs[p], "all_to_all");
    check_tensor(outputs[p], "all_to_all");
    check_device(inputs[p], device_of(outputs[0]), "all_to_all");
    ins.emplace_back(inputs[p]);
    outs.push_back(outputs[p].is_contiguous()
                       ? outputs[p]
                       : at::empty_like(outputs[p], at::MemoryFormat::Contiguous));
  }
  op_step s;
  s.issue = [this, ins, outs]() {
    weftResult_t res = weftGroupStart();
    if (res != weftSuccess) return res;
    for (int p = 0; p < size_ && res == weftSuccess; p++) {
      const at::Tensor &in = ins[p].get();
      if (in.nbytes() > 0) res = weftSend(in.data_ptr(), in.nbytes(), weftUint8, p, comm_, stream_);
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
  for (size_t p = 0; p < outs.size(); p++)
    if (!outs[p].is_same(outputs[p])) s.held.push_back(outs[p]);
  return submit("all_to_all", c10d::OpType::ALLTOALL, {s}, outputs, opts.asyncOp, inputs);
}

c10::intrusive_ptr<c10d::Work> WeftBackend::gather(std::vector<std::vector<at::Tensor>> &outputs,
                                                   std::vector<at::Tensor> &inputs,
                                                   const c10d::GatherOptions &opts) {
  run_input in{single(inputs, "gather")};
  check_root(opts.rootRank, "gather");
  int root = (int)opts.rootRank;
  bool is_root = rank_ == root;
  std::vector<at::Tensor> outs;
  if (is_root) {
    TORCH_CHECK(outputs.size() == 1, "weft: gather takes one list of outputs on the root");
    check_list(outputs[0], in.src, "gather");
    outs = outputs[0];
  } else {
    TORCH_CHECK(outputs.empty() || outputs[0].empty(),
                "weft: gather: only the root passes outputs");
  }
  at::Tensor stage =
      is_root ? at::empty({(int64_t)size_ * in.src.numel()}, in.src.options()) : at::Tensor();
  op_step s;
  s.held.push_back(stage);
  s.issue = [this, in, stage, root]() {
    flat_buf b = bytes_of(in.get());
    return weftGather(b.ptr, stage.defined() ? stage.data_ptr() : nullptr, b.count, b.dtype, root,
                      comm_, stream_);
  };
  if (is_root)
    s.finish = [outs, stage]() {
      auto parts = stage.chunk((int64_t)outs.size());
      for (size_t r = 0; r < outs.size(); r++) outs[r].copy_(parts[r].view_as(outs[r]));
    };
  return submit("gather", c10d::OpType::GATHER, {s}, outs, opts.asyncOp, inputs);
}

c10::intrusive_ptr<c10d::Work> WeftBackend::scatter(std::vector<at::Tensor> &outputs,
                                                    std::vector<std::vector<at::Tensor>> &inputs,
                                                    const c10d::ScatterOptions &opts) {
  at::Tensor out = single(outputs, "scatter");
  check_root(opts.rootRank, "scatter");
  int root = (int)opts.rootRank;
  bool is_root = rank_ == root;
  run_input stage{at::Tensor()};
  if (is_root) {
    TORCH_CHECK(inputs.size() == 1, "weft: scatter takes one list of inputs on the root");
    check_list(inputs[0], out, "scatter");
    stage = run_input(inputs[0], out, rank_);
  } else {
    TORCH_CHECK(inputs.empty() || inputs[0].empty(), "weft: scatter: only the root passes inputs");
  }
  op_step s = inplace_step(out, [this, stage, root](const at::Tensor &buf) {
    flat_buf b = bytes_of(buf);
    return weftScatter(stage.defined() ? stage.get().data_ptr() : nullptr, b.ptr, b.count, b.dtype,
                       root, comm_, stream_);
  });
  return submit("scatter", c10d::OpType::SCATTER, {s}, {out}, opts.asyncOp,
                is_root ? inputs[0] : std::vector<at::Tensor>{});
}

c10::intrusive_ptr<c10d::Work> WeftBackend::send(std::vector<at::Tensor> &tensors, int dst, int) {
  at::Tensor t = single(tensors, "send");
  check_peer(dst, "send");
  run_input in{t};
  op_step s;
  const bool host = device_of(t) < 0;
  const bool own = host && !gpu_fake_on(); /* on pcomm_ (the fake CUDA layer's: comm_) */
  s.issue = [this, in, dst, host, own]() {
    flat_buf b = bytes_of(in.get());
    if (host && !simulating()) announce_send(dst); /* for a receive from any source */
    return weftSend(b.ptr, b.count, b.dtype, dst, own ? pcomm_ : comm_, stream_);
  };
  s.p2p = own;
  return submit_p2p("send", c10d::OpType::SEND, s, {t}, dst);
}

c10::intrusive_ptr<c10d::Work> WeftBackend::recv(std::vector<at::Tensor> &tensors, int src, int) {
  at::Tensor t = single(tensors, "recv");
  check_peer(src, "recv");
  const bool host = device_of(t) < 0;
  const bool own = host && !gpu_fake_on(); /* as send's */
  op_step s = inplace_step(t, [this, src, host, own](const at::Tensor &buf) {
    flat_buf b = bytes_of(buf);
    if (host && !simulating()) received_[src]++; /* what a receive from any source compares */
    return weftRecv(b.ptr, b.count, b.dtype, src, own ? pcomm_ : comm_, stream_);
  });
  s.p2p = own;
  return submit_p2p("recv", c10d::OpType::RECV, s, {t}, src);
}

c10::intrusive_ptr<c10d::Work> WeftBackend::barrier(const c10d::BarrierOptions &opts) {
  at::Tensor t = at::zeros({1}, at::kByte);
  op_step s;
  s.issue = [this, t]() {
    return weftAllReduce(t.data_ptr(), t.data_ptr(), 1, weftUint8, weftSum, comm_, stream_);
  };
  // on a CUDA device (torch names one from device_ids or the group's bound
  // device), as NCCL's: once every rank has joined, what this rank queued
  // on the caller's current stream (and on the group's stream) is done when
  // the barrier is passed.
  // Not before joining: a send queued there may wait for a peer's receive
  // that the peer makes after its barrier.
  if (cuda_built() && opts.device.has_value() && opts.device->is_cuda()) {
    const int device = opts.device->has_index() ? opts.device->index() : -1;
    void *stream = gpu_current_stream(device);
    // and the operations issued before it on the group's stream of it
    void *comm = device >= 0 ? streams_.stream_of(gpu_real_layer(), device) : nullptr;
    s.finish = [device, stream, comm]() {
      gpu_stream_sync(device, stream);
      if (comm != nullptr && comm != stream) gpu_stream_sync(device, comm);
    };
  }
  return submit("barrier", c10d::OpType::BARRIER, {s}, {}, opts.asyncOp);
}

void WeftBackend::startCoalescing() {
  TORCH_CHECK(!in_block(), "weft: startCoalescing called twice");
  std::thread::id none;
  TORCH_CHECK(block_owner_.compare_exchange_strong(none, std::this_thread::get_id()),
              "weft: startCoalescing while another thread of this process has a coalescing block "
              "open on the group (a group takes one block at a time)");
  try {
    coalesced_ = task{"coalesced", {}, {}};
    coalesced_work_ = make_work(c10d::OpType::COALESCED, "weft:coalesced", {});
    coalesced_work_->set_block_open(true);
    block_coll_ = block_p2p_ = false;
    coalesced_.works.push_back(coalesced_work_);
  } catch (...) {
    block_owner_.store(std::thread::id()); /* no block opened */
    throw;
  }
}

c10::intrusive_ptr<c10d::Work> WeftBackend::endCoalescing() {
  TORCH_CHECK(in_block(), "weft: endCoalescing without startCoalescing");
  struct closer {
    std::atomic<std::thread::id> &owner;
    ~closer() { owner.store(std::thread::id()); } /* the block's state is left as found */
  } close{block_owner_};
  auto work = coalesced_work_;
  work->set_block_open(false);
  coalesced_work_.reset();
  // a block recorded into a CUDA graph being captured: followed by neither
  // the watchdog nor the flight recorder, as its operations (submit)
  const bool captured = coalesced_.sdev >= 0 && capture_open(coalesced_.sdev);
  if (!coalesced_.steps.empty() && !captured) watch(work, "coalesced", block_seq_);
  if ((block_coll_ || block_p2p_) && !captured) {
    // the block's end, as PyTorch's recorder writes it: an entry of its own
    // under the block's sequence numbers
    flight_op op;
    op.kind = "coalesced";
    op.collective_seq = block_coll_seq_; /* the block's, whatever other threads took since */
    op.p2p_seq = block_p2p_seq_;
    op.op_id = (int64_t)block_seq_;
    op.is_p2p = !block_coll_;
    op.timeout_ms = timeout().count();
    work->add_flight(flight_recorder::get().record(flight_, op, {}, {}));
  }
  // a block of sends and receives on host memory alone (batch_isend_irecv)
  // goes to the host stream as one group, as a send does
  bool p2p = !coalesced_.steps.empty() && coalesced_.sdev < 0;
  for (const auto &s : coalesced_.steps) p2p = p2p && s.p2p;
  coalesced_.p2p = p2p;
  if (p2p)
    issue_p2p(std::move(coalesced_));
  else
    enqueue(std::move(coalesced_));
  coalesced_ = task{"coalesced", {}, {}};
  return work;
}

void WeftBackend::check_tensor(const at::Tensor &t, const char *opname) const {
  TORCH_CHECK(t.defined(), "weft: ", opname, ": undefined tensor");
  TORCH_CHECK(t.device().is_cpu() || (t.device().is_cuda() && cuda_built()), "weft: ", opname,
              ": tensors on ", t.device(), " are not supported by this build of torch_weft (",
              cuda_built() ? "CPU and CUDA" : "CPU", " tensors only)");
  TORCH_CHECK(!t.is_sparse(), "weft: ", opname, ": sparse tensors are not supported");
}

void WeftBackend::check_device(const at::Tensor &t, int device, const char *opname) {
  TORCH_CHECK(device_of(t) == device, "weft: ", opname, ": tensors on ", t.device(), " and on ",
              device < 0 ? std::string("cpu") : "cuda:" + std::to_string(device),
              " in one operation");
}

at::Tensor WeftBackend::single(std::vector<at::Tensor> &tensors, const char *opname) const {
  TORCH_CHECK(tensors.size() == 1, "weft: ", opname, " takes one tensor per rank, got ",
              tensors.size());
  check_tensor(tensors[0], opname);
  return tensors[0];
}

void WeftBackend::check_root(int64_t root, const char *opname) const {
  TORCH_CHECK(root >= 0 && root < size_, "weft: ", opname, ": root ", root,
              " is not a rank of this group of ", size_);
}

void WeftBackend::check_peer(int peer, const char *opname) const {
  TORCH_CHECK(peer >= 0 && peer < size_, "weft: ", opname, ": peer ", peer,
              " is not a rank of this group of ", size_);
}

bool WeftBackend::same_numel(const std::vector<at::Tensor> &list, const at::Tensor &like) {
  for (auto &t : list)
    if (t.defined() && t.numel() != like.numel()) return false;
  return true;
}

void WeftBackend::check_list(const std::vector<at::Tensor> &list, const at::Tensor &like,
                             const char *opname, bool even) const {
  TORCH_CHECK((int)list.size() == size_, "weft: ", opname, " takes a list of ", size_,
              " tensors, got ", list.size());
  for (auto &t : list) {
    check_tensor(t, opname);
    check_device(t, device_of(like), opname);
    TORCH_CHECK(t.scalar_type() == like.scalar_type(), "weft: ", opname,
                ": every tensor of the list must be of ", like.scalar_type(), ", got ",
                t.scalar_type());
    TORCH_CHECK(!even || t.numel() == like.numel(),
                "weft: ", opname, ": every tensor of the list must have ", like.numel(),
                " elements of ", like.scalar_type(), ", got ", t.numel(), " of ", t.scalar_type());
  }
}

void WeftBackend::split_layout(const at::Tensor &t, const std::vector<int64_t> &splits,
                               const char *which, std::vector<int64_t> *off,
                               std::vector<int64_t> *len) {
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
  TORCH_CHECK((int)splits.size() == size_, "weft: all_to_all_single: ", splits.size(), " ", which,
              " splits for ", size_, " ranks");
  int64_t at_row = 0;
  for (int64_t s : splits) {
    TORCH_CHECK(s >= 0, "weft: all_to_all_single: negative ", which, " split ", s);
    off->push_back(at_row * row);
    len->push_back(s * row);
    at_row += s;
  }
  TORCH_CHECK(at_row == rows, "weft: all_to_all_single: the ", which, " splits add up to ", at_row,
              " rows, the tensor has ", rows);
}

op_step WeftBackend::inplace_step(const at::Tensor &t,
                                  std::function<weftResult_t(const at::Tensor &)> call) {
  op_step s;
  if (t.is_contiguous()) {
    s.issue = [call, t]() { return call(t); };
  } else {
    // the copy is made when the operation runs, not when it is queued: an
    // earlier queued operation may still write t (on a GPU both are on the
    // group's stream, in order, either way)
    run_input stage{t};
    s.issue = [call, stage]() { return call(stage.get()); };
    s.finish = [t, stage]() {
      if (stage.made->defined()) t.copy_(*stage.made);
    };
  }
  return s;
}

op_step WeftBackend::allreduce_step(const at::Tensor &t, const ReduceOp &rop, const char *opname) {
  red_plan p = red_plan_of(rop, t.scalar_type(), opname);
  if (p.kind == red_plan::bitwise) {
    // gather every rank's bits, then fold them locally
    run_input in{t};
    at::Tensor all = at::empty({(int64_t)size_, t.numel()}, t.options());
    op_step s;
    s.held.push_back(all);
    s.issue = [this, in, all]() {
      flat_buf b = bytes_of(in.get());
      return weftAllGather(b.ptr, all.data_ptr(), b.count, b.dtype, comm_, stream_);
    };
    auto bit = p.bit_op;
    s.finish = [t, all, bit]() {
      at::Tensor acc = all[0].clone();
      for (int64_t r = 1; r < all.size(0); r++) {
        if (bit == ReduceOp::BAND)
          acc.bitwise_and_(all[r]);
        else if (bit == ReduceOp::BOR)
          acc.bitwise_or_(all[r]);
        else
          acc.bitwise_xor_(all[r]);
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

op_step WeftBackend::premul_step(const at::Tensor &t, const red_plan &p, const char *opname,
                                 int64_t recvcount, const run_input &in) {
  at::ScalarType st = t.scalar_type();
  at::ScalarType scalar_type = at::isComplexType(st) ? c10::toRealValueType(st) : st;
  if (t.is_cuda() && p.tensor_factor.defined() && p.tensor_factor.device() == t.device())
    return premul_device_step(t, p.tensor_factor, scalar_type, opname, recvcount, in);
  // the factor rounded to the tensor's type, as weft multiplies by it; a
  // tensor factor is read here, on the caller's thread (one on a GPU for an
  // operation on host memory or on another GPU: a copy to the host, which
  // waits for the GPU)
  at::Tensor scalar = p.tensor_factor.defined()
                          ? p.tensor_factor.to(at::kCPU, scalar_type).reshape({1}).clone()
                          : at::full({1}, p.factor, at::TensorOptions().dtype(scalar_type));
  if (size_ == 1) {
    // one rank: the sum is this rank's input scaled, done here (weft's
    // device path refuses a pre-multiply op on one rank)
    elems_of(t, opname);
    op_step s;
    const double factor = scalar.to(at::kDouble).item<double>();
    s.finish = [t, in, factor]() {
      t.copy_(at::mul(in.defined() ? in.get().view_as(t) : t, factor));
    };
    return s;
  }
  // weft keeps the op's scalar from the call on (it could go once the call
  // returns); the step's release destroys it
  auto op = std::make_shared<std::optional<weftRedOp_t>>();
  auto body = [this, scalar, opname, recvcount, in, op](const at::Tensor &buf) {
    flat_buf b = elems_of(buf, opname);
    weftRedOp_t made;
    weftResult_t res =
        weftRedOpCreatePreMulSum(&made, scalar.data_ptr(), b.dtype, weftScalarHostImmediate, comm_);
    if (res != weftSuccess) return res;
    *op = made;
    if (recvcount < 0) return weftAllReduce(b.ptr, b.ptr, b.count, b.dtype, made, comm_, stream_);
    flat_buf src = elems_of(in.get(), opname);
    return weftReduceScatter(src.ptr, b.ptr, b.count, b.dtype, made, comm_, stream_);
  };
  op_step s = inplace_step(t, body);
  s.release = [this, op]() {
    if (op->has_value()) weftRedOpDestroy(**op, comm_);
    op->reset();
  };
  return s;
}

op_step WeftBackend::premul_device_step(const at::Tensor &t, const at::Tensor &factor,
                                        at::ScalarType scalar_type, const char *opname,
                                        int64_t recvcount, const run_input &in) {
  elems_of(t, opname);
  TORCH_CHECK(factor.numel() == 1, "weft: ", opname, ": PREMUL_SUM's factor has ",
              factor.numel(), " elements (one expected)");
  op_step s;
  if (size_ == 1) {
    // one rank: this rank's input scaled, on the communication stream (weft's
    // device path refuses a pre-multiply op on one rank)
    s.finish = [t, in, factor, scalar_type]() {
      const at::Tensor f = factor.to(scalar_type).reshape({});
      t.copy_(at::mul(in.defined() ? in.get().view_as(t) : t, f));
    };
    s.held.push_back(factor); /* the communication stream reads it, as the caller's tensors */
    return s;
  }
  // the factor rounded to the tensor's type, made when the step runs (on
  // the communication stream, before the kernels that read it; it lives as
  // long as the step), or the factor itself where it has that type: weft's
  // kernels read it when they run (weftScalarDevice, as NCCL's
  // ncclScalarDevice)
  auto scalar = std::make_shared<at::Tensor>();
  auto op = std::make_shared<std::optional<weftRedOp_t>>();
  auto body = [this, factor, scalar_type, scalar, opname, recvcount, in,
               op](const at::Tensor &buf) {
    flat_buf b = elems_of(buf, opname);
    *scalar = factor.to(scalar_type).reshape({1}).contiguous();
    weftRedOp_t made;
    weftResult_t res =
        weftRedOpCreatePreMulSum(&made, scalar->data_ptr(), b.dtype, weftScalarDevice, comm_);
    if (res != weftSuccess) return res;
    *op = made;
    if (recvcount < 0) return weftAllReduce(b.ptr, b.ptr, b.count, b.dtype, made, comm_, stream_);
    flat_buf src = elems_of(in.get(), opname);
    return weftReduceScatter(src.ptr, b.ptr, b.count, b.dtype, made, comm_, stream_);
  };
  s = inplace_step(t, body);
  s.held.push_back(factor); /* the communication stream reads it, as the caller's tensors */
  s.release = [this, op]() {
    if (op->has_value()) weftRedOpDestroy(**op, comm_);
    op->reset();
  };
  return s;
}

op_step WeftBackend::allgather_list_step(const std::vector<at::Tensor> &outs,
                                         const at::Tensor &input) {
  run_input in{input};
  at::Tensor stage = at::empty({(int64_t)size_ * input.numel()}, input.options());
  op_step s;
  s.held.push_back(stage);
  s.issue = [this, in, stage]() {
    flat_buf b = bytes_of(in.get());
    return weftAllGather(b.ptr, stage.data_ptr(), b.count, b.dtype, comm_, stream_);
  };
  s.finish = [outs, stage]() {
    auto parts = stage.chunk((int64_t)outs.size());
    for (size_t r = 0; r < outs.size(); r++) outs[r].copy_(parts[r].view_as(outs[r]));
  };
  return s;
}

op_step WeftBackend::allgather_base_step(at::Tensor &output, at::Tensor &input) {
  check_tensor(output, "all_gather_into_tensor");
  check_tensor(input, "all_gather_into_tensor");
  TORCH_CHECK(input.scalar_type() == output.scalar_type(),
              "weft: all_gather_into_tensor: input and output dtypes differ");
  check_device(input, device_of(output), "all_gather_into_tensor");
  TORCH_CHECK(output.numel() == input.numel() * size_,
              "weft: all_gather_into_tensor: ", "the output has ", output.numel(),
              " elements, expected ", size_, " x ", input.numel());
  run_input in{input};
  return inplace_step(output, [this, in](const at::Tensor &buf) {
    flat_buf b = bytes_of(in.get());
    return weftAllGather(b.ptr, buf.data_ptr(), b.count, b.dtype, comm_, stream_);
  });
}

op_step WeftBackend::sparse_allreduce_step(const at::Tensor &t) {
  // three all-gathers, one after another outside any group: each rank's
  // layout (its number of entries, sparse dimensions, dtype and sizes), then
  // indices and values padded to the largest number of entries
  constexpr int64_t kMaxDims = 16, kHead = 4 + kMaxDims;
  TORCH_CHECK(t.dim() <= kMaxDims, "weft: allreduce: a sparse tensor of ", t.dim(),
              " dimensions (at most ", kMaxDims, ")");
  op_step s;
  auto result = std::make_shared<at::Tensor>();
  s.issue = [this, t, result]() {
    at::Tensor in = t.coalesce();
    at::Tensor idx = in._indices().contiguous();
    at::Tensor val = in._values().contiguous();
    const int64_t sparse_dim = idx.size(0);
    at::Tensor head = at::full({kHead}, -1, at::kLong);
    head[0] = in._nnz();
    head[1] = sparse_dim;
    head[2] = t.dim();
    head[3] = (int64_t)t.scalar_type();
    for (int64_t d = 0; d < t.dim(); d++) head[4 + d] = t.size(d);
    at::Tensor heads = at::empty({(int64_t)size_, kHead}, at::kLong);
    weftResult_t res =
        weftAllGather(head.data_ptr(), heads.data_ptr(), kHead, weftInt64, comm_, stream_);
    if (res != weftSuccess) return res;
    // every rank sees every layout: all refuse alike before the next gathers
    for (int r = 0; r < size_; r++) {
      at::Tensor theirs = heads[r].narrow(0, 1, kHead - 1);
      if (at::equal(theirs, head.narrow(0, 1, kHead - 1))) continue;
      auto layout = [](const at::Tensor &h) {
        std::vector<int64_t> sizes;
        for (int64_t d = 0; d < h[2].item<int64_t>() && d < kMaxDims; d++)
          sizes.push_back(h[4 + d].item<int64_t>());
        return c10::str("sizes ", c10::IntArrayRef(sizes), ", ", h[1].item<int64_t>(),
                        " sparse dimensions, ",
                        c10::toString((at::ScalarType)h[3].item<int64_t>()));
      };
      TORCH_CHECK(false, "weft: allreduce: the sparse tensors' layouts differ: rank ", rank_,
                  " has ", layout(head), ", rank ", r, " has ", layout(heads[r]));
    }
    at::Tensor all_nnz = heads.select(1, 0).contiguous();
    const int64_t most = all_nnz.max().item<int64_t>();
    std::vector<int64_t> val_shape = val.sizes().vec();
    val_shape[0] = most;
    at::Tensor idx_pad = at::zeros({sparse_dim, most}, idx.options());
    at::Tensor val_pad = at::zeros(val_shape, val.options());
    idx_pad.narrow(1, 0, in._nnz()).copy_(idx);
    val_pad.narrow(0, 0, in._nnz()).copy_(val);
    // indices go as one row of [sparse_dim x most] per rank
    at::Tensor idx_t = idx_pad.t().contiguous();
    at::Tensor all_idx = at::empty({(int64_t)size_, most, sparse_dim}, idx.options());
    val_shape.insert(val_shape.begin(), (int64_t)size_);
    at::Tensor all_val = at::empty(val_shape, val.options());
    if (most > 0) { /* the same on every rank */
      flat_buf bi = bytes_of(idx_t);
      res = weftAllGather(bi.ptr, all_idx.data_ptr(), bi.count, bi.dtype, comm_, stream_);
      if (res != weftSuccess) return res;
      flat_buf bv = bytes_of(val_pad);
      if (bv.count > 0)
        res = weftAllGather(bv.ptr, all_val.data_ptr(), bv.count, bv.dtype, comm_, stream_);
      if (res != weftSuccess) return res;
    }
    std::vector<at::Tensor> idx_parts, val_parts;
    for (int r = 0; r < size_; r++) {
      const int64_t k = all_nnz[r].item<int64_t>();
      idx_parts.push_back(all_idx[r].narrow(0, 0, k).t());
      val_parts.push_back(all_val[r].narrow(0, 0, k));
    }
    *result = at::sparse_coo_tensor(at::cat(idx_parts, 1), at::cat(val_parts, 0), t.sizes(),
                                    t.options())
                  .coalesce();
    return weftSuccess;
  };
  s.finish = [t, result]() { t.copy_(*result); };
  return s;
}

op_step WeftBackend::reduce_scatter_step(const at::Tensor &out, const run_input &in,
                                         const ReduceOp &rop) {
  TORCH_CHECK(in.like().scalar_type() == out.scalar_type(),
              "weft: reduce_scatter: input and output dtypes differ");
  check_device(in.like(), device_of(out), "reduce_scatter");
  TORCH_CHECK(in.numel() == out.numel() * size_, "weft: reduce_scatter: the input has ",
              in.numel(), " elements, expected ", size_, " x ", out.numel());
  red_plan p = red_plan_of(rop, out.scalar_type(), "reduce_scatter");
  if (p.kind == red_plan::premul) return premul_step(out, p, "reduce_scatter", 0, in);
  if (p.kind == red_plan::bitwise) {
    // all-reduce a copy bitwise (made when the operation runs), keep this
    // rank's block
    at::Tensor whole = at::empty({in.numel()}, out.options());
    op_step s = allreduce_step(whole, rop, "reduce_scatter");
    s.held.push_back(whole);
    s.issue = [issue = s.issue, whole, in]() {
      in.copy_to(whole);
      return issue();
    };
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
    flat_buf src = elems_of(in.get(), "reduce_scatter");
    flat_buf b = elems_of(buf, "reduce_scatter");
    return weftReduceScatter(src.ptr, b.ptr, b.count, b.dtype, op, comm_, stream_);
  });
}

}  // namespace torch_weft
