"""A diffusers attention processor that computes attention with any registered kernel.

diffusers' ``Attention`` module owns the projections; a processor does the math. This one is
``diffusers.models.attention_processor.AttnProcessor2_0`` line for line, except that the call to
``F.scaled_dot_product_attention`` is a call to ``self._attend``, which hands the (B, H, L, D)
query, key and value to the kernel. With the ``sdpa`` kernel it returns exactly what
``AttnProcessor2_0`` returns.

>>> from divergence.attention.kernels import get_kernel
>>> processor = KernelAttnProcessor(get_kernel("baseline"))
>>> # model.set_attn_processor(processor), or per module: attn.set_processor(processor)
"""

from __future__ import annotations

import torch

from divergence.attention.kernels import Kernel, get_kernel


class KernelAttnProcessor:
    """Attention with ``kernel`` (a :class:`Kernel` or a registered name) inside diffusers."""

    def __init__(self, kernel: Kernel | str):
        self.kernel = get_kernel(kernel) if isinstance(kernel, str) else kernel

    def __call__(
        self,
        attn,
        hidden_states: torch.Tensor,
        encoder_hidden_states: torch.Tensor | None = None,
        attention_mask: torch.Tensor | None = None,
        temb: torch.Tensor | None = None,
        *args,
        **kwargs,
    ) -> torch.Tensor:
        residual = hidden_states
        if attn.spatial_norm is not None:
            hidden_states = attn.spatial_norm(hidden_states, temb)

        input_ndim = hidden_states.ndim

        if input_ndim == 4:
            batch_size, channel, height, width = hidden_states.shape
            hidden_states = hidden_states.view(batch_size, channel, height * width).transpose(1, 2)

        batch_size, sequence_length, _ = (
            hidden_states.shape if encoder_hidden_states is None else encoder_hidden_states.shape
        )

        if attention_mask is not None:
            attention_mask = attn.prepare_attention_mask(attention_mask, sequence_length, batch_size)
            # (batch, heads, source_length, target_length), as SDPA takes it
            attention_mask = attention_mask.view(batch_size, attn.heads, -1, attention_mask.shape[-1])

        if attn.group_norm is not None:
            hidden_states = attn.group_norm(hidden_states.transpose(1, 2)).transpose(1, 2)

        query = attn.to_q(hidden_states)

        if encoder_hidden_states is None:
            encoder_hidden_states = hidden_states
        elif attn.norm_cross:
            encoder_hidden_states = attn.norm_encoder_hidden_states(encoder_hidden_states)

        key = attn.to_k(encoder_hidden_states)
        value = attn.to_v(encoder_hidden_states)

        inner_dim = key.shape[-1]
        head_dim = inner_dim // attn.heads

        query = query.view(batch_size, -1, attn.heads, head_dim).transpose(1, 2)

        key = key.view(batch_size, -1, attn.heads, head_dim).transpose(1, 2)
        value = value.view(batch_size, -1, attn.heads, head_dim).transpose(1, 2)

        if attn.norm_q is not None:
            query = attn.norm_q(query)
        if attn.norm_k is not None:
            key = attn.norm_k(key)

        # (B, H, L, D) -> (B, H, L, D); the only line that differs from AttnProcessor2_0
        hidden_states = self._attend(query, key, value, attention_mask)

        hidden_states = hidden_states.transpose(1, 2).reshape(batch_size, -1, attn.heads * head_dim)
        hidden_states = hidden_states.to(query.dtype)

        # linear proj
        hidden_states = attn.to_out[0](hidden_states)
        # dropout
        hidden_states = attn.to_out[1](hidden_states)

        if input_ndim == 4:
            hidden_states = hidden_states.transpose(-1, -2).reshape(batch_size, channel, height, width)

        if attn.residual_connection:
            hidden_states = hidden_states + residual

        hidden_states = hidden_states / attn.rescale_output_factor

        return hidden_states

    def _attend(self, query, key, value, attention_mask) -> torch.Tensor:
        """Attention of (B, H, Lq, D) queries over (B, H, Lk, D) keys and values."""
        return self.kernel(query, key, value, attn_mask=attention_mask)
