#!/usr/bin/env python3
# Writes a small random qwen3_moe checkpoint (HF layout, BF16) paired with a given tokenizer.json, for tests of
# the user-facing paths (run / chat / serve) that need real token ids and text but no trained weights.
# Usage: tools/make_random_model.py OUT_DIR TOKENIZER_JSON [--seed N]
import json, os, struct, sys
import numpy as np

out, tok_path = sys.argv[1], sys.argv[2]
seed = int(sys.argv[sys.argv.index("--seed") + 1]) if "--seed" in sys.argv else 1234
tok = json.load(open(tok_path))
vocab = len(tok["model"]["vocab"]) + sum(1 for a in tok["added_tokens"] if a["id"] >= len(tok["model"]["vocab"]))
vocab = max(vocab, max(a["id"] for a in tok["added_tokens"]) + 1)
H, L, E, F, heads, kv, hd = 64, 2, 8, 32, 4, 2, 16
rng = np.random.default_rng(seed)

def bf16(a):
    a = np.asarray(a, dtype=np.float32)
    u = a.view(np.uint32).astype(np.uint64)
    u = ((u + 0x7FFF + ((u >> 16) & 1)) >> 16).astype(np.uint16)
    return u

tensors = {}
def add(name, shape, scale=0.08, value=None):
    a = np.full(shape, value, np.float32) if value is not None else rng.normal(0, scale, shape).astype(np.float32)
    tensors[name] = bf16(a)

add("model.embed_tokens.weight", (vocab, H), 0.5)
add("lm_head.weight", (vocab, H), 0.3)
add("model.norm.weight", (H,), value=1.0)
for l in range(L):
    p = f"model.layers.{l}."
    add(p + "input_layernorm.weight", (H,), value=1.0)
    add(p + "post_attention_layernorm.weight", (H,), value=1.0)
    add(p + "self_attn.q_proj.weight", (heads * hd, H))
    add(p + "self_attn.k_proj.weight", (kv * hd, H))
    add(p + "self_attn.v_proj.weight", (kv * hd, H))
    add(p + "self_attn.o_proj.weight", (H, heads * hd))
    add(p + "self_attn.q_norm.weight", (hd,), value=1.0)
    add(p + "self_attn.k_norm.weight", (hd,), value=1.0)
    add(p + "mlp.gate.weight", (E, H), 0.5)
    for e in range(E):
        add(p + f"mlp.experts.{e}.gate_proj.weight", (F, H))
        add(p + f"mlp.experts.{e}.up_proj.weight", (F, H))
        add(p + f"mlp.experts.{e}.down_proj.weight", (H, F))

os.makedirs(out, exist_ok=True)
header, blobs, off = {"__metadata__": {"format": "pt"}}, [], 0
for name in sorted(tensors):
    b = tensors[name].tobytes()
    header[name] = {"dtype": "BF16", "shape": list(tensors[name].shape), "data_offsets": [off, off + len(b)]}
    blobs.append(b)
    off += len(b)
h = json.dumps(header, separators=(",", ":")).encode()
h += b" " * ((8 - len(h) % 8) % 8)
with open(os.path.join(out, "model.safetensors"), "wb") as f:
    f.write(struct.pack("<Q", len(h)))
    f.write(h)
    for b in blobs:
        f.write(b)
eos = next(a["id"] for a in tok["added_tokens"] if a["content"] == "<|im_end|>")
config = {"architectures": ["Qwen3MoeForCausalLM"], "model_type": "qwen3_moe", "vocab_size": vocab, "hidden_size": H,
          "num_hidden_layers": L, "num_attention_heads": heads, "num_key_value_heads": kv, "head_dim": hd,
          "intermediate_size": 4 * H, "moe_intermediate_size": F, "num_experts": E, "num_experts_per_tok": 2,
          "norm_topk_prob": True, "rms_norm_eps": 1e-6, "rope_parameters": {"rope_type": "default", "rope_theta": 10000.0},
          "max_position_embeddings": 512, "tie_word_embeddings": False, "eos_token_id": eos, "dtype": "bfloat16"}
json.dump(config, open(os.path.join(out, "config.json"), "w"), indent=1)
json.dump({"eos_token_id": eos, "do_sample": False}, open(os.path.join(out, "generation_config.json"), "w"), indent=1)
template = ("{%- for message in messages %}{{- '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>' + '\\n' }}"
            "{%- endfor %}{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}{%- endif %}")
json.dump({"chat_template": template, "eos_token": "<|im_end|>", "bos_token": None, "model_max_length": 512},
          open(os.path.join(out, "tokenizer_config.json"), "w"), indent=1)
with open(tok_path) as src, open(os.path.join(out, "tokenizer.json"), "w") as dst:
    dst.write(src.read())
print(f"wrote {out}: vocab {vocab}, {off} bytes of weights")
