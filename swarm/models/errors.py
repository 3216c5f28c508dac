"""Errors raised while locating, converting or loading model weights."""


class ModelError(Exception):
    """Base class for every model-related failure the user should see as one line."""


class ModelNotFoundError(ModelError):
    """The model file or package is not installed where we looked."""


class ModelFormatError(ModelError):
    """The model file exists but cannot be read or is not a supported layout."""


class UnsplittableModel(ModelError):
    """The model's architecture cannot be cut into independent contiguous layer ranges."""
