"""The demo's sizes: the model, the pages and token budget, the requests, by name; and the fp8
formats --full-kv takes."""

SIZES = {
    # name: model sizes, pages and budget, requests
    "cpu": dict(hidden=64, heads=8, kv_heads=1, head_dim=16, layers=4, window=8, experts=4,
                top_k=2, vocab=128, page=4, budget=32, requests=6, system=24,
                user=(5, 14), new=(8, 16), arrivals=2),
    "gpu": dict(hidden=1024, heads=64, kv_heads=8, head_dim=64, layers=8, window=128,
                experts=8, top_k=2, vocab=4096, page=16, budget=2048, requests=16,
                system=512, user=(64, 768), new=(96, 192), arrivals=1),
}

# --full-kv's choices: the fp8 formats a full layer's cache may take (torch dtype names).
FULL_KV = {"fp8-e4m3": "float8_e4m3fn", "fp8-e5m2": "float8_e5m2"}
