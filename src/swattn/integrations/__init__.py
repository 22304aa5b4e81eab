"""swattn where users already work: ``transformers`` (``attn_implementation="swattn"``),
drop-ins with the signatures of SGLang's and vLLM's Triton attention kernels, and
DeepSeek-V4's and V3.2's layers as an engine holds them (``deepseek``). Each
module is imported on its own; none is imported by ``import swattn``."""
