"""The limits the DCP, Megatron ``torch_dist`` and DeepSpeed readers hold a folder to, in one place.

A checkpoint folder may come from anywhere, and every number in its small files (a chunk
count, a byte range, a layer count) is a claim about work and memory the reader would spend.
Each limit below is checked before that work starts, and a folder past one is refused in one
line naming the file and the limit. Each is set well above what a real checkpoint needs, with
the reason beside it; what it protects against is a file of a few kB that asks for hours or for
the machine's memory.
"""

from __future__ import annotations

# --- DCP ``.metadata`` ------------------------------------------------------------------------
# A DCP checkpoint has one chunk per tensor per rank that holds a shard of it. The largest
# layouts in use: a 405B-parameter model (about 1,100 weight tensors, 3,400 with Adam's two
# moments) sharded over 1,024 ranks (FSDP x tensor parallel) is 3.5 million chunks; a
# 70B-parameter model on 256 ranks, 0.6 million. 2^24 is five times the first.
MAX_CHUNKS = 2**24
# torch pickles each chunk as three objects (ChunkStorageMetadata, MetadataIndex, _StorageInfo):
# about 120 bytes of ``.metadata`` per chunk (measured on a metadata that dcp.save's classes
# pickle), so MAX_CHUNKS chunks are about 2 GB. 2 GiB.
MAX_METADATA_BYTES = 2**31
# A chunk costs at least this many bytes of a real ``.metadata`` (about 120 measured; its three
# objects and their numbers cannot be written in fewer). A pickle can list one object many
# times for 2 bytes each (its memo): more chunks than the file's size allows at this rate are
# such references, and are refused before any is looked at.
MIN_METADATA_BYTES_PER_CHUNK = 32
# The exact-tiling check visits each chunk's 2^d corners, d the number of dimensions along which
# the tensor is cut. DTensor cuts one tensor dimension per mesh dimension it is sharded over
# (FSDP, tensor, expert parallel: 3 at most in use); 6 is twice that.
MAX_SPLIT_DIMS = 6

# --- DCP chunk archives (``torch.save`` of one tensor in a ``.distcp`` shard) -----------------
# A chunk's ``data.pkl`` rebuilds one tensor: about 300 bytes. 1 MiB is 3,000 times that.
MAX_CHUNK_PICKLE_BYTES = 2**20

# --- Megatron-Core ``torch_dist`` --------------------------------------------------------------
# metadata.json names the backends in about 120 bytes (megatron.core.dist_checkpointing's
# CheckpointingConfig); 1 MiB leaves room for any content metadata a later release adds.
MAX_MEGATRON_JSON_BYTES = 2**20
# A stacked tensor's dim 0 is the model's layers, each named as a tensor of its own: a few hundred layers
# times some ten stacked tensors in the largest models, a few thousand names. This bounds them all.
MAX_STACKED_LAYERS = 2**20

# --- DeepSpeed ``save_dir`` --------------------------------------------------------------------
# ``latest`` holds a tag, which names a folder: at most 255 bytes on every common file system.
MAX_TAG_BYTES = 4096

# --- An arm's DCP step folder (``ArmWriter(format="dcp")``) ------------------------------------
# ``complete.json`` lists the shards' sizes and the ties: a few kB for thousands of ranks.
MAX_MARKER_BYTES = 16 * 1024 * 1024
