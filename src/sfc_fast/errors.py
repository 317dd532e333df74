"""The root of the core's exceptions: every error the core raises on purpose is an
``SfcError``, so a caller can tell "the input was wrong" from a bug with one ``except``.

Each error also keeps the built-in class it had (``RecipeError`` is still a
``ValueError``): code that caught the built-in goes on working. The host's root,
``sfc_host.errors.SfcHostError``, derives from this one.
"""

__all__ = ["SfcError"]


class SfcError(Exception):
    """An error of sfc-fast: a recipe, a state document, a graph, a transition, a packet
    that cannot be used. A bug is never an ``SfcError``."""
