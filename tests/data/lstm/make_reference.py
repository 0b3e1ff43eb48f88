#!/usr/bin/python3
"""Reference values for tests/ops/recurrent_test.cc: one forward and backward step
of PyTorch's nn.LSTM language model, in float64, from fixed random weights.

Run once with Debian's python3-torch (`/usr/bin/python3 tests/data/lstm/make_reference.py`);
its output, reference.txt beside this file, is committed, so the test needs no torch.

The model is the cell of examples/lstm.loss at small sizes: embedding E (D x V,
nn.Embedding's weight transposed), W = [weight_ih | weight_hh] (4H x (D+H), gates
in nn.LSTM's order i, f, g, o), b = bias_ih + bias_hh (only the sum is seen: the
test compares b's gradient with that of bias_ih, which equals bias_hh's), V and bv
(nn.Linear(H, V)); the loss is the cross-entropy of the next token summed over the
B x T tokens; the first step starts from nonzero states h0, c0 (a carried state).

reference.txt: "NAME ROWS COLS" and then ROWS*COLS values in column-major order,
for: dims (vocabulary, embed, hidden, steps, batch), tokens ((T+1) x B, the
segment of each column), h0, c0, E, W, b, V, bv, loss (1 x 1), and dE, dW, db,
dV, dbv.
"""

import os

import torch

VOCAB, EMBED, HIDDEN, STEPS, BATCH = 7, 3, 4, 5, 3


def main():
    torch.manual_seed(20261123)
    dtype = torch.float64
    emb = torch.nn.Embedding(VOCAB, EMBED).to(dtype)
    lstm = torch.nn.LSTM(EMBED, HIDDEN).to(dtype)
    out = torch.nn.Linear(HIDDEN, VOCAB).to(dtype)
    with torch.no_grad():
        for p in list(emb.parameters()) + list(lstm.parameters()) + list(out.parameters()):
            p.uniform_(-0.5, 0.5)
    tokens = torch.randint(0, VOCAB, (STEPS + 1, BATCH))
    h0 = (torch.rand(1, BATCH, HIDDEN, dtype=dtype) - 0.5)
    c0 = (torch.rand(1, BATCH, HIDDEN, dtype=dtype) - 0.5)

    hs, _ = lstm(emb(tokens[:-1]), (h0, c0))
    logits = out(hs)
    loss = torch.nn.functional.cross_entropy(logits.reshape(-1, VOCAB), tokens[1:].reshape(-1), reduction="sum")
    loss.backward()

    def mat(x):
        x = x.detach().to(dtype)
        return x.reshape(x.shape[0], -1) if x.dim() > 1 else x.reshape(-1, 1)

    entries = [
        ("dims", torch.tensor([[VOCAB, EMBED, HIDDEN, STEPS, BATCH]], dtype=dtype).t()),
        ("tokens", tokens.to(dtype)),
        ("h0", h0[0].t()),
        ("c0", c0[0].t()),
        ("E", emb.weight.t()),
        ("W", torch.cat([lstm.weight_ih_l0, lstm.weight_hh_l0], dim=1)),
        ("b", (lstm.bias_ih_l0 + lstm.bias_hh_l0).reshape(-1, 1)),
        ("V", out.weight),
        ("bv", out.bias.reshape(-1, 1)),
        ("loss", loss.reshape(1, 1)),
        ("dE", emb.weight.grad.t()),
        ("dW", torch.cat([lstm.weight_ih_l0.grad, lstm.weight_hh_l0.grad], dim=1)),
        ("db", lstm.bias_ih_l0.grad.reshape(-1, 1)),
        ("dV", out.weight.grad),
        ("dbv", out.bias.grad.reshape(-1, 1)),
    ]
    lines = [f"# {torch.__version__} nn.LSTM reference; see make_reference.py"]
    for name, value in entries:
        m = mat(value)
        lines.append(f"{name} {m.shape[0]} {m.shape[1]}")
        lines.append(" ".join(f"{v:.17g}" for v in m.t().reshape(-1).tolist()))
    path = os.path.join(os.path.dirname(os.path.abspath(__file__)), "reference.txt")
    tmp = f"{path}.tmp.{os.getpid()}"
    with open(tmp, "w", encoding="ascii", newline="\n") as f:
        f.write("\n".join(lines) + "\n")
    os.replace(tmp, path)


if __name__ == "__main__":
    main()
