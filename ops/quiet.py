"""Warnings the project cannot avoid, silenced by their exact text (everything else still shows)."""
import warnings

# PEFT reads `model.is_gradient_checkpointing` when it wraps a model; transformers 5 deprecated the name.
# transformers' own generate() (used by TRL) still passes `past_key_values` to the model (ours passes `cache`).
UNAVOIDABLE = (("`is_gradient_checkpointing` is deprecated", FutureWarning),
               ("`past_key_values` is deprecated", FutureWarning))


def silence_unavoidable_warnings() -> None:
    """Filter exactly the warnings in UNAVOIDABLE."""
    for text, category in UNAVOIDABLE:
        warnings.filterwarnings("ignore", message=text, category=category)
