"""``python -m collsim.calibration.torchbench``: nccl-tests-style timing through torch.distributed.

Started by ``torchrun``/``python -m torch.distributed.run`` (or srun/mpirun: the SLURM and Open MPI
rank variables are understood), one process per rank. For every collective and size it runs
``--warmup`` untimed calls, then ``--iters`` timed calls back to back, and reports the average time
per call, combined over ranks as nccl-tests' ``-a`` does (default: mean over ranks). Rank 0 prints
nccl-tests-compatible lines and keeps each completed point in a :class:`ResultStore` at once, so a
rerun skips what is done and ``read_log`` reads ``--out/logs/<collective>.txt``.

How each collective maps onto torch.distributed (torch 2.13; gloo on CPUs supports all of them):

=============== ====================================== =====================================
collective      out-of-place                           in-place
=============== ====================================== =====================================
all_reduce      N/A (torch's all_reduce is in-place)   ``all_reduce(buf)``
all_gather      ``all_gather_single(out, in)``         input = the rank's slice of out
reduce_scatter  ``reduce_scatter_single(out, in)``     output = the rank's slice of in
broadcast       N/A (in-place API)                     ``broadcast(buf, 0)``
reduce          N/A (in-place API)                     ``reduce(buf, 0)``
alltoall        ``all_to_all_single(out, in)``         N/A (no in-place API)
sendrecv        ``isend`` to rank+1, ``irecv`` from    N/A
                rank-1 (a ring, as nccl-tests does)
=============== ====================================== =====================================

Nothing is emulated with extra copies: a placement torch lacks is reported as ``N/A``. After the
timing, one more call on known inputs is checked and the wrong elements are the ``#wrong`` column
(``--no-check`` skips it). Each point runs under a watchdog: past ``--timeout`` seconds the process
prints which collective and size hung and exits with status 3.
"""

from __future__ import annotations

import argparse
import datetime
import os
import platform
import re
import socket
import sys
import threading
import time
from collections.abc import Callable
from typing import Any

from collsim import units
from collsim.calibration.store import ResultStore, point_key
from collsim.calibration.writer import format_row, header_lines, nccl_tests_count, row_from_times
from collsim.dtypes import canonical_dtype
from collsim.errors import CollsimError
from collsim.metrics import canonical_collective

HUNG_EXIT = 3
TORCH_DTYPES = {
    "float": "float32",
    "half": "float16",
    "bfloat16": "bfloat16",
    "double": "float64",
    "int32": "int32",
    "int64": "int64",
    "int8": "int8",
    "uint8": "uint8",
}
"""nccl-tests' names (:mod:`collsim.dtypes`) of the types the benchmark runs -> torch's."""
_AVERAGE = {"0": "rank0", "1": "avg", "2": "min", "3": "max"}


def _torch_dtype(text: str) -> str:
    """``-d``: any name :func:`canonical_dtype` takes for a type torch runs here -> its
    nccl-tests name (what the table prints)."""
    try:
        return canonical_dtype(text, tuple(TORCH_DTYPES))
    except CollsimError as exc:
        raise argparse.ArgumentTypeError(exc.message) from None


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(
        prog="python -m collsim.calibration.torchbench", description=__doc__.splitlines()[0]
    )
    p.add_argument("--collectives", "-c", default="all_reduce")
    p.add_argument("-b", "--minbytes", default="8")
    p.add_argument("-e", "--maxbytes", default="1M")
    p.add_argument("-f", "--stepfactor", type=float, default=2.0)
    p.add_argument("-d", "--datatype", default="float", type=_torch_dtype)
    p.add_argument("-w", "--warmup", type=int, default=5)
    p.add_argument("-n", "--iters", type=int, default=20)
    p.add_argument(
        "-a",
        "--average",
        default="1",
        choices=sorted(_AVERAGE),
        help="time over ranks: 0 rank 0, 1 mean (nccl-tests' default), 2 min, 3 max",
    )
    p.add_argument("--backend", default="auto", choices=["auto", "gloo", "nccl"])
    p.add_argument("--out", required=True, help="results directory (ResultStore)")
    p.add_argument("--timeout", type=float, default=120.0, help="seconds allowed per point")
    p.add_argument("--check", action=argparse.BooleanOptionalAction, default=True)
    args = p.parse_args(argv)
    args.collectives = [canonical_collective(c) for c in args.collectives.split(",") if c]
    args.sizes = units.size_range(
        units.parse_size(args.minbytes), units.parse_size(args.maxbytes), args.stepfactor
    )
    return args


def _rank_env() -> None:
    """Give torch's env:// rendezvous what srun or mpirun provide under their own names."""
    if "RANK" in os.environ:
        return
    for rank, size, local in (
        ("SLURM_PROCID", "SLURM_NTASKS", "SLURM_LOCALID"),
        ("OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE", "OMPI_COMM_WORLD_LOCAL_RANK"),
    ):
        if rank in os.environ:
            os.environ["RANK"], os.environ["WORLD_SIZE"] = os.environ[rank], os.environ[size]
            os.environ["LOCAL_RANK"] = os.environ.get(local, "0")
            break
    os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
    os.environ.setdefault("MASTER_PORT", "29500")


class Watchdog:
    """Ends the process with a clear message when one guarded step takes too long."""

    def __init__(self, rank: int) -> None:
        self.rank = rank
        self.deadline: float | None = None
        self.what = ""
        self.limit = 0.0
        threading.Thread(target=self._watch, daemon=True).start()

    def arm(self, what: str, seconds: float) -> None:
        self.what, self.limit, self.deadline = what, seconds, time.monotonic() + seconds

    def disarm(self) -> None:
        self.deadline = None

    def _watch(self) -> None:
        while True:
            time.sleep(0.2)
            if self.deadline is not None and time.monotonic() > self.deadline:
                hung(self.rank, self.what, self.limit)


def hung(rank: int, what: str, seconds: float, detail: str = "") -> None:
    """Report a collective that did not finish in time (or, with ``detail``, failed: the
    backend's error) and end the process."""
    if detail and not re.search(r"time(d)? ?out|timeout", detail, re.IGNORECASE):
        why = f"failed: {detail}"
    else:
        extra = f" ({detail})" if detail else ""
        why = f"did not complete within {seconds:g} s (hung or failed collective){extra}"
    print(f"collsim torchbench: rank {rank}: {what} {why}; aborting", file=sys.stderr, flush=True)
    os._exit(HUNG_EXIT)


class Bench:
    """Buffers and calls of one collective at one size, for one rank."""

    def __init__(
        self, torch: Any, dist: Any, name: str, size: int, dtype: str, device: Any
    ) -> None:
        self.torch, self.dist, self.name, self.device = torch, dist, name, device
        self.rank, self.n = dist.get_rank(), dist.get_world_size()
        self.dtype = getattr(torch, TORCH_DTYPES[dtype])
        elem = torch.empty(0, dtype=self.dtype).element_size()
        self.count, self.size = nccl_tests_count(name, size, elem, self.n)
        self.per = self.count  # per-rank elements (rounded collectives) or the whole buffer

    def buf(self, numel: int, value: float = 0.0) -> Any:
        return self.torch.full((numel,), value, dtype=self.dtype, device=self.device)

    def calls(self) -> tuple[Callable[[], Any] | None, Callable[[], Any] | None]:
        """(out-of-place, in-place) callables; None where torch has no such form."""
        d, n, r, per = self.dist, self.n, self.rank, self.per
        ag = getattr(d, "all_gather_single", None) or d.all_gather_into_tensor
        rs = getattr(d, "reduce_scatter_single", None) or d.reduce_scatter_tensor
        if self.name == "all_reduce":
            buf = self.buf(per, 1)
            return None, lambda: d.all_reduce(buf)
        if self.name in ("broadcast", "reduce"):
            buf = self.buf(per, 1)
            fn = d.broadcast if self.name == "broadcast" else d.reduce
            return None, lambda: fn(buf, 0)
        if self.name == "all_gather":
            inp, out, out2 = self.buf(per, 1), self.buf(per * n), self.buf(per * n)
            return (lambda: ag(out, inp)), (lambda: ag(out2, out2[r * per : (r + 1) * per]))
        if self.name == "reduce_scatter":
            inp, out, inp2 = self.buf(per * n, 1), self.buf(per), self.buf(per * n, 1)
            return (lambda: rs(out, inp)), (lambda: rs(inp2[r * per : (r + 1) * per], inp2))
        if self.name == "alltoall":
            inp, out = self.buf(per * n, 1), self.buf(per * n)
            return (lambda: d.all_to_all_single(out, inp)), None
        send, recv = self.buf(per, 1), self.buf(per)
        ops = [d.P2POp(d.isend, send, (r + 1) % n), d.P2POp(d.irecv, recv, (r - 1) % n)]
        return (lambda: [w.wait() for w in d.batch_isend_irecv(ops)]), None

    def expect(self, numel: int, value: int) -> Any:
        """``value`` as this type holds it: integers wrap as the reduction's own sum does."""
        torch = self.torch
        return torch.full((numel,), value, dtype=torch.int64, device=self.device).to(self.dtype)

    def exact_below(self) -> float:
        """Integers up to this are exact in the type (and so are sums that stay below it)."""
        torch = self.torch
        if not self.dtype.is_floating_point:
            return float("inf")  # integer sums wrap, identically on both sides
        return 2.0 / torch.finfo(self.dtype).eps  # 2 ** (mantissa bits + 1)

    def addend(self, r: int) -> int:
        """What rank ``r`` contributes to a checked sum: ``r + 1``, or 1 where the sum of
        ``1..n`` would leave the type's exact integers (bf16 above 22 ranks) and ``n`` would not,
        so the check stays exact and a missing rank is still caught."""
        n = self.n
        return r + 1 if n * (n + 1) // 2 <= self.exact_below() or n > self.exact_below() else 1

    def mismatches(self, got: Any, want: Any, terms: int = 1) -> int:
        """Elements of ``got`` that differ from ``want``: exactly, or, for a floating sum past the
        type's exact integers, by more than its ``terms - 1`` additions may round (``(terms - 1)
        u |want|``, ``u`` the unit roundoff)."""
        torch = self.torch
        if terms <= 1 or float(want.double().abs().max()) <= self.exact_below():
            return int((got != want).sum().item())
        tol = (terms - 1) * torch.finfo(self.dtype).eps / 2 * want.double().abs()
        return int(((got.double() - want.double()).abs() > tol).sum().item())

    def wrong(self, in_place: bool) -> int:
        """Run once on known inputs (rank r holds :meth:`addend`, r+1 where exact) and count the
        wrong elements."""
        torch, d, n, r, per = self.torch, self.dist, self.n, self.rank, self.per
        total = sum(self.addend(k) for k in range(n))
        if self.name in ("all_reduce", "broadcast", "reduce"):
            buf = self.expect(per, self.addend(r) if self.name != "broadcast" else r + 1)
            {
                "all_reduce": d.all_reduce,
                "broadcast": lambda b: d.broadcast(b, 0),
                "reduce": lambda b: d.reduce(b, 0),
            }[self.name](buf)
            if self.name == "reduce" and r != 0:
                return 0
            got, want = buf, self.expect(per, total if self.name != "broadcast" else 1)
            return self.mismatches(got, want, n if self.name != "broadcast" else 1)
        elif self.name == "all_gather":
            out = self.buf(per * n)
            inp = out[r * per : (r + 1) * per] if in_place else self.expect(per, r + 1)
            inp.copy_(self.expect(per, r + 1))
            (getattr(d, "all_gather_single", None) or d.all_gather_into_tensor)(out, inp)
            got = out
            want = torch.arange(1, n + 1, device=self.device).repeat_interleave(per).to(self.dtype)
        elif self.name == "reduce_scatter":
            inp = self.expect(per * n, self.addend(r))
            out = inp[r * per : (r + 1) * per] if in_place else self.buf(per)
            (getattr(d, "reduce_scatter_single", None) or d.reduce_scatter_tensor)(out, inp)
            return self.mismatches(out, self.expect(per, total), n)
        elif self.name == "alltoall":
            inp = (torch.arange(n, device=self.device).repeat_interleave(per) + r * n).to(
                self.dtype
            )  # int64 to a narrower type wraps, on both sides alike
            out = self.buf(per * n)
            d.all_to_all_single(out, inp)
            want = (torch.arange(n, device=self.device) * n + r).repeat_interleave(per)
            got, want = out, want.to(self.dtype)
        else:
            recv = self.buf(per)
            ops = [
                d.P2POp(d.isend, self.expect(per, r + 1), (r + 1) % n),
                d.P2POp(d.irecv, recv, (r - 1) % n),
            ]
            for w in d.batch_isend_irecv(ops):
                w.wait()
            got, want = recv, self.expect(per, (r - 1) % n + 1)
        return self.mismatches(got, want)


def _timed(
    torch: Any, dist: Any, fn: Callable[[], Any], warmup: int, iters: int, cuda: bool
) -> float:
    """Seconds per call on this rank: warm-up, barrier, ``iters`` calls back to back, sync."""
    for _ in range(warmup):
        fn()
    if cuda:
        torch.cuda.synchronize()
    dist.barrier()
    start = time.perf_counter()
    for _ in range(iters):
        fn()
    if cuda:
        torch.cuda.synchronize()
    return (time.perf_counter() - start) / iters


def _combine(torch: Any, dist: Any, seconds: float, how: str, device: Any) -> float:
    """One time for all ranks, as nccl-tests' ``-a``: rank 0's, the mean, the min or the max."""
    value = torch.tensor([seconds], dtype=torch.float64, device=device)
    if how == "rank0":
        dist.broadcast(value, 0)
    else:
        op = {"avg": dist.ReduceOp.SUM, "min": dist.ReduceOp.MIN, "max": dist.ReduceOp.MAX}[how]
        dist.all_reduce(value, op=op)
    result = float(value.item())
    return result / dist.get_world_size() if how == "avg" else result


def preamble(torch: Any, dist: Any, args: argparse.Namespace, name: str, device: Any) -> list[str]:
    """nccl-tests' preamble: versions, parameters and one device line per rank."""
    if device.type == "cuda":
        gpu, where = torch.cuda.get_device_name(device), f"cuda:{device.index}"
    else:
        gpu, where = f"CPU {platform.machine()} ({args.backend_used})", "cpu"
    me = (socket.gethostname(), os.getpid(), device.index or 0, where, gpu)
    everyone: list[Any] = [None] * dist.get_world_size()
    dist.all_gather_object(everyone, me)
    lines = [f"# collsim torchbench: torch {torch.__version__}, backend {args.backend_used}"]
    if args.backend_used == "nccl":
        lines.append("NCCL version " + ".".join(str(v) for v in torch.cuda.nccl.version()))
    lines += [f"# env {k}={v}" for k, v in sorted(os.environ.items()) if k.startswith("NCCL_")]
    lines += [
        f"# Collective test starting: {name}_perf",
        f"# nThread 1 nGpus 1 minBytes {args.sizes[0]} maxBytes {units.parse_size(args.maxbytes)} "
        f"step: "
        f"{args.stepfactor:g}(factor) warmup iters: {args.warmup} iters: {args.iters} agg iters: 1 "
        f"validation: {int(args.check)} graph: 0",
        "#",
        "# Using devices",
    ]
    for rank, (host, pid, dev, where_, model) in enumerate(everyone):
        lines.append(
            f"#  Rank {rank:2d} Group  0 Pid {pid:6d} on {host:>10} device {dev:2d} "
            f"[{where_}] {model}"
        )
    return lines


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    import torch
    import torch.distributed as dist

    _rank_env()
    cuda = args.backend != "gloo" and torch.cuda.is_available()
    args.backend_used = (
        "nccl" if args.backend == "nccl" or (args.backend == "auto" and cuda) else "gloo"
    )
    local = int(os.environ.get("LOCAL_RANK", "0"))
    device = torch.device(f"cuda:{local}" if args.backend_used == "nccl" else "cpu")
    if device.type == "cuda":
        torch.cuda.set_device(device)
    dist.init_process_group(
        args.backend_used, timeout=datetime.timedelta(seconds=max(args.timeout, 1.0))
    )
    rank, n = dist.get_rank(), dist.get_world_size()
    watchdog = Watchdog(rank)
    store = None
    skip: list[Any] = [[]]
    if rank == 0:
        identity = {
            "runner": "torch",
            "ranks": n,
            "dtype": args.datatype,
            "backend": args.backend_used,
            "average": _AVERAGE[args.average],
            "warmup": args.warmup,
            "iters": args.iters,
        }
        store = ResultStore(args.out, identity)
        for problem in store.problems():
            print(f"# warning: {problem}", flush=True)
        store.clean()
        skip = [[k for k in store.manifest["points"] if store.done(k)]]
    dist.broadcast_object_list(skip, 0)
    done = set(skip[0])
    for name in args.collectives:
        if name == "sendrecv" and n < 2:
            if rank == 0:
                print("# sendrecv needs at least 2 ranks: skipped", flush=True)
            continue
        lines = preamble(torch, dist, args, name, device)
        if rank == 0 and store is not None:
            store.set_preamble(name, lines)
            print("\n".join([*lines, "#", *header_lines()]), flush=True)
        for size in args.sizes:
            bench = Bench(torch, dist, name, size, args.datatype, device)
            if point_key(name, bench.size) in done:
                if rank == 0:
                    print(f"# {name} {bench.size} B: done in an earlier run, skipped", flush=True)
                continue
            what = f"{name} of {bench.size} B"
            watchdog.arm(what, args.timeout)
            try:
                times, wrong = [], []
                for in_place, fn in enumerate(bench.calls()):
                    if fn is None:
                        times.append(None)
                        wrong.append(None)
                        continue
                    local_s = _timed(
                        torch, dist, fn, args.warmup, args.iters, device.type == "cuda"
                    )
                    times.append(_combine(torch, dist, local_s, _AVERAGE[args.average], device))
                    bad = bench.wrong(bool(in_place)) if args.check else None
                    if bad is not None:
                        total = torch.tensor([bad], dtype=torch.float64, device=device)
                        dist.all_reduce(total)
                        bad = int(total.item())
                    wrong.append(bad)
            except RuntimeError as exc:  # gloo/NCCL time out or fail: say which point
                hung(rank, what, args.timeout, str(exc).splitlines()[0] if str(exc) else "")
            watchdog.disarm()
            if rank == 0 and store is not None:
                row = row_from_times(
                    name,
                    n,
                    size,
                    args.datatype,
                    oop_time_s=times[0],
                    ip_time_s=times[1],
                    oop_wrong=wrong[0],
                    ip_wrong=wrong[1],
                )
                store.record_point(name, row)
                print(format_row(row), flush=True)
        if rank == 0 and store is not None:
            log = store.render_log(name)
            print(f"# Collective test concluded: {name}_perf (log: {log})", flush=True)
    dist.barrier()
    dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main())
