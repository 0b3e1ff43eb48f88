"""fmnist14.py SRC DST [TRAIN_EXAMPLES]: Fashion-MNIST pooled 2x2 to 14x14 (196 features in
[0, 1]) as CSV, label first: DST/train.csv (the first TRAIN_EXAMPLES images, default all)
and DST/test.csv. A logistic regression on it has 1,970 parameters: small enough for
--optimizer bfgs and dfp, and for SciPy's L-BFGS on one process."""
import gzip
import sys

import numpy as np


def load(src, kind, limit=None):
    images = np.frombuffer(gzip.open(f"{src}/{kind}-images-idx3-ubyte.gz").read()[16:], np.uint8)
    labels = np.frombuffer(gzip.open(f"{src}/{kind}-labels-idx1-ubyte.gz").read()[8:], np.uint8)
    images = images.reshape(-1, 28, 28)[:limit].astype(np.float64) / 255.0
    pooled = images.reshape(-1, 14, 2, 14, 2).mean(axis=(2, 4)).reshape(-1, 196)
    return pooled.astype(np.float32), labels[:limit]


def main():
    src, dst = sys.argv[1], sys.argv[2]
    limit = int(sys.argv[3]) if len(sys.argv) > 3 else None
    for kind, name, n in (("train", "train", limit), ("t10k", "test", None)):
        x, y = load(src, kind, n)
        with open(f"{dst}/{name}.csv", "w") as f:
            for label, row in zip(y, x):
                f.write(f"{label}," + ",".join(f"{v:.6g}" for v in row) + "\n")


if __name__ == "__main__":
    main()
