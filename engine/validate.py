"""`engine.validate`, kept importable: the validator lives in `engine.validation`."""

from .validation import check_file, discover, format_schema, packaged_validator, validate_paths

__all__ = ["check_file", "discover", "format_schema", "packaged_validator", "validate_paths"]
