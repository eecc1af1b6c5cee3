"""The flight recorder of the "weft" backend, dumped on request, under torchrun
(run.sh flight N sets TORCH_FR_BUFFER_SIZE=16, so the ring wraps, and
TORCH_FR_DUMP_TEMP_FILE to a directory of its own, which it removes):

- each rank's dump (torch_weft.dump_flight_recorder) holds the last 16 of the
  operations it issued, oldest first, with consecutive record ids, PyTorch's
  names, the group's sequence numbers, sizes, dtypes, state completed;
- pg_config names the default group and a new_group with their global
  ranks; pg_status the last collective of the default group;
- torch_weft.flight_recorder_trace() says the same as the file;
- PyTorch's analyzer (torchfrtrace) reads every rank's dump and finds every
  collective matched: no missing rank, no mismatch.
"""
import os
import pickle
import subprocess
import sys

import torch
import torch.distributed as dist

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..",
                                "tools", "torch_weft"))
import torch_weft  # noqa: E402

CAPACITY = 16


def main():
    dist.init_process_group("weft")
    rank, world = dist.get_rank(), dist.get_world_size()
    failures = []

    def check(ok, what):
        if not ok:
            failures.append(what)
            print(f"rank {rank}: FAIL: {what}", flush=True)

    # what each rank issues, in order, and what the recorder must say of it:
    # (profiling name, group name, input sizes, output sizes, dtype)
    expected = []
    t = torch.full((5,), float(rank + 1))

    def p2p():
        if rank == 0:
            dist.send(t, 1)
            expected.append(("weft:send 0->1", "0", [[5]], [[5]], "Float"))
        elif rank == 1:
            dist.recv(t, 0)
            expected.append(("weft:recv 1<-0", "0", [[5]], [[5]], "Float"))

    for _ in range(12):  # the ring keeps the last 16: these fall out first
        dist.all_reduce(t)
        expected.append(("weft:all_reduce", "0", [[5]], [[5]], "Float"))
    dist.broadcast(t, 0)
    expected.append(("weft:broadcast", "0", [[5]], [[5]], "Float"))
    out = torch.zeros(3 * world, dtype=torch.int32)
    dist.all_gather_into_tensor(out, torch.arange(3, dtype=torch.int32))
    expected.append(("weft:_all_gather_base", "0", [[3]], [[3 * world]], "Int"))
    rs = torch.zeros(2, dtype=torch.float64)
    dist.reduce_scatter_tensor(rs, torch.ones(2 * world, dtype=torch.float64))
    expected.append(("weft:_reduce_scatter_base", "0", [[2 * world]], [[2]], "Double"))
    sub = dist.new_group(list(range(world))[::-1])
    dist.all_reduce(t, group=sub)
    expected.append(("weft:all_reduce", sub.group_name, [[5]], [[5]], "Float"))
    dist.barrier()
    expected.append(("weft:barrier", "0", [], [], None))
    # the analyzer matches a send or receive against every rank of its group
    # (it reports the others missing), and aligns the ranks' rings by record
    # id (a rank that recorded more than another is misread): the send and
    # receive with 2 ranks only, and the subgroup every rank's
    if world == 2:
        p2p()
    for _ in range(3):
        dist.all_reduce(t)
        expected.append(("weft:all_reduce", "0", [[5]], [[5]], "Float"))

    # one directory for every rank's dump: TORCH_FR_DUMP_TEMP_FILE's (run.sh's)
    prefix = os.environ["TORCH_FR_DUMP_TEMP_FILE"]
    where = [os.path.dirname(prefix)]
    path = torch_weft.dump_flight_recorder()
    check(path == f"{prefix}{rank}", f"dump path {path}")
    with open(path, "rb") as f:
        d = pickle.load(f)
    live = torch_weft.flight_recorder_trace()
    check(live["entries"] == d["entries"] and live["pg_config"] == d["pg_config"],
          "flight_recorder_trace() differs from the file")

    entries = d["entries"]
    want = expected[-CAPACITY:]
    check(len(entries) == CAPACITY, f"{len(entries)} entries, expected {CAPACITY}")
    ids = [e["record_id"] for e in entries]
    check(ids == list(range(len(expected) - CAPACITY, len(expected))),
          f"record ids {ids}, expected the last {CAPACITY} of {len(expected)}")
    for e, (name, group, ins, outs, dtype) in zip(entries, want):
        got = (e["profiling_name"], e["process_group"][0], e["input_sizes"], e["output_sizes"])
        check(got == (name, group, ins, outs), f"entry {e['record_id']}: {got}, expected "
              f"{(name, group, ins, outs)}")
        check(dtype is None or e["input_dtypes"][0] == dtype,
              f"entry {e['record_id']}: dtypes {e['input_dtypes']}, expected {dtype}")
        check(e["state"] == "completed" and e["time_discovered_completed_ns"] >=
              e["time_discovered_started_ns"] >= e["time_created_ns"] > 0,
              f"entry {e['record_id']}: state {e['state']}, times out of order")
        check(e["is_p2p"] == (" " in name), f"entry {e['record_id']}: is_p2p {e['is_p2p']}")
    # sequence numbers: the default group's collectives from 1, and the
    # group's sequence number (what TORCH_DISTRIBUTED_DEBUG=DETAIL compares)
    # their count, as NCCL's: sends and receives are not in it
    coll = [e["collective_seq_id"] for e in entries
            if e["process_group"][0] == "0" and not e["is_p2p"]]
    check(coll == list(range(coll[0], coll[0] + len(coll))) and coll[-1] == 19,
          f"default group's collective_seq_id {coll}, expected consecutive up to 19")
    check(coll[-1] == dist.group.WORLD._get_sequence_number_for_group(),
          f"last collective_seq_id {coll[-1]}, the group's sequence number "
          f"{dist.group.WORLD._get_sequence_number_for_group()}")
    ranks = str(list(range(world)))
    check(d["pg_config"]["0"] == {"name": "0", "desc": "default_pg", "ranks": ranks},
          f"pg_config of the default group: {d['pg_config'].get('0')}")
    check(d["pg_config"].get(sub.group_name, {}).get("ranks") == ranks,
          f"pg_config of the subgroup: {d['pg_config'].get(sub.group_name)}")
    check(len(d["pg_config"]) == 2, f"pg_config holds {sorted(d['pg_config'])}")
    check(d["pg_status"]["0"]["last_completed_collective"] == 19,
          f"pg_status {d['pg_status']['0']}")
    check(d["version"] == "2.10", f"version {d['version']}")

    dist.barrier()
    if rank == 0:
        exe = os.path.join(os.path.dirname(sys.executable), "torchfrtrace")
        res = subprocess.run([exe, where[0]], capture_output=True, text=True, timeout=120)
        out = "\n".join(ln for ln in (res.stdout + res.stderr).splitlines()
                        if "unrecognized comm library" not in ln)
        bad = [w for w in ("missing", "Not all ranks", "has errors", "mismatch",
                           "Traceback", "cannot decide") if w.lower() in out.lower()]
        check(res.returncode == 0 and not bad,
              f"torchfrtrace exit {res.returncode}, says {bad}: {out[-2000:]}")
        print(f"rank 0: torchfrtrace {where[0]}: exit {res.returncode}, "
              f"{len(out.splitlines())} lines beside its warnings{': ' + out[:300] if out else ''}",
              flush=True)
    print(f"rank {rank}: check_flight: {len(entries)} entries checked, "
          f"{'ok' if not failures else f'{len(failures)} FAILED'}", flush=True)
    dist.destroy_process_group()
    sys.exit(1 if failures else 0)


if __name__ == "__main__":
    main()
