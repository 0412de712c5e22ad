"""The first MaxText-written fixtures with MaxText's logits, shared by the logits tests and the --to torch tests."""

# (checkpoint under maxtext/, logits file stem, --model as the user passes it)
FIXTURES = [
    ("llama2_scan/checkpoints/5", "llama2_scan_step5", "llama2-7b"),
    ("llama2_scan_params/checkpoints/0", "llama2_scan_params_bf16", "llama2-7b"),
    ("llama31_scan_params/checkpoints/0", "llama31_scan_params_bf16", "llama3.1-8b"),
    ("mistral_scan/checkpoints/5", "mistral_scan_step5", "mistral-7b"),
    ("qwen3_scan/checkpoints/5", "qwen3_scan_step5", "qwen3-0.6b"),
]
