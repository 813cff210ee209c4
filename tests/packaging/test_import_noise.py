"""``import divergence`` in a user's script, beside transformers and diffusers, prints nothing: the
messages the optional torchao prints when they import it (divergence.import_noise) are dropped."""

import subprocess
import sys


# a script that configures logging (the root's handler shows every WARNING, so it is the strictest
# case; a plain `import divergence, transformers` prints a subset) and builds a model: transformers'
# quantizer registry imports torchao, whose intmm module warned "Detected no triton"
SCRIPT = (
    "import logging; logging.basicConfig(); import divergence, transformers; "
    "from transformers import CLIPTextModel; from diffusers import UNet2DConditionModel"
)


def test_importing_divergence_beside_transformers_prints_nothing():
    code = SCRIPT
    run = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=180)
    assert run.returncode == 0, run.stderr[-2000:]
    assert run.stdout == "" and run.stderr == "", run.stderr[-2000:]
