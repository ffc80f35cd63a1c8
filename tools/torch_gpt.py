"""torch_gpt.py: the GPT model of src/training/gpt.h written with PyTorch's own layers.

The same architecture and parameter names as chorus's model (learned positions, pre-LN blocks,
tanh GELU, the head tied to the token embedding), so a flat chorus parameter file loads by name.
Used by tests/reference/gpt_torch.py (the model against PyTorch) and bench/train_compare (speed
side by side). Needs Debian's python3-torch (/usr/bin/python3).
"""
import math

import torch
import torch.nn as nn
import torch.nn.functional as F


class Attention(nn.Module):
    def __init__(self, width, heads, sdpa=False):
        super().__init__()
        self.heads = heads
        self.sdpa = sdpa  # PyTorch 2's fused attention (F.scaled_dot_product_attention)
        self.c_attn = nn.Linear(width, 3 * width)
        self.c_proj = nn.Linear(width, width)

    def forward(self, x):
        B, T, C = x.shape
        q, k, v = self.c_attn(x).split(C, dim=2)
        shape = (B, T, self.heads, C // self.heads)
        q, k, v = (t.view(shape).transpose(1, 2) for t in (q, k, v))
        if self.sdpa:
            return self.c_proj(F.scaled_dot_product_attention(q, k, v, is_causal=True).transpose(1, 2).reshape(B, T, C))
        scores = (q @ k.transpose(-2, -1)) * (1.0 / math.sqrt(C // self.heads))
        mask = torch.ones(T, T, dtype=torch.bool, device=x.device).tril()
        probs = F.softmax(scores.masked_fill(~mask, float("-inf")), dim=-1)
        return self.c_proj((probs @ v).transpose(1, 2).reshape(B, T, C))


class Mlp(nn.Module):
    def __init__(self, width):
        super().__init__()
        self.c_fc = nn.Linear(width, 4 * width)
        self.c_proj = nn.Linear(4 * width, width)

    def forward(self, x):
        return self.c_proj(F.gelu(self.c_fc(x), approximate="tanh"))


class Block(nn.Module):
    def __init__(self, width, heads, sdpa=False):
        super().__init__()
        self.ln_1 = nn.LayerNorm(width)
        self.attn = Attention(width, heads, sdpa)
        self.ln_2 = nn.LayerNorm(width)
        self.mlp = Mlp(width)

    def forward(self, x):
        x = x + self.attn(self.ln_1(x))
        return x + self.mlp(self.ln_2(x))


class Gpt(nn.Module):
    def __init__(self, layers, heads, width, context, vocab, sdpa=False):
        super().__init__()
        self.wte = nn.Embedding(vocab, width)
        self.wpe = nn.Embedding(context, width)
        self.h = nn.ModuleList(Block(width, heads, sdpa) for _ in range(layers))
        self.ln_f = nn.LayerNorm(width)

    def forward(self, tokens, targets):
        x = self.wte(tokens) + self.wpe(torch.arange(tokens.shape[1], device=tokens.device))
        for block in self.h:
            x = block(x)
        logits = F.linear(self.ln_f(x), self.wte.weight)  # the tied head
        loss = F.cross_entropy(logits.view(-1, logits.shape[-1]), targets.view(-1))
        return logits, loss
