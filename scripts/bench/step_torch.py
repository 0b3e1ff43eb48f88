"""One rank's training step of the 784-H-H-10 MLP in PyTorch, without the network: the
counterpart of orpheus_bench_step --modes dense (step_vs_torch.sh runs both). Forward,
cross-entropy, backward, SGD step on random data of the same shapes; prints one JSON line
with the time per clock.

Usage: /usr/bin/python3 step_torch.py [--features D] [--hidden H] [--classes C] [--batch B]
         [--clocks N] [--warmup N] [--threads T]
"""
import argparse
import json
import statistics
import sys
import time


def main(argv):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--features", type=int, default=784)
    p.add_argument("--hidden", type=int, default=2048)
    p.add_argument("--classes", type=int, default=10)
    p.add_argument("--batch", type=int, default=100)
    p.add_argument("--clocks", type=int, default=20)
    p.add_argument("--warmup", type=int, default=3)
    p.add_argument("--threads", type=int, default=1)
    a = p.parse_args(argv)
    import torch
    import torch.nn.functional as F
    from torch import nn

    torch.set_num_threads(a.threads)
    torch.manual_seed(7)
    h = a.hidden
    model = nn.Sequential(nn.Linear(a.features, h), nn.ReLU(), nn.Linear(h, h), nn.ReLU(), nn.Linear(h, a.classes))
    opt = torch.optim.SGD(model.parameters(), lr=1e-4)
    x = torch.rand(a.batch, a.features)
    y = torch.randint(0, a.classes, (a.batch,))

    def clock():
        opt.zero_grad(set_to_none=True)
        loss = F.cross_entropy(model(x), y)
        loss.backward()
        opt.step()
        return loss.item()

    loss = 0.0
    for _ in range(a.warmup):
        clock()
    seconds = []
    for _ in range(a.clocks):
        t = time.perf_counter()
        loss = clock()
        seconds.append(time.perf_counter() - t)
    print(json.dumps({"kind": "step", "engine": "torch", "mode": "dense", "hidden": h, "batch": a.batch,
                      "threads": a.threads, "clocks": a.clocks, "median_ms": round(1e3 * statistics.median(seconds), 3),
                      "min_ms": round(1e3 * min(seconds), 3), "last_loss": round(loss, 6),
                      "torch": torch.__version__}))


if __name__ == "__main__":
    main(sys.argv[1:])
