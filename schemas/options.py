"""Configuration fields that carry their own help text, so a dataclass states each option once.

A config dataclass declares `x: int = opt(10, "what x is")`; the CLI (ops/commands/args.py) and the CLI
reference (ops/cli_reference.py) read the help from the field's metadata and the default from the field.
It sits at the bottom layer because every layer's configs use it.
"""
from dataclasses import MISSING, Field, field

HELP = "help"  # the metadata key


def opt(default=MISSING, help: str = "", *, factory=MISSING):
    """A dataclass field with `default` (or a default `factory`; neither: required) and its help text."""
    return field(default=default, default_factory=factory, metadata={HELP: help})


def derived(help: str):
    """A field its dataclass computes in __post_init__ from other fields (not a constructor argument), with its help."""
    return field(init=False, repr=False, compare=False, metadata={HELP: help})


def help_of(f: Field) -> str | None:
    """The help text a field declares, or None."""
    return f.metadata.get(HELP)
