"""Device time of one attention call in the captured step's shapes, per SDPA kernel (issue 40, item 4).

The kernel table of a swept step on the H200 (``experiments/results/gpu-h200-sweep``) puts a third of the step's
device time in masked attention: each layer of each draft level attends ``rows`` tree rows to a static cache of
``capacity`` rows through an additive 4D mask (the tree's ancestors, the prompt, nothing beyond the used length).
This times that one call alone, for each kernel SDPA can take with such a mask (cuDNN, memory-efficient, math),
and two calls it cannot be, as bounds: flash attention without a mask over the used length only, and
FlexAttention with a block mask (which skips the key blocks past the used length).

    python experiments/bench_attention.py --out experiments/results/gpu-h200-sweep/attention.json

Device microseconds per call from ``torch.profiler`` (kernels only, mean over ``--calls`` calls after a
warm-up), so host launch costs do not enter. Shapes: the 0.5B draft's level (14 heads, 2 key/value heads, head
size 64) and the 1.5B target's verification (12 heads, 2, 128), Qwen2.5-Coder's."""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path
from typing import Callable

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

#: name -> (query heads, key/value heads, head size, query rows)
SHAPES = {"draft level": (14, 2, 64, 16), "target verification": (12, 2, 128, 64)}
#: FlexAttention's block size: key blocks past the used length are skipped
BLOCK = 128  # FlexAttention's default
SDPA = {"cudnn": SDPBackend.CUDNN_ATTENTION, "memory-efficient": SDPBackend.EFFICIENT_ATTENTION,
        "math": SDPBackend.MATH}


def device_us(call: Callable[[], object], calls: int, device: torch.device) -> float:
    """Mean device (CUDA) or CPU microseconds of ``call``'s kernels over ``calls`` calls, after three warm-ups."""
    for _ in range(3):
        call()
    cuda = device.type == "cuda"
    acts = [torch.profiler.ProfilerActivity.CUDA] if cuda else [torch.profiler.ProfilerActivity.CPU]
    if cuda:
        torch.cuda.synchronize()
    with torch.profiler.profile(activities=acts) as prof:
        for _ in range(calls):
            call()
        if cuda:
            torch.cuda.synchronize()
    if not cuda:
        return sum(e.self_cpu_time_total for e in prof.key_averages() if e.key.startswith("aten::")) / calls
    return sum(e.self_device_time_total for e in prof.key_averages()
               if e.device_type == torch.autograd.DeviceType.CUDA) / calls


def inputs(shape: tuple[int, int, int, int], capacity: int, used: int, dtype: torch.dtype, device: torch.device):
    """q, k, v (key/value heads repeated, as HF's SDPA path does) and the additive mask: every query row sees the
    ``used - rows`` cached rows and a lower-triangular part of its own block (a chain: the densest tree mask)."""
    heads, kv_heads, size, rows = shape
    q = torch.randn(1, heads, rows, size, dtype=dtype, device=device)
    k, v = (torch.randn(1, kv_heads, capacity, size, dtype=dtype, device=device).repeat_interleave(
        heads // kv_heads, dim=1) for _ in range(2))
    seen = torch.zeros(rows, capacity, dtype=torch.bool, device=device)
    seen[:, : used - rows] = True
    seen[:, used - rows: used] = torch.ones(rows, rows, dtype=torch.bool, device=device).tril()
    mask = torch.zeros(1, 1, rows, capacity, dtype=dtype, device=device).masked_fill(~seen, torch.finfo(dtype).min)
    return q, k, v, mask, seen


def time_shape(name: str, capacity: int, used: int, calls: int, dtype: torch.dtype, device: torch.device,
               with_flex: bool = True) -> dict:
    """Every kernel's microseconds for one shape; a kernel that refuses the inputs is recorded as refused."""
    q, k, v, mask, seen = inputs(SHAPES[name], capacity, used, dtype, device)
    want = F.scaled_dot_product_attention(q.float(), k.float(), v.float(), attn_mask=mask.float())
    row: dict = {"shape": name, "capacity": capacity, "used": used, "rows": SHAPES[name][3]}
    for kernel, backend in SDPA.items():
        def call(backend=backend):
            with sdpa_kernel(backend):
                return F.scaled_dot_product_attention(q, k, v, attn_mask=mask)
        try:
            err = float((call().float() - want).abs().max())
            row[kernel] = {"us": device_us(call, calls, device), "max_error": err}
        except RuntimeError as e:
            row[kernel] = {"refused": str(e).splitlines()[0][:160]}
    if device.type == "cuda":  # no mask, the used length only: a bound on what skipping masked keys could reach
        qu, ku, vu = q, k[:, :, :used], v[:, :, :used]

        def flash():
            with sdpa_kernel(SDPBackend.FLASH_ATTENTION):
                return F.scaled_dot_product_attention(qu, ku, vu)
        row["flash, no mask, used length (bound)"] = {"us": device_us(flash, calls, device)}
        if with_flex:
            row["flex, block mask"] = flex(q, k, v, seen, want, calls, device)
    return row


def flex(q, k, v, seen, want, calls: int, device: torch.device) -> dict:
    """FlexAttention with a block mask from ``seen`` (compiled once per shape; its compile seconds recorded)."""
    from torch.nn.attention.flex_attention import create_block_mask, flex_attention

    t = time.perf_counter()
    try:
        block = create_block_mask(lambda b, h, qi, ki: seen[qi, ki], 1, 1, q.shape[2], k.shape[2], device=device,
                                  BLOCK_SIZE=BLOCK)
        fn = torch.compile(flex_attention, dynamic=False)
        out = fn(q, k, v, block_mask=block)
    except Exception as e:  # a kernel that does not compile here is a finding, not the end of the run
        return {"refused": f"{type(e).__name__}: {str(e).splitlines()[0][:160] if str(e) else ''}"}
    compile_s = time.perf_counter() - t
    return {"us": device_us(lambda: fn(q, k, v, block_mask=block), calls, device), "compile_seconds": compile_s,
            "max_error": float((out.float() - want).abs().max())}


def main(argv: list[str] | None = None) -> list[dict]:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", type=Path, required=True, help="JSON file of the results (one row per shape)")
    ap.add_argument("--capacities", type=int, nargs="+", default=[256, 1024])
    ap.add_argument("--used", type=int, default=192, help="cache rows in use (prompt + tokens + the level's rows)")
    ap.add_argument("--calls", type=int, default=50)
    ap.add_argument("--no-flex", action="store_true", help="skip FlexAttention (its compile)")
    args = ap.parse_args(argv)
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    dtype = torch.bfloat16 if device.type == "cuda" else torch.float32
    rows = []
    for name in SHAPES:
        for capacity in args.capacities:
            rows.append(time_shape(name, capacity, args.used, args.calls, dtype, device, not args.no_flex))
            print(json.dumps(rows[-1]), flush=True)
            args.out.parent.mkdir(parents=True, exist_ok=True)
            args.out.write_text(json.dumps({"device": torch.cuda.get_device_name() if device.type == "cuda"
                                            else "cpu", "torch": torch.__version__, "rows": rows}, indent=1))
    return rows


if __name__ == "__main__":
    main()
