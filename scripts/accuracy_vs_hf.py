"""bf16 accuracy of ringserve against HuggingFace on the same weights: HF float32 is the reference;
ringserve's bf16 logits must be no further from it (relative L2) than 1.5x HF's own bf16 run.
usage: accuracy_vs_hf.py MODEL_DIR PROMPTS_JSON OURS_F32_BIN OUT_JSON
OURS_F32_BIN holds [prompts, positions, vocab] float32 logits (cuda_bench's dump). PROMPTS_JSON is
a list of prompts (logits at every position: the decode-path dump) or {"prompts", "positions"}
(logits at those positions only: the prefill-path dump, `*.prefill`)."""
import json, sys
import numpy as np
import torch
from transformers import LlamaForCausalLM

model_dir, prompts_path, ours_path, out_path = sys.argv[1:5]
prompts = json.load(open(prompts_path))
positions = None
if isinstance(prompts, dict):
    prompts, positions = prompts["prompts"], prompts["positions"]
ids = torch.tensor(prompts, device="cuda")

def logits(dtype):
    m = LlamaForCausalLM.from_pretrained(model_dir, dtype=dtype).to("cuda").eval()
    with torch.no_grad():
        out = m(ids).logits
        if positions is not None:
            out = out[:, positions]
        out = out.float().cpu().numpy()
    del m
    torch.cuda.empty_cache()
    return out

ref = logits(torch.float32)
hf_bf16 = logits(torch.bfloat16)
ours = np.fromfile(ours_path, dtype=np.float32).reshape(ref.shape)

def rel_l2(a, b):
    return float(np.linalg.norm((a - b).ravel()) / np.linalg.norm(b.ravel()))

res = {"positions": int(ref.shape[0] * ref.shape[1]),
       "ringserve_bf16_vs_hf_f32": rel_l2(ours, ref),
       "hf_bf16_vs_hf_f32": rel_l2(hf_bf16, ref),
       "per_prompt_ringserve": [rel_l2(ours[i], ref[i]) for i in range(ref.shape[0])],
       "per_prompt_hf_bf16": [rel_l2(hf_bf16[i], ref[i]) for i in range(ref.shape[0])],
       "argmax_agree_ringserve": float((ours.argmax(-1) == ref.argmax(-1)).mean()),
       "argmax_agree_hf_bf16": float((hf_bf16.argmax(-1) == ref.argmax(-1)).mean())}
res["ratio"] = res["ringserve_bf16_vs_hf_f32"] / res["hf_bf16_vs_hf_f32"]
res["pass"] = res["ratio"] <= 1.5
print(json.dumps(res, indent=1))
json.dump(res, open(out_path, "w"), indent=1)
