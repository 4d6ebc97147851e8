"""Data: real images that ship inside packages, generated sets, user folders."""

from .digits import digit_images as digit_images

__all__ = ["digit_images"]
