"""What T5 hands to ``F.scaled_dot_product_attention`` under the installed transformers: per call, the mask's shape,
strides, dtype and requires_grad, and the dispatcher's choice (``torch._fused_sdp_choice``), for one training step of
a 2-layer T5 (batch 2 x 64, dropout 0.1) in fp32 and under amp-bf16. JSON to argv[1].

    PYTHONPATH=. python benchmarks/gpu/record_t5_mask.py OUT.json

The call is seen at the Python level (a wrapper around the function), so under autocast the mask is still the
float32 one the model made. Read by tests/memory/trace/test_plain_validation.py
(data/measurements/measure/t5_position_bias__h200.json): why the H200's T5 self-attention ran the math path.
"""
import sys

import torch
import torch.nn.functional as F

from labkit.core.provenance import header, write_measurement

NAMES = {-1: "error", 0: "math", 1: "flash", 2: "efficient", 3: "cudnn", 4: "overrideable"}


def main(out: str) -> None:
    import transformers
    from transformers import T5Config, T5ForConditionalGeneration

    calls: list[dict] = []
    original = F.scaled_dot_product_attention

    def seen(q, k, v, attn_mask=None, dropout_p=0.0, is_causal=False, scale=None, enable_gqa=False):
        m = attn_mask
        choice = torch._fused_sdp_choice(q, k, v, attn_mask=m, dropout_p=dropout_p, is_causal=is_causal, scale=scale,
                                         enable_gqa=enable_gqa)
        calls.append(dict(q=list(q.shape), q_stride=list(q.stride()), dtype=str(q.dtype), q_grad=q.requires_grad,
                          mask=None if m is None else dict(shape=list(m.shape), stride=list(m.stride()),
                                                           dtype=str(m.dtype), grad=m.requires_grad,
                                                           contiguous=m.is_contiguous()),
                          dropout=dropout_p, causal=is_causal, choice=NAMES[int(choice)]))
        return original(q, k, v, attn_mask=attn_mask, dropout_p=dropout_p, is_causal=is_causal, scale=scale,
                        enable_gqa=enable_gqa)

    F.scaled_dot_product_attention = seen
    runs = {}
    try:
        for precision in ("fp32", "amp-bf16"):
            calls.clear()
            cfg = T5Config(d_model=256, d_ff=512, num_layers=2, num_decoder_layers=2, num_heads=4, d_kv=64,
                           vocab_size=1000, decoder_start_token_id=0, pad_token_id=0, dropout_rate=0.1)
            cfg._attn_implementation = "sdpa"
            model = T5ForConditionalGeneration(cfg).cuda().train()
            ids = torch.randint(0, 1000, (2, 64), device="cuda")
            with torch.autocast("cuda", torch.bfloat16, enabled=precision != "fp32"):
                loss = model(input_ids=ids, labels=ids).loss
            loss.backward()
            runs[precision] = dict(attn_implementation=model.config._attn_implementation, calls=list(calls))
    finally:
        F.scaled_dot_product_attention = original
    prov = dict(header(), transformers=transformers.__version__)
    write_measurement(out, "t5_sdpa_calls", {"runs": runs}, provenance=prov)


if __name__ == "__main__":
    main(sys.argv[1])
