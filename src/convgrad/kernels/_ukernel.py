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

A second family sums products along the lanes (both operands vectors of consecutive
positions, as in the NCX arrays' rows; the 1x1 weight gradient)::

    acc[r][j]  = 0
    acc[r][j] += a[r*a_rs + k*V .. +V] * b[j*b_rs + k*V .. +V]     for each vector k of
                 npos positions (the last one masked)
    y[r*y_rs + j] += sum of acc[r][j]'s lanes (a fixed halving tree)

for r < R and j < J, reached through ``dotkernel(R, J, ...)``.

A third family is a small stencil over rows (the depthwise forward and data gradient on
their phase grids, one channel)::

    y[u*y_rs + p] (+)= sum_{kh < KH, kw < KW} w[kh*KW + kw] * x[(u + kh)*x_rs + kw*x_cs + p]

for u < U rows and p < npos (the last vector masked), taps row-major, through
``stencil(stencil_key(KH, KW, U, accumulate), ...)``: each input row is loaded once for
the up to KH output rows that read it.

Variants for every ``1 <= OB <= OB_MAX`` and ``1 <= R <= r_limits(V)[OB - 1]`` are reached through one
entry point, ``ukernel(R, OB, ...)``, whose address the numba drivers call
(``_blocked_jit.py``). Arguments are 64-bit integers, addresses included. Compiling all
variants (and the transpose) takes 1-4 s, once per process, on first use (measured: 1.0 s
for AVX-512 on the Intel Xeon, 1.9 s for AVX2 on the AMD EPYC, whose variants come twice;
3.9 s on the AVX-512 Zen 5, whose variants come twice too: see the unmasked copies at
``REGISTERS``).
"""

from __future__ import annotations

import functools
import hashlib
import os
import platform

LANES_AVX512 = 16
LANES_AVX2 = 8
# (R_MAX, OB_MAX): R*OB accumulators + OB loaded vectors + 1 broadcast must fit the 32
# (AVX-512) or 16 (AVX2) vector registers: 6 x 4 + 4 + 1 = 29, 4 x 3 + 3 + 1 = 16.
TILES = {LANES_AVX512: (6, 4), LANES_AVX2: (4, 3)}
# Vector registers of each width, and the most rows any variant has: with fewer vectors per
# row a tile can have more rows (``r_limits``: 12 x 2 of 16 lanes, 24 accumulators), for
# the weight gradient's tiles whose rows run over (tap, channel) pairs.
REGISTERS = {LANES_AVX512: 32, LANES_AVX2: 16}
# Unmasked copies: each variant has an unmasked copy for ``tail == V``. On AVX2 a mask takes
# one of the 16 vector registers, which the 4 x 3 tile's 12 accumulators + 3 loaded vectors
# + 1 broadcast fill: LLVM then spilled two accumulators and rebuilt the mask on every step
# of the loop. On AVX-512 the mask lives in a mask register (k0-k7), but
# the masked last vector of every tile (the micro-kernel's only masked accesses) read and
# wrote whole NCX rows at about half the rate of plain accesses where they missed the cache
# (see PREFETCH_ROWS below). In-process, the two entry points' calls interleaved in one
# process, 2 threads, unmasked copies / masked only: 1x1 data gradients resnet_50
# res2b_branch2a 0.84, mobilenet conv2 0.92, conv3 0.95, conv4 0.93; 1x1 forwards 0.83,
# 0.97, 0.95; wavenet conv1d_10 data gradient and forward 0.96 and 0.95; channels-last
# tiles (3x3, 3x3x3) and the weight gradients 0.99-1.02.
R_TALL = 12
# (R_MAX, J_MAX) of the lane-sum family: R*J accumulators + R loaded vectors + 1.
DOT_TILES = {LANES_AVX512: (4, 6), LANES_AVX2: (3, 3)}
DOT_NARGS = 7   # a, b, y, npos, a_rs, b_rs, y_rs
TRANSPOSE_NARGS = 7   # src, src_rs, dst, dst_rs, nr, nc, sl
# The stencil family (depthwise forwards and data gradients): blocks of at most
# STENCIL_KH x STENCIL_KW taps, STENCIL_U output rows per call (KH*KW broadcast weights + U
# accumulators + a loaded vector: 14 of AVX2's 16 registers at the largest), or one row
# (the rows left over): with every row count from 1 to 4 the module took 1.85 s to
# compile instead of 0.96-1.06 without the family, with these two 1.40-1.49 s.
STENCIL_KH, STENCIL_KW, STENCIL_U = 3, 3, 4
STENCIL_NARGS = 7     # x, w, y, npos, x_rs, x_cs, y_rs
# The stride-2 data-gradient family (``_up2_variant_ir``): up to UP2_R rows of taps, UP2_A
# taps of each parity per row (kernels up to 2*UP2_A wide), UP2_U output rows per call.
UP2_R, UP2_A, UP2_U = 3, 2, 4
UP2_NARGS = 8         # x, w, y, nvec, x_rs, y_rs, lo, hi: see _up2_variant_ir
# The row weight-gradient and forward families (``_rowdot_variant_ir``,
# ``_rowfwd_variant_ir``; depthwise rows read in place, stride 1 or 2 along them): up to
# ROW_R kernel rows of up to ROW_KW taps per call (R*KW accumulators, or broadcast
# weights); the same ten arguments. With stride 2 a pair of taps shares its two loads
# (``_row_reads_ir``): warm, back to back, 2 threads, on an AMD EPYC Zen 3, us, pairs /
# a load pair per tap: mobilenet conv2_2/dw (64 x 112^2) weight gradient 247-250 / 341-345,
# forward 250-252 / 352-355; conv3_2/dw (128 x 56^2) 160-163 / 214-220, 174-175 / 225-226;
# conv4_2/dw (256 x 28^2) 114-115 / 136, 119-122 / 144.
ROW_R, ROW_KW = 3, 4
ROW_NARGS = 10       # x, dy or w, acc or y, npos, nrows, x_rs, x_us, dy_rs or y_rs, lo, hi
# Software prefetch in the depthwise families (row, stencil, up2), PREFETCH_ROWS rows of
# the call ahead of the vector being read or written. On this Zen 5 a masked load or store
# whose line is not in the cache runs at about half a plain access's rate (a 4 MB sum
# after a 20 ms sleep: masked loads 7.5-8.3 GB/s, plain 13-15; masked stores 8.7, plain
# 16.5), presumably because masked accesses do not train the hardware prefetchers; with
# an explicit prefetch both ran 15-25 GB/s, and in the cache nothing changed. The row
# kernels read every ``x`` element masked (the padding and the row's end), so a weight
# gradient whose images had left the cache (a 0.5 s pause, then calls back to back, one
# thread) ran 1.4, 1.2, 1.2, 0.9, 0.7 ms per call on mobilenet conv2_2/dw before
# settling at 0.14; with these prefetches 0.56, 0.26, 0.21, 0.19. The rows of ``x`` a
# call reads move ``x_us`` per output row, so the first PREFETCH_R of its kernel rows,
# ahead, cover every row for strides up to 2.
PREFETCH_ROWS = 4
PREFETCH_R = 2
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


def r_limits(V: int) -> tuple[int, ...]:
    """The most rows ``R`` of a variant with ``OB`` vectors per row, for ``OB = 1 ..
    OB_MAX`` (pure): ``R*OB`` accumulators + ``OB`` loaded vectors + 1 broadcast fit the
    registers, at least ``R_MAX`` and at most ``R_TALL`` rows."""
    r_max, ob_max = TILES[V]
    return tuple(max(r_max, min(R_TALL, (REGISTERS[V] - ob - 1) // ob)) for ob in range(1, ob_max + 1))


def _vector_load(dst: str, ptr: str, V: int, masked: bool) -> str:
    """One IR line: ``V`` floats from ``ptr`` into ``dst``, only the lanes of ``%mask`` if
    ``masked`` (zeros in the others)."""
    vt = f"<{V} x float>"
    if masked:
        return f"  {dst} = call {vt} @llvm.masked.load.v{V}f32.p0(ptr {ptr}, i32 4, <{V} x i1> %mask, {vt} zeroinitializer)"
    return f"  {dst} = load {vt}, ptr {ptr}, align 4"


def _variant_ir(name: str, R: int, OB: int, V: int, masked: bool = True) -> str:
    """One ``(R, OB)`` variant; with ``masked`` False every vector is whole (``tail`` is
    not read: the caller passes ``tail == V``)."""
    vt = f"<{V} x float>"
    L: list[str] = []
    a = L.append
    last = OB - 1 if masked else -1

    def load(dst: str, ptr: str, j: int) -> None:
        a(_vector_load(dst, ptr, V, j == last))

    a(f"define internal void @{name}(i64 %aa, i64 %ba, i64 %ya, i64 %aoffa, i64 %boffa, i64 %ntaps, i64 %K, "
      f"i64 %a_rs, i64 %a_ks, i64 %b_ks, i64 %y_rs, i64 %accf, i64 %tail) #0 {{")
    a("entry:")
    if masked:
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


def _npos_ir(V: int) -> list[str]:
    """IR lines: ``%full`` whole vectors in ``%npos`` positions, ``%tail`` left over, and
    ``%mask`` of the tail's lanes."""
    lanes = ", ".join(f"i32 {i}" for i in range(V))
    return [f"  %full = sdiv i64 %npos, {V}", f"  %tail = srem i64 %npos, {V}", "  %tail32 = trunc i64 %tail to i32",
            f"  %tailv.0 = insertelement <{V} x i32> poison, i32 %tail32, i64 0",
            f"  %tailv = shufflevector <{V} x i32> %tailv.0, <{V} x i32> poison, <{V} x i32> zeroinitializer",
            f"  %mask = icmp slt <{V} x i32> <{lanes}>, %tailv"]


def _dot_variant_ir(name: str, R: int, J: int, V: int) -> str:
    vt = f"<{V} x float>"
    L: list[str] = []
    a = L.append
    acc = [(r, j) for r in range(R) for j in range(J)]
    a(f"define internal void @{name}(i64 %aa, i64 %ba, i64 %ya, i64 %npos, i64 %a_rs, i64 %b_rs, i64 %y_rs) #0 {{")
    a("entry:")
    for v in ("a", "b", "y"):
        a(f"  %{v} = inttoptr i64 %{v}a to ptr")
    L += _npos_ir(V)
    for r in range(R):
        a(f"  %ar{r} = mul i64 %a_rs, {r}")
    for j in range(J):
        a(f"  %br{j} = mul i64 %b_rs, {j}")
    a("  %any = icmp sgt i64 %full, 0")
    a("  br i1 %any, label %loop, label %epi")
    a("loop:")
    a("  %k = phi i64 [0, %entry], [%k1, %loop]")
    for r, j in acc:
        a(f"  %c{r}_{j} = phi {vt} [zeroinitializer, %entry], [%n{r}_{j}, %loop]")
    a(f"  %kv = mul i64 %k, {V}")

    def body(tag: str, masked: bool, src: str) -> None:
        for r in range(R):
            a(f"  %ai{r}{tag} = add i64 %ar{r}, %kv{tag}")
            a(f"  %ap{r}{tag} = getelementptr float, ptr %a, i64 %ai{r}{tag}")
            a(_vector_load(f"%av{r}{tag}", f"%ap{r}{tag}", V, masked))
        for j in range(J):
            a(f"  %bi{j}{tag} = add i64 %br{j}, %kv{tag}")
            a(f"  %bp{j}{tag} = getelementptr float, ptr %b, i64 %bi{j}{tag}")
            a(_vector_load(f"%bv{j}{tag}", f"%bp{j}{tag}", V, masked))
            for r in range(R):
                a(f"  %n{r}_{j}{tag} = call {vt} @llvm.fma.v{V}f32({vt} %av{r}{tag}, {vt} %bv{j}{tag}, {vt} {src}{r}_{j})")

    body("", False, "%c")
    a("  %k1 = add i64 %k, 1")
    a("  %more = icmp slt i64 %k1, %full")
    a("  br i1 %more, label %loop, label %epi")
    a("epi:")
    for r, j in acc:
        a(f"  %e{r}_{j} = phi {vt} [zeroinitializer, %entry], [%n{r}_{j}, %loop]")
    a("  %hastail = icmp sgt i64 %tail, 0")
    a("  br i1 %hastail, label %last, label %sum")
    a("last:")
    a(f"  %kvm = mul i64 %full, {V}")
    body("m", True, "%e")
    a("  br label %sum")
    a("sum:")
    for r, j in acc:
        a(f"  %s{r}_{j} = phi {vt} [%e{r}_{j}, %epi], [%n{r}_{j}m, %last]")
    for r, j in acc:
        _lane_sum_ir(a, f"%s{r}_{j}", f"{r}_{j}", V)
        a(f"  %yo{r}_{j}.0 = mul i64 %y_rs, {r}")
        a(f"  %yo{r}_{j} = add i64 %yo{r}_{j}.0, {j}")
        a(f"  %yp{r}_{j} = getelementptr float, ptr %y, i64 %yo{r}_{j}")
        a(f"  %yl{r}_{j} = load float, ptr %yp{r}_{j}")
        a(f"  %ys{r}_{j} = fadd float %yl{r}_{j}, %t{r}_{j}")
        a(f"  store float %ys{r}_{j}, ptr %yp{r}_{j}")
    a("  ret void")
    a("}")
    return "\n".join(L)


def _stencil_variant_ir(name: str, KH: int, KW: int, U: int, V: int, accumulate: bool) -> str:
    """One ``(KH, KW, U)`` variant of the stencil family (``module_ir``): for u < U and p <
    npos, ``y[u*y_rs + p] (+)= sum over kh < KH, kw < KW, row-major, of w[kh*KW + kw] *
    x[(u + kh)*x_rs + kw*x_cs + p]``, each term one FMA, the weights broadcast once per
    call. The U rows share their input rows: row ``i`` of ``x`` is loaded once per
    vector of positions for the up to KH outputs that read it, (U + KH - 1)*KW loads for
    U*KH*KW terms. The last vector of a row is masked."""
    vt = f"<{V} x float>"
    L: list[str] = []
    a = L.append
    a(f"define internal void @{name}(i64 %xa, i64 %wa, i64 %ya, i64 %npos, i64 %x_rs, i64 %x_cs, i64 %y_rs) #0 {{")
    a("entry:")
    for v in ("x", "w", "y"):
        a(f"  %{v} = inttoptr i64 %{v}a to ptr")
    L += _npos_ir(V)
    for t in range(KH * KW):
        a(f"  %wp{t} = getelementptr float, ptr %w, i64 {t}")
        a(f"  %ws{t} = load float, ptr %wp{t}")
        a(f"  %wv{t}.0 = insertelement {vt} poison, float %ws{t}, i64 0")
        a(f"  %wv{t} = shufflevector {vt} %wv{t}.0, {vt} poison, <{V} x i32> zeroinitializer")
    for i in range(U + KH - 1):
        a(f"  %xr{i} = mul i64 %x_rs, {i}")
        for kw in range(KW):
            a(f"  %xc{i}_{kw} = mul i64 %x_cs, {kw}")
            a(f"  %xo{i}_{kw} = add i64 %xr{i}, %xc{i}_{kw}")
    for u in range(U):
        a(f"  %yo{u} = mul i64 %y_rs, {u}")
    a(f"  %pfxd = mul i64 %x_rs, {PREFETCH_ROWS}")
    a(f"  %pfyd = mul i64 %y_rs, {PREFETCH_ROWS}")
    a("  %any = icmp sgt i64 %full, 0")
    a("  br i1 %any, label %loop, label %epi")

    def body(tag: str, masked: bool) -> None:
        kv = f"%kv{tag}"
        step = [0] * U
        for u in range(U):
            a(f"  %yi{u}{tag} = add i64 %yo{u}, {kv}")
            a(f"  %yp{u}{tag} = getelementptr float, ptr %y, i64 %yi{u}{tag}")
            if accumulate:
                a(_vector_load(f"%c{u}_0{tag}", f"%yp{u}{tag}", V, masked))
        for i in range(U + KH - 1):
            for kw in range(KW):
                a(f"  %xi{i}_{kw}{tag} = add i64 %xo{i}_{kw}, {kv}")
                a(f"  %xp{i}_{kw}{tag} = getelementptr float, ptr %x, i64 %xi{i}_{kw}{tag}")
                a(_vector_load(f"%xv{i}_{kw}{tag}", f"%xp{i}_{kw}{tag}", V, masked))
        if not masked:      # the rows the next calls read, and the rows they write
            for u in range(U):
                _prefetch_ir(a, f"pfx{u}", f"%xp{u + KH - 1}_0", "%pfxd", False)
                _prefetch_ir(a, f"pfy{u}", f"%yp{u}", "%pfyd", True)
        for u in range(U):
            for kh in range(KH):
                for kw in range(KW):
                    acc = f"%c{u}_{step[u]}{tag}" if accumulate or step[u] else "zeroinitializer"
                    a(f"  %c{u}_{step[u] + 1}{tag} = call {vt} @llvm.fma.v{V}f32({vt} %wv{kh * KW + kw}, "
                      f"{vt} %xv{u + kh}_{kw}{tag}, {vt} {acc})")
                    step[u] += 1
        for u in range(U):
            val = f"%c{u}_{step[u]}{tag}"
            if masked:
                a(f"  call void @llvm.masked.store.v{V}f32.p0({vt} {val}, ptr %yp{u}{tag}, i32 4, <{V} x i1> %mask)")
            else:
                a(f"  store {vt} {val}, ptr %yp{u}{tag}, align 4")

    a("loop:")
    a("  %k = phi i64 [0, %entry], [%k1, %loop]")
    a(f"  %kv = mul i64 %k, {V}")
    body("", False)
    a("  %k1 = add i64 %k, 1")
    a("  %more = icmp slt i64 %k1, %full")
    a("  br i1 %more, label %loop, label %epi")
    a("epi:")
    a("  %hastail = icmp sgt i64 %tail, 0")
    a("  br i1 %hastail, label %last, label %done")
    a("last:")
    a(f"  %kvm = mul i64 %full, {V}")
    body("m", True)
    a("  br label %done")
    a("done:")
    a("  ret void")
    a("}")
    return "\n".join(L)


def _up2_variant_ir(name: str, R: int, A: int, U: int, V: int) -> str:
    """One ``(R, A, U)`` variant of the stride-2 data-gradient family (``module_ir``):
    output rows ``u < U`` at ``y + u*y_rs``, lane ``i`` of vector ``b < nvec`` the element
    ``b*V + i``, stored where ``lo <= b*V + i < hi``, are

        y[u*y_rs + 2p + e] = sum over r < R, a < A of w[(r*A + a)*2 + e] * x[(u - r)*x_rs + p - a]

    (``e`` the lane's parity): each half vector of ``x`` is loaded once per term and its
    elements doubled into both lanes of their pair (one shuffle), times the weight pair
    repeated across the vector. A stride-2 data gradient along a row interleaves its two
    phases this way with no phase grids: output column ``t = 2p + e`` (padded) reads
    ``diff_dst[p - a]`` with kernel tap ``e + 2a``."""
    vt = f"<{V} x float>"
    ht = f"<{V // 2} x float>"
    L: list[str] = []
    a_ = L.append
    a_(f"define internal void @{name}(i64 %xa, i64 %wa, i64 %ya, i64 %nvec, i64 %x_rs, i64 %y_rs, i64 %lo, "
       f"i64 %hi) #0 {{")
    a_("entry:")
    for v in ("x", "w", "y"):
        a_(f"  %{v} = inttoptr i64 %{v}a to ptr")
    lanes = ", ".join(f"i32 {i}" for i in range(V))
    dup = ", ".join(f"i32 {i // 2}" for i in range(V))
    pair = ", ".join(f"i32 {i % 2}" for i in range(V))
    for t in range(R * A):
        a_(f"  %wp{t} = getelementptr float, ptr %w, i64 {2 * t}")
        a_(f"  %ws{t} = load <2 x float>, ptr %wp{t}, align 4")
        a_(f"  %wv{t} = shufflevector <2 x float> %ws{t}, <2 x float> poison, <{V} x i32> <{pair}>")
    for v in ("lo", "hi"):
        a_(f"  %{v}32 = trunc i64 %{v} to i32")
        a_(f"  %{v}v.0 = insertelement <{V} x i32> poison, i32 %{v}32, i64 0")
        a_(f"  %{v}v = shufflevector <{V} x i32> %{v}v.0, <{V} x i32> poison, <{V} x i32> zeroinitializer")
    a_(f"  %pfyd = mul i64 %y_rs, {PREFETCH_ROWS}")
    for u in range(U):
        a_(f"  %yo{u} = mul i64 %y_rs, {u}")
        for r in range(R):
            a_(f"  %xo{u}_{r} = mul i64 %x_rs, {u - r}")
    a_("  %any = icmp sgt i64 %nvec, 0")
    a_("  br i1 %any, label %loop, label %done")
    a_("loop:")
    a_("  %b = phi i64 [0, %entry], [%b1, %st.join]")
    a_(f"  %yv = mul i64 %b, {V}")
    a_(f"  %xv = mul i64 %b, {V // 2}")
    a_("  %yv32 = trunc i64 %yv to i32")
    a_(f"  %bv.0 = insertelement <{V} x i32> poison, i32 %yv32, i64 0")
    a_(f"  %bv = shufflevector <{V} x i32> %bv.0, <{V} x i32> poison, <{V} x i32> zeroinitializer")
    a_(f"  %idx = add <{V} x i32> %bv, <{lanes}>")
    a_(f"  %ge = icmp sge <{V} x i32> %idx, %lov")
    a_(f"  %lt = icmp slt <{V} x i32> %idx, %hiv")
    a_(f"  %in = and <{V} x i1> %ge, %lt")
    a_("  %wlo = icmp sge i64 %yv, %lo")
    a_(f"  %yend = add i64 %yv, {V}")
    a_("  %whi = icmp sle i64 %yend, %hi")
    a_("  %whole = and i1 %wlo, %whi")
    stores = []
    for u in range(U):
        acc = "zeroinitializer"
        for r in range(R):
            for k in range(A):
                a_(f"  %xi{u}_{r}_{k} = add i64 %xo{u}_{r}, {-k}")
                a_(f"  %xj{u}_{r}_{k} = add i64 %xi{u}_{r}_{k}, %xv")
                a_(f"  %xp{u}_{r}_{k} = getelementptr float, ptr %x, i64 %xj{u}_{r}_{k}")
                a_(f"  %xh{u}_{r}_{k} = load {ht}, ptr %xp{u}_{r}_{k}, align 4")
                a_(f"  %xd{u}_{r}_{k} = shufflevector {ht} %xh{u}_{r}_{k}, {ht} poison, <{V} x i32> <{dup}>")
                a_(f"  %c{u}_{r}_{k} = call {vt} @llvm.fma.v{V}f32({vt} %xd{u}_{r}_{k}, {vt} %wv{r * A + k}, {vt} {acc})")
                acc = f"%c{u}_{r}_{k}"
        a_(f"  %yi{u} = add i64 %yo{u}, %yv")
        a_(f"  %yp{u} = getelementptr float, ptr %y, i64 %yi{u}")
        _prefetch_ir(a_, f"pfy{u}", f"%yp{u}", "%pfyd", True)
        stores.append((acc, f"%yp{u}"))
    _split_store_ir(a_, stores, "%in", "%whole", "st", V)
    a_("  %b1 = add i64 %b, 1")
    a_("  %more = icmp slt i64 %b1, %nvec")
    a_("  br i1 %more, label %loop, label %done")
    a_("done:")
    a_("  ret void")
    a_("}")
    return "\n".join(L)


def _split_store_ir(a_, stores: list[tuple[str, str]], mask: str, whole: str, tag: str, V: int) -> None:
    """IR lines storing each ``(value, pointer)`` of ``stores``: plain stores where the i1
    ``whole`` says every lane of ``mask`` is set, masked stores under ``mask`` otherwise;
    the lines after them run in block ``%{tag}.join``. A masked 256-bit store is
    microcoded on AMD Zen 3 (AVX2): the depthwise row families, which had stored every
    vector masked, ran 1.2-1.8x slower there than the phase grids they replaced
    (mobilenet's stride-2 data gradients); only a row's edge vectors need the mask."""
    vt = f"<{V} x float>"
    a_(f"  br i1 {whole}, label %{tag}.plain, label %{tag}.masked")
    a_(f"{tag}.plain:")
    for val, ptr in stores:
        a_(f"  store {vt} {val}, ptr {ptr}, align 4")
    a_(f"  br label %{tag}.join")
    a_(f"{tag}.masked:")
    for val, ptr in stores:
        a_(f"  call void @llvm.masked.store.v{V}f32.p0({vt} {val}, ptr {ptr}, i32 4, <{V} x i1> {mask})")
    a_(f"  br label %{tag}.join")
    a_(f"{tag}.join:")


def _prefetch_ir(a_, name: str, base: str, ahead: str, write: bool) -> None:
    """IR lines asking for the cache line at float ``base + ahead`` of ``%{base}``'s
    pointer (``llvm.prefetch``; a hint, never a fault, whatever the address)."""
    a_(f"  %{name} = getelementptr float, ptr {base}, i64 {ahead}")
    a_(f"  call void @llvm.prefetch.p0(ptr %{name}, i32 {int(write)}, i32 3, i32 1)")


def _splat_ir(a_, src: str, dst: str, V: int) -> None:
    """IR lines: the i64 ``src`` as i32 in every lane of ``dst``."""
    it = f"<{V} x i32>"
    a_(f"  {dst}.32 = trunc i64 {src} to i32")
    a_(f"  {dst}.0 = insertelement {it} poison, i32 {dst}.32, i64 0")
    a_(f"  {dst} = shufflevector {it} {dst}.0, {it} poison, {it} zeroinitializer")


def _row_reads_ir(a_, R: int, KW: int, S: int, V: int) -> None:
    """IR lines of the row families' reads, in the vector loop (``%o0``: the first output
    of the vector, ``%xu``: the row's offset in ``x``): ``%om``, the real outputs
    (``o < npos``), and ``%xs{r}_{k}``, lane ``i`` = ``x[xu + r*x_rs + S*(o0 + i) + k]``
    where ``lo <= S*(o0 + i) + k < hi`` and the output is real, else zero. S = 1: one
    masked load per tap. S = 2: two masked loads per pair of taps ``(k, k + 1)``, ``k``
    even (the cells ``S*o + k`` and ``S*o + k + 1`` of one output are neighbours), and an
    in-lane two-source shuffle each (one ``vshufps``) of their even lanes for tap ``k``
    and of their odd lanes for ``k + 1``: lane ``i`` then holds output ``_s2_order(V)[i]``,
    which the callers match (the weight gradient's ``diff_dst`` vector
    put in that order, the forward's sum put back before its store)."""
    vt, it, mt = f"<{V} x float>", f"<{V} x i32>", f"<{V} x i1>"
    lanes = ", ".join(f"i32 {i}" for i in range(V))
    upper = ", ".join(f"i32 {i + V}" for i in range(V))
    _splat_ir(a_, "%o0", "%o0v", V)
    a_(f"  %oi = add {it} %o0v, <{lanes}>")
    a_(f"  %om = icmp slt {it} %oi, %nposv")
    # the output each loaded lane belongs to (S == 2: lane l of the first load, l // 2)
    loads = (("a", ", ".join(f"i32 {i // 2}" for i in range(V)), lanes),
             ("b", ", ".join(f"i32 {(i + V) // 2}" for i in range(V)), upper))[:S]
    if S == 2:
        for h, idx, _ in loads:
            a_(f"  %oo{h} = add {it} %o0v, <{idx}>")
            a_(f"  %om{h} = icmp slt {it} %oo{h}, %nposv")
    a_(f"  %e0 = mul i64 %o0, {S}")
    for r in range(min(R, PREFETCH_R)):
        a_(f"  %pfr{r}.0 = mul i64 %x_rs, {r}")
        a_(f"  %pfr{r}.1 = add i64 %pfr{r}.0, %xu")
        a_(f"  %pfr{r}.2 = add i64 %pfr{r}.1, %e0")
        a_(f"  %pfr{r} = add i64 %pfr{r}.2, %pfx")
        a_(f"  %pfq{r} = getelementptr float, ptr %x, i64 %pfr{r}")
        for h in range(S):
            _prefetch_ir(a_, f"pfp{r}_{h}", f"%pfq{r}", str(h * V), False)
    starts = range(0, KW, S)            # S = 2: a load pair per pair of taps (k, k + 1)
    for k in starts:
        a_(f"  %j{k} = add i64 %e0, {k}")
        _splat_ir(a_, f"%j{k}", f"%j{k}v", V)
        for h, _, off in loads:
            a_(f"  %ji{k}{h} = add {it} %j{k}v, <{off}>")
            a_(f"  %ge{k}{h} = icmp sge {it} %ji{k}{h}, %lov")
            a_(f"  %lt{k}{h} = icmp slt {it} %ji{k}{h}, %hiv")
            a_(f"  %in{k}{h}.0 = and {mt} %ge{k}{h}, %lt{k}{h}")
            a_(f"  %in{k}{h} = and {mt} %in{k}{h}.0, %om{h if S == 2 else ''}")
    evens, odds = _s2_shuffles(V)
    for r in range(R):
        a_(f"  %xr{r}.0 = mul i64 %x_rs, {r}")
        a_(f"  %xr{r} = add i64 %xr{r}.0, %xu")
        for k in starts:
            a_(f"  %xi{r}_{k} = add i64 %xr{r}, %j{k}")
            a_(f"  %xp{r}_{k}a = getelementptr float, ptr %x, i64 %xi{r}_{k}")
            a_(f"  %xp{r}_{k}b = getelementptr float, ptr %xp{r}_{k}a, i64 {V}")
            for h, _, _ in loads:
                a_(f"  %xl{r}_{k}{h} = call {vt} @llvm.masked.load.v{V}f32.p0(ptr %xp{r}_{k}{h}, i32 4, "
                   f"{mt} %in{k}{h}, {vt} zeroinitializer)")
            if S == 1:
                a_(f"  %xs{r}_{k} = shufflevector {vt} %xl{r}_{k}a, {vt} poison, <{V} x i32> <{lanes}>")
                continue
            a_(f"  %xs{r}_{k} = shufflevector {vt} %xl{r}_{k}a, {vt} %xl{r}_{k}b, <{V} x i32> <{evens}>")
            if k + 1 < KW:
                a_(f"  %xs{r}_{k + 1} = shufflevector {vt} %xl{r}_{k}a, {vt} %xl{r}_{k}b, <{V} x i32> <{odds}>")


def _s2_order(V: int) -> list[int]:
    """The output each lane holds after ``_row_reads_ir``'s stride-2 shuffles: within each
    128-bit lane of 4, two from the first load's cells then two from the second's (the
    order of one ``vshufps``), e.g. ``[0, 1, 4, 5, 2, 3, 6, 7]`` for 8 lanes."""
    return [2 * (p // 4) + p % 2 + (V // 2 if p % 4 >= 2 else 0) for p in range(V)]


def _s2_shuffles(V: int) -> tuple[str, str]:
    """Shuffle masks (two loads ``a``, ``b`` of ``2V`` consecutive cells) of the even and the
    odd cells in ``_s2_order``: lane ``p`` takes cell ``2 * _s2_order(V)[p]`` (+1)."""
    cells = [2 * o for o in _s2_order(V)]
    return (", ".join(f"i32 {c}" for c in cells), ", ".join(f"i32 {c + 1}" for c in cells))


def _order_ir(a_, src: str, dst: str, order: list[int], V: int) -> None:
    """``dst[p] = src[order[p]]``."""
    idx = ", ".join(f"i32 {i}" for i in order)
    a_(f"  {dst} = shufflevector <{V} x float> {src}, <{V} x float> poison, <{V} x i32> <{idx}>")


def _row_prologue_ir(a_, V: int, exit_label: str) -> None:
    """IR lines of both row families' entry: the bounds in every lane, the vectors per row
    (``%nvec``), and the branch past the loops when there is nothing to do."""
    for v in ("lo", "hi", "npos"):
        _splat_ir(a_, f"%{v}", f"%{v}v", V)
    a_(f"  %pfx = mul i64 %x_us, {PREFETCH_ROWS}")
    a_(f"  %nvec.0 = add i64 %npos, {V - 1}")
    a_(f"  %nvec = sdiv i64 %nvec.0, {V}")
    a_("  %anyr = icmp sgt i64 %nrows, 0")
    a_("  %anyv = icmp sgt i64 %nvec, 0")
    a_("  %any = and i1 %anyr, %anyv")
    a_(f"  br i1 %any, label %rows, label %{exit_label}")


def _lane_sum_ir(a_, src: str, tag: str, V: int) -> str:
    """IR lines adding the lanes of ``src`` by a fixed halving tree (lanes [0, w/2) plus
    [w/2, w) until one is left); returns the scalar's name."""
    v, width, step = src, V, 0
    while width > 1:
        half = width // 2
        lo = ", ".join(f"i32 {i}" for i in range(half))
        hi = ", ".join(f"i32 {i + half}" for i in range(half))
        a_(f"  %h{tag}_{step}l = shufflevector <{width} x float> {v}, <{width} x float> poison, <{half} x i32> <{lo}>")
        a_(f"  %h{tag}_{step}h = shufflevector <{width} x float> {v}, <{width} x float> poison, <{half} x i32> <{hi}>")
        a_(f"  %h{tag}_{step} = fadd <{half} x float> %h{tag}_{step}l, %h{tag}_{step}h")
        v, width, step = f"%h{tag}_{step}", half, step + 1
    a_(f"  %t{tag} = extractelement <1 x float> {v}, i64 0")
    return f"%t{tag}"


def _rowdot_variant_ir(name: str, R: int, KW: int, V: int, S: int) -> str:
    """One ``(R, KW, S)`` variant of the row weight-gradient family (``module_ir``):
    ``acc[r*KW + k] += sum over u < nrows, o < npos of dy[u*dy_rs + o] *
    x[u*x_us + r*x_rs + S*o + k]`` for r < R, k < KW, where an ``x`` element counts only
    if ``lo <= S*o + k < hi`` (outside it reads as zero: the padding) and its output is
    real (``o < npos``), read as ``_row_reads_ir`` reads them. The sums run in the vector
    lanes from zero, then a fixed halving tree adds each accumulator's lanes into ``acc``."""
    vt, mt = f"<{V} x float>", f"<{V} x i1>"
    L: list[str] = []
    a_ = L.append
    a_(f"define internal void @{name}(i64 %xa, i64 %da, i64 %aa, i64 %npos, i64 %nrows, i64 %x_rs, i64 %x_us, "
       f"i64 %dy_rs, i64 %lo, i64 %hi) #0 {{")
    a_("entry:")
    for v in ("x", "d", "a"):
        a_(f"  %{v} = inttoptr i64 %{v}a to ptr")
    a_(f"  %pfdd = mul i64 %dy_rs, {PREFETCH_ROWS}")
    _row_prologue_ir(a_, V, "sum")
    acc = [(r, k) for r in range(R) for k in range(KW)]
    a_("rows:")
    a_("  %u = phi i64 [0, %entry], [%u1, %rowend]")
    for r, k in acc:
        a_(f"  %cr{r}_{k} = phi {vt} [zeroinitializer, %entry], [%cn{r}_{k}, %rowend]")
    a_("  %xu = mul i64 %u, %x_us")
    a_("  %du = mul i64 %u, %dy_rs")
    a_("  br label %vec")
    a_("vec:")
    a_("  %b = phi i64 [0, %rows], [%b1, %vec]")
    for r, k in acc:
        a_(f"  %c{r}_{k} = phi {vt} [%cr{r}_{k}, %rows], [%n{r}_{k}, %vec]")
    a_(f"  %o0 = mul i64 %b, {V}")
    _row_reads_ir(a_, R, KW, S, V)
    a_("  %di = add i64 %du, %o0")
    a_("  %dp = getelementptr float, ptr %d, i64 %di")
    loaded = "%dv.0" if S == 2 else "%dv"
    a_(f"  {loaded} = call {vt} @llvm.masked.load.v{V}f32.p0(ptr %dp, i32 4, {mt} %om, {vt} zeroinitializer)")
    if S == 2:                          # in the lane order of the input cells
        _order_ir(a_, "%dv.0", "%dv", _s2_order(V), V)
    _prefetch_ir(a_, "pfdp", "%dp", "%pfdd", False)
    for r, k in acc:
        a_(f"  %n{r}_{k} = call {vt} @llvm.fma.v{V}f32({vt} %dv, {vt} %xs{r}_{k}, {vt} %c{r}_{k})")
    a_("  %b1 = add i64 %b, 1")
    a_("  %morev = icmp slt i64 %b1, %nvec")
    a_("  br i1 %morev, label %vec, label %rowend")
    a_("rowend:")
    for r, k in acc:
        a_(f"  %cn{r}_{k} = phi {vt} [%n{r}_{k}, %vec]")
    a_("  %u1 = add i64 %u, 1")
    a_("  %morer = icmp slt i64 %u1, %nrows")
    a_("  br i1 %morer, label %rows, label %sum")
    a_("sum:")
    for r, k in acc:
        a_(f"  %s{r}_{k} = phi {vt} [zeroinitializer, %entry], [%cn{r}_{k}, %rowend]")
    for r, k in acc:
        t = _lane_sum_ir(a_, f"%s{r}_{k}", f"{r}_{k}", V)
        a_(f"  %ap{r}_{k} = getelementptr float, ptr %a, i64 {r * KW + k}")
        a_(f"  %al{r}_{k} = load float, ptr %ap{r}_{k}")
        a_(f"  %as{r}_{k} = fadd float %al{r}_{k}, {t}")
        a_(f"  store float %as{r}_{k}, ptr %ap{r}_{k}")
    a_("  ret void")
    a_("}")
    return "\n".join(L)


def _rowfwd_variant_ir(name: str, R: int, KW: int, V: int, S: int) -> str:
    """One ``(R, KW, S)`` variant of the row forward family (``module_ir``): for u <
    nrows and o < npos, ``y[u*y_rs + o] = sum over r < R, k < KW of w[r*KW + k] *
    x[u*x_us + r*x_rs + S*o + k]``, an ``x`` element counting only where ``lo <= S*o + k
    < hi`` (the padding reads as zero), read as ``_row_reads_ir`` reads them, times the
    weight broadcast; the last vector of a row stored masked."""
    vt = f"<{V} x float>"
    L: list[str] = []
    a_ = L.append
    a_(f"define internal void @{name}(i64 %xa, i64 %wa, i64 %ya, i64 %npos, i64 %nrows, i64 %x_rs, i64 %x_us, "
       f"i64 %y_rs, i64 %lo, i64 %hi) #0 {{")
    a_("entry:")
    for v in ("x", "w", "y"):
        a_(f"  %{v} = inttoptr i64 %{v}a to ptr")
    for t in range(R * KW):
        a_(f"  %wp{t} = getelementptr float, ptr %w, i64 {t}")
        a_(f"  %ws{t} = load float, ptr %wp{t}")
        a_(f"  %wv{t}.0 = insertelement {vt} poison, float %ws{t}, i64 0")
        a_(f"  %wv{t} = shufflevector {vt} %wv{t}.0, {vt} poison, <{V} x i32> zeroinitializer")
    a_(f"  %pfyd = mul i64 %y_rs, {PREFETCH_ROWS}")
    _row_prologue_ir(a_, V, "done")
    a_("rows:")
    a_("  %u = phi i64 [0, %entry], [%u1, %rowend]")
    a_("  %xu = mul i64 %u, %x_us")
    a_("  %yu = mul i64 %u, %y_rs")
    a_("  br label %vec")
    a_("vec:")
    a_("  %b = phi i64 [0, %rows], [%b1, %st.join]")
    a_(f"  %o0 = mul i64 %b, {V}")
    _row_reads_ir(a_, R, KW, S, V)
    acc = "zeroinitializer"
    for r in range(R):
        for k in range(KW):
            a_(f"  %c{r}_{k} = call {vt} @llvm.fma.v{V}f32({vt} %wv{r * KW + k}, {vt} %xs{r}_{k}, {vt} {acc})")
            acc = f"%c{r}_{k}"
    if S == 2:                          # lane o back to output o
        order = _s2_order(V)
        _order_ir(a_, acc, "%cy", [order.index(o) for o in range(V)], V)
        acc = "%cy"
    a_("  %yi = add i64 %yu, %o0")
    a_("  %yp = getelementptr float, ptr %y, i64 %yi")
    _prefetch_ir(a_, "pfy", "%yp", "%pfyd", True)
    a_(f"  %oend = add i64 %o0, {V}")
    a_("  %whole = icmp sle i64 %oend, %npos")
    _split_store_ir(a_, [(acc, "%yp")], "%om", "%whole", "st", V)
    a_("  %b1 = add i64 %b, 1")
    a_("  %morev = icmp slt i64 %b1, %nvec")
    a_("  br i1 %morev, label %vec, label %rowend")
    a_("rowend:")
    a_("  %u1 = add i64 %u, 1")
    a_("  %morer = icmp slt i64 %u1, %nrows")
    a_("  br i1 %morer, label %rows, label %done")
    a_("done:")
    a_("  ret void")
    a_("}")
    return "\n".join(L)


def _switch_entry_ir(entry: str, variants: list[tuple], key, nargs: int) -> str:
    """``entry(key, x0 .. x_nargs)``: a switch on ``key`` (``key(*variant)``) calling the
    variant ``{entry}_{v0}_{v1}_...`` with the other arguments."""
    args = ", ".join(f"i64 %x{i}" for i in range(nargs))
    out = [f"define void @{entry}(i64 %key, {args}) #0 {{", "entry:", "  switch i64 %key, label %done ["]
    out += [f"    i64 {key(*v)}, label %c{key(*v)}" for v in variants]
    out.append("  ]")
    for v in variants:
        out += [f"c{key(*v)}:", f"  call void @{entry}_{'_'.join(str(int(p)) for p in v)}({args})", "  br label %done"]
    out += ["done:", "  ret void", "}"]
    return "\n".join(out)


def _row_entries_ir(V: int) -> list[str]:
    variants = [(R, KW, S) for S in (1, 2) for R in range(1, ROW_R + 1) for KW in range(1, ROW_KW + 1)]
    parts = []
    for entry, body in (("rowdot", _rowdot_variant_ir), ("rowfwd", _rowfwd_variant_ir)):
        parts += [body(f"{entry}_{R}_{KW}_{S}", R, KW, V, S) for R, KW, S in variants]
        parts.append(_switch_entry_ir(entry, variants, row_key, ROW_NARGS))
    return parts


def row_key(R: int, KW: int, S: int) -> int:
    """The ``rowdot`` / ``rowfwd`` entry points' first argument for one variant (pure)."""
    return (S * 8 + R) * 8 + KW


def up2_key(R: int, A: int, U: int) -> int:
    """The ``up2`` entry point's first argument for one variant (pure)."""
    return (R * 8 + A) * 8 + U


def _up2_entry_ir(V: int) -> tuple[str, list[str]]:
    variants = [(R, A, U) for R in range(1, UP2_R + 1) for A in range(1, UP2_A + 1) for U in (1, UP2_U)]
    bodies = [_up2_variant_ir(f"up2_{R}_{A}_{U}", R, A, U, V) for R, A, U in variants]
    return _switch_entry_ir("up2", variants, up2_key, UP2_NARGS), bodies


def stencil_key(KH: int, KW: int, U: int, accumulate: bool) -> int:
    """The ``stencil`` entry point's first argument for one variant (pure)."""
    return ((KH * 8 + KW) * 8 + U) * 2 + int(accumulate)


def _stencil_entry_ir(V: int) -> tuple[str, list[str]]:
    variants = [(KH, KW, U, acc) for KH in range(1, STENCIL_KH + 1) for KW in range(1, STENCIL_KW + 1)
                for U in (1, STENCIL_U) for acc in (False, True)]
    bodies = [_stencil_variant_ir(f"st_{KH}_{KW}_{U}_{int(acc)}", KH, KW, U, V, acc) for KH, KW, U, acc in variants]
    args = ", ".join(f"i64 %x{i}" for i in range(STENCIL_NARGS))
    out = [f"define void @stencil(i64 %key, {args}) #0 {{", "entry:", "  switch i64 %key, label %done ["]
    out += [f"    i64 {stencil_key(*v)}, label %c{stencil_key(*v)}" for v in variants]
    out.append("  ]")
    for KH, KW, U, acc in variants:
        k = stencil_key(KH, KW, U, acc)
        out += [f"c{k}:", f"  call void @st_{KH}_{KW}_{U}_{int(acc)}({args})", "  br label %done"]
    out += ["done:", "  ret void", "}"]
    return "\n".join(out), bodies


def transpose_ir(name: str, V: int) -> str:
    """IR of ``name(src, src_rs, dst, dst_rs, nr, nc, sl)``: the ``V x V`` block transposed,
    ``dst[j*dst_rs + i] = src[i*src_rs + j]`` for ``j < nc`` and ``i < sl``, zero for
    ``nr <= i < sl`` (the zero lanes of padded channels); nothing else is read or written.
    ``V`` rows are loaded (masked), then ``log2 V`` stages each swap one bit of the row
    index with the same bit of the column index (two two-source shuffles per pair of rows:
    one instruction each on AVX-512 and AVX2), then ``V`` rows are stored (masked).

    Masked accesses are slow: a masked 256-bit store is microcoded on AMD Zen 3, and on
    Zen 5 masked accesses that miss the cache run at about half the plain rate (see the
    unmasked copies at ``REGISTERS``). So the entry point takes a copy without masks for
    whole blocks (``nr == nc == sl == V``) and one with whole-row stores, each behind a
    branch on ``j < nc``, where ``sl == V``; the masked copy only for the others. Measured on Zen 5
    (in-process, calls of both entry points interleaved, new / masked only): resnet_50
    conv1 forward 0.89-0.92, res2a_branch2b forward 0.96, other 3x3 and 3x3x3 layers
    0.98-1.01."""
    args = "i64 %srca, i64 %src_rs, i64 %dsta, i64 %dst_rs, i64 %nr, i64 %nc, i64 %sl"
    entry = [f"define void @{name}({args}) #0 {{", "entry:",
             f"  %wide = icmp eq i64 %sl, {V}", f"  %fr = icmp eq i64 %nr, {V}", f"  %fc = icmp eq i64 %nc, {V}",
             "  %frc = and i1 %fr, %fc", "  %full = and i1 %frc, %wide",
             "  br i1 %full, label %f, label %notfull", "notfull:", "  br i1 %wide, label %w, label %m",
             "f:", f"  call void @{name}_f({args})", "  ret void",
             "w:", f"  call void @{name}_w({args})", "  ret void",
             "m:", f"  call void @{name}_m({args})", "  ret void", "}"]
    return "\n\n".join([_transpose_variant_ir(f"{name}_f", V, "plain", "internal"),
                        _transpose_variant_ir(f"{name}_w", V, "rows", "internal"),
                        _transpose_variant_ir(f"{name}_m", V, "masked", "internal"), "\n".join(entry)])


def transpose_pairs_ir(name: str, V: int) -> str:
    """IR of ``name(src, src_rs, dst, dst_rs, nr, nc, sl)``: ``transpose_ir``'s masked copy
    reading every other element of the source rows, ``dst[j*dst_rs + i] = src[i*src_rs +
    2*j]`` (a stride-2 gather folded into the transpose: two masked loads of a row, which
    read only ``src[.. 2*nc - 2]``, and one two-source shuffle of their even lanes)."""
    return _transpose_variant_ir(name, V, "masked", "", pairs=True)


def _transpose_variant_ir(name: str, V: int, mode: str, linkage: str, pairs: bool = False) -> str:
    """One copy of the transpose: ``mode`` "masked" (any block), "rows" (``sl == V``:
    masked loads, whole rows stored where ``j < nc``) or "plain" (a whole block);
    ``pairs``: the source columns are ``2*j`` (masked only)."""
    vt = f"<{V} x float>"
    mt = f"<{V} x i1>"
    L: list[str] = []
    a = L.append
    link = f"{linkage} " if linkage else ""
    a(f"define {link}void @{name}(i64 %srca, i64 %src_rs, i64 %dsta, i64 %dst_rs, i64 %nr, i64 %nc, i64 %sl) #0 {{")
    a("entry:")
    a("  %src = inttoptr i64 %srca to ptr")
    a("  %dst = inttoptr i64 %dsta to ptr")
    lanes = ", ".join(f"i32 {i}" for i in range(V))
    for m in {"masked": ("nc", "sl"), "rows": ("nc",), "plain": ()}[mode]:     # the masks this copy reads
        a(f"  %{m}32 = trunc i64 %{m} to i32")
        a(f"  %{m}v.0 = insertelement <{V} x i32> poison, i32 %{m}32, i64 0")
        a(f"  %{m}v = shufflevector <{V} x i32> %{m}v.0, <{V} x i32> poison, <{V} x i32> zeroinitializer")
        a(f"  %{m}m = icmp slt <{V} x i32> <{lanes}>, %{m}v")
    if pairs:                                 # source elements 0 .. 2*nc - 2 of each row
        upper = ", ".join(f"i32 {i + V}" for i in range(V))
        even = ", ".join(f"i32 {2 * i}" for i in range(V))
        a("  %pn.0 = shl i32 %nc32, 1")
        a("  %pn = sub i32 %pn.0, 1")
        a(f"  %pnv.0 = insertelement <{V} x i32> poison, i32 %pn, i64 0")
        a(f"  %pnv = shufflevector <{V} x i32> %pnv.0, <{V} x i32> poison, <{V} x i32> zeroinitializer")
        a(f"  %pam = icmp slt <{V} x i32> <{lanes}>, %pnv")
        a(f"  %pbm = icmp slt <{V} x i32> <{upper}>, %pnv")
        a(f"  %pb = icmp sgt i32 %pn, {V}")        # the second load reads something
    for i in range(V):
        a(f"  %lo{i} = mul i64 %src_rs, {i}")
        if mode == "plain":
            a(f"  %lp{i} = getelementptr float, ptr %src, i64 %lo{i}")
        else:
            # A row past ``nr`` loads nothing, but from row 0's address: a masked load
            # still translates its address, and rows past the array's end may lie on
            # pages not mapped or not present (a microcode assist per load on AMD Zen
            # 5: a 3-channel copy ran 4.3 or 13-19 ms depending on what followed the
            # array in memory).
            a(f"  %in{i} = icmp sgt i64 %nr, {i}")
            a(f"  %lr{i} = getelementptr float, ptr %src, i64 %lo{i}")
            a(f"  %lp{i} = select i1 %in{i}, ptr %lr{i}, ptr %src")
        if pairs:
            a(f"  %la{i} = select i1 %in{i}, {mt} %pam, {mt} zeroinitializer")
            a(f"  %lb{i} = select i1 %in{i}, {mt} %pbm, {mt} zeroinitializer")
            a(f"  %lv{i} = getelementptr float, ptr %lp{i}, i64 {V}")
            a(f"  %lq{i} = select i1 %pb, ptr %lv{i}, ptr %lp{i}")
            a(f"  %ra{i} = call {vt} @llvm.masked.load.v{V}f32.p0(ptr %lp{i}, i32 4, {mt} %la{i}, {vt} zeroinitializer)")
            a(f"  %rb{i} = call {vt} @llvm.masked.load.v{V}f32.p0(ptr %lq{i}, i32 4, {mt} %lb{i}, {vt} zeroinitializer)")
            a(f"  %r0_{i} = shufflevector {vt} %ra{i}, {vt} %rb{i}, <{V} x i32> <{even}>")
        elif mode == "plain":
            a(f"  %r0_{i} = load {vt}, ptr %lp{i}, align 4")
        else:
            a(f"  %lm{i} = select i1 %in{i}, {mt} %ncm, {mt} zeroinitializer")
            a(f"  %r0_{i} = call {vt} @llvm.masked.load.v{V}f32.p0(ptr %lp{i}, i32 4, {mt} %lm{i}, {vt} zeroinitializer)")
    stage, bit = 0, 1
    while bit < V:
        lo = ", ".join(f"i32 {j if not j & bit else V + (j ^ bit)}" for j in range(V))
        hi = ", ".join(f"i32 {j | bit if not j & bit else V + j}" for j in range(V))
        for i in range(V):
            if i & bit:
                continue
            src_a, src_b = f"%r{stage}_{i}", f"%r{stage}_{i | bit}"
            a(f"  %r{stage + 1}_{i} = shufflevector {vt} {src_a}, {vt} {src_b}, <{V} x i32> <{lo}>")
            a(f"  %r{stage + 1}_{i | bit} = shufflevector {vt} {src_a}, {vt} {src_b}, <{V} x i32> <{hi}>")
        stage, bit = stage + 1, bit * 2
    for j in range(V):
        a(f"  %so{j} = mul i64 %dst_rs, {j}")
        a(f"  %sp{j} = getelementptr float, ptr %dst, i64 %so{j}")
        if mode == "plain":
            a(f"  store {vt} %r{stage}_{j}, ptr %sp{j}, align 4")
        elif mode == "rows":          # rows j < nc, in order: stop at the first one past nc
            a(f"  %out{j} = icmp sgt i64 %nc, {j}")
            a(f"  br i1 %out{j}, label %st{j}, label %done")
            a(f"st{j}:")
            a(f"  store {vt} %r{stage}_{j}, ptr %sp{j}, align 4")
        else:                       # a row past ``nc`` stores nothing, at row 0's address
            a(f"  %out{j} = icmp sgt i64 %nc, {j}")
            a(f"  %sm{j} = select i1 %out{j}, {mt} %slm, {mt} zeroinitializer")
            a(f"  %sq{j} = select i1 %out{j}, ptr %sp{j}, ptr %dst")
            a(f"  call void @llvm.masked.store.v{V}f32.p0({vt} %r{stage}_{j}, ptr %sq{j}, i32 4, {mt} %sm{j})")
    if mode == "rows":
        a("  br label %done")
        a("done:")
    a("  ret void")
    a("}")
    return "\n".join(L)


def _tail_split_ir(name: str, V: int) -> str:
    """``name``: the unmasked variant ``name_f`` where ``tail == V`` (every channels-last
    tile, most 1x1 and 1-D tiles), else the masked one ``name_m``."""
    args = ", ".join(f"i64 %x{i}" for i in range(NARGS))
    return "\n".join([f"define internal void @{name}({args}) #0 {{", "entry:",
                      f"  %full = icmp eq i64 %x{NARGS - 1}, {V}", "  br i1 %full, label %f, label %m", "f:",
                      f"  call void @{name}_f({args})", "  ret void", "m:", f"  call void @{name}_m({args})",
                      "  ret void", "}"])


def _entry_ir(name: str, variant: str, shapes: list[tuple[int, int]], nargs: int) -> str:
    args = ", ".join(f"i64 %x{i}" for i in range(nargs))
    out = [f"define void @{name}(i64 %R, i64 %OB, {args}) #0 {{", "entry:",
           "  %hi = mul i64 %R, 64", "  %key = add i64 %hi, %OB", "  switch i64 %key, label %done ["]
    out += [f"    i64 {R * 64 + OB}, label %c{R}_{OB}" for R, OB in shapes]
    out.append("  ]")
    for R, OB in shapes:
        out += [f"c{R}_{OB}:", f"  call void @{variant}_{R}_{OB}({args})", "  br label %done"]
    out += ["done:", "  ret void", "}"]
    return "\n".join(out)


def module_ir(V: int) -> str:
    """The IR of every variant (``R <= r_limits(V)[OB - 1]``) and of the ``ukernel(R, OB,
    ...)`` and ``dotkernel(R, J, ...)`` entry points (pure)."""
    vt = f"<{V} x float>"
    parts = [f"declare {vt} @llvm.fma.v{V}f32({vt}, {vt}, {vt})\n"
             f"declare {vt} @llvm.masked.load.v{V}f32.p0(ptr, i32, <{V} x i1>, {vt})\n"
             f"declare void @llvm.masked.store.v{V}f32.p0({vt}, ptr, i32, <{V} x i1>)\n"
             "declare void @llvm.prefetch.p0(ptr, i32, i32, i32)"]
    shapes = [(R, OB) for OB, top in enumerate(r_limits(V), 1) for R in range(1, top + 1)]
    for R, OB in shapes:         # (both widths: the unmasked copies at REGISTERS)
        parts += [_variant_ir(f"uk_{R}_{OB}_m", R, OB, V), _variant_ir(f"uk_{R}_{OB}_f", R, OB, V, masked=False),
                  _tail_split_ir(f"uk_{R}_{OB}", V)]
    parts.append(_entry_ir("ukernel", "uk", shapes, NARGS))
    dr, dj = DOT_TILES[V]
    dots = [(R, J) for R in range(1, dr + 1) for J in range(1, dj + 1)]
    parts += [_dot_variant_ir(f"dk_{R}_{J}", R, J, V) for R, J in dots]
    parts.append(_entry_ir("dotkernel", "dk", dots, DOT_NARGS))
    parts.append(transpose_ir("transpose", V))
    parts.append(transpose_pairs_ir("transpose_pairs", V))
    entry, bodies = _stencil_entry_ir(V)
    parts += bodies + [entry]
    entry, bodies = _up2_entry_ir(V)
    parts += bodies + [entry]
    parts += _row_entries_ir(V)
    parts.append(f'attributes #0 = {{ nounwind "min-legal-vector-width"="{V * 32}" }}')
    return "\n\n".join(parts) + "\n"


class Compiled:
    """The compiled module of this host: ``address`` of ``ukernel``, ``lanes`` (V),
    the largest square-ish tile ``(r_max, ob_max)`` and the most rows per vector count
    ``r_limits``; ``dot_address`` of ``dotkernel`` and its largest
    tile ``(dot_r_max, dot_j_max)``; ``transpose_address`` of ``transpose`` (``transpose_ir``),
    ``transpose_pairs_address`` of ``transpose_pairs`` (``transpose_pairs_ir``);
    ``stencil_address`` of ``stencil(key, ...)`` (``stencil_key``).
    Holds the execution engine (the code lives as
    long as it does)."""

    def __init__(self, cpu: str, features: str, lanes: int) -> None:
        import llvmlite.binding as llvm
        llvm.initialize_native_target()
        llvm.initialize_native_asmprinter()
        self.cpu = cpu
        self.lanes = lanes
        self.r_max, self.ob_max = TILES[lanes]
        self.r_limits = r_limits(lanes)
        text = module_ir(lanes)
        key = _cache_key(text, cpu, features)
        cached = _read_object(key)
        self.from_cache = cached is not None
        mod = llvm.parse_assembly(text)
        mod.verify()
        tm = llvm.Target.from_default_triple().create_target_machine(cpu=cpu, features=features, opt=3)
        if cached is None:
            pb = llvm.create_pass_builder(tm, llvm.create_pipeline_tuning_options(speed_level=3))
            pb.getModulePassManager().run(mod, pb)
        self._engine = llvm.create_mcjit_compiler(mod, tm)
        self._engine.set_object_cache(
            notify_func=None if cached is not None else (lambda _module, obj: _write_object(key, obj)),
            getbuffer_func=lambda _module: cached)
        self._engine.finalize_object()
        self.address = self._engine.get_function_address("ukernel")
        self.dot_address = self._engine.get_function_address("dotkernel")
        self.transpose_address = self._engine.get_function_address("transpose")
        self.transpose_pairs_address = self._engine.get_function_address("transpose_pairs")
        self.dot_r_max, self.dot_j_max = DOT_TILES[lanes]
        self.stencil_address = self._engine.get_function_address("stencil")
        self.up2_address = self._engine.get_function_address("up2")
        self.rowdot_address = self._engine.get_function_address("rowdot")
        self.rowfwd_address = self._engine.get_function_address("rowfwd")


# The compiled module's machine code is kept on disk between processes (compiling it takes
# 1-4 s, loading it ~0.1 s): in ``CONVGRAD_CACHE_DIR``, else ``$XDG_CACHE_HOME/convgrad``
# or ``~/.cache/convgrad``; ``CONVGRAD_KERNEL_CACHE=0`` turns it off. A file is named by a
# hash of everything the code depends on (the module's IR, the CPU name and features, the
# llvmlite and LLVM versions) and holds a header, the SHA-256 of the code and the code; a
# file that does not check out (truncated, another format, too large) is ignored and
# written anew. Writes go through a temporary file and a rename, so a reader never sees
# half a file; a directory that cannot be written only costs the compile.
CACHE_MAGIC = b"convgrad-ukernel-object-1\n"
CACHE_MAX_BYTES = 64 << 20


def cache_dir() -> str | None:
    """Where the compiled micro-kernels are kept between processes (None: not kept)."""
    if os.environ.get("CONVGRAD_KERNEL_CACHE", "1").strip() == "0":
        return None
    where = os.environ.get("CONVGRAD_CACHE_DIR", "").strip()
    if where:
        return where
    base = os.environ.get("XDG_CACHE_HOME", "").strip() or os.path.join(os.path.expanduser("~"), ".cache")
    return os.path.join(base, "convgrad")


def _cache_key(text: str, cpu: str, features: str) -> str:
    import llvmlite
    import llvmlite.binding as llvm
    parts = (text, cpu, features, llvmlite.__version__, ".".join(map(str, llvm.llvm_version_info)))
    return hashlib.sha256("\0".join(parts).encode()).hexdigest()


def _cache_path(key: str) -> str | None:
    where = cache_dir()
    return None if where is None else os.path.join(where, f"ukernel-{key[:40]}.bin")


def _read_object(key: str) -> bytes | None:
    """The cached machine code for ``key``, or None (no file, or one that does not check out)."""
    path = _cache_path(key)
    if path is None:
        return None
    try:
        with open(path, "rb") as f:
            head = f.read(len(CACHE_MAGIC) + 32)
            if len(head) != len(CACHE_MAGIC) + 32 or not head.startswith(CACHE_MAGIC):
                return None
            body = f.read(CACHE_MAX_BYTES + 1)
    except OSError:
        return None
    if not body or len(body) > CACHE_MAX_BYTES or hashlib.sha256(body).digest() != head[len(CACHE_MAGIC):]:
        return None
    return body


def _write_object(key: str, obj: bytes) -> None:
    import tempfile
    path = _cache_path(key)
    if path is None or not obj or len(obj) > CACHE_MAX_BYTES:
        return
    try:
        os.makedirs(os.path.dirname(path), mode=0o700, exist_ok=True)
        fd, tmp = tempfile.mkstemp(prefix=".ukernel-", dir=os.path.dirname(path))
        try:
            with os.fdopen(fd, "wb") as f:
                f.write(CACHE_MAGIC + hashlib.sha256(obj).digest() + bytes(obj))
            os.replace(tmp, path)
        except BaseException:
            os.unlink(tmp)
            raise
    except OSError:
        pass


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
