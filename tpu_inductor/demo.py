"""``python -m tpu_inductor.demo``: compile a small transformer with ``backend="tpu"`` on the
default device, check it against CPU eager, and print device, compile time and steady-state
time against eager.
"""

from __future__ import annotations

import argparse
import copy
import time

import torch
import torch.nn as nn


class TinyDecoder(nn.Module):
    """A causal decoder-only language model: embedding, N pre-norm blocks, LM head."""

    def __init__(self, vocab=512, d=128, heads=4, layers=2, seq=64):
        super().__init__()
        self.tok = nn.Embedding(vocab, d)
        self.pos = nn.Embedding(seq, d)
        self.blocks = nn.ModuleList(
            nn.TransformerEncoderLayer(
                d, heads, 4 * d, dropout=0.0, batch_first=True, norm_first=True, activation="gelu"
            )
            for _ in range(layers)
        )
        self.norm = nn.LayerNorm(d)
        self.head = nn.Linear(d, vocab, bias=False)

    def forward(self, ids):
        t = ids.shape[1]
        x = self.tok(ids) + self.pos(torch.arange(t))
        mask = nn.Transformer.generate_square_subsequent_mask(t)
        for block in self.blocks:
            x = block(x, src_mask=mask, is_causal=True)
        return self.head(self.norm(x))


def _time(fn, *args, iters):
    fn(*args)
    start = time.perf_counter()
    for _ in range(iters):
        fn(*args)
    return (time.perf_counter() - start) / iters


def main(argv=None) -> int:
    """Run the demo; returns a process exit code (0 when compiled matches eager)."""
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--seq", type=int, default=64)
    parser.add_argument("--iters", type=int, default=20)
    parser.add_argument("--device", choices=["tpu", "gpu", "cpu"], default=None)
    args = parser.parse_args(argv)

    from tpu_inductor.runtime import select_device

    torch.manual_seed(0)
    model = TinyDecoder(seq=args.seq).eval()
    ids = torch.randint(0, 512, (args.batch, args.seq))
    device = select_device(args.device)
    options = {"device": args.device} if args.device else None
    compiled = torch.compile(copy.deepcopy(model), backend="tpu", options=options)

    with torch.no_grad():
        start = time.perf_counter()
        out = compiled(ids)
        compile_s = time.perf_counter() - start
        ref = model(ids)
        err = (out - ref).abs().max().item()
        ok = out.dtype == ref.dtype and out.shape == ref.shape and err < 1e-3
        t_comp = _time(compiled, ids, iters=args.iters)
        t_eager = _time(model, ids, iters=args.iters)

    params = sum(p.numel() for p in model.parameters())
    print(
        f"tpu-inductor demo: {params / 1e6:.2f}M-parameter decoder, batch {args.batch} x "
        f"seq {args.seq}, inference"
    )
    print(f"  device              : {device.platform} ({device.device_kind})")
    print(f"  first call (compile): {compile_s:.2f} s")
    print(
        f"  steady state        : {t_comp * 1e3:.2f} ms/call compiled, "
        f"{t_eager * 1e3:.2f} ms/call torch eager (CPU) -> {t_eager / t_comp:.2f}x"
    )
    print(f"  max |compiled - eager| = {err:.2e}  ->  {'MATCH' if ok else 'MISMATCH'}")
    return 0 if ok else 1


if __name__ == "__main__":
    raise SystemExit(main())
