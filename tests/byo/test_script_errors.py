"""A writer's refusal inside a person's own script ends it with one line, not a traceback.

Each script runs as its own Python process, as a user runs it; stderr is what they read.
"""

import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch

from divergence.errors import ScriptError, UserInputError

ROOT = Path(__file__).resolve().parents[2]


def run_script(tmp_path, source: str) -> subprocess.CompletedProcess:
    script = tmp_path / "train.py"
    script.write_text(textwrap.dedent(source))
    return subprocess.run(
        [sys.executable, str(script)],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=120,
        env={"PYTHONPATH": str(ROOT), "PATH": "/usr/bin:/bin"},
    )


def assert_one_line_end(result, *fragments):
    assert result.returncode == 1, result
    assert "Traceback" not in result.stderr, result.stderr
    last = result.stderr.splitlines()[-1]  # above it: the libraries' own import-time warnings, if any
    assert last.startswith("divergence: error: ") and result.stderr.count("divergence: error") == 1, result.stderr
    for fragment in fragments:
        assert fragment in last, (fragment, last)


def test_an_arm_that_labels_only_itself_gets_one_line(tmp_path):
    result = run_script(
        tmp_path,
        """
        import torch, divergence
        divergence.ArmWriter("pair", "a", max_steps=3, name="flash-vs-baseline", arms={"a": ["attention=flash"]})
        """,
    )
    assert_one_line_end(result, "arms={'a': ['attention=flash']}: labels arm 'a' only", "'b': [")
    assert not (tmp_path / "pair" / "pair.json").exists()


def test_the_trainer_callbacks_logging_steps_refusal_is_one_line(tmp_path):
    """Raised through the real Trainer as a ``ScriptError``: uncaught, the one line the test above
    shows a script ending with (its ``code``), not a traceback through the Trainer's frames."""
    pytest.importorskip("accelerate", reason="the transformers Trainer needs accelerate")
    from transformers import GPT2Config, GPT2LMHeadModel, Trainer, TrainingArguments

    from divergence.writers.transformers import ArmWriterCallback

    model = GPT2LMHeadModel(GPT2Config(vocab_size=32, n_positions=16, n_embd=16, n_layer=1, n_head=2))
    data = [{"input_ids": t, "labels": t} for t in torch.randint(0, 32, (8, 8))]
    args = TrainingArguments(
        output_dir=str(tmp_path / "hf"),
        max_steps=2,
        logging_steps=5,
        report_to=[],
        use_cpu=True,
        save_strategy="no",
        disable_tqdm=True,
    )
    trainer = Trainer(model=model, args=args, train_dataset=data, callbacks=[ArmWriterCallback(tmp_path / "pair", "a")])
    with pytest.raises(ScriptError) as caught:
        trainer.train()
    code = caught.value.code
    assert isinstance(caught.value, SystemExit) and "\n" not in code
    assert code.startswith("divergence: error: TrainingArguments(logging_steps=5, logging_strategy=steps)")
    assert code.endswith("set logging_steps=1 and logging_strategy='steps'")


def test_caught_it_is_the_user_input_error_it_was():
    err = ScriptError("arms=1: bad")
    assert isinstance(err, UserInputError) and isinstance(err, ValueError) and str(err) == "arms=1: bad"
    with pytest.raises(ValueError, match="arms=1: bad"):
        raise err
