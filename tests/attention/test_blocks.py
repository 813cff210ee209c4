"""The tile-size rule, block orders and block-size parsing."""

import math

import pytest

from divergence.attention.blocks import cpu_flash_tile, ordered_tile, parse_block_size, tile_from_memory
from divergence.errors import UserInputError


@pytest.mark.parametrize("memory,d", [(65536, 64), (1000, 16), (4096, 128), (100000, 80)])
def test_tile_rule(memory, d):
    br, bc = tile_from_memory(memory, d)
    assert bc == math.ceil(memory / (4 * d))
    assert br == min(bc, d)


def test_orders():
    assert ordered_tile(64, 256, "default") == (64, 256)
    assert ordered_tile(64, 256, "swapped") == (256, 64)
    assert ordered_tile(64, 256, "square") == (256, 256)
    with pytest.raises(UserInputError, match="block order 'diagonal'"):
        ordered_tile(64, 256, "diagonal")


def test_parse_block_size():
    assert parse_block_size("128") == (128, 128)
    assert parse_block_size("64x256") == (64, 256)
    assert parse_block_size(32) == (32, 32)
    for bad in ("0", "64x", "x", "axb", "1x2x3", "-4"):
        with pytest.raises(UserInputError, match="block size"):
            parse_block_size(bad)


def test_cpu_flash_tile_follows_the_kernel_source():
    assert cpu_flash_tile(100) == (32, 100)
    assert cpu_flash_tile(192) == (64, 192)
    assert cpu_flash_tile(767) == (64, 512)
    assert cpu_flash_tile(768) == (256, 512)
