"""Tiny Llama-shaped models written on the fly (config.json only; the weights are SGLang's
dummy loader's, made larger and deterministic by the test plugin's stand-in)."""

from __future__ import annotations

import json
from pathlib import Path

VOCAB = 512
BASE = {
    "model_type": "llama",
    "vocab_size": VOCAB,
    "hidden_size": 64,
    "intermediate_size": 128,
    "num_attention_heads": 2,
    "num_key_value_heads": 1,
    "head_dim": 32,
    "hidden_act": "silu",
    "max_position_embeddings": 2048,
    "rms_norm_eps": 1e-5,
    "rope_theta": 10000.0,
    "tie_word_embeddings": False,
    "torch_dtype": "float32",
    "dtype": "float32",
    "bos_token_id": 1,
    "eos_token_id": 2,
}

# name -> (architecture, layers, extra config)
MODELS = {
    "target": ("LlamaForCausalLM", 4, {}),
    # EAGLE3's and DFLASH's target, as the stand-in reads ``spec_fused_e2e``: its last
    # layer passes through (EAGLE3's last aux hidden state is then the final one), its
    # head is its embedding turned by a fixed rotation and DFLASH's mask token embeds to 0
    # (standins._target_as_configured, _drafts_that_accept)
    "target-spec": (
        "LlamaForCausalLM",
        4,
        {
            "spec_fused_e2e": {
                "passthrough_layers": [3],
                "zero_embedding_rows": [VOCAB - 1],
                "head_rotates_embedding": True,
            }
        },
    ),
    "standalone": ("LlamaForCausalLM", 3, {}),
    "eagle": ("LlamaForCausalLMEagle", 1, {}),
    "eagle3": (
        "LlamaForCausalLMEagle3",
        1,
        {
            "draft_vocab_size": None,  # the target's head
            "eagle_config": {"eagle_aux_hidden_state_layer_ids": [0, 1, 2]},
        },
    ),
    "dflash": (
        "DFlashDraftModel",
        1,
        {
            "num_target_layers": 4,
            "num_key_value_heads": 2,  # v as wide as the hidden state
            "dflash_config": {
                "block_size": 4,
                "target_layer_ids": [1, 2],
                "mask_token_id": VOCAB - 1,
            },
        },
    ),
}


def make(root: Path, name: str) -> str:
    arch, layers, extra = MODELS[name]
    path = Path(root) / name
    path.mkdir(parents=True, exist_ok=True)
    config = dict(BASE, architectures=[arch], num_hidden_layers=layers, **extra)
    (path / "config.json").write_text(json.dumps(config, indent=1))
    return str(path)


def make_all(root: Path) -> dict:
    return {name: make(root, name) for name in MODELS}
