"""Register-blocked micro-kernels compiled for this CPU with llvmlite (kernel layer).

One family of functions, written as LLVM IR and compiled once per process for the host
(``get_host_cpu_name`` / ``get_host_cpu_features``, so AVX-512 hosts get 512-bit vectors
and AVX2 hosts 256-bit ones)::

    acc[r][j]  = 0, or y[r*y_rs + V*j .. +V]                    (acc flag)
    acc[r][j] += a[aoff[t] + r*a_rs + k*a_ks] * b[boff[t] + k*b_ks + V*j .. +V]
                 for t in 0..ntaps-1, then k in 0..K-1 (in that order)
    y[r*y_rs + V*j .. +V] = acc[r][j]

for r < R and j < OB, where the last vector (``j = OB - 1``) holds only its first ``tail``
lanes (``1 <= tail <= V``: masked loads and stores, nothing read or written past them):
an ``R x (OB*V)`` tile of float32 accumulators that stays in vector
registers for the whole reduction, each term one fused multiply-add of a broadcast ``a``
element by a vector of ``b``. The same function is the inner loop of the forward
convolution on channels-last data (``r`` positions, ``k`` input channels, ``t`` the taps
that read real rows; ``b`` the weights, output channels in the lanes) and of the weight
gradient (``r`` input channels, ``k`` positions of a row, ``t`` the rows; ``b`` diff_dst,
output channels in the lanes). Every element's sum runs over ``t`` then ``k`` in order,
each term one FMA: no reassociation, so a result depends only on the order of the term
lists the drivers build, never on threads or tiles.

Variants for every ``1 <= R <= R_MAX`` and ``1 <= OB <= OB_MAX`` are reached through one
entry point, ``ukernel(R, OB, ...)``, whose address the numba drivers call
(``_blocked_jit.py``). Arguments are 64-bit integers, addresses included. Compiling all
variants takes about 0.4 s, once per process, on first use.
"""

from __future__ import annotations

import functools
import os
import platform

LANES_AVX512 = 16
LANES_AVX2 = 8
# (R_MAX, OB_MAX): R*OB accumulators + OB loaded vectors + 1 broadcast must fit the 32
# (AVX-512) or 16 (AVX2) vector registers: 6 x 4 + 4 + 1 = 29, 4 x 3 + 3 + 1 = 16.
TILES = {LANES_AVX512: (6, 4), LANES_AVX2: (4, 3)}
NARGS = 13      # a, b, y, aoff, boff, ntaps, K, a_rs, a_ks, b_ks, y_rs, acc, tail


def _features() -> tuple[str, str, int] | None:
    """(cpu name, feature string, lanes) of this host, or None where no kernel is built
    (no llvmlite, not x86-64, no AVX2 + FMA, or ``CONVGRAD_NUMBA=0``)."""
    if os.environ.get("CONVGRAD_NUMBA", "1").strip() == "0":
        return None
    if platform.machine().lower() not in ("x86_64", "amd64"):
        return None
    try:
        import llvmlite.binding as llvm
    except ImportError:
        return None
    feats = llvm.get_host_cpu_features()
    has = {k for k, v in feats.items() if v}
    if {"avx512f", "avx512vl"} <= has:
        lanes = LANES_AVX512
    elif {"avx2", "fma"} <= has:
        lanes = LANES_AVX2
    else:
        return None
    return llvm.get_host_cpu_name(), feats.flatten(), lanes


def _variant_ir(name: str, R: int, OB: int, V: int) -> str:
    vt = f"<{V} x float>"
    L: list[str] = []
    a = L.append
    last = OB - 1

    def load(dst: str, ptr: str, j: int) -> None:
        if j == last:
            a(f"  {dst} = call {vt} @llvm.masked.load.v{V}f32.p0(ptr {ptr}, i32 4, <{V} x i1> %mask, "
              f"{vt} zeroinitializer)")
        else:
            a(f"  {dst} = load {vt}, ptr {ptr}, align 4")

    a(f"define internal void @{name}(i64 %aa, i64 %ba, i64 %ya, i64 %aoffa, i64 %boffa, i64 %ntaps, i64 %K, "
      f"i64 %a_rs, i64 %a_ks, i64 %b_ks, i64 %y_rs, i64 %accf, i64 %tail) #0 {{")
    a("entry:")
    a("  %tail32 = trunc i64 %tail to i32")
    a(f"  %tailv.0 = insertelement <{V} x i32> poison, i32 %tail32, i64 0")
    a(f"  %tailv = shufflevector <{V} x i32> %tailv.0, <{V} x i32> poison, <{V} x i32> zeroinitializer")
    lanes = ", ".join(f"i32 {i}" for i in range(V))
    a(f"  %mask = icmp slt <{V} x i32> <{lanes}>, %tailv")
    for v in ("a", "b", "y", "aoff", "boff"):
        a(f"  %{v} = inttoptr i64 %{v}a to ptr")
    for r in range(R):
        a(f"  %yr{r} = mul i64 %y_rs, {r}")
        a(f"  %ar{r} = mul i64 %a_rs, {r}")
        for j in range(OB):
            a(f"  %yo{r}_{j} = add i64 %yr{r}, {j * V}")
            a(f"  %yp{r}_{j} = getelementptr float, ptr %y, i64 %yo{r}_{j}")
    a("  %doacc = icmp ne i64 %accf, 0")
    a("  br i1 %doacc, label %load, label %init")
    a("load:")
    for r in range(R):
        for j in range(OB):
            load(f"%l{r}_{j}", f"%yp{r}_{j}", j)
    a("  br label %init")
    a("init:")
    for r in range(R):
        for j in range(OB):
            a(f"  %i{r}_{j} = phi {vt} [%l{r}_{j}, %load], [zeroinitializer, %entry]")
    a("  %hast = icmp sgt i64 %ntaps, 0")
    a("  %hask = icmp sgt i64 %K, 0")
    a("  %go = and i1 %hast, %hask")
    a("  br i1 %go, label %tloop, label %done")
    a("tloop:")
    a("  %t = phi i64 [0, %init], [%t1, %kdone]")
    for r in range(R):
        for j in range(OB):
            a(f"  %ta{r}_{j} = phi {vt} [%i{r}_{j}, %init], [%n{r}_{j}, %kdone]")
    a("  %aop = getelementptr i64, ptr %aoff, i64 %t")
    a("  %ao = load i64, ptr %aop")
    a("  %bop = getelementptr i64, ptr %boff, i64 %t")
    a("  %bo = load i64, ptr %bop")
    a("  %ab = getelementptr float, ptr %a, i64 %ao")
    a("  %bb = getelementptr float, ptr %b, i64 %bo")
    a("  br label %kloop")
    a("kloop:")
    a("  %k = phi i64 [0, %tloop], [%k1, %kloop]")
    for r in range(R):
        for j in range(OB):
            a(f"  %c{r}_{j} = phi {vt} [%ta{r}_{j}, %tloop], [%n{r}_{j}, %kloop]")
    a("  %bk = mul i64 %k, %b_ks")
    for j in range(OB):
        a(f"  %bo{j} = add i64 %bk, {j * V}")
        a(f"  %bp{j} = getelementptr float, ptr %bb, i64 %bo{j}")
        load(f"%bv{j}", f"%bp{j}", j)
    a("  %ak = mul i64 %k, %a_ks")
    for r in range(R):
        a(f"  %ai{r} = add i64 %ak, %ar{r}")
        a(f"  %ap{r} = getelementptr float, ptr %ab, i64 %ai{r}")
        a(f"  %as{r} = load float, ptr %ap{r}")
        a(f"  %av{r}.0 = insertelement {vt} poison, float %as{r}, i64 0")
        a(f"  %av{r} = shufflevector {vt} %av{r}.0, {vt} poison, <{V} x i32> zeroinitializer")
        for j in range(OB):
            a(f"  %n{r}_{j} = call {vt} @llvm.fma.v{V}f32({vt} %av{r}, {vt} %bv{j}, {vt} %c{r}_{j})")
    a("  %k1 = add i64 %k, 1")
    a("  %kmore = icmp slt i64 %k1, %K")
    a("  br i1 %kmore, label %kloop, label %kdone")
    a("kdone:")
    a("  %t1 = add i64 %t, 1")
    a("  %tmore = icmp slt i64 %t1, %ntaps")
    a("  br i1 %tmore, label %tloop, label %done")
    a("done:")
    for r in range(R):
        for j in range(OB):
            a(f"  %f{r}_{j} = phi {vt} [%i{r}_{j}, %init], [%n{r}_{j}, %kdone]")
    for r in range(R):
        for j in range(OB):
            if j == last:
                a(f"  call void @llvm.masked.store.v{V}f32.p0({vt} %f{r}_{j}, ptr %yp{r}_{j}, i32 4, <{V} x i1> %mask)")
            else:
                a(f"  store {vt} %f{r}_{j}, ptr %yp{r}_{j}, align 4")
    a("  ret void")
    a("}")
    return "\n".join(L)


def module_ir(V: int, r_max: int, ob_max: int) -> str:
    """The IR of every variant and of the ``ukernel(R, OB, ...)`` entry point (pure)."""
    args = ", ".join(f"i64 %x{i}" for i in range(NARGS))
    vt = f"<{V} x float>"
    parts = [f"declare {vt} @llvm.fma.v{V}f32({vt}, {vt}, {vt})\n"
             f"declare {vt} @llvm.masked.load.v{V}f32.p0(ptr, i32, <{V} x i1>, {vt})\n"
             f"declare void @llvm.masked.store.v{V}f32.p0({vt}, ptr, i32, <{V} x i1>)"]
    parts += [_variant_ir(f"uk_{R}_{OB}", R, OB, V) for R in range(1, r_max + 1) for OB in range(1, ob_max + 1)]
    entry = [f"define void @ukernel(i64 %R, i64 %OB, {args}) #0 {{", "entry:",
             "  %hi = mul i64 %R, 64", "  %key = add i64 %hi, %OB", "  switch i64 %key, label %done ["]
    entry += [f"    i64 {R * 64 + OB}, label %c{R}_{OB}" for R in range(1, r_max + 1) for OB in range(1, ob_max + 1)]
    entry.append("  ]")
    for R in range(1, r_max + 1):
        for OB in range(1, ob_max + 1):
            entry += [f"c{R}_{OB}:", f"  call void @uk_{R}_{OB}({args})", "  br label %done"]
    entry += ["done:", "  ret void", "}"]
    parts.append("\n".join(entry))
    parts.append(f'attributes #0 = {{ nounwind "min-legal-vector-width"="{V * 32}" }}')
    return "\n\n".join(parts) + "\n"


class Compiled:
    """The compiled module of this host: ``address`` of ``ukernel``, ``lanes`` (V) and
    the largest tile ``(r_max, ob_max)``. Holds the execution engine (the code lives as
    long as it does)."""

    def __init__(self, cpu: str, features: str, lanes: int) -> None:
        import llvmlite.binding as llvm
        llvm.initialize_native_target()
        llvm.initialize_native_asmprinter()
        self.lanes = lanes
        self.r_max, self.ob_max = TILES[lanes]
        mod = llvm.parse_assembly(module_ir(lanes, self.r_max, self.ob_max))
        mod.verify()
        tm = llvm.Target.from_default_triple().create_target_machine(cpu=cpu, features=features, opt=3)
        pb = llvm.create_pass_builder(tm, llvm.create_pipeline_tuning_options(speed_level=3))
        pb.getModulePassManager().run(mod, pb)
        self._engine = llvm.create_mcjit_compiler(mod, tm)
        self._engine.finalize_object()
        self.address = self._engine.get_function_address("ukernel")


@functools.lru_cache(maxsize=1)
def compiled() -> Compiled | None:
    """This process's compiled micro-kernels, or None where none can be built."""
    host = _features()
    if host is None:
        return None
    try:
        return Compiled(*host)
    except Exception:         # an LLVM that rejects the module: the other lowerings run
        return None
