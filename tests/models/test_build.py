"""Networks from a recipe: seeded by model.seed alone, pretrained parts from local folders only."""

import pytest
import torch

from divergence.errors import UserInputError
from divergence.models.build import build_text_encoder, build_unet, build_vae
from divergence.models.tokenizers import ByteTokenizer, build_tokenizer
from divergence.recipe.model import TextEncoderConfig, TokenizerConfig, UNetConfig, VAEConfig


def _unet(seed):
    return build_unet(UNetConfig(), channels=3, sample_size=32, cross_attention_dim=64, seed=seed)


def _same(a, b):
    return all(torch.equal(x, y) for x, y in zip(a.state_dict().values(), b.state_dict().values()))


def test_init_depends_on_model_seed_only():
    torch.manual_seed(123)
    a = _unet(0)
    torch.manual_seed(456)  # the global RNG does not matter ...
    b = _unet(0)
    assert _same(a, b)
    assert not _same(a, _unet(1))  # ... the seed does


def test_init_leaves_the_global_rng_alone():
    torch.manual_seed(0)
    expected = torch.rand(3)
    torch.manual_seed(0)
    _unet(5)
    assert torch.equal(torch.rand(3), expected)


def test_random_text_encoder_fits_the_byte_tokenizer():
    tok = ByteTokenizer(16)
    model = build_text_encoder(TextEncoderConfig(train=False), tok, seed=0)
    out = model(tok(["a red circle", ""]))[0]
    assert out.shape == (2, 16, 64)
    assert not any(p.requires_grad for p in model.parameters())


def test_byte_tokenizer_truncates_and_pads():
    ids = ByteTokenizer(5)(["abcdef", ""])
    assert ids.tolist() == [[256, 97, 98, 99, 257], [256, 257, 258, 258, 258]]


@pytest.mark.parametrize(
    "build, key",
    [
        (lambda p: build_tokenizer(TokenizerConfig(kind="clip", path=p)), "model.tokenizer.path"),
        (lambda p: build_text_encoder(TextEncoderConfig(path=p), ByteTokenizer(8), 0), "model.text_encoder.path"),
        (lambda p: build_vae(VAEConfig(path=p), 0), "model.vae.path"),
    ],
)
def test_missing_local_folder_says_what_to_put_there(build, key, tmp_path):
    with pytest.raises(UserInputError, match=f"{key} .*nowhere.*put"):
        build(str(tmp_path / "nowhere"))


def test_word_tokenizer_gives_each_word_of_every_caption_one_id_and_the_text_encoder_fits_it():
    from divergence.data.shapes import ShapesDataset

    tok = build_tokenizer(TokenizerConfig(kind="words", max_length=24))  # two shapes: 15 words
    captions = [ShapesDataset(0, 200, 16)[i][1] for i in range(200)]
    ids = tok(captions)
    for caption, row in zip(captions, ids.tolist()):
        body = row[1 : row.index(tok.eos_token_id)]
        assert row[0] == tok.bos_token_id and len(body) == len(caption.split())  # one token a word
        assert tok.unk_token_id not in body  # every word of the dataset is in the vocabulary
    assert tok(["a mauve circle", ""]).tolist() == [
        [
            tok.bos_token_id,
            tok.ids["a"],
            tok.unk_token_id,
            tok.ids["circle"],
            tok.eos_token_id,
            *[tok.pad_token_id] * 19,
        ],
        [tok.bos_token_id, tok.eos_token_id, *[tok.pad_token_id] * 22],
    ]
    enc = build_text_encoder(TextEncoderConfig(hidden_size=32, num_layers=1, num_heads=2, intermediate_size=64), tok, 0)
    assert enc(ids[:4]).last_hidden_state.shape == (4, 24, 32)
