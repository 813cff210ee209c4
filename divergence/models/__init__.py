"""The networks a recipe names, and the attention variant applied to one model at a time.

- ``tokenizers``: captions -> token ids (byte-level built in code, or CLIP from a local folder);
- ``build``: UNet, text encoder, VAE and DDPM scheduler, seeded by ``model.seed`` alone;
- ``codec``: pixels or frozen-VAE latents, shared by the arms of a pair;
- ``attention``: apply an attention variant by name to one model and verify it;
- ``sampling``: classifier-free-guided generation and image grids.
"""
