"""tfsift: pipeline and data-parallel training with data sifting for Keras 3."""

from tfsift.version import __version__

__all__ = ["__version__"]
