"""Scale-out example: convgrad.dask on a distributed.LocalCluster (loopback only).

Two problems whose inputs do not fit in one worker's memory limit:

1. weights gradient over a large batch of 3-D inputs (src and diff_dst generated lazily
   from random chunks with a fixed seed, so no process ever holds them whole), checked
   against the float64 sum of single-machine gradients of each sample;
2. data gradient of a large 3-D volume, checked with the adjoint identity
   <conv_forward(x, w), dy> = <x, conv_backward_data(dy, w)>, both sides reduced on the
   cluster.

It prints the problem sizes, the workers, the wall time of each computation and the peak
resident memory of every worker process. Run::

    python examples/dask_localcluster.py                  # 2 workers, 300 MiB each
    python examples/dask_localcluster.py --workers 4 --memory-limit 1GiB --scale 2
"""

from __future__ import annotations

import argparse
import logging
import os
import resource
import time

import dask
import dask.array as da
import numpy as np
from distributed import Client, LocalCluster

import convgrad
import convgrad.dask as cgd
from convgrad.spec import forward_size


def peak_rss() -> int:
    """Peak resident memory of this process in bytes (Linux reports KiB)."""
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024


def mib(n: float) -> str:
    return f"{n / 2**20:.0f} MiB"


def out_shape(shape, o, k, kw):
    return (shape[0], o) + tuple(forward_size(*a) for a in zip(shape[2:], k, kw["strides"], kw["dilations"],
                                                                kw["pads_begin"], kw["pads_end"]))


def weights_gradient(client: Client, scale: int) -> None:
    rs = da.random.default_rng(2024)
    shape, o, k = (32 * scale, 2, 48, 128, 128), 3, (3, 3, 3)
    kw = dict(strides=(1, 1, 1), dilations=(1, 1, 1), pads_begin=(1, 1, 1), pads_end=(1, 1, 1), groups=1)
    x = rs.standard_normal(shape, chunks=(1, 2, 24, 64, 128))
    dy = rs.standard_normal(out_shape(shape, o, k, kw), chunks=(1, 3, 24, 64, 128))
    print(f"weights gradient: src {x.shape} + diff_dst {dy.shape} float64 = {mib(x.nbytes + dy.nbytes)} "
          f"in {x.npartitions} + {dy.npartitions} chunks")
    dw = cgd.conv_backward_weights(x, dy, k, **kw)
    t = time.perf_counter()
    got = dw.compute(scheduler=client)
    print(f"  computed {got.shape} in {time.perf_counter() - t:.1f} s")
    # Check: single-machine gradients of whole samples, summed in float64.
    per_sample = [dask.delayed(convgrad.conv_backward_weights)(x[n:n + 1], dy[n:n + 1], k, **kw)
                  for n in range(shape[0])]
    want = np.sum(client.compute(per_sample, sync=True), axis=0)
    err = np.linalg.norm(got - want) / np.linalg.norm(want)
    print(f"  rel err vs the sum of single-machine gradients per sample: {err:.2e}")


def data_gradient(client: Client, scale: int) -> None:
    rs = da.random.default_rng(7)
    shape, o, k = (1, 4, 192 * scale, 256, 256), 6, (3, 5, 5)
    kw = dict(strides=(1, 2, 2), dilations=(2, 1, 1), pads_begin=(2, 2, 1), pads_end=(2, 1, 2), groups=2)
    w = np.random.default_rng(8).standard_normal((o, shape[1] // kw["groups"]) + k)
    x = rs.standard_normal(shape, chunks=(1, 4, 16, 128, 128))
    dy = rs.standard_normal(out_shape(shape, o, k, kw), chunks=(1, 6, 16, 64, 64))
    dx = cgd.conv_backward_data(dy, w, shape[2:], **kw)
    print(f"data gradient of a volume: diff_dst {dy.shape} ({mib(dy.nbytes)}, {dy.npartitions} chunks) -> "
          f"diff_src {dx.shape} ({mib(dx.nbytes)}, {dx.npartitions} chunks), float64; "
          f"the check also reads src {x.shape} ({mib(x.nbytes)})")
    y = cgd.conv_forward(x, w, **kw)
    t = time.perf_counter()
    # One side at a time: fewer consumers per input chunk, so fewer chunks wait in memory.
    rhs, ndx = client.compute([(x * dx).sum(), da.linalg.norm(dx.ravel())], sync=True)
    print(f"  data gradient (+ <x, dx>) in {time.perf_counter() - t:.1f} s")
    lhs, ny, ndy = client.compute([(y * dy).sum(), da.linalg.norm(y.ravel()), da.linalg.norm(dy.ravel())],
                                  sync=True)
    print(f"  adjoint: |<y, dy> - <x, dx>| / (|y| |dy|) = {abs(lhs - rhs) / (ny * ndy):.2e}"
          f"  (<y, dy> = {lhs:.6e}, <x, dx> = {rhs:.6e})")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--threads", type=int, default=1, help="threads per worker")
    ap.add_argument("--memory-limit", default="300MiB", help="per worker")
    ap.add_argument("--scale", type=int, default=1, help="multiply the batch and the volume depth")
    args = ap.parse_args()
    with LocalCluster(n_workers=args.workers, threads_per_worker=args.threads, processes=True,
                      host="127.0.0.1", dashboard_address=None, memory_limit=args.memory_limit,
                      silence_logs=logging.ERROR) as cluster, Client(cluster) as client:
        print(f"{args.workers} workers x {args.threads} thread(s), memory limit {args.memory_limit} each, "
              f"scheduler {cluster.scheduler_address}")
        base, pids = client.run(peak_rss), client.run(os.getpid)
        print(f"peak RSS per worker at start: {', '.join(mib(base[a]) for a in sorted(base))}")
        for run in (weights_gradient, data_gradient):
            run(client, args.scale)
            peaks = client.run(peak_rss)
            print(f"  peak RSS per worker so far: {', '.join(mib(peaks[a]) for a in sorted(peaks))}")
        # A worker over its memory limit is killed and restarted by its nanny (new process).
        print(f"workers restarted: {len(set(pids.values()) - set(client.run(os.getpid).values()))}")


if __name__ == "__main__":
    main()
