# torch_reference.sh: the GPT model against PyTorch. gpt_reference runs a small GPT (one forward and
# backward, then 10 AdamW steps) and writes everything; gpt_torch.py repeats it with Debian's
# python3-torch and fails on any difference beyond fp32 rounding (tests/reference/gpt_torch.py).
source "$(dirname "$0")/lib.sh"
/usr/bin/python3 -c "import torch" 2>/dev/null || fail "Debian's python3-torch is missing (tools/setup installs it)"
"$build/tests/gpt_reference" "$work" 10
/usr/bin/python3 "$source_dir/tests/reference/gpt_torch.py" "$work"
