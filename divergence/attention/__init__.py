"""Attention implementations whose numerics divergence measures.

One idea per module, in the order a reader needs them:

- ``reference``: baseline attention (explicit ``softmax(Q K^T * scale) V``) and its fp64 golden value;
- ``blocks``: the FlashAttention tile-size rule and block orders;
- ``tiled``: a numerical re-implementation of the FlashAttention forward pass with the number
  format, tile sizes and accumulation precision as knobs;
- ``kernels``: real kernels (SDPA backends, the ``flash-attn`` package, ``tiled``) registered by name
  with device and dtype checks;
- ``processor``: a diffusers attention processor that calls any registered kernel;
- ``joint``: the same for SD3's joint (image + caption) attention;
- ``shadow``: a processor that runs two kernels on identical inputs and records their deviation.

Every function takes tensors shaped ``(B, H, L, D)``: batch, heads, sequence length, head dim.
"""
