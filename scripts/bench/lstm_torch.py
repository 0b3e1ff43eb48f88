#!/usr/bin/python3
"""PyTorch's nn.LSTM language model trained as `orpheus train --model examples/lstm.loss`
trains it: the same token files, the same per-rank shards and parallel streams, the
same segments in the same order, the same states carried across segments, plain SGD
with the same step (the gradient of the loss summed over a clock's tokens, divided
by the B*P examples of the clock), the same evaluation.

  lstm_torch.py --train T.tokens --valid V.tokens --ranks P --batch B --clocks N --lr LR
                [--embed D] [--hidden H] [--init R] [--eval-every K] [--target-perplexity X] [--ddp] [--threads N]
                [--device cpu|cuda] [--powersgd R]
                [--rank R --master ADDR]   (one DDP process, started by the caller on its host)

Without --ddp one process computes what P ranks of DDP would (the mean of their
gradients is the full gradient), which is what tests/e2e/lstm_kjv.sh takes its
bound from; with --ddp it runs P processes of DistributedDataParallel over gloo on
this machine (the benchmark's baseline). Prints one JSON line per evaluation:
clock, examples, tokens, valid_perplexity, seconds (training time, evaluations
excluded), and a summary line. Run with Debian's /usr/bin/python3 (python3-torch).
"""

import argparse
import json
import math
import os
import sys
import time

import torch

SEGMENT_CAP_STREAMS = 16


def read_tokens(path):
    with open(path, "rb") as f:
        data = f.read()
    header_end = data.index(b"\n") + 1
    fields = dict(kv.split("=") for kv in data[:header_end].decode().split()[1:])
    return data, header_end, int(fields["vocabulary"]), int(fields["steps"])


def shard(data, body_start, rank, ranks):
    """The ids of the lines whose first byte lies in rank's part of the body, as
    engine/data/token_reader.cc reads them."""
    body = len(data) - body_start
    begin = body_start + body * rank // ranks
    end = body_start + body * (rank + 1) // ranks
    pos = begin if begin == body_start else data.find(b"\n", begin - 1) + 1
    if pos == 0:
        return []
    ids = []
    while 0 < pos < end and pos < len(data):
        stop = data.find(b"\n", pos)
        stop = len(data) if stop < 0 else stop
        ids.extend(int(t) for t in data[pos:stop].split())
        pos = stop + 1
    return ids


def segments(ids, streams, steps):
    """(segments, streams, steps + 1) tokens: segment s of stream b."""
    if streams <= 0:
        streams = max(1, min(len(ids) // (steps + 1), SEGMENT_CAP_STREAMS))
    per_stream = len(ids) // streams
    count = (per_stream - 1) // steps
    t = torch.tensor(ids[: per_stream * streams]).reshape(streams, per_stream)
    return torch.stack([t[:, s * steps: s * steps + steps + 1] for s in range(count)])


class Model(torch.nn.Module):
    def __init__(self, vocab, embed, hidden, init):
        super().__init__()
        self.embed = torch.nn.Embedding(vocab, embed)
        self.lstm = torch.nn.LSTM(embed, hidden)
        self.out = torch.nn.Linear(hidden, vocab)
        with torch.no_grad():  # as examples/lstm.loss: uniform(init), zero biases
            for p in self.parameters():
                p.uniform_(-init, init)
            for b in (self.lstm.bias_ih_l0, self.lstm.bias_hh_l0, self.out.bias):
                b.zero_()

    def forward(self, segment, state):
        """segment: (B, T + 1) tokens; returns the summed loss and the next state."""
        x = segment[:, :-1].t()
        h, state = self.lstm(self.embed(x), state)
        logits = self.out(h)
        loss = torch.nn.functional.cross_entropy(logits.reshape(-1, logits.shape[-1]), segment[:, 1:].t().reshape(-1),
                                                 reduction="sum")
        return loss, tuple(s.detach() for s in state)


def zero_state(batch, hidden, device=None):
    return (torch.zeros(1, batch, hidden, device=device), torch.zeros(1, batch, hidden, device=device))


def evaluate(model, shards, hidden):
    total, count = 0.0, 0
    with torch.no_grad():
        for segs in shards:
            state = zero_state(segs.shape[1], hidden, segs.device)
            for s in range(segs.shape[0]):
                loss, state = model(segs[s], state)
                total += loss.item()
                count += segs.shape[1] * (segs.shape[2] - 1)
    return total, count


def train(args, rank, ranks, ddp):
    data, start, vocab, steps = read_tokens(args.train)
    my_ranks = [rank] if ddp else list(range(ranks))
    device = torch.device("cpu")
    if args.device == "cuda":
        if not torch.cuda.is_available():
            sys.exit("lstm_torch: --device cuda: this torch sees no CUDA GPU")
        device = torch.device("cuda", rank % torch.cuda.device_count())
        torch.cuda.set_device(device)
    train_shards = [segments(shard(data, start, r, ranks), args.batch, steps).to(device) for r in my_ranks]
    vdata, vstart, _, _ = read_tokens(args.valid)
    valid_shards = [segments(shard(vdata, vstart, r, ranks), args.batch, steps).to(device) for r in my_ranks]
    torch.manual_seed(args.seed)
    model = Model(vocab, args.embed, args.hidden, args.init).to(device)
    peer = None
    if ddp and args.powersgd > 0:
        # PowerSGD (Vogels et al. 2019) at rank R with error feedback and warm start, from
        # the third step, with blocking all-reduces: step for step what torch's
        # powerSGD_hook does (scripts/bench/peers.py), whose hook crashes in gloo here.
        sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
        import types
        import peers
        peer = peers.make(types.SimpleNamespace(peer="powersgd", rank_r=args.powersgd, powersgd_start=2), model,
                          ranks)
        net = model
    else:
        net = torch.nn.parallel.DistributedDataParallel(model) if ddp else model
    opt = torch.optim.SGD(model.parameters(), lr=args.lr)
    states = [zero_state(args.batch, args.hidden, device) for _ in my_ranks]
    seconds = 0.0
    lead = rank == 0

    def report(clock):
        total, count = evaluate(model, valid_shards, args.hidden)
        if ddp:
            t = torch.tensor([total, float(count)], dtype=torch.float64)
            torch.distributed.all_reduce(t)
            total, count = t[0].item(), t[1].item()
        ppl = math.exp(total / count)
        if lead:
            print(json.dumps({"clock": clock, "examples": clock * args.batch * ranks,
                              "tokens": clock * args.batch * ranks * steps, "valid_perplexity": ppl,
                              "seconds": seconds}), flush=True)
        return ppl

    ppl = report(0)
    clock = 0
    for clock in range(1, args.clocks + 1):
        began = time.perf_counter()
        opt.zero_grad()
        for k, segs in enumerate(train_shards):
            loss, states[k] = net(segs[(clock - 1) % segs.shape[0]], states[k])
            # The gradient of the clock's summed loss over the B*P examples it holds
            # (DDP averages the ranks' gradients: each divides by B only).
            (loss / (args.batch * (1 if ddp else ranks))).backward()
        if peer is not None:
            peer.after_backward()  # the gradients averaged over the ranks, compressed
        opt.step()
        if device.type == "cuda":
            torch.cuda.synchronize(device)  # the clock's kernels are queued, not done
        seconds += time.perf_counter() - began
        if (args.eval_every > 0 and clock % args.eval_every == 0) or clock == args.clocks:
            ppl = report(clock)
            if args.target_perplexity > 0 and ppl <= args.target_perplexity:
                break
    if lead:
        print(json.dumps({"summary": True, "clocks": clock, "valid_perplexity": ppl, "seconds": seconds,
                          "reached_target": args.target_perplexity > 0 and ppl <= args.target_perplexity}), flush=True)


def ddp_worker(rank, args):
    os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
    os.environ.setdefault("MASTER_PORT", str(args.port))
    torch.distributed.init_process_group("gloo", rank=rank, world_size=args.ranks)
    torch.set_num_threads(args.threads)
    try:
        train(args, rank, args.ranks, True)
    finally:
        torch.distributed.destroy_process_group()


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--train", required=True)
    p.add_argument("--valid", required=True)
    p.add_argument("--ranks", type=int, default=4)
    p.add_argument("--batch", type=int, default=20, help="streams (examples) per rank per clock")
    p.add_argument("--clocks", type=int, default=100)
    p.add_argument("--lr", type=float, default=0.05)
    p.add_argument("--embed", type=int, default=128)
    p.add_argument("--hidden", type=int, default=128)
    p.add_argument("--init", type=float, default=0.1,
                   help="weights uniform in [-init, init], as the .loss model's `init uniform(init)`")
    p.add_argument("--eval-every", type=int, default=0)
    p.add_argument("--target-perplexity", type=float, default=0.0)
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--device", choices=["cpu", "cuda"], default="cpu",
                   help="cuda: each rank on the GPU of its rank modulo the GPUs visible (several may share one)")
    p.add_argument("--ddp", action="store_true", help="P processes of DDP over gloo")
    p.add_argument("--powersgd", type=int, default=0, metavar="R",
                   help="with --ddp (or --rank): gradients averaged by PowerSGD at rank R (peers.py) instead of DDP")
    p.add_argument("--threads", type=int, default=1, help="torch threads per process")
    p.add_argument("--port", type=int, default=29533)
    p.add_argument("--rank", type=int, default=-1, help="run only this DDP rank (with --master)")
    p.add_argument("--master", default="", help="address of DDP rank 0")
    args = p.parse_args()
    if args.rank >= 0:
        os.environ["MASTER_ADDR"] = args.master or "127.0.0.1"
        ddp_worker(args.rank, args)
    elif args.ddp:
        torch.multiprocessing.spawn(ddp_worker, args=(args,), nprocs=args.ranks, join=True)
    else:
        torch.set_num_threads(args.threads)
        train(args, 0, args.ranks, False)


if __name__ == "__main__":
    sys.exit(main())
