"""The data-parallel methods a user would pick instead of Orpheus, for ddp_fmnist.py.

A peer decides how the ranks' replicas stay together: after the backward pass
(`after_backward`: the gradient methods) and after the optimizer step (`after_step`: the
parameter methods). The training loop runs the forward pass on `peer.module`. Every peer
counts what it all-reduces (`bytes`: the payload) and its exposed communication
(`comm_seconds`): for the peers written here, the seconds inside their blocking
all-reduces; for DDP and its comm hook, which overlap the all-reduce with the backward
pass, the seconds from the last bucket's hook to the end of the backward pass (with the
hook, its compression arithmetic counts there too).

  ddp            DistributedDataParallel: gradients all-reduced in buckets during backward.
  powersgd       PowerSGD (Vogels et al. 2019) with plain blocking all-reduces, step for step
                 what torch's powerSGD_hook does (see PowerSGD below).
  powersgd-hook  DDP with torch's own powerSGD_hook, the same settings.
  localsgd       every rank steps on its own gradient; parameters averaged every H steps.
  diloco         DiLoCo (Douillard et al. 2023): H inner SGD steps, then an outer Nesterov step
                 on the averaged parameter delta (outer gradient = old params - mean new params).

torch is imported by make(), not here: the harness reads the byte rules below without it.
"""

import time

import numpy as np

PEERS = ("ddp", "powersgd", "powersgd-hook", "localsgd", "diloco")
MIN_COMPRESSION_RATE = 2  # torch's PowerSGDState default
RANDOM_SEED = 0  # torch's PowerSGDState default: seeds the draw of Q

torch = dist = None


def add_arguments(p):
    p.add_argument("--peer", choices=PEERS, default="ddp",
                   help="how the ranks synchronise (default ddp); see scripts/bench/peers.py")
    p.add_argument("--rank-r", type=int, default=1, metavar="R",
                   help="powersgd, powersgd-hook: rank of the approximation (torch's matrix_approximation_rank; "
                        "default 1)")
    p.add_argument("--powersgd-start", type=int, default=2, metavar="S",
                   help="powersgd, powersgd-hook: steps of plain all-reduce before compression (torch's "
                        "start_powerSGD_iter; default 2, the least the hook allows with error feedback)")
    p.add_argument("--local-steps", type=int, default=10, metavar="H",
                   help="localsgd, diloco: steps between synchronisations (default 10)")
    p.add_argument("--outer-lr", type=float, default=0.7, help="diloco: outer learning rate (default 0.7)")
    p.add_argument("--outer-momentum", type=float, default=0.9,
                   help="diloco: outer Nesterov momentum (default 0.9)")


def check_arguments(p, a):
    if a.rank_r < 1:
        p.error(f"--rank-r must be at least 1, got {a.rank_r}")
    if a.powersgd_start < 2:
        p.error(f"--powersgd-start must be at least 2 (torch's hook with error feedback), got {a.powersgd_start}")
    if a.local_steps < 1:
        p.error(f"--local-steps must be at least 1, got {a.local_steps}")
    if not a.outer_lr > 0 or not 0 <= a.outer_momentum < 1:
        p.error("--outer-lr must be positive and --outer-momentum in [0, 1)")


def describe(a):
    """The peer and the settings it uses, for the metrics summary."""
    if a.peer in ("powersgd", "powersgd-hook"):
        return (f"{a.peer} rank {a.rank_r}, plain all-reduce for the first {a.powersgd_start} steps, error feedback, "
                f"warm start, min compression rate {MIN_COMPRESSION_RATE}")
    if a.peer == "localsgd":
        return f"localsgd, parameters averaged every {a.local_steps} steps"
    if a.peer == "diloco":
        return (f"diloco, {a.local_steps} inner SGD steps, outer Nesterov lr {a.outer_lr} "
                f"momentum {a.outer_momentum}")
    return "ddp"


def compressed_rank(shape, rank):
    """The rank PowerSGD compresses a tensor of this shape to, 0 for none: the tensor viewed as
    n x (numel / n) with r = min(n, m, rank) is compressed iff (n + m) r x min rate < n m
    (torch's _should_compress; a vector, n x 1, never is)."""
    n = shape[0]
    m = int(np.prod(shape[1:], dtype=np.int64)) if len(shape) > 1 else 1
    r = min(n, m, rank)
    return r if (n + m) * r * MIN_COMPRESSION_RATE < n * m else 0


def powersgd_payload(shapes, rank):
    """Numbers PowerSGD all-reduces per compressed step: P and Q of each compressed tensor,
    every other tensor whole."""
    total = 0
    for shape in shapes:
        r = compressed_rank(shape, rank)
        n = shape[0]
        numel = int(np.prod(shape, dtype=np.int64))
        total += (n + numel // n) * r if r else numel
    return total


def make(args, model, world):
    global torch, dist
    import torch
    import torch.distributed as dist

    if args.peer == "ddp":
        return DDPPeer(model, world)
    if args.peer == "powersgd-hook":
        return PowerSGDHook(model, world, args.rank_r, args.powersgd_start)
    if args.peer == "powersgd":
        return PowerSGD(model, world, args.rank_r, args.powersgd_start)
    if args.peer == "localsgd":
        return LocalSGD(model, world, args.local_steps)
    return DiLoCo(model, world, args.local_steps, args.outer_lr, args.outer_momentum)


def flatten(tensors):
    return torch.cat([t.reshape(-1) for t in tensors])


def unflatten_into(flat, tensors):
    with torch.no_grad():
        offset = 0
        for t in tensors:
            t.copy_(flat[offset:offset + t.numel()].view_as(t))
            offset += t.numel()


class Peer:
    def __init__(self, model, world):
        self.model, self.module, self.world = model, model, world
        self.params = list(model.parameters())
        self.bytes, self.comm_seconds = 0, 0.0

    def allreduce(self, tensor):
        """Sums the tensor over the ranks in place, blocking; counts its bytes and seconds."""
        start = time.perf_counter()
        dist.all_reduce(tensor)
        self.comm_seconds += time.perf_counter() - start
        self.bytes += tensor.numel() * tensor.element_size()
        return tensor

    def allreduce_mean(self, tensors):
        """Replaces the tensors by their mean over the ranks, in one all-reduce."""
        flat = flatten(tensors)
        unflatten_into(self.allreduce(flat).div_(self.world), tensors)

    def after_backward(self):
        pass

    def after_step(self, step):
        pass


def _ddp_hook(peer, bucket):  # DDP checks the parameter names: (state, bucket)
    if bucket.is_last():  # bucket 0, the last to be all-reduced
        peer.last_bucket_at = time.perf_counter()
    return peer.reduce_bucket(bucket)


class DDPPeer(Peer):
    def __init__(self, model, world):
        super().__init__(model, world)
        from torch.nn.parallel import DistributedDataParallel

        self.module = DistributedDataParallel(model)
        self.last_bucket_at = None
        self.module.register_comm_hook(self, _ddp_hook)

    def reduce_bucket(self, bucket):
        from torch.distributed.algorithms.ddp_comm_hooks import default_hooks

        buf = bucket.buffer()
        self.bytes += buf.numel() * buf.element_size()
        return default_hooks.allreduce_hook(None, bucket)

    def after_backward(self):
        # DDP waits for the buckets' all-reduces at the end of backward: what was left
        # once the last bucket was handed over is the exposed part.
        if self.last_bucket_at is not None:
            self.comm_seconds += time.perf_counter() - self.last_bucket_at
            self.last_bucket_at = None


class PowerSGDHook(DDPPeer):
    def __init__(self, model, world, rank, start):
        from torch.distributed.algorithms.ddp_comm_hooks import powerSGD_hook

        self.hook = powerSGD_hook.powerSGD_hook
        self.state = powerSGD_hook.PowerSGDState(
            None, matrix_approximation_rank=rank, start_powerSGD_iter=start,
            min_compression_rate=MIN_COMPRESSION_RATE, use_error_feedback=True, warm_start=True,
            random_seed=RANDOM_SEED)
        super().__init__(model, world)

    def reduce_bucket(self, bucket):
        buf = bucket.buffer()
        if self.state.iter < self.state.start_powerSGD_iter:
            self.bytes += buf.numel() * buf.element_size()
        else:
            shapes = [g.shape for g in bucket.gradients()]
            self.bytes += powersgd_payload(shapes, self.state.matrix_approximation_rank) * buf.element_size()
        return self.hook(self.state, bucket)


def orthogonalize(m):
    """Orthonormal columns in place, as torch's hook does it: Gram-Schmidt for up to two
    columns, QR beyond."""
    rank = m.shape[1]
    if rank > 2:
        m.copy_(torch.linalg.qr(m)[0])
        return
    for i in range(rank):
        col = m[:, i:i + 1]
        col /= torch.norm(col, dim=0, keepdim=True)
        if i + 1 < rank:
            rest = m[:, i + 1:]
            rest -= torch.sum(col * rest, dim=0, keepdim=True) * col


class PowerSGD(Peer):
    """PowerSGD with blocking all-reduces, following torch 1.13's powerSGD_hook as if one
    bucket held every gradient, so that both compress the same tensors, draw the same Q and
    take the same steps:
      - the first `start` steps all-reduce the whole gradient (start_powerSGD_iter);
      - tensors that compressed_rank() rejects (the biases) are all-reduced whole, in one
        buffer, and averaged;
      - each compressed gradient, viewed as a matrix, gets its error: M = G + E;
      - Q: drawn once, standard normal under the seed RandomState(0).randint(10^9), in
        DDP's bucket order (the parameters reversed, grouped by shape); after that the
        previous step's Q (warm start); orthogonalized before every use;
      - P = M Q, all-reduced (summed) in one buffer, orthogonalized;
      - Q = Mᵀ P, all-reduced in one buffer and divided by the world size;
      - G = P Qᵀ, E = M - P Qᵀ.
    The hook also keeps an error for the tensors it does not compress (its rank's gradient
    less the mean); its mean over ranks is zero, so it changes nothing but rounding."""

    def __init__(self, model, world, rank, start):
        super().__init__(model, world)
        order = list(reversed(self.params))  # DDP's bucket once it is rebuilt after step 1
        first = {}
        for p in order:
            first.setdefault(p.shape, len(first))
        planned = [(p, compressed_rank(p.shape, rank)) for p in order]
        self.matrices = sorted(((p, r) for p, r in planned if r), key=lambda pr: first[pr[0].shape])
        self.vectors = [p for p, r in planned if not r]
        self.start, self.step = start, 0
        self.rng = np.random.RandomState(RANDOM_SEED)
        self.p_flat = self.q_flat = None

    def _buffers(self, like):
        """P and Q as views into two flat buffers (one all-reduce each), Q drawn as the hook draws it."""
        shapes = [(p.shape[0], p.numel() // p.shape[0], r) for p, r in self.matrices]
        self.p_flat = like.new_empty(sum(n * r for n, _, r in shapes))
        self.q_flat = like.new_empty(sum(m * r for _, m, r in shapes))
        self.ps, self.qs, po, qo = [], [], 0, 0
        for n, m, r in shapes:
            self.ps.append(self.p_flat[po:po + n * r].view(n, r))
            self.qs.append(self.q_flat[qo:qo + m * r].view(m, r))
            po, qo = po + n * r, qo + m * r
        self.errors = [like.new_zeros(p.shape[0], p.numel() // p.shape[0]) for p, _ in self.matrices]
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(self.rng.randint(1_000_000_000))
            for q in self.qs:
                q.copy_(torch.randn(*q.shape, dtype=q.dtype))

    def after_backward(self):
        self.step += 1
        if self.step <= self.start:
            self.allreduce_mean([p.grad for p in self.params])
            return
        if self.vectors:
            self.allreduce_mean([p.grad for p in self.vectors])
        ms = [p.grad.view(p.shape[0], -1) for p, _ in self.matrices]
        if not ms:
            return
        if self.p_flat is None:
            self._buffers(ms[0])
        for m, e in zip(ms, self.errors):
            m.add_(e)
        for m, q, p in zip(ms, self.qs, self.ps):
            orthogonalize(q)
            torch.matmul(m, q, out=p)
        self.allreduce(self.p_flat)
        for m, p, q in zip(ms, self.ps, self.qs):
            orthogonalize(p)
            torch.matmul(m.t(), p, out=q)
        self.allreduce(self.q_flat).div_(self.world)
        for m, p, q, e in zip(ms, self.ps, self.qs, self.errors):
            approx = p @ q.t()
            torch.sub(m, approx, out=e)
            m.copy_(approx)


class LocalSGD(Peer):
    def __init__(self, model, world, every):
        super().__init__(model, world)
        self.every = every

    def after_step(self, step):
        if step % self.every == 0:
            self.allreduce_mean(self.params)


class DiLoCo(Peer):
    def __init__(self, model, world, every, lr, momentum):
        super().__init__(model, world)
        self.every, self.lr, self.momentum = every, lr, momentum
        self.outer = flatten(self.params).detach().clone()
        self.buf = None

    def after_step(self, step):
        if step % self.every:
            return
        with torch.no_grad():
            delta = self.outer - flatten(self.params)
            self.allreduce(delta).div_(self.world)  # the outer gradient: old - mean of the new
            # torch.optim.SGD(momentum, nesterov=True): b = mu b + g (b = g at first), step g + mu b
            self.buf = delta.clone() if self.buf is None else self.buf.mul_(self.momentum).add_(delta)
            self.outer.sub_(delta.add(self.buf, alpha=self.momentum), alpha=self.lr)
            unflatten_into(self.outer, self.params)
