"""The keys a pruned export adds to the model's config.json (the rest is the dense model's
config): what ``load_pruned`` needs to build the pruned shapes, and how a folder is known to be
one."""

HEADS_KEY, KV_HEADS_KEY, BLOCK_SIZE_KEY = (
    "headprune_heads_per_layer",
    "headprune_kv_heads",
    "headprune_block_size",
)
EXPORT_KEYS = (HEADS_KEY, KV_HEADS_KEY, BLOCK_SIZE_KEY)
