"""The two models the book trains, and the single-process reference every exercise is checked against.

* :class:`TinyMLP`: two linear layers, for the fastest tests.
* :class:`TinyGPT`: a small decoder-only transformer language model over bytes (vocabulary
  256, so no tokenizer to download): token and position embeddings, ``layers`` blocks of
  causal self-attention and an MLP with pre-LayerNorm, and a linear head. The default size
  (~0.1M parameters) runs a training step in a few milliseconds on one CPU core.

The *reference* is the plain single-process computation on the full batch:
:func:`reference_gradients` and :func:`reference_training`. Any correct data-, tensor- or
pipeline-parallel version must reproduce it up to float32 rounding, because averaging the
gradients of equal shards is the gradient of the mean over the whole batch.

Every model is built from a seed (:func:`build`), so every rank and the reference start from
identical weights without sending them.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn as nn
import torch.nn.functional as F


@dataclass(frozen=True)
class GPTConfig:
    vocab_size: int = 256      # bytes
    context: int = 32          # longest sequence the position embedding covers
    dim: int = 64              # width of the residual stream
    heads: int = 4
    layers: int = 2
    mlp_ratio: int = 4


class CausalSelfAttention(nn.Module):
    def __init__(self, cfg: GPTConfig):
        super().__init__()
        self.heads = cfg.heads
        self.qkv = nn.Linear(cfg.dim, 3 * cfg.dim)
        self.proj = nn.Linear(cfg.dim, cfg.dim)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        batch, seq, dim = x.shape
        q, k, v = self.qkv(x).split(dim, dim=-1)
        # (batch, seq, dim) -> (batch, heads, seq, dim / heads): each head attends on its own
        q, k, v = (t.view(batch, seq, self.heads, dim // self.heads).transpose(1, 2) for t in (q, k, v))
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        return self.proj(y.transpose(1, 2).reshape(batch, seq, dim))


class Block(nn.Module):
    """Pre-LayerNorm transformer block: x + attention(norm(x)), then x + mlp(norm(x))."""

    def __init__(self, cfg: GPTConfig):
        super().__init__()
        self.norm1 = nn.LayerNorm(cfg.dim)
        self.attn = CausalSelfAttention(cfg)
        self.norm2 = nn.LayerNorm(cfg.dim)
        self.fc1 = nn.Linear(cfg.dim, cfg.mlp_ratio * cfg.dim)
        self.fc2 = nn.Linear(cfg.mlp_ratio * cfg.dim, cfg.dim)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.attn(self.norm1(x))
        return x + self.fc2(F.gelu(self.fc1(self.norm2(x))))


class TinyGPT(nn.Module):
    def __init__(self, cfg: GPTConfig = GPTConfig()):
        super().__init__()
        self.cfg = cfg
        self.tok = nn.Embedding(cfg.vocab_size, cfg.dim)
        self.pos = nn.Embedding(cfg.context, cfg.dim)
        self.blocks = nn.ModuleList(Block(cfg) for _ in range(cfg.layers))
        self.norm = nn.LayerNorm(cfg.dim)
        self.head = nn.Linear(cfg.dim, cfg.vocab_size)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        """Logits of shape (batch, seq, vocab) for tokens of shape (batch, seq)."""
        seq = tokens.shape[1]
        x = self.tok(tokens) + self.pos(torch.arange(seq, device=tokens.device))
        for block in self.blocks:
            x = block(x)
        return self.head(self.norm(x))


class TinyMLP(nn.Module):
    def __init__(self, inputs: int = 16, hidden: int = 32, outputs: int = 4):
        super().__init__()
        self.fc1 = nn.Linear(inputs, hidden)
        self.fc2 = nn.Linear(hidden, outputs)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc2(torch.relu(self.fc1(x)))


def build(kind: str = "gpt", seed: int = 0, **config) -> nn.Module:
    """A model with weights fixed by ``seed``: the same on every rank and in the reference."""
    generator_state = torch.random.get_rng_state()
    torch.manual_seed(seed)
    try:
        if kind == "gpt":
            return TinyGPT(GPTConfig(**config))
        if kind == "mlp":
            return TinyMLP(**config)
        raise ValueError(f"kind must be 'gpt' or 'mlp', got {kind!r}")
    finally:
        torch.random.set_rng_state(generator_state)


def loss_fn(model: nn.Module, batch) -> torch.Tensor:
    """Mean loss over the batch: next-byte cross-entropy for TinyGPT, MSE for TinyMLP.

    ``model`` may be wrapped (torch's DDP, or any wrapper that keeps the model in ``.module``):
    the kind of loss is decided by the model inside.
    """
    inputs, targets = batch
    out = model(inputs)
    inner = model
    while isinstance(getattr(inner, "module", None), nn.Module):
        inner = inner.module
    if isinstance(inner, TinyGPT):
        return F.cross_entropy(out.reshape(-1, out.shape[-1]), targets.reshape(-1))
    return F.mse_loss(out, targets)


def example_batch(kind: str = "gpt", batch_size: int = 8, seed: int = 0, **config):
    """A reproducible random batch of the right shape for ``kind``."""
    g = torch.Generator().manual_seed(seed)
    if kind == "gpt":
        cfg = GPTConfig(**config)
        tokens = torch.randint(0, cfg.vocab_size, (batch_size, cfg.context + 1), generator=g)
        return tokens[:, :-1], tokens[:, 1:]
    inputs, outputs = config.get("inputs", 16), config.get("outputs", 4)
    return torch.randn(batch_size, inputs, generator=g), torch.randn(batch_size, outputs, generator=g)


def shard(batch, rank: int, world_size: int):
    """Rank ``rank``'s equal, contiguous slice of a batch (the batch size must divide evenly)."""
    inputs, targets = batch
    if inputs.shape[0] % world_size:
        raise ValueError(f"a batch of {inputs.shape[0]} does not split evenly over {world_size} ranks")
    per_rank = inputs.shape[0] // world_size
    rows = slice(rank * per_rank, (rank + 1) * per_rank)
    return inputs[rows], targets[rows]


def gradients(model: nn.Module) -> dict[str, torch.Tensor | None]:
    """``{parameter name: copy of its gradient}`` (``None`` where a parameter has none)."""
    return {name: None if p.grad is None else p.grad.detach().clone() for name, p in model.named_parameters()}


def reference_gradients(model: nn.Module, batch) -> dict[str, torch.Tensor]:
    """``{parameter name: gradient}`` of the mean loss over the full batch, in one process."""
    model.zero_grad(set_to_none=True)
    loss_fn(model, batch).backward()
    return gradients(model)


def reference_training(model: nn.Module, batches, lr: float = 0.1) -> list[float]:
    """Train with plain SGD on each full batch in turn; return the loss before each step."""
    optimizer = torch.optim.SGD(model.parameters(), lr=lr)
    losses = []
    for batch in batches:
        optimizer.zero_grad(set_to_none=True)
        loss = loss_fn(model, batch)
        loss.backward()
        optimizer.step()
        losses.append(loss.item())
    return losses
