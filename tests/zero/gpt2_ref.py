"""weft-train's transformer in PyTorch: the same model, started from the
parameters weft-train wrote (--dump-init) and fed the batches it wrote
(--dump-batches), with AdamW, clipping and the same learning-rate schedule.
Prints `step N loss X` per step, as weft-train does.

With --eval-step N it trains nothing: it prints `step N loss X`, the loss of
step N's batch (every micro-step's, averaged) at the parameters in --init, in
float64. Given the parameters weft-train held before step N (--stop-at N-1
--save, then weft-zero-consolidate), X is what weft-train's step N should
print, whatever rounding did to the parameters on the way there.

usage: gpt2_ref.py --init FILE --batches FILE --layers L --heads H --channels C
                   --context T --steps N [--lr X --warmup N --min-lr X --clip X]
                   [--eval-step N]
"""
import argparse
import math
import struct

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn


class Block(nn.Module):
    def __init__(self, C, H):
        super().__init__()
        self.H = H
        self.ln1 = nn.LayerNorm(C)
        self.qkv = nn.Linear(C, 3 * C)
        self.proj = nn.Linear(C, C)
        self.ln2 = nn.LayerNorm(C)
        self.fc = nn.Linear(C, 4 * C)
        self.fcproj = nn.Linear(4 * C, C)

    def forward(self, x):
        B, T, C = x.shape
        q, k, v = self.qkv(self.ln1(x)).split(C, dim=2)
        q, k, v = (t.view(B, T, self.H, C // self.H).transpose(1, 2) for t in (q, k, v))
        att = (q @ k.transpose(-2, -1)) / math.sqrt(C // self.H)
        mask = torch.ones(T, T, dtype=torch.bool).tril()
        att = att.masked_fill(~mask, float("-inf")).softmax(dim=-1)
        y = (att @ v).transpose(1, 2).contiguous().view(B, T, C)
        x = x + self.proj(y)
        return x + self.fcproj(F.gelu(self.fc(self.ln2(x)), approximate="tanh"))


class GPT(nn.Module):
    def __init__(self, L, H, C, T, V=256):
        super().__init__()
        self.wte = nn.Embedding(V, C)
        self.wpe = nn.Embedding(T, C)
        self.blocks = nn.ModuleList(Block(C, H) for _ in range(L))
        self.lnf = nn.LayerNorm(C)

    def forward(self, idx, targets):
        T = idx.shape[1]
        x = self.wte(idx) + self.wpe(torch.arange(T))
        for b in self.blocks:
            x = b(x)
        logits = self.lnf(x) @ self.wte.weight.t()  # tied
        return F.cross_entropy(logits.reshape(-1, logits.shape[-1]), targets.reshape(-1))

    def tensors(self):
        """In weft-train's registration order."""
        out = [self.wte.weight, self.wpe.weight]
        for b in self.blocks:
            out += [b.ln1.weight, b.ln1.bias, b.qkv.weight, b.qkv.bias, b.proj.weight,
                    b.proj.bias, b.ln2.weight, b.ln2.bias, b.fc.weight, b.fc.bias,
                    b.fcproj.weight, b.fcproj.bias]
        return out + [self.lnf.weight, self.lnf.bias]


def load_params(model, path):
    with open(path, "rb") as f:
        data = f.read()
    assert data[:8] == b"WEFTZF32", "not a weft parameter file"
    (nl,) = struct.unpack_from("<Q", data, 8)
    off = 16 + 8 * nl
    flat = np.frombuffer(data, dtype="<f4", offset=off)
    at = 0
    with torch.no_grad():
        for t in model.tensors():
            n = t.numel()
            t.copy_(torch.from_numpy(flat[at:at + n].copy()).view_as(t).to(t.dtype))
            at += n
    assert at == flat.size, f"{flat.size} values for {at} parameters"


def batches(path):
    with open(path, "rb") as f:
        data = f.read()
    assert data[:8] == b"WEFTBAT1", "not a weft batch file"
    seq, gb, accum, first = struct.unpack_from("<4I", data, 8)
    arr = np.frombuffer(data, dtype=np.uint8, offset=24).reshape(-1, gb, seq + 1)
    return first, accum, torch.from_numpy(arr.astype(np.int64))


def lr_at(a, step):
    if step < a.warmup:
        return a.lr * (step + 1) / a.warmup
    if a.steps <= a.warmup:
        return a.lr
    # 0 at the first step after warm-up, 1 at the last (steps - 1)
    span = a.steps - 1 - a.warmup
    p = (step - a.warmup) / span if span > 0 else 0.0
    low = a.lr * a.min_lr
    return low + 0.5 * (1.0 + math.cos(math.pi * p)) * (a.lr - low)


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--init", required=True)
    p.add_argument("--batches", required=True)
    for n in ("layers", "heads", "channels", "context", "steps"):
        p.add_argument("--" + n, type=int, required=True)
    p.add_argument("--lr", type=float, default=3e-3)
    p.add_argument("--warmup", type=int, default=1)
    p.add_argument("--min-lr", type=float, default=0.1)
    p.add_argument("--clip", type=float, default=1.0)
    p.add_argument("--eval-step", type=int, default=0)
    a = p.parse_args()
    torch.manual_seed(0)
    torch.set_num_threads(1)
    if a.eval_step > 0:
        torch.set_default_dtype(torch.float64)
    model = GPT(a.layers, a.heads, a.channels, a.context)
    load_params(model, a.init)
    first, accum, data = batches(a.batches)
    if a.eval_step > 0:
        i = a.eval_step - 1 - first
        assert 0 <= i < data.shape[0] // accum, f"no batch for step {a.eval_step}"
        with torch.no_grad():
            total = sum(model(w[:, :-1], w[:, 1:]).item() for w in data[i * accum:(i + 1) * accum])
        print(f"step {a.eval_step:4d} loss {total / accum:.6f}", flush=True)
        return
    opt = torch.optim.AdamW(model.parameters(), lr=a.lr, betas=(0.9, 0.999), eps=1e-8,
                            weight_decay=0.0)
    for i in range(data.shape[0] // accum):
        step = first + i
        for g in opt.param_groups:
            g["lr"] = lr_at(a, step)
        opt.zero_grad()
        total = 0.0
        for m in range(accum):
            w = data[i * accum + m]
            loss = model(w[:, :-1], w[:, 1:])
            (loss / accum).backward()
            total += loss.item()
        if a.clip > 0:
            torch.nn.utils.clip_grad_norm_(model.parameters(), a.clip)
        opt.step()
        print(f"step {step + 1:4d} loss {total / accum:.6f}", flush=True)


if __name__ == "__main__":
    main()
