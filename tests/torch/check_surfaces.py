"""The parts of PyTorch built on torch.distributed that reach the "weft" backend
through other paths than the plain calls, each run over weft and over a Gloo
group of the same ranks (same inputs, results compared), on host tensors:

- functional collectives (torch.distributed._functional_collectives:
  all_reduce, all_gather_tensor, reduce_scatter_tensor, all_to_all_single,
  wait_tensor), eagerly and under torch.compile: backend "aot_eager" for the
  whole set, "inductor" (which compiles C++: about a minute cold on a loaded
  2-core machine, seconds from its cache) for one small all-reduce and
  all-gather, at 2 ranks only;
- DTensor: a mesh over the group; distribute_tensor with Shard(0) and
  Shard(1) (even and uneven sizes) -> Replicate -> Shard, Partial ->
  Replicate and Partial -> Shard, and a row- and column-parallel linear whose
  output and gradients match the single-process computation;
- torch.distributed.pipelining: a model of one linear stage per rank
  (PipelineStage), ScheduleGPipe and Schedule1F1B, whose losses and
  gradients match those of the whole model run in one process.

Run under torchrun (2 or 3 ranks); exits non-zero with the failing checks
listed. The random inputs are seeded; the seed is printed
(WEFT_SURFACES_SEED repeats a run).
"""
import os
import random
import sys
import time

# inductor compiles in this process, not in a pool of workers (2 cores)
os.environ.setdefault("TORCHINDUCTOR_COMPILE_THREADS", "1")

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402
import torch.distributed._functional_collectives as funcol  # noqa: E402

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "..", "tools", "torch_weft"))
import torch_weft  # noqa: E402,F401
import teardown  # noqa: E402  (beside this script)

failures = []
checks = 0
SEED = 0  # rank 0's, set in main()


def check(name, ok, detail=""):
    global checks
    checks += 1
    if not ok:
        failures.append(f"{name}: {detail}")


def check_close(name, got, want, exact=True):
    global checks
    checks += 1
    if got.dtype != want.dtype or got.shape != want.shape:
        failures.append(f"{name}: {got.dtype}{tuple(got.shape)} != {want.dtype}{tuple(want.shape)}")
        return
    ok = torch.equal(got, want) if exact else torch.allclose(got, want, rtol=1e-5, atol=1e-5)
    if not ok:
        failures.append(f"{name}: first values {got.flatten()[:4].tolist()} vs "
                        f"{want.flatten()[:4].tolist()} (max diff "
                        f"{(got.double() - want.double()).abs().max().item():.3g})")


def rank_tensor(rank, shape, tag, dtype=torch.float32):
    """Integer-valued data, so that sums are exact whatever their order."""
    g = torch.Generator().manual_seed(SEED + 1009 * (rank + 1) + tag)
    return torch.randint(-20, 20, shape, generator=g).to(dtype)


# --- functional collectives ---------------------------------------------------

def funcol_set(x, group, world):
    """Every functional collective once on x (world*k rows), waited with
    wait_tensor; returns the results."""
    ar = funcol.all_reduce(x, "sum", group)
    ag = funcol.all_gather_tensor(x, 0, group)
    rs = funcol.reduce_scatter_tensor(x, "sum", 0, group)
    a2a = funcol.all_to_all_single(x, None, None, group)
    mx = funcol.all_reduce(x, "max", group)
    ag1 = funcol.all_gather_tensor(x, 1, group)
    return [funcol.wait_tensor(t) for t in (ar, ag, rs, a2a, mx, ag1)]


def funcol_coalesced(xs, group, avg=True):
    """The coalesced forms (FSDP's and DTensor's), and an average."""
    out = list(funcol.all_reduce_coalesced(xs, "sum", group))
    out = out + list(funcol.all_gather_into_tensor_coalesced(xs, group))
    out = out + list(funcol.reduce_scatter_tensor_coalesced(xs, "sum", [0] * len(xs), group))
    if avg:
        out = out + [funcol.reduce_scatter_tensor(xs[0], "avg", 0, group)]
    return [funcol.wait_tensor(t) for t in out]


def funcol_uneven(x, group, world, rank):
    """all_to_all_single with uneven splits: rank r sends r+1+j rows to rank j."""
    in_splits = [rank + 1 + j for j in range(world)]
    out_splits = [j + 1 + rank for j in range(world)]
    return funcol.wait_tensor(funcol.all_to_all_single(x[:sum(in_splits)], out_splits,
                                                      in_splits, group))


def funcol_small(x, group):
    """One generated C++ kernel (x * 2) around two collectives."""
    y = funcol.all_reduce(x * 2, "sum", group)
    return funcol.wait_tensor(funcol.all_gather_tensor(y, 0, group))


def check_funcol(gloo):
    r, world = dist.get_rank(), dist.get_world_size()
    weft = dist.group.WORLD
    names = ["all_reduce", "all_gather_tensor", "reduce_scatter_tensor", "all_to_all_single",
             "all_reduce max", "all_gather_tensor dim 1"]
    for dtype in (torch.float32, torch.int64, torch.bfloat16):
        x = rank_tensor(r, (world * 3, 5), 1, dtype)
        got, want = funcol_set(x, weft, world), funcol_set(x, gloo, world)
        for n, g, w in zip(names, got, want):
            check_close(f"funcol eager {n} {dtype}", g, w)
        xs = [rank_tensor(r, (world * 2, 3), 6, dtype), rank_tensor(r, (world,), 7, dtype)]
        avg = dtype.is_floating_point
        got, want = funcol_coalesced(xs, weft, avg), funcol_coalesced(xs, gloo, avg)
        check(f"funcol eager coalesced {dtype}: count", len(got) == len(want),
              f"{len(got)} vs {len(want)}")
        for i, (g, w) in enumerate(zip(got, want)):
            check_close(f"funcol eager coalesced {dtype} result {i}", g, w)
    x = rank_tensor(r, (3 * world * world, 2), 2)
    check_close("funcol eager all_to_all_single uneven", funcol_uneven(x, weft, world, r),
                funcol_uneven(x, gloo, world, r))
    # a different input so that what was traced is not what ran eagerly
    x = rank_tensor(r, (world * 2, 3), 3)
    compiled = torch.compile(funcol_set, backend="aot_eager", fullgraph=True)
    got, want = compiled(x, weft, world), funcol_set(x, gloo, world)
    for n, g, w in zip(names, got, want):
        check_close(f"funcol aot_eager {n}", g, w)
    got_gloo = compiled(x, gloo, world)
    for n, g, w in zip(names, got_gloo, want):
        check_close(f"funcol aot_eager (Gloo, compiled) {n}", g, w)
    xs = [rank_tensor(r, (world * 2, 3), 8), rank_tensor(r, (world,), 9)]
    compiled_co = torch.compile(funcol_coalesced, backend="aot_eager", fullgraph=True)
    for i, (g, w) in enumerate(zip(compiled_co(xs, weft), funcol_coalesced(xs, gloo))):
        check_close(f"funcol aot_eager coalesced result {i}", g, w)
    compiled_uneven = torch.compile(funcol_uneven, backend="aot_eager", fullgraph=True)
    x = rank_tensor(r, (3 * world * world, 2), 4)
    check_close("funcol aot_eager all_to_all_single uneven", compiled_uneven(x, weft, world, r),
                funcol_uneven(x, gloo, world, r))
    if world != 2:
        if r == 0:
            print("funcol: the inductor case runs at 2 ranks only (a cold compile takes a "
                  "minute on a loaded 2-core machine)", flush=True)
        return
    start = time.monotonic()
    small = torch.compile(funcol_small, backend="inductor", fullgraph=True)
    x = rank_tensor(r, (4,), 5)
    check_close("funcol inductor all_reduce + all_gather", small(x, weft), funcol_small(x, gloo))
    print(f"rank {r}: inductor compile and run {time.monotonic() - start:.1f} s", flush=True)


# --- DTensor ------------------------------------------------------------------

def dtensor_run(mesh, rank, world):
    """Redistributions and a small parallel linear over mesh; every result as
    a full (replicated) tensor."""
    from torch.distributed.tensor import DTensor, Partial, Replicate, Shard, distribute_tensor
    out = {}
    for rows, cols in ((world * 2, world * 3), (world * 2 + 1, world + 2)):  # even, uneven
        full = rank_tensor(0, (rows, cols), 10 + rows)  # the same on every rank
        for dim in (0, 1):
            d = distribute_tensor(full, mesh, [Shard(dim)])
            out[f"shard{dim} local {rows}x{cols}"] = d.to_local().clone()
            rep = d.redistribute(mesh, [Replicate()])
            out[f"shard{dim}->replicate {rows}x{cols}"] = rep.to_local().clone()
            back = rep.redistribute(mesh, [Shard(1 - dim)])
            out[f"replicate->shard{1 - dim} local {rows}x{cols}"] = back.to_local().clone()
            out[f"shard{dim}->shard{1 - dim} full {rows}x{cols}"] = \
                d.redistribute(mesh, [Shard(1 - dim)]).full_tensor()
        local = rank_tensor(rank, (rows, cols), 20 + rows)
        part = DTensor.from_local(local, mesh, [Partial()])
        out[f"partial->replicate {rows}x{cols}"] = \
            part.redistribute(mesh, [Replicate()]).to_local().clone()
        out[f"partial->shard0 local {rows}x{cols}"] = \
            part.redistribute(mesh, [Shard(0)]).to_local().clone()
    # column- then row-parallel linear (Megatron's MLP): y = relu(x W1^T) W2^T
    x = rank_tensor(0, (4, world * 2), 30)
    w1 = rank_tensor(0, (world * 4, world * 2), 31)
    w2 = rank_tensor(0, (3, world * 4), 32)
    x_d = distribute_tensor(x, mesh, [Replicate()])
    w1_d = distribute_tensor(w1, mesh, [Shard(0)]).requires_grad_()
    w2_d = distribute_tensor(w2, mesh, [Shard(1)]).requires_grad_()
    h = torch.relu(torch.nn.functional.linear(x_d, w1_d))
    y = torch.nn.functional.linear(h, w2_d)
    out["mlp placements"] = torch.tensor([isinstance(p, Partial) for p in y.placements])
    y_full = y.full_tensor()
    out["mlp y"] = y_full
    y.sum().backward()
    out["mlp grad w1"] = w1_d.grad.full_tensor()
    out["mlp grad w2"] = w2_d.grad.full_tensor()
    out["matmul shard0 x replicate"] = torch.matmul(
        distribute_tensor(w1, mesh, [Shard(0)]), distribute_tensor(x.t(), mesh, [Replicate()])
    ).full_tensor()
    return out


def dtensor_reference(world):
    """The MLP's output and gradients in one process."""
    x = rank_tensor(0, (4, world * 2), 30)
    w1 = rank_tensor(0, (world * 4, world * 2), 31).requires_grad_()
    w2 = rank_tensor(0, (3, world * 4), 32).requires_grad_()
    y = torch.nn.functional.linear(torch.relu(torch.nn.functional.linear(x, w1)), w2)
    y.sum().backward()
    return {"mlp y": y.detach(), "mlp grad w1": w1.grad, "mlp grad w2": w2.grad,
            "matmul shard0 x replicate": w1.detach() @ x.t()}


def check_dtensor(gloo):
    from torch.distributed.device_mesh import DeviceMesh, init_device_mesh
    r, world = dist.get_rank(), dist.get_world_size()
    mesh_weft = init_device_mesh("cpu", (world,))
    check("DTensor: the mesh's group is weft's",
          mesh_weft.get_group()._get_backend_name() == "weft",
          mesh_weft.get_group()._get_backend_name())
    mesh_gloo = DeviceMesh.from_group(gloo, "cpu")
    got, want = dtensor_run(mesh_weft, r, world), dtensor_run(mesh_gloo, r, world)
    for k in want:
        check_close(f"DTensor {k}", got[k], want[k])
    for k, v in dtensor_reference(world).items():
        check_close(f"DTensor {k} (single process)", got[k], v)
    # the redistributions agree with the tensor they came from
    for rows, cols in ((world * 2, world * 3), (world * 2 + 1, world + 2)):
        full = rank_tensor(0, (rows, cols), 10 + rows)
        check_close(f"DTensor shard0->replicate {rows}x{cols} is the tensor",
                    got[f"shard0->replicate {rows}x{cols}"], full)
        psum = sum(rank_tensor(q, (rows, cols), 20 + rows) for q in range(world))
        check_close(f"DTensor partial->replicate {rows}x{cols} is the sum",
                    got[f"partial->replicate {rows}x{cols}"], psum)


# --- pipelining -----------------------------------------------------------------

DIM, BATCH, MICRO = 8, 12, 4


def stage_module(i):
    torch.manual_seed(SEED + 100 + i)
    return torch.nn.Sequential(torch.nn.Linear(DIM, DIM), torch.nn.Tanh())


def loss_fn(out, target):
    return torch.nn.functional.mse_loss(out, target, reduction="sum")


def pipeline_run(schedule_cls, group, world, rank):
    """One step of schedule_cls over the group, a stage per rank; returns the
    losses (last stage) and this stage's gradients."""
    from torch.distributed.pipelining import PipelineStage
    mod = stage_module(rank)
    stage = PipelineStage(mod, rank, world, torch.device("cpu"), group=group)
    sched = schedule_cls(stage, n_microbatches=MICRO, loss_fn=loss_fn, scale_grads=False)
    x = rank_tensor(0, (BATCH, DIM), 40) / 10
    y = rank_tensor(0, (BATCH, DIM), 41) / 10
    losses = []
    if rank == 0:
        sched.step(x)
    elif rank == world - 1:
        sched.step(target=y, losses=losses)
    else:
        sched.step()
    return losses, [p.grad.clone() for p in mod.parameters()]


def pipeline_reference(world, rank):
    """The whole model in this process, microbatch by microbatch as the
    schedules run it: the losses and the gradients of stage `rank`."""
    mods = [stage_module(i) for i in range(world)]
    model = torch.nn.Sequential(*mods)
    x = rank_tensor(0, (BATCH, DIM), 40) / 10
    y = rank_tensor(0, (BATCH, DIM), 41) / 10
    losses = []
    for xm, ym in zip(x.chunk(MICRO), y.chunk(MICRO)):
        loss = loss_fn(model(xm), ym)
        loss.backward()
        losses.append(loss.detach())
    return losses, [p.grad.clone() for p in mods[rank].parameters()]


def check_pipelining(gloo):
    from torch.distributed.pipelining import Schedule1F1B, ScheduleGPipe
    r, world = dist.get_rank(), dist.get_world_size()
    ref_losses, ref_grads = pipeline_reference(world, r)
    for cls in (ScheduleGPipe, Schedule1F1B):
        name = cls.__name__
        losses, grads = pipeline_run(cls, dist.group.WORLD, world, r)
        g_losses, g_grads = pipeline_run(cls, gloo, world, r)
        for i, (g, w, ref) in enumerate(zip(grads, g_grads, ref_grads)):
            check_close(f"{name} stage {r} grad {i} (Gloo)", g, w)
            check_close(f"{name} stage {r} grad {i} (single process)", g, ref, exact=False)
        if r == world - 1:
            check(f"{name} losses", len(losses) == MICRO, f"{len(losses)} losses")
            for i, (g, w, ref) in enumerate(zip(losses, g_losses, ref_losses)):
                check_close(f"{name} loss {i} (Gloo)", g, w)
                check_close(f"{name} loss {i} (single process)", g, ref, exact=False)


def main():
    dist.init_process_group("weft")
    gloo = dist.new_group(backend="gloo")
    r = dist.get_rank()
    global SEED
    seed = torch.tensor([int(os.environ.get("WEFT_SURFACES_SEED",
                                            random.SystemRandom().randrange(1 << 30)))])
    dist.broadcast(seed, 0, group=gloo)
    SEED = int(seed.item())
    if r == 0:
        print(f"check_surfaces: seed {SEED} (WEFT_SURFACES_SEED={SEED} repeats it), "
              f"{dist.get_world_size()} ranks", flush=True)
    parts = [("functional collectives", check_funcol), ("DTensor", check_dtensor),
             ("pipelining", check_pipelining)]
    only = os.environ.get("WEFT_SURFACES_ONLY")
    for name, fn in parts:
        if only and only not in name:
            continue
        start = time.monotonic()
        try:
            fn(gloo)
        except Exception as e:  # noqa: BLE001  (a part that raises is a failure, the rest run)
            failures.append(f"{name}: raised {type(e).__name__}: {e}")
        dist.barrier(group=gloo)
        if r == 0:
            print(f"{name}: {time.monotonic() - start:.1f} s", flush=True)
    if failures:
        for f in failures:
            print(f"rank {r}: FAIL {f}", flush=True)
    else:
        print(f"rank {r}: {checks} checks passed", flush=True)
    dist.destroy_process_group()
    teardown.leave(1 if failures else 0)


if __name__ == "__main__":
    main()
