"""A diffusers joint-attention processor (SD3's MMDiT) that computes attention with any kernel.

Joint attention (Esser et al., 2024, "Scaling Rectified Flow Transformers", section 4) attends
over the concatenation of image and caption tokens, each stream with its own projections::

    Q = [X W_q ; C W_q'],  K = [X W_k ; C W_k'],  V = [X W_v ; C W_v']      (L = N_x + N_c tokens)
    [O_x ; O_c] = softmax(Q K^T / sqrt(d)) V,   out_x = O_x W_o,  out_c = O_c W_o'

where the primed weights are diffusers' ``add_q_proj``, ``add_k_proj``, ``add_v_proj`` and
``to_add_out``. This processor is ``diffusers.models.attention_processor.JointAttnProcessor2_0``
line for line, except that the call to ``F.scaled_dot_product_attention`` is a call to
``self._attend`` (inherited from :class:`KernelAttnProcessor`), which hands the joint (B, H, L, D)
query, key and value to the kernel. With the ``sdpa`` kernel it returns exactly what
``JointAttnProcessor2_0`` returns (tests/models/test_transformers.py).
"""

from __future__ import annotations

import torch

from divergence.attention.processor import KernelAttnProcessor


class KernelJointAttnProcessor(KernelAttnProcessor):
    """Joint (image + caption) attention with ``kernel`` inside a diffusers SD3 ``Attention``."""

    def __call__(
        self,
        attn,
        hidden_states: torch.Tensor,
        encoder_hidden_states: torch.Tensor | None = None,
        attention_mask: torch.Tensor | None = None,
        *args,
        **kwargs,
    ) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
        residual = hidden_states

        batch_size = hidden_states.shape[0]

        # `sample` projections.
        query = attn.to_q(hidden_states)
        key = attn.to_k(hidden_states)
        value = attn.to_v(hidden_states)

        inner_dim = key.shape[-1]
        head_dim = inner_dim // attn.heads

        # (B, N_x, H * D) -> (B, H, N_x, D)
        query = query.view(batch_size, -1, attn.heads, head_dim).transpose(1, 2)
        key = key.view(batch_size, -1, attn.heads, head_dim).transpose(1, 2)
        value = value.view(batch_size, -1, attn.heads, head_dim).transpose(1, 2)

        if attn.norm_q is not None:
            query = attn.norm_q(query)
        if attn.norm_k is not None:
            key = attn.norm_k(key)

        # `context` projections.
        if encoder_hidden_states is not None:
            encoder_hidden_states_query_proj = attn.add_q_proj(encoder_hidden_states)
            encoder_hidden_states_key_proj = attn.add_k_proj(encoder_hidden_states)
            encoder_hidden_states_value_proj = attn.add_v_proj(encoder_hidden_states)

            # (B, N_c, H * D) -> (B, H, N_c, D)
            encoder_hidden_states_query_proj = encoder_hidden_states_query_proj.view(
                batch_size, -1, attn.heads, head_dim
            ).transpose(1, 2)
            encoder_hidden_states_key_proj = encoder_hidden_states_key_proj.view(
                batch_size, -1, attn.heads, head_dim
            ).transpose(1, 2)
            encoder_hidden_states_value_proj = encoder_hidden_states_value_proj.view(
                batch_size, -1, attn.heads, head_dim
            ).transpose(1, 2)

            if attn.norm_added_q is not None:
                encoder_hidden_states_query_proj = attn.norm_added_q(encoder_hidden_states_query_proj)
            if attn.norm_added_k is not None:
                encoder_hidden_states_key_proj = attn.norm_added_k(encoder_hidden_states_key_proj)

            # (B, H, N_x + N_c, D): image tokens first, then caption tokens
            query = torch.cat([query, encoder_hidden_states_query_proj], dim=2)
            key = torch.cat([key, encoder_hidden_states_key_proj], dim=2)
            value = torch.cat([value, encoder_hidden_states_value_proj], dim=2)

        # (B, H, L, D) -> (B, H, L, D); the only line that differs from JointAttnProcessor2_0
        hidden_states = self._attend(query, key, value, None)
        hidden_states = hidden_states.transpose(1, 2).reshape(batch_size, -1, attn.heads * head_dim)
        hidden_states = hidden_states.to(query.dtype)

        if encoder_hidden_states is not None:
            # Split the attention outputs.
            hidden_states, encoder_hidden_states = (
                hidden_states[:, : residual.shape[1]],
                hidden_states[:, residual.shape[1] :],
            )
            if not attn.context_pre_only:
                encoder_hidden_states = attn.to_add_out(encoder_hidden_states)

        # linear proj
        hidden_states = attn.to_out[0](hidden_states)
        # dropout
        hidden_states = attn.to_out[1](hidden_states)

        if encoder_hidden_states is not None:
            return hidden_states, encoder_hidden_states
        else:
            return hidden_states
