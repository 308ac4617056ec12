"""llama.cpp's own CPU kernels (ggml) on a built-in model's GGUF tensors, by the rows multiplied, beside the kernels
treespec runs that model on: can llama.cpp's kernels inside treespec beat llama.cpp (issue 42)?

Every 2-D weight of the file's decoder layers plus its LM head (``output.weight``, or the tied ``token_embd.weight``),
in the file's own types, multiplied by M random float32 rows, one ``ggml_mul_mat`` graph per tensor (built once per
M, computed on a persistent 2-thread ggml threadpool; llama.cpp runs the same kernels, its activations quantised to
8 bits per block inside the product), in ms for the whole set (median of ``--repeats`` after a warm-up), 2 threads:

* ``ggml``: the tensors in plain CPU memory (``vec_dot`` per row and column);
* ``ggml repacked``: the tensors llama.cpp's ``CPU_REPACK`` buffer takes (Q4_0, Q4_K, IQ4_NL on this x86) in its
  interleaved layout with its multi-row ``gemm`` kernels (what llama.cpp uses by default), the rest plain;
* ``treespec``: the same model as ``load(name, dtype="int4")`` builds it, each Linear layer on its kernel
  (``quantized.kernel_only``: a target's 4-bit blocks on torch's int4 kernel, its other types on the int8 kernel; a
  draft's every layer re-quantised to int4, as ``auto`` converts it).

It also checks, per ggml type, whether M rows multiplied together equal the rows one at a time, bit for bit (an
exact tree's rows must compute what one-token forwards compute: ``treespec.core.checks``).

ggml comes from the llama.cpp that ``llama-cpp-python``'s source package on PyPI carries (30 s to build here)::

    pip download llama-cpp-python==0.3.36 --no-binary :all: --no-deps -d /tmp/lcp
    tar xzf /tmp/lcp/llama_cpp_python-0.3.36.tar.gz -C /tmp/lcp
    cmake -S /tmp/lcp/llama_cpp_python-0.3.36/vendor/llama.cpp -B /tmp/ggml-build -G Ninja \\
        -DCMAKE_BUILD_TYPE=Release -DGGML_NATIVE=ON -DBUILD_SHARED_LIBS=ON -DGGML_OPENMP=OFF -DLLAMA_CURL=OFF
    cmake --build /tmp/ggml-build -j2 --target ggml-base ggml-cpu
    python experiments/ggml_kernels_by_rows.py --ggml-lib /tmp/ggml-build/bin [--model qwen2.5-coder-0.5b-instruct]

torch runs one thread while ggml's arms run: torch's OpenMP workers spin after every torch op and took the cores
from ggml's two threads (seen while writing this script; not timed here).

Run at 09bb04d on the Zen 4 host (family 25 model 17), alone (1 min 22 s; ``experiments/results/ggml-kernels-cpu``):
the target's set, ms at 1 / 2 / 4 / 8 rows, two rounds: ggml 48.6-52.6 / 98-104 / 127-153 / 290-312, **ggml
repacked 35.9-43.5** / 65-73 / **103-107** / 243-275, treespec int4 66.5-69.5 / 75-82 / **97-100** / 206-217:
llama.cpp's kernels win at one row and lose from four (every kernel here is compute-bound past a row or two).
"""

from __future__ import annotations

import argparse
import ctypes as C
import tempfile
from pathlib import Path

import numpy as np
import torch

from linear_kernels_by_rows import median_ms  # this folder's: run as a script
from treespec.models import DEFAULT_TARGET, load
from treespec.models.packaged import REGISTRY, assemble_gguf, chunk_paths
from treespec.models.quantized import KernelLinear, kernel_only

P = C.c_void_p
F32 = 0


class _Init(C.Structure):
    _fields_ = [("mem_size", C.c_size_t), ("mem_buffer", P), ("no_alloc", C.c_bool)]


class _PoolParams(C.Structure):  # ggml_threadpool_params (GGML_MAX_N_THREADS = 512)
    _fields_ = [("cpumask", C.c_bool * 512), ("n_threads", C.c_int), ("prio", C.c_int), ("poll", C.c_uint32),
                ("strict_cpu", C.c_bool), ("paused", C.c_bool)]


class _Plan(C.Structure):  # ggml_cplan
    _fields_ = [("work_size", C.c_size_t), ("work_data", P), ("n_threads", C.c_int), ("threadpool", P),
                ("abort_callback", P), ("abort_callback_data", P), ("use_ref", C.c_bool)]


class Ggml:
    """The few ggml functions a matrix product needs, from ``libggml-base.so`` and ``libggml-cpu.so`` in ``lib``."""

    def __init__(self, lib: Path, threads: int = 2) -> None:
        base = C.CDLL(str(lib / "libggml-base.so"), mode=C.RTLD_GLOBAL)
        cpu = C.CDLL(str(lib / "libggml-cpu.so"), mode=C.RTLD_GLOBAL)
        sig = {"init": (base, "ggml_init", P, _Init), "new2d": (base, "ggml_new_tensor_2d", P, P, C.c_int,
                                                                  C.c_int64, C.c_int64),
               "data": (base, "ggml_get_data", P, P), "mul_mat": (base, "ggml_mul_mat", P, P, P, P),
               "graph": (base, "ggml_new_graph", P, P), "expand": (base, "ggml_build_forward_expand", None, P, P),
               "tensor_set": (base, "ggml_backend_tensor_set", None, P, P, C.c_size_t, C.c_size_t),
               "alloc": (base, "ggml_backend_alloc_ctx_tensors_from_buft", P, P, P),
               "buft_name": (base, "ggml_backend_buft_name", C.c_char_p, P),
               "proc": (base, "ggml_backend_reg_get_proc_address", P, P, C.c_char_p),
               "dev": (base, "ggml_backend_reg_dev_get", P, P, C.c_size_t),
               "pool_params": (base, "ggml_threadpool_params_default", _PoolParams, C.c_int),
               "plan": (cpu, "ggml_graph_plan", _Plan, P, C.c_int, P),
               "compute": (cpu, "ggml_graph_compute", C.c_int, P, C.POINTER(_Plan)),
               "pool": (cpu, "ggml_threadpool_new", P, C.POINTER(_PoolParams)),
               "cpu_reg": (cpu, "ggml_backend_cpu_reg", P), "cpu_init": (cpu, "ggml_cpu_init", None)}
        for key, (so, name, res, *args) in sig.items():
            f = getattr(so, name)
            f.restype, f.argtypes = res, list(args)
            setattr(self, key, f)
        self.cpu_init()
        params = self.pool_params(threads)
        params.poll = 0  # no spinning between products: the host's threads run torch's ops there
        self.threads, self.threadpool = threads, self.pool(C.byref(params))
        reg = self.cpu_reg()
        extra = C.CFUNCTYPE(C.POINTER(P), P)(self.proc(reg, b"ggml_backend_dev_get_extra_bufts"))(self.dev(reg, 0))
        found = []
        while extra[len(found)]:  # a NULL-terminated list of buffer types
            found.append(extra[len(found)])
        self.repack = next((b for b in found if self.buft_name(b) == b"CPU_REPACK"), None)


class GgmlMatrix:
    """One weight (ggml type ``qtype``, ``raw`` bytes, ``columns`` inputs per row) and its product graphs per M."""

    def __init__(self, g: Ggml, raw: np.ndarray, qtype: int, columns: int, rows: int, repack: bool) -> None:
        self.g, self.k, self.n, self.graphs = g, columns, rows, {}
        self.ctx = g.init(_Init(raw.nbytes + (1 << 20), None, repack))
        self.w = g.new2d(self.ctx, qtype, columns, rows)
        if repack:  # llama.cpp's interleaved layout: the buffer's tensor_set repacks the file's blocks
            self.buffer = g.alloc(self.ctx, g.repack)
            g.tensor_set(self.w, raw.ctypes.data, 0, raw.nbytes)
        else:
            C.memmove(g.data(self.w), raw.ctypes.data, raw.nbytes)

    def _graph(self, m: int) -> tuple:
        if m not in self.graphs:
            g = self.g
            ctx = g.init(_Init((self.k + self.n) * m * 4 + (1 << 20), None, False))
            x = g.new2d(ctx, F32, self.k, m)
            y = g.mul_mat(ctx, self.w, x)
            graph = g.graph(ctx)
            g.expand(graph, y)
            plan = g.plan(graph, g.threads, g.threadpool)
            work = np.empty(plan.work_size + 64, np.uint8)
            plan.work_data = work.ctypes.data
            view = lambda t, cols: torch.from_numpy(  # noqa: E731
                np.ctypeslib.as_array(C.cast(g.data(t), C.POINTER(C.c_float)), (m, cols)))
            self.graphs[m] = (ctx, graph, plan, work, view(x, self.k), view(y, self.n))
        return self.graphs[m]

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        _, graph, plan, _, inp, out = self._graph(x.shape[0])
        inp.copy_(x)
        self.g.compute(graph, C.byref(plan))
        return out.clone()


def file_matrices(name: str, workdir: Path) -> list[tuple[str, int, np.ndarray, int, int]]:
    """(name, ggml type, bytes, columns, rows) of every 2-D weight of the decoder layers and the LM head of
    built-in model ``name``'s GGUF (assembled from its chunk packages into ``workdir``)."""
    import gguf

    spec = REGISTRY[name]
    reader = gguf.GGUFReader(str(assemble_gguf(chunk_paths(spec), workdir / spec.gguf_file, spec.size)))
    names = {t.name for t in reader.tensors}
    head = "output.weight" if "output.weight" in names else "token_embd.weight"
    return [(t.name, int(t.tensor_type), np.ascontiguousarray(t.data).view(np.uint8).reshape(-1),
             int(t.shape[0]), int(t.shape[1])) for t in reader.tensors
            if len(t.shape) == 2 and (t.name.startswith("blk.") or t.name == head)]


def rows_independent(mats: list[GgmlMatrix], types: list[int], m: int) -> dict[int, bool]:
    """Per ggml type: whether every matrix's product of ``m`` random rows equals its rows one at a time."""
    gen, same = torch.Generator().manual_seed(0), {}
    for mat, qtype in zip(mats, types):
        x = torch.randn(m, mat.k, generator=gen)
        same[qtype] = same.get(qtype, True) and torch.equal(mat(x), torch.cat([mat(row[None]) for row in x]))
    return same


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--ggml-lib", type=Path, required=True, help="folder with libggml-base.so and libggml-cpu.so")
    ap.add_argument("--model", default=DEFAULT_TARGET, choices=sorted(REGISTRY))
    ap.add_argument("--rows", type=int, nargs="+", default=[1, 2, 4, 8])
    ap.add_argument("--repeats", type=int, default=7)
    ap.add_argument("--rounds", type=int, default=2, help="rounds alternating the three arms")
    args = ap.parse_args()
    import gguf

    g = Ggml(args.ggml_lib)
    with tempfile.TemporaryDirectory() as tmp:
        tensors = file_matrices(args.model, Path(tmp))
        types = [qtype for _, qtype, *_ in tensors]
        repackable = {gguf.GGMLQuantizationType.Q4_0, gguf.GGMLQuantizationType.Q4_K,
                      gguf.GGMLQuantizationType.IQ4_NL}
        plain = [GgmlMatrix(g, raw, qtype, k, n, repack=False) for _, qtype, raw, k, n in tensors]
        packed = [GgmlMatrix(g, raw, qtype, k, n, repack=qtype in repackable) for _, qtype, raw, k, n in tensors]
    counts = {gguf.GGMLQuantizationType(t).name: types.count(t) for t in sorted(set(types))}
    print(f"{args.model}: {len(tensors)} matrices, {counts}", flush=True)
    model, _ = load(args.model, dtype="int4", role="draft" if args.model != DEFAULT_TARGET else "target")
    layers = [m for m in model.modules() if isinstance(m, KernelLinear)]
    for m in args.rows[1:]:
        for arm, mats in (("ggml", plain), ("ggml repacked", packed)):
            same = rows_independent(mats, types, m)
            print(f"{arm}, {m} rows at once equal to one at a time: "
                  + ", ".join(f"{gguf.GGMLQuantizationType(t).name} {'yes' if s else 'NO'}" for t, s in same.items()),
                  flush=True)
    for _ in range(args.rounds):
        for m in args.rows:
            x = {k: torch.randn(m, k) for k in {mat.k for mat in plain}}
            row = {}
            torch.set_num_threads(1)
            for arm, mats in (("ggml", plain), ("ggml repacked", packed)):
                row[arm] = median_ms(lambda: [mat(x[mat.k]) for mat in mats], args.repeats)
            torch.set_num_threads(2)
            with kernel_only(model):
                row["treespec int4"] = median_ms(lambda: [layer(x[layer.in_features]) for layer in layers],
                                                 args.repeats)
            print(f"M={m}: " + ", ".join(f"{k} {v:.1f} ms" for k, v in row.items()), flush=True)


if __name__ == "__main__":
    main()
