"""The ``divergence`` command: a thin dispatcher over one module per subcommand.

Each subcommand module defines ``register(subparsers)`` and ``run(args) -> int``, and
imports its heavy dependencies (torch, lightning, diffusers) inside ``run`` so that
``divergence --help`` stays instant. User mistakes surface as ``UserInputError`` and
become one line on stderr with exit code 2.
"""

from __future__ import annotations

import argparse
import importlib
import os
import sys

from divergence import __version__
from divergence.errors import UserInputError
from divergence.loggers.wandb_mode import offline_notice, wandb_offline

# Subcommand modules under divergence.cli, in the order `--help` lists them.
COMMANDS = (
    "compare",
    "microbench",
    "train",
    "export",
    "store",
    "study",
    "calibrate",
    "consequence",
    "atlas",
    "report",
    "watch",
    "launch",
    "track",
    "pair",
    "check",
    "dashboard",
)

EXIT_USAGE = 2


class _Parser(argparse.ArgumentParser):
    """argparse, but a usage error is one line (no usage dump) and exit code 2."""

    def error(self, message: str):  # noqa: D401 - argparse API
        self.exit(EXIT_USAGE, f"{self.prog}: error: {message}\n")


def folder_argument(parser: argparse.ArgumentParser, help: str) -> None:
    """The command's one folder as every command names it, a positional ``DIR``; ``--out DIR``, its
    first spelling in ``train`` and ``track``, stays accepted (hidden: the jobs a study starts use it)."""
    parser.add_argument("dir", nargs="?", metavar="DIR", help=help)
    parser.add_argument("--out", dest="out_flag", metavar="DIR", help=argparse.SUPPRESS)


def shorthand(overrides: list[str], flag: str, key: str, value) -> None:
    """Append ``key=value`` for a flag that is shorthand for a recipe override (``--max-steps N`` is
    ``train.max_steps=N``), unless ``value`` is None (the flag not given); the same key also given as
    ``KEY=VALUE`` with another value is refused, so a command never says one thing two ways and silently
    keeps one."""
    if value is None:
        return
    import yaml

    given = [o.split("=", 1)[1] for o in overrides if o.split("=", 1)[0].strip() == key]
    if any(yaml.safe_load(g) != yaml.safe_load(str(value)) for g in given):
        raise UserInputError(f"{flag} {value} and {key}={given[-1]}: give the value once (they are the same setting)")
    overrides.append(f"{key}={value}")


def at_least(minimum: int, *flags: tuple[str, int | None], why: str = "") -> None:
    """Each count flag given (``(flag, value)``, None: not given) is at least ``minimum``, else one line."""
    for flag, value in flags:
        if value is not None and value < minimum:
            raise UserInputError(f"{flag} {value}: must be >= {minimum}{why}")


def send_to_wandb(send, written: str) -> str | None:
    """Run ``send()`` (it logs to wandb and returns where the run went) and say where, or, when wandb
    fails, warn in one line that ``written`` are written anyway (wandb trouble must not hide them);
    the offline notice names the ``wandb sync`` command."""
    offline, mode_env = wandb_offline(), dict(os.environ)  # before wandb.init, which sets WANDB_MODE itself
    try:
        where = send()
    except Exception as err:  # noqa: BLE001 - the files are written; wandb trouble must not hide them
        print(
            f"warning: logging to wandb failed ({type(err).__name__}: {err}); {written} are written. "
            "Use --no-wandb to skip wandb.",
            file=sys.stderr,
        )
        return None
    print(offline_notice(where, mode_env) if offline else f"wandb: {where}")
    return where


def chosen_folder(args: argparse.Namespace) -> str:
    """``DIR`` or ``--out DIR`` (one of them, or both the same), refused in one line otherwise."""
    given = {str(f) for f in (args.dir, args.out_flag) if f is not None}
    if not given:
        raise UserInputError("the folder is missing: give it as DIR (after the command)")
    if len(given) > 1:  # a word without "=" meant as an override reads as a second folder
        raise UserInputError(
            f"give the folder once, as DIR (got {args.dir!r} and --out {args.out_flag!r}); an override is KEY=VALUE"
        )
    return given.pop()


def plain(text: str) -> str:
    """A docstring's text as ``--help`` prints it: no reStructuredText double backticks, one line."""
    return " ".join(text.replace("``", "").split())


class Renamed(argparse.Action):
    """A store_true flag under its old name, kept for the scripts that hold it: accepted, hidden from
    ``--help``, and its first use says the new name (``parser.add_argument(OLD, action=Renamed, new=NEW)``)."""

    def __init__(self, option_strings, dest, new: str, note: str = "", **kwargs):
        super().__init__(option_strings, dest, nargs=0, default=False, help=argparse.SUPPRESS, **kwargs)
        self.new, self.note = new, note

    def __call__(self, parser, namespace, values, option_string=None):
        if not getattr(namespace, self.dest):
            print(f"{parser.prog}: note: {option_string} is deprecated; use {self.new}{self.note}", file=sys.stderr)
        setattr(namespace, self.dest, True)


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(
        prog="divergence",
        description="Measure and bound the weight divergence a training optimization causes.",
    )
    parser.add_argument("--version", action="version", version=f"divergence {__version__}")
    # dest: not "command", which `launch --command` sets too
    subparsers = parser.add_subparsers(dest="subcommand", metavar="COMMAND", parser_class=_Parser)
    subparsers.required = True
    for name in COMMANDS:
        module = importlib.import_module(f"divergence.cli.{name}")
        sub = module.register(subparsers)
        sub.set_defaults(_run=module.run)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = parse(build_parser(), argv)
    try:
        return int(args._run(args) or 0)
    except UserInputError as err:
        print(f"divergence {args.subcommand}: error: {err}", file=sys.stderr)
        return EXIT_USAGE
    except ImportError as err:  # an optional package a command did not check for first
        from divergence.extras import missing_extra

        missing = missing_extra(err)
        if missing is None:
            raise
        print(f"divergence {args.subcommand}: error: {missing}", file=sys.stderr)
        return EXIT_USAGE
    except KeyboardInterrupt:
        print(f"divergence {args.subcommand}: interrupted", file=sys.stderr)
        return 130


def parse(parser: argparse.ArgumentParser, argv: list[str] | None) -> argparse.Namespace:
    """``parser.parse_args``, but KEY=VALUE words after an option join the command's overrides
    (``train DIR --recipe R train.lr=1``): argparse gives a ``nargs="*"`` positional only the words
    before the first option."""
    args, extra = parser.parse_known_args(argv)
    if extra:
        if not isinstance(getattr(args, "overrides", None), list) or any(w.startswith("-") for w in extra):
            parser.error(f"unrecognized arguments: {' '.join(extra)}")
        args.overrides = [*args.overrides, *extra]
    return args


EXIT_CLOSED_PIPE = 128 + 13  # 128 + SIGPIPE: the status a shell shows for a writer whose reader left


def entry_point() -> None:
    """The installed ``divergence`` command: ``main``, and a reader that closed the pipe early
    (``divergence compare A B | head``) ends it quietly, as it ends ``cat`` or ``yes``."""
    try:
        code = main()
        sys.stdout.flush()  # a pipe closed under the last print surfaces here
    except BrokenPipeError:
        # stdout to /dev/null, so the interpreter's own flush at exit writes nowhere (the recipe
        # of Python's ``signal`` documentation, "Note on SIGPIPE")
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        code = EXIT_CLOSED_PIPE
    sys.exit(code)
