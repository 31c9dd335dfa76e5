"""Mimir's config.json and special-token ids, shared by the scripts that write HRM-Text
checkpoints (make_fixtures.py, make_mimir_random.py, train_demo.py); needs no torch."""
import math

BOS, EOS, PAD, TURN_END = 2, 1, 0, 106


def l_bp_cycles(H: int, L: int) -> list:
    # What the HRM-Text converter writes for the default bp_max_steps = H + 1 (inference no-op).
    bp = H + 1
    h_bp = min(H, max(0, bp - 1))
    l_bp = min(H * L, max(0, bp - h_bp))
    thr = H * L - l_bp
    return [max(0, min(L, (i + 1) * L - thr)) for i in range(H)]


def mimir_config(s: dict, vocab: int) -> dict:
    """config.json in the form the HRM-Text converter writes (Mimir): num_hidden_layers is the
    per-stack layer count, no num_layers_per_stack, no transformers_version."""
    std = 1.0 / math.sqrt(s["hidden"])
    return {
        "model_type": "hrm_text",
        "architectures": ["HrmTextForCausalLM"],
        "vocab_size": vocab,
        "hidden_size": s["hidden"],
        "intermediate_size": s["ffn"],
        "num_hidden_layers": s["lps"],
        "num_attention_heads": s["heads"],
        "num_key_value_heads": s["heads"],
        "head_dim": s["head_dim"],
        "hidden_act": "silu",
        "H_cycles": s["H"],
        "L_cycles": s["L"],
        "L_bp_cycles": l_bp_cycles(s["H"], s["L"]),
        "max_position_embeddings": s["max_pos"],
        "rms_norm_eps": 1e-6,
        "rope_theta": 10000.0,
        "rope_parameters": {"rope_type": "default", "rope_theta": 10000.0},
        "attention_bias": False,
        "attention_dropout": 0.0,
        "mlp_bias": False,
        "use_cache": True,
        "tie_word_embeddings": False,
        "initializer_range": std,
        "embedding_scale": 1.0 / std,
        "prefix_lm": True,
        "pad_token_id": PAD,
        "bos_token_id": BOS,
        "eos_token_id": TURN_END,
    }
