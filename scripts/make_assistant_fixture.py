#!/usr/bin/env python3
"""Build the tiny Gemma 4 assistant fixture (issue 49) and its reference, from transformers.

A Gemma 4 assistant (`Gemma4AssistantForCausalLM`, `model_type: gemma4_assistant`) drafts for
a Gemma 4 target. It keeps no cache: every layer attends over the keys and values of the
target's last cache-keeping layer of its kind (full or sliding), with queries of its own. A
round that starts at position P (the target's caches hold 0..P-1) feeds it the target's
embedding of the token at P beside the target's final state at P-1, projected from the
target's width to its own; each further draft feeds back the previous draft and the
assistant's own state, projected back to the target's width, at the same position P. Its
logits come from its own tied head, through a centroid-masked head when
`use_ordered_embeddings` (only the tokens of the best `centroid_intermediate_top_k` of
`num_centroids` clusters are scored; the rest get the least of those scores, less 1).

This script draws an assistant for the committed `gemma4` fixture (sliding window 8, shared
keys and values, per-layer inputs) and records what transformers' own classes give for one
round, in float64:

    nn/tests/fixtures/gemma4_assistant/
        config.json            as save_pretrained writes it (ordered embeddings on)
        model.safetensors      as save_pretrained writes it (f32)
        reference.safetensors
            prompt        [P]        i32: the target's prompt, longer than its window
            first         [1]        i32: the round's first token, at position P
            chain_tokens  [k]        i32: the greedy drafts, each step's argmax
            chain_logits  [1, k, V]  f32: each step's logits (ordered embeddings)
            plain_logits  [1, k, V]  f32: the same steps with the plain tied head
                                     (`use_ordered_embeddings: false`) on the same weights,
                                     fed the same tokens
            first_inputs  [1, 1, 2H] f32: the first step's input (the target's embedding of
                                     `first` beside its final state at P - 1)
            full_keys, full_values, sliding_keys, sliding_values
                          [1, kv, P, d] f32: the target's keys and values the assistant reads
            narrow_logits [1, 1, V]  f32: the first step with the sliding layers reading only
                                     the last `sliding_window - 1` positions, the window
                                     mlx-vlm's drafter gives them (`cross_check_mlx_vlm.py`)

Transformers' bidirectional window counts distances up to `sliding_window` inclusive, so past
the window its sliding layers read `sliding_window + 1` positions; mlxkit reads the same.

The candidate generator transformers pairs with it (`SinglePositionMultiTokenCandidateGenerator`)
slices the target's keys and values to the tokens it holds; after a round with a rejected draft
that slice still holds the rejected draft's entry at P. The reference here is a first round,
where there is none: the assistant sees exactly the target's positions 0..P-1, which is what a
drafter reading the target's committed cache sees in every round.

Run by hand, once, by whoever changes the fixture (CI never runs it), in the venv of
`scripts/make_fixtures.py` (torch 2.15.0, transformers 5.24.0):

    ~/.cache/mlxkit/fixtures-venv/bin/python scripts/make_assistant_fixture.py
"""

import json
import shutil
import tempfile
from pathlib import Path

import numpy as np
import safetensors.numpy
import torch
import transformers
from transformers import Gemma4AssistantConfig, Gemma4AssistantForCausalLM, Gemma4TextConfig

ROOT = Path(__file__).resolve().parent.parent
FIXTURES = ROOT / "nn" / "tests" / "fixtures"
SEED = 49
PROMPT = 12
CHAIN = 4


def assistant_config(target: dict) -> Gemma4AssistantConfig:
    """An assistant narrower than its target (48 against 64) whose heads match the target's
    keys and values: two layers, one of each kind, every one sharing."""
    text = Gemma4TextConfig(
        hidden_size=48,
        intermediate_size=80,
        num_hidden_layers=2,
        layer_types=["sliding_attention", "full_attention"],
        num_attention_heads=4,
        num_key_value_heads=target["num_key_value_heads"],
        head_dim=target["head_dim"],
        per_layer_config={"1": {"head_dim": target["per_layer_config"]["2"]["head_dim"]}},
        num_kv_shared_layers=2,
        sliding_window=target["sliding_window"],
        rope_parameters=target["rope_parameters"],
        rms_norm_eps=target["rms_norm_eps"],
        vocab_size=target["vocab_size"],
        hidden_activation=target["hidden_activation"],
        hidden_size_per_layer_input=0,
        vocab_size_per_layer_input=0,
        max_position_embeddings=target["max_position_embeddings"],
        tie_word_embeddings=True,
    )
    return Gemma4AssistantConfig(
        text_config=text,
        backbone_hidden_size=target["hidden_size"],
        use_ordered_embeddings=True,
        num_centroids=16,
        centroid_intermediate_top_k=4,
    )


def main() -> None:
    torch.manual_seed(SEED)
    rng = np.random.default_rng(SEED)
    target_dir, out = FIXTURES / "gemma4", FIXTURES / "gemma4_assistant"
    target_config = json.loads((target_dir / "config.json").read_text())
    target = transformers.Gemma4ForCausalLM.from_pretrained(target_dir, dtype=torch.float64)
    target.eval()

    config = assistant_config(target_config)
    assistant = Gemma4AssistantForCausalLM(config).double().eval()
    with torch.no_grad():
        for name, value in assistant.named_parameters():
            if name.endswith("norm.weight"):
                drawn = 1.0 + rng.standard_normal(value.shape) * 0.3
            elif name.endswith("layer_scalar"):
                drawn = 0.5 + rng.random(value.shape)
            else:
                drawn = rng.standard_normal(value.shape) * 0.15
            value.copy_(torch.from_numpy(drawn))
        ordering = rng.permutation(config.text_config.vocab_size)
        assistant.masked_embedding.token_ordering.copy_(torch.from_numpy(ordering))

    vocab = config.text_config.vocab_size
    prompt = rng.integers(3, vocab, size=PROMPT)
    first = int(rng.integers(3, vocab))
    with torch.no_grad():
        outputs = target.model(
            input_ids=torch.from_numpy(prompt)[None],
            output_hidden_states=True,
            return_shared_kv_states=True,
        )
        # The candidate generator reads `hidden_states[-1]`: the final, normed state.
        assert torch.equal(outputs.hidden_states[-1], outputs.last_hidden_state)
        shared = outputs.shared_kv_states
        embed = target.get_input_embeddings()

        def round_of(ordered: bool, tokens: list | None) -> tuple:
            assistant.config.use_ordered_embeddings = ordered
            state = outputs.last_hidden_state[:, -1:]
            token = first
            drafted, logits = [], []
            for step in range(CHAIN):
                inputs = torch.cat([embed(torch.tensor([[token]])), state], dim=-1)
                step_out = assistant(
                    inputs_embeds=inputs,
                    position_ids=torch.tensor([[PROMPT]]),
                    shared_kv_states=shared,
                )
                row = step_out.logits[0, -1]
                logits.append(row.numpy())
                drafted.append(int(torch.argmax(row)))
                token = drafted[-1] if tokens is None else tokens[step]
                state = step_out.last_hidden_state
            return drafted, logits

        chain_tokens, chain_logits = round_of(True, None)
        _, plain_logits = round_of(False, chain_tokens)
        assistant.config.use_ordered_embeddings = True
        first_inputs = torch.cat(
            [embed(torch.tensor([[first]])), outputs.last_hidden_state[:, -1:]], dim=-1
        )
        keep = config.text_config.sliding_window - 1
        narrow = {
            "full_attention": shared["full_attention"],
            "sliding_attention": tuple(t[:, :, -keep:] for t in shared["sliding_attention"]),
        }
        narrow_logits = assistant(
            inputs_embeds=first_inputs,
            position_ids=torch.tensor([[PROMPT]]),
            shared_kv_states=narrow,
        ).logits

    out.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory() as scratch:
        assistant.float().save_pretrained(scratch)
        for name in ("config.json", "model.safetensors"):
            shutil.copy(Path(scratch) / name, out / name)
    safetensors.numpy.save_file(
        {
            "prompt": prompt.astype(np.int32),
            "first": np.array([first], dtype=np.int32),
            "chain_tokens": np.array(chain_tokens, dtype=np.int32),
            "chain_logits": np.stack(chain_logits)[None].astype(np.float32),
            "plain_logits": np.stack(plain_logits)[None].astype(np.float32),
            "first_inputs": first_inputs.numpy().astype(np.float32),
            "full_keys": shared["full_attention"][0].numpy().astype(np.float32),
            "full_values": shared["full_attention"][1].numpy().astype(np.float32),
            "sliding_keys": shared["sliding_attention"][0].numpy().astype(np.float32),
            "sliding_values": shared["sliding_attention"][1].numpy().astype(np.float32),
            "narrow_logits": narrow_logits.numpy().astype(np.float32),
        },
        out / "reference.safetensors",
    )
    margins = [float(np.sort(r)[-1] - np.sort(r)[-2]) for r in chain_logits]
    print(f"wrote {out}: chain {chain_tokens}, top-2 margins {[round(m, 4) for m in margins]}")


if __name__ == "__main__":
    main()
