#!/usr/bin/python3
"""The benchmark harness: runs configurations in turn (interleaved A B A B, several
repetitions), reads the metrics JSON lines every run writes (`orpheus train
--metrics`, or ddp_fmnist.py's in the same format), and writes a markdown table
(median and spread over repetitions) and a PNG plot (matplotlib).

A suite is a list of groups; a group is a network (loopback or an emulated cluster
made by scripts/netcluster.sh) and a workload, and holds configurations that are
compared with each other in the same group: ratios are always taken inside one
group, from runs interleaved in the same invocation.

Suites (scripts/bench/run.sh SUITE calls this file):
  vs-ddp   PyTorch DDP against Orpheus dense, SV broadcast and its best settings, on
           loopback and on emulated 1 and 10 Gbit/s clusters (np 4; MLR and the
           784-2048-2048-10 MLP).
  vs-peers Orpheus's best settings (those of vs-ddp) against the data-parallel methods
           users pick instead (ddp_fmnist.py --peer, see peers.py): DDP, PowerSGD rank
           1, 2, 4, local SGD and DiLoCo with H = 10, 50; the same networks and
           workloads, 2 repetitions unless --reps; ratios to the fastest peer.
  table4   the Orpheus paper's Table 4: time to target with no checkpoint, matrix
           checkpoint, SV checkpoint, and recovery from failures with each (np 4, MLP),
           plus bytes written per clock and restore time against T.

Standard library plus matplotlib (Debian's python3-matplotlib, for the plot only).
"""

import argparse
import contextlib
import datetime
import hashlib
import json
import os
import platform
import re
import shlex
import shutil
import signal
import statistics
import subprocess
import sys
import tarfile
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
sys.path.insert(0, HERE)
import bench_metrics  # noqa: E402
import peers  # noqa: E402  (its byte rules; it imports torch only to run a peer)

PYTHON = "/usr/bin/python3"
NETCLUSTER = os.path.join(ROOT, "scripts", "netcluster.sh")
FMNIST = os.environ.get("FASHION_MNIST", "/usr/share/datasets/fashion-mnist")
TRAIN = os.path.join(FMNIST, "train-images-idx3-ubyte.gz")
TEST = os.path.join(FMNIST, "t10k-images-idx3-ubyte.gz")
SV_HEADER_BYTES = 64
SV_MATRIX_ENTRY_BYTES = 32
FLOAT = 4


def say(*args):
    print("bench:", *args, file=sys.stderr, flush=True)


# --- workloads and their analytic byte counts ------------------------------------------

class Workload:
    """A model on Fashion-MNIST: its .loss file (or 'mlr'), the DDP equivalent and its
    matrices (rows, cols, has bias) for the analytic byte counts."""

    def __init__(self, name, orpheus_model, ddp_args, matrices, target):
        self.name, self.orpheus_model, self.ddp_args = name, orpheus_model, ddp_args
        self.matrices, self.target = matrices, target

    def params(self):
        return sum(r * c + (r if bias else 0) for r, c, bias in self.matrices)


def mlp(hidden, loss_file):
    return Workload(f"mlp-{hidden}", os.path.join(ROOT, "examples", loss_file),
                    ["--model", "mlp", "--hidden", str(hidden)],
                    [(hidden, 784, True), (hidden, hidden, True), (10, hidden, True)], 0.85)


WORKLOADS = {
    "mlr": Workload("mlr", "mlr", ["--model", "mlr"], [(10, 784, True)], 0.82),
    "mlp": mlp(1024, "mlp.loss"),
    "mlp-wide": mlp(2048, "mlp_wide.loss"),
}


def flag(flags, name, default=None):
    if name in flags:
        return flags[flags.index(name) + 1]
    return default


def sv_batch_bytes(workload, n, core):
    size = SV_HEADER_BYTES + SV_MATRIX_ENTRY_BYTES * len(workload.matrices) + FLOAT * n
    for rows, cols, bias in workload.matrices:
        size += FLOAT * (rows + cols) * n
        if core:
            size += FLOAT * n * n + (FLOAT * n if bias else 0)
    return size


REF_BYTES = 32  # a batch reference in the SV log (ckpt/log_entry.h)


def analytic_log_bytes_per_clock(workload, np_, batch, select, fanout, fmt):
    """SV log bytes all ranks together write per clock, headers included, segment
    metadata and snapshots not: format 3 writes every rank's whole local batch once,
    B(J+K) floats per matrix, and a 32-byte reference per batch received; format 2
    also copies every received (selected) batch into the receiver's log."""
    own = sv_batch_bytes(workload, batch, False)
    n = select if 0 < select < batch else batch
    received = np_ * fanout
    if fmt == 2:
        return np_ * own + received * sv_batch_bytes(workload, n, n < batch)
    return np_ * own + received * REF_BYTES


def peer_settings(config):
    """The --peer flags of a ddp_fmnist.py configuration, with peers.py's defaults."""
    p = argparse.ArgumentParser(add_help=False)
    peers.add_arguments(p)
    return p.parse_known_args(config.flags)[0]


def analytic_bytes_per_clock(config, workload, np_, batch, clocks=None):
    """Bytes all ranks together send per clock, as the runs count them: ring all-reduce
    (2(P-1)/P of the payload per rank) for dense and DDP, the SV batches of the
    multicast schedule otherwise, plus averaging (an all-reduce) and rotation (every
    replica one step along the ring) spread over their periods. The peers of
    ddp_fmnist.py: PowerSGD's P and Q and the uncompressed biases (after its first
    --powersgd-start steps of whole gradients), the parameters every H steps for local
    SGD and DiLoCo; over `clocks` clocks when given, else per clock in the long run."""
    payload = FLOAT * workload.params()
    ring = 2 * (np_ - 1) * payload
    if config.kind == "ddp":
        a = peer_settings(config)
        if a.peer in ("localsgd", "diloco"):
            return ring / a.local_steps if clocks is None else ring * (clocks // a.local_steps) / clocks
        if a.peer in ("powersgd", "powersgd-hook"):
            shapes = [(r, c) for r, c, _ in workload.matrices] + [(r,) for r, _, bias in workload.matrices if bias]
            compressed = 2 * (np_ - 1) * FLOAT * peers.powersgd_payload(shapes, a.rank_r)
            if clocks is None:
                return compressed
            full = min(a.powersgd_start, clocks)
            return (full * ring + (clocks - full) * compressed) / clocks
        return ring
    if flag(config.flags, "--sync", "sv") == "dense":
        return ring
    select = int(flag(config.flags, "--select", "0"))
    n = select if select > 0 else batch
    rank = int(flag(config.flags, "--sv-rank", "0"))
    if rank > 0:
        n = rank + 1  # R + 1 SVGs per matrix, each with a core (engine/worker/low_rank.h)
    fanout = int(flag(config.flags, "--fanout", "0")) or np_ - 1
    if flag(config.flags, "--multicast", "all") == "all":
        fanout = np_ - 1
    total = np_ * fanout * sv_batch_bytes(workload, n, select > 0 or rank > 0)
    every = int(flag(config.flags, "--average-every", "0"))
    if every > 0:
        total += ring / every
    rotate = int(flag(config.flags, "--rotate-every", "0"))
    if rotate > 0:
        total += np_ * payload / rotate  # every rank passes its whole replica on
    return total


# --- configurations and networks ------------------------------------------------------

class Config:
    """One way to run a job. np and batch, when given, replace the suite's for this
    configuration alone (the ranks-against-threads rows)."""

    def __init__(self, key, label, kind, flags=(), note="", np_=None, batch=None, baseline=False):
        self.key, self.label, self.kind, self.flags, self.note = key, label, kind, list(flags), note
        self.np, self.batch = np_, batch
        self.baseline = baseline  # run by the --baseline binary instead of --orpheus

    def describe(self):
        if self.kind == "ddp":
            return f"PyTorch (gloo), SGD, `ddp_fmnist.py {' '.join(self.flags)}`" if self.flags else \
                "PyTorch DDP (gloo), SGD"
        return "`" + " ".join(self.flags) + "`"


class Network:
    """Loopback (rate None) or an emulated cluster of np hosts from netcluster.sh."""

    def __init__(self, name, rate=None, delay=None):
        self.name, self.rate, self.delay = name, rate, delay
        self.mpirun_args = []

    @property
    def emulated(self):
        return self.rate is not None

    def describe(self):
        if not self.emulated:
            return "loopback (one kernel; Open MPI shared memory, gloo over 127.0.0.1)"
        delay = (f"with {self.delay} one-way delay (netem)" if self.delay else
                 "no added delay (this kernel has no netem qdisc)")
        return (f"emulated cluster: one network namespace per rank, each link limited to {self.rate} "
                f"(tbf), {delay}, Open MPI over TCP (btl tcp,self), gloo over the same links")

    def up(self, np_):
        if not self.emulated:
            return
        up = subprocess.run([NETCLUSTER, "up", str(np_), "--rate", self.rate, "--delay", self.delay], check=True,
                            stderr=subprocess.PIPE, text=True)
        sys.stderr.write(up.stderr)
        if "netem" in up.stderr:  # the kernel lacks netem: rate limit only
            self.delay = None
        out = subprocess.run([NETCLUSTER, "mpirun-args"], check=True, capture_output=True, text=True).stdout
        self.mpirun_args = shlex.split(out)

    def down(self):
        if self.emulated:
            subprocess.run([NETCLUSTER, "down"], check=False)

    def kill_leftovers(self):
        """Processes a killed job left in the hosts (Open MPI's daemons detach)."""
        if not self.emulated:
            return
        for i in range(64):
            ns = f"orph-h{i}"
            out = subprocess.run(["ip", "netns", "pids", ns], capture_output=True, text=True)
            if out.returncode != 0:
                break
            for pid in out.stdout.split():
                with contextlib.suppress(ProcessLookupError, ValueError):
                    os.kill(int(pid), signal.SIGKILL)

    def tx_bytes(self):
        if not self.emulated:
            return None
        out = subprocess.run([NETCLUSTER, "tx-bytes"], capture_output=True, text=True).stdout.strip()
        return int(out) if out.isdigit() else None


NETWORKS = {
    "loopback": Network("loopback"),
    "1gbit": Network("1gbit", "1gbit", "0.1ms"),
    "10gbit": Network("10gbit", "10gbit", "0.1ms"),
}


# --- running ----------------------------------------------------------------------------

class Runner:
    def __init__(self, args, work):
        self.args, self.work = args, work
        # Copies, so that a rebuild during the suite cannot mix binaries.
        self.binary, self.binary_sha = self.copied(args.orpheus, "orpheus")
        self.binary_built = datetime.datetime.utcfromtimestamp(os.path.getmtime(args.orpheus))
        self.baseline = None
        if args.baseline:
            self.baseline, self.baseline_sha = self.copied(args.baseline, "orpheus-baseline")
        self.port = 29500

    def copied(self, path, name):
        """`path` copied into the work directory as `name`: the copy and its sha256 (12 digits)."""
        copy = os.path.join(self.work, name)
        shutil.copy2(path, copy)
        with open(copy, "rb") as f:
            return copy, hashlib.sha256(f.read()).hexdigest()[:12]

    def common(self, workload, batch, clocks, extra_orpheus=()):
        a = self.args
        return ["--model", workload.orpheus_model, "--train", TRAIN, "--test", TEST, "--batch", str(batch),
                "--lr", str(a.lr), "--clocks", str(clocks), "--eval-every", str(a.eval_every), "--seed", "1",
                "--target-accuracy", str(workload.target), "--progress", "off", "--log-level", "warn",
                *extra_orpheus]

    def command(self, config, network, workload, np_, metrics, extra=()):
        a = self.args
        np_ = config.np or np_
        batch = config.batch or a.batch
        if config.kind == "orpheus":
            # Open MPI binds each rank to one core when np <= 2: a rank with threads
            # needs the cores it is given.
            bind = ["--bind-to", "none"] if "--threads" in config.flags else []
            binary = self.baseline if config.baseline else self.binary
            return [["mpirun", "-np", str(np_), "--oversubscribe", *bind, *network.mpirun_args, binary, "train",
                     *self.common(workload, batch, a.clocks), *config.flags, *extra, "--metrics", metrics]]
        ddp = [PYTHON, os.path.join(HERE, "ddp_fmnist.py"), *workload.ddp_args, "--data", FMNIST,
               "--batch", str(batch), "--lr", str(a.lr), "--clocks", str(a.clocks),
               "--eval-every", str(a.eval_every), "--target-accuracy", str(workload.target), "--seed", "1",
               *config.flags, "--metrics", metrics]
        if not network.emulated:
            return [ddp + ["--np", str(np_)]]
        self.port += 1
        master = f"198.18.0.1:{self.port}"
        return [[NETCLUSTER, "exec", str(r), *ddp, "--rank", str(r), "--world-size", str(np_),
                 "--master", master, "--ifname", "eth0"] for r in range(np_)]

    def run(self, commands, log_path, limit, started=None, startup_limit=None):
        """Runs the processes (one job), killing them all at the time limit, or after
        startup_limit seconds if the file `started` has not appeared by then (a launch
        that hung). Returns (exit code, timed out, wall seconds); exit code 125: the
        launch hung."""
        env = dict(os.environ, OMPI_ALLOW_RUN_AS_ROOT="1", OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1",
                   OPENBLAS_NUM_THREADS="1", OMP_NUM_THREADS="1")
        start = time.monotonic()
        procs = []
        with open(log_path, "a") as log:
            for cmd in commands:
                log.write("$ " + shlex.join(cmd) + "\n")
                log.flush()
                procs.append(subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, env=env,
                                              start_new_session=True, cwd=ROOT))
            timed_out = hung = False
            finished_at = None
            try:
                while any(p.poll() is None for p in procs):
                    elapsed = time.monotonic() - start
                    # The summary line is written last: processes that linger long after
                    # it (a hang on exit) are killed, and the run counts as complete.
                    if finished_at is None and started and has_summary(started):
                        finished_at = elapsed
                    if finished_at is not None and elapsed - finished_at > 20:
                        log.write("still running 20 s after its summary line: killed\n")
                        break
                    if elapsed > limit:
                        timed_out = True
                        break
                    if started and startup_limit and elapsed > startup_limit and not os.path.exists(started):
                        hung = True
                        log.write(f"no metrics after {startup_limit} s: the launch hung; killed\n")
                        break
                    # Wakes when a process ends, so wall times are not rounded to the poll.
                    with contextlib.suppress(subprocess.TimeoutExpired):
                        next(p for p in procs if p.poll() is None).wait(timeout=0.5)
            finally:
                kill_all(procs)
        if hung:
            return 125, False, time.monotonic() - start
        if finished_at is not None:
            return 0, False, finished_at
        rc = max((p.returncode or 0) for p in procs) if not timed_out else 124
        return rc, timed_out, time.monotonic() - start


def has_summary(path):
    try:
        with open(path, "rb") as f:
            f.seek(0, os.SEEK_END)
            f.seek(max(0, f.tell() - 4096))
            return b'"summary": true' in f.read()
    except OSError:
        return False


def kill_all(procs):
    for sig in (signal.SIGTERM, signal.SIGKILL):
        alive = [p for p in procs if p.poll() is None]
        for p in alive:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(p.pid, sig)
        deadline = time.monotonic() + 5
        for p in alive:
            with contextlib.suppress(subprocess.TimeoutExpired):
                p.wait(timeout=max(deadline - time.monotonic(), 0.1))


# --- reading a run ----------------------------------------------------------------------

def analyse(path, target):
    """What one run achieved, from its metrics file (complete or cut off)."""
    if not os.path.exists(path):
        return None
    clocks, summary = bench_metrics.read_metrics(path)
    if not clocks:
        return None
    evals = [(c["clock"], c["seconds"], c["test_accuracy"]) for c in clocks if "test_accuracy" in c]
    hit = next(((c, s, acc) for c, s, acc in evals if acc >= target), None)

    def mean(key):
        values = [c[key] for c in clocks if key in c]
        return statistics.fmean(values) if values else None

    return {
        "clocks_run": clocks[-1]["clock"],
        "seconds_run": clocks[-1]["seconds"],
        "clocks_to_target": hit[0] if hit else None,
        "seconds_to_target": hit[1] if hit else None,
        "best_accuracy": max((acc for _, _, acc in evals), default=None),
        "final_accuracy": evals[-1][2] if evals else None,
        "bytes_per_clock": mean("bytes_sent"),
        "clock_ms": 1e3 * statistics.median(c["clock_seconds"] for c in clocks),
        "compute_ms": ms(mean("compute_seconds")),
        "comm_ms": ms(mean("comm_seconds")),
        "update_ms": ms(mean("update_seconds")),
        "wait_ms": ms(mean("wait_seconds")),
        # --overlap: the exchange under way and the share of it hidden behind compute and rebuild.
        "exchange_ms": ms(mean("exchange_seconds")),
        "hidden_share": mean("hidden_exchange_share"),
        "ckpt_wait_ms": ms(mean("ckpt_wait_seconds")),
        "ckpt_cpu_ms": ms(mean("ckpt_writer_cpu_seconds")),
        "failures": sum(c.get("failures", 0) for c in clocks),
        "lost_clocks": sum(c.get("lost_clocks", 0) for c in clocks),
        "complete": summary is not None,
        "summary": summary or {},
        "curve": [(s, acc, c) for c, s, acc in evals],
    }


def ms(seconds):
    return None if seconds is None else 1e3 * seconds


# --- the report -------------------------------------------------------------------------

def med(values):
    values = [v for v in values if v is not None]
    return statistics.median(values) if values else None


def spread(values, fmt):
    values = [v for v in values if v is not None]
    if not values:
        return "—"
    m = fmt(statistics.median(values))
    if len(values) == 1:
        return m
    return f"{m} [{fmt(min(values))}–{fmt(max(values))}]"


def f0(v):
    return f"{v:.0f}"


def f1(v):
    return f"{v:.1f}"


def f2(v):
    return f"{v:.2f}"


def f4(v):
    return f"{v:.4f}"


def fbytes(b):
    if b is None:
        return "—"
    for unit, scale in (("GB", 1e9), ("MB", 1e6), ("kB", 1e3)):
        if b >= scale:
            return f"{b / scale:.3g} {unit}"
    return f"{b:.0f} B"


def sgemm_gflops():
    """The machine's single-thread SGEMM rate (torch.mm on OpenBLAS, 1024^3, best of 7):
    machines of this kind differ ~4x in compute, so every ratio is stated beside it."""
    code = ("import time, torch\n"
            "torch.set_num_threads(1)\n"
            "n = 1024\n"
            "a, b = torch.randn(n, n), torch.randn(n, n)\n"
            "best = min((lambda t: (a @ b, time.perf_counter() - t)[1])(time.perf_counter()) for _ in range(7))\n"
            "print(f'{2 * n ** 3 / best / 1e9:.1f}')\n")
    out = subprocess.run([PYTHON, "-c", code], capture_output=True, text=True).stdout.strip()
    return out or "unknown"


SGEMM = None  # measured once, before the first run (the cores are quiet then)


def versions(kinds):
    lines = []
    cpu = "unknown CPU"
    with contextlib.suppress(OSError):
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    cpu = line.split(":", 1)[1].strip()
                    break
    lines.append(f"- **machine:** {cpu}, {os.cpu_count()} cores, {platform.system()} {platform.release()}, "
                 f"{round(os.sysconf('SC_PAGE_SIZE') * os.sysconf('SC_PHYS_PAGES') / 2**30)} GiB, "
                 f"single-thread SGEMM {SGEMM or sgemm_gflops()} GFLOP/s (torch.mm, 1024^3, measured before the runs)")
    mpi = subprocess.run(["mpirun", "--version"], capture_output=True, text=True).stdout.splitlines()
    lines.append(f"- **MPI:** {mpi[0] if mpi else 'unknown'}")
    if "ddp" in kinds:
        torch = subprocess.run([PYTHON, "-c", "import torch; print(torch.__version__)"], capture_output=True,
                               text=True).stdout.strip()
        lines.append(f"- **PyTorch:** {torch or 'unknown'} (Debian python3-torch, gloo backend, "
                     "OpenBLAS, one thread per process)")
    return lines


def report(args, suite, groups, results, runner, started, extra_sections=()):
    kinds = {c.kind for g in groups for c in g.configs}
    commit = subprocess.run(["git", "-C", ROOT, "rev-parse", "--short", "HEAD"], capture_output=True,
                            text=True).stdout.strip() or "unknown"
    out = [f"## Benchmark `{suite}` ({datetime.datetime.utcnow():%Y-%m-%d %H:%M} UTC)", ""]
    out.append(f"- **date:** runs of {started:%Y-%m-%d %H:%M}–{datetime.datetime.utcnow():%H:%M} UTC")
    out += versions(kinds)
    out.append(f"- **Orpheus:** Release binary sha256 {runner.binary_sha}, built "
               f"{runner.binary_built:%Y-%m-%d %H:%M} UTC, HEAD {commit}")
    if runner.baseline:
        out.append(f"- **baseline:** the rows marked \"baseline binary\" ran `{args.baseline}` (sha256 "
                   f"{runner.baseline_sha}), interleaved with the others")
    out.append(f"- **runs:** np {args.np}, batch {args.batch} per rank, lr {args.lr}, eval every "
               f"{args.eval_every} clocks (evaluation time excluded on both sides), at most {args.clocks} clocks "
               f"and {args.time_limit} s per run, {args.reps} repetition(s) per configuration, interleaved")
    load = open("/proc/loadavg").read().split()[:3]
    out.append(f"- **load average at the end:** {' '.join(load)} (other work on the cores skews timings)")
    if args.note:
        out.append(f"- **note:** {args.note}")
    out.append("")
    for g in groups:
        out += group_table(args, g, results)
    out += list(extra_sections)
    return "\n".join(out) + "\n"


def group_table(args, g, results):
    w = g.workload

    def seconds(c):
        return med([r["seconds_to_target"] for r in results.get((g.key, c.key), []) if r])

    # The ratio's reference: the first configuration, or the fastest of g.ratio_to.
    refs = [c for c in g.configs if c.key in g.ratio_to] if g.ratio_to else g.configs[:1]
    ref_seconds, ref = min(((seconds(c), c) for c in refs if seconds(c)), key=lambda t: t[0], default=(None, refs[0]))
    ref_name = ref.key if not g.ratio_to else f"the best peer ({ref.key})" if ref_seconds else "the best peer"
    out = [f"### {g.title}", "", f"Network: {g.network.describe()}. Target: test accuracy ≥ {w.target}.", ""]
    head = ("| configuration | clocks to target | seconds to target | ratio to "
            f"{ref_name} | final acc. | bytes/clock measured | analytic | measured/analytic |")
    sep = "|---|---:|---:|---:|---:|---:|---:|---:|"
    if g.network.emulated:
        head += " wire bytes/clock |"
        sep += "---:|"
    head += " ms/clock | compute / comm / update / wait ms |"
    sep += "---:|---|"
    for col in g.extra_columns:
        head += f" {col[0]} |"
        sep += "---:|"
    out += [head, sep]
    for c in g.configs:
        runs = [r for r in results.get((g.key, c.key), []) if r]
        if not runs:
            out.append(f"| {c.label} | failed | | | | | | |")
            continue
        reached = [r for r in runs if r["seconds_to_target"] is not None]
        if len(reached) == len(runs):
            clocks = spread([r["clocks_to_target"] for r in runs], f0)
            secs = spread([r["seconds_to_target"] for r in runs], f1)
            mine = med([r["seconds_to_target"] for r in runs])
            ratio = f"{ref_seconds / mine:.2f}×" if ref_seconds and mine else "—"
        else:
            best = max(r["best_accuracy"] or 0 for r in runs)
            clocks = (f"not reached in {len(runs) - len(reached)}/{len(runs)} runs "
                      f"(≤ {max(r['clocks_run'] for r in runs)} clocks, best {best:.4f})")
            secs = f"> {min(r['seconds_run'] for r in runs):.1f}"
            ratio = (f"< {ref_seconds / min(r['seconds_run'] for r in runs):.2f}×" if ref_seconds else "—")
        measured = med([r["bytes_per_clock"] for r in runs])
        analytic = med([analytic_bytes_per_clock(c, w, c.np or args.np, c.batch or args.batch, r["clocks_run"])
                        for r in runs])
        fraction = f"{measured / analytic:.3f}" if measured and analytic else "—"
        row = (f"| {c.label} | {clocks} | {secs} | {ratio} | {spread([r['final_accuracy'] for r in runs], f4)} "
               f"| {fbytes(measured)} | {fbytes(analytic)} | {fraction} |")
        if g.network.emulated:
            row += f" {fbytes(med([r.get('wire_bytes_per_clock') for r in runs]))} |"
        parts = [med([r[k] for r in runs]) for k in ("compute_ms", "comm_ms", "update_ms", "wait_ms")]
        breakdown = " / ".join("—" if p is None else f"{p:.1f}" for p in parts)
        row += f" {spread([r['clock_ms'] for r in runs], f1)} | {breakdown} |"
        for col in g.extra_columns:
            row += f" {col[1](runs)} |"
        out.append(row)
    out.append("")
    out.append("Configurations: " + "; ".join(f"**{c.label}** {c.describe()}" for c in g.configs) + ".")
    out.append("")
    return out


def plot(path, groups, results):
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        say("matplotlib missing: no plot (apt-get install python3-matplotlib)")
        return
    cols = min(len(groups), 3)
    rows = (len(groups) + cols - 1) // cols
    fig, axes = plt.subplots(rows, cols, figsize=(5.2 * cols, 4.2 * rows), squeeze=False)
    for ax in axes.flat[len(groups):]:
        ax.set_visible(False)
    for ax, g in zip(axes.flat, groups):
        for c in g.configs:
            runs = [r for r in results.get((g.key, c.key), []) if r]
            if not runs:
                continue
            curve = runs[0]["curve"]
            ax.plot([s for s, _, _ in curve], [a for _, a, _ in curve], marker=".", label=c.label)
        ax.axhline(g.workload.target, color="grey", lw=0.8, ls="--")
        ax.set_title(g.title, fontsize=9)
        ax.set_xlabel("training seconds (evaluation excluded)")
        ax.set_ylabel("test accuracy")
        ax.set_ylim(max(0.5, g.workload.target - 0.15), g.workload.target + 0.04)
        ax.legend(fontsize=7)
        ax.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    say(f"plot: {path}")


# --- suites -----------------------------------------------------------------------------

class Group:
    """Configurations compared with each other; ratios are to the first, or with ratio_to
    (configuration keys) to the fastest of those."""

    def __init__(self, key, title, network, workload, configs, extra_columns=(), ratio_to=()):
        self.key, self.title, self.network, self.workload = key, title, network, workload
        self.configs, self.extra_columns, self.ratio_to = configs, list(extra_columns), list(ratio_to)


def exchange_column(runs):
    """The exchange under way per clock and the share of it hidden (--overlap on)."""
    exchange = med([r.get("exchange_ms") for r in runs if r.get("exchange_ms") is not None])
    hidden = med([r.get("hidden_share") for r in runs if r.get("hidden_share") is not None])
    if exchange is None:
        return "—"
    return f"{exchange:.1f} ({100 * hidden:.0f}%)" if hidden is not None else f"{exchange:.1f}"


# Orpheus's best settings per workload (measured in vs-ddp and vs-peers; dense is MLR's,
# J = 10). SELECT25 was MLP-2048's best before --sv-rank.
SELECT25 = ["--sync", "sv", "--select", "25", "--consistency", "ssp", "--staleness", "4", "--average-every", "50"]
ORPHEUS_BEST = {
    "mlr": ["--sync", "dense"],
    "mlp": SELECT25,
    "mlp-wide": ["--sync", "sv", "--sv-rank", "1"],
}


def vs_ddp_groups(args):
    best = ORPHEUS_BEST
    groups = []
    for net_name in args.networks:
        network = NETWORKS[net_name]
        for wname in args.models:
            w = WORKLOADS[wname]
            configs = [
                Config("ddp", "PyTorch DDP", "ddp"),
                Config("dense", "Orpheus dense", "orpheus", ["--sync", "dense"]),
                Config("svb", "Orpheus SV broadcast", "orpheus", ["--sync", "sv"]),
                Config("best", "Orpheus best", "orpheus", best[wname]),
                # The same with communication overlapped with the backward pass.
                Config("dense-ovl", "Orpheus dense, --overlap on", "orpheus", ["--sync", "dense", "--overlap", "on"]),
                Config("svb-ovl", "Orpheus SV broadcast, --overlap on", "orpheus",
                       ["--sync", "sv", "--overlap", "on"]),
            ]
            if wname != "mlr":
                configs.append(Config("best-ovl", "Orpheus best, --overlap on", "orpheus",
                                      best[wname] + ["--overlap", "on"]))
            if wname == "mlr":
                configs = [c for c in configs if c.key != "best"]  # dense is MLR's best (J = 10)
            groups.append(Group(f"{net_name}/{wname}", f"{w.name}, {network.name}, np {args.np}", network, w,
                                configs, [("exchange ms (hidden)", exchange_column)]))
            if net_name == "loopback" and args.threads_column and wname != "mlr":
                # The machine's cores as ranks or as threads: the same 2 x batch examples
                # per clock, from 2 ranks of 1 thread or 1 rank of 2 threads.
                two = 2 * args.batch
                threads = [
                    Config("ddp-r2", "PyTorch DDP, 2 ranks", "ddp", np_=2),
                    Config("dense-r2t1", "Orpheus dense, 2 ranks x 1 thread", "orpheus",
                           ["--sync", "dense", "--threads", "1"], np_=2),
                    Config("dense-r1t2", f"Orpheus, 1 rank x 2 threads (batch {two})", "orpheus",
                           ["--sync", "dense", "--threads", "2"], np_=1, batch=two),
                    Config("best-r2t1", "Orpheus best, 2 ranks x 1 thread", "orpheus",
                           best[wname] + ["--threads", "1"], np_=2),
                ]
                groups.append(Group(f"{net_name}/{wname}-threads",
                                    f"{w.name}, {network.name}: 2 ranks x 1 thread against 1 rank x 2 threads",
                                    network, w, threads))
    return groups


def mean_step_column(runs):
    """Training seconds per step over the whole run: the periodic synchronisations included,
    which the median step of local SGD, DiLoCo or --average-every leaves out."""
    return spread([1e3 * r["seconds_run"] / r["clocks_run"] for r in runs], f1)


def vs_peers_groups(args):
    groups = []
    for net_name in args.networks:
        network = NETWORKS[net_name]
        for wname in args.models:
            w = WORKLOADS[wname]
            configs = [Config("ddp", "PyTorch DDP", "ddp")]
            configs += [Config(f"powersgd-r{r}", f"PowerSGD rank {r}", "ddp",
                               ["--peer", "powersgd", "--rank-r", str(r)]) for r in (1, 2, 4)]
            for peer, label in (("localsgd", "local SGD"), ("diloco", "DiLoCo")):
                configs += [Config(f"{peer}-h{h}", f"{label}, H = {h}", "ddp",
                                   ["--peer", peer, "--local-steps", str(h)]) for h in (10, 50)]
            # The same peers with Nesterov momentum 0.9 (DiLoCo has its own, outer): a user
            # whose model trains faster with momentum would turn it on for any of them.
            nag = ["--nesterov", "0.9"]
            configs += [Config("ddp-nag", "PyTorch DDP, Nesterov 0.9", "ddp", nag),
                        Config("powersgd-r2-nag", "PowerSGD rank 2, Nesterov 0.9", "ddp",
                               ["--peer", "powersgd", "--rank-r", "2", *nag])]
            configs += [Config(f"localsgd-h{h}-nag", f"local SGD, H = {h}, Nesterov 0.9", "ddp",
                               ["--peer", "localsgd", "--local-steps", str(h), *nag]) for h in (10, 50)]
            peer_keys = [c.key for c in configs]
            configs.append(Config("best", "Orpheus best", "orpheus", ORPHEUS_BEST[wname]))
            configs.append(Config("best-nag", "Orpheus best, Nesterov 0.9", "orpheus",
                                  ORPHEUS_BEST[wname] + ["--optimizer", "nesterov", "--momentum", "0.9"]))
            if wname != "mlr":  # MLR's best is --sync dense: nothing to factor
                # Rank-R batches with error feedback (engine/worker/low_rank.h), BSP broadcast.
                configs += [Config(f"rank{r}", f"Orpheus, --sv-rank {r}", "orpheus", ["--sync", "sv", "--sv-rank", str(r)])
                            for r in (1, 2) if ORPHEUS_BEST[wname] != ["--sync", "sv", "--sv-rank", str(r)]]
                # Higher ranks with Nesterov momentum, and --adapt choosing the rank.
                nesterov = ["--optimizer", "nesterov", "--momentum", "0.9"]
                configs += [Config(f"rank{r}-nag", f"Orpheus, --sv-rank {r}, Nesterov 0.9", "orpheus",
                                   ["--sync", "sv", "--sv-rank", str(r), *nesterov]) for r in (2, 4)]
                configs.append(Config("adapt-rank-nag", "Orpheus, --sv-rank 2 --adapt (r in 1..4), Nesterov 0.9",
                                      "orpheus", ["--sync", "sv", "--sv-rank", "2", "--adapt", "--adapt-every", "25",
                                                  "--adapt-rank", "1:4", *nesterov]))
                if ORPHEUS_BEST[wname] != SELECT25:
                    configs.append(Config("select25", "Orpheus, select 25, SSP 4, average every 50", "orpheus", SELECT25))
            groups.append(Group(f"{net_name}/{wname}", f"{w.name}, {network.name}, np {args.np}: Orpheus and its peers",
                                network, w, configs, [("mean ms/step", mean_step_column)], ratio_to=peer_keys))
    return groups


def table4_groups(args):
    w = WORKLOADS["mlp"]
    base = ["--sync", "sv", "--select", "25", "--average-every", "50"]
    every = str(args.ckpt_every)
    configs = [
        Config("none", "no checkpoint", "orpheus", base),
        Config("matrix", f"matrix checkpoint every {every}", "orpheus",
               base + ["--ckpt", "matrix", "--ckpt-every", every, "--ckpt-dir", "{ckpt}"]),
        Config("sv", "SV checkpoint (ISVC)", "orpheus", base + ["--ckpt", "sv", "--ckpt-dir", "{ckpt}"]),
        Config("sv-copies", "SV checkpoint, previous format (copies)", "orpheus",
               base + ["--ckpt", "sv", "--ckpt-format", "2", "--ckpt-dir", "{ckpt}"]),
        Config("sv-idle", "SV checkpoint, SCHED_IDLE writer", "orpheus",
               base + ["--ckpt", "sv", "--ckpt-writer-idle", "--ckpt-dir", "{ckpt}"]),
        Config("matrix-rec", f"matrix recovery, p = {args.fail_prob}", "orpheus",
               base + ["--ckpt", "matrix", "--ckpt-every", every, "--ckpt-dir", "{ckpt}",
                       "--fail-prob", str(args.fail_prob)]),
        Config("sv-rec", f"SV recovery, p = {args.fail_prob}", "orpheus",
               base + ["--ckpt", "sv", "--ckpt-dir", "{ckpt}", "--fail-prob", str(args.fail_prob)]),
    ]

    def written(runs):
        return fbytes(med([r.get("ckpt_bytes_per_clock") for r in runs]))

    def log_written(runs):
        return fbytes(med([r.get("log_bytes_per_clock") for r in runs]))

    def log_analytic(runs):
        flags = runs[0].get("flags", [])
        if "sv" != flag(flags, "--ckpt"):
            return "—"
        fmt = int(flag(flags, "--ckpt-format", "3"))
        if flag(flags, "--fail-prob"):
            fmt = 2  # with failures, receivers keep copies (a failed sender loses what it staged)
        a = analytic_log_bytes_per_clock(w, args.np, args.batch, 25, args.np - 1, fmt)
        m = med([r.get("log_bytes_per_clock") for r in runs])
        return f"{fbytes(a)} ({m / a:.3f})" if m else fbytes(a)

    def writer_cpu(runs):
        v = med([r.get("ckpt_cpu_ms") for r in runs])
        return "—" if v is None else f"{v:.2f}"

    def failures(runs):
        f = med([r["failures"] for r in runs])
        lost = med([r["lost_clocks"] for r in runs])
        return "—" if not f else f"{f:.0f} ({lost:.0f} clocks lost)"

    def vs_none(runs):
        return spread([r.get("clock_ratio") for r in runs], lambda v: f"{v:.3f}×")

    return [Group("loopback/mlp", f"{w.name}, loopback, np {args.np}: checkpoint and recovery",
                  NETWORKS["loopback"], w, configs,
                  [("checkpoint bytes written/clock", written), ("SV log bytes/clock", log_written),
                   ("analytic (measured/analytic)", log_analytic), ("writer CPU ms/clock", writer_cpu),
                   ("failures (clocks lost)", failures),
                   ("ms/clock vs none (same rep)", vs_none)])]


def restore_section(args, runner, work):
    """restore(T) time with and without snapshots, from two SV-logged runs of the same job."""
    w = WORKLOADS["mlp"]
    clocks = args.restore_clocks
    rows = []
    for snapshots in (True, False):
        ckpt = os.path.join(work, f"restore-{'snap' if snapshots else 'nosnap'}")
        shutil.rmtree(ckpt, ignore_errors=True)
        # Snapshots are taken at averaging barriers; without averaging, replay starts at W0.
        flags = ["--sync", "sv", "--select", "25", "--ckpt", "sv", "--ckpt-dir", ckpt]
        if snapshots:
            flags += ["--average-every", "50"]
        cmd = ["mpirun", "-np", str(args.np), "--oversubscribe", runner.binary, "train",
               *runner.common(w, args.batch, clocks), *flags]
        cmd[cmd.index("--target-accuracy") + 1] = "0"
        rc, _, _ = runner.run([cmd], os.path.join(args.raw, "restore-train.log"), args.time_limit)
        if rc != 0:
            say(f"restore: training for the restore timings failed (see {args.raw}/restore-train.log)")
            return []
        times = []
        # Just before each snapshot point (every 50 clocks), where replay from one is longest.
        for t in [c - 5 for c in range(50, clocks + 1, 50)] + [clocks]:
            start = time.monotonic()
            r = subprocess.run([runner.binary, "restore", "--ckpt-dir", ckpt, "--clock", str(t), "--out",
                                os.path.join(work, "restored.h5")], capture_output=True, text=True)
            times.append((t, time.monotonic() - start if r.returncode == 0 else None))
        rows.append(times)
        shutil.rmtree(ckpt, ignore_errors=True)
    out = ["### restore(T): seconds to rebuild replica 0 at clock T", "",
           f"Two runs of {clocks} clocks ({w.name}, np {args.np}, `--sync sv --select 25 --ckpt sv`), one with "
           "`--average-every 50` and a snapshot at every averaging barrier, one without averaging and so without "
           "snapshots (restore replays the log from W₀, generated from the seed). One `orpheus restore` process "
           "per T, wall time including start-up and reading the files.", "",
           "| T | with snapshots s | without snapshots s |", "|---:|---:|---:|"]
    for (t, a), (_, b) in zip(*rows):
        out.append(f"| {t} | {'failed' if a is None else f'{a:.2f}'} | {'failed' if b is None else f'{b:.2f}'} |")
    out.append("")
    return out


def dir_bytes(path):
    total = 0
    for base, _, files in os.walk(path):
        for name in files:
            with contextlib.suppress(OSError):
                total += os.path.getsize(os.path.join(base, name))
    return total


def log_bytes(ckpt):
    """Bytes of the SV log alone: the replica-* directories (no snapshots, no job file)."""
    return sum(dir_bytes(os.path.join(ckpt, d)) for d in os.listdir(ckpt) if d.startswith("replica-"))


def ab_section(args, runner, work):
    """Whole-process A/B of --ckpt sv against --ckpt none (and the previous format):
    the issue's workload, a fixed number of clocks, repetitions interleaved; wall time,
    CPU time (user + sys of the whole job, children of mpirun included) and peak RSS
    (the largest rank, from GNU time's %M per process) per run."""
    w = WORKLOADS["mlp"]
    clocks = args.ab_clocks
    base = ["--sync", "sv", "--select", "25", "--average-every", "50"]
    configs = [("none", []), ("sv", ["--ckpt", "sv"]), ("sv-copies", ["--ckpt", "sv", "--ckpt-format", "2"])]
    if args.ab_idle:
        configs.append(("sv-idle", ["--ckpt", "sv", "--ckpt-writer-idle"]))
    runs = {k: [] for k, _ in configs}
    for rep in range(1, args.reps + 1):
        for key, extra in configs:
            ckpt = os.path.join(work, "ab-ckpt")
            shutil.rmtree(ckpt, ignore_errors=True)
            flags = base + extra + (["--ckpt-dir", ckpt] if extra else [])
            rss = os.path.join(work, "ab-rss")
            shutil.rmtree(rss, ignore_errors=True)
            os.makedirs(rss)
            # Each rank under GNU time (when installed) for its own peak RSS.
            timed = ["/usr/bin/time", "-f", "%M", "-o", os.path.join(rss, "rank-%p")] if os.path.exists(
                "/usr/bin/time") else []
            train = [runner.binary, "train", *runner.common(w, args.batch, clocks), *flags]
            train[train.index("--target-accuracy") + 1] = "0"
            cmd = ["mpirun", "-np", str(args.np), "--oversubscribe", "sh", "-c",
                   shlex.join([*timed, *train]).replace("%p", "$$")]
            say(f"{datetime.datetime.now():%H:%M:%S} A/B {key} rep {rep}")
            before = os.times()
            rc, _, wall = runner.run([cmd], os.path.join(args.raw, f"ab__{key}__{rep}.log"), args.time_limit)
            after = os.times()
            cpu = (after.children_user - before.children_user) + (after.children_system - before.children_system)
            peak = 0
            for name in os.listdir(rss):
                with contextlib.suppress(OSError, ValueError):
                    peak = max(peak, int(open(os.path.join(rss, name)).read().split()[-1]))
            r = {"rc": rc, "wall": wall, "cpu": cpu, "rss_mib": peak / 1024 if peak else None}
            if os.path.isdir(ckpt):
                r["log_bytes_per_clock"] = log_bytes(ckpt) / clocks
            runs[key].append(r if rc == 0 else None)
            shutil.rmtree(ckpt, ignore_errors=True)
    ok = {k: [r for r in v if r] for k, v in runs.items()}
    none_wall = med([r["wall"] for r in ok["none"]])
    none_cpu = med([r["cpu"] for r in ok["none"]])
    out = [f"### Whole-process A/B: `--ckpt sv` against `--ckpt none` ({w.name}, np {args.np}, {clocks} clocks)", "",
           f"`{' '.join(base)}`, batch {args.batch}, no target (every run does {clocks} clocks), "
           f"{args.reps} repetitions interleaved. Wall time of the whole `mpirun`, CPU time of all its processes "
           "(user + system), peak RSS of the largest rank (GNU time), SV log bytes per clock (the replica "
           "directories) against the analytic count (every rank's whole batch once, B(J+K) floats per matrix, "
           "plus headers and 32-byte references; the previous format adds a copy of every received batch).", "",
           "| configuration | runs ok | wall s | wall vs none | CPU s | CPU vs none | peak RSS MiB | "
           "log bytes/clock | analytic | measured/analytic |", "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for key, extra in configs:
        rs = ok[key]
        if not rs:
            out.append(f"| {key} | 0/{len(runs[key])} | | | | | | | | |")
            continue
        wall, cpu = med([r["wall"] for r in rs]), med([r["cpu"] for r in rs])
        rss = med([r["rss_mib"] for r in rs])
        measured = med([r.get("log_bytes_per_clock") for r in rs])
        analytic = None
        if extra:
            fmt = 2 if "--ckpt-format" in extra else 3
            analytic = analytic_log_bytes_per_clock(w, args.np, args.batch, 25, args.np - 1, fmt)
        out.append(
            f"| {key} | {len(rs)}/{len(runs[key])} | {spread([r['wall'] for r in rs], f1)} | "
            f"{wall / none_wall:.3f}× | {spread([r['cpu'] for r in rs], f1)} | "
            f"{cpu / none_cpu:.3f}× | {'—' if rss is None else f'{rss:.0f}'} | "
            f"{fbytes(measured) if measured else '—'} | {fbytes(analytic) if analytic else '—'} | "
            f"{f'{measured / analytic:.3f}' if measured and analytic else '—'} |"
            if none_wall and none_cpu else f"| {key} | {len(rs)}/{len(runs[key])} | {wall:.1f} | — | {cpu:.1f} | — | | | | |")
    out.append("")
    return out


# --- main -------------------------------------------------------------------------------

def check_out_dir(out, name):
    if not os.path.isdir(out):
        sys.exit(f"bench: --out '{out}' is not a directory (create it first)")
    for suffix in (".md", ".png", "_raw.tar.xz"):
        path = os.path.join(out, name + suffix)
        if os.path.exists(path) and (not os.path.isfile(path) or not os.access(path, os.W_OK)):
            sys.exit(f"bench: cannot write '{path}'")
    try:
        probe = tempfile.NamedTemporaryFile(dir=out, prefix=".probe-")
        probe.close()
    except OSError as e:
        sys.exit(f"bench: cannot write into --out '{out}': {e.strerror}")


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("suite", choices=["vs-ddp", "vs-peers", "table4"])
    p.add_argument("--orpheus", default=os.path.join(ROOT, "build-release", "engine", "orpheus"))
    p.add_argument("--np", type=int, default=4)
    p.add_argument("--reps", type=int, help="repetitions, interleaved (default 2 for vs-peers, else 1)")
    p.add_argument("--batch", type=int, default=100)
    p.add_argument("--lr", type=float, default=0.1)
    p.add_argument("--clocks", type=int, default=3000, help="cap on clocks per run (runs stop at the target)")
    p.add_argument("--eval-every", type=int, default=50)
    p.add_argument("--time-limit", type=int, default=900, help="seconds per run before it is cut off")
    p.add_argument("--startup-limit", type=int, default=150,
                   help="seconds a run may take to write its first metrics line before its launch counts as hung "
                        "(killed and retried once)")
    p.add_argument("--networks", default="loopback,1gbit,10gbit")
    p.add_argument("--models", default="mlr,mlp-wide")
    p.add_argument("--threads-column", type=int, default=1,
                   help="vs-ddp: also run 2 ranks x 1 thread against 1 rank x 2 threads on loopback (0: not)")
    p.add_argument("--only", default="", help="comma-separated configuration keys to run (default: all)")
    p.add_argument("--baseline", default="",
                   help="a second orpheus binary (an earlier build): each Orpheus configuration also runs on it, "
                        "as KEY-base, interleaved, so a change is measured side by side")
    p.add_argument("--skip", default="", help="comma-separated NETWORK/CONFIG pairs not to run, e.g. 10gbit/svb")
    p.add_argument("--ckpt-every", type=int, default=100)
    p.add_argument("--fail-prob", type=float, default=0.01)
    p.add_argument("--restore-clocks", type=int, default=400)
    p.add_argument("--ab-clocks", type=int, default=200, help="table4: clocks of each whole-process A/B run (0: none)")
    p.add_argument("--ab-idle", action="store_true", help="table4: also A/B the SCHED_IDLE writer")
    p.add_argument("--no-target-runs", action="store_true",
                   help="table4: only the whole-process A/B and restore timings, not the time-to-target runs")
    p.add_argument("--out", default=os.path.join(HERE, "results"))
    p.add_argument("--name", default="", help="report name (default: the suite's)")
    p.add_argument("--note", default="")
    args = p.parse_args()
    if args.reps is None:
        args.reps = 2 if args.suite == "vs-peers" else 1
    args.networks = [n for n in args.networks.split(",") if n]
    args.models = [m for m in args.models.split(",") if m]
    for n in args.networks:
        if n not in NETWORKS:
            sys.exit(f"bench: unknown network '{n}' (known: {', '.join(NETWORKS)})")
    for m in args.models:
        if m not in WORKLOADS:
            sys.exit(f"bench: unknown model '{m}' (known: {', '.join(WORKLOADS)})")
    if not os.access(args.orpheus, os.X_OK):
        sys.exit(f"bench: missing {args.orpheus} (scripts/run.sh builds it)")
    name = args.name or args.suite
    # The outputs are checked before the first run, so minutes of benchmark are never
    # lost to a report that cannot be written.
    check_out_dir(args.out, name)
    # Raw runs stay out of the source tree; one compressed archive per suite is kept
    # beside its report.
    args.raw = os.path.join(os.path.dirname(os.path.dirname(HERE)), "build", "bench-raw", f"{name}_raw")
    os.makedirs(args.raw, exist_ok=True)

    groups = {"vs-ddp": vs_ddp_groups, "vs-peers": vs_peers_groups, "table4": table4_groups}[args.suite](args)
    if args.suite == "table4" and args.no_target_runs:
        groups = []
    only = [k for k in args.only.split(",") if k]
    skip = {k for k in args.skip.split(",") if k}
    for g in groups:
        g.configs = [c for c in g.configs
                     if (not only or c.key in only) and f"{g.network.name}/{c.key}" not in skip]
    if args.baseline:
        if not os.access(args.baseline, os.X_OK):
            sys.exit(f"bench: --baseline '{args.baseline}' is not an executable")
        for g in groups:
            g.configs += [Config(f"{c.key}-base", f"{c.label} (baseline binary)", c.kind, c.flags, c.note, c.np,
                                 c.batch, baseline=True) for c in g.configs if c.kind == "orpheus"]
    groups = [g for g in groups if g.configs]
    if any(g.network.emulated for g in groups) and os.geteuid() != 0:
        say("the emulated cluster needs root: running on loopback only")
        groups = [g for g in groups if not g.network.emulated]

    # A signal ends the suite through the finally blocks below: processes killed, network down.
    def interrupted(signum, _frame):
        raise KeyboardInterrupt(f"signal {signum}")
    signal.signal(signal.SIGTERM, interrupted)

    global SGEMM
    SGEMM = sgemm_gflops()
    say(f"single-thread SGEMM: {SGEMM} GFLOP/s")
    work = tempfile.mkdtemp(prefix="orpheus-bench-")
    runner = Runner(args, work)
    started = datetime.datetime.utcnow()
    results = {}
    extra = []
    try:
        by_network = {}
        for g in groups:
            by_network.setdefault(g.network.name, []).append(g)
        for net_name, net_groups in by_network.items():
            network = net_groups[0].network
            say(f"network {net_name}: {network.describe()}")
            network.up(args.np)
            try:
                for rep in range(1, args.reps + 1):
                    for g in net_groups:
                        run_group_rep(args, runner, work, g, rep, results)
            finally:
                network.down()
        if args.suite == "table4":
            if args.ab_clocks > 0:
                extra += ab_section(args, runner, work)
            if args.restore_clocks > 0:
                extra += restore_section(args, runner, work)
    except KeyboardInterrupt as e:
        say(f"interrupted ({e}); reporting what finished")
    finally:
        shutil.rmtree(work, ignore_errors=True)
    text = report(args, args.suite, groups, results, runner, started, extra)
    md = os.path.join(args.out, f"{name}.md")
    with open(md, "w") as f:
        f.write(text)
    with open(os.path.join(args.raw, "results.json"), "w") as f:
        json.dump({f"{k[0]}|{k[1]}": v for k, v in results.items()}, f, indent=1, default=str)
    print(text)
    if groups:
        plot(os.path.join(args.out, f"{name}.png"), groups, results)
    archive_raw(args.raw, os.path.join(args.out, f"{name}_raw.tar.xz"))


def archive_raw(raw, archive):
    """Packs a suite's raw runs (metrics, logs, command lines) into one .tar.xz."""
    with tarfile.open(archive, "w:xz") as tar:
        tar.add(raw, arcname=os.path.basename(raw))
    say(f"raw runs in {raw}, archived in {archive}")


def run_group_rep(args, runner, work, g, rep, results):
    none_ms = None
    for c in g.configs:
        base = os.path.join(args.raw, f"{g.key.replace('/', '_')}__{c.key}__{rep}")
        metrics = base + ".jsonl"
        ckpt = os.path.join(work, "ckpt")
        shutil.rmtree(ckpt, ignore_errors=True)
        config = Config(c.key, c.label, c.kind, [f.replace("{ckpt}", ckpt) for f in c.flags], c.note, c.np, c.batch,
                        baseline=c.baseline)
        with contextlib.suppress(FileNotFoundError):
            os.remove(metrics)
        with open(base + ".log", "w") as log:
            log.write(f"load average before: {open('/proc/loadavg').read()}")
        cmds = runner.command(config, g.network, g.workload, args.np, metrics)
        say(f"{datetime.datetime.now():%H:%M:%S} {g.key} {c.key} rep {rep}")
        for attempt in (1, 2):
            tx0 = g.network.tx_bytes()
            rc, timed_out, wall = runner.run(cmds, base + ".log", args.time_limit, started=metrics,
                                             startup_limit=args.startup_limit)
            tx1 = g.network.tx_bytes()
            g.network.kill_leftovers()
            if rc != 125:
                break
            say(f"  the launch hung (no metrics after {args.startup_limit} s); "
                f"{'retrying' if attempt == 1 else 'giving up'}")
        r = analyse(metrics, g.workload.target)
        if r is None:
            say(f"  FAILED (exit {rc}); see {base}.log")
            results.setdefault((g.key, c.key), []).append(None)
            continue
        r["rc"], r["timed_out"], r["wall"] = rc, timed_out, wall
        if tx0 is not None and tx1 is not None:
            r["wire_bytes_per_clock"] = (tx1 - tx0) / max(1, r["clocks_run"])
        r["flags"] = config.flags
        if os.path.isdir(ckpt):
            r["ckpt_bytes_per_clock"] = dir_bytes(ckpt) / max(1, r["clocks_run"])
            r["log_bytes_per_clock"] = log_bytes(ckpt) / max(1, r["clocks_run"])
        if c.key == "none":
            none_ms = r["clock_ms"]
        if none_ms:
            r["clock_ratio"] = r["clock_ms"] / none_ms
        shutil.rmtree(ckpt, ignore_errors=True)
        results.setdefault((g.key, c.key), []).append(r)
        got = (f"target at clock {r['clocks_to_target']}, {r['seconds_to_target']:.1f} s"
               if r["seconds_to_target"] is not None else
               f"target not reached ({r['clocks_run']} clocks, best {r['best_accuracy']})")
        say(f"  {got}; {r['clock_ms']:.1f} ms/clock; wall {wall:.0f} s{' (cut off)' if timed_out else ''}")


if __name__ == "__main__":
    main()
