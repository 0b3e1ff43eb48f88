#!/usr/bin/python3
"""PyTorch DistributedDataParallel (gloo) and its peers on Fashion-MNIST, trained the way the
engine trains.

The data-parallel baselines that Orpheus is compared against: the same models, data, sharding,
sampling, loss, step and metrics format as `orpheus train`, with the replicas kept together by
--peer (scripts/bench/peers.py): ddp (gradients all-reduced by DDP, the default), powersgd
(PowerSGD with blocking all-reduces, --rank-r), powersgd-hook (DDP with torch's powerSGD_hook),
localsgd (parameters averaged every --local-steps H) or diloco (an outer Nesterov step every H).

  Data      Fashion-MNIST IDX gzip files (--data DIR), pixels / 255 as float32. Rank r of P holds
            training examples [60000 r/P, 60000 (r+1)/P) and test examples [10000 r/P,
            10000 (r+1)/P) (integer division). Each step a rank draws --batch examples from its
            shard without replacement within an epoch (a fresh permutation per epoch, seeded by
            (seed, rank, epoch)).
  Models    mlr: softmax regression 784 -> 10, W ~ normal(0, 0.01), b = 0 (as ops/mlr.cc).
            mlp: 784 -> H -> H -> 10 with ReLU (examples/mlp.loss): W1, W2 He normal
            (std sqrt(2 / fan_in)), W3 Glorot uniform (a = sqrt(6 / (fan_in + fan_out))),
            biases zero.
  Step      mean softmax cross-entropy over the rank's batch; DDP averages gradients over ranks,
            so SGD (constant --lr, no momentum unless --nesterov) steps by lr x the mean gradient over all P x B
            examples, the meaning of the engine's --lr (localsgd and diloco step on the rank's
            own gradient between synchronisations).
  Timing    per step around forward + backward + the peer's communication + optimizer step;
            batch gathering, data loading and evaluation are excluded. Ranks agree at every
            evaluation (an all-reduce of the test counts), so all stop together. Evaluation
            runs on each rank's own replica (localsgd and diloco: identical at the steps that
            synchronise, so evaluate every multiple of H).

Launch, either
  /usr/bin/python3 scripts/bench/ddp_fmnist.py --np 4 --model mlr --clocks 2000 --target-accuracy 0.82
      spawns 4 local processes (gloo over 127.0.0.1, interface lo unless --ifname), or
  /usr/bin/python3 scripts/bench/ddp_fmnist.py --rank R --world-size P --master ADDR:PORT --ifname eth0 ...
      one process per rank, started by the caller, e.g. in an emulated host:
      scripts/netcluster.sh exec R /usr/bin/python3 scripts/bench/ddp_fmnist.py --rank R \\
          --world-size 4 --master 198.18.0.1:29500 --ifname eth0 --model mlp --hidden 2048 --clocks 50

Output: --metrics FILE (rank 0) as JSON lines in the engine's format: one line per step with
clock, seconds (cumulative training seconds on rank 0), clock_seconds, compute_seconds and
comm_seconds (rank 0's exposed communication, see peers.py, and the rest of the step), train_loss
(rank 0's batch loss) and bytes_sent (see below), plus test_accuracy and test_loss on evaluation
steps; then a summary line ("summary": true, "system": PEER, ...). One final line on stdout, e.g.
  ddp mlp-2048 on 4 ranks: 1200 steps in 208.1 s, test accuracy 0.8512

Bytes: the peer adds up the bytes of every tensor it all-reduces in a step (the payload,
measured; for DDP a comm hook wrapping the default all-reduce hook counts every gradient
bucket). bytes_sent per step is what all ranks together send under a ring all-reduce of that
payload: P x 2(P-1)/P x payload, the same count the engine uses for --sync dense.

For the correctness checks (peers_check.py): --dtype float64 and --save-params FILE (rank 0's
parameters at the end, as numpy .npz, in the model's order).

Exit codes: 0 done, 2 bad arguments or a missing data file, 1 other failures (e.g. a peer that
does not show up within --timeout seconds).
"""

import os

# One BLAS and one OpenMP thread per process: the ranks share the machine's cores. Set before
# torch is imported so that both the parent and every spawned rank see it.
os.environ["OPENBLAS_NUM_THREADS"] = "1"
os.environ["OMP_NUM_THREADS"] = "1"
os.environ["MKL_NUM_THREADS"] = "1"

import argparse
import datetime
import gzip
import json
import re
import socket
import struct
import sys
import time

import numpy as np

import peers

DEFAULT_DATA = "/usr/share/datasets/fashion-mnist"
FILES = {
    "train_images": "train-images-idx3-ubyte.gz",
    "train_labels": "train-labels-idx1-ubyte.gz",
    "test_images": "t10k-images-idx3-ubyte.gz",
    "test_labels": "t10k-labels-idx1-ubyte.gz",
}


class UsageError(Exception):
    pass


def fail(message, code=2):
    print(f"ddp_fmnist: {message}", file=sys.stderr)
    sys.exit(code)


def parse_args(argv):
    p = argparse.ArgumentParser(
        description="PyTorch DDP (gloo) and its peers on Fashion-MNIST, trained like `orpheus train`.",
        formatter_class=argparse.RawDescriptionHelpFormatter,
        epilog="See the header of this file for the data, models, timing and metrics.",
    )
    p.add_argument("--model", choices=["mlr", "mlp"], default="mlr")
    p.add_argument("--hidden", type=int, default=1024, help="width H of both MLP hidden layers (default 1024)")
    p.add_argument("--data", default=DEFAULT_DATA, help=f"directory of the IDX .gz files (default {DEFAULT_DATA})")
    p.add_argument("--clocks", type=int, default=1000, help="steps to run at most (default 1000)")
    p.add_argument("--batch", type=int, default=100, help="examples per rank per step (default 100)")
    p.add_argument("--lr", type=float, default=0.1, help="SGD step on the mean loss of the global batch (default 0.1)")
    p.add_argument("--nesterov", type=float, default=0.0, metavar="MU",
                   help="SGD with Nesterov momentum MU (torch.optim.SGD(momentum=MU, nesterov=True), as orpheus "
                        "--optimizer nesterov --momentum MU); 0: plain SGD (default)")
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--eval-every", type=int, default=50, help="evaluate every E steps and at the end; 0: at the end only")
    p.add_argument("--target-accuracy", type=float, default=0.0,
                   help="stop at the first evaluation whose test accuracy is >= A (0: never)")
    p.add_argument("--metrics", help="JSON lines file written by rank 0")
    p.add_argument("--timeout", type=float, default=300.0, help="longest wait for a peer, seconds (default 300)")
    p.add_argument("--np", type=int, help="spawn this many local ranks (gloo over 127.0.0.1)")
    p.add_argument("--port", type=int, default=0, help="with --np: the rendezvous port (default: a free one)")
    p.add_argument("--rank", type=int, help="this process's rank (with --world-size and --master)")
    p.add_argument("--world-size", type=int)
    p.add_argument("--master", help="ADDR:PORT of rank 0's rendezvous")
    p.add_argument("--ifname", help="network interface gloo uses (sets GLOO_SOCKET_IFNAME), e.g. eth0")
    p.add_argument("--dtype", choices=["float32", "float64"], default="float32",
                   help="parameters and data (default float32; float64 for the correctness checks)")
    p.add_argument("--device", choices=["cpu", "cuda"], default="cpu",
                   help="cpu, or cuda: every rank on the GPU of its rank modulo the GPUs visible (several ranks "
                        "may share one; gloo stages CUDA tensors through host memory) (default cpu)")
    p.add_argument("--save-params", metavar="FILE", help="rank 0 writes its parameters at the end (.npz)")
    peers.add_arguments(p)
    a = p.parse_args(argv)

    spawned = a.np is not None
    external = any(v is not None for v in (a.rank, a.world_size, a.master))
    if spawned == external:
        p.error("give either --np P, or --rank R --world-size P --master ADDR:PORT")
    if spawned:
        if a.np < 1:
            p.error(f"--np must be at least 1, got {a.np}")
        a.world_size = a.np
    else:
        if a.rank is None or a.world_size is None or a.master is None:
            p.error("--rank, --world-size and --master go together")
        if a.world_size < 1 or not 0 <= a.rank < a.world_size:
            p.error(f"--rank must be in [0, --world-size), got rank {a.rank} of {a.world_size}")
        host, sep, port = a.master.rpartition(":")
        if not sep or not host or not port.isdigit() or not 0 < int(port) < 65536:
            p.error(f"--master must be ADDR:PORT, got '{a.master}'")
    if a.clocks < 1:
        p.error(f"--clocks must be at least 1, got {a.clocks}")
    if a.batch < 1:
        p.error(f"--batch must be at least 1, got {a.batch}")
    if not 0 <= a.nesterov < 1:
        p.error(f"--nesterov must be in [0, 1), got {a.nesterov}")
    if a.hidden < 1:
        p.error(f"--hidden must be at least 1, got {a.hidden}")
    if a.eval_every < 0:
        p.error(f"--eval-every must be >= 0, got {a.eval_every}")
    if not 0.0 <= a.target_accuracy <= 1.0:
        p.error(f"--target-accuracy must be in [0, 1], got {a.target_accuracy}")
    if not a.lr > 0:
        p.error(f"--lr must be positive, got {a.lr}")
    if a.timeout <= 0:
        p.error(f"--timeout must be positive, got {a.timeout}")
    peers.check_arguments(p, a)
    return a


def check_data(directory):
    for name in FILES.values():
        path = os.path.join(directory, name)
        if not os.path.isfile(path):
            raise UsageError(f"missing data file {path} (Debian package dataset-fashion-mnist)")


def read_idx_shard(path, rank, world, expect_dims):
    """Rows [n r/P, n (r+1)/P) of an IDX gzip file as a numpy array (uint8)."""
    try:
        with gzip.open(path, "rb") as f:
            header = f.read(4)
            if len(header) != 4 or header[0] != 0 or header[1] != 0 or header[2] != 0x08:
                raise UsageError(f"{path}: not an IDX file of unsigned bytes")
            dims = header[3]
            if dims != expect_dims:
                raise UsageError(f"{path}: expected {expect_dims} dimensions, the file has {dims}")
            shape = struct.unpack(">" + "I" * dims, f.read(4 * dims))
            row = int(np.prod(shape[1:])) if dims > 1 else 1
            n = shape[0]
            begin, end = n * rank // world, n * (rank + 1) // world
            f.seek(4 + 4 * dims + begin * row)  # gzip seeks forward by decompressing
            data = f.read((end - begin) * row)
    except (OSError, EOFError, struct.error) as e:
        raise UsageError(f"{path}: cannot read: {e}")
    if len(data) != (end - begin) * row:
        raise UsageError(f"{path}: truncated")
    arr = np.frombuffer(data, dtype=np.uint8)
    return arr.reshape((end - begin,) + tuple(shape[1:])) if dims > 1 else arr, n


def load_shard(directory, split, rank, world):
    images, n = read_idx_shard(os.path.join(directory, FILES[split + "_images"]), rank, world, 3)
    labels, m = read_idx_shard(os.path.join(directory, FILES[split + "_labels"]), rank, world, 1)
    if n != m:
        raise UsageError(f"{split}: {n} images but {m} labels")
    x = images.reshape(images.shape[0], -1).astype(np.float32) / np.float32(255.0)
    if labels.size and labels.max() > 9:
        raise UsageError(f"{split}: label {int(labels.max())} beyond the 10 classes")
    return x, labels.astype(np.int64)


class Sampler:
    """Minibatches of shard indices without replacement within an epoch, like the engine's
    MinibatchSampler: each epoch a fresh permutation; a batch that crosses into the next epoch
    takes that epoch's first indices it does not hold already."""

    def __init__(self, size, batch, seed, rank):
        self.size, self.batch, self.seed, self.rank = size, batch, seed, rank
        self.epoch, self.order, self.pos = 0, np.empty(0, dtype=np.int64), 0

    def _reshuffle(self, held):
        self.epoch += 1
        rng = np.random.default_rng([self.seed, self.rank, self.epoch])
        order = rng.permutation(self.size)
        need = self.batch - len(held)
        if held and self.batch <= self.size:
            mask = np.isin(order, np.fromiter(held, dtype=np.int64))
            free = order[~mask]
            order = np.concatenate([free[:need], order[mask], free[need:]])
        self.order, self.pos = order, 0

    def next(self):
        out = []
        while len(out) < self.batch:
            if self.pos == len(self.order):
                self._reshuffle(set(int(i) for i in out))
            take = min(len(self.order) - self.pos, self.batch - len(out))
            out.extend(self.order[self.pos:self.pos + take].tolist())
            self.pos += take
        return np.asarray(out, dtype=np.int64)


def build_model(torch, args, features, classes):
    nn = torch.nn
    torch.manual_seed(args.seed)  # DDP broadcasts rank 0's parameters anyway
    if args.model == "mlr":
        model = nn.Linear(features, classes)
        with torch.no_grad():
            model.weight.normal_(0.0, 0.01)
            model.bias.zero_()
        return model, "mlr", f"mlr features={features} classes={classes}"
    h = args.hidden
    model = nn.Sequential(nn.Linear(features, h), nn.ReLU(), nn.Linear(h, h), nn.ReLU(), nn.Linear(h, classes))
    with torch.no_grad():
        for layer in (model[0], model[2]):  # He normal: std sqrt(2 / fan_in)
            layer.weight.normal_(0.0, (2.0 / layer.in_features) ** 0.5)
            layer.bias.zero_()
        last = model[4]  # Glorot uniform: a = sqrt(6 / (fan_in + fan_out))
        a = (6.0 / (last.in_features + last.out_features)) ** 0.5
        last.weight.uniform_(-a, a)
        last.bias.zero_()
    return model, f"mlp-{h}", f"mlp {features}-{h}-{h}-{classes}"


def blas_description(torch):
    """The BLAS library this process really loaded, plus what the torch build says."""
    libs = []
    try:
        with open("/proc/self/maps") as f:
            for line in f:
                fields = line.split()
                path = fields[5] if len(fields) >= 6 else ""
                base = os.path.basename(path).lower()
                short = "/".join(path.split("/")[-2:])
                if ("blas" in base or "mkl" in base) and short not in libs:
                    libs.append(short)
    except OSError:
        pass
    match = re.search(r"BLAS_INFO=(\w+)", torch.__config__.show())
    return f"{', '.join(libs) or 'unknown'} (torch build BLAS_INFO={match.group(1) if match else 'unknown'})"


def worker(rank, args, init_method):
    import torch
    import torch.distributed as dist
    import torch.nn.functional as F

    torch.set_num_threads(1)
    try:
        torch.set_num_interop_threads(1)
    except RuntimeError:
        pass  # already set in this process
    if args.ifname:
        os.environ["GLOO_SOCKET_IFNAME"] = args.ifname
    world = args.world_size

    # Data first (excluded from the timing), then the rendezvous.
    xtr, ytr = load_shard(args.data, "train", rank, world)
    xte, yte = load_shard(args.data, "test", rank, world)
    device = torch.device("cpu")
    if args.device == "cuda":
        if not torch.cuda.is_available():
            raise UsageError("--device cuda: this torch sees no CUDA GPU")
        device = torch.device("cuda", rank % torch.cuda.device_count())
        torch.cuda.set_device(device)
    xtr, ytr = torch.from_numpy(xtr).to(device), torch.from_numpy(ytr).to(device)
    xte, yte = torch.from_numpy(xte).to(device), torch.from_numpy(yte).to(device)
    if len(ytr) == 0:
        raise UsageError(f"rank {rank} of {world} has an empty training shard")
    features, classes = xtr.shape[1], 10

    try:
        dist.init_process_group("gloo", init_method=init_method, rank=rank, world_size=world,
                                timeout=datetime.timedelta(seconds=args.timeout))
    except RuntimeError as e:
        first = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        raise RuntimeError(f"no rendezvous of {world} ranks at {init_method} within {args.timeout:g} s "
                           f"(interface {os.environ.get('GLOO_SOCKET_IFNAME', 'default')}): {first}") from e
    model, model_name, model_spec = build_model(torch, args, features, classes)
    dtype = getattr(torch, args.dtype)
    model.to(device=device, dtype=dtype)
    peer = peers.make(args, model, world)
    opt = torch.optim.SGD(model.parameters(), lr=args.lr, momentum=args.nesterov, nesterov=args.nesterov > 0)
    sampler = Sampler(len(ytr), args.batch, args.seed, rank)
    leader = rank == 0

    def evaluate():
        """(test loss, test accuracy) over every rank's test shard; a collective."""
        sums = torch.zeros(3, dtype=torch.float64)  # loss sum, correct, count
        with torch.no_grad():
            for i in range(0, len(yte), 1000):
                logits = model(xte[i:i + 1000].to(dtype))
                y = yte[i:i + 1000]
                sums[0] += F.cross_entropy(logits, y, reduction="sum").item()
                sums[1] += (logits.argmax(1) == y).sum().item()
                sums[2] += len(y)
        dist.all_reduce(sums)
        n = max(sums[2].item(), 1.0)
        return sums[0].item() / n, sums[1].item() / n

    metrics = open(args.metrics, "w") if leader and args.metrics else None

    def write(record):
        if metrics:
            metrics.write(json.dumps(record) + "\n")

    initial_loss, _ = evaluate()
    dist.barrier()
    train_seconds, total_bytes, best_acc = 0.0, 0, 0.0
    last_loss, last_acc = initial_loss, None
    reached = False
    step = 0
    for step in range(1, args.clocks + 1):
        idx = torch.from_numpy(sampler.next()).to(device)
        x, y = xtr[idx].to(dtype), ytr[idx]
        before, comm_before = peer.bytes, peer.comm_seconds
        start = time.perf_counter()
        opt.zero_grad(set_to_none=True)
        loss = F.cross_entropy(peer.module(x), y)
        loss.backward()  # ddp and powersgd-hook all-reduce the gradient buckets here
        peer.after_backward()
        opt.step()
        peer.after_step(step)
        if device.type == "cuda":
            torch.cuda.synchronize(device)  # the step's kernels are queued, not done
        clock_seconds = time.perf_counter() - start
        comm_seconds = peer.comm_seconds - comm_before
        train_seconds += clock_seconds
        payload = peer.bytes - before
        # Ring all-reduce: each rank sends 2(P-1)/P x payload, P ranks together 2(P-1) x payload.
        sent = 2 * (world - 1) * payload
        total_bytes += sent
        record = {"clock": step, "seconds": train_seconds, "clock_seconds": clock_seconds,
                  "compute_seconds": clock_seconds - comm_seconds, "comm_seconds": comm_seconds,
                  "train_loss": loss.item(), "bytes_sent": sent}
        if step == args.clocks or (args.eval_every > 0 and step % args.eval_every == 0):
            last_loss, last_acc = evaluate()
            best_acc = max(best_acc, last_acc)
            record["test_loss"], record["test_accuracy"] = last_loss, last_acc
            if metrics:
                metrics.flush()
            reached = args.target_accuracy > 0 and last_acc >= args.target_accuracy
        write(record)
        if reached:
            break

    # The loop ends at an evaluation: the last step, or the one that reached the target.
    payload_per_step = peer.bytes / step
    if leader:
        if args.save_params:
            np.savez(args.save_params, *[p.detach().cpu().numpy() for p in model.parameters()])
        summary = {
            "summary": True, "system": args.peer, "peer": peers.describe(args), "dtype": args.dtype,
            "clocks": step, "clocks_planned": args.clocks,
            "reached_target": reached, "target_accuracy": args.target_accuracy, "ranks": world,
            "batch_per_rank": args.batch, "model": model_name, "model_spec": model_spec, "lr": args.lr,
            "seed": args.seed, "seconds": train_seconds, "seconds_per_clock": train_seconds / step,
            "bytes_sent": total_bytes, "bytes_per_clock": total_bytes / step,
            "allreduce_bytes_per_clock": payload_per_step,
            "bytes_model": "ring allreduce: 2(P-1)/P x payload per rank, summed over ranks",
            "initial_test_loss": initial_loss, "test_loss": last_loss, "test_accuracy": last_acc,
            "best_test_accuracy": best_acc, "torch": torch.__version__, "blas": blas_description(torch),
        }
        write(summary)
        if metrics:
            metrics.close()
        print(f"{args.peer} {model_name} on {world} ranks: {step} steps in {train_seconds:.1f} s, "
              f"test accuracy {last_acc:.4f}", flush=True)
    dist.barrier()
    dist.destroy_process_group()


def spawned_worker(rank, args, init_method):
    try:
        worker(rank, args, init_method)
    except UsageError as e:
        print(f"ddp_fmnist: rank {rank}: {e}", file=sys.stderr)
        sys.exit(2)


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def main(argv):
    args = parse_args(argv)
    try:
        check_data(args.data)
    except UsageError as e:
        fail(str(e))
    for name, path in (("--metrics", args.metrics), ("--save-params", args.save_params)):
        directory = os.path.dirname(os.path.abspath(path)) if path else None
        if directory and not os.path.isdir(directory):
            fail(f"{name}: directory {directory} does not exist")
    try:
        if args.np is not None:
            import torch.multiprocessing as mp

            if not args.ifname:
                args.ifname = "lo"
            init_method = f"tcp://127.0.0.1:{args.port or free_port()}"
            try:
                mp.spawn(spawned_worker, args=(args, init_method), nprocs=args.np, join=True)
            except mp.ProcessExitedException as e:
                fail(f"rank {e.error_index} exited with code {e.exit_code}", 2 if e.exit_code == 2 else 1)
            except mp.ProcessRaisedException as e:
                last = str(e).strip().splitlines()[-1] if str(e).strip() else "failed"
                fail(f"a rank failed: {last}", 1)
        else:
            worker(args.rank, args, f"tcp://{args.master}")
    except UsageError as e:
        fail(str(e))
    except RuntimeError as e:
        fail(f"rank {args.rank if args.rank is not None else 0}: {str(e).strip().splitlines()[0]}", 1)
    except KeyboardInterrupt:
        fail("interrupted", 130)


if __name__ == "__main__":
    main(sys.argv[1:])
