#!/usr/bin/env python3
"""Build the tiny multi-token-prediction head fixtures (issue 49), and their references.

Qwen3.5 checkpoints ship a one-layer MTP head under `mtp.*` beside the decoder. Given the
target's final (post-norm) hidden state h_S at position S and the token t_{S+1} that follows,
it predicts t_{S+2}:

    e   = rms_norm(embed(t_{S+1}), 1 + mtp.pre_fc_norm_embedding)
    h   = rms_norm(h_S,            1 + mtp.pre_fc_norm_hidden)
    x   = mtp.fc([e, h])                         # the embedding first
    x  += attention(rms_norm(x, 1 + mtp.layers.0.input_layernorm))   at rope position S
    x  += mlp(rms_norm(x, 1 + mtp.layers.0.post_attention_layernorm))
    out = rms_norm(x, 1 + mtp.norm);   logits = lm_head(out)

with the target's own `embed_tokens` and `lm_head`, and the layer the decoder's full-attention
layers use (gated attention: `q_proj` gives each head's query and its output gate side by side;
per-head q/k norms; rotary embedding over the first quarter of each head). Chained drafting
feeds `out` back as the next step's h. Sources for the layout: vLLM's `qwen3_5_mtp.py` and
`qwen3_next_mtp.py`, Ollama's Qwen3.5 model; the layer's own forward follows transformers'
`Qwen3_5Attention` and `Qwen3_5MLP` (5.24). transformers has no MTP code, and mlx-lm cannot read
`qwen3_5_text`, so the reference forward is written here, in float64 numpy, from that layout.

Writes, under nn/tests/fixtures/qwen3_5_mtp/:

    config.json          the qwen3_5 fixture's config with `mtp_num_hidden_layers: 1`
    model.safetensors    the qwen3_5 fixture's decoder and the 15 `mtp.*` tensors (f32, drawn
                         with a fixed seed): a checkpoint with its head, as released ones are
    reference.safetensors
        tokens      [n]       i32: t_{S+1} for S = 0 .. n-1
        conditioning[1, n, H] f32: h_S (random draws: the head's parity does not depend on them)
        logits      [1, n, V] f32: the head over all n positions, causally, from an empty cache
        chain_tokens[k]       i32: greedy chain from the last position: each step's argmax
        chain_logits[1, k, V] f32: each chained step's logits (conditioned on the previous out)

The target weights are the committed qwen3_5 fixture's, read from its model.safetensors.

A second head, in the same layout over a Llama decoder layer (plain RMS norms, grouped-query
attention with the rotary embedding over whole heads, no gate, no q/k norms), is what
`scripts/train_mtp_head.py` trains for SmolLM2 and `nn::load::load_with_head` attaches. It
goes under nn/tests/fixtures/llama_mtp/, beside the `llama` fixture it drafts for:

    head.safetensors      the 13 `mtp.*` tensors, f32, with their config in the file's
                          metadata (`config`), as a trained head ships
    reference.safetensors as above

A third head is DeepSeek-V3's next-token-prediction layer, `model.layers.{num_hidden_layers}`,
beside the `deepseek_v3` fixture's decoder (GLM-4-MoE-Lite ships the same layout):

    e   = rms_norm(embed(t_{S+1}), enorm),  zero at S = 0
    h   = rms_norm(h_S, hnorm)
    x   = eh_proj([e, h])
    x   = decoder_layer(x)                   a sparse layer of the decoder's own kind
    out = rms_norm(x, shared_head.norm);  logits = lm_head(out)

The position-0 zero follows vLLM's `deepseek_mtp.py`, the serving stack these checkpoints are
published for; the rest is the DeepSeek-V3 report's module. Its decoder layer (multi-head latent
attention and the routed experts) is transformers' own `DeepseekV3DecoderLayer` (5.24), run in
float64 over the whole sequence with a causal mask, so this part needs the fixtures venv of
`scripts/make_fixtures.py` (torch, transformers); the two heads above need only numpy. It goes
under nn/tests/fixtures/deepseek_v3_mtp/ as config.json (the fixture's, unchanged: it already
says `num_nextn_predict_layers: 1`), model.safetensors (decoder and head, with the head's
copies of `embed_tokens` and `shared_head.head` as released checkpoints carry them) and
reference.safetensors as above.

Run by hand, once, by whoever changes the fixture (CI never runs it):

    python3 -m venv ~/.cache/mlxkit/mtp-fixture-venv
    ~/.cache/mlxkit/mtp-fixture-venv/bin/pip install numpy==2.4.6
    ~/.cache/mlxkit/mtp-fixture-venv/bin/python scripts/make_mtp_fixture.py
    ~/.cache/mlxkit/fixtures-venv/bin/python scripts/make_mtp_fixture.py deepseek_v3_mtp
"""

import json
import struct
import sys
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
FIXTURES = ROOT / "nn" / "tests" / "fixtures"
SEED = 49
POSITIONS = 12
CHAIN = 4

DTYPES = {"F32": np.float32, "I32": np.int32}


def read_safetensors(path: Path) -> dict:
    raw = path.read_bytes()
    (header_len,) = struct.unpack("<Q", raw[:8])
    header = json.loads(raw[8 : 8 + header_len])
    data = raw[8 + header_len :]
    tensors = {}
    for name, entry in header.items():
        if name == "__metadata__":
            continue
        start, end = entry["data_offsets"]
        array = np.frombuffer(data[start:end], dtype=DTYPES[entry["dtype"]])
        tensors[name] = array.reshape(entry["shape"])
    return tensors


def write_safetensors(path: Path, tensors: dict, metadata: dict | None = None) -> None:
    header, blobs, offset = {}, [], 0
    for name in sorted(tensors):
        array = np.ascontiguousarray(tensors[name])
        dtype = {np.dtype(np.float32): "F32", np.dtype(np.int32): "I32"}[array.dtype]
        blob = array.tobytes()
        header[name] = {
            "dtype": dtype,
            "shape": list(array.shape),
            "data_offsets": [offset, offset + len(blob)],
        }
        blobs.append(blob)
        offset += len(blob)
    if metadata:
        header["__metadata__"] = metadata
    encoded = json.dumps(header, separators=(",", ":")).encode()
    encoded += b" " * (-len(encoded) % 8)
    path.write_bytes(struct.pack("<Q", len(encoded)) + encoded + b"".join(blobs))


def head_tensors(config: dict, rng: np.random.Generator, gated: bool) -> dict:
    """The `mtp.*` tensors, in the checkpoint's layout. Qwen3.5's norms store w - 1, as its
    decoder's do, and its attention is gated with q/k norms (`gated`); Llama's is neither."""
    hidden = config["hidden_size"]
    heads, kv_heads = config["num_attention_heads"], config["num_key_value_heads"]
    head_dim, inter = config["head_dim"], config["intermediate_size"]

    def matrix(out: int, inp: int) -> np.ndarray:
        return (rng.standard_normal((out, inp)) * 0.15).astype(np.float32)

    def norm(size: int) -> np.ndarray:
        return (rng.standard_normal(size) * 0.3).astype(np.float32)

    p = "mtp.layers.0"
    tensors = {
        "mtp.pre_fc_norm_embedding.weight": norm(hidden),
        "mtp.pre_fc_norm_hidden.weight": norm(hidden),
        "mtp.fc.weight": matrix(hidden, 2 * hidden),
        f"{p}.input_layernorm.weight": norm(hidden),
        f"{p}.self_attn.q_proj.weight": matrix((2 if gated else 1) * heads * head_dim, hidden),
        f"{p}.self_attn.k_proj.weight": matrix(kv_heads * head_dim, hidden),
        f"{p}.self_attn.v_proj.weight": matrix(kv_heads * head_dim, hidden),
        f"{p}.self_attn.o_proj.weight": matrix(hidden, heads * head_dim),
    }
    if gated:
        tensors[f"{p}.self_attn.q_norm.weight"] = norm(head_dim)
        tensors[f"{p}.self_attn.k_norm.weight"] = norm(head_dim)
    return tensors | {
        f"{p}.post_attention_layernorm.weight": norm(hidden),
        f"{p}.mlp.gate_proj.weight": matrix(inter, hidden),
        f"{p}.mlp.up_proj.weight": matrix(inter, hidden),
        f"{p}.mlp.down_proj.weight": matrix(hidden, inter),
        "mtp.norm.weight": norm(hidden),
    }


def rms_norm(x: np.ndarray, w: np.ndarray, eps: float, offset: float) -> np.ndarray:
    return x / np.sqrt(np.mean(x * x, axis=-1, keepdims=True) + eps) * (offset + w)


def silu(x: np.ndarray) -> np.ndarray:
    return x / (1.0 + np.exp(-x))


class Head:
    """The reference forward, float64, keeping its own keys and values across calls."""

    def __init__(self, config: dict, target: dict, head: dict, gated: bool):
        f64 = {k: v.astype(np.float64) for k, v in {**target, **head}.items()}
        self.w = f64
        self.c = config
        self.gated = gated
        # Qwen3.5 stores each norm's weight less one; Llama stores the weight.
        self.offset = 1.0 if gated else 0.0
        self.eps = config["rms_norm_eps"]
        rope = config["rope_parameters"]
        self.rotary = int(config["head_dim"] * rope.get("partial_rotary_factor", 1.0))
        self.theta = rope["rope_theta"]
        self.keys: list = []
        self.values: list = []

    def rope(self, x: np.ndarray, position: int) -> np.ndarray:
        # Text positions are equal on the three M-RoPE axes: the plain rotary embedding over the
        # first `rotary` features, halves rotated (transformers' rotate_half).
        r = self.rotary
        inv_freq = 1.0 / self.theta ** (np.arange(0, r, 2, dtype=np.float64) / r)
        angles = position * inv_freq
        cos = np.concatenate([np.cos(angles), np.cos(angles)])
        sin = np.concatenate([np.sin(angles), np.sin(angles)])
        rot, rest = x[..., :r], x[..., r:]
        half = r // 2
        rotated = np.concatenate([-rot[..., half:], rot[..., :half]], axis=-1)
        return np.concatenate([rot * cos + rotated * sin, rest], axis=-1)

    def step(self, token: int, h: np.ndarray, position: int) -> tuple:
        """One position: returns (out, logits)."""
        w, c, eps = self.w, self.c, self.eps
        heads, kv_heads, hd = c["num_attention_heads"], c["num_key_value_heads"], c["head_dim"]
        p = "mtp.layers.0"
        norm = lambda x, name: rms_norm(x, w[name], eps, self.offset)  # noqa: E731
        embedding = w["model.embed_tokens.weight"][token]
        e = norm(embedding, "mtp.pre_fc_norm_embedding.weight")
        hn = norm(h, "mtp.pre_fc_norm_hidden.weight")
        x = w["mtp.fc.weight"] @ np.concatenate([e, hn])

        a = norm(x, f"{p}.input_layernorm.weight")
        q = w[f"{p}.self_attn.q_proj.weight"] @ a
        k = (w[f"{p}.self_attn.k_proj.weight"] @ a).reshape(kv_heads, hd)
        if self.gated:
            q_and_gate = q.reshape(heads, 2 * hd)
            q, gate = q_and_gate[:, :hd], q_and_gate[:, hd:].reshape(-1)
            q = norm(q, f"{p}.self_attn.q_norm.weight")
            k = norm(k, f"{p}.self_attn.k_norm.weight")
        else:
            q = q.reshape(heads, hd)
        v = (w[f"{p}.self_attn.v_proj.weight"] @ a).reshape(kv_heads, hd)
        q, k = self.rope(q, position), self.rope(k, position)
        self.keys.append(k)
        self.values.append(v)
        keys, values = np.stack(self.keys), np.stack(self.values)  # [t, kv_heads, hd]
        group = heads // kv_heads
        attended = np.empty((heads, hd))
        for head in range(heads):
            kv = head // group
            scores = keys[:, kv] @ q[head] / np.sqrt(hd)
            weights = np.exp(scores - scores.max())
            attended[head] = (weights / weights.sum()) @ values[:, kv]
        attended = attended.reshape(-1)
        if self.gated:
            attended = attended * (1.0 / (1.0 + np.exp(-gate)))
        x = x + w[f"{p}.self_attn.o_proj.weight"] @ attended

        m = norm(x, f"{p}.post_attention_layernorm.weight")
        up = w[f"{p}.mlp.up_proj.weight"] @ m
        x = x + w[f"{p}.mlp.down_proj.weight"] @ (silu(w[f"{p}.mlp.gate_proj.weight"] @ m) * up)

        out = norm(x, "mtp.norm.weight")
        lm_head = w.get("lm_head.weight", w["model.embed_tokens.weight"])
        return out, lm_head @ out


def main() -> None:
    wanted = set(sys.argv[1:]) or {"qwen3_5_mtp", "llama_mtp"}
    if "qwen3_5_mtp" in wanted:
        make("qwen3_5", "qwen3_5_mtp", gated=True)
    if "llama_mtp" in wanted:
        make("llama", "llama_mtp", gated=False)
    if "deepseek_v3_mtp" in wanted:
        make_next_n("deepseek_v3", "deepseek_v3_mtp")


def make(target_name: str, out_name: str, gated: bool) -> None:
    """A head for fixture `target_name`, and its reference, under fixtures/`out_name`."""
    target_dir, out = FIXTURES / target_name, FIXTURES / out_name
    config = json.loads((target_dir / "config.json").read_text())
    if gated:
        config["mtp_num_hidden_layers"] = 1
    target = read_safetensors(target_dir / "model.safetensors")
    rng = np.random.default_rng(SEED)
    head = head_tensors(config, rng, gated)

    hidden, vocab = config["hidden_size"], config["vocab_size"]
    tokens = rng.integers(3, vocab, size=POSITIONS).astype(np.int32)
    conditioning = rng.standard_normal((POSITIONS, hidden)).astype(np.float32)

    reference = Head(config, target, head, gated)
    logits, state = [], None
    for position in range(POSITIONS):
        state = conditioning[position].astype(np.float64)
        state, row = reference.step(int(tokens[position]), state, position)
        logits.append(row)
    chain_tokens, chain_logits = [], []
    token = int(np.argmax(logits[-1]))
    for step in range(CHAIN):
        chain_tokens.append(token)
        state, row = reference.step(token, state, POSITIONS + step)
        chain_logits.append(row)
        token = int(np.argmax(row))

    out.mkdir(parents=True, exist_ok=True)
    if gated:
        # A checkpoint that ships its head: decoder and head in one file, named by the config.
        (out / "config.json").write_text(json.dumps(config, indent=2, sort_keys=True) + "\n")
        write_safetensors(out / "model.safetensors", {**target, **head})
    else:
        # A head trained apart: its own file, describing itself.
        described = {"hidden_size": hidden, "vocab_size": vocab, "target": target_name}
        write_safetensors(out / "head.safetensors", head,
                          {"config": json.dumps(described, sort_keys=True)})
    write_safetensors(
        out / "reference.safetensors",
        {
            "tokens": tokens,
            "conditioning": conditioning[None],
            "logits": np.stack(logits)[None].astype(np.float32),
            "chain_tokens": np.array(chain_tokens, dtype=np.int32),
            "chain_logits": np.stack(chain_logits)[None].astype(np.float32),
        },
    )
    report(out, chain_tokens, chain_logits)


def report(out: Path, chain_tokens: list, chain_logits: list) -> None:
    margins = [np.sort(row)[-1] - np.sort(row)[-2] for row in chain_logits]
    shown = [round(float(m), 4) for m in margins]
    print(f"wrote {out}: chain {chain_tokens}, top-2 margins {shown}")


def make_next_n(target_name: str, out_name: str) -> None:
    """DeepSeek-V3's head for fixture `target_name`, and its reference, under `out_name`."""
    import torch
    from transformers import DeepseekV3Config
    from transformers.models.deepseek_v3 import modeling_deepseek_v3 as deepseek

    target_dir, out = FIXTURES / target_name, FIXTURES / out_name
    config = json.loads((target_dir / "config.json").read_text())
    target = read_safetensors(target_dir / "model.safetensors")
    index = config["num_hidden_layers"]
    p = f"model.layers.{index}"
    hidden, vocab, eps = config["hidden_size"], config["vocab_size"], config["rms_norm_eps"]

    settings = DeepseekV3Config.from_dict(config)
    settings._attn_implementation = "eager"
    torch.manual_seed(SEED)
    # Its index is past `first_k_dense_replace`, so the layer is sparse, as released heads are.
    layer = deepseek.DeepseekV3DecoderLayer(settings, index).double().eval()
    rotary = deepseek.DeepseekV3RotaryEmbedding(settings).double()
    rng = np.random.default_rng(SEED)
    with torch.no_grad():
        for name, value in list(layer.named_parameters()) + list(layer.named_buffers()):
            if name.endswith("norm.weight"):
                drawn = 1.0 + rng.standard_normal(value.shape) * 0.3
            else:
                drawn = rng.standard_normal(value.shape) * 0.15
            value.copy_(torch.from_numpy(drawn))
    head = {f"{p}.{name}": value.detach().numpy().astype(np.float32)
            for name, value in layer.state_dict().items()}
    norm = lambda: (1.0 + rng.standard_normal(hidden) * 0.3).astype(np.float32)  # noqa: E731
    head |= {
        f"{p}.enorm.weight": norm(),
        f"{p}.hnorm.weight": norm(),
        f"{p}.eh_proj.weight": (rng.standard_normal((hidden, 2 * hidden)) * 0.15).astype(
            np.float32),
        f"{p}.shared_head.norm.weight": norm(),
        # The released checkpoints repeat the embedding and output head inside the layer.
        f"{p}.embed_tokens.weight": target["model.embed_tokens.weight"],
        f"{p}.shared_head.head.weight": target["lm_head.weight"],
    }

    tokens = rng.integers(3, vocab, size=POSITIONS).astype(np.int32)
    conditioning = rng.standard_normal((POSITIONS, hidden)).astype(np.float32)
    w = {k: torch.from_numpy(v.astype(np.float64)) for k, v in {**target, **head}.items()}

    def rms(x, weight):
        return x / torch.sqrt((x * x).mean(-1, keepdim=True) + eps) * weight

    def head_forward(ids: list, states: torch.Tensor) -> torch.Tensor:
        """The head over positions 0.. of `ids` and `states` at once, causally: [n, vocab]."""
        n = len(ids)
        e = w["model.embed_tokens.weight"][torch.tensor(ids)].clone()
        e[0] = 0.0
        x = torch.cat([rms(e, w[f"{p}.enorm.weight"]), rms(states, w[f"{p}.hnorm.weight"])], -1)
        x = (x @ w[f"{p}.eh_proj.weight"].T)[None]
        positions = torch.arange(n)[None]
        mask = torch.full((n, n), float("-inf"), dtype=torch.float64).triu(1)[None, None]
        x = layer(x, attention_mask=mask, position_ids=positions,
                  position_embeddings=rotary(x, positions))[0]
        out = rms(x, w[f"{p}.shared_head.norm.weight"])
        return out, out @ w["lm_head.weight"].T

    with torch.no_grad():
        states = torch.from_numpy(conditioning.astype(np.float64))
        ids = [int(t) for t in tokens]
        out_states, logits = head_forward(ids, states)
        chain_tokens, chain_logits = [], []
        token = int(torch.argmax(logits[-1]))
        for _ in range(CHAIN):
            chain_tokens.append(token)
            ids.append(token)
            states = torch.cat([states, out_states[-1:]], 0)
            # Earlier positions keep the target's states; each chained one is fed the state
            # the step before gave.
            out_states, all_logits = head_forward(ids, states)
            chain_logits.append(all_logits[-1].numpy())
            token = int(torch.argmax(all_logits[-1]))
        logits = logits.numpy()

    out.mkdir(parents=True, exist_ok=True)
    (out / "config.json").write_text(json.dumps(config, indent=2, sort_keys=True) + "\n")
    write_safetensors(out / "model.safetensors", {**target, **head})
    write_safetensors(
        out / "reference.safetensors",
        {
            "tokens": tokens,
            "conditioning": conditioning[None],
            "logits": logits[None].astype(np.float32),
            "chain_tokens": np.array(chain_tokens, dtype=np.int32),
            "chain_logits": np.stack(chain_logits)[None].astype(np.float32),
        },
    )
    report(out, chain_tokens, chain_logits)


if __name__ == "__main__":
    main()
