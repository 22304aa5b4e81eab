"""swattn where users already work: ``transformers`` (``attn_implementation="swattn"``),
and drop-ins with the signatures of SGLang's and vLLM's Triton attention kernels. Each
module is imported on its own; none is imported by ``import swattn``."""
